"""A worker pass's bookkeeping: loads taken with completions wait a few passes for their
run's task, completions hand the tasks they wake to their worker, and a wake-up of the
blocking read is written once until drained."""

from __future__ import annotations

import os

import pytest
from apps.basic import Sequence

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from workers.preloads import PRELOAD_PASSES, Preloads
from workers.reader import TaskReader
from workers.worker import Worker, WorkerThread


def test_a_preload_waits_a_few_passes_for_its_task() -> None:
    preloads = Preloads()
    loaded = ({"seq": 3}, [], [])
    preloads.current["r1"] = (3, loaded)
    for _ in range(PRELOAD_PASSES - 1):
        preloads.end_pass()
    assert preloads.take("r1") == (3, loaded)
    assert preloads.take("r1") == (-1, None)  # taken: used once
    preloads.current["r1"] = (3, loaded)
    for _ in range(PRELOAD_PASSES):
        preloads.end_pass()
    assert preloads.take("r1") == (-1, None)  # its task went elsewhere: dropped
    preloads.current["r2"] = (5, loaded)
    preloads.end_pass()
    preloads.forget(["r2"])  # a new input reached the run: the load would miss it
    assert preloads.take("r2") == (-1, None)


def test_runs_decided_from_preloads_finish_with_every_step(store: RedisStore) -> None:
    worker = Worker(store, concurrency=4, grace=5, block_ms=100)
    # Preloads ride with completions through the inbox; a claimed task's result rides with its
    # run's next decision instead, and how many tasks a worker claims depends on timing.
    worker.decider.claims_activity = lambda _scheduled: False
    used = []
    take = worker.decider.preloads.take

    def spy(run_id: str):  # type: ignore[no-untyped-def]
        got = take(run_id)
        used.append(got[1] is not None)
        return got

    worker.decider.preloads.take = spy  # type: ignore[method-assign]
    with WorkerThread(worker):
        stubs = [WorkflowStub.make(Sequence, store=store).start(5) for _ in range(8)]
        assert [s.result(timeout=60) for s in stubs] == [sum(range(5))] * 8
    assert any(used)


def test_a_wake_up_is_written_once_until_drained() -> None:
    reader = TaskReader(lambda _group: None, "c")  # type: ignore[arg-type, return-value]
    try:
        reader.wake()
        reader.wake()
        assert os.read(reader._wake_r, 16) == b"!"  # one byte for both
        reader._drain()
        reader.wake()  # drained: the next wake-up writes again
        assert os.read(reader._wake_r, 16) == b"!"
    finally:
        reader.close()


def test_a_closed_reader_writes_no_wake_up_into_a_reused_descriptor() -> None:
    """An activity thread handing a result over after its worker stopped wakes a closed reader:
    its pipe's descriptor numbers belonged by then to whatever was opened next, and the wake-up
    byte garbled that (a Redis connection got a command starting with "!")."""
    reader = TaskReader(lambda _group: None, "c")  # type: ignore[arg-type, return-value]
    reader.close()
    r, w = os.pipe()  # the lowest free descriptors: those the reader's pipe had
    try:
        reader.wake()
        os.set_blocking(r, False)
        with pytest.raises(BlockingIOError):
            os.read(r, 16)  # nothing was written into the new pipe
    finally:
        os.close(r)
        os.close(w)


def test_completions_hand_the_woken_sticky_task_to_their_worker(store: RedisStore) -> None:
    """A completion recorded by the main thread reads the task it enqueued in this worker's
    sticky stream for the worker (no read round trip); those tasks are decided in the same
    pass, and every run finishes whole."""
    worker = Worker(store, concurrency=4, grace=5, block_ms=100)
    # Tasks are handed with completions through the inbox; a claimed task's result rides with
    # its run's next decision instead, and how many tasks a worker claims depends on timing
    # (a clean CI run once claimed them all, leaving nothing to hand).
    worker.decider.claims_activity = lambda _scheduled: False
    handed: list[str] = []
    complete = worker._complete

    def spy(outcomes):  # type: ignore[no-untyped-def]
        complete(outcomes)
        handed.extend(t.stream for t in worker._handed)

    worker._complete = spy  # type: ignore[method-assign]
    with WorkerThread(worker):
        stubs = [WorkflowStub.make(Sequence, store=store).start(5) for _ in range(8)]
        assert [s.result(timeout=60) for s in stubs] == [sum(range(5))] * 8
    assert handed and all(worker.session_queue in stream for stream in handed)
    for stub in stubs:
        assert [e.type for e in stub.history()].count("ActivityCompleted") == 5
