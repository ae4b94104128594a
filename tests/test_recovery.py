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
from apps.recovery import NOTES, FailsUnprintably, MailingToStop, MailingWithCleanup, OneRecoveringActivity
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub, codec
from durable.runinfo import with_attempts
from durable.store.activities import AttemptBegun
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask
from workers.worker import Worker, WorkerThread

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


# ------------------------------------------------------------------ the begin check
def _queued(store: RedisStore, attempt: int) -> tuple[ActivityTask, str, str]:
    """An activity task of run r-1 in its stream, read by a worker: (task, stream, entry id)."""
    k = store.keys
    stream = k.activity_tasks(0, "default")
    store.ensure_groups([stream])
    task = ActivityTask("r-1", "wf-1", 0, "a1", "send_mail", codec.dumps([]), attempt, stream)
    entry_id = store.redis.xadd(stream, {"run": "r-1", "act": "a1", "body": task.encode()}).decode()
    store.redis.xreadgroup("workers", "w", {stream: ">"})
    return task, stream, entry_id


def test_describe_says_what_an_attempt_not_begun_waits_for(store: RedisStore) -> None:
    """Its queue, its retry time, or (leased: eager mode, a local activity) a thread of its
    worker; a leased one said `queued on 'default', waiting for a worker (backlog 0)`."""
    k, r = store.keys, store.redis
    r.hset(k.activities(0, "r-2"), mapping={"q#": 1, "t#": 2, "l#": 1})
    r.zadd(k.timers(0), {"r|r-2|t": 1_796_000_000_000})  # t's retry is due then
    r.zadd(k.running(0), {"r-2|l|1": 1_796_000_000_000})  # l is leased until then
    steps = [{"kind": "activity", "id": aid, "queue": "default"} for aid in ("q", "t", "l")]
    begun = store.pending_attempts(0, "r-2", steps)
    assert begun == {
        "q": AttemptBegun(1, backlog=0),
        "t": AttemptBegun(2, retry_due_ms=1_796_000_000_000),
        "l": AttemptBegun(1, leased=True),
    }
    pending = with_attempts(steps, begun, {})
    assert [s["state"] for s in pending] == [
        "attempt 1: not begun: queued on 'default', waiting for a worker (backlog 0)",
        "attempt 2: not begun: waiting for its retry time (2026-11-30 00:53:20 UTC), then queued on 'default'",
        "attempt 1: not begun: leased to a worker (eager mode or a local activity), waiting for one of its threads",
    ]


def test_an_attempt_begins_only_while_its_run_is_open_and_it_is_current(store: RedisStore) -> None:
    k, r = store.keys, store.redis
    r.hset(k.run(0, "r-1"), "status", "running")
    r.hset(k.activities(0, "r-1"), mapping={"a1#": 2, "a1:hb": codec.dumps({"step": 3})})
    task, stream, entry_id = _queued(store, 2)
    assert store.attempts_begun(0, "r-1", ["a1", "gone"]) == {"a1": AttemptBegun(2)}  # not begun yet
    begun = store.begin_attempt(task, stream, entry_id, 123_456, 1000, "vm:1:2.1")
    assert begun.ok and codec.loads(begun.details) == {"step": 3}
    assert r.zscore(k.running(0), "r-1|a1|2") == 123_456
    assert r.hget(k.activities(0, "r-1"), "a1:started") == b"1000"
    assert store.attempts_begun(0, "r-1", ["a1"]) == {"a1": AttemptBegun(2, 1000, "vm:1:2.1")}
    r.hset(k.activities(0, "r-1"), "a1#", 3)  # a retry is scheduled: attempt 3 has not begun
    assert store.attempts_begun(0, "r-1", ["a1"]) == {"a1": AttemptBegun(3)}
    r.hset(k.activities(0, "r-1"), "a1#", 2)
    assert r.xlen(stream) == 1, "a begun attempt's task stays until its outcome is recorded"

    stale, stream, entry_id = _queued(store, 1)
    assert store.begin_attempt(stale, stream, entry_id, 0, 0)[:2] == (False, "a newer attempt is current")
    assert r.xlen(stream) == 1, "the refused task is acked and deleted"

    r.hset(k.run(0, "r-1"), "status", "terminated")
    task, stream, entry_id = _queued(store, 2)
    assert store.begin_attempt(task, stream, entry_id, 0, 0).reason == "the run is closed"
    r.hset(k.run(0, "r-1"), "status", "running")
    r.hdel(k.activities(0, "r-1"), "a1#")
    assert store.begin_attempt(task, stream, "", 0, 0).reason.startswith("the activity is no longer pending")
    assert r.xlen(stream) == 1 and r.xpending(stream, "workers")["pending"] == 1, "only the begun one is left"


def test_no_cancelled_activity_starts_while_its_run_goes_on(store: RedisStore) -> None:
    worker = Worker(store, concurrency=1, grace=5, block_ms=100)
    with WorkerThread(worker):
        stub = WorkflowStub.make(MailingWithCleanup).start("cleanup", 60)
        wait_for(lambda: len(_notes(store, "cleanup")) >= 2, timeout=30)
        stub.cancel("stop")
        cancelled = time.time()
        assert stub.result(timeout=30) == "cleaned up"
    late = [float(t) for t in _notes(store, "cleanup") if float(t) > cancelled + 0.05]
    assert late == [] and len(_notes(store, "cleanup:cleanup")) == 1


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


@pytest.mark.slow
def test_an_activity_error_nothing_can_print_fails_the_attempt_once(
    redis_url: str, store: RedisStore
) -> None:
    """Its ``__str__`` and ``__repr__`` raise: the attempt is still recorded (with a stand-in
    message) instead of the recording failing and the task running again on every reclaim."""
    worker = spawn_worker(redis_url, app="apps.recovery", extra=("--claim-idle", "1"))
    try:
        stub = WorkflowStub.make(FailsUnprintably, store=store).start("unprintable")
        assert stub.result(timeout=30) == "caught ActivityFailed"
        time.sleep(2.5)  # past two reclaim intervals: nothing runs it again
        assert _notes(store, "unprintable") == ["ran"]
        record = stub.describe()["attempts"][0]["record"]
        assert record["error"] == "UnprintableError: <UnprintableError: its str() and repr() raised>"
        assert record["final"] == "max_attempts=1 reached"
    finally:
        stop(worker)
