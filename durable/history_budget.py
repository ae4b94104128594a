"""A workflow class's history budget: when its history is near enough its limit to continue as new."""

from __future__ import annotations

from typing import Any

from .errors import ConfigurationError

__all__ = ["DEFAULT_HISTORY_BUDGET", "NEAR_LIMIT", "effective_history_budget", "near_history_limit"]

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
