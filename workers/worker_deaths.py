"""Activity attempts whose worker process died running them: how many deaths an attempt may
cost, the error that ends it, and leased attempts whose lease lapsed.

A worker death is not the end of an attempt: a queued task stays pending and is reclaimed (see
:mod:`workers.crash_loops`); a leased attempt (``--eager``, local activities: no task in a
stream, a lease its worker renews) runs again, as the same attempt, from its activity queue once
its lease lapsed (:func:`lapsed_lease`), where the reclaims take over. Either way the attempt
costs no attempt of its ``RetryPolicy`` until it has begun :data:`MAX_ACTIVITY_DELIVERIES` times
without its outcome recorded (each begin ended with its worker); then it fails with
:class:`~durable.errors.ActivityWorkerLost` (:func:`worker_lost`) and the policy decides.
"""

from __future__ import annotations

import logging

from durable.errors import ActivityWorkerLost
from durable.store.activities import Begins
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask

from . import metrics
from .logging import bind_run, unbind_run

log = logging.getLogger("durable.worker")

MAX_ACTIVITY_DELIVERIES = 3
"""An activity attempt begun this often without its outcome recorded (each time, its worker
died) is failed (:class:`~durable.errors.ActivityWorkerLost`) instead of run again.

Why 3: one death is the ordinary case the reclaim exists for (a worker killed by a deploy, a
node lost) and must run the attempt again; two in a row can still be bad luck (a machine
draining); three deaths of whichever worker runs the same attempt are the attempt's doing. Each
costs a worker restart and ``--claim-idle`` of waiting, so a crash loop now ends after about
3 x ``--claim-idle``."""


def worker_lost(task: ActivityTask, begun: Begins, deliveries: int, consumer: str = "") -> ActivityWorkerLost:
    """The error failing ``task``'s attempt, begun ``begun.begins`` times by workers that died
    (``deliveries``: how often it was handed to a worker, this last time included), said in a
    WARNING naming the worker ``consumer`` that fails it (``""``: a scheduler, for a lapsed lease)."""
    deaths, last_worker = begun.begins, begun.worker
    ids = {"workflow_id": task.workflow_id, "run_id": task.run_id, "activity_id": task.activity_id}
    token = bind_run({**ids, "activity_type": task.name, "attempt": task.attempt})
    try:
        log.warning(
            "activity %s (%s) of run %s attempt %d: its worker died %d times running it (last: worker "
            "%s); %s fails the attempt instead of running it again",
            task.name,
            task.activity_id,
            task.run_id,
            task.attempt,
            deaths,
            last_worker,
            f"worker {consumer}" if consumer else "the scheduler",
        )
    finally:
        unbind_run(token)
    return ActivityWorkerLost(
        f"the worker process running activity {task.name} ({task.activity_id}) attempt {task.attempt} "
        f"died {deaths} times (os._exit, a crash, the OOM killer?); last on worker {last_worker}",
        deliveries=deliveries,
        worker=last_worker,
    )


def lapsed_lease(
    store: RedisStore, task: ActivityTask, bound: int = MAX_ACTIVITY_DELIVERIES
) -> ActivityWorkerLost | None:
    """A leased attempt whose lease lapsed (the scheduler expired it, kind ``lease``): its worker
    died, since a live one renews the leases of the attempts it holds.

    Runs it again, as the same attempt, from its activity queue (once, whichever scheduler comes
    first), unless it has begun ``bound`` times already. An attempt still waiting for a thread when
    its worker died has not begun there: nothing counts against it.

    Returns:
        ``None`` when the attempt goes on (run again from its queue, or another scheduler saw to
        it, or it is no longer current): record nothing. Else the error to fail it with.
    """
    begun = store.attempt_begins(task.partition, task.run_id, task.activity_id)
    if begun is None or begun.attempt != task.attempt:
        return None  # no longer current: its record stands
    if begun.begins >= bound:
        return worker_lost(task, begun, begun.begins + 1)
    if not store.rerun_leased(task):
        return None
    metrics.lease_lapsed(task.name)  # its worker died: counted once, by whoever runs it again
    ids = {"workflow_id": task.workflow_id, "run_id": task.run_id, "activity_id": task.activity_id}
    token = bind_run({**ids, "activity_type": task.name, "attempt": task.attempt})
    try:
        if begun.begins:
            log.warning(
                "activity %s (%s) of run %s attempt %d: worker %s died running it (its lease lapsed); "
                "it runs again, as the same attempt, from its queue (%d of %d deaths allowed)",
                task.name,
                task.activity_id,
                task.run_id,
                task.attempt,
                begun.worker,
                begun.begins,
                bound,
            )
        else:
            log.warning(
                "activity %s (%s) of run %s attempt %d: the worker it was leased to died before it began "
                "(its lease lapsed); it runs from its queue",
                task.name,
                task.activity_id,
                task.run_id,
                task.attempt,
            )
    finally:
        unbind_run(token)
    return None
