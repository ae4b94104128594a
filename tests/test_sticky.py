"""Sticky workflow tasks: a run's next task goes to the worker whose cache holds its driver,
and back to the shared queue when that worker stops or dies; and the worker process's GC setup."""

from __future__ import annotations

import signal
import threading

import pytest
from apps.basic import Sequence, Waiter
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from workers.worker import Worker, WorkerThread


def _leased(store: RedisStore, *workers: Worker) -> bool:
    keys = store.keys
    return all(
        store.redis.exists(keys.alive(p, w.session_queue)) for w in workers for p in range(keys.partitions)
    )


def _sticky_host(store: RedisStore, stub: WorkflowStub) -> str:
    ref = store.ref(stub.id)
    raw = store.redis.hget(store.keys.run(ref.partition, ref.run_id), "sticky")
    return raw.decode() if raw else ""


def _waiting_run(store: RedisStore) -> tuple[WorkflowStub, str]:
    """A run waiting for its signal, and the worker it is sticky to."""
    stub = WorkflowStub.make(Waiter).start(0.05)
    wait_for(lambda: stub.status() == "suspended" and _sticky_host(store, stub) != "", timeout=30)
    return stub, _sticky_host(store, stub)


def test_a_run_is_decided_by_the_worker_that_cached_it(store: RedisStore) -> None:
    first, second = (Worker(store, concurrency=2, grace=5, block_ms=100) for _ in range(2))
    with WorkerThread(first), WorkerThread(second):
        wait_for(lambda: _leased(store, first, second))
        stubs = [WorkflowStub.make(Sequence).start(8) for _ in range(6)]
        assert [s.result(timeout=30) for s in stubs] == [28] * 6
    # A run's first decision is no cache lookup (a new run cannot be cached); its 8 later
    # decisions, one per activity result, all hit the cache of the worker that made the first.
    # Without affinity about half of them would land on the other worker and replay.
    assert first.decider.cache.misses + second.decider.cache.misses == 0
    assert first.decider.cache.hits + second.decider.cache.hits == 6 * 8


def test_a_worker_whose_private_stream_was_taken_recreates_it(store: RedisStore) -> None:
    # Another worker took this one for dead (its lease lapsed while it stalled) and handed
    # its private tasks back: the stream is gone, the worker must carry on regardless.
    worker = Worker(store, concurrency=2, grace=5, claim_idle_ms=2000, block_ms=100)
    with WorkerThread(worker):
        wait_for(lambda: _leased(store, worker))
        assert WorkflowStub.make(Sequence).start(2).result(timeout=15) == 1
        keys = store.keys
        for p in range(keys.partitions):
            # The worker renews its lease meanwhile (every claim_idle / 3): a renewal between
            # the delete and the unstick makes it alive again, so delete until unstick goes through.
            for _ in range(20):
                store.redis.delete(keys.alive(p, worker.session_queue))
                if store.unstick(p, worker.session_queue) >= 0:
                    break
            else:
                raise AssertionError(f"partition {p}: the lease kept coming back")
            assert not store.redis.exists(keys.workflow_tasks(p, worker.session_queue))
        assert WorkflowStub.make(Sequence).start(4).result(timeout=15) == 6
        wait_for(lambda: _leased(store, worker))  # its next lease renewal comes back
        assert WorkflowStub.make(Sequence).start(3).result(timeout=15) == 3
        assert any(t.name == "durable-worker" and t.is_alive() for t in threading.enumerate())


def test_unstick_leaves_a_live_workers_tasks_alone(store: RedisStore) -> None:
    keys = store.keys
    stream, host = keys.workflow_tasks(0, "@live-host"), "@live-host"
    store.redis.set(keys.alive(0, host), "x", px=10_000)
    store.redis.xadd(stream, {"run": "r-1"})
    assert store.unstick(0, host) == -1
    assert store.redis.xlen(stream) == 1


@pytest.mark.slow
@pytest.mark.fault
def test_tasks_sent_to_a_killed_worker_go_to_another(redis_url: str, store: RedisStore) -> None:
    victim = spawn_worker(redis_url, extra=("--claim-idle", "1.5"))
    try:
        stub, host = _waiting_run(store)
        p = store.ref(stub.id).partition
        assert store.redis.exists(store.keys.alive(p, host)), "a worker holds its lease before it decides"
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
    finally:
        stop(victim)
    # Its lease has not run out yet: the signal's task goes to the dead worker's stream...
    stub.signal("go", "late")
    assert store.redis.xlen(store.keys.workflow_tasks(p, host)) == 1
    # ...and a live worker hands it back once the lease lapses.
    other = spawn_worker(redis_url, extra=("--claim-idle", "1.5"))
    try:
        assert stub.result(timeout=30) == "late"
    finally:
        stop(other)
    assert not store.redis.exists(store.keys.workflow_tasks(p, host))


@pytest.mark.slow
def test_a_stopping_worker_gives_its_runs_back_at_once(redis_url: str, store: RedisStore) -> None:
    # Long leases: only the stopping worker's own release can make this quick.
    first = spawn_worker(redis_url, extra=("--claim-idle", "60"))
    try:
        stub, _ = _waiting_run(store)
    finally:
        assert stop(first) == 0
    second = spawn_worker(redis_url, extra=("--claim-idle", "60"))
    try:
        stub.signal("go", "moved")
        assert stub.result(timeout=10) == "moved"
    finally:
        stop(second)


def test_tune_gc_raises_the_young_threshold_and_freezes_what_is_loaded() -> None:
    import gc

    from workers.worker import tune_gc

    before = gc.get_threshold()
    try:
        tune_gc(12_345)
        assert gc.get_threshold() == (12_345, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
