"""The interface between workflow code and whatever runs it.

:mod:`durable.workflow` (the calls user code makes) depends on this module
only; the replay driver (:class:`durable.replay.Driver`) implements
:class:`WorkflowRuntime`. Workflow code runs in greenlets, and every greenlet
that runs it is a :class:`WorkflowGreenlet` that knows its runtime, so
:func:`current_runtime` finds the runtime of the calling code without a
global.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import greenlet

from .errors import DurableError
from .options import ActivityOptions, ChildOptions, Seconds

T = TypeVar("T")

__all__ = [
    "Hook",
    "WorkflowGreenlet",
    "WorkflowRuntime",
    "current_runtime",
    "forbid_durable_calls",
]


class Hook:
    """A durable callback created by :func:`durable.create_hook`.

    Attributes:
        id: Command id of the hook in its run.
        name: The name given at creation.
        token: Unguessable single-use token; give it to the party that will
            call ``WorkflowStub.resume_hook(token, payload)``.
    """

    __slots__ = ("id", "name", "token")

    def __init__(self, id: str, name: str, token: str) -> None:  # noqa: A002
        self.id = id
        self.name = name
        self.token = token

    def __repr__(self) -> str:
        return f"Hook(id={self.id!r}, name={self.name!r})"


class WorkflowRuntime(ABC):
    """What the durable calls of :mod:`durable.workflow` ask of the code that runs a workflow.

    Each ``call_*`` method is entered on the greenlet of the calling branch;
    the ones that wait suspend that greenlet until history resolves the step.
    """

    @abstractmethod
    def check_call_allowed(self) -> None:
        """Raise :class:`DurableError` if workflow code may not make a durable call now."""

    @abstractmethod
    def call_activity(self, target: Any, args: tuple[Any, ...], options: ActivityOptions) -> Any:
        """Schedule an activity and return its result."""

    @abstractmethod
    def call_timer(self, duration: Seconds, *, id: str | None) -> None:  # noqa: A002
        """Sleep durably for ``duration``."""

    @abstractmethod
    def call_await_signal(self, name: str, timeout: Seconds | None, *, id: str | None) -> Any:  # noqa: A002
        """Wait for the signal ``name`` and return its payload."""

    @abstractmethod
    def call_wait_until(
        self,
        predicate: Callable[[], bool],
        timeout: Seconds | None,
        *,
        id: str | None,  # noqa: A002
    ) -> bool:
        """Wait until ``predicate()`` is true; False when ``timeout`` passed first."""

    @abstractmethod
    def call_side_effect(self, fn: Callable[[], T], *, id: str | None) -> T:  # noqa: A002
        """Call ``fn`` once, record its value, and return the recorded value."""

    @abstractmethod
    def call_child(self, workflow: Any, args: tuple[Any, ...], options: ChildOptions) -> Any:
        """Start a child workflow and return its result."""

    @abstractmethod
    def call_all(self, fns: list[Callable[[], Any]], *, id: str | None) -> list[Any]:  # noqa: A002
        """Run callables as concurrent branches and return their results in order."""

    @abstractmethod
    def call_get_version(self, change_id: str, min_supported: int, max_supported: int) -> int:
        """The version of ``change_id`` this run uses."""

    @abstractmethod
    def call_patched(self, patch_id: str) -> bool:
        """Whether this run was started by code declaring ``patch_id``."""

    @abstractmethod
    def call_continue_as_new(self, args: tuple[Any, ...]) -> NoReturn:
        """Close this run and start the next one with ``args``."""

    @abstractmethod
    def call_create_hook(self, name: str, metadata: Any, *, id: str | None) -> Hook:  # noqa: A002
        """Create a hook (its token is recorded)."""

    @abstractmethod
    def call_await_hook(self, hook: Hook, timeout: Seconds | None) -> Any:
        """Wait until ``hook`` is resumed and return its payload."""

    @abstractmethod
    def call_upsert_search_attributes(self, values: dict[str, Any], *, id: str | None) -> None:  # noqa: A002
        """Set (``None``: remove) search attributes of the run (recorded)."""

    @abstractmethod
    def call_upsert_memo(self, values: dict[str, Any], *, id: str | None) -> None:  # noqa: A002
        """Set (``None``: remove) memo keys of the run (recorded)."""

    @abstractmethod
    def now(self) -> datetime:
        """The workflow's deterministic current time (UTC)."""

    @abstractmethod
    def history_length(self) -> int:
        """Events in the run's history at this point of the code."""

    @abstractmethod
    def should_continue_as_new(self) -> bool:
        """Whether the run's history is near its budget at this point of the code."""

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """``workflow_id``, ``run_id`` and ``type`` of the running workflow."""


class WorkflowGreenlet(greenlet.greenlet):
    """A greenlet that runs workflow code on behalf of ``runtime``."""

    def __init__(self, runtime: WorkflowRuntime, run: Callable[..., Any], parent: greenlet.greenlet) -> None:
        super().__init__(run=run, parent=parent)
        self.runtime = runtime


_guard = threading.local()


@contextmanager
def forbid_durable_calls(what: str) -> Iterator[None]:
    """Refuse durable calls on this thread while user code ``what`` runs outside any branch.

    Signal handlers, queries and ``wait_until`` predicates run on the driver's
    own greenlet: a durable call there would have no branch to suspend.
    """
    previous = getattr(_guard, "callback", None)
    _guard.callback = what
    try:
        yield
    finally:
        _guard.callback = previous


def current_runtime() -> WorkflowRuntime:
    """The runtime of the workflow branch running on this greenlet.

    Raises:
        DurableError: outside a running workflow, inside a signal handler,
            query, ``wait_until`` predicate or side-effect function, or once
            the run or its runtime is closed.
    """
    callback = getattr(_guard, "callback", None)
    if callback is not None:
        raise DurableError(f"durable calls are not allowed inside a {callback}")
    g = greenlet.getcurrent()
    if isinstance(g, WorkflowGreenlet):
        g.runtime.check_call_allowed()
        return g.runtime
    raise DurableError(
        "durable workflow calls (activity, timer, await_signal, ...) can only be made inside "
        "Workflow.handle() while a worker runs it"
    )
