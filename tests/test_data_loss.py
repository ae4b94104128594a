"""Redis losing durable's data is said, not silent (durable.store.origins).

A Redis restarted without persistence (or flushed) comes back empty: before, a run was just
``no workflow with id ...``, and a parent whose child lived on a partition that lost its data
(a cluster node restarted empty) read "its start is on its way" for ever. A real worker process
that saw the data before finds its partitions' origin markers gone and says so in its log; the
views say it: ``durable workers`` (and ``/healthz``, the UI's workers page) warn, a missing id
names the loss of its partition, and the parent is blocked (``data_lost``) naming its child.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
from apps.child_blocks import GoThenClose, ParentOfNamed
from click.testing import CliRunner
from clikit import cli_ok
from procs import spawn_worker, stop
from waiting import wait_for

from durable import AsyncWorkflowStub, WorkflowBlocked, WorkflowNotFound, WorkflowStub, codec
from durable.store.child_blocks import children_gone
from durable.store.redis_store import RedisStore
from durable.store.waits import wait_alone
from workers.cli import cli

pytestmark = pytest.mark.slow

LOST = "Redis lost the data of its partition"


def _warnings() -> list[str]:
    return list(json.loads(cli_ok("workers", "--json"))["warnings"])


def _ids_apart(store: RedisStore, prefix: str) -> tuple[str, str]:
    """Two workflow ids of different partitions."""
    first = f"{prefix}-p"
    other = next(
        f"{prefix}-c{i}"
        for i in range(100)
        if store.keys.partition(f"{prefix}-c{i}") != store.keys.partition(first)
    )
    return first, other


def test_a_redis_that_came_back_empty_is_said_by_the_worker_and_the_views(
    redis_url: str, store: RedisStore
) -> None:
    worker = spawn_worker(redis_url, app="apps.child_blocks", extra=("--retention", "20m"))
    try:
        wait_for(store.live_workers, timeout=30)
        assert json.loads(cli_ok("workers", "--json"))["retention"] == "20m"
        gone = WorkflowStub.make(GoThenClose, "lost-1", store=store).start()
        assert not [w for w in _warnings() if "lost" in w]
        store.redis.flushall()  # as a Redis restarted without persistence
        said = wait_for(lambda: [w for w in _warnings() if "Redis lost durable's data" in w], timeout=20)
        assert len(said) == store.keys.partitions and "gone for good" in said[0], said
        # The namespace's retention went with the data: the worker writes it back (runs closing
        # from now on were kept the default 3 days, silently).
        wait_for(lambda: json.loads(cli_ok("workers", "--json"))["retention"] == "20m", timeout=10)
        with pytest.raises(WorkflowNotFound, match=LOST):
            WorkflowStub.load(gone.id, store=store)
        status = CliRunner().invoke(cli, ["status", gone.id])
        assert status.exit_code != 0 and LOST in status.output, status.output
        # The worker goes on: a run started now runs.
        again = WorkflowStub.make(GoThenClose, "lost-2", store=store).start()
        again.signal("go", 7)
        assert again.result(timeout=30) == 7
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.stderr is not None
        err = worker.stderr.read().decode()  # to its end: it has exited
        stop(worker)
    lines = [line for line in err.splitlines() if "Redis lost durable's data of partition(s) 0, 1" in line]
    assert len(lines) == 1 and "ERROR" in lines[0], err[-3000:]
    assert "the namespace's retention (20m) was written again: Redis lost it with the data" in err


def test_a_parent_whose_childs_partition_lost_its_data_is_blocked_naming_it(
    redis_url: str, store: RedisStore
) -> None:
    parent_id, child_id = _ids_apart(store, "orphan")
    worker = spawn_worker(redis_url, app="apps.child_blocks")
    try:
        wait_for(store.live_workers, timeout=30)
        parent = WorkflowStub.make(ParentOfNamed, parent_id, store=store).start(child_id)
        wait_for(lambda: store.instance_statuses([child_id])[0] == "suspended", timeout=20)  # waits for "go"
        assert parent.blocked() is None
        # As a cluster node holding the child's partition restarted empty: the parent's is intact.
        lost_tag = store.keys.tag(store.keys.partition(child_id))
        for key in store.redis.scan_iter(match=f"{lost_tag}:*", count=1000):
            store.redis.delete(key)
        # Gone at once (no start of it is on its way); the loss, once a worker found the marker gone.
        reason = wait_for(lambda: (r := parent.blocked()) and LOST in r.message and r, timeout=20)
        assert reason.kind == "data_lost" and reason.child == child_id
        assert reason.message.startswith(f"waits on child {child_id!r}, which does not exist ({LOST}")
        assert reason.message.endswith("this run cannot finish; terminate it and start it again")
        [step] = parent.describe().pending
        assert step["state"].startswith(f"child {child_id}: no run of it exists ({LOST}"), step
        assert "(blocked: waits on child" in cli_ok("status", parent_id)
        blocked = json.loads(cli_ok("list", "--status", "blocked", "--json"))
        assert [r["workflow_id"] for r in blocked] == [parent_id]
        parent.terminate("its child is gone")
    finally:
        stop(worker)


def test_a_parent_whose_child_vanished_is_blocked_and_its_result_says_so(
    redis_url: str, store: RedisStore
) -> None:
    # Only the child's keys go (evicted under allkeys-lru, deleted by hand): its partition's
    # origin marker stays, so no loss is on record. It read "its start is on its way" for ever,
    # and result() waited its whole timeout.
    parent_id, child_id = _ids_apart(store, "vanished")
    worker = spawn_worker(redis_url, app="apps.child_blocks")
    try:
        wait_for(store.live_workers, timeout=30)
        parent = WorkflowStub.make(ParentOfNamed, parent_id, store=store).start(child_id)
        wait_for(lambda: store.instance_statuses([child_id])[0] == "suspended", timeout=20)
        assert parent.blocked() is None
        child_run = WorkflowStub.load(child_id, store=store).run_id
        tag = store.keys.tag(store.keys.partition(child_id))
        gone = [k for k in store.redis.scan_iter(match=f"{tag}:*", count=1000) if child_run.encode() in k]
        gone.append(store.keys.instance(store.keys.partition(child_id), child_id).encode())
        store.redis.delete(*gone)
        assert store.redis.exists(store.keys.origin(store.keys.partition(child_id)))
        began = time.monotonic()
        with pytest.raises(
            WorkflowBlocked, match=f"waits on child {child_id!r}, which does not exist"
        ) as info:
            parent.result(timeout=60)
        assert info.value.kind == "data_lost" and time.monotonic() - began < 20
        # The async client's waiter, and a Redis Cluster's wait (each caller on its own
        # connection, tried here on one Redis): they waited their whole timeout.
        for wait in (
            lambda: asyncio.run(AsyncWorkflowStub(parent).result(timeout=60)),
            lambda: wait_alone(store, parent._ref(), time.monotonic() + 60),
        ):
            began = time.monotonic()
            with pytest.raises(WorkflowBlocked, match=f"waits on child {child_id!r}, which does not exist"):
                wait()
            assert time.monotonic() - began < 20
        reason = parent.blocked()
        assert reason is not None and reason.kind == "data_lost" and reason.child == child_id
        assert "no start of it is on its way" in reason.message
        blocked = json.loads(cli_ok("list", "--status", "blocked", "--json"))
        assert [r["workflow_id"] for r in blocked] == [parent_id]
    finally:
        stop(worker)
    # A start that is in the parent's outbox (no worker has carried it out yet) is on its way.
    [gone] = children_gone(store, [parent._ref()])
    assert gone is not None and gone.child == child_id
    start = codec.pack({"kind": "start", "wid": child_id, "type": "GoThenClose"})
    store.redis.xadd(store.keys.outbox(store.keys.partition(parent_id)), {"m": start})
    assert children_gone(store, [parent._ref()]) == [None]
    parent.terminate("its child is gone")
