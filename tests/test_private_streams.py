"""A worker's private streams (``T:aq:@<worker>``, ``T:wq:@<worker>``) go when the worker does:
at a clean stop, or at the sweep once a killed worker's lease lapsed; never with a task in them."""

from __future__ import annotations

import signal
from collections.abc import Collection

import pytest
import redis
from apps.basic import Sequence
from apps.sessions import Pinned
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.connect import is_missing_group
from durable.store.redis_store import RedisStore

pytestmark = pytest.mark.slow


def _activity_streams(store: RedisStore) -> dict[str, int]:
    """Worker (private queue name) -> how many private activity streams it has."""
    found: dict[str, int] = {}
    for p in range(store.keys.partitions):
        prefix = store.keys.activity_tasks(p, "@")
        for key in store.redis.scan_iter(match=prefix + "*"):
            host = "@" + key.decode()[len(prefix) :]
            found[host] = found.get(host, 0) + 1
    return found


def _workflow_streams(store: RedisStore, host: str) -> list[str]:
    keys = store.keys
    return [s for p in range(keys.partitions) if store.redis.exists(s := keys.workflow_tasks(p, host))]


def _new_worker(store: RedisStore, known: Collection[str] = ()) -> str:
    """The one worker not in ``known`` that has created its private streams (all partitions)."""

    def started() -> str:
        new = {h: n for h, n in _activity_streams(store).items() if h not in known}
        ready = [h for h, n in new.items() if n == store.keys.partitions]
        return ready[0] if len(ready) == 1 else ""

    return wait_for(started, timeout=30)


def test_a_worker_stopping_cleanly_deletes_its_private_streams(redis_url: str, store: RedisStore) -> None:
    # A long lease and no other worker: only the stopping worker itself can delete them.
    proc = spawn_worker(redis_url, extra=("--claim-idle", "60"))
    try:
        host = _new_worker(store)
        assert WorkflowStub.make(Sequence).start(3).result(timeout=30) == 3
        assert _workflow_streams(store, host)
    finally:
        assert stop(proc) == 0
    assert _activity_streams(store) == {}
    assert _workflow_streams(store, host) == []


@pytest.mark.fault
def test_a_killed_workers_empty_private_streams_are_swept(redis_url: str, store: RedisStore) -> None:
    fast = ("--claim-idle", "1")
    victim = spawn_worker(redis_url, extra=fast)
    try:
        dead = _new_worker(store)
        survivor = spawn_worker(redis_url, extra=fast)
        try:
            alive = _new_worker(store, {dead})
            victim.send_signal(signal.SIGKILL)
            victim.wait(5)
            # The survivor's sweep (every --claim-idle / 3) once the dead worker's lease lapsed.
            wait_for(lambda: dead not in _activity_streams(store), timeout=15)
            assert _activity_streams(store) == {alive: store.keys.partitions}
            assert _workflow_streams(store, dead) == []
        finally:
            assert stop(survivor) == 0
    finally:
        stop(victim)
    assert _activity_streams(store) == {}


@pytest.mark.fault
def test_a_dead_hosts_private_stream_is_kept_while_it_holds_a_task(redis_url: str, store: RedisStore) -> None:
    keys, parts = store.keys, range(store.keys.partitions)
    host_proc = spawn_worker(redis_url, app="apps.sessions", extra=("--claim-idle", "1"))
    try:
        stub = WorkflowStub.make(Pinned).start(2)
        wait_for(lambda: stub.query("progress") == "waiting", timeout=30)
        (host,) = _activity_streams(store)
        host_proc.send_signal(signal.SIGKILL)
        host_proc.wait(5)
    finally:
        stop(host_proc)
    wait_for(lambda: not any(store.redis.exists(keys.alive(p, host)) for p in parts))
    p = store.ref(stub.id).partition
    stream = keys.activity_tasks(p, host)
    # A long lease: this worker sweeps when it starts (the dead host's streams are empty then),
    # and next only after 20 s: meanwhile it queues the session's next task for the dead host.
    decider = spawn_worker(redis_url, app="apps.sessions", extra=("--claim-idle", "60"))
    try:
        wait_for(lambda: host not in _activity_streams(store), timeout=30)
        stub.signal("continue")
        wait_for(lambda: store.redis.xlen(stream) == 1)
        # The sweep's script keeps a private stream that holds a task, its host listed for the
        # sessions sweep...
        assert store.unstick(p, host) == 0
        assert store.redis.xlen(stream) == 1
        assert store.redis.sismember(keys.sessions(p), host)
        # ...which fails the task as before (only the dead host could run it), then deletes it.
        sweeper = spawn_worker(redis_url, app="apps.sessions", extra=("--claim-idle", "1"))
        try:
            result = stub.result(timeout=30)
            wait_for(lambda: not store.redis.exists(stream), timeout=15)
        finally:
            stop(sweeper)
    finally:
        stop(decider)
    assert result["lost"] is True and "stopped" in result["error"]
    assert len(result["ran_on"]) == 2
    assert not store.redis.sismember(keys.sessions(p), host)
    assert _activity_streams(store) == {}


@pytest.mark.parametrize(
    ("reply", "missing"),
    [
        ("NOGROUP No such key 'T:{0}:q:default' or consumer group 'g' in XREADGROUP with GROUP option", True),
        ("UNBLOCKED the stream key no longer exists", True),  # Redis 7, a read blocked on a deleted stream
        ("ERR wrong number of arguments for 'xreadgroup' command", False),
    ],
)
def test_both_answers_to_a_read_of_a_deleted_stream_mean_a_missing_group(reply: str, missing: bool) -> None:
    """The reader makes the group again on either (the embedded Redis 6.2 answers NOGROUP only)."""
    assert is_missing_group(redis.ResponseError(reply)) is missing
