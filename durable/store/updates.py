"""Updates in Redis: deliver one exactly once (``lua/update.lua``), wait for its outcome.

An update's outcome is in the run's history: ``UpdateCompleted`` (the handler returned
or raised) or ``UpdateRejected`` (refused before it ran), both carrying the update id.
The caller reads the history stream after the point it delivered at, blocking on it
(``XREAD BLOCK``) on its own connection: the process's shared waiter
(:class:`~durable.store.waits.RunWaiter`) wakes callers on a run's *closing* entry only,
while an update's outcome can be any entry. Its one-look check
(:func:`~durable.store.waits.look`) is reused for blocked and vanished runs.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from .. import codec
from .. import events as ev
from .. import limits as run_limits
from ..errors import DurableError, UpdateRejected, WorkflowClosed, error_text
from .records import RunRef, text
from .redis_store import RedisStore
from .waits import BLOCK_CHECK_S, look, peek_type, sleep_out, waits_outage

#: How many times a delivery follows the workflow to its next run (continue-as-new racing it).
_FOLLOW = 5
#: Entries read per XREAD while looking for an outcome.
_BATCH = 256

Outcome = ev.UpdateCompleted | ev.UpdateRejectedEvent


def deliver_update(
    store: RedisStore,
    workflow_id: str,
    update_id: str,
    name: str,
    args: bytes,
    headers: dict[str, Any] | None = None,
) -> tuple[RunRef, str]:
    """Push an update (with its interceptor ``headers``) onto the workflow's current run, unless
    that run already has its id.

    Returns the run and the history stream id to read its outcome after (``0-0`` for a
    repeated id: the first delivery's outcome may be anywhere in the history).

    Raises:
        WorkflowNotFound: unknown workflow id.
        WorkflowClosed: the current run is closed (and never got this update id).
        LimitExceeded: the run is at one of :func:`durable.limits.input_bounds` (nothing written).
    """
    request = ev.UpdateRequested(id=update_id, name=name, args=args, headers=headers or {})
    type_name, data = ev.encode_input_data(request)
    bounds = codec.pack(run_limits.input_bounds())
    k = store.keys
    for _ in range(_FOLLOW):
        ref = store.ref(workflow_id)
        p, rid = ref.partition, ref.run_id
        last = store.redis.xrevrange(k.history(p, rid), "+", "-", count=1)
        after = last[0][0].decode() if last else "0-0"
        result = store._run_script(
            "update",
            [k.run(p, rid), k.inbox(p, rid), k.updates(p, rid)],
            [rid, update_id, type_name, data, bounds],
        )
        outcome = text(result[0])
        if outcome == "OK":
            return ref, after
        if outcome == "DUP":
            return ref, "0-0"
        if outcome == "LIMIT":
            raise run_limits.input_refused(
                text(result[1]),
                f"workflow {workflow_id!r} (run {rid}) refused update {name!r}",
                int(result[2]),
            )
        status = text(result[1])
        if status != "continued":
            raise WorkflowClosed(
                f"workflow {workflow_id!r} (run {rid}) is {status}; it takes no more updates — "
                "start a new run to continue"
            )
    raise WorkflowClosed(
        f"workflow {workflow_id!r} kept continuing as new; update {name!r} was not delivered"
    )


def update_timeout(ref: RunRef, update_id: str) -> TimeoutError:
    """The error a caller whose wait for an update's outcome timed out gets."""
    return TimeoutError(
        f"update {update_id!r} of workflow {ref.workflow_id!r} had no outcome within the timeout; "
        "call update() again with the same update_id to keep waiting (ids are kept per run: once "
        f"run {ref.run_id} has continued as new, that call runs the update again in the new run)"
    )


_OUTCOME_TYPES = frozenset(
    {None, ev.UpdateCompleted.TYPE, ev.UpdateRejectedEvent.TYPE, *(cls.TYPE for cls in ev.CLOSING)}
)
"""The entries an update's caller looks at (``None``: unreadable, the decoder says why)."""


def scan_for_outcome(rows: list[Any], ref: RunRef, update_id: str, last: str) -> tuple[str, Outcome | None]:
    """Look through history ``rows`` (an ``XREAD`` reply's) for update ``update_id``'s outcome;
    returns the last stream id read and the outcome, if found.

    Raises:
        WorkflowClosed: the run closed before the update had an outcome.
    """
    for entry_id, fields in rows:
        last = entry_id.decode()
        if peek_type(fields[b"e"]) not in _OUTCOME_TYPES:  # not decoded: a newer release's too
            continue
        event = ev.decode(fields[b"e"], run_id=ref.run_id, seq=int(last.split("-")[1])).event
        if isinstance(event, ev.UpdateCompleted | ev.UpdateRejectedEvent) and event.id == update_id:
            return last, event
        if isinstance(event, ev.CLOSING):
            then = (
                ": its handler did not finish (what it did before stays done); call update() again "
                "to run it in the new run, after checking what it did"
                if isinstance(event, ev.WorkflowContinuedAsNew)
                else ""
            )
            raise WorkflowClosed(
                f"workflow {ref.workflow_id!r} (run {ref.run_id}) closed "
                f"({ev.STATUS_OF_CLOSING[event.type]}) before update {update_id!r} had an outcome{then}"
            )
    return last, None


def wait_update(
    store: RedisStore, ref: RunRef, update_id: str, after: str, deadline: float | None
) -> Outcome:
    """The entry recording the outcome of update ``update_id`` of run ``ref``.

    Raises:
        WorkflowClosed: the run closed before the update had an outcome.
        WorkflowBlocked: the run is (or becomes) blocked.
        WorkflowNotFound: the run is gone.
        TimeoutError: ``deadline`` (``time.monotonic()``) passed first.
    """
    key = store.keys.history(ref.partition, ref.run_id)
    last = after
    outage = waits_outage(store)
    while True:
        block_s = BLOCK_CHECK_S
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise update_timeout(ref, update_id)
            block_s = min(block_s, remaining)
        try:
            reply = store.redis.xread({key: last}, count=_BATCH, block=max(1, int(block_s * 1000)))
            rows: list[Any] = reply[0][1] if reply else []
            last, outcome = scan_for_outcome(rows, ref, update_id, last)
            if outcome is not None:
                return outcome
            if not rows:
                look(store, ref)  # raises for a blocked or vanished run
            outage.recovered()
        except redis.RedisError as exc:  # rides out an unreachable Redis, as result() does
            sleep_out(outage, exc, deadline, update_timeout(ref, update_id), store.url)


def update_result(event: Outcome, workflow_id: str, name: str) -> Any:
    """What ``WorkflowStub.update`` returns for an outcome, or the error it raises."""
    if isinstance(event, ev.UpdateRejectedEvent):
        cause = codec.loads(event.error)
        error = cause if isinstance(cause, BaseException) else None
        raise UpdateRejected(
            f"update {name!r} ({event.id}) of workflow {workflow_id!r} was rejected: "
            f"{error_text(cause) if error is not None else f'{type(cause).__name__}: {cause}'}",
            update_id=event.id,
            name=name,
            cause=error,
        )
    if event.error is not None:
        error = codec.loads(event.error)
        if isinstance(error, BaseException):
            raise error
        raise DurableError(f"update {name!r} ({event.id}) of workflow {workflow_id!r} failed: {error!r}")
    return codec.loads(event.result) if event.result is not None else None
