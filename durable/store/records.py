"""Plain records the store reads back: where a run lives, a run's record, a commit's outcome."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis

from .. import codec
from ..codec.sealed import open_text
from ..errors import (
    DurableError,
    EventConflict,
    HistoryCorrupt,
    SerializationError,
    WorkflowClosed,
    message_of,
)
from ..immutable import immutable
from .tasks import ActivityTask
from .wire import pairs

OPEN_STATUSES = frozenset({"pending", "running", "suspended", "cancelling"})
CLOSED_STATUSES = frozenset({"completed", "failed", "cancelled", "terminated", "continued"})

HEARTBEAT_S = 2.0
"""Seconds between a worker's registry heartbeats."""

REGISTRY_TTL_MS = 10_000
"""A registry entry not renewed this long (five heartbeats) is a dead worker's."""

DECISION_FIELDS = ("seq", "status", "blocked", "build", "wq", "workflow_id", "parent", "queue")
"""The fields of a run record a decision reads (the rest, e.g. the snapshot, only clients use)."""


@immutable(slots=False)
class RunRef:
    """Where a run lives: its partition, run id and workflow id."""

    partition: int
    run_id: str
    workflow_id: str


class StaleCompletion(DurableError):
    """An eager commit carried the result of an attempt that is no longer current."""


@immutable
class ClaimedTask:
    """A task a script read for the calling worker: an activity task its commit scheduled
    (``CommitPlan.claimed``), or a workflow task its completion woke (``Completions.handed``).

    Attributes:
        stream: The task stream.
        entry_id: The task's entry, pending for that worker like one it read.
        fields: The entry's fields.
        began_ms: When its attempt began (the scripts' clock); 0 when the entry is an older task
            of the stream (not the one the commit added), whose attempt is begun as usual.
        task: The activity task as the decision that scheduled it built it, when the entry is
            the one its commit added (``began_ms``), so the body need not be decoded again;
            ``None``: decode ``fields``.
    """

    stream: str
    entry_id: str
    fields: dict[bytes, bytes]
    began_ms: int
    task: ActivityTask | None = None

    @classmethod
    def read(cls, stream: Any, entry_id: Any, flat: Sequence[Any], began_ms: Any = 0) -> ClaimedTask:
        """From a script's raw reply: the entry's fields flat, as XREADGROUP gives them."""
        return cls(text(stream), text(entry_id), pairs(flat), int(began_ms))

    def with_task(self, built: Mapping[str, ActivityTask]) -> ClaimedTask:
        """This entry with the task its commit's plan built (``built``: by activity id) when it is
        that task's entry, the one the commit added and began (``began_ms``: its body is that
        task's encoding), so the activity thread need not decode it again; else itself."""
        act = self.fields.get(b"act") if self.began_ms else None  # else an older entry of the stream
        task = built.get(act.decode()) if act is not None else None
        if task is None or task.stream != self.stream:
            return self
        return ClaimedTask(self.stream, self.entry_id, self.fields, self.began_ms, task)


@immutable(slots=False)
class CommitResult:
    """Outcome of :meth:`RedisStore.commit`: the run's new seq, its inbox length (0 when the
    commit did not read it: an eager one, or one that closed the run), and the activity tasks
    read for the committing worker (``CommitPlan.claimed``)."""

    seq: int
    inbox: int
    claimed: Sequence[ClaimedTask] = ()


def text(value: Any) -> str:
    """A reply (bytes) or a value as text."""
    # backslashreplace: a value durable did not write (odd bytes) is shown as it is, never a crash
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)


def decision_record(values: Sequence[Any]) -> dict[str, Any] | None:
    """An HMGET of :data:`DECISION_FIELDS`, decoded like a whole record (``None``: no run)."""
    if values[0] is None:
        return None
    return decode_run({name: v for name, v in zip(DECISION_FIELDS, values, strict=True) if v is not None})


def snapshot_of(raw: bytes | None) -> dict[str, Any]:
    """A run record's snapshot, decoded. One that does not decode (bytes durable did not write)
    reads as ``{"unreadable": why}``: the views still show the run (and say so), and terminate
    still closes it; a decision writes a new one."""
    if not raw:
        return {}
    try:
        value = codec.unpack(raw)
    except (SerializationError, ValueError) as exc:
        return {"unreadable": f"the run record's snapshot does not decode ({message_of(exc)})"}
    return value if isinstance(value, dict) else {"unreadable": "the run record's snapshot is not a map"}


def decode_run(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """A run hash as read from Redis, decoded (snapshot and parent unpacked)."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = text(key)
        if name in ("seq", "created", "updated", "closed"):
            out[name] = int(value)
        elif name == "snapshot":
            out[name] = snapshot_of(value)
        elif name == "parent":
            out[name] = codec.unpack(value) if value else None
        elif name in ("result", "error", "memo"):
            out[name] = value
        elif name == "blocked":
            out[name] = open_text(value)
        else:
            out[name] = text(value)
    return out


def commit_outcome(run_id: str, expected_seq: int, reply: Any) -> CommitResult | Exception:
    """The commit script's reply as a :class:`CommitResult` or the exception it stands for."""
    if isinstance(reply, Exception):
        return reply
    outcome = text(reply[0])
    if outcome == "CONFLICT":
        return EventConflict(
            f"run {run_id}: history is at seq {int(reply[1])}, decision expected {expected_seq} "
            "(another decider committed first)"
        )
    if outcome == "INPUTS":  # decided again as a conflict is, with them
        return EventConflict(f"run {run_id}: signals arrived while its decision closed it")
    if outcome == "CLOSED":
        return WorkflowClosed(f"run {run_id} is {text(reply[1])}; decision discarded")
    if outcome == "LOST":
        return HistoryCorrupt(
            f"run {run_id}: its history is gone from Redis (the run record counts {int(reply[1])} events): "
            "evicted (a maxmemory-policy other than noeviction) or deleted; nothing was written. Restore "
            "Redis from a backup, or `durable terminate` the run"
        )
    if outcome == "WRONGKIND":  # a refusal of Redis's, as the command's own WRONGTYPE, the key named
        return redis.ResponseError(
            f"WRONGTYPE: run {run_id}: Redis key {text(reply[1])} is a {text(reply[2])}, not a {text(reply[3])}; "
            "nothing was written"
        )
    if outcome == "STALE":
        return StaleCompletion(
            f"run {run_id}: activity {text(reply[1])} is no longer pending; eager result not applied"
        )
    claimed = [ClaimedTask.read(*claimed) for claimed in (reply[3] if len(reply) > 3 else ())]
    return CommitResult(seq=int(reply[1]), inbox=int(reply[2]), claimed=claimed)
