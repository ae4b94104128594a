"""Retention of closed runs: how long a closed run's keys stay in Redis.

A run that closes (completed, failed, cancelled, terminated, continued) keeps
its history, log, run record and instance record for a **retention period**,
then the scheduler of any worker purges them (see :mod:`durable.store.retention`).

Which period applies is fixed when the run closes, like Temporal's namespace
retention: the run's own (``Workflow.retention`` of its type, recorded in the
run record when it starts and kept across ``continue_as_new``), else the
namespace's (``durable worker --retention`` / ``DURABLE_RETENTION``, stored in
Redis beside the partitions), else :data:`DEFAULT_RETENTION`. Changing a setting
later changes the runs that close afterwards, not those already closed.

Durations are written ``30s``, ``5m``, ``1h``, ``7d`` (or ``1d12h``), or given
as seconds or a :class:`~datetime.timedelta`.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

from .errors import ConfigurationError
from .options import MAX_DURATION_S
from .registry import workflows

__all__ = [
    "DEFAULT_RETENTION",
    "ENV",
    "duration_text",
    "parse_duration",
    "retention_ms",
    "type_retention_ms",
]

DEFAULT_RETENTION = timedelta(days=3)
"""Retention when neither the workflow type nor the namespace sets one.

Three days, like a Temporal namespace created without a ``--retention``: long enough
to cover a weekend between a failure and someone reading ``durable describe``, a
``result()`` fetched late by a batch job, a history exported for ``durable replay``
after an incident -- and short because Redis keeps everything in memory: at one run
a second, three days of closed 10-activity runs hold about 1.5 GB (embedded server
settings) to 2.8 GB (stock Redis 6.2); see docs/operations.md for the arithmetic.
"""

ENV = "DURABLE_RETENTION"
"""Environment variable read by ``durable worker``/``dev`` as the namespace retention."""

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str, allow_zero: bool = False) -> float:
    """Seconds in a duration written ``30s``, ``5m``, ``1h``, ``7d``, ``2w``, ``1d12h``, ``250ms``
    or plain seconds (``90``).

    Raises:
        ConfigurationError: ``text`` is not such a duration, or is not positive (zero is
            allowed with ``allow_zero``: "closed 0s ago" means now).
    """
    raw = text.strip().lower()
    try:
        seconds = float(raw)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _PART.finditer(raw):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(raw) or not raw:
            raise ConfigurationError(
                f"not a duration: {text!r} (write e.g. 30s, 5m, 1h, 7d, 1d12h, or seconds)"
            ) from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigurationError(f"a duration must be positive, got {text!r}")
    return seconds


def retention_ms(value: Any, what: str = "retention") -> int:
    """A retention given as a :class:`timedelta`, seconds (int/float) or a duration string, in ms.

    Raises:
        ConfigurationError: not a positive duration.
    """
    if isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{what}: {exc}") from None
    elif isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"{what} must be a timedelta, seconds or a duration like '7d', not {type(value).__name__}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{what} must be a positive duration, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise ConfigurationError(
            f"{what} must be at most {MAX_DURATION_S:.0e} s (about 30 million years), got {value!r}"
        )
    return max(1, int(round(seconds * 1000)))


def type_retention_ms(workflow_type: str) -> int | None:
    """The ``retention`` of the workflow class registered as ``workflow_type`` in this process,
    in ms; ``None`` when the type sets none (or is not registered here: the namespace's applies)."""
    cls = workflows().get(workflow_type)
    value = getattr(cls, "retention", None) if cls is not None else None
    if value is None:
        return None
    return retention_ms(value, f"{getattr(cls, '__name__', workflow_type)}.retention")


def duration_text(ms: int) -> str:
    """A retention in the words it is given in: ``3d``, ``12h``, ``30m``, ``45s``, ``250ms``."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms / 1000:g}s" if ms >= 1000 else f"{ms}ms"
