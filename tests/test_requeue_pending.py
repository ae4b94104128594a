"""A leaving worker hands back the tasks it was delivered but did not finish, so they run
elsewhere at once instead of waiting out ``--claim-idle`` (``lua/requeue_pending.lua``)."""

from __future__ import annotations

import signal
import time

import redis
from apps.recovery import OneRecoveringActivity
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore


def test_only_the_leaving_consumers_pending_tasks_move_with_their_fields(store: RedisStore) -> None:
    r: redis.Redis = store.redis
    stream = store.keys.activity_tasks(0, "default")
    store.ensure_groups([stream])
    ids = [r.xadd(stream, {"task": f"t{i}".encode(), "n": str(i).encode()}) for i in range(3)]
    r.xreadgroup(GROUP, "gone", {stream: ">"}, count=2)
    r.xreadgroup(GROUP, "alive", {stream: ">"}, count=1)

    assert store.requeue_pending([stream, store.keys.activity_tasks(1, "nobody-reads")], "gone") == 2

    consumers = {c["name"].decode(): c["pending"] for c in r.xinfo_consumers(stream, GROUP)}
    assert consumers["gone"] == 0 and consumers["alive"] == 1
    entries = r.xrange(stream)
    assert [e[0] for e in entries][:1] == [ids[2]]  # the other consumer's task stays where it was
    assert sorted(e[1][b"task"] for e in entries[1:]) == [b"t0", b"t1"]  # the moved ones, at the end
    # They are new, undelivered entries: any worker's next read takes them.
    again = r.xreadgroup(GROUP, "next", {stream: ">"}, count=10)
    assert sorted(f[b"n"] for _, f in again[0][1]) == [b"0", b"1"]
    assert store.requeue_pending([stream], "gone") == 0


def test_the_tasks_a_worker_holds_stay_pending_for_it(store: RedisStore) -> None:
    """After an outage a worker puts back what it was given unseen, not what it runs."""
    r: redis.Redis = store.redis
    stream = store.keys.activity_tasks(0, "default")
    other = store.keys.activity_tasks(1, "default")
    store.ensure_groups([stream, other])
    ids = [r.xadd(stream, {"n": str(i).encode()}) for i in range(3)]
    other_id = r.xadd(other, {"n": b"9"})
    r.xreadgroup(GROUP, "w", {stream: ">", other: ">"}, count=3)
    held = {(stream, ids[1].decode()), (other, "1-1")}  # keep names (stream, entry id) pairs

    assert store.requeue_pending([stream, other], "w", keep=held) == 3
    pending = r.xpending_range(stream, GROUP, "-", "+", 10, "w")
    assert [p["message_id"] for p in pending] == [ids[1]]
    assert r.xpending(other, GROUP)["pending"] == 0 and r.xrange(other)[0][0] != other_id


def test_a_stopped_workers_unfinished_activity_runs_elsewhere_without_waiting_for_the_reclaim(
    redis_url: str, store: RedisStore
) -> None:
    # The activity records heartbeat details, then hangs: it outlives the first worker's
    # grace. The claim-idle of 60 s would hold the task that long; the hand-back does not.
    first = spawn_worker(redis_url, app="apps.recovery", extra=("--grace", "0.5", "--claim-idle", "60"))
    second = None
    try:
        stub = WorkflowStub.make(OneRecoveringActivity).start("resumes", "handback")
        wait_for(lambda: store.redis.lrange("test:recovery:handback", 0, -1), timeout=30)
        first.send_signal(signal.SIGTERM)
        first.wait(20)
        assert first.stderr is not None
        log = first.stderr.read().decode()
        assert "handed back 1 task(s) this worker was delivered but did not finish" in log
        stopped = time.monotonic()
        second = spawn_worker(redis_url, app="apps.recovery", extra=("--claim-idle", "60"))
        # The second execution finds the first one's heartbeat details: the same attempt, resumed.
        assert stub.result(timeout=30) == [{"step": 3}, 1]
        assert time.monotonic() - stopped < 30
    finally:
        stop(first)
        if second is not None:
            stop(second)
