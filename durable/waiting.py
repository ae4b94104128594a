"""What an open run waits on, in words: its timers, signals, conditions, hooks and children,
and the signals it received that nothing awaited yet.

``durable status`` adds it to the status word of a run that is not blocked, and a ``result()``
that times out says it, so "it did not close" never comes without "because it waits on this".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .run_views import describe_run, task_in_words
from .runinfo import NO_LIVE_WORKER, from_now, past_dates, utc_text
from .store.connect import masked_url
from .store.redis_store import RedisStore, RunRef
from .store.timer_index import OVERDUE_MS

MOST_NAMED = 5
"""The most waits a line names (a wide fan-out waits on many: ``describe`` lists them all)."""


def waits_in_words(
    pending: Sequence[Mapping[str, Any]], now_ms: int, *, task_pending: bool = False
) -> list[str]:
    """A line per pending step that waits on something other than an activity, with its
    deadline and how far off it is (``now_ms``: the time to count from, UTC ms).
    ``task_pending``: a workflow task of the run waits to be decided (said beside): a deadline
    past has most likely fired, its input waiting with that task."""
    lines = []
    for step in pending:
        kind, sid, name = step.get("kind"), step.get("id"), step.get("name")
        if kind == "timer":
            what = f"timer {sid}"
        elif kind == "signal":
            what = f"signal {name!r}"
        elif kind == "hook":
            what = f"hook {name or sid!r}"
        elif kind == "wait_until":
            what = f"a wait_until condition ({sid})"
        elif kind == "child":
            what = str(step.get("state") or f"child {step.get('workflow_id')}")
        else:
            continue  # activities: describe's attempts say more; "frontier" is replay's own
        deadline = step.get("deadline")
        if deadline is not None:
            verb = "fires" if kind == "timer" else "times out"
            what += f": {verb} {_at(int(deadline), now_ms)}"
            if now_ms - int(deadline) > OVERDUE_MS:
                # A live worker's scheduler fires it within a moment of its time: with a task
                # waiting, it fired (its input goes with that task); without one, none has.
                what += (
                    " (passed: it moves once its workflow task is decided)"
                    if task_pending
                    else " (overdue: it is not in its partition's timers index, deleted by hand?, so no scheduler "
                    "fires it: `durable repair` arms it again)"
                    if step.get("unarmed")
                    else " (overdue: no live worker's scheduler has fired it; `durable workers` shows their heartbeats)"
                )
        lines.append(what)
    return lines


def in_words(
    pending: Sequence[Mapping[str, Any]],
    now_ms: int,
    buffered: Mapping[str, int] | None,
    *,
    activities: bool = False,
    task_pending: bool = False,
) -> str:
    """What a run that is not blocked waits on (``""``: nothing said), and the signals it
    received that no ``await_signal`` took yet (``buffered``: count per name): where a signal
    sent under a misspelt name shows. ``activities``: name its pending activities first (where
    nothing else says how their attempts are doing)."""
    clauses = []
    waits = waits_in_words(pending, now_ms, task_pending=task_pending)
    if activities:
        waits[:0] = [
            f"activity {s.get('name')} ({s.get('id')})" for s in pending if s.get("kind") == "activity"
        ]
    if len(waits) > MOST_NAMED:
        waits[MOST_NAMED:] = [f"{len(waits) - MOST_NAMED} more"]
    if waits:
        clauses.append(f"waiting for {'; '.join(waits)}")
    if buffered:
        names = ", ".join(f"signal {name!r} x{count}" for name, count in sorted(buffered.items()))
        clauses.append(f"received, not awaited yet: {names}")
    return "; ".join(clauses)


def not_closed(store: RedisStore, ref: RunRef, timeout: float | None) -> str:
    """Why ``result()`` on ``ref`` timed out: the run's status and either what blocks it or what
    it waits on (one read of its record; activities: ``durable describe`` has their attempts)."""
    within = "within the timeout" if timeout is None else f"within {timeout:g} s"
    head = f"workflow {ref.workflow_id!r} did not close {within}"
    try:
        record, live = store.run_record(ref), store.live_workers()
        blocked, now_ms = store.why_blocked(record, live), store.server_time_ms()
        task = None if blocked is not None else task_in_words(store, ref, record, live)
    except Exception:  # noqa: BLE001 - the timeout is the answer; this look only explains it
        return head
    head += f": it is {record.get('status') or 'pending'}"
    if blocked is not None:
        # A worker started elsewhere may serve another Redis (another folder's embedded one).
        where = (
            f" [this client uses Redis {masked_url(store.url)}]"
            if blocked.kind == NO_LIVE_WORKER and store.url
            else ""
        )
        return f"{head}, blocked: {blocked.message}{where}"
    snapshot = record.get("snapshot") or {}
    pending = snapshot.get("pending") or []
    waits = in_words(
        pending, now_ms, snapshot.get("signals_buffered"), activities=True, task_pending=bool(task)
    )
    said = "; ".join(w for w in (task, waits, _retrying(store, ref, pending, now_ms)) if w)
    more = f"`durable describe {ref.workflow_id}`"
    return f"{head}, {said} ({more} says more)" if said else f"{head} ({more} shows its steps)"


def _retrying(store: RedisStore, ref: RunRef, pending: Sequence[Any], now_ms: int) -> str:
    """The activities past their first attempt with their last error, as ``durable status``
    says them (a test mocking one with an exception sat to its timeout, told only "waiting for
    activity X"); more reads, only when the run waits on an activity."""
    if not any(isinstance(s, Mapping) and s.get("kind") == "activity" for s in pending):
        return ""
    try:
        return "; ".join(describe_run(store, ref.workflow_id, ref).retrying(now_ms))
    except Exception:  # noqa: BLE001 - the timeout is the answer; this only explains it
        return ""


def _at(deadline_ms: int, now_ms: int) -> str:
    at = utc_text(deadline_ms)
    return f"{at} UTC" if past_dates(deadline_ms) else f"{at} UTC, {from_now(deadline_ms, now_ms)}"
