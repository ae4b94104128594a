"""Interceptors: middleware around durable's calls, in the client, in workflow code and in activities.

An interceptor is an object with some of the methods below; each takes an input record
and ``next``, the rest of the chain, and returns what ``next(input)`` returns (or raises).
It may read or change the input (mostly its ``headers``), act before and after, or
wrap the call (a span, a timer, a log context)::

    class Tenant(durable.interceptors.Interceptor):
        def start_workflow(self, input, next):
            input.headers["tenant"] = current_tenant()
            return next(input)

        def execute_activity(self, input, next):
            with tenant_context(input.headers.get("tenant")):
                return next(input)

    durable.interceptors.register(Tenant())

The registry is process-wide: register in the module your ``durable worker --app`` imports
(and in the client's process); the first registered is the outermost. Four kinds:

* :class:`ClientInterceptor` -- :meth:`~ClientInterceptor.start_workflow` (``start`` and
  ``signal_with_start``), :meth:`~ClientInterceptor.signal_workflow`,
  :meth:`~ClientInterceptor.query_workflow`, :meth:`~ClientInterceptor.update_workflow`.
* :class:`WorkflowInboundInterceptor` -- calls into workflow code: ``handle``, a signal,
  a query, an update's validator and handler, and each live decision
  (:meth:`~WorkflowInboundInterceptor.decide`).
* :class:`WorkflowOutboundInterceptor` -- calls workflow code makes: an activity, a child
  workflow, a timer.
* :class:`ActivityInboundInterceptor` -- one activity attempt.

**Headers** (``{name: str | bytes}``) travel with the run: the client's start headers are
recorded in ``WorkflowStarted`` (so they survive restarts and continue-as-new), a signal's in
its ``SignalReceived``, an update's in its ``UpdateRequested`` and ``UpdateAccepted``; the
headers of an activity or child call start as a copy of the run's (in an update handler: the
run's updated with the update's) and are recorded in ``ActivityScheduled`` / ``ChildStarted``;
an activity attempt sees its call's headers. So a header set by a client interceptor reaches
every activity of the run (and its children) with no workflow interceptor at all.

**Determinism.** Workflow interceptors run inside workflow code, again on every replay. They
must not change what the code decides: no I/O, clocks or randomness that alter ``args``,
``options`` or whether ``next`` is called; an exception they raise is the workflow's. They
may change ``headers`` freely (headers are recorded, never compared: a replay uses the
recorded ones), and may have side effects outside the run (a span, a metric, a log line)
when ``input.replaying`` is false: replay then does not repeat them. See docs/interceptors.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

Headers = dict[str, Any]
"""Interceptor headers: ``{name: str | bytes}`` (msgpack-encoded with the event or task)."""

Next = Callable[[Any], Any]


# ----------------------------------------------------------------- client side
@dataclass(slots=True)
class StartWorkflowInput:
    """``WorkflowStub.start`` / ``signal_with_start``. ``next`` returns the run id."""

    workflow_type: str
    workflow_id: str
    args: tuple[Any, ...]
    headers: Headers = field(default_factory=dict)
    #: signal_with_start: the signal's name and args (its SignalReceived gets ``headers`` too).
    signal: str | None = None
    signal_args: tuple[Any, ...] = ()


@dataclass(slots=True)
class SignalWorkflowInput:
    """``WorkflowStub.signal``: ``headers`` are recorded in the run's SignalReceived."""

    workflow_id: str
    name: str
    args: tuple[Any, ...]
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class UpdateWorkflowInput:
    """``WorkflowStub.update`` (sync and async): ``headers`` are recorded with the update.

    ``next`` delivers the update and returns the delivery (return it unchanged); the wait for
    the update's outcome comes after the chain, so the async client can await it.
    """

    workflow_id: str
    name: str
    args: tuple[Any, ...]
    update_id: str
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class QueryWorkflowInput:
    """``WorkflowStub.query`` (answered in this process: ``headers`` reach ``handle_query``)."""

    workflow_id: str
    name: str
    args: tuple[Any, ...]
    headers: Headers = field(default_factory=dict)


# ---------------------------------------------------------------- workflow side
@dataclass(frozen=True, slots=True)
class RunInfo:
    """The run a workflow interceptor is called for, and the headers it was started with."""

    workflow_id: str
    run_id: str
    workflow_type: str
    headers: Mapping[str, Any]


@dataclass(slots=True)
class HandleInput:
    """The call of the workflow's ``handle`` (``next`` runs the whole workflow function)."""

    run: RunInfo
    args: tuple[Any, ...]
    replaying: bool


