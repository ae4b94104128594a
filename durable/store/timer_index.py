"""A run's deadlines in its partition's timers index (``T:timers``): those missing from it.

A run waiting on a timer (or a signal wait's timeout) moves when a scheduler finds its member in
the index and fires it. A timers key overwritten by hand (another kind of value), then deleted as
the error said, took its timers with it: the runs waiting on them waited for ever, status saying
"overdue: no live worker's scheduler has fired it", and ``durable repair`` re-queued a task that
decided nothing. The views say which deadlines the index lacks; repair puts them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis

from .base import StoreBase
from .keys import timer_member
from .records import HEARTBEAT_S, RunRef

__all__ = ["OVERDUE_MS", "rearm", "unarmed"]

OVERDUE_MS = 2 * HEARTBEAT_S * 1000
"""How long past its time a timer (or a wait's timeout) is said to be overdue: a live worker's
scheduler fires it within a moment, so this long means none is running (or all are stalled)."""


def _deadlines(pending: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """``{wait id: due ms}`` of the pending waits a timers-index member fires: timers and signal
    waits with a timeout (their commit added ``t|<run>|<id>``)."""
    return {
        str(step["id"]): int(step["deadline"])
        for step in pending
        if step.get("kind") in ("timer", "signal") and step.get("deadline") is not None
    }


def unarmed(store: StoreBase, ref: RunRef, pending: Sequence[Mapping[str, Any]]) -> set[str]:
    """The ids of ``pending``'s deadlines whose member the partition's timers index lacks (one
    round trip; none when the key holds another kind: that is said by name elsewhere)."""
    due = list(_deadlines(pending))
    if not due:
        return set()
    key = store.keys.timers(ref.partition)
    try:
        with store.redis.pipeline(transaction=False) as pipe:
            for wait_id in due:
                pipe.zscore(key, timer_member(ref.run_id, wait_id))
            scores = pipe.execute()
    except redis.ResponseError:
        return set()
    return {wait_id for wait_id, score in zip(due, scores, strict=True) if score is None}


def rearm(store: StoreBase, ref: RunRef, pending: Sequence[Mapping[str, Any]]) -> int:
    """Put ``pending``'s deadlines the timers index lacks back into it, at their due times (one
    past due fires at the next scheduler pass); how many. A member there already is left as it is
    (``NX``)."""
    missing = unarmed(store, ref, pending)
    if not missing:
        return 0
    due = _deadlines(pending)
    members = {timer_member(ref.run_id, wait_id): due[wait_id] for wait_id in missing}
    return int(store.redis.zadd(store.keys.timers(ref.partition), members, nx=True))
