"""A workflow class's history budget: when its history is near enough its limit to continue as new."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError, DurableError

__all__ = [
    "DEFAULT_HISTORY_BUDGET",
    "NEAR_LIMIT",
    "effective_history_budget",
    "history_info",
    "near_history_limit",
]

#: Default history budget of a run; ``Workflow.history_budget`` overrides either key.
DEFAULT_HISTORY_BUDGET: dict[str, int] = {"events": 10_000, "bytes": 10 * 1024 * 1024}
#: Fraction of a budget threshold past which a run is near its limit.
NEAR_LIMIT = 0.8


def effective_history_budget(cls: Any) -> dict[str, int]:
    """A workflow class's ``history_budget`` over :data:`DEFAULT_HISTORY_BUDGET`.

    Raises:
        ConfigurationError: not a dict, an unknown key, or a value that is not a positive integer.
    """
    budget = dict(DEFAULT_HISTORY_BUDGET)
    given = getattr(cls, "history_budget", None) if cls is not None else None
    if given is None:
        return budget
    where = f"{getattr(cls, '__name__', cls)}.history_budget"
    if not isinstance(given, dict):
        raise ConfigurationError(f"{where} must be a dict like {{'events': 10000, 'bytes': 10485760}}")
    for key, value in given.items():
        if key not in budget:
            raise ConfigurationError(f"{where}: unknown key {key!r} (use 'events' and/or 'bytes')")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigurationError(f"{where}[{key!r}] must be a positive integer, not {value!r}")
        budget[key] = value
    return budget


def near_history_limit(events: int, size: int, budget: dict[str, int]) -> bool:
    """Whether ``events`` or ``size`` (bytes) passed :data:`NEAR_LIMIT` of its threshold in ``budget``."""
    return events >= NEAR_LIMIT * budget["events"] or size >= NEAR_LIMIT * budget["bytes"]


def history_info(snap: dict[str, Any], workflow_class: Callable[[str], Any]) -> dict[str, Any]:
    """The ``history`` item of a run's description (``{"events", "bytes", "budget", "near_limit"}``),
    from the snapshot its last decision wrote; takes those items out of ``snap``.

    ``workflow_class`` looks a type name up (for the budget of a snapshot that names none).
    """
    budget = snap.pop("history_budget", None)
    if not isinstance(budget, dict):
        try:
            budget = effective_history_budget(workflow_class(str(snap.get("type") or "")))
        except DurableError:
            budget = effective_history_budget(None)
    events = snap.pop("history_events", None)
    if not isinstance(events, int):  # no decision yet: only what the record knows
        events = int(snap.get("seq") or 0)
    size = snap.pop("history_bytes", None)
    near = snap.pop("near_history_limit", None)
    if not isinstance(near, bool):
        near = near_history_limit(events, size if isinstance(size, int) else 0, budget)
    return {"events": events, "bytes": size, "budget": budget, "near_limit": near}
