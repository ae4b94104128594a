"""A workflow class's history budget: when its history is near enough its limit to continue as
new; a run whose history reached the limit with only inputs to wait on (it cannot move); and how
much of a pile of inputs one decision takes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigurationError, DurableError
from .limits import current as current_limits

__all__ = [
    "DEFAULT_HISTORY_BUDGET",
    "check_history_budget",
    "NEAR_LIMIT",
    "effective_history_budget",
    "history_full_reason",
    "history_info",
    "near_history_limit",
    "one_decisions_inputs",
]

log = logging.getLogger("durable.workflow")

#: Default history budget of a run; ``Workflow.history_budget`` overrides either key.
DEFAULT_HISTORY_BUDGET: dict[str, int] = {"events": 10_000, "bytes": 10 * 1024 * 1024}
#: Fraction of a budget threshold past which a run is near its limit.
NEAR_LIMIT = 0.8
#: Bytes of inputs one decision takes from a run's inbox (at least one input, whatever its size).
DECISION_INPUT_BYTES = 8 * 1024 * 1024


def one_decisions_inputs(inbox: list[bytes], most: int | None = None) -> list[bytes]:
    """The head of ``inbox`` one decision takes: up to ``most`` bytes (default
    :data:`DECISION_INPUT_BYTES`), at least one input.

    A run's inputs pile up while no worker decides it (workers down, a blocked run repaired):
    taken at once, they would be one commit script as large as the pile, blocking Redis for as
    long as it writes, and past Redis's query buffer (1 GB) refused for ever. The rest stays in
    the inbox for the next decision (the commit enqueues its task), in order; the history
    limits are checked at each.
    """
    most = DECISION_INPUT_BYTES if most is None else most
    taken = 0
    for n, raw in enumerate(inbox):
        taken += len(raw)
        if taken > most and n > 0:
            return inbox[:n]
    return inbox


def effective_history_budget(cls: Any) -> dict[str, int]:
    """A workflow class's ``history_budget`` over :data:`DEFAULT_HISTORY_BUDGET`, each threshold
    at most this process's hard limit (``max_history_events``, ``max_history_bytes``).

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
    return _within_limits(budget)


def _within_limits(budget: dict[str, int]) -> dict[str, int]:
    """``budget`` cut to this process's hard limits: past them, should_continue_as_new() would
    turn true only after the limit had terminated the run."""
    limits = current_limits()
    hard = {"events": limits.max_history_events, "bytes": limits.max_history_bytes}
    return {key: min(value, hard[key]) if hard[key] else value for key, value in budget.items()}


def check_history_budget(cls: Any) -> None:
    """Refuse a bad ``history_budget`` of workflow class ``cls``; warn of one past the hard limits
    (it is cut to them: see :func:`effective_history_budget`).

    Raises:
        ConfigurationError: as :func:`effective_history_budget`.
    """
    budget = effective_history_budget(cls)
    # What the user's classes declare (Workflow's own default, cut to the limits, says nothing).
    declared = next(
        (
            vars(c)["history_budget"]
            for c in cls.__mro__
            if "history_budget" in vars(c) and c.__module__ != __package__ + ".workflow"
        ),
        None,
    )
    for key, value in (declared or {}).items():
        if value > budget[key]:
            log.warning(
                "%s.history_budget[%r] = %d is past the hard limit (%d, durable.limits): "
                "should_continue_as_new() turns true at 80%% of the limit instead",
                cls.__name__,
                key,
                value,
                budget[key],
            )


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


_MOVED_BY_ITSELF = ("timer", "activity", "child")
"""Pending steps whose outcome reaches a run whatever its history's length (past its limit, the
decision that applies it closes the run, naming the limit)."""


def history_full_reason(record: Mapping[str, Any]) -> str | None:
    """Why an open run whose history holds ``max_history_events`` (this process's limit) cannot
    move: it waits only on inputs, and every signal, update or hook payload to it is refused
    (``None``: it is below the limit, or a timer, activity or child will move it)."""
    limit = current_limits().max_history_events
    events = int(record.get("seq") or 0)
    if not limit or events < limit:
        return None
    pending = (record.get("snapshot") or {}).get("pending") or ()
    if any(step.get("kind") in _MOVED_BY_ITSELF or step.get("deadline") is not None for step in pending):
        return None
    return (
        f"its history holds {events} events, the limit (max_history_events {limit}): every signal, "
        "update and hook payload to it is refused, so nothing can move it; cancel or terminate it (a long run "
        "that continue_as_new()s before its limit stays short), or raise DURABLE_MAX_HISTORY_EVENTS "
        "for its workers and clients"
    )
