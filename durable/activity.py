"""Activities: the at-least-once steps a workflow delegates its side effects to.

An activity is an :class:`Activity` subclass (``handle()`` does the work) or a
plain function. Either runs on a worker's thread pool, may run more than once
(retries, a worker lost mid-attempt), and should therefore make its external
effects idempotent with :attr:`ActivityContext.idempotency_key`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

from .errors import DurableError
from .options import RetryPolicy, Seconds, to_seconds
from .registry import register_activity_class

# Re-exported: they were defined here first and user code imports them from here.
__all__ = [
    "Activity",
    "ActivityCancelledError",
    "ActivityContext",
    "RetryPolicy",
    "Seconds",
    "activity_context",
    "running_activity",
    "set_worker_identity",
    "to_seconds",
    "worker_identity",
]


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

        Cheap enough to call for every item of a loop: as Temporal's SDKs do, heartbeats are
        throttled. One is written at once; those within the next interval (a quarter of the
        heartbeat timeout, at most 1 s) are held back and the latest is written when it ends
        (it still pushes the deadline from when it was made), so a cancel may be seen one
        interval late. A heartbeat timeout under 1 s is not throttled: each is written. ``details=None`` keeps the last details. When the attempt fails, its
        latest details are written before the failure: the retry resumes from them.

        Raises:
            ActivityCancelledError: The workflow no longer wants this result;
                stop work (cleanup is fine) and let the error propagate.
        """
        if self._heartbeat_fn is not None and self._heartbeat_fn(details):
            raise ActivityCancelledError(f"activity {self.activity_id} of run {self.run_id} was cancelled")


_local = threading.local()
# The running attempt's context: a context variable, so each ``async def`` activity (a task
# on the worker's shared event loop thread) sees its own; a thread sees what it set.
_context: ContextVar[ActivityContext | None] = ContextVar("durable_activity_context", default=None)


def activity_context() -> ActivityContext:
    """The :class:`ActivityContext` of the activity running on this thread (or in this
    ``async def`` activity's task).

    Raises:
        DurableError: Called outside a running activity.
    """
    ctx = _context.get()
    if ctx is None:
        raise DurableError("activity_context() called outside a running activity")
    return ctx


@contextmanager
def running_activity(ctx: ActivityContext) -> Iterator[ActivityContext]:
    """Make ``ctx`` what :func:`activity_context` returns on this thread while the block runs.

    A worker wraps each activity attempt in it; the previous context (if any)
    is restored on exit.
    """
    token = _context.set(ctx)
    try:
        yield ctx
    finally:
        _context.reset(token)


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
        register_activity_class(cls)

    @property
    def context(self) -> ActivityContext:
        """The context of the running attempt."""
        return activity_context()

    def handle(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.handle() is not implemented")
