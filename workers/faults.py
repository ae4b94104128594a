"""Fault injection: crash this worker process at named points (for tests/faults).

Off unless ``DURABLE_FAULTS`` is set, e.g.
``DURABLE_FAULTS="activity.after_effect=0.05,decision.after_commit=0.02"``: at
each named point the process SIGKILLs itself with that probability, so the
fault suite can kill workers exactly between an effect and its record.

Points:
    activity.after_effect   the activity ran (its effect happened), completion not recorded
    decision.before_commit  a decision was computed, nothing committed
    decision.after_commit   the decision (and its task ack) committed, cache/outbox not done
    timers.after_fire       a batch of timers fired, the scheduler not yet woken again
    outbox.before_ack       a cross-partition message was carried out, not yet acked
"""

from __future__ import annotations

import logging
import os
import random
import signal

log = logging.getLogger("durable.faults")


def _parse(spec: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, prob = part.partition("=")
        points[name.strip()] = float(prob or 1.0)
    return points


_POINTS = _parse(os.environ.get("DURABLE_FAULTS", ""))
_rng = random.Random(os.environ.get("DURABLE_FAULTS_SEED") or None)


def point(name: str) -> None:
    """Maybe die here (SIGKILL, no cleanup), if fault injection names this point."""
    probability = _POINTS.get(name)
    if probability and _rng.random() < probability:
        log.warning("fault injection: SIGKILL at %s", name)
        os.kill(os.getpid(), signal.SIGKILL)
