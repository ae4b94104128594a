"""Tasks a worker took as prefetch go back to their queue when the activity type turns slow.

A worker takes activity tasks beyond its free threads only for types that took microseconds
(``workers/pace.py``); its own commits claim such tasks and begin their attempts for it. When the
type turns slow (or a hung attempt holds the thread), those tasks waited behind it: no other
worker could take them, ``describe`` said ``running on W`` for tasks nothing ran, and their
timeouts ran meanwhile, so a task that never ran could time out and fail its run. Now the worker
gives them back to their stream, with the claim's begin undone, for any worker; in eager mode
its leased attempts go to their queue the same way.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest
import redis
from apps.turns_slow import TurnsSlowSteps
from procs import spawn_logged_worker, stop
from waiting import wait_for

from durable import WorkflowClosed, WorkflowStub
from durable.store.activities import Begun
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask
from workers import activity_host as activity_host_module
from workers.activity_host import ActivityHost

pytestmark = pytest.mark.slow

RUNS = 24


def _states(stubs: list[WorkflowStub]) -> list[str]:
    out = []
    for stub in stubs:
        pending = stub.describe().pending
        out.append(str(pending[0].get("state", "")) if pending else "")
    return out


def _last_pid(stub: WorkflowStub) -> int | None:
    done = [e for e in stub.history() if e.type == "ActivityCompleted"]
    return int(done[-1].data["result"]) if done else None


@pytest.mark.parametrize("mode", [(), ("--eager",)], ids=["claimed", "eager"])
def test_tasks_waiting_behind_a_type_that_turned_slow_go_back_to_their_queue(
    redis_url: str, store: RedisStore, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    """Claimed by the worker's commits (queued mode), or leased to it (``--eager``): either way
    they waited behind the slow thread until their timeout failed their runs."""
    slow = tmp_path / "slow"
    env = {"DURABLE_TEST_SLOW_FILE": str(slow)}
    first = spawn_logged_worker(
        redis_url, tmp_path / "first.log", "--concurrency", "1", *mode, app="apps.turns_slow", env=env
    )
    second = None
    stubs: list[WorkflowStub] = []
    try:
        (me,) = wait_for(store.live_workers, timeout=20)
        stubs = [WorkflowStub.make(TurnsSlowSteps, store=store).start(1_000_000) for _ in range(RUNS)]
        # Fast: one thread runs them all, its commits claiming each run's next step ahead of it.
        wait_for(lambda: all(len(s.history()) > 12 for s in stubs), timeout=30)
        slow.touch()
        # Its thread is now in a 1.5 s step; the tasks that waited behind it went back to the queue.
        mine = f"running on {me.name}"
        wait_for(lambda: sum(mine in state for state in _states(stubs)) <= 1, timeout=10)
        # Before, they waited there (said to run there, or leased to it) until their timeout
        # failed their runs. Now they are back in their queue.
        queued = "not begun: queued on 'default'"
        wait_for(lambda: sum(queued in state for state in _states(stubs)) >= RUNS - 2, timeout=10)
        failed = [s.describe().attempts[-1] for s in stubs if s.status() != "running"]
        assert not failed, failed[:2]
        # Another worker runs them, well within their 4 s timeout (one attempt: a timeout fails the run).
        started = time.monotonic()
        second = spawn_logged_worker(
            redis_url, tmp_path / "second.log", "--concurrency", str(RUNS), app="apps.turns_slow", env=env
        )
        pid = second.pid
        wait_for(lambda: sum(_last_pid(s) == pid for s in stubs) >= RUNS - 2, timeout=20)
        assert [s.status() for s in stubs] == ["running"] * RUNS, [s.describe().attempts[-1:] for s in stubs]
        assert time.monotonic() - started < 15
    finally:
        try:
            for stub in stubs:
                with contextlib.suppress(WorkflowClosed):  # a run failed: the assertion says so
                    stub.terminate("test over")
        finally:
            for proc in (first, second):
                if proc is not None:
                    stop(proc)
    log = (tmp_path / "first.log").read_text()
    assert "that waited for a thread here, behind 1 thread(s) busy with long attempts" in log, log[-3000:]


def _one_thread_host(store: RedisStore) -> ActivityHost:
    """A worker's activity side alone, with one thread (no worker process around it)."""
    return ActivityHost(
        store,
        concurrency=1,
        queues=["default"],
        allowed=lambda _: True,
        identity=("w-test", "@w-test"),
        eager=False,
        wake=lambda: None,
        on_timer=lambda _: None,
    )


