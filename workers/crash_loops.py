"""Activity tasks whose worker keeps dying: failed as an attempt, not run again blindly.

An activity attempt that kills its worker process (``os._exit``, a segfault, the OOM killer)
leaves its task pending in the dead worker's consumer group entry; after ``--claim-idle`` another
worker reclaims it and runs it again, which kills that worker too, and so on forever: every
worker of the queue crash-loops, and the run looks ``running``. (A leased attempt, of an
``--eager`` worker or a local activity, gets here too: its lapsed lease puts it in its queue
again, see :mod:`workers.worker_deaths`.)

What counts is how often the attempt *began* (``begin_attempt.lua`` counts each begin of the
current attempt, and a commit that claims a new task for its worker begins it): a begun attempt
whose outcome never came was running when its worker died. Once an attempt has begun
:data:`MAX_ACTIVITY_DELIVERIES` times so, the next reclaim fails it with
:class:`~durable.errors.ActivityWorkerLost` through the usual failure path
(:func:`workers.attempts.fail_attempt`), so the activity's ``RetryPolicy`` decides: a further
attempt is a new task (begun afresh), and once the policy gives up the workflow sees
``ActivityFailed`` with that cause. A task that only sat in a dying worker's backlog (read or
reclaimed, waiting for a thread) did not begin there and is not blamed. Workflow tasks have the
same guard (``Worker.max_deliveries``, :func:`block_if_decision_crash_loop`: their run is
blocked instead, since a decision's crash is a code bug a deploy fixes).

Which of the attempts running in a process killed it cannot be told from outside: an attempt
that runs, healthy, beside the killer each time the process dies is blamed too.
"""

from __future__ import annotations

from collections.abc import Callable

from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask

from . import metrics
from .attempts import attempt_began, fail_attempt
from .logging import bind_run, unbind_run
from .worker_deaths import MAX_ACTIVITY_DELIVERIES, worker_lost

__all__ = ["MAX_ACTIVITY_DELIVERIES", "fail_if_crash_loop"]


def _never(_due: int) -> None:
    pass


def fail_if_crash_loop(
    store: RedisStore,
    stream: str,
    entry_id: str,
    fields: dict[bytes, bytes],
    *,
    consumer: str,
    on_timer: Callable[[int], None] = _never,
    bound: int = MAX_ACTIVITY_DELIVERIES,
) -> bool:
    """Fail the attempt of a reclaimed activity task that has killed its worker too often.

    Args:
        store: The store.
        stream: The activity task stream the task was reclaimed from.
        entry_id: Its entry id there.
        fields: Its fields.
        consumer: The worker that reclaimed it (named in the log).
        on_timer: Told the due time (ms) of the retry it schedules, if any.
        bound: The begins an attempt may have had (see :data:`MAX_ACTIVITY_DELIVERIES`).

    Returns:
        True when the attempt was failed here (the task entry is acked: do not run it); False
        when the task should run as usual (few begins, undecodable, or no longer current: the
        usual path parks or drops it).
    """
    deliveries = store.delivery_count(stream, entry_id)
    # Each earlier delivery began the attempt at most once, and a leased attempt once before its
    # entry existed: with fewer deliveries than the bound it cannot have begun that often.
    if deliveries < bound:
        return False
    try:
        task = ActivityTask.decode(fields[b"body"])
    except Exception:  # noqa: BLE001 - run_activity parks it with the reason
        return False
    begun = store.attempt_begins(task.partition, task.run_id, task.activity_id)
    # Only the current attempt's begins count: a task that merely sat in dead workers' backlogs
    # is run as usual, and a void one dropped.
    if begun is None or begun.attempt != task.attempt or begun.begins < bound:
        return False
    # This delivery (the reclaim) has not run it: each begin ended with its worker.
    error = worker_lost(task, begun, max(deliveries, begun.begins + 1), consumer)
    ids = {"workflow_id": task.workflow_id, "run_id": task.run_id, "activity_id": task.activity_id}
    token = bind_run({**ids, "activity_type": task.name, "attempt": task.attempt})
    try:
        outcome = fail_attempt(
            store,
            task,
            error,
            stream=stream,
            entry_id=entry_id,
            started=attempt_began(begun.started_ms, store.server_time_ms()),
            on_timer=on_timer,
            started_ms=begun.started_ms,
        )
    finally:
        unbind_run(token)
    metrics.attempt(task.name, stream, outcome, None)
    return True


def block_if_decision_crash_loop(
    store: RedisStore, stream: str, entry_id: str, fields: dict[bytes, bytes], most: int
) -> bool:
    """Block the run of a reclaimed workflow task delivered more than ``most`` times (its decision
    keeps dying with its worker), keeping the task; whether it did."""
    if store.delivery_count(stream, entry_id) <= most:
        return False
    store.park(
        p=store.keys.partition_of_key(stream),
        stream=stream,
        entry_id=entry_id,
        kind="workflow",
        fields=fields,
        run_id=fields.get(b"run", b"").decode(),
        block=True,
        reason=f"the decision did not finish in {most} deliveries (it crashed or hung its worker); fix the "
        "code, then `durable repair`",
    )
    return True
