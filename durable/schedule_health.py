"""Why a schedule does not start runs, in words for ``describe`` and ``list``.

A schedule fires where a worker's scheduler runs, and starts what its overlap policy lets it:
a schedule can stop starting runs without any error. :class:`Lateness` says why a time that is
past has not fired (:attr:`~durable.schedules.ScheduleDescription.overdue`); :func:`held_up`
why one that fires starts nothing (:attr:`~durable.schedules.ScheduleDescription.held_up`).
"""

from __future__ import annotations

import builtins
from typing import Any

from .schedule_spec import Schedule, iso
from .store.redis_store import RedisStore

__all__ = ["OVERDUE_AFTER_S", "Lateness", "failing", "held_up"]

OVERDUE_AFTER_S = 5.0
"""How late a schedule's next time may be before ``describe`` calls it overdue (a worker's
scheduler claims due times on each of its passes, well within this)."""


class Lateness:
    """Why a schedule's past time has not fired (:attr:`ScheduleDescription.overdue`), from
    reads made once however many schedules ask (``list``): the scripts' clock, then, only for a
    time that is late, Redis's memory state and the live workers."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._now_ms: int | None = None
        self._cause: tuple[str | None, int] | None = None  # (Redis refusing writes, live workers)

    def why(self, spec: Schedule, due_ms: int) -> str:
        """Why the time ``due_ms`` has not fired although it is past, or ``""`` (on time).

        Schedules fire only where a worker runs: without one, nothing says so but this."""
        if self._now_ms is None:
            self._now_ms = self._store.server_time_ms()
        late_s = (self._now_ms - due_ms) / 1000
        if late_s <= OVERDUE_AFTER_S:
            return ""
        if self._cause is None:
            self._cause = (self._store.memory_state().reason, len(self._store.live_workers()))
        refused, live = self._cause
        due = f"{iso(due_ms)} was due {late_s:.0f} s ago"
        if refused:  # Redis refusing writes: no scheduler can claim it
            return f"{due} and has not fired: {refused}"
        if not live:
            window = float(spec.catchup_window)  # type: ignore[arg-type]
            return (
                f"{due} and has not fired: no live worker runs, and each worker's scheduler fires the "
                f"schedules (any queue); start one (`durable worker --app YOUR_APP`). Times more than "
                f"{window:g} s old by then (the catchup window) are recorded as missed, not started"
            )
        return (
            f"{due} and has not fired although {live} worker(s) are live, whose schedulers fire due "
            "times on every pass: see their logs (`durable workers` lists them)"
        )


def held_up(
    actions: builtins.list[dict[str, Any]], running: builtins.list[dict[str, Any]], buffered: int
) -> str:
    """:attr:`ScheduleDescription.held_up`: ``its last 5 times were skipped behind run s-...
    (scheduled 2026-...), still pending; blocked: no live worker serves queue 'q' ...``."""
    skipped = 0
    for entry in actions:  # newest first
        if entry.get("action") != "skipped":
            break
        skipped += 1
    if not running or (skipped < 2 and not buffered):
        return ""
    run = running[0]
    waiting = (
        f"its last {skipped}{' or more' if skipped == len(actions) else ''} times were skipped"
        if skipped >= 2
        else f"{buffered} time(s) wait buffered"
    )
    why = f"; blocked: {run['blocked']}" if run.get("blocked") else ""
    return f"{waiting} behind run {run['workflow_id']} (scheduled {run['scheduled_at']}), still {run['status']}{why}"


def failing(note: str | None) -> str:
    """:attr:`ScheduleDescription.held_up` of a schedule whose scheduler passes fail: the note
    the last failure left on its record (``"<ms>|<error>"``), in words; ``""`` for none."""
    if not note:
        return ""
    ms, _, error = note.partition("|")
    return (
        f"its scheduler's passes fail (last at {iso(int(ms)) if ms.isdigit() else ms}, tried again "
        f"every few seconds): {error}"
    )
