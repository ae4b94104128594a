"""The streams of queues no live worker serves go once empty: a queue per tenant (or per host)
left its empty workflow and activity streams in every partition for good (a tester: 300
tenant queues, all runs terminated and purged, 300 x 16 empty streams left, ~110 KB).

A worker's scheduler deletes them and keeps a queue whose streams hold a task. The queue's
name stays known (a re-check found a name forgotten under a task sent meanwhile: its backlog
left `durable workers`); a task sent later recreates its stream.
"""

from __future__ import annotations

from apps.basic import Waiter
from waiting import wait_for

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from durable.store.workers import served_queues
from workers.worker import Worker, WorkerThread


def _streams(store: RedisStore, queue: str) -> list[str]:
    k = store.keys
    streams = [
        s for p in range(k.partitions) for s in (k.workflow_tasks(p, queue), k.activity_tasks(p, queue))
    ]
    return [s for s in streams if store.redis.exists(s)]


def test_empty_streams_of_unserved_queues_go_and_a_waiting_task_keeps_its_queue(store: RedisStore) -> None:
    for i in range(3):  # no worker serves these queues
        WorkflowStub.make(Waiter, id=f"tenant-{i}", queue=f"tenant-{i}", store=store).start(60)
    for i in range(2):
        WorkflowStub.load(f"tenant-{i}", store=store).terminate("done with the tenant")
    unserved = sorted(set(store.known_queues()) - set(served_queues(store.live_workers())))
    assert {"tenant-0", "tenant-1", "tenant-2"} <= set(unserved)
    store.drop_void_tasks([s for q in unserved for s in _streams(store, q)])  # as the scheduler does first
    emptied = store.drop_unserved_streams(unserved)
    assert {"tenant-0", "tenant-1"} <= set(emptied) and "tenant-2" not in emptied
    assert _streams(store, "tenant-0") == [] and _streams(store, "tenant-2") != []
    assert store.drop_unserved_streams(unserved) == []  # nothing left to delete: not said again
    # The name stays: a task sent now is in the backlog the views read.
    WorkflowStub.make(Waiter, id="tenant-0-again", queue="tenant-0", store=store).start(60)
    assert "tenant-0" in store.known_queues() and _streams(store, "tenant-0") != []
    backlog = store.queue_backlog(["tenant-0"], {""})["tenant-0"]
    assert backlog["workflow_tasks"] == 1, backlog
    for wid in ("tenant-2", "tenant-0-again"):
        WorkflowStub.load(wid, store=store).terminate("test over")


def test_a_workers_scheduler_sweeps_them(store: RedisStore) -> None:
    WorkflowStub.make(Waiter, id="tenant-swept", queue="tenant-swept", store=store).start(60)
    WorkflowStub.load("tenant-swept", store=store).terminate("done")
    with WorkerThread(Worker(store, concurrency=2, grace=5, claim_idle_ms=1000, block_ms=100)):
        wait_for(lambda: _streams(store, "tenant-swept") == [], timeout=20)


def test_the_streams_of_a_queue_only_a_worker_served_go_once_it_stopped(store: RedisStore) -> None:
    # No task was ever sent to the queue (a mistyped --queue, a per-host queue name): its streams
    # were never swept, the name being unknown to the sweep.
    with WorkerThread(Worker(store, queues=["only-served"], concurrency=2, grace=5, block_ms=100)):
        wait_for(lambda: _streams(store, "only-served") != [], timeout=20)
    assert "only-served" in store.known_queues()
    with WorkerThread(Worker(store, concurrency=2, grace=5, claim_idle_ms=1000, block_ms=100)):
        wait_for(lambda: _streams(store, "only-served") == [], timeout=20)
