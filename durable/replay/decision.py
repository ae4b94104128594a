"""A decision: what one pass of the driver asks the store to commit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import events as ev

#: What a closing run voids: (timer ids, activity ids, (command id, child workflow id, policy)).
CloseActions = tuple[list[str], list[str], list[tuple[str, str, str]]]


@dataclass
class Decision:
    """What one decision asks the store to commit, atomically.

    Attributes:
        expected_seq: The last committed seq the decision is based on; the
            commit fails with ``EventConflict`` if the history moved on.
        events: Entries to append, in order (seq ``expected_seq + 1`` ...):
            consumed inbox items copied byte for byte, interleaved with the
            command events their application produced.
        consumed: How many inbox items (from the head) the decision read.
        dropped: Inbox items read but not written to history, with the reason
            (duplicates, late results); kept beside the history.
        activities: Activities to enqueue (net: not cancelled in this decision).
        timers: ``(timer id, fire_at ms)`` to add to the timers set.
        cancelled_timers: Timer ids to remove.
        cancelled_activities: Activity ids whose pending task/attempt is void.
        children: Child workflows to start.
        cancelled_children: ``(command id, child workflow id, policy)`` to act on.
        hooks: Hooks created (token digest -> run routing).
        expired_hooks: Ids of hooks whose wait ended without a resume: their tokens are void.
        closing: The closing event when the run ends, else ``None``.
        status: The run's status word after this decision.
        snapshot: The projection written with the commit.
    """

    expected_seq: int
    events: list[bytes]
    consumed: int
    dropped: list[tuple[bytes, str]]
    activities: list[ev.ActivityScheduled]
    timers: list[tuple[str, int]]
    cancelled_timers: list[str]
    cancelled_activities: list[str]
    children: list[ev.ChildStarted]
    cancelled_children: list[tuple[str, str, str]]
    hooks: list[ev.HookCreated]
    closing: ev.Event | None
    status: str
    snapshot: dict[str, Any]
    expired_hooks: list[str] = field(default_factory=list)
    #: The run's search attributes (``{name: [type, value]}``) when this decision upserted some.
    search_attributes: dict[str, Any] | None = None
    #: The run's whole memo (a payload) when this decision upserted it.
    memo: bytes | None = None
    #: Signals read after the run continued as new: not this run's, they go to the next run's
    #: inbox (a signal is addressed to the workflow id, whose current run that is).
    carried: list[bytes] = field(default_factory=list)


def build_decision(
    *,
    expected_seq: int,
    events: list[bytes],
    consumed: int,
    dropped: list[tuple[bytes, str]],
    new: Sequence[ev.Event],
    close_actions: CloseActions,
    child_cancels: list[tuple[str, str, str]],
    closing: ev.Event | None,
    status: str,
    snapshot: dict[str, Any],
) -> Decision:
    """The decision for the command events ``new`` issued since the last commit.

    Activities and timers started and cancelled within the same decision
    cancel out: the store never sees them.
    """
    scheduled: dict[str, ev.ActivityScheduled] = {}
    timers: dict[str, int] = {}
    cancelled_timers: list[str] = []
    cancelled_activities: list[str] = []
    children: list[ev.ChildStarted] = []
    hooks: list[ev.HookCreated] = []
    for event in new:
        if isinstance(event, ev.ActivityScheduled):
            scheduled[event.id] = event
        elif isinstance(event, ev.ActivityCancelled):
            if scheduled.pop(event.id, None) is None:
                cancelled_activities.append(event.id)
        elif isinstance(event, ev.TimerStarted):
            timers[event.id] = event.fire_at
        elif isinstance(event, ev.SignalWaitStarted) and event.deadline is not None:
            timers[event.id] = event.deadline
        elif isinstance(event, ev.TimerCancelled):
            if timers.pop(event.id, None) is None:
                cancelled_timers.append(event.id)
        elif isinstance(event, ev.ChildStarted):
            children.append(event)
        elif isinstance(event, ev.HookCreated):
            hooks.append(event)
    close_timers, close_activities, close_children = close_actions
    for tid in close_timers:
        if timers.pop(tid, None) is None:
            cancelled_timers.append(tid)
    for aid in close_activities:
        if scheduled.pop(aid, None) is None:
            cancelled_activities.append(aid)
    return Decision(
        expected_seq=expected_seq,
        events=events,
        consumed=consumed,
        dropped=dropped,
        activities=list(scheduled.values()),
        timers=list(timers.items()),
        cancelled_timers=cancelled_timers,
        cancelled_activities=cancelled_activities,
        children=children,
        cancelled_children=[*child_cancels, *close_children],
        hooks=hooks,
        closing=closing,
        status=status,
        snapshot=snapshot,
    )
