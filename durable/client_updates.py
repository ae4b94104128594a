"""Sending an update from a client, shared by the sync and the async stub: the checks made
before anything is written, the client interceptors (``update_workflow``), the delivery; and
the signal event a client sends, checked the same way (:func:`signal_event`).

Waiting for the outcome is not here: the sync stub blocks on the run's history
(:func:`durable.store.updates.wait_update`), the async one awaits it (:mod:`durable.store.aio`).
What a caller needs around the wait (why a run is blocked, in words; whether an update id was
first sent with other arguments) is.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import codec, interceptors, typed_args
from . import events as ev
from .errors import ConfigurationError, DurableError, UpdateRejected, WorkflowBlocked
from .ids import check_command_id, new_run_id
from .interceptors import ClientInterceptor, UpdateWorkflowInput
from .limits import check_name_length
from .registry import check_signal, get_workflow
from .replay.updates import check_arguments
from .runinfo import blocked_reason, blocked_text
from .store.records import text
from .store.redis_store import RedisStore, RunRef
from .store.updates import deliver_update

#: The run record's fields :func:`blocked_reason` reads.
_BLOCK_FIELDS = ("status", "blocked", "blocked_kind")
#: History entries read per round trip while looking for an update id's first request.
_BATCH = 256


class Delivery(NamedTuple):
    """A delivered update: its run, its id, and the history stream id to read its outcome after
    (``0-0``: the id had been delivered before, or the run had no history yet)."""

    ref: RunRef
    update_id: str
    after: str


def check_update_call(workflow_type: str, name: str, args: Sequence[Any], workflow_id: str = "") -> None:
    """Refuse an unknown update name, or arguments its handler cannot take, before writing,
    when this process has the class (the run's worker checks both again either way).

    Raises:
        UpdateRejected: no ``@update`` ``name``, or ``args`` do not fit its signature.
    """
    try:
        cls = get_workflow(workflow_type)
    except DurableError:
        return  # not registered here: the run's worker rejects an unknown name
    # The run by its id, as the worker's rejection names it (the type alone named no workflow).
    which = f"workflow {workflow_id!r} ({workflow_type})" if workflow_id else f"workflow {workflow_type!r}"
    entry = cls._updates.get(name)
    if entry is None:
        raise UpdateRejected(f"{which} has no @update {name!r}; it has {sorted(cls._updates)}", name=name)
    # Bound to a stand-in instance, so that the signature named is the caller's (no ``self``).
    handler = functools.partial(getattr(cls, entry[0]), None)
    try:
        check_arguments(handler, args, f"@update {name!r}")
        # Model-annotated arguments validated as the handler's wrapper will (on a stand-in self).
        typed_args.prepared(types.MethodType(getattr(cls, entry[0]), object()), tuple(args))
    except DurableError as exc:
        raise UpdateRejected(
            f"update {name!r} of {which} was rejected: {exc}", name=name, cause=exc
        ) from None


def refuse_if_blocked(store: RedisStore, workflow_id: str, update_id: str, name: str) -> None:
    """Refuse a new update to a blocked run at once.

    A blocked run applies no input until an operator repairs it (which may be never: it may be
    terminated instead), so a caller would wait without end and its update run whenever that
    happens. An id the run has already (a retry) passes: its outcome may be in the history.

    Raises:
        WorkflowBlocked: the workflow's current run is blocked (nothing written).
    """
    ref = store.ref(workflow_id)
    keys = store.keys
    with store.redis.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.run(ref.partition, ref.run_id), _BLOCK_FIELDS)
        pipe.hexists(keys.updates(ref.partition, ref.run_id), update_id)
        values, known = pipe.execute()
    record = {f: text(v) for f, v in zip(_BLOCK_FIELDS, values, strict=True) if v is not None}
    reason = blocked_reason(record)
    if reason is None or known:
        return
    raise WorkflowBlocked(
        f"{blocked_text(workflow_id, ref.run_id, reason.kind, reason.message)}; update {name!r} "
        f"({update_id}) was not delivered: send it again once the run is repaired",
        workflow_id=workflow_id,
        run_id=ref.run_id,
        kind=reason.kind,
        reason=reason.message,
    )


def send_update(
    store: RedisStore,
    workflow_type: str,
    workflow_id: str,
    name: str,
    args: Sequence[Any],
    update_id: str | None,
) -> Delivery:
    """Check update ``name`` and deliver it through the client interceptors (their headers
    are recorded with the update).

    Raises:
        ConfigurationError: an empty name or a bad ``update_id``.
        UpdateRejected: this process knows the workflow class and it has no such ``@update``,
            or the arguments do not fit its handler.
        WorkflowBlocked: the run is blocked (:func:`refuse_if_blocked`; nothing written).
        SerializationError: an argument cannot be encoded (nothing written).
        WorkflowNotFound, WorkflowClosed, LimitExceeded: as :func:`deliver_update`.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError("update name must be a non-empty string")
    check_name_length(name, "update")
    uid = check_command_id(update_id, "update_id") if update_id is not None else f"u-{new_run_id().lower()}"
    check_update_call(workflow_type, name, args, workflow_id)

    def deliver(request: UpdateWorkflowInput) -> Delivery:
        payload = codec.dumps(tuple(request.args), path="args", allowed_only=True)

        def once() -> tuple[RunRef, str]:  # the update id makes a resend a no-op
            refuse_if_blocked(store, request.workflow_id, request.update_id, request.name)
            return deliver_update(
                store, request.workflow_id, request.update_id, request.name, payload, request.headers
            )

        ref, after = store.ride(f"update({request.name!r}) of workflow {request.workflow_id!r}", once)
        return Delivery(ref, request.update_id, after)

    request = UpdateWorkflowInput(workflow_id, name, tuple(args), uid)
    delivery: Delivery = interceptors.run(ClientInterceptor, "update_workflow", request, deliver)
    return delivery


def first_request(store: RedisStore, ref: RunRef, update_id: str) -> ev.Event | None:
    """How update id ``update_id`` was first sent to run ``ref``: its ``UpdateAccepted`` or
    ``UpdateRejected`` in the history, else its ``UpdateRequested`` still in the inbox
    (``None``: not found, e.g. the history cannot be read).

    Reads the whole history in the worst case: for a retried id only.
    """
    p, rid = ref.partition, ref.run_id
    start = "0-0"
    try:
        while True:
            rows = store.redis.xrange(store.keys.history(p, rid), start, "+", count=_BATCH)
            for entry_id, fields in rows:
                seq = int(text(entry_id).split("-")[1])
                event = ev.decode(fields[b"e"], run_id=rid, seq=seq).event
                if isinstance(event, ev.UpdateAccepted | ev.UpdateRejectedEvent) and event.id == update_id:
                    return event
            if len(rows) < _BATCH:
                break
            start = f"0-{seq + 1}"
        for raw in store.redis.lrange(store.keys.inbox(p, rid), 0, -1):
            event = ev.decode(raw, run_id=rid).event
            if isinstance(event, ev.UpdateRequested) and event.id == update_id:
                return event
    except DurableError:  # an entry that cannot be decoded: nothing to compare with
        return None
    return None


def reused_differently(store: RedisStore, delivery: Delivery, name: str, args: Sequence[Any]) -> str | None:
    """Whether a retried update id was first sent as another update (name or arguments): the
    id is the idempotency key, so this call ran nothing and its caller gets the first one's
    outcome. Returns how it was first sent, in words (``None``: the same, or not known).
    """
    first = first_request(store, delivery.ref, delivery.update_id)
    if first is None:
        return None
    first_name = getattr(first, "name", name)
    first_args = getattr(first, "args", None)  # an UpdateRejected does not keep its arguments
    try:
        same_args = first_args is None or first_args == codec.dumps(tuple(args), path="args")
        shown = "" if first_args is None else ", ".join(repr(a) for a in codec.loads(first_args))
    except DurableError:
        return None
    if first_name == name and same_args:
        return None
    return f"{first_name}({shown})" if first_args is not None else f"{first_name!r}"


def signal_event(
    name: str, args: Sequence[Any], headers: dict[str, Any], code: type | str
) -> ev.SignalReceived:
    """The event sending signal ``name`` with ``args`` delivers; refused before anything is
    written when the @signal handler of ``code`` (a class, or a type this process registered)
    would refuse ``args``. Its id makes a resend (a lost reply) deliver nothing twice."""
    check_signal(code, name, tuple(args))
    payload = codec.dumps(tuple(args), path="args", allowed_only=True)
    return ev.SignalReceived(name=name, payload=payload, signal_id=new_run_id(), headers=headers)
