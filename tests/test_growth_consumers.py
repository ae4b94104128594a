"""Consumers leave the task streams' consumer groups: every worker start adds its consumer name to
the group of each shared stream it reads (``wq``, ``aq``, the outbox, in every partition), and
nothing removed them: after many restarts ``XINFO CONSUMERS`` listed hundreds of dead ones.

A worker stopping cleanly deletes its own; a live worker's scheduler deletes those of workers
that died (``kill -9``). Never a consumer holding pending entries: ``XGROUP DELCONSUMER`` would
drop them, and their tasks with them.

Real Redis (the shared test server); real worker processes (``tests/procs.py``), each stopped.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
from apps.basic import Sequence, SlowSteps
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore


def shared_streams(store: RedisStore, queue: str = "default") -> list[str]:
    k = store.keys
    parts = range(k.partitions)
    return [
        *(k.workflow_tasks(p, queue) for p in parts),
        *(k.activity_tasks(p, queue) for p in parts),
        *(k.outbox(p) for p in parts),
    ]


def consumers(store: RedisStore, streams: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Consumer name -> stream -> its pending entries, over ``streams`` (the shared ones)."""
    out: dict[str, dict[str, int]] = {}
    for stream in streams or shared_streams(store):
        try:
            rows = store.redis.xinfo_consumers(stream, GROUP)
        except redis.ResponseError:
            continue  # no such stream or group
        for row in rows:
            out.setdefault(row["name"].decode(), {})[stream] = int(row["pending"])
    return out


def started(store: RedisStore, proc: subprocess.Popen, before: set[str]) -> str:
    """Wait until the worker process ``proc`` registered; returns its consumer name (also its
    registry name). Redis 6.2 adds a consumer to a group only when it delivers it an entry;
    Redis 7 at its first read of the stream."""

    def new_one() -> str | None:
        assert proc.poll() is None, "the worker exited"
        fresh = [w.name for w in store.live_workers() if w.name not in before]
        return fresh[0] if fresh else None

    name = wait_for(new_one, timeout=20)
    assert name is not None
    return name


# ------------------------------------------------------------------------- the rule itself


def test_only_consumers_without_pending_entries_are_deleted(store: RedisStore) -> None:
    r = store.redis
    a, b = store.keys.activity_tasks(0, "default"), store.keys.workflow_tasks(0, "default")
    store.ensure_groups([a, b])
    for i in range(3):
        r.xadd(a, {"n": str(i)})
    r.xreadgroup(GROUP, "holds", {a: ">"}, count=1)  # one pending entry
    r.xreadgroup(GROUP, "idle", {a: ">"}, count=1)
    r.xreadgroup(GROUP, "live", {a: ">"}, count=1)
    r.xadd(b, {"n": "3"})
    r.xreadgroup(GROUP, "idle", {b: ">"}, count=1)
    for stream in (a, b):  # "idle" finished its tasks: nothing pending
        for row in r.xpending_range(stream, GROUP, "-", "+", 10, consumername="idle"):
            r.xack(stream, GROUP, row["message_id"])

    # A stopping worker: only its own consumer, only where it holds nothing.
    assert store.forget_consumer([a, b], "holds") == (0, 1)
    assert set(consumers(store, [a])) == {"holds", "idle", "live"}

    # Consumers read too recently are kept (a worker that just started may not be named yet).
    assert store.drop_dead_consumers([a, b], live=["live"], idle_ms=60_000) == (0, 0)
    # The dead: "idle" goes from both streams; "holds" stays while its entry is pending.
    assert store.drop_dead_consumers([a, b], live=["live"], idle_ms=0) == (2, 1)
    assert set(consumers(store, [a, b])) == {"holds", "live"}
    assert r.xpending(a, GROUP)["pending"] == 2  # nobody's pending entries were dropped

    # Once its entry is reclaimed by a live worker, the dead consumer goes at the next sweep.
    r.xautoclaim(a, GROUP, "live", 0, "0-0")
    assert store.drop_dead_consumers([a, b], live=["live"], idle_ms=0) == (1, 0)
    assert set(consumers(store, [a, b])) == {"live"}
    assert r.xpending(a, GROUP)["pending"] == 2
    # A stream without a group, or none at all, is no error.
    assert store.drop_dead_consumers([store.keys.activity_tasks(1, "nobody")], live=[], idle_ms=0) == (0, 0)


# ------------------------------------------------------------------------- real workers


