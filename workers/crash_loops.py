"""Activity tasks whose worker keeps dying: failed as an attempt, not run again blindly.

An activity attempt that kills its worker process (``os._exit``, a segfault, the OOM killer)
leaves its task pending in the dead worker's consumer group entry; after ``--claim-idle`` another
worker reclaims it and runs it again, which kills that worker too, and so on forever: every
worker of the queue crash-loops, and the run looks ``running``. Each reclaim (``XAUTOCLAIM``)
counts one more delivery of the task entry, so a task delivered more than
:data:`MAX_ACTIVITY_DELIVERIES` times whose attempt is still current was begun that many times
without its outcome ever recorded. Its attempt is then failed with
:class:`~durable.errors.ActivityWorkerLost` through the usual failure path
(:func:`workers.attempts.fail_attempt`), so the activity's ``RetryPolicy`` decides: a further
attempt is a new task (a fresh delivery count), and once the policy gives up the workflow sees
``ActivityFailed`` with that cause. Workflow tasks have the same guard (``Worker.max_deliveries``:
their run is blocked instead, since a decision's crash is a code bug a deploy fixes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from durable.errors import ActivityWorkerLost
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask

from . import metrics
from .attempts import attempt_began, fail_attempt
from .logging import bind_run, unbind_run

log = logging.getLogger("durable.worker")

MAX_ACTIVITY_DELIVERIES = 3
"""An activity task delivered more often than this without its attempt's outcome recorded has
its attempt failed (:class:`~durable.errors.ActivityWorkerLost`) instead of run again.

Why 3: one death is the ordinary case the reclaim exists for (a worker killed by a deploy, a
node lost) and must run the attempt again; two in a row can still be bad luck (a machine
draining); three deaths of whichever worker runs the same attempt are the attempt's doing. Each
costs a worker restart and ``--claim-idle`` of waiting, so a crash loop now ends after about
3 x ``--claim-idle``."""


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
        bound: The deliveries a task may have had (see :data:`MAX_ACTIVITY_DELIVERIES`).

    Returns:
        True when the attempt was failed here (the task entry is acked: do not run it); False
        when the task should run as usual (few deliveries, undecodable, or no longer current:
        the usual path parks or drops it).
    """
    deliveries = store.delivery_count(stream, entry_id)
    if deliveries <= bound:
        return False
    try:
        task = ActivityTask.decode(fields[b"body"])
    except Exception:  # noqa: BLE001 - run_activity parks it with the reason
        return False
    begun = store.attempts_begun(task.partition, task.run_id, [task.activity_id]).get(task.activity_id)
    # Only an attempt that is current and was begun (by the workers that died) is to blame: a
    # task that merely sat in a dead worker's backlog is run as usual, and a void one dropped.
    if begun is None or begun.attempt != task.attempt or not begun.worker:
        return False
    _fail(store, task, stream, entry_id, deliveries, begun.worker, begun.started_ms, consumer, on_timer)
    return True


def _fail(
    store: RedisStore,
    task: ActivityTask,
    stream: str,
    entry_id: str,
    deliveries: int,
    last_worker: str,
    started_ms: int,
    consumer: str,
    on_timer: Callable[[int], None],
) -> None:
    # This delivery (the reclaim) has not run it: each earlier one ended with its worker.
    deaths = deliveries - 1
    error = ActivityWorkerLost(
        f"the worker process running activity {task.name} ({task.activity_id}) attempt {task.attempt} "
        f"died {deaths} times (os._exit, a crash, the OOM killer?); last on worker {last_worker}",
        deliveries=deliveries,
        worker=last_worker,
    )
    ids = {"workflow_id": task.workflow_id, "run_id": task.run_id, "activity_id": task.activity_id}
    token = bind_run({**ids, "activity_type": task.name, "attempt": task.attempt})
    try:
        log.warning(
            "activity %s (%s) of run %s attempt %d: its worker died %d times running it (last: worker "
            "%s); worker %s fails the attempt instead of running it again",
            task.name,
            task.activity_id,
            task.run_id,
            task.attempt,
            deaths,
            last_worker,
            consumer,
        )
        outcome = fail_attempt(
            store,
            task,
            error,
            stream=stream,
            entry_id=entry_id,
            started=attempt_began(started_ms, store.server_time_ms()),
            on_timer=on_timer,
            started_ms=started_ms,
        )
    finally:
        unbind_run(token)
    metrics.attempt(task.name, stream, outcome, None)
