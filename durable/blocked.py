"""Why an open run cannot make progress until an operator acts: :class:`BlockedReason`, its
kinds, and how a reason is worded for the views (``durable status``, ``describe``, ``list``,
the API and the UI) and for ``result()``'s :class:`~durable.errors.WorkflowBlocked`."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .store.records import OPEN_STATUSES

__all__ = [
    "BLOCKED_KINDS",
    "DATA_LOST",
    "HISTORY_FULL",
    "NO_LIVE_WORKER",
    "BlockedReason",
    "blocked_reason",
    "blocked_text",
    "cancel_note",
    "classify_block",
    "repair_note",
]

BLOCKED_KINDS = (
    "nondeterminism",
    "unknown_type",
    "needs_upgrade",
    "no_live_worker",
    "runaway_decision",
    "parked_input",
    "history_corrupt",
    "workflow_error",
    "other",
)
"""The kinds of :attr:`BlockedReason.kind` (``other``: a reason not classified here)."""

NO_LIVE_WORKER = "no_live_worker"
"""The kind of a run pinned to a build that no live worker serves (found on read, not recorded)."""

HISTORY_FULL = "history_full"
"""The kind of a run whose history holds ``max_history_events`` while it waits on inputs
only (signals, updates, hooks): each is refused, so nothing moves it (found on read)."""

DATA_LOST = "data_lost"
"""The kind of a run waiting on a child whose partition's data Redis lost (found on read; see
:mod:`durable.store.origins`): it cannot finish."""

# Reasons written before runs recorded a kind (and writers that give none) name the
# error type first ("NondeterminismError: ...") or say what happened in words.
_PREFIX_KINDS = (
    ("NondeterminismError", "nondeterminism"),
    ("UnknownTypeError", "unknown_type"),
    ("SerializationError", "parked_input"),
    ("HistoryCorrupt", "history_corrupt"),
    ("WorkflowTaskFailed", "workflow_error"),
    ("the decision did not finish", "runaway_decision"),
    ("decision exceeded", "runaway_decision"),
    ("no live worker", "no_live_worker"),
)


def classify_block(message: str) -> str:
    """The :data:`BLOCKED_KINDS` entry a recorded blocked reason belongs to."""
    for prefix, kind in _PREFIX_KINDS:
        if message.startswith(prefix):
            return kind
    return "other"


@dataclass(frozen=True)
class BlockedReason:
    """Why an open run cannot make progress until an operator acts.

    Attributes:
        kind: One of :data:`BLOCKED_KINDS` (recorded: ``durable repair`` re-queues the run
            once the cause is fixed), or found on read, gone by itself once its cause is:
            ``no_live_worker``, ``starved_queue`` (every live worker of a queue an activity
            waits on has its threads held by hung activities), ``redis_out_of_memory``,
            ``redis_cannot_persist``, ``data_lost`` (a child it waits on is gone with its
            partition's data: the run cannot finish).
        message: The reason as recorded (names the error, the type, the build...).
        child: For a run blocked through a pending child that is blocked itself, that child's
            workflow id (the message then starts ``waits on child 'ID', which is blocked:``);
            else ``None``.
    """

    kind: str
    message: str
    child: str | None = None

    def __str__(self) -> str:
        return self.message

    @classmethod
    def through(cls, child_id: str, reason: BlockedReason) -> BlockedReason:
        """A parent's reason: it waits on the child ``child_id``, blocked for ``reason``."""
        return cls(kind=reason.kind, message=f"{_THROUGH.format(child_id)}{reason.message}", child=child_id)

    @classmethod
    def child_gone(cls, child_id: str, why: str) -> BlockedReason:
        """A parent's reason: the child ``child_id`` it waits on does not exist (``why``: its
        partition's data was lost), so it never finishes."""
        message = f"{_GONE.format(child_id)}{why}: this run cannot finish; terminate it and start it again"
        return cls(kind=DATA_LOST, message=message, child=child_id)

    @property
    def child_message(self) -> str:
        """For a reason :meth:`through` a child, the child's own message (else :attr:`message`);
        for :meth:`child_gone`, what follows "does not exist"."""
        if not self.child:
            return self.message
        return self.message.removeprefix(_THROUGH.format(self.child)).removeprefix(_GONE.format(self.child))


_THROUGH = "waits on child {!r}, which is blocked: "
_GONE = "waits on child {!r}, which does not exist"


def blocked_reason(record: Mapping[str, Any]) -> BlockedReason | None:
    """The blocked reason of a decoded run record (``None``: not blocked, or closed).

    The record's ``blocked`` field holds the message; ``blocked_kind``, when a
    writer gave one, the kind (else it is derived from the message).
    """
    message = record.get("blocked")
    if not message or record.get("status", "pending") not in OPEN_STATUSES:
        return None
    kind = str(record.get("blocked_kind") or "") or classify_block(str(message))
    return BlockedReason(kind=kind, message=str(message))


def blocked_text(workflow_id: str, run_id: str, kind: str, reason: str) -> str:
    """A blocked run, in words, with how to repair it (once: some reasons name the repair)."""
    message = f"workflow {workflow_id!r} (run {run_id}) is blocked ({kind}): {reason}"
    command = f"`durable repair {workflow_id}`"
    if command in reason:
        return message
    if "`durable repair`" in reason:  # the step is named, not for which run
        return f"{message} (here: {command})"
    return f"{message}; fix the cause, then {command}"


def repair_note(was: BlockedReason | None, found_on_read: Collection[str]) -> str | None:
    """What to tell of a repair of a run that was blocked for ``was`` (``None``: not blocked):
    ``None`` when it cleared a recorded reason, else why it changed nothing."""
    if was is not None and was.kind not in found_on_read:
        return None
    why = "it was not blocked" if was is None else f"nothing recorded blocks it ({was.kind}: {was.message})"
    return f"{why}; the extra workflow task is harmless"


def cancel_note(
    workflow_id: str, blocked: BlockedReason | None, found_on_read: Collection[str]
) -> str | None:
    """What to tell of a cancellation of a run blocked for ``blocked``: it runs the workflow's
    cleanup, which a blocked run does not run until it moves (``None``: not blocked)."""
    if blocked is None or blocked.kind == HISTORY_FULL:  # a cancel is no input it refuses: it closes it
        return None
    then = "" if blocked.kind in found_on_read else f", then `durable repair {workflow_id}`"
    return (
        f"the run is blocked ({blocked.kind}: {blocked.message}), so the cancellation takes effect only "
        f"once it moves again (fix the cause{then}); to end it now without running workflow code: "
        f"`durable terminate {workflow_id}`"
    )
