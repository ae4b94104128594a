"""A worker whose activity threads are all busy with long activities, with a real ``durable worker``.

It takes no more activity tasks than it can start (plus a small prefetch of activity types known
to take microseconds, ``workers/pace.py``): the rest stay in their queue's backlog, where any other
worker can take them and where ``durable workers`` and the queue metric count them, and
``status``/``describe`` of a run whose activity waits there say so, with the backlog. Before, a
worker that had just run fast activities claimed a burst of slow ones (up to 32 per thread),
each reading "running on <worker>" while it waited behind the others for a thread.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from apps.basic import Sequence, SlowSteps
from clikit import cli_ok as _cli
from procs import spawn_worker, stop
from waiting import wait_for

from durable import ConfigurationError, WorkflowStub
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore
from workers.pace import Pace
from workers.threads import ActivityThreads

pytestmark = pytest.mark.slow

THREADS, RUNS, SECONDS = 2, 4, 6.0


def _held(store: RedisStore) -> int:
    """Activity tasks of ``default`` delivered to a worker and not acknowledged yet."""
    keys = store.keys
    return sum(
        int(store.redis.xpending(keys.activity_tasks(p, "default"), GROUP)["pending"])
        for p in range(keys.partitions)
    )


def _started(path: Path) -> bool:
    return path.exists() and "start" in path.read_text()


def test_an_overloaded_worker_leaves_what_it_cannot_start_in_the_queue_and_says_so(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    worker = spawn_worker(redis_url, extra=("--concurrency", str(THREADS)))
    try:
        wait_for(store.live_workers, timeout=30)
        # Fast activities first: the worker learns that `add` takes microseconds (its prefetch);
        # that must not make it hoard the slow ones that come next.
        assert WorkflowStub.make(Sequence, store=store).start(30).result(timeout=30) == 435
        paths = [tmp_path / f"run{i}" for i in range(RUNS)]
        stubs = [WorkflowStub.make(SlowSteps, store=store).start(str(p), 1, SECONDS) for p in paths]
        wait_for(lambda: sum(_started(p) for p in paths) == THREADS, timeout=15)
        waiting = RUNS - THREADS
        wait_for(lambda: store.queued_activity_tasks(["default"]) == {"default": waiting}, timeout=5)
        t0 = time.monotonic()

        # The worker holds only what its threads run; the rest is the queue's backlog. (A read
        # sent while its threads were free may bring a task back for a moment: it returns it.)
        wait_for(lambda: _held(store) == THREADS, timeout=2)
        assert store.queued_activity_tasks(["default"]) == {"default": waiting}
        report = json.loads(_cli("workers", "--json"))
        assert report["backlog"]["default"]["activity_tasks"] >= waiting

        queued = [s for s, p in zip(stubs, paths, strict=True) if not _started(p)]
        running = [s for s, p in zip(stubs, paths, strict=True) if _started(p)]
        assert len(queued) == waiting and len(running) == THREADS
        for stub in queued:
            step = stub.describe().pending[0]
            assert step["worker"] is None and step["backlog"] == waiting
            assert step["state"] == (
                f"attempt 1: not begun: queued on 'default', waiting for a worker (backlog {waiting})"
            )
            assert _cli("status", stub.id).strip() == (
                f"running (activity Slow (1) queued on 'default': waiting for a worker (backlog {waiting}))"
            )
            assert "queued on 'default', waiting for a worker" in _cli("describe", stub.id)
        for stub in running:
            step = stub.describe().pending[0]
            assert step["state"].startswith("attempt 1: running on ") and step["backlog"] is None
            # What the run is doing: which activity, on which worker, since when.
            assert (
                _cli("status", stub.id)
                .strip()
                .startswith("running (activity Slow (1) attempt 1: running on ")
            )
        assert time.monotonic() - t0 < SECONDS - 1, "the checks must see one state of the queue"

        # All of them still complete, in waves of THREADS.
        for stub in stubs:
            assert stub.result(timeout=60) == ["s0", "end"]
        assert store.queued_activity_tasks(["default"]) == {"default": 0} and _held(store) == 0
    finally:
        stop(worker)


def test_no_prefetch_for_an_unknown_type_nor_behind_stalled_threads() -> None:
    """The bound itself: a free thread always; beyond that only an activity type measured fast,
    on threads that turn over; a type that turned slow loses its prefetch at once."""
    pace = Pace(2)
    assert pace.limit("never-ran", stalled=0) == 2
    pace.ran("fast", 50e-6)
    assert pace.limit("fast", stalled=0) == 64 and pace.most() == 64
    assert pace.limit("fast", stalled=1) == 33  # the stalled thread keeps only its own task
    assert pace.limit("fast", stalled=2) == 2
    pace.ran("fast", 30.0)
    assert pace.limit("fast", stalled=0) == 2

    threads = ActivityThreads(1)
    try:
        threads.submit(time.sleep, 0.5)
        wait_for(lambda: threads.stalled(0.2) == 1, timeout=5)
        wait_for(lambda: threads.stalled(0.0) == 0, timeout=5)
    finally:
        threads.shutdown()


def test_activity_threads_the_system_refuses_are_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--concurrency 100000`` died with "RuntimeError: can't start new thread"; the threads it
    had started are stopped again."""
    import threading

    real_start = threading.Thread.start
    started: list[threading.Thread] = []

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("durable-activity") and len(started) == 3:
            raise RuntimeError("can't start new thread")
        real_start(thread)
        started.append(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(ConfigurationError) as info:
        ActivityThreads(10)
    assert str(info.value) == (
        "cannot start 10 activity threads: the system refused thread 4 (can't start new thread); "
        "lower --concurrency"
    )
    for thread in started:
        thread.join(timeout=5)
        assert not thread.is_alive()