@dataclass(slots=True)
class HandleSignalInput:
    """A signal applied to the run (``payload``: its encoded args; ``headers``: the sender's)."""

    run: RunInfo
    name: str
    payload: bytes
    headers: Mapping[str, Any]
    replaying: bool


@dataclass(slots=True)
class HandleQueryInput:
    """A ``@query`` method call (never recorded; ``headers``: the client's query headers)."""

    run: RunInfo
    name: str
    args: tuple[Any, ...]
    headers: Mapping[str, Any]


@dataclass(slots=True)
class HandleUpdateInput:
    """An ``@update``'s validator (live only) or its accepted handler (``next`` runs it; it may
    suspend). ``headers``: the sender's, as recorded with the update; in ``handle_update`` the
    handler's activity and child calls start from the run's headers updated with these (as the
    interceptors leave them)."""

    run: RunInfo
    update_id: str
    name: str
    args: tuple[Any, ...]
    replaying: bool
    headers: Headers = field(default_factory=dict)


@dataclass(slots=True)
class DecisionInput:
    """One live decision: ``inbox`` are the new inputs; ``next`` returns the Decision to commit.

    Called only for decisions (never for a replay of recorded history), outside workflow code.
    """

    run: RunInfo
    inbox: Sequence[Any]


@dataclass(slots=True)
class StartActivityInput:
    """``activity(...)``: ``name`` is the activity type; ``headers`` start as the run's."""

    run: RunInfo
    target: Any
    name: str
    args: tuple[Any, ...]
    options: Any
    headers: Headers
    replaying: bool


@dataclass(slots=True)
class StartChildInput:
    """``child(...)``: ``headers`` start as the run's and become the child run's headers."""

    run: RunInfo
    workflow: Any
    workflow_type: str
    args: tuple[Any, ...]
    options: Any
    headers: Headers
    replaying: bool


@dataclass(slots=True)
class StartTimerInput:
    """``timer(...)``."""

    run: RunInfo
    duration: Any
    id: str | None
    replaying: bool


# ---------------------------------------------------------------- activity side
@dataclass(slots=True)
class ExecuteActivityInput:
    """One activity attempt (``next`` runs the activity function with ``args``)."""

    name: str
    activity_id: str
    attempt: int
    workflow_id: str
    run_id: str
    args: tuple[Any, ...]
    headers: Mapping[str, Any]
    #: Seconds the attempt may run (``None``: no limit); one that returns later was timed out.
    start_to_close_timeout: float | None = None


# ----------------------------------------------------------------- base classes
class ClientInterceptor:
    """Client outbound calls. Override what you need; each must return ``next(input)``'s value."""

    def start_workflow(self, input: StartWorkflowInput, next: Next) -> Any:  # noqa: A002
        """Around a start (returns the run id)."""
        return next(input)

    def signal_workflow(self, input: SignalWorkflowInput, next: Next) -> Any:  # noqa: A002
        """Around sending a signal."""
        return next(input)

    def query_workflow(self, input: QueryWorkflowInput, next: Next) -> Any:  # noqa: A002
        """Around a query (returns its result)."""
        return next(input)

    def update_workflow(self, input: UpdateWorkflowInput, next: Next) -> Any:  # noqa: A002
        """Around delivering an update (returns the delivery; the outcome is awaited after)."""
        return next(input)


class WorkflowInboundInterceptor:
    """Calls into workflow code. Runs in workflow code: see the determinism rules above."""

    def handle(self, input: HandleInput, next: Next) -> Any:  # noqa: A002
        """Around the workflow function."""
        return next(input)

    def handle_signal(self, input: HandleSignalInput, next: Next) -> Any:  # noqa: A002
        """Around applying a signal (a ``@signal`` handler, a waiter, or the buffer)."""
        return next(input)

    def handle_query(self, input: HandleQueryInput, next: Next) -> Any:  # noqa: A002
        """Around a ``@query`` method."""
        return next(input)

    def validate_update(self, input: HandleUpdateInput, next: Next) -> Any:  # noqa: A002
        """Around an update's admission, live only (``next`` runs its validator, if it has one);
        raising rejects the update."""
        return next(input)

    def handle_update(self, input: HandleUpdateInput, next: Next) -> Any:  # noqa: A002
        """Around an ``@update`` handler."""
        return next(input)

    def decide(self, input: DecisionInput, next: Next) -> Any:  # noqa: A002
        """Around one live decision (returns the Decision)."""
        return next(input)


