"""Recovery bounds with real worker processes (issue 13, items 6-8).

* A SIGKILLed worker's run continues within heartbeat timeout + sticky timeout (5 s) + the
  activity's own time: its next workflow task does not wait for the dead worker's lease.
* A reclaimed activity attempt gets the last heartbeat details.
* No attempt of a terminated or cancelled run's queued activities starts.
"""

from __future__ import annotations

import signal
import time

import pytest
from apps.recovery import NOTES, MailingToStop, OneRecoveringActivity
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.redis_store import RedisStore

HEARTBEAT_TIMEOUT = 2.0  # apps.recovery.BeatingUntilKilled
STICKY_TIMEOUT = 5.0  # the worker's default --sticky-timeout
RETRY_BACKOFF = 0.1  # apps.recovery.BeatingUntilKilled's retry policy


def _notes(store: RedisStore, key: str) -> list[str]:
    return [v.decode() for v in store.redis.lrange(NOTES + key, 0, -1)]


def _leased(store: RedisStore, n: int) -> bool:
    """``n`` workers hold their leases (they are serving)."""
    return len(store.redis.keys(store.keys.alive(0, "*"))) >= n


def _private_stream(store: RedisStore, stub: WorkflowStub) -> str:
    ref = store.ref(stub.id)
    host = store.redis.hget(store.keys.run(ref.partition, ref.run_id), "sticky")
    return store.keys.workflow_tasks(ref.partition, host.decode()) if host else ""


# ----------------------------------------------------------------- the sticky sweep
def _sticky_run(store: RedisStore, host: str, rid: str, age_ms: int) -> str:
    """A run sticky to the live ``host`` whose workflow task has waited ``age_ms`` unread."""
    k = store.keys
    stream, queue = k.workflow_tasks(0, host), k.workflow_tasks(0, "default")
    store.redis.set(k.alive(0, host), "x", px=60_000)
    store.redis.sadd(k.sticky_hosts(0), host)
    store.redis.hset(k.run(0, rid), mapping={"wq": queue, "sticky": host, "task": "1"})
    now = store.server_time_ms()
    store.redis.xadd(stream, {"run": rid}, id=f"{now - age_ms}-{len(rid)}")
    return stream


def test_the_sweep_hands_back_only_sticky_tasks_left_unread_too_long(store: RedisStore) -> None:
    k, r = store.keys, store.redis
    stream = _sticky_run(store, "@stuck", "old", age_ms=8000)
    _sticky_run(store, "@stuck", "young", age_ms=1000)
    store.ensure_groups([stream, k.workflow_tasks(0, "default")])
    moved, wait_ms = store.sweep_sticky(5000)
    assert moved == 1
    assert wait_ms is not None and 3500 <= wait_ms <= 4000, "the young task times out in ~4 s"
    assert [f[b"run"] for _, f in r.xrange(k.workflow_tasks(0, "default"))] == [b"old"]
    assert [f[b"run"] for _, f in r.xrange(stream)] == [b"young"]
    assert r.hget(k.run(0, "old"), "sticky") is None, "its later tasks go to the shared queue"
    assert r.hget(k.run(0, "young"), "sticky") == b"@stuck"


def test_the_sweep_leaves_tasks_the_owner_has_read(store: RedisStore) -> None:
    k, r = store.keys, store.redis
    stream = _sticky_run(store, "@busy", "deciding", age_ms=8000)
    store.ensure_groups([stream])
    r.xreadgroup("workers", "busy-consumer", {stream: ">"}, count=10)
    assert store.sweep_sticky(5000) == (0, None)
    assert r.xlen(stream) == 1 and r.hget(k.run(0, "deciding"), "sticky") == b"@busy"


# ------------------------------------------------------------- real worker processes
@pytest.mark.slow
@pytest.mark.fault
def test_a_killed_workers_run_completes_within_heartbeat_plus_sticky_timeout(
    redis_url: str, store: RedisStore
) -> None:
    victim = spawn_worker(redis_url, app="apps.recovery")  # default --claim-idle 30, --sticky-timeout 5
    other = None
    try:
        stub = WorkflowStub.make(OneRecoveringActivity).start("beating", "kill")
        wait_for(lambda: _notes(store, "kill") == ["attempt 1"], timeout=30)
        assert _private_stream(store, stub), "the run is sticky to the worker running its activity"
        other = spawn_worker(redis_url, app="apps.recovery")
        wait_for(lambda: _leased(store, 2), timeout=30)
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.wait(5)
        assert stub.result(timeout=60) == 2
        took = time.monotonic() - killed
    finally:
        stop(victim)
        if other is not None:
            stop(other)
    # The heartbeat timeout, the retry's backoff, the sticky timeout; slack for a loaded machine.
    # Without the sticky timeout the result waited for the dead worker's 30 s lease.
    bound = HEARTBEAT_TIMEOUT + RETRY_BACKOFF + STICKY_TIMEOUT + 2.5
    print(f"\nSIGKILL mid-activity -> run completed in {took:.2f} s (bound {bound:.1f} s)")
    assert took < bound
    assert took > HEARTBEAT_TIMEOUT


@pytest.mark.slow
@pytest.mark.fault
def test_a_reclaimed_activity_gets_its_last_heartbeat_details(redis_url: str, store: RedisStore) -> None:
    fast = ("--claim-idle", "1.5")
    victim = spawn_worker(redis_url, app="apps.recovery", extra=fast)
    try:
        stub = WorkflowStub.make(OneRecoveringActivity).start("resumable", "reclaim")
        wait_for(lambda: _notes(store, "reclaim") == ["beat"], timeout=30)
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
    finally:
        stop(victim)
    other = spawn_worker(redis_url, app="apps.recovery", extra=fast)
    try:
        # Attempt 1 again (no heartbeat timeout: the task entry was reclaimed), with its details.
        assert stub.result(timeout=30) == [{"step": 3}, 1]
    finally:
        stop(other)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("how", ["terminate", "cancel"])
def test_no_queued_activity_of_a_closed_run_starts(redis_url: str, store: RedisStore, how: str) -> None:
    worker = spawn_worker(redis_url, app="apps.recovery", extra=("--concurrency", "2"))
    try:
        stub = WorkflowStub.make(MailingToStop).start(how, 200)
        wait_for(lambda: len(_notes(store, how)) >= 4, timeout=30)
        getattr(stub, how)("stop the mailing")
        closed = time.time()
        wait_for(lambda: stub.status() in ("terminated", "cancelled"), timeout=15)
        # The 196-odd queued tasks are read, refused and dropped: the activity queues drain.
        k = store.keys
        queues = [k.activity_tasks(p, "default") for p in range(k.partitions)]
        wait_for(lambda: sum(store.redis.xlen(q) for q in queues) == 0, timeout=30)
        time.sleep(0.5)  # anything still slipping through would note itself by now
    finally:
        stop(worker)
    started = [float(t) for t in _notes(store, how)]
    # In-flight attempts began before the run closed; an attempt that passed its begin check
    # just before may note itself a moment later (the note is its first line): 50 ms of grace.
    late = [t - closed for t in started if t > closed + 0.05]
    print(f"\n{how}: {len(started)} of 200 e-mails started, {len(late)} after the run closed")
    assert late == []
    assert len(started) < 20
