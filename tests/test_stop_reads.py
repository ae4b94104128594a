"""A stopping worker ends its blocking task reads at once (``CLIENT UNBLOCK``), instead of
leaving them to wait out their BLOCK: it takes no new task after its stop signal (in a deploy,
a new run would otherwise start on the old code), and it stops sooner."""

from __future__ import annotations

import time
from pathlib import Path

from apps.basic import Sequence, SlowSteps, Waiter

from durable import WorkflowStub
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore
from workers.reader import TaskReader
from workers.worker import Worker, WorkerThread


def test_an_unblocked_read_returns_at_once_and_takes_no_task_added_after(store: RedisStore) -> None:
    stream = store.keys.workflow_tasks(0, "stop-reads")
    store.ensure_groups([stream])
    reader = TaskReader(store.open_read, "c", group_of=store.read_group)
    try:
        assert reader.read({"lane": ([stream], 10)}, block_ms=30_000, wait=False) is None  # outstanding
        started = time.monotonic()
        reader.unblock()
        reply = reader.read({}, block_ms=30_000)
        assert time.monotonic() - started < 2, "the read waited out its BLOCK"
        assert reply == [("lane", [])]
        store.redis.xadd(stream, {"run": "r"})
        time.sleep(0.1)
        assert store.redis.xpending(stream, GROUP)["pending"] == 0  # delivered to no one
    finally:
        reader.close()


def test_a_stopping_worker_ends_its_reads_and_leaves_a_new_run_to_the_next_worker(
    store: RedisStore,
) -> None:
    worker = Worker(store, grace=5, block_ms=30_000)
    thread = WorkerThread(worker)
    thread.__enter__()
    time.sleep(0.5)  # idle, in a read that would block for another ~29 s
    started = time.monotonic()
    worker.stop()
    thread.thread.join(timeout=40)
    took = time.monotonic() - started
    assert not thread.thread.is_alive()
    assert took < 5, f"the stop took {took:.1f} s: it waited for its blocking reads to time out"

    stub = WorkflowStub.make(Sequence, store=store).start(3)
    time.sleep(0.3)
    assert stub.status() == "pending"  # no stopped worker's read took its task
    with WorkerThread(Worker(store, grace=5, block_ms=100)):
        assert stub.result(timeout=30) == 0 + 1 + 2


def test_what_comes_for_a_stopping_workers_runs_goes_to_the_workers_that_go_on(
    store: RedisStore, tmp_path: Path
) -> None:
    """A stopping worker lets its running activities finish (up to --grace). A short one's result
    was recorded only once the slowest was done too: its run waited for the whole stop, shown
    as still running on that worker. And the workflow tasks of its runs (that result's, a
    signal's) went to its private stream, where nothing read them until --sticky-timeout."""
    journal = str(tmp_path / "journal")
    stopping = Worker(store, grace=30, block_ms=100, concurrency=4)
    thread = WorkerThread(stopping)
    thread.__enter__()
    waiter = WorkflowStub.make(Waiter, store=store).start(0)
    short = WorkflowStub.make(SlowSteps, store=store).start(journal, 1, 0.5)
    long = WorkflowStub.make(SlowSteps, store=store).start(journal, 1, 8.0)
    wait_for(lambda: Path(journal).exists() and Path(journal).read_text().count("start") == 2)
    wait_for(lambda: waiter.status() == "suspended")  # decided here: sticky to this worker
    stopping.stop()  # both activities are running on its threads
    # The next worker, with the default --sticky-timeout (5 s).
    with WorkerThread(Worker(store, grace=5, block_ms=100)):
        assert short.result(timeout=3) == ["s0", "end"]
        waiter.signal("go", "now")
        assert waiter.result(timeout=3) == "now"
        assert thread.thread.is_alive(), "the stopping worker is still finishing the long one"
        assert long.result(timeout=30) == ["s0", "end"]
    thread.thread.join(timeout=30)
    assert not thread.thread.is_alive()


def wait_for(predicate, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
