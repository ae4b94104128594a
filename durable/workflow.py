"""Workflow side of the public API: the ``Workflow`` base and its durable calls.

Every function here is meant to be called from inside ``Workflow.handle()``
(or from a branch of :func:`all`). Each one that waits suspends the calling
greenlet; the replay driver resumes it when the history says the step is done.
Called anywhere else, they raise :class:`durable.DurableError`.
"""

from __future__ import annotations

import builtins
import inspect
import random as _random
import uuid as _uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar, Unpack, overload

from .activity import activity_context
from .errors import ConfigurationError, DurableError, NondeterminismError
from .handlers import ActivityCallOptions, ChildCallOptions, Handles, query, signal, update
from .history_budget import (
    DEFAULT_HISTORY_BUDGET,
    NEAR_LIMIT,
    check_history_budget,
    effective_history_budget,
    near_history_limit,
)
from .limits import check_name_length, check_queue_name
from .options import ActivityOptions, ChildOptions, RetryPolicy, Seconds
from .registry import register_activity, register_workflow_class
from .retention import retention_ms
from .runtime import Hook, current_runtime

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: What ``get_version`` returns when replaying a history written before the change.
DEFAULT_VERSION = -1


class Workflow:
    """Base class for workflows: subclass it and write ``handle()``.

    ``handle()`` is plain straight-line code. Each durable call in it
    (:func:`activity`, :func:`timer`, :func:`await_signal`, ...) is recorded
    in the run's history; after a crash any worker replays that history and
    the code continues where it was. The code must therefore be
    deterministic: same history, same calls (see ``docs/determinism.md``).

    Class attributes:
        name: Durable type name (default: the class name). Must be unique.
        queue: Task queue its workflow tasks go to (default ``"default"``).
        patches: Patch ids this code declares; new runs record them and
            :func:`patched` answers from the run.
        history_budget: ``{"events": N, "bytes": M}`` (either key; defaults
            10,000 events and 10 MiB): the size past 80% of which
            :func:`should_continue_as_new` is true and a warning is logged.
        retention: How long a closed run of this type stays in Redis before the
            scheduler purges it: a ``timedelta``, seconds, or ``"30d"``; ``None``
            (default): the namespace's (``durable worker --retention``, else 3 days).
            Recorded in the run when it starts.
        block_on_errors: Exception types that, raised out of ``handle()`` or a ``@signal``
            handler, *block* the run instead of failing it (as a Temporal workflow task
            failure): e.g. ``(NameError, AttributeError)`` for the bugs of a bad deploy, or
            ``(Exception,)``. Errors of durable calls (any ``DurableError``) still fail it.
            Default ``()``: an uncaught error fails the run. After the fix is deployed,
            ``durable repair ID`` (or ``--blocked``) replays the run with the new code.

    Example:
        ```python
        class Order(Workflow):
            def handle(self, order_id: str) -> str:
                receipt = activity(Charge, order_id)
                timer(timedelta(hours=1))
                activity(Ship, order_id)
                return receipt
        ```
    """

    name: ClassVar[str] = ""
    queue: ClassVar[str] = "default"
    patches: ClassVar[tuple[str, ...]] = ()
    history_budget: ClassVar[dict[str, int]] = dict(DEFAULT_HISTORY_BUDGET)
    retention: ClassVar[timedelta | float | str | None] = None
    block_on_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    _signals: ClassVar[dict[str, str]] = {}
    _queries: ClassVar[dict[str, str]] = {}
    #: ``@update`` name -> (handler attribute, validator attribute or None).
    _updates: ClassVar[dict[str, tuple[str, str | None]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        signals: dict[str, str] = {}
        queries: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                if hasattr(value, "__durable_signal__"):
                    signals[value.__durable_signal__] = attr
                if hasattr(value, "__durable_query__"):
                    queries[value.__durable_query__] = attr
        cls._signals = signals
        cls._queries = queries
        cls._updates = _update_handlers(cls)
        check_queue_name(cls.queue, f"{cls.__name__}.queue")
        for name in (*signals, *queries, *cls._updates):
            check_name_length(name, f"{cls.__name__} signal/query")
        _check_synchronous(cls)
        check_history_budget(cls)  # a bad budget fails at class definition, not mid-run
        if cls.retention is not None:
            retention_ms(cls.retention, f"{cls.__name__}.retention")  # likewise a bad retention
        errors = cls.block_on_errors
        if not isinstance(errors, tuple) or not builtins.all(
            isinstance(e, type) and issubclass(e, BaseException) for e in errors
        ):
            raise ConfigurationError(
                f"{cls.__name__}.block_on_errors must be a tuple of exception classes, e.g. (NameError, AttributeError), not {errors!r}"
            )
        register_workflow_class(cls)

    def handle(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.handle() is not implemented")


def _check_synchronous(cls: type[Workflow]) -> None:
    """Workflow code is plain ``def``: an ``async def`` handler (Temporal's habit) returned a
    coroutine nobody awaited -- every signal to it was dropped, silently -- and a generator
    (Laravel's ``yield``) a generator; refused when the class is defined."""
    handlers = {"handle", *cls._signals.values(), *cls._queries.values()}
    handlers |= {a for pair in cls._updates.values() for a in pair if a is not None}
    for attr in sorted(handlers):
        fn = inspect.unwrap(getattr(cls, attr, None) or (lambda: None))
        kind = (
            "async def"
            if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
            else "a generator (it yields)"
            if inspect.isgeneratorfunction(fn)
            else ""
        )
        if kind:
            raise ConfigurationError(
                f"{cls.__name__}.{attr} is {kind}: workflow code is plain synchronous Python, whose "
                "durable calls (activity(), timer(), await_signal(), child()) suspend it until their "
                "result is there; write it as a plain def (an activity may be async def)"
            )


def _update_handlers(cls: type) -> dict[str, tuple[str, str | None]]:
    """``@update`` name -> (handler attribute, validator attribute) of a workflow class."""
    updates: dict[str, tuple[str, str | None]] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            if hasattr(value, "__durable_update__"):
                updates[value.__durable_update__] = (
                    attr,
                    getattr(value, "__durable_update_validator__", None),
                )
    return updates


# Typed for type checkers: the result is what the activity's ``handle`` (or function) returns,
# awaited for an ``async def`` one.
@overload
def activity(
    target: type[Handles[Coroutine[Any, Any, T]]], *args: Any, **options: Unpack[ActivityCallOptions]
) -> T: ...
@overload
def activity(target: type[Handles[T]], *args: Any, **options: Unpack[ActivityCallOptions]) -> T: ...
@overload
def activity(
    target: Callable[..., Coroutine[Any, Any, T]], *args: Any, **options: Unpack[ActivityCallOptions]
) -> T: ...
@overload
def activity(target: Callable[..., T], *args: Any, **options: Unpack[ActivityCallOptions]) -> T: ...
@overload
def activity(target: str, *args: Any, **options: Unpack[ActivityCallOptions]) -> Any: ...
def activity(
    target: Any,
    *args: Any,
    id: str | None = None,
    queue: str | None = None,
    retry: RetryPolicy | None = None,
    start_to_close_timeout: Seconds | None = None,
    schedule_to_close_timeout: Seconds | None = None,
    heartbeat_timeout: Seconds | None = None,
) -> Any:
    """Run an activity and return its result (suspends until it completes).

    Args:
        target: An ``Activity`` subclass, a function, or a registered name.
        *args: Arguments, encoded with the payload codec.
        id: A stable command id (must not start with a digit); default: the
            next number of the calling branch.
        queue, retry, start_to_close_timeout, schedule_to_close_timeout,
        heartbeat_timeout: Override the activity's class defaults.

    Raises:
        ActivityFailed: The activity failed for good; ``.cause`` is its error.
        SerializationError: An argument cannot be encoded.
    """
    options = ActivityOptions(
        id=id,
        queue=queue,
        retry=retry,
        start_to_close_timeout=start_to_close_timeout,
        schedule_to_close_timeout=schedule_to_close_timeout,
        heartbeat_timeout=heartbeat_timeout,
    )
    return current_runtime().call_activity(target, args, options)


def local_activity(
    target: Any,
    *args: Any,
    id: str | None = None,
    retry: RetryPolicy | None = None,
    start_to_close_timeout: Seconds | None = None,
) -> Any:
    """Run a short activity in the workflow worker's own process.

    Recorded in history like :func:`activity`, with the same retry semantics;
    it skips the activity queue, so use it for quick work only.
    """
    options = ActivityOptions(id=id, retry=retry, start_to_close_timeout=start_to_close_timeout, local=True)
    return current_runtime().call_activity(target, args, options)


def timer(duration: Seconds, *, id: str | None = None) -> None:
    """Sleep durably for ``duration`` (seconds or a timedelta). No worker is held meanwhile."""
    current_runtime().call_timer(duration, id=id)


def await_signal(name: str, timeout: Seconds | None = None, *, id: str | None = None) -> Any:
    """Wait for the signal ``name`` and return its payload.

    A signal sent with one argument returns that argument; with none,
    ``None``; with several, a tuple. Signals that arrived earlier (and have no
    ``@signal`` handler) are buffered and served first come, first served.

    Raises:
        SignalTimeout: ``timeout`` passed without the signal.
    """
    return current_runtime().call_await_signal(name, timeout, id=id)


def wait_until(
    predicate: Callable[[], bool], timeout: Seconds | None = None, *, id: str | None = None
) -> bool:
    """Wait until ``predicate()`` is true (re-checked after every applied event).

    Returns:
        True when the predicate became true, False when ``timeout`` passed first.
    """
    return current_runtime().call_wait_until(predicate, timeout, id=id)


def side_effect(fn: Callable[[], T], *, id: str | None = None) -> T:
    """Call ``fn`` once and record its value; replay returns the recorded value.

    The value goes through the codec both times, so live and replayed code see
    the same types. An exception from ``fn`` is recorded and re-raised on replay.
    Once per committed decision: a decision not committed (its worker killed) is made
    again, calling ``fn`` again, so ``fn`` must have no effect of its own.
    """
    return current_runtime().call_side_effect(fn, id=id)


@overload
def child(workflow: type[Handles[T]], *args: Any, **options: Unpack[ChildCallOptions]) -> T: ...
@overload
def child(workflow: str, *args: Any, **options: Unpack[ChildCallOptions]) -> Any: ...
def child(
    workflow: Any,
    *args: Any,
    id: str | None = None,
    workflow_id: str | None = None,
    queue: str | None = None,
    parent_close_policy: str = "terminate",
) -> Any:
    """Start a child workflow and return its result (suspends until it closes).

    Args:
        workflow: A ``Workflow`` subclass or its registered name.
        id: Command id in this run (default: the next number).
        workflow_id: The child's workflow id (default: ``<parent id>/<command id>``).
        parent_close_policy: What happens to the child if this run closes first (completes,
            fails, times out, continues as new or is terminated): ``terminate`` (default),
            ``request_cancel`` or ``abandon``; applied by messages the parent's closing write
            leaves, so through crashes and to every generation. Cancelling the parent is not
            closing it: while the parent waits on the child, a cancellation is passed on to the
            child (a cancel request), whatever the policy, and this call raises
            ``CancelledError`` once the child has closed, its own clean-up done (Temporal's
            default, ``WAIT_CANCELLATION_COMPLETED``): the parent does not close, and apply its
            policy, while the child still cleans up.

    Raises:
        ChildWorkflowFailed: The child failed, was cancelled or terminated.
        CancelledError: This run (or the ``all()`` branch waiting) was cancelled; raised once
            the child has closed.
    """
    options = ChildOptions(
        id=id, workflow_id=workflow_id, queue=queue, parent_close_policy=parent_close_policy
    )
    return current_runtime().call_child(workflow, args, options)


def all(branches: Sequence[Callable[[], Any]], *, id: str | None = None) -> list[Any]:  # noqa: A001
    """Run callables concurrently, each in its own branch, and return their results in input order.

    Fail-fast: when one branch raises, its unsettled siblings get
    :class:`CancelledError` at their suspension points (their cleanup may make
    durable calls), and once they have all finished the first error is raised here.
    """
    # A lone non-iterable (None raised a bare TypeError) is refused as not a list of callables.
    return current_runtime().call_all(list(branches) if isinstance(branches, Iterable) else [branches], id=id)


@dataclass(frozen=True)
class Settled:
    """One branch's outcome in :func:`all_settled`.

    Attributes:
        ok: The branch returned (``value``); false: it raised (``error``).
        value: What the branch returned.
        error: What the branch raised.
    """

    ok: bool
    value: Any = None
    error: Exception | None = None


def _settle(fn: Callable[[], Any]) -> Callable[[], Settled]:
    def run() -> Settled:
        try:
            return Settled(True, value=fn())
        except NondeterminismError:
            raise  # the code no longer matches its history: never an outcome to collect
        except Exception as exc:  # noqa: BLE001 - every failure is this branch's outcome
            return Settled(False, error=exc)

    return run


def all_settled(branches: Sequence[Callable[[], Any]], *, id: str | None = None) -> list[Settled]:  # noqa: A002
    """Run callables concurrently like :func:`all`, but without fail-fast: wait for every branch
    and return each one's outcome (:class:`Settled`), in input order.

    A branch that raises does not cancel its siblings; its exception is its ``error``.
    Cancelling the workflow still cancels every branch (``CancelledError`` is not an outcome),
    and the call raises :class:`CancelledError` once they have finished. Deterministic on replay
    as :func:`all` is: the same branches, the same command ids.

    Example:
        ```python
        outcomes = all_settled([lambda i=i: activity(Charge, i) for i in items])
        failed = [(i, o.error) for i, o in zip(items, outcomes) if not o.ok]
        ```
    """
    fns = list(branches) if isinstance(branches, Iterable) else [branches]  # as in all()
    if not builtins.all(callable(fn) for fn in fns):  # this module's all() shadows the builtin
        raise ConfigurationError("all_settled() takes a list of callables, e.g. [lambda: activity(A), ...]")
    return current_runtime().call_all([_settle(fn) for fn in fns], id=id)


def now() -> datetime:
    """The workflow's deterministic current time (UTC): the time stamp of the last applied event."""
    return current_runtime().now()


def uuid4() -> _uuid.UUID:
    """A random UUID, recorded once (a side effect)."""
    return side_effect(_uuid.uuid4)


def random() -> float:
    """A random float in [0, 1), recorded once (a side effect)."""
    return side_effect(_random.random)


def get_version(change_id: str, min_supported: int, max_supported: int) -> int:
    """Version a code change so that runs started before it keep deciding as they did.

    New runs record ``max_supported`` at first use; a run replaying a history
    written before the change gets :data:`DEFAULT_VERSION` (-1). Later calls
    with the same ``change_id`` return the same version. Does not consume a
    command number, so adding it to existing code keeps old ids stable.

    Raises:
        NondeterminismError: The recorded version is outside [min, max].
    """
    return current_runtime().call_get_version(change_id, min_supported, max_supported)


def patched(patch_id: str) -> bool:
    """Whether this run was started by code declaring ``patch_id`` in ``Workflow.patches``.

    The set is written into the run at start, so an old
    run keeps its old branch and a new run takes the new one, on any worker.
    """
    return current_runtime().call_patched(patch_id)


def continue_as_new(*args: Any) -> None:
    """Close this run and start a fresh one of the same workflow id with ``args``.

    Never returns. The new run keeps the type, queue, build id and patches.
    """
    current_runtime().call_continue_as_new(args)


def create_hook(name: str, metadata: Any = None, *, id: str | None = None) -> Hook:
    """Create a hook with an unguessable, single-use token.

    The token is derived from a secret (``DURABLE_HOOK_SECRET``, else the namespace's own),
    never stored: history records its digest, and replay derives the same token again. It
    lives as long as the wait on it: an ``await_hook`` timeout or the run closing voids it.
    """
    return current_runtime().call_create_hook(name, metadata, id=id)


def await_hook(hook: Hook, timeout: Seconds | None = None) -> Any:
    """Wait until the hook is resumed and return its payload.

    Raises:
        SignalTimeout: ``timeout`` passed first.
    """
    return current_runtime().call_await_hook(hook, timeout)


def upsert_search_attributes(values: dict[str, Any], *, id: str | None = None) -> None:  # noqa: A002
    """Set search attributes of this run (a ``None`` value removes one); recorded in history.

    Names must be declared (:class:`durable.SearchAttribute`) and values of their type; the
    index that ``durable list --where`` queries is updated when the decision commits.

    Example:
        ```python
        durable.upsert_search_attributes({"customer": "acme", "amount": 12.5})
        ```

    Raises:
        ConfigurationError: an undeclared name or a value of the wrong type (nothing recorded).
    """
    current_runtime().call_upsert_search_attributes(values, id=id)


def upsert_memo(values: dict[str, Any], *, id: str | None = None) -> None:  # noqa: A002
    """Set keys of this run's memo (a ``None`` value removes one); recorded in history.

    The memo is not indexed: ``describe`` and ``durable list --json`` show it.

    Raises:
        SerializationError: a value the codec cannot encode (nothing recorded).
    """
    current_runtime().call_upsert_memo(values, id=id)


class WorkerSession:
    """Activities pinned to one worker (files on its disk, a GPU): see :func:`worker_session`."""

    def __init__(self, queue: str | None) -> None:
        self._queue = queue
        self.host_queue = ""

    def __enter__(self) -> WorkerSession:
        # Any worker serving the queue runs the opening activity and answers with its
        # private queue: that worker is the session's host from now on.
        self.host_queue = activity(SESSION_OPEN, queue=self._queue, retry=RetryPolicy(max_attempts=1))
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def activity(self, target: Any, *args: Any, **options: Any) -> Any:
        """Like :func:`activity`, on the session's host worker.

        Raises:
            ActivityFailed: with ``cause`` a :class:`SessionLost` when the host
                worker stopped: handle it, e.g. by opening a new session.
        """
        if not self.host_queue:
            raise DurableError("use the session inside `with worker_session() as s:`")
        return activity(target, *args, queue=self.host_queue, **options)


def worker_session(queue: str | None = None) -> WorkerSession:
    """Pin a sequence of activities to one worker.

    Example:
        ```python
        with worker_session() as s:
            path = s.activity(download, url)      # on the host worker's disk
            s.activity(transcode, path)           # same worker
        ```

    The host is the worker that runs the session's opening activity (on
    ``queue``, default the workflow's). It holds a lease while it lives; if it
    dies, the session's next activity fails with ``SessionLost`` as cause.
    """
    return WorkerSession(queue)


SESSION_OPEN = "durable.session.open"


def _session_open() -> str:
    queue = activity_context().session_queue
    if not queue:
        raise DurableError("this worker cannot host worker sessions")
    return queue


def history_length() -> int:
    """Number of events in this run's history so far (for continue-as-new decisions)."""
    return current_runtime().history_length()


def should_continue_as_new() -> bool:
    """Whether this run's history is near its budget, so it should :func:`continue_as_new`.

    True once the history (at this point of the code) has passed 80% of either
    threshold of the class's ``history_budget``: ``events`` (default 10,000) or
    ``bytes`` of stored entries (default 10 MiB). Deterministic: replay answers
    what the live call answered. Typical use, at a safe point of a long loop:

        ```python
        class Poller(Workflow):
            history_budget = {"events": 2_000}

            def handle(self, cursor: int) -> None:
                while True:
                    cursor = activity(poll, cursor)
                    if should_continue_as_new():
                        continue_as_new(cursor)
        ```
    """
    return current_runtime().should_continue_as_new()


def workflow_info() -> dict[str, Any]:
    """Identity of the running workflow: ``workflow_id``, ``run_id``, ``type``."""
    return current_runtime().info()


class ContinueAsNew(BaseException):  # noqa: N818 - a control-flow signal, not an error
    """Raised by :func:`continue_as_new`; the driver turns it into the run's closing."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        super().__init__("continue_as_new")
        self.args_ = args


__all__ = [
    "DEFAULT_HISTORY_BUDGET",
    "DEFAULT_VERSION",
    "NEAR_LIMIT",
    "SESSION_OPEN",
    "ContinueAsNew",
    "Hook",
    "WorkerSession",
    "Workflow",
    "activity",
    "all",
    "await_hook",
    "await_signal",
    "child",
    "continue_as_new",
    "create_hook",
    "effective_history_budget",
    "get_version",
    "history_length",
    "local_activity",
    "near_history_limit",
    "now",
    "patched",
    "query",
    "random",
    "should_continue_as_new",
    "side_effect",
    "signal",
    "timer",
    "update",
    "uuid4",
    "wait_until",
    "worker_session",
    "workflow_info",
]

# The activity that opens a worker session exists in every process that imports durable.
register_activity(_session_open, name=SESSION_OPEN)
