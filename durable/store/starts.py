"""The start script's options and replies (``lua/start_run.lua``): start policies,
signal-with-start, workflow timeouts. :meth:`RunStore.start` drives it."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import redis

from .. import codec
from .. import events as ev
from .. import limits as run_limits
from ..errors import WorkflowAlreadyStarted
from ..immutable import immutable
from ..start_policy import EXECUTION_TIMEOUT, RUN_TIMEOUT, StartPolicy, deadlines
from .connect import Client
from .keys import SENT_TTL_MS, Keys, deadline_member, retry_member, timer_member
from .records import OPEN_STATUSES, RunRef, snapshot_of, text
from .tasks import child_policy_message, child_result_message, children_to_close


@immutable(slots=False)
class StartedRun(RunRef):
    """The run a start left the workflow id with.

    Attributes:
        started: True when this start created the run; False when ``use_existing`` found the
            id's open run (and a signal-with-start delivered its signal there).
        replaced: ``terminate_existing``: the id of the run it terminated (its children were
            closed by their parent close policy in the same script), else ``""``.
        closing: What closing the replaced run told its parent and children (``None``: no run
            was replaced, or a resend found the start done).
    """

    started: bool = True
    replaced: str = ""
    closing: Closing | None = None


def deadline_args(run_id: str, options: dict[str, Any]) -> list[list[Any]]:
    """The ``deadlines`` a run with these WorkflowStarted ``options`` puts in the timers set:
    ``[member, due ms or 0, ms from the run's start or 0]`` each."""
    return [[deadline_member(run_id, which), due, after] for which, due, after in deadlines(options)]


def script_options(
    policy: StartPolicy,
    conflict: str,
    run_id: str,
    options: dict[str, Any],
    signal: ev.Event | None,
    *,
    sent: str = "",
) -> dict[str, Any]:
    """The start script's options map, but for what terminating an open run needs (``sent``:
    the signal's ``T:sent`` key, noting where it went so that a resend is not delivered twice)."""
    out: dict[str, Any] = {
        "reuse": policy.id_reuse_policy,
        "conflict": conflict,
        "deadlines": deadline_args(run_id, options),
    }
    if signal is not None:
        type_name, data = ev.encode_input_data(signal)
        out["signal"] = [type_name, data]
        out["limits"] = run_limits.input_bounds()
        if sent:
            out["sent"] = [sent, SENT_TTL_MS]
    return out


def started_run(
    reply: list[Any],
    p: int,
    workflow_id: str,
    policy: StartPolicy,
    close: Closing | None = None,
    *,
    child: bool = False,
) -> StartedRun:
    """What the start script's reply means (``MOVED`` is the caller's to retry); ``close``: the
    :class:`Closing` of the open run ``terminate_existing`` expected to replace; ``child``: a
    parent's ``child()`` starts it (which takes no id conflict policy: not offered).

    Raises:
        WorkflowAlreadyStarted: the id has an open run (``fail``), or a closed one its id
            reuse policy does not restart.
        LimitExceeded: a signal-with-start's open run is at a signal or history limit.
        redis.ResponseError: a key the start writes holds another kind of value (``WRONGTYPE``,
            the key named; nothing written).
    """
    outcome = text(reply[0])
    if outcome == "OK":
        replaced = text(reply[3]) if len(reply) > 3 else ""
        return StartedRun(p, text(reply[1]), workflow_id, True, replaced, close if replaced else None)
    if outcome == "EXISTING":
        return StartedRun(p, text(reply[1]), workflow_id, False)
    if outcome == "ALREADY":
        raise WorkflowAlreadyStarted(
            f"workflow {workflow_id!r} already has an open run ({text(reply[1])}); "
            + (
                "give the child another workflow_id (child(..., workflow_id=...)), or let that run close first"
                if child
                else "signal it, wait for it, or start with another id"
                " (or with id_conflict_policy 'use_existing' or 'terminate_existing')"
            )
        )
    if outcome == "REJECTED":
        why = (
            "only a run that did not complete may be followed"
            if policy.id_reuse_policy == "allow_duplicate_failed_only"
            else "a closed id is never started again"
        )
        raise WorkflowAlreadyStarted(
            f"workflow {workflow_id!r} already ran (run {text(reply[1])} {text(reply[2])}) and its "
            f"id_reuse_policy {policy.id_reuse_policy!r} forbids a new run ({why}); start with another "
            "id, or with id_reuse_policy 'allow_duplicate'"
        )
    if outcome == "LIMIT":
        raise run_limits.input_refused(
            text(reply[1]),
            f"workflow {workflow_id!r} (run {text(reply[3])}) refused SignalReceived (signal-with-start)",
            int(reply[2]),
        )
    if outcome == "WRONGKIND":
        # A refusal of Redis's, as the command's own WRONGTYPE would be (a child's start stays in
        # its outbox and is tried again, not failed for its parent), with the key named.
        raise redis.ResponseError(
            f"WRONGTYPE: cannot start workflow {workflow_id!r}: Redis key {text(reply[1])} is a "
            f"{text(reply[2])}, not a {text(reply[3])} (made by hand, or by another program sharing the "
            "database); nothing was written: delete or rename the key (durable makes it again)"
        )
    raise AssertionError(f"start script replied {outcome!r}")  # pragma: no cover


def script_now_ms(client: Client, keys: Keys, p: int) -> int:
    """The scripts' clock in partition ``p`` (Redis time plus its test offset), in ms."""
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.get(keys.clock(p))
        (sec, usec), offset = pipe.execute()
    return int(sec) * 1000 + int(usec) // 1000 + int(offset or 0)


@immutable
class Closing:
    """What closing a run from outside its code (terminate, ``terminate_existing``) tells its
    parent and its children: outbox messages its closing script writes, made from the run's
    snapshot with SHA1 ``snapshot_sha1`` (a script that finds another snapshot refuses).

    Attributes:
        to_parent: The message telling its parent (``b""``: it has none).
        children: ``(policy, workflow id)`` of the children their close policy acts on.
        reason: Why, as the children are told.
        snapshot_sha1: SHA1 of the snapshot they were read from.
        timers: Its members of the partition's timers (timers, signal-wait deadlines, activity
            retries, run timeouts): nothing fires them for a closed run, so its close drops them
            rather than leave them until they come due (days, for a long timeout).
    """

    to_parent: bytes
    children: list[tuple[str, str]]
    reason: str
    snapshot_sha1: str
    timers: list[str] = dataclasses.field(default_factory=list)

    @property
    def to_children(self) -> list[bytes]:
        """The outbox messages applying each child's policy."""
        return [child_policy_message(policy, wid, self.reason) for policy, wid in self.children]

    @property
    def to_terminate(self) -> list[str]:
        """The workflow ids of the children whose policy is ``terminate``."""
        return [wid for policy, wid in self.children if policy == "terminate"]


def closing(client: Client, keys: Keys, p: int, run_id: str, reason: str) -> Closing:
    """The :class:`Closing` of run ``run_id`` as it stands; ``reason`` goes to its children."""
    parent_raw, snapshot_raw = client.hmget(keys.run(p, run_id), "parent", "snapshot")
    parent = codec.unpack(parent_raw) if parent_raw else None
    to_parent = b""
    if parent:
        to_parent = child_result_message(parent, ev.ChildFailed(id=parent["cid"], status="terminated"))
    snapshot = snapshot_of(snapshot_raw)  # unreadable: no child is known to close
    sha1 = hashlib.sha1(snapshot_raw or b"", usedforsecurity=False).hexdigest()
    return Closing(to_parent, children_to_close(snapshot), reason, sha1, timers_of(run_id, snapshot))


def timers_of(run_id: str, snapshot: dict[str, Any]) -> list[str]:
    """The timers members a run may have, from its snapshot's pending steps (see :class:`Closing`)."""
    members = [deadline_member(run_id, which) for which in (RUN_TIMEOUT, EXECUTION_TIMEOUT)]
    for step in snapshot.get("pending") or ():
        step_id = str(step.get("id", ""))
        if step.get("kind") == "activity":
            members.append(retry_member(run_id, step_id))
        elif step.get("kind") == "timer" or step.get("deadline") is not None:
            members.append(timer_member(run_id, step_id))
    return members


def open_run(
    client: Client, keys: Keys, p: int, workflow_id: str
) -> tuple[dict[str, Any], list[str], Closing | None]:
    """What ``terminate_existing`` needs of the id's open run, if any: ``(script options: expect,
    terminated, to_parent, to_children, snapshot_sha1; its run, history, inbox, activities and
    log keys and the outbox; its Closing)``."""
    rid_raw, status = client.hmget(keys.instance(p, workflow_id), "run", "status")
    if rid_raw is None or text(status) not in OPEN_STATUSES:
        return {}, [], None
    rid = text(rid_raw)
    reason = "replaced by a new run (id_conflict_policy terminate_existing)"
    close = closing(client, keys, p, rid, "parent replaced (id_conflict_policy terminate_existing)")
    found = {
        "expect": rid,
        "terminated": codec.pack(ev.WorkflowTerminated(reason=reason).to_data()),
        "to_parent": close.to_parent,
        "to_children": close.to_children,
        "snapshot_sha1": close.snapshot_sha1,
        "timers": close.timers,
    }
    return found, [*keys.terminated_keys(p, rid), keys.outbox(p)], close
