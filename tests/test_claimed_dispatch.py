"""A commit reads the activity tasks it schedules for the committing worker (claimed dispatch).

When the deciding worker serves an activity's queue and has room for it (a thread free, or
for activities that take microseconds, a short wait for one), the commit script
adds the task to its stream and reads it for that worker in the same script: the task is in
the consumer group's pending list (recovered like any task read if the worker dies), and
when it is the stream's only waiting task its attempt begins there too. These tests drive
the decider and the commit script directly against a real Redis. A worker with a free thread
claims every activity it schedules, so the SIGKILL tests of ``test_recovery.py`` (a killed
worker's attempt reclaimed by another worker) run claimed attempts.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import apps.basic
import pytest
from apps.basic import AddsAtOnce, Sequence

from durable import WorkflowStub, codec
from durable import events as ev
from durable.registry import register_module_functions
from durable.replay import Driver
from durable.store.activities import Begun
from durable.store.keys import GROUP
from durable.store.records import ClaimedTask
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask, AttemptResult
from workers.activity_host import MOST_PER_THREAD
from workers.attempts import completion, execute_attempt
from workers.decider import Decider
from workers.worker import Worker


def _decide_and_commit(store: RedisStore, workflow_id: str, decider: Decider) -> list[ClaimedTask]:
    """Decide the first workflow task of ``workflow_id`` with ``decider`` and commit it."""
    claimed: list[ClaimedTask] = []
    decider.on_claimed = claimed.append
    ref = store.ref(workflow_id)
    record, _inbox, rows = store.load_for_decision(ref.partition, ref.run_id, 0)
    driver = Driver(run_id=ref.run_id, workflow_id=workflow_id)
    driver.replay(store.decode_history(ref, rows))
    decision = driver.decide([])
    # The run's workflow task (the commit acks and deletes it, as a worker's would).
    wq = store.keys.workflow_tasks(ref.partition, "default")
    task = next((wq, i.decode()) for i, f in store.redis.xrange(wq) if f[b"run"].decode() == ref.run_id)
    plan = decider.commit_plan(ref, record, driver, decision, task)
    result = store.commit(ref, plan)
    decider._after_commit(ref, driver, decision, plan, result)
    return claimed


def _claiming(store: RedisStore, consumer: str) -> Decider:
    """A decider whose worker claims every activity it schedules (a thread always free)."""
    return Decider(store, cache_size=0, claims_activity=lambda _scheduled: True, claimer=consumer)


def _pending_for(store: RedisStore, stream: str) -> dict[str, str]:
    return {
        row["message_id"].decode(): row["consumer"].decode()
        for row in store.redis.xpending_range(stream, GROUP, min="-", max="+", count=100)
    }


def test_the_commit_reads_and_begins_the_task_it_schedules_for_its_worker(store: RedisStore) -> None:
    WorkflowStub.make(Sequence, id="claim-1").start(2)
    ref = store.ref("claim-1")
    stream = store.keys.activity_tasks(ref.partition, "default")
    store.ensure_groups([stream])

    claimed = _decide_and_commit(store, "claim-1", _claiming(store, "w-claim"))

    assert len(claimed) == 1
    task = claimed[0]
    assert task.stream == stream and task.began_ms > 0
    body = ActivityTask.decode(task.fields[b"body"])
    assert (body.run_id, body.name, body.attempt) == (ref.run_id, "add", 1)
    # The task the decision built comes along: the activity thread need not decode the body.
    assert task.task == body
    # Pending for the claimer, like a task it read: a reclaim finds it if that worker dies.
    assert _pending_for(store, stream) == {task.entry_id: "w-claim"}
    # Begun in the commit: describe names the worker running attempt 1.
    begun = store.attempts_begun(ref.partition, ref.run_id, [body.activity_id])[body.activity_id]
    assert (begun.attempt, begun.worker) == (1, "w-claim") and begun.started_ms > 0


def test_an_older_waiting_task_is_claimed_first_and_begun_as_usual(store: RedisStore) -> None:
    older_id_of_run = "claim-old"
    p = store.keys.partition(older_id_of_run)
    newer = next(f"claim-new-{i}" for i in range(1000) if store.keys.partition(f"claim-new-{i}") == p)
    for wid in (older_id_of_run, newer):
        WorkflowStub.make(Sequence, id=wid).start(1)
    stream = store.keys.activity_tasks(p, "default")
    store.ensure_groups([stream])
    # An older task waits in the stream, read by nobody yet.
    _decide_and_commit(store, older_id_of_run, Decider(store, cache_size=0))  # claims nothing
    waiting = store.redis.xrange(stream)
    assert len(waiting) == 1
    older_id = waiting[0][0].decode()

    claimed = _decide_and_commit(store, newer, _claiming(store, "w-claim"))

    # FIFO: the claimer takes the task that waited longest, its attempt not begun by the
    # commit (the worker begins it as for any read task); the new task waits for any worker.
    assert [(c.entry_id, c.began_ms) for c in claimed] == [(older_id, 0)]
    assert claimed[0].task is None  # not the task this decision built: its body is decoded
    assert _pending_for(store, stream) == {older_id: "w-claim"}
    new_id, fields = next((i.decode(), f) for i, f in store.redis.xrange(stream) if i.decode() != older_id)
    new = store.ref(newer)
    aid = ActivityTask.decode(fields[b"body"]).activity_id
    begun = store.attempts_begun(new.partition, new.run_id, [aid])[aid]
    assert (begun.attempt, begun.started_ms, begun.worker) == (1, 0, "")
    got = store.redis.xreadgroup(GROUP, "another", {stream: ">"}, count=10)
    assert [e[0].decode() for _, entries in got for e in entries] == [new_id]


def test_a_worker_claims_only_what_its_backlog_has_room_for(store: RedisStore) -> None:
    """``ActivityHost.claims_here`` reserves a place in the backlog per claim; the rest stay in
    the stream. Until it knows how long its activities take, a worker claims one per thread."""
    w = Worker(store, concurrency=2, block_ms=100)
    try:
        scheduled = ev.ActivityScheduled(id="a", name="add", args=b"", queue="default")
        elsewhere = ev.ActivityScheduled(id="b", name="add", args=b"", queue="other")
        assert not w.activities.claims_here(elsewhere)  # a queue it does not serve
        assert [w.activities.claims_here(scheduled) for _ in range(3)] == [True, True, False]
        w.activities.lease_dropped(2)
        assert w.activities.claims_here(scheduled)
    finally:
        w.activities.lease_dropped(1)
        w.activities.finish(0)


def test_a_worker_whose_activities_take_microseconds_claims_up_to_most_per_thread(
    store: RedisStore,
) -> None:
    """Fast activities wait for a thread less than BACKLOG_MS, so the commit claims more of
    them than there are threads (each skips its own read and begin round trip); slow ones get
    one per thread, so a worker never hoards a fan-out of slow work. The bound is per activity
    type: a type it has not run yet gets one per thread, whatever the others take."""
    w = Worker(store, concurrency=2, block_ms=100)

    def scheduled(name: str) -> ev.ActivityScheduled:
        return ev.ActivityScheduled(id="a", name=name, args=b"", queue="default")

    w.activities.allowed = lambda _name: True  # the names stand for types of various speeds
    try:
        w.activities.pace.ran("add", 50e-6)  # what it measures for activities of 50 µs
        most = 2 * MOST_PER_THREAD  # 5 ms / 50 µs is 100 per thread: the count bound holds
        assert sum(w.activities.claims_here(scheduled("add")) for _ in range(most + 20)) == most
        assert w.activities.waiting() == most - 2
        # A type never run here gets none of that prefetch (but the claims above fill the threads).
        assert not w.activities.claims_here(scheduled("record"))
        w.activities.lease_dropped(most)
        assert sum(w.activities.claims_here(scheduled("record")) for _ in range(20)) == 2
        w.activities.lease_dropped(2)
        w.activities.pace.ran("apply_once", 1e-3)  # 5 per thread by the time bound
        assert sum(w.activities.claims_here(scheduled("apply_once")) for _ in range(20)) == 10
        w.activities.lease_dropped(10)
        w.activities.pace.ran("Slow", 0.05)
        assert sum(w.activities.claims_here(scheduled("Slow")) for _ in range(20)) == 2
        w.activities.lease_dropped(2)
        # A fast type that turns slow loses its prefetch at its first slow run.
        w.activities.pace.ran("add", 30.0)
        assert sum(w.activities.claims_here(scheduled("add")) for _ in range(20)) == 2
        w.activities.lease_dropped(2)
    finally:
        w.activities.finish(0)


def test_claims_beyond_the_threads_all_run_and_are_begun_by_their_commit(store: RedisStore) -> None:
    """A fan-out of fast activities larger than the worker's threads: the commit claims them
    all (the backlog has room), begins their attempts, and every one runs to the result."""
    w = Worker(store, concurrency=1, block_ms=100)
    w.activities.pace.ran("add", 50e-6)  # measured fast: room for MOST_PER_THREAD on the one thread
    claimed: list[ClaimedTask] = []
    on_claimed = w.decider.on_claimed

    def spy(task: ClaimedTask) -> None:
        claimed.append(task)
        on_claimed(task)

    w.decider.on_claimed = spy
    stub = WorkflowStub.make(AddsAtOnce, id="claim-backlog").start(6)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    try:
        assert stub.result(timeout=20) == [i * 2 for i in range(6)]
    finally:
        w.stop()
        thread.join(10)
    assert len(claimed) == 6 and all(task.began_ms for task in claimed)


def test_a_stream_without_its_consumer_group_leaves_the_task_unclaimed_and_the_commit_whole(
    store: RedisStore,
) -> None:
    """A claim that cannot read (the group is gone: NOGROUP) must not break the commit halfway:
    the decision is committed, the task waits in its stream, the thread is given back."""
    stub = WorkflowStub.make(Sequence, id="claim-nogroup").start(2)
    ref = store.ref("claim-nogroup")
    stream = store.keys.activity_tasks(ref.partition, "default")
    store.redis.delete(stream)  # no stream, so no consumer group either
    dropped: list[int] = []
    decider = _claiming(store, "w-claim")
    decider.on_lease_dropped = dropped.append

    claimed = _decide_and_commit(store, "claim-nogroup", decider)

    assert claimed == [] and dropped == [1]
    assert [e.type for e in stub.history()] == ["WorkflowStarted", "ActivityScheduled"]
    assert store.redis.hget(store.keys.run(ref.partition, ref.run_id), "seq") == b"2"
    assert len(store.redis.xrange(stream)) == 1


def test_a_completion_reads_the_woken_task_only_from_its_takers_private_stream(store: RedisStore) -> None:
    """``complete_then_load(taker=...)`` reads for the worker only what waits in its private
    stream; a run not sticky to it has its task in the shared queue, untouched, and a private
    stream that does not exist (no consumer group) does not fail the completion."""
    WorkflowStub.make(Sequence, id="claim-done").start(1)
    ref = store.ref("claim-done")
    store.ensure_groups([store.keys.activity_tasks(ref.partition, "default")])
    (claimed,) = _decide_and_commit(store, "claim-done", _claiming(store, "w-claim"))
    task = ActivityTask.decode(claimed.fields[b"body"])
    outcome = completion(
        AttemptResult(task, codec.dumps(0, path="result"), {}, claimed.stream, claimed.entry_id)
    )

    replies, loads, handed = store.complete_then_load([outcome], [], taker="w-claim", sticky="@nobody")

    assert replies == [("OK", 1)] and loads is None and handed == []
    shared = store.redis.xrange(store.keys.workflow_tasks(ref.partition, "default"))
    assert [f[b"run"].decode() for _, f in shared][-1] == ref.run_id


@pytest.mark.parametrize(
    ("activity", "args", "at_least", "below"), [("add", (1, 2), 0.0, 0.1), ("Slow", None, 0.1, 1.0)]
)
def test_the_backlog_learns_the_time_of_the_activity_code_only(
    store: RedisStore,
    tmp_path: Path,
    activity: str,
    args: tuple[Any, ...] | None,
    at_least: float,
    below: float,
) -> None:
    """``execute_attempt`` reports the seconds the activity's own code took (``on_ran``), not the
    work around it: here a result hand-over that takes 0.3 s. Timing the whole attempt had
    microsecond activities measure milliseconds (its thread waits for the GIL while the main
    thread decides), so the backlog fell to about one per thread."""
    # As a worker's --app does: `add` is a plain function, known by name only once registered
    # (alone, this test ran before any workflow had called it, and the task was parked).
    register_module_functions(apps.basic)
    encoded = codec.dumps(args if args is not None else (str(tmp_path / "slow"), 0.1, "t"))
    task = ActivityTask("r-1", "w-1", 0, "a-1", activity, encoded, 1, "default")
    ran: list[tuple[str, float]] = []
    outcome = execute_attempt(
        store,
        task,
        stream="default",
        begun=Begun(True, now_ms=1),
        on_result=lambda _result: time.sleep(0.3),
        on_ran=lambda name, seconds: ran.append((name, seconds)),
    )
    assert outcome == "completed"
    assert len(ran) == 1 and ran[0][0] == activity and at_least <= ran[0][1] < below


def test_a_claimed_result_still_in_hand_at_shutdown_is_recorded_and_its_task_acked(
    store: RedisStore,
) -> None:
    """A stopping worker records the results it holds through the inbox (no more decisions):
    a claimed task's result carries its entry, so that entry is acked, not left to a reclaim."""
    WorkflowStub.make(Sequence, id="claim-stop").start(1)
    ref = store.ref("claim-stop")
    stream = store.keys.activity_tasks(ref.partition, "default")
    store.ensure_groups([stream])
    (claimed,) = _decide_and_commit(store, "claim-stop", _claiming(store, "w-claim"))
    assert _pending_for(store, stream) == {claimed.entry_id: "w-claim"}
    task = ActivityTask.decode(claimed.fields[b"body"])
    w = Worker(store, concurrency=1, block_ms=100)
    w.activities.eager_done.append(
        AttemptResult(task, codec.dumps(0, path="result"), {}, claimed.stream, claimed.entry_id)
    )
    w.activities.finish(0)
    assert _pending_for(store, stream) == {}
    assert len(store.redis.lrange(store.keys.inbox(ref.partition, ref.run_id), 0, -1)) == 1
