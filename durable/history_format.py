"""Which releases of durable can replay a history: its events' history format.

Replay must take the path the code took when the history was recorded. A release that records
something an older release would replay differently (a new event type, or a field that changes
what replay does) raises :data:`HISTORY_FORMAT`, and each event that uses it carries the format
it needs in its envelope (``f``; events every release reads carry none). A process reads such an
event (``durable history`` shows it) but raises :class:`~durable.errors.HistoryTooNew` rather than
replay it wrongly, or when its type is one this release does not know: a worker leaves the run to a live worker of a newer release, and parks it
(blocked, ``needs_upgrade``) when none comes; a query and ``durable replay`` say to upgrade the
process. Releases before this marker ignore it (they decode fields they know and nothing else).

Formats:

1. Every history written before 2026-12-07.
2. Signals one decision applied together (``SignalReceived.with_previous``: the code did not run
   between them) and a cancelled parent that waits for its child (``ChildStarted.wait_cancel``).
   Releases of 2026-12-07 wrote them unmarked; a release before that replays them differently.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .errors import HistoryCorrupt, HistoryTooNew
from .release import release

__all__ = ["HISTORY_FORMAT", "mark", "needed_by", "require", "too_new"]

HISTORY_FORMAT = 2
"""The newest history format this release writes and reads."""

_MARKED: dict[str, tuple[str, int]] = {
    "SignalReceived": ("with_previous", 2),
    "ChildStarted": ("wait_cancel", 2),
}
"""Per event type: the field that, when set, needs a format past 1, and that format."""


def needed_by(type_name: str, data: dict[str, Any]) -> int:
    """The history format an event of ``type_name`` with ``data`` needs (1: any release)."""
    marked = _MARKED.get(type_name)
    return marked[1] if marked is not None and data.get(marked[0]) else 1


def mark(envelope: dict[str, Any], where: str, *, run_id: str, seq: int) -> int:
    """The history format a stored entry's envelope says it needs (:class:`HistoryCorrupt` when
    its mark is not one durable writes)."""
    needed = envelope.get("f", 1)
    if type(needed) is not int or needed < 1:
        raise HistoryCorrupt(f"{where}: its history format mark is not a number", run_id=run_id, seq=seq)
    return needed


def require(entries: Iterable[Any], run_id: str = "") -> int:
    """The highest history format ``entries`` (:class:`durable.events.Entry`) need; raises
    :class:`HistoryTooNew` for the first that needs one past this release's: replay would take
    another path than the code took. Reading an entry is fine (``durable history`` shows it);
    replaying it is not."""
    highest = 1
    for entry in entries:
        if entry.format > HISTORY_FORMAT:
            raise too_new(entry.type, entry.format, f"run {run_id or '?'} seq {entry.seq}", run_id, entry.seq)
        highest = max(highest, entry.format)
    return highest


def too_new(type_name: object, needed: int, where: str, run_id: str, seq: int) -> HistoryTooNew:
    """The error for an entry of ``type_name`` that needs history format ``needed``."""
    return HistoryTooNew(
        f"{where}: {type_name!s:.40} was written by a newer release of durable (history format "
        f"{needed}; this process runs durable {release()}, which reads up to format "
        f"{HISTORY_FORMAT}): upgrade durable here",
        run_id=run_id,
        seq=seq,
        needed=needed,
        reads=HISTORY_FORMAT,
    )
