"""An activity attempt's timeouts: when it must have finished (or heartbeated), which timeout an
expired one hit, and its heartbeat, which pushes the heartbeat deadline.
"""

from __future__ import annotations

import logging
import time

from durable.store.connect import is_transient
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask

from .heartbeats import AttemptHeartbeat, interval_for

__all__ = ["attempt_deadline", "attempt_heartbeat", "timeout_kind"]

log = logging.getLogger("durable.worker")


def attempt_deadline(task: ActivityTask, started: float, *, heartbeat: bool = True) -> float | None:
    """When an attempt started at ``started`` must have finished (or heartbeated), if ever;
    without ``heartbeat``, only its hard limits (start-to-close, schedule-to-close)."""
    kinds = ("start_to_close", "heartbeat") if heartbeat else ("start_to_close",)
    limits = [started + t for t in map(task.timeout, kinds) if t]
    schedule_to_close = task.timeout("schedule_to_close")
    if schedule_to_close:
        limits.append(task.scheduled / 1000 + schedule_to_close)
    return min(limits) if limits else None


def timeout_kind(task: ActivityTask, started_ms: int | None, now_ms: int) -> str:
    """Which timeout an expired attempt hit: schedule_to_close, start_to_close, heartbeat, or
    ``lease`` (the worker running a leased attempt stopped renewing it: it died)."""
    timeouts = task.timeouts or {}
    if not any(timeouts.values()):
        return "lease"
    schedule_to_close, start_to_close = task.timeout("schedule_to_close"), task.timeout("start_to_close")
    if schedule_to_close and now_ms >= task.scheduled + schedule_to_close * 1000:
        return "schedule_to_close"
    if start_to_close and started_ms is not None and now_ms >= started_ms + start_to_close * 1000:
        return "start_to_close"
    return "heartbeat" if task.timeout("heartbeat") else "start_to_close"


def attempt_heartbeat(store: RedisStore, task: ActivityTask, started: float) -> AttemptHeartbeat:
    """The attempt's heartbeat function (see ``ActivityContext.heartbeat``), throttled."""
    heartbeat_timeout = task.timeout("heartbeat")

    def send(details: bytes, beat_at: float) -> bool:
        extend = 0
        if heartbeat_timeout:
            # Push the deadline one heartbeat timeout past the heartbeat (not past its write,
            # which the throttle may delay), never past the attempt's hard limits.
            hard = attempt_deadline(task, started, heartbeat=False)
            due = beat_at + heartbeat_timeout
            extend = max(1, int(((min(due, hard) if hard else due) - time.time()) * 1000))
        try:
            return store.heartbeat(task, details, extend)
        except Exception as exc:
            if not is_transient(exc):
                raise
            # Redis unreachable or stalled: the activity goes on (its next heartbeat writes these
            # details); a redis ConnectionError raised into its code failed the attempt.
            log.debug("heartbeat of activity %s (run %s) not written: %s", task.activity_id, task.run_id, exc)
            return False

    return AttemptHeartbeat(send, interval_for(heartbeat_timeout))
