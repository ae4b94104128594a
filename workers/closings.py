"""What a closing decision sends on (the result a parent waits for, the run a continue-as-new
starts) and says in the worker's log."""

from __future__ import annotations

import logging
from typing import Any

from durable import codec
from durable import events as ev
from durable.limits import LIMIT_REASON
from durable.replay import Driver
from durable.runinfo import failure_text
from durable.store.redis_store import RunRef
from durable.store.tasks import NextRun, child_result_message


def child_result(parent: dict[str, Any], closing: ev.Event) -> bytes:
    """The outbox message giving a child's closing (``closing``) to its ``parent`` run."""
    if isinstance(closing, ev.WorkflowCompleted):
        event: ev.Event = ev.ChildCompleted(id=parent["cid"], result=closing.result)
    elif isinstance(closing, ev.WorkflowFailedEvent):
        event = ev.ChildFailed(id=parent["cid"], error=closing.error, status="failed")
    else:
        event = ev.ChildFailed(id=parent["cid"], status=ev.STATUS_OF_CLOSING[closing.type])
    return child_result_message(parent, event)


def next_run_of(
    ref: RunRef, record: dict[str, Any], driver: Driver, closing: ev.WorkflowContinuedAsNew, build_id: str
) -> NextRun:
    """The run ``closing`` continues ``ref`` as (its commit starts it), on the run's build
    (``build_id``, this worker's, if the run was not pinned to one)."""
    started = driver.started
    assert started is not None
    # The next run keeps the build id: same code, same routing. It records the patches of the
    # code deciding this (a fresh run, as Temporal's): a loop takes a patch up at its next run.
    build = record.get("build") or build_id
    data = ev.WorkflowStarted(
        workflow_type=started.workflow_type,
        workflow_id=ref.workflow_id,
        run_id=closing.new_run_id,
        args=closing.args,
        queue=started.queue,
        parent=started.parent,
        build_id=build,
        patches=list(driver.declared_patches),
        options={**started.options, "continued_from": ref.run_id},
        search_attributes=driver.search_attributes,  # carried over, as in Temporal
        memo=codec.dumps(driver.memo, path="memo") if driver.memo else None,
        headers=started.headers,  # trace context, tenant...: the same for every run of the id
    ).to_data()
    parent = codec.pack(started.parent) if started.parent else b""
    return NextRun(
        closing.new_run_id,
        ref.workflow_id,
        started.workflow_type,
        started.queue,
        codec.pack(data),
        parent,
        build,
    )


log = logging.getLogger("durable.worker")


def say_closed(closing: ev.Event, ref: RunRef, workflow_type: str, ids: dict[str, str]) -> None:
    """Log a run's close when an operator must hear of it: a failure (a bug's at WARNING, with
    where it rose) and a termination by a limit (the engine's authority, not the code's)."""
    if isinstance(closing, ev.WorkflowFailedEvent):
        text, bug = failure_text(closing)
        (log.warning if bug else log.info)(
            "run %s (%s) failed: %s", ref.run_id, workflow_type, text, extra=ids
        )
    elif isinstance(closing, ev.WorkflowTerminated) and closing.reason.startswith(LIMIT_REASON):
        log.warning("run %s (%s) terminated: %s", ref.run_id, workflow_type, closing.reason, extra=ids)
