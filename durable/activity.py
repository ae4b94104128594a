"""Activities: the at-least-once steps a workflow delegates its side effects to.

An activity is an :class:`Activity` subclass (``handle()`` does the work) or a
plain function. Either runs on a worker's thread pool, may run more than once
(retries, a worker lost mid-attempt), and should therefore make its external
effects idempotent with :attr:`ActivityContext.idempotency_key`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

from .errors import ConfigurationError, DurableError

Seconds = float | int | timedelta


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
    return seconds


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
            (the default, as in Temporal).
        non_retryable_errors: Exception type names (``"ValueError"`` or
            ``"myapp.errors.CardDeclined"``) that fail the activity at once.
    """

    initial_interval: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval: float | None = None
    max_attempts: int = 0
    non_retryable_errors: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
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

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        assert self.max_interval is not None
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


class ActivityCancelledError(DurableError):
    """Raised by :meth:`ActivityContext.heartbeat` when the workflow cancelled this activity."""


class ActivityContext:
    """What a running activity knows about itself.

    Attributes:
        workflow_id: The workflow instance id.
        run_id: The run that scheduled the activity.
        activity_id: The command id of the activity within its run.
        attempt: 1 for the first attempt, 2 for the first retry, ...
        idempotency_key: ``run_id:activity_id`` — stable across retries and
            redeliveries; use it to make external effects happen once.
        attempt_id: ``idempotency_key:attempt`` — distinct per attempt.
        heartbeat_details: The details of the last heartbeat of an earlier
            attempt (``None`` if there was none), to resume long work.
        worker: Name of the worker process running this attempt.
        session_queue: The private queue of that worker (what a worker session
            pins its activities to).
    """

    def __init__(
        self,
        *,
        workflow_id: str,
        run_id: str,
        activity_id: str,
        name: str,
        attempt: int,
        heartbeat_details: Any = None,
        heartbeat_fn: Callable[[Any], bool] | None = None,
    ) -> None:
        self.workflow_id = workflow_id
        self.run_id = run_id
        self.activity_id = activity_id
        self.name = name
        self.attempt = attempt
        self.heartbeat_details = heartbeat_details
        self._heartbeat_fn = heartbeat_fn
        self.worker, self.session_queue = worker_identity()

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.activity_id}"

    @property
    def attempt_id(self) -> str:
        return f"{self.idempotency_key}:{self.attempt}"

    def heartbeat(self, details: Any = None) -> None:
        """Report progress: pushes the heartbeat deadline and saves ``details``.

        Raises:
            ActivityCancelledError: The workflow no longer wants this result;
                stop work (cleanup is fine) and let the error propagate.
        """
        if self._heartbeat_fn is not None and self._heartbeat_fn(details):
            raise ActivityCancelledError(f"activity {self.activity_id} of run {self.run_id} was cancelled")


_local = threading.local()


def activity_context() -> ActivityContext:
    """The :class:`ActivityContext` of the activity running on this thread.

    Raises:
        DurableError: Called outside a running activity.
    """
    ctx = getattr(_local, "context", None)
    if ctx is None:
        raise DurableError("activity_context() called outside a running activity")
    return ctx


def _set_context(ctx: ActivityContext | None) -> None:
    _local.context = ctx


def set_worker_identity(worker: str, session_queue: str) -> None:
    """Called by a worker on each of its activity threads (thread pool initializer)."""
    _local.identity = (worker, session_queue)


def worker_identity() -> tuple[str, str]:
    """(worker name, its private session queue) of the current activity thread, or empty."""
    identity: tuple[str, str] = getattr(_local, "identity", ("", ""))
    return identity


class Activity:
    """Base class for activities: subclass it and implement ``handle()``.

    Class attributes (each overridable per call in ``activity(...)``):
        name: Durable name (default: the class name). Must be unique.
        queue: Task queue the activity runs on (default ``"default"``).
        retry: A :class:`RetryPolicy` (default: ``RetryPolicy()``).
        start_to_close_timeout: Max seconds (or timedelta) of one attempt.
        schedule_to_close_timeout: Max seconds from scheduling to the end, retries included.
        heartbeat_timeout: Max seconds between two heartbeats.

    Example:
        ```python
        class Charge(Activity):
            retry = RetryPolicy(max_attempts=5)

            def handle(self, order_id: str, cents: int) -> str:
                return payments.charge(order_id, cents, key=self.context.idempotency_key)
        ```
    """

    name: ClassVar[str] = ""
    queue: ClassVar[str | None] = None
    retry: ClassVar[RetryPolicy | None] = None
    start_to_close_timeout: ClassVar[Seconds | None] = None
    schedule_to_close_timeout: ClassVar[Seconds | None] = None
    heartbeat_timeout: ClassVar[Seconds | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        from .registry import register_activity_class

        register_activity_class(cls)

    @property
    def context(self) -> ActivityContext:
        """The context of the running attempt."""
        return activity_context()

    def handle(self, *args: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.handle() is not implemented")