def test_tasks_it_cannot_give_back_wait_for_a_thread_as_before(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis unavailable while a worker gives tasks back: they stay here, run when a thread frees
    (nothing is lost, nothing counted twice)."""
    host = _one_thread_host(store)
    ran: list[str] = []
    monkeypatch.setattr(host, "_activity", lambda queued: ran.append(queued.entry_id))
    release = threading.Event()
    with host._lock:
        host.busy += 1  # the one thread's attempt, held past STALLED_S:
    host._pool.submit(lambda: release.wait(10))
    body = ActivityTask("r-1", "w-1", 0, "1", "quick", b"", 1, "default").encode()
    for i in (1, 2):
        host.submit("s", f"{i}-0", {b"body": body}, redelivered=False)
    time.sleep(0.3)

    def unavailable(*_: object) -> int:
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(store, "return_tasks", unavailable)
    host.shed()
    assert (host.busy, host.waiting()) == (3, 2)
    release.set()
    wait_for(lambda: ran == ["1-0", "2-0"], timeout=5)
    host._pool.shutdown()


def test_a_stopping_worker_gives_back_the_tasks_no_thread_started(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a graceful stop the tasks waiting for a thread go back at once (before, they ran during
    the grace, or went back still marked begun by their claim)."""
    host = _one_thread_host(store)
    ran: list[str] = []
    monkeypatch.setattr(host, "_activity", lambda queued: ran.append(queued.entry_id))
    given: list[tuple[str, str, bool]] = []
    monkeypatch.setattr(
        store, "return_tasks", lambda worker, tasks: given.extend((s, e, c) for s, e, _, c in tasks) or 0
    )
    release = threading.Event()

    def attempt() -> None:  # the one thread's attempt, ending 0.3 s into the stop
        release.wait(10)
        with host._lock:
            host.busy -= 1

    with host._lock:
        host.busy += 1
    host._pool.submit(attempt)
    wait_for(host._pool.running, timeout=5)  # on its thread, not among the calls waiting for one
    body = ActivityTask("r-1", "w-1", 0, "1", "quick", b"", 1, "default").encode()
    host.submit("s", "1-0", {b"body": body}, redelivered=False, begun=Begun(True, now_ms=1))
    host.submit("s", "2-0", {b"body": body}, redelivered=False)
    threading.Timer(0.3, release.set).start()
    host.finish(grace=5)
    assert given == [("s", "1-0", True), ("s", "2-0", False)] and ran == []
    assert host.busy == 0


def test_a_stopping_worker_records_its_finished_results_through_a_short_redis_outage(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM while Redis was away 3 s: the worker tried its finished results once more and gave
    up at once ("could not record 3 finished activities on shutdown"), well inside its grace; the
    work ran again elsewhere and the runs waited for the retries (an acceptance soak, F2)."""
    host = _one_thread_host(store)
    tries: list[int] = []

    def away_for_a_while(_store: RedisStore, batch: list) -> int:
        tries.append(len(batch))
        if len(tries) <= 5:  # about a second of an outage
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return 0

    monkeypatch.setattr(activity_host_module, "complete_batch", away_for_a_while)
    host.completed.extend(["a", "b", "c"])  # type: ignore[list-item] - opaque to the stand-in
    host.finish(grace=5)
    assert tries[-1] == 3 and len(tries) == 6
    assert "could not record" not in caplog.text


def test_a_result_that_comes_while_the_worker_stops_through_an_outage_is_recorded(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The last attempt ended during the stop's sleep: nothing running, its result not tried yet,
    and the stop ended there, giving it up (the re-check pass, F5: a single activity ran twice)."""
    host = _one_thread_host(store)
    recorded: list[int] = []

    def away_for_a_while(_store: RedisStore, batch: list) -> int:
        if len(recorded) < 5:
            recorded.append(0)
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        recorded.append(len(batch))
        return 0

    def attempt() -> None:  # the one running attempt, ending 0.1 s into the stop
        time.sleep(0.1)
        with host._lock:
            host.completed.append("its result")  # type: ignore[arg-type] - opaque to the stand-in
            host.busy -= 1

    monkeypatch.setattr(activity_host_module, "complete_batch", away_for_a_while)
    with host._lock:
        host.busy += 1
    host._pool.submit(attempt)
    wait_for(host._pool.running, timeout=5)  # on its thread, not among the calls waiting for one
    host.finish(grace=5)
    assert recorded[-1] == 1
    assert "could not record" not in caplog.text
