"""Where a run's pending workflow task is, said by ``durable status`` and ``describe``: a run
moves when a worker decides that task, so "pending" alone never says why it has not moved.

A worker here is registered (live in the registry) but runs no loop: its tasks stay where
the test puts them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from apps.basic import Waiter
from click.testing import CliRunner
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore
from workers.cli import cli
from workers.worker import Worker


def _status(workflow_id: str) -> str:
    result = CliRunner().invoke(cli, ["status", workflow_id], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


@pytest.fixture
def idle_worker(store: RedisStore) -> Iterator[Worker]:
    """A live worker of queue 'default' that reads nothing (it says its --claim-idle: 12 s)."""
    worker = Worker(store, concurrency=1, claim_idle_ms=12_000)
    worker._ensure_groups()
    worker.membership.join()
    try:
        yield worker
    finally:
        worker.membership.leave()


def test_status_says_where_the_pending_workflow_task_is(store: RedisStore, idle_worker: Worker) -> None:
    stub = WorkflowStub.make(Waiter, id="where-1", store=store).start(0.01)
    waits = "its workflow task waits on queue 'default' for a worker (backlog 1)"
    assert _status("where-1") == f"pending ({waits})"
    with pytest.raises(TimeoutError) as timed_out:  # a result() that times out says it too
        stub.result(timeout=0.2)
    assert (
        f"did not close within 0.2 s: it is pending, {waits} (`durable describe where-1` says more)"
        in str(timed_out.value)
    )

    # A worker read it and has not decided it (a decision takes milliseconds: here it hangs).
    stream = store.keys.workflow_tasks(store.ref(stub.id).partition, "default")
    assert store.redis.xreadgroup(GROUP, idle_worker.consumer, {stream: ">"})
    said = _status("where-1")
    assert said.startswith(f"pending (its workflow task was delivered to worker {idle_worker.consumer} ")
    assert said.endswith(" s ago and is not decided yet)")
    assert stub.describe().workflow_task == said.removeprefix("pending (").removesuffix(")")
    # The describe table has the row (only --json and the API had it).
    table = CliRunner().invoke(cli, ["describe", "where-1"], terminal_width=400).output
    row = [line for line in table.splitlines() if line.startswith("workflow task ")]
    assert row and f"its workflow task was delivered to worker {idle_worker.consumer}" in row[0], table
    # Delivered again (read back, then reclaimed: "ago" starts over each time): the count says it.
    ((_, entries),) = store.redis.xreadgroup(GROUP, idle_worker.consumer, {stream: "0"})
    store.redis.xclaim(stream, GROUP, idle_worker.consumer, 0, [entries[0][0]])
    assert "s ago (its delivery 3: earlier ones were not decided either) and is not decided yet" in _status(
        "where-1"
    )


def test_a_task_delivered_to_a_gone_worker_says_it_is_taken_over(
    store: RedisStore, idle_worker: Worker
) -> None:
    stub = WorkflowStub.make(Waiter, id="where-2", store=store).start(0.01)
    stream = store.keys.workflow_tasks(store.ref(stub.id).partition, "default")
    assert store.redis.xreadgroup(GROUP, "vm:1:1.1", {stream: ">"})  # a worker that died holding it
    assert _status("where-2") == (
        "pending (its workflow task was delivered to worker vm:1:1.1 0 s ago and is not decided yet; that "
        "worker is gone (stopped or died): another takes the task over after --claim-idle (12 s on the live "
        "workers))"
    )
    assert stub.describe().to_dict()["workflow_task"].startswith("its workflow task was delivered")


def test_a_run_waiting_with_no_pending_task_says_nothing_of_one(store: RedisStore, worker: Worker) -> None:
    stub = WorkflowStub.make(Waiter, id="where-3", store=store).start(0.01)
    wait_for(lambda: _status("where-3") == "suspended (waiting for signal 'go')", timeout=20)
    assert stub.describe().workflow_task is None


@pytest.mark.slow
def test_a_task_on_a_dead_workers_private_queue_says_whose_and_when_it_goes_back(
    store: RedisStore, redis_url: str
) -> None:
    """The run's next task goes to the private queue of the worker that decided it last (it
    has the run cached); that worker killed, the status names it, then says it is gone (the
    other worker keeps the queue served: the run is not blocked) and when the task goes back:
    after the --sticky-timeout the live worker said in its registry entry (60 s, not the
    default 5 s)."""
    flags = ("--sticky-timeout", "60", "--claim-idle", "60")
    procs = [spawn_worker(redis_url, extra=flags) for _ in range(2)]
    try:
        wait_for(lambda: len(store.live_workers()) == 2, timeout=30)
        stub = WorkflowStub.make(Waiter, id="where-4", store=store).start(0.01)
        wait_for(lambda: _status("where-4") == "suspended (waiting for signal 'go')", timeout=30)
        host = store.run_record(store.ref("where-4"))["sticky"]
        owner = next(w for w in store.live_workers() if "@" + w.name.replace(":", "-") == host)
        os.kill(owner.pid, signal.SIGKILL)
        next(p for p in procs if p.pid == owner.pid).wait(10)
        time.sleep(0.3)  # Redis drops its connections (and their blocked reads) on reading their end
        stub.signal("go", 1)
        private = (
            f"its workflow task waits on the private queue of worker {owner.name}, which decided the run last"
        )
        assert _status("where-4") == f"suspended ({private} (backlog 1); waiting for signal 'go')"
        wait_for(lambda: "that worker is gone" in _status("where-4"), timeout=30)  # its registry entry lapsed
        assert _status("where-4") == (
            f"suspended ({private} (backlog 1); that worker is gone (stopped or died): the task goes back "
            "to the run's queue after --sticky-timeout (60 s on the live workers); waiting for signal 'go')"
        )
    finally:
        for proc in procs:
            stop(proc)
