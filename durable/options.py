"""Options shared by workflow code, activity definitions and the replay driver.

A leaf module (it imports only :mod:`durable.errors` and :mod:`durable.immutable`):
durations, the retry policy of an activity, and the per-call options a durable call hands
to the workflow runtime.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from .errors import ConfigurationError
from .immutable import immutable

if TYPE_CHECKING:
    from .store.redis_store import RedisStore

#: A duration: seconds (int or float) or a :class:`~datetime.timedelta`.
Seconds = float | int | timedelta


MAX_DURATION_S = 1e15
"""The longest duration (timeouts, timers, retention) durable takes, in seconds: about 30 million
years, so that any time stamp plus it still fits the signed 64-bit ms fields of history and Redis."""


def to_seconds(value: Seconds | None, what: str) -> float | None:
    """Normalise seconds-or-timedelta to float seconds (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{what} must be seconds (int/float) or a timedelta, not {type(value).__name__}"
        )
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(f"{what} must be a finite, non-negative duration, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise ConfigurationError(
            f"{what} must be at most {MAX_DURATION_S:.0e} s (about 30 million years), got {value!r}"
        )
    return seconds


def wait_seconds(timeout: Seconds | None) -> float | None:
    """A client wait's ``timeout`` (``result()``, ``update()``) in seconds; ``None`` and
    ``math.inf`` wait as long as it takes (an infinite timeout reached the thread wait and
    raised OverflowError; a NaN one timed out at once).

    Raises:
        ConfigurationError: negative, NaN, past :data:`MAX_DURATION_S` or not a duration.
    """
    if timeout is None or timeout == math.inf:
        return None
    return to_seconds(timeout, "timeout")


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed activity attempt is retried.

    The delay before attempt ``n + 1`` is
    ``min(initial_interval * backoff_coefficient ** (n - 1), max_interval)``.

    Args:
        initial_interval: Seconds before the first retry.
        backoff_coefficient: Multiplier applied to the delay after each retry (>= 1).
        max_interval: Cap on the delay, in seconds (default: 100x ``initial_interval``).
        max_attempts: Total attempts including the first; ``0`` means unlimited
            (the default).
        non_retryable_errors: Exception type names (``"ValueError"`` or
            ``"myapp.errors.CardDeclined"``) that fail the activity at once.
        maximum_attempts: Temporal's name for ``max_attempts`` (keyword only).
        maximum_interval: Temporal's name for ``max_interval`` (keyword only).
        non_retryable_error_types: Temporal's name for ``non_retryable_errors`` (keyword only).

    Temporal's names are taken so that a ported ``RetryPolicy(maximum_attempts=3)`` means what
    it meant there; the policy keeps durable's names (``policy.max_attempts``).
    """

    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float | None = None
    max_attempts: int = 0
    # Sequence: a list is taken (Temporal's type); stored as a tuple.
    non_retryable_errors: Sequence[str] = field(default_factory=tuple)
    maximum_attempts: int | None = field(default=None, kw_only=True, repr=False, compare=False)
    maximum_interval: Seconds | None = field(default=None, kw_only=True, repr=False, compare=False)
    non_retryable_error_types: Sequence[str] | None = field(
        default=None, kw_only=True, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._take_temporal_names()
        initial = to_seconds(self.initial_interval, "RetryPolicy.initial_interval")
        assert initial is not None
        if initial <= 0:
            raise ConfigurationError("RetryPolicy.initial_interval must be > 0 seconds")
        object.__setattr__(self, "initial_interval", initial)
        if isinstance(self.backoff_coefficient, bool) or not isinstance(
            self.backoff_coefficient, int | float
        ):
            raise ConfigurationError("RetryPolicy.backoff_coefficient must be a number >= 1")
        if not self.backoff_coefficient >= 1:
            raise ConfigurationError(
                f"RetryPolicy.backoff_coefficient must be >= 1, got {self.backoff_coefficient!r}"
            )
        object.__setattr__(self, "backoff_coefficient", float(self.backoff_coefficient))
        max_interval = to_seconds(self.max_interval, "RetryPolicy.max_interval")
        if max_interval is None:
            max_interval = 100.0 * initial
        if max_interval < initial:
            raise ConfigurationError("RetryPolicy.max_interval must be >= initial_interval")
        object.__setattr__(self, "max_interval", max_interval)
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 0
        ):
            raise ConfigurationError("RetryPolicy.max_attempts must be an int >= 0 (0 = unlimited)")
        names = self.non_retryable_errors
        if isinstance(names, str):
            names = (names,)
        if not all(isinstance(n, str) and n for n in names):
            raise ConfigurationError("RetryPolicy.non_retryable_errors must be exception type names (str)")
        object.__setattr__(self, "non_retryable_errors", tuple(names))

    def _take_temporal_names(self) -> None:
        defaults = {"max_attempts": 0, "max_interval": None, "non_retryable_errors": ()}
        for alias, name in (
            ("maximum_attempts", "max_attempts"),
            ("maximum_interval", "max_interval"),
            ("non_retryable_error_types", "non_retryable_errors"),
        ):
            value = getattr(self, alias)
            if value is None:
                continue
            mine = getattr(self, name)
            if mine != defaults[name] and mine != value:
                raise ConfigurationError(
                    f"RetryPolicy got both {name}={mine!r} and {alias}={value!r} (Temporal's name "
                    f"for it): give one"
                )
            object.__setattr__(self, name, value)
            # Folded in: replace() and pickling see one value, under durable's name.
            object.__setattr__(self, alias, None)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        assert self.max_interval is not None
        if self.backoff_coefficient > 1:
            # Past the cap, the power is not computed: 2.0 ** 1024 overflows (attempt 1025 of
            # the default policy, about a day of retries, would fail to be recorded, forever).
            capped = math.log(self.max_interval / self.initial_interval, self.backoff_coefficient) + 1
            if attempt >= capped:
                return self.max_interval
        return min(self.initial_interval * self.backoff_coefficient ** (attempt - 1), self.max_interval)

    def to_dict(self) -> dict[str, Any]:
        return {
            "initial_interval": self.initial_interval,
            "backoff_coefficient": self.backoff_coefficient,
            "max_interval": self.max_interval,
            "max_attempts": self.max_attempts,
            "non_retryable_errors": list(self.non_retryable_errors),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RetryPolicy:
        if not data:
            return cls()
        return cls(
            initial_interval=data["initial_interval"],
            backoff_coefficient=data["backoff_coefficient"],
            max_interval=data["max_interval"],
            max_attempts=data["max_attempts"],
            non_retryable_errors=tuple(data.get("non_retryable_errors", ())),
        )


def duration_ms(value: Seconds, what: str) -> int:
    """A duration (seconds or timedelta) as whole milliseconds.

    Raises:
        ConfigurationError: not a duration (``None`` included: ``timer(None)`` is no duration).
    """
    seconds = to_seconds(value, what)
    if seconds is None:
        raise ConfigurationError(f"{what} must be seconds (int/float) or a timedelta, not None")
    return int(round(seconds * 1000))


@immutable(kw_only=True)
class ActivityOptions:
    """The options of one ``activity()`` / ``local_activity()`` call, as given (``None``: the definition's).

    Attributes:
        id: Explicit command id, else the next number of the calling branch.
        queue: Task queue override.
        retry: Retry policy override.
        start_to_close_timeout: Max duration of one attempt.
        schedule_to_close_timeout: Max duration from scheduling to the end, retries included.
        heartbeat_timeout: Max duration between two heartbeats.
        local: Run in the workflow worker's own process.
    """

    id: str | None = None
    queue: str | None = None
    retry: RetryPolicy | None = None
    start_to_close_timeout: Seconds | None = None
    schedule_to_close_timeout: Seconds | None = None
    heartbeat_timeout: Seconds | None = None
    local: bool = False


@immutable(kw_only=True)
class ChildOptions:
    """The options of one ``child()`` call.

    Attributes:
        id: Explicit command id, else the next number of the calling branch.
        workflow_id: The child's workflow id, else ``<parent id>/<command id>``.
        queue: Task queue override.
        parent_close_policy: ``terminate``, ``request_cancel`` or ``abandon``.
    """

    id: str | None = None
    workflow_id: str | None = None
    queue: str | None = None
    parent_close_policy: str = "terminate"


class MakeOptions(TypedDict, total=False):
    """The keyword options of :meth:`WorkflowStub.make` (what ``AsyncWorkflowStub.make`` passes on)."""

    queue: str | None
    store: RedisStore | None
    id_reuse_policy: str
    id_conflict_policy: str | None
    execution_timeout: Seconds | str | None
    run_timeout: Seconds | str | None
    search_attributes: dict[str, Any] | None
    memo: dict[str, Any] | None