@pytest.mark.slow
def test_restarted_workers_leave_no_consumer_behind(redis_url: str, store: RedisStore) -> None:
    restarts, runs = 3, 16
    seen: set[str] = set()
    for i in range(restarts):
        proc = spawn_worker(redis_url, extra=("--grace", "2"))
        try:
            seen.add(started(store, proc, seen))
            # Runs in most partitions: the worker is delivered tasks from most shared streams.
            stubs = [
                WorkflowStub.make(Sequence, id=f"growth-{i}-{n}", store=store).start(2) for n in range(runs)
            ]
            assert [s.result(timeout=15) for s in stubs] == [1] * runs
            held = sum(len(s) for s in consumers(store).values())
        finally:
            assert stop(proc) == 0
        left = consumers(store)
        print(f"start {i + 1}: its consumer was in {held} groups; after its stop: {left}")
        # Old code: each start's consumer stayed in every group it had been delivered from.
        assert held >= runs // 2 and not left
    assert len(seen) == restarts


@pytest.mark.fault
def test_a_killed_workers_consumers_are_deleted_by_a_live_worker_after_its_tasks_are_reclaimed(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    # The survivor sweeps dead workers' consumers every --claim-idle; the victim's registry
    # entry lapses 10 s after its death (REGISTRY_TTL_MS), and only then is it taken for dead.
    victim = spawn_worker(redis_url, extra=("--claim-idle", "1"))
    survivor = None
    try:
        dead = started(store, victim, set())
        # The victim dies holding a task: the slow activity it runs (the only worker yet).
        path = tmp_path / "slow.log"
        stub = WorkflowStub.make(SlowSteps, store=store).start(str(path), 1, 4.0)
        wait_for(path.exists, timeout=15)
        survivor = spawn_worker(redis_url, extra=("--claim-idle", "1", "--grace", "1"))
        keep = started(store, survivor, {dead})
        assert sum(consumers(store)[dead].values()) == 1  # its pending activity task
        victim.kill()
        victim.wait(5)
        killed = time.monotonic()
        # Its task is reclaimed and run again; its consumer leaves every group, none lost.
        assert stub.result(timeout=20) == ["s0", "end"]
        wait_for(lambda: dead not in consumers(store), timeout=20)
        print(f"killed worker's consumers gone {time.monotonic() - killed:.1f} s after the kill")
        assert set(consumers(store)) == {keep}
        assert path.read_text().count("start s0") == 2  # ran again elsewhere: the task was kept
    finally:
        stop(victim)
        if survivor is not None:
            assert stop(survivor) == 0


@pytest.mark.fault
def test_a_killed_workers_consumers_go_from_a_queue_no_live_worker_serves(
    redis_url: str, store: RedisStore
) -> None:
    """Nobody reads the queue any more, so no worker of its own sweeps it: a live worker of
    another queue does (the queue is known: tasks were sent to it)."""
    victim = spawn_worker(redis_url, extra=("--queue", "other"))
    survivor = None
    try:
        dead = started(store, victim, set())
        stubs = [WorkflowStub.make(Sequence, store=store, queue="other").start(2) for _ in range(8)]
        assert [s.result(timeout=15) for s in stubs] == [1] * 8
        streams = shared_streams(store, "other")[: -store.keys.partitions]  # wq and aq, no outbox
        assert dead in consumers(store, streams)
        victim.kill()
        victim.wait(5)
        survivor = spawn_worker(redis_url, extra=("--claim-idle", "1"))
        started(store, survivor, {dead})
        # Its registry entry lapses 10 s after the kill; the survivor's next sweep deletes them.
        wait_for(lambda: dead not in consumers(store, streams), timeout=30)
    finally:
        stop(victim)
        if survivor is not None:
            assert stop(survivor) == 0


def test_tasks_of_closed_runs_leave_a_queue_no_live_worker_serves(redis_url: str, store: RedisStore) -> None:
    """Runs started on a queue no worker serves, then terminated (and purged): their workflow
    tasks stayed in its stream for ever, counted by `durable workers` and the backlog metric."""
    stubs = [WorkflowStub.make(Sequence, queue="typo-q", store=store).start(1) for _ in range(5)]
    stubs[0].terminate("typo")
    stubs[1].terminate("typo")
    streams = [store.keys.workflow_tasks(p, "typo-q") for p in range(store.keys.partitions)]
    assert sum(store.redis.xlen(s) for s in streams) == 5
    assert store.drop_void_tasks(streams) == 2  # the open runs' tasks stay
    assert sum(store.redis.xlen(s) for s in streams) == 3
    for stub in stubs[2:]:
        stub.terminate("typo")
    worker = spawn_worker(redis_url, extra=("--claim-idle", "1"))  # serves 'default' only
    try:
        wait_for(lambda: sum(store.redis.xlen(s) for s in streams) == 0, timeout=30)
    finally:
        stop(worker)