class WorkflowOutboundInterceptor:
    """Calls workflow code makes. Runs in workflow code: see the determinism rules above."""

    def start_activity(self, input: StartActivityInput, next: Next) -> Any:  # noqa: A002
        """Around ``activity()`` (returns the activity's result, after the run waited for it)."""
        return next(input)

    def start_child(self, input: StartChildInput, next: Next) -> Any:  # noqa: A002
        """Around ``child()`` (returns the child's result)."""
        return next(input)

    def start_timer(self, input: StartTimerInput, next: Next) -> Any:  # noqa: A002
        """Around ``timer()``."""
        return next(input)


class ActivityInboundInterceptor:
    """One activity attempt, in the worker's activity thread (ordinary code: anything goes)."""

    def execute_activity(self, input: ExecuteActivityInput, next: Next) -> Any:  # noqa: A002
        """Around the activity function (returns its result; what it raises fails the attempt)."""
        return next(input)


class Interceptor(
    ClientInterceptor, WorkflowInboundInterceptor, WorkflowOutboundInterceptor, ActivityInboundInterceptor
):
    """All four kinds in one base: override any of their methods."""


# --------------------------------------------------------------------- registry
_KINDS = (
    ClientInterceptor,
    WorkflowInboundInterceptor,
    WorkflowOutboundInterceptor,
    ActivityInboundInterceptor,
)
_registered: list[object] = []
_chains: dict[type, tuple[Any, ...]] = {kind: () for kind in _KINDS}
# Per (kind, method): only the interceptors that override it. A hook nobody overrides is a
# pass-through, so its callers skip building its input at all (tracing defines no start_activity).
_method_chains: dict[tuple[type, str], tuple[Any, ...]] = {}


def _rebuild() -> None:
    global _method_chains
    method_chains: dict[tuple[type, str], tuple[Any, ...]] = {}
    for kind in _KINDS:
        chain = tuple(i for i in _registered if isinstance(i, kind))
        for method in (name for name in vars(kind) if not name.startswith("_")):
            base = getattr(kind, method)
            method_chains[kind, method] = tuple(
                i for i in chain if getattr(type(i), method, base) is not base
            )
        _chains[kind] = chain
    _method_chains = method_chains  # swapped whole: a concurrent run() sees the old or the new


def register(*interceptors: object) -> None:
    """Add interceptors to this process's chains (after those registered before: inner).

    Raises:
        TypeError: an object that is none of the four interceptor kinds.
    """
    for interceptor in interceptors:
        if not isinstance(interceptor, _KINDS):
            raise TypeError(
                f"{type(interceptor).__name__} is not an interceptor: subclass "
                "durable.interceptors.Interceptor (or one of its four kinds)"
            )
    _registered.extend(interceptors)
    _rebuild()


def unregister(interceptor: object) -> None:
    """Remove an interceptor registered before (no error when it is not registered)."""
    if interceptor in _registered:
        _registered.remove(interceptor)
        _rebuild()


def registered() -> tuple[object, ...]:
    """The registered interceptors, outermost first."""
    return tuple(_registered)


@contextmanager
def installed(*interceptors: object) -> Iterator[None]:
    """Register ``interceptors`` for the ``with`` block (tests, scripts)."""
    register(*interceptors)
    try:
        yield
    finally:
        for interceptor in interceptors:
            unregister(interceptor)


def run(kind: type, method: str, input: Any, terminal: Next) -> Any:  # noqa: A002
    """Call ``method`` of every registered interceptor of ``kind`` around ``terminal(input)``."""
    chain = _method_chains.get((kind, method), ())
    if not chain:
        return terminal(input)
    return _call(chain, method, terminal, 0, input)


def _call(chain: tuple[Any, ...], method: str, terminal: Next, index: int, value: Any) -> Any:
    # ``next`` is a partial, not a closure over a function that names itself: that was a
    # reference cycle per call, garbage only the cyclic GC frees (with its input).
    if index == len(chain):
        return terminal(value)
    return getattr(chain[index], method)(value, partial(_call, chain, method, terminal, index + 1))


def active(kind: type, method: str | None = None) -> bool:
    """True when an interceptor of ``kind`` is registered (callers skip building inputs if not);
    with ``method``, one that overrides that method."""
    return bool(_chains[kind] if method is None else _method_chains.get((kind, method)))


def execute(task: Any, fn: Callable[..., Any], args: Sequence[Any]) -> Any:
    """Run one attempt of an activity task's function through the activity interceptors."""
    if not _chains[ActivityInboundInterceptor]:
        return fn(*args)
    request = ExecuteActivityInput(
        task.name,
        task.activity_id,
        task.attempt,
        task.workflow_id,
        task.run_id,
        tuple(args),
        task.headers or {},
        task.timeout("start_to_close"),
    )
    return run(ActivityInboundInterceptor, "execute_activity", request, lambda i: fn(*i.args))
