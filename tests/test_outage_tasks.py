"""Redis refusing writes (OOM at ``maxmemory``): workflow tasks a worker read but could not
finish are decided again once Redis answers, and a worker can start meanwhile."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from apps.basic import Parent, Sequence
from redis import exceptions as rexc

from durable import WorkflowStub, codec
from durable.store.embedded import EmbeddedRedis
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore
from workers import worker as worker_module
from workers.outbox import handle_outbox
from workers.worker import Worker, WorkerThread

SCRIPT_OOM = (
    "Error running script (call to f_1): @user_script:1: @user_script: 1: "
    "-OOM command not allowed when used memory > 'maxmemory'."
)


def refuse_commits_when(store: RedisStore, refuse: Callable[[list[Any]], bool]) -> None:
    """Make ``store`` refuse (as Redis at maxmemory does) each batch of commits ``refuse`` picks
    (given the batch's ``(ref, plan)`` decisions): none of it is committed, each gets the error.
    A batch is judged whole, once its last decision is added; what is not refused is committed."""
    commits = store.commits

    class Refusing:
        def __init__(self, part: int | None = None) -> None:
            self.decisions: list[Any] = []

        def add(self, ref: Any, plan: Any) -> None:
            store.commit_args(ref, plan)  # what cannot be packed raises here, as it would
            self.decisions.append((ref, plan))

        def outcomes(self) -> list[Any]:
            if refuse(self.decisions):
                return [rexc.ResponseError(SCRIPT_OOM)] * len(self.decisions)
            real = commits(part=None)
            for ref, plan in self.decisions:
                real.add(ref, plan)
            return real.outcomes()

    store.commits = Refusing  # type: ignore[method-assign,assignment]


def refuse_commits(
    store: RedisStore, seconds: float, starting: Callable[[Any], bool] = lambda _: True
) -> list[float]:
    """Make ``store`` refuse commits for ``seconds`` (as Redis at maxmemory does), from the first
    batch ``starting`` picks; returns the list that gets the refusal's end once it began."""
    refusing: list[float] = []

    def refuse(decisions: Any) -> bool:
        if not refusing and starting(decisions):
            refusing.append(time.monotonic() + seconds)
        return bool(refusing) and time.monotonic() < refusing[0]

    refuse_commits_when(store, refuse)
    return refusing


def _unclaimed(worker: Worker) -> Worker:
    """``worker`` with claimed dispatch off: a claimed task's result rides with the run's next
    decision, so only a task read from a queue has its result go through the inbox and wake the
    run on the worker's private (sticky) stream, the path these tests refuse."""
    worker.decider.claims_activity = lambda _scheduled: False
    return worker


def test_a_sticky_task_refused_at_maxmemory_is_decided_again(store: RedisStore) -> None:
    worker = _unclaimed(Worker(store, concurrency=2, grace=5, claim_idle_ms=1000, block_ms=100))
    refused: list[str] = []

    def refuse_first_sticky(decisions: Any) -> bool:
        # Redis at maxmemory refuses the commit of the first task read from the worker's
        # private stream: the task stays pending in its own consumer's list.
        sticky = [plan.task for _, plan in decisions if plan.task and ":wq:@" in plan.task[0]]
        if sticky and not refused:
            refused.append(sticky[0][0])
            return True
        return False

    refuse_commits_when(store, refuse_first_sticky)
    with WorkerThread(worker):
        stub = WorkflowStub.make(Sequence).start(3)
        assert stub.result(timeout=15) == 3
    assert refused


def test_tasks_refused_at_maxmemory_are_decided_again_when_redis_answers_not_after_a_reclaim(
    store: RedisStore,
) -> None:
    """The worker that read them decides them again as soon as a commit goes through: they do not
    wait out --claim-idle (30 s by default) pending in its list while the run shows as pending
    and nothing says why."""
    worker = Worker(store, concurrency=2, grace=5, claim_idle_ms=60_000, block_ms=100)
    refusing = refuse_commits(store, 1.0)
    with WorkerThread(worker):
        stub = WorkflowStub.make(Sequence).start(3)
        assert stub.result(timeout=15) == 3
    assert refusing
    assert not store.dead_letters()


def test_outbox_messages_an_outage_interrupts_are_carried_out_when_redis_answers(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The messages (child starts and results here) read with the interrupted one are not left for
    a reclaim after --claim-idle either: the rest of the read is kept for the next pass."""
    worker = Worker(store, concurrency=2, grace=5, claim_idle_ms=60_000, block_ms=100)
    failed: list[str] = []

    def lose_the_first(*args: Any) -> None:
        if not failed:
            failed.append(args[3])
            raise rexc.ConnectionError("Connection closed by server.")
        handle_outbox(*args)

    monkeypatch.setattr(worker_module, "handle_outbox", lose_the_first)
    with WorkerThread(worker):
        stub = WorkflowStub.make(Parent).start(3)
        assert stub.result(timeout=15) == [1, 3, 6]
    assert failed
    assert not store.dead_letters()


def test_tasks_delivered_to_a_read_an_outage_cut_off_are_taken_back_when_redis_answers(
    store: RedisStore,
) -> None:
    """Redis delivered a task to the worker's read and the connection dropped before the reply
    came: the task sits in the worker's pending list, unseen. Once Redis answers the worker puts
    such tasks back in line for itself, rather than leave them to a reclaim after --claim-idle."""
    worker = Worker(store, concurrency=2, grace=5, claim_idle_ms=60_000, block_ms=100)
    stub = WorkflowStub.make(Sequence, store=store).start(3)
    stream = store.keys.workflow_tasks(store.ref(stub.id).partition, "default")
    store.ensure_groups([stream])
    assert store.redis.xreadgroup(GROUP, worker.consumer, {stream: ">"})  # the reply the drop lost
    read = worker.reader.read
    cut: list[int] = []

    def cut_off(*args: Any, **kwargs: Any) -> Any:
        if not cut:
            cut.append(1)
            raise rexc.ConnectionError("Connection closed by server.")
        return read(*args, **kwargs)

    worker.reader.read = cut_off  # type: ignore[method-assign]
    with WorkerThread(worker):
        assert stub.result(timeout=15) == 3
    assert cut


@pytest.mark.slow
def test_an_outage_longer_than_the_crash_loop_guard_blocks_no_run(store: RedisStore) -> None:
    # Commits refused for 5 s, ten times --claim-idle: a worker reclaiming its tasks all the while
    # would count each claim as a delivery and block the run as a crash loop (max_deliveries=3).
    worker = _unclaimed(
        Worker(store, concurrency=2, grace=5, claim_idle_ms=500, block_ms=100, max_deliveries=3)
    )
    refusing = refuse_commits(
        store,
        5.0,
        starting=lambda decisions: any(plan.task and ":wq:@" in plan.task[0] for _, plan in decisions),
    )
    with WorkerThread(worker):
        stub = WorkflowStub.make(Sequence).start(3)
        assert stub.result(timeout=30) == 3
    assert refusing
    assert not store.dead_letters()


def test_a_claimed_result_refused_at_maxmemory_is_recorded_once_redis_answers(store: RedisStore) -> None:
    # The commit carrying a claimed task's result with the run's next decision is refused, and
    # so is the completion script it falls back to, for a second: the result stays in hand (its
    # task pending for the worker) and is recorded once Redis answers; the activity never reruns.
    worker = Worker(store, concurrency=2, grace=5, claim_idle_ms=5000, block_ms=100)
    refusing: list[float] = []
    complete_many, complete_then_load = store.complete_many, store.complete_then_load
    refused: list[str] = []

    def refuse_claimed_results(decisions: Any) -> bool:
        carries = any(r.entry_id for _, plan in decisions for r in plan.eager)
        if carries and not refusing:
            refusing.append(time.monotonic() + 1.0)
        if carries and time.monotonic() < refusing[0]:
            refused.append("commit")
            return True
        return False

    def refusing_completions(complete: Any) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            if refusing and time.monotonic() < refusing[0]:
                refused.append("completion")
                raise rexc.ResponseError(SCRIPT_OOM)
            return complete(*args, **kwargs)

        return refuse

    refuse_commits_when(store, refuse_claimed_results)
    store.complete_many = refusing_completions(complete_many)  # type: ignore[method-assign]
    store.complete_then_load = refusing_completions(complete_then_load)  # type: ignore[method-assign]
    with WorkerThread(worker):
        stub = WorkflowStub.make(Sequence).start(3)
        assert stub.result(timeout=15) == 3
    assert refused[0] == "commit" and "completion" in refused
    assert worker.activities_run == 3
    assert not store.dead_letters()


def test_a_store_opens_while_redis_is_at_maxmemory(fresh_redis: EmbeddedRedis) -> None:
    # A worker (re)starting during the outage opens its store: that must not need a write.
    RedisStore(fresh_redis.url).close()
    client = redis.Redis.from_url(fresh_redis.url)
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", client.info("memory")["used_memory"] + 1)
        with pytest.raises(rexc.OutOfMemoryError):
            client.set("k", "v" * 10_000)
        RedisStore(fresh_redis.url).close()
    finally:
        client.config_set("maxmemory", 0)
        client.close()


@pytest.mark.parametrize("went_through", [False, True], ids=["refused", "reply-lost"])
def test_activity_tasks_an_outage_kept_from_going_back_are_handed_back_when_redis_answers(
    store: RedisStore, went_through: bool
) -> None:
    """A read brought an activity task beyond the worker's room; the outage cut its hand-back
    short, so it sat pending for this worker: it would wait for a reclaim after --claim-idle
    (60 s here) while `durable status` said it waited on its queue. Once Redis answers, it goes
    back to its queue, and only once (the hand-back may have gone through, its reply lost)."""
    worker = _unclaimed(Worker(store, concurrency=2, grace=5, claim_idle_ms=60_000, block_ms=100))
    takes = worker.activities.takes
    refused: list[bytes] = []

    def no_room_once(fields: dict[bytes, bytes]) -> bool:
        if not refused:
            refused.append(fields[b"body"])
            return False  # beyond the room: handed back
        return takes(fields)

    requeue = store.requeue
    lost: list[str] = []

    def cut_off(tasks: Any) -> None:
        if not lost:
            lost.append(next(iter(tasks)))
            if went_through:
                requeue(tasks)  # the outage lost only its reply
            raise rexc.ConnectionError("Connection closed by server.")
        requeue(tasks)

    worker.activities.takes = no_room_once  # type: ignore[method-assign]
    store.requeue = cut_off  # type: ignore[method-assign]
    with WorkerThread(worker):
        stub = WorkflowStub.make(Sequence, store=store).start(2)
        assert stub.result(timeout=15) == 1
    assert refused and lost
    stream = lost[0]
    bodies = [fields[b"body"] for _, fields in store.redis.xrange(stream)]
    assert bodies.count(refused[0]) <= 1  # not queued twice (acked and deleted once it ran)
    assert not store.redis.xpending(stream, GROUP)["pending"]


def test_an_outbox_message_an_outage_interrupts_is_no_error_in_the_log(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A child start a Redis restart cut short logged an ERROR with its traceback, where every
    other part of the worker says the outage once, as a WARNING, and nothing was lost."""

    def lost(*_args: Any, **_kw: Any) -> None:
        raise rexc.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(store, "start", lost)
    message = {"kind": "start", "type": "Sequence", "wid": "kid", "rid": "r", "args": b"", "queue": "default"}
    fields = {b"m": codec.pack({**message, "parent": {"wid": "p", "rid": "pr", "cid": "1"}})}
    with pytest.raises(rexc.ConnectionError):
        handle_outbox(store, 0, store.keys.outbox(0), "1-0", fields)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
