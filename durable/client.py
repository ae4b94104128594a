"""The client side: :class:`WorkflowStub` starts, signals, queries and awaits runs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Self, TypeVar, overload

import redis

from . import codec, interceptors
from . import events as ev
from .client_updates import send_update, signal_event
from .default_store import default_store
from .errors import (
    ConfigurationError,
    WorkflowClosed,
    WorkflowNotFound,
)
from .handlers import Handles
from .ids import check_workflow_id, new_run_id
from .interceptors import ClientInterceptor, QueryWorkflowInput, SignalWorkflowInput, StartWorkflowInput
from .limits import check_name_length, check_queue_name, cut_reason
from .options import Seconds, wait_seconds
from .registry import check_name, start_patches, start_queue
from .replay.driver import query_history
from .run_views import describe_run, run_snapshot
from .runinfo import (
    BlockedReason,
    HistoryEvent,
    RunDescription,
    closing_error,
)
from .search import start_attributes
from .start_policy import DEFAULT as DEFAULT_POLICY
from .start_policy import StartPolicy
from .store.key_types import is_wrong_type
from .store.redis_store import RedisStore, RunRef
from .store.starts import Closing
from .store.updates import update_result, wait_update
from .store.waits import RunMoved, wait_closing
from .time_limit import QUERY_TIMEOUT, query_overrun, run_limited
from .typed_args import check_call
from .waiting import not_closed
from .workflow import Workflow


def _terminate_children(store: RedisStore, close: Closing | None) -> None:
    """Terminate the ``terminate``-policy children of a run closed from outside its code, at
    once: its closing script's messages would, but only once a worker reads them (they then find
    the children closed: a no-op)."""
    if close is None:
        return
    for wid in close.to_terminate:
        with contextlib.suppress(WorkflowClosed, WorkflowNotFound):
            WorkflowStub(store, "", wid).terminate(close.reason)


R = TypeVar("R")
T = TypeVar("T")


class WorkflowStub(Generic[R]):
    """A handle on one workflow instance (its id), used from ordinary code.

    ``WorkflowStub.make(Order)`` is typed ``WorkflowStub[T]`` where ``T`` is the return
    annotation of ``Order.handle``, so a type checker knows what ``result()`` returns; a
    stub made from a type name or loaded by id is ``WorkflowStub[Any]``.

    Every call rides out a short Redis outage (a restart, a failover): it is tried again for up
    to the store's ``client_ride_s`` (10 s; a ``result()`` or ``update()`` wait under way, 60 s),
    then raises :class:`~durable.errors.RedisUnavailable`. A call resent because its reply was
    lost is not done twice (a start finds its run, a signal its earlier delivery).

    Example:
        ```python
        stub = WorkflowStub.make(OrderWorkflow, id="order-42")
        stub.start("order-42", 1999)
        stub.signal("approve", "alice")
        print(stub.result(timeout=30))
        ```
    """

    def __init__(
        self,
        store: RedisStore | None,
        workflow_type: str,
        workflow_id: str,
        run_id: str | None = None,
        queue: str | None = None,
    ) -> None:
        self._opened = store  # None: the process's default store, opened at the first call
        self._type = workflow_type
        self._id = workflow_id
        self._run_id = run_id
        self._queue = queue
        self._policy = DEFAULT_POLICY
        self._search: dict[str, Any] = {}  # initial search attributes, encoded (make)
        self._memo: bytes | None = None  # initial memo payload (make)
        self._code: type[Workflow] | None = None  # the class it was made from: start() checks args

    # ------------------------------------------------------------- creation
    @overload
    @classmethod
    def make(
        cls,
        workflow: type[Handles[T]],
        id: str | None = None,
        *,
        queue: str | None = None,
        store: RedisStore | None = None,
        id_reuse_policy: str = "allow_duplicate",
        id_conflict_policy: str | None = None,
        execution_timeout: Seconds | str | None = None,
        run_timeout: Seconds | str | None = None,
        search_attributes: dict[str, Any] | None = None,
        memo: dict[str, Any] | None = None,
    ) -> WorkflowStub[T]: ...  # noqa: A002

    @overload
    @classmethod
    def make(
        cls,
        workflow: str,
        id: str | None = None,
        *,
        queue: str | None = None,
        store: RedisStore | None = None,
        id_reuse_policy: str = "allow_duplicate",
        id_conflict_policy: str | None = None,
        execution_timeout: Seconds | str | None = None,
        run_timeout: Seconds | str | None = None,
        search_attributes: dict[str, Any] | None = None,
        memo: dict[str, Any] | None = None,
    ) -> WorkflowStub[Any]: ...  # noqa: A002

    @classmethod
    def make(
        cls,
        workflow: type[Workflow] | type[Handles[Any]] | str,
        id: str | None = None,
        *,
        queue: str | None = None,
        store: RedisStore | None = None,
        id_reuse_policy: str = "allow_duplicate",
        id_conflict_policy: str | None = None,
        execution_timeout: Seconds | str | None = None,
        run_timeout: Seconds | str | None = None,
        search_attributes: dict[str, Any] | None = None,
        memo: dict[str, Any] | None = None,
    ) -> WorkflowStub[Any]:  # noqa: A002
        """A stub for a new workflow instance (nothing is written until :meth:`start`).

        Args:
            workflow: A ``Workflow`` subclass or its registered name.
            id: The workflow id (1-256 printable characters); default: a new unique id.
            queue: Task queue (default: the class's ``queue``).
            id_reuse_policy: When the id's last run is closed: ``allow_duplicate`` (start),
                ``allow_duplicate_failed_only`` (start unless it completed) or
                ``reject_duplicate`` (:class:`WorkflowAlreadyStarted`).
            id_conflict_policy: When the id has an open run: ``fail``
                (:class:`WorkflowAlreadyStarted`; the default of :meth:`start`),
                ``use_existing`` (the stub takes that run; the default of
                :meth:`signal_with_start`) or ``terminate_existing`` (terminate it, then start).
            execution_timeout: The id's runs together (across continue-as-new) must close
                within it; seconds, a timedelta or a duration like ``"1h"``.
            run_timeout: Each run must close within it of its own start. A run past either
                timeout closes as ``failed`` with a :class:`~durable.errors.WorkflowTimeout`
                cause (see :mod:`durable.start_policy`).

            search_attributes: Initial search attributes of the runs :meth:`start` starts
                (declared names, values of their type; see :class:`durable.SearchAttribute`).
            memo: Initial memo (any encodable values; shown by ``describe``, not indexed).

        Raises:
            ConfigurationError: bad id, not a workflow, an unknown policy (the message lists
                the valid ones), a timeout that is not a positive duration, an undeclared
                search attribute or one of the wrong type.
            SerializationError: a memo value the codec cannot encode.
        """
        if isinstance(workflow, str):
            type_name = check_name(workflow, "workflow")
            default_queue = None
        elif isinstance(workflow, type) and issubclass(workflow, Workflow):
            type_name, default_queue = workflow.name, workflow.queue
        else:
            raise ConfigurationError(
                f"WorkflowStub.make needs a Workflow subclass or its name, not {workflow!r}"
            )
        workflow_id = (
            check_workflow_id(id, new=True) if id is not None else f"{type_name}-{new_run_id().lower()}"
        )
        if queue is not None:
            check_queue_name(queue)
        if search_attributes:  # their types are the namespace's: read now
            store = store or default_store()
        search = start_attributes(search_attributes, store.search_types if store is not None else dict)
        if memo is not None and not isinstance(memo, dict):
            raise ConfigurationError(f"memo must be a dict, not {type(memo).__name__}")
        memo_payload = codec.dumps(memo, path="memo") if memo else None
        policy = StartPolicy.of(
            id_reuse_policy=id_reuse_policy,
            id_conflict_policy=id_conflict_policy,
            execution_timeout=execution_timeout,
            run_timeout=run_timeout,
        )
        stub = cls(store, type_name, workflow_id, None, queue or default_queue)
        stub._policy = policy
        stub._search, stub._memo = search, memo_payload
        stub._code = workflow if isinstance(workflow, type) else None
        return stub

    @classmethod
    def from_stub(cls, stub: WorkflowStub[Any]) -> Self:
        """A stub of this class for the same workflow, run, queue, store and start policy as ``stub``."""
        copy = cls(stub._opened, stub._type, stub._id, stub._run_id, stub._queue)
        copy._policy = stub._policy
        copy._search, copy._memo = stub._search, stub._memo
        copy._code = stub._code
        return copy

    @classmethod
    def load(cls, id: str, *, store: RedisStore | None = None) -> WorkflowStub[Any]:  # noqa: A002
        """A stub for an existing workflow id (its current run).

        Raises:
            WorkflowNotFound: no workflow with that id.
        """
        store = store or default_store()
        ref = store.ref(id)
        record = store.run_record(ref)
        return cls(store, record.get("type", ""), id, ref.run_id, record.get("queue"))

    @staticmethod
    def resume_hook(token: str, payload: Any = None, *, store: RedisStore | None = None) -> None:
        """Deliver ``payload`` to the hook with this token (single use).

        One script finds the hook's run, uses the token up and pushes the payload onto the
        run's inbox: nothing can use the token without delivering. The call rides out a short
        Redis outage; resent after its reply was lost, it finds its own delivery.

        Raises:
            HookError: unknown, used or expired token (the message never repeats it).
            WorkflowClosed: the hook's run is closed.
        """
        store = store or default_store()
        data = codec.dumps((payload,), path="payload", allowed_only=True)
        # One script resolves, uses up and delivers: a crash cannot burn the token alone. The
        # delivery id makes a resend (its reply lost in an outage) find its delivery.
        delivery = new_run_id()
        store.ride("resume_hook()", lambda: store.resume_hook(token, data, delivery_id=delivery))

    # ------------------------------------------------------------ identity
    @property
    def id(self) -> str:
        """The workflow id (instance id)."""
        return self._id

    @property
    def workflow_type(self) -> str:
        """The workflow type name (empty for a stub loaded from a run without a record of it)."""
        return self._type

    @property
    def queue(self) -> str | None:
        """The task queue given for new runs (``None``: the workflow class's)."""
        return self._queue

    @property
    def store(self) -> RedisStore:
        """The store this stub talks to (the default one is opened by the first call needing it)."""
        return self._store

    @property
    def _store(self) -> RedisStore:
        if self._opened is None:
            self._opened = default_store()
        return self._opened

    @property
    def run_id(self) -> str | None:
        """The id of the run this stub last reached: its :meth:`start`'s, or the current run's as
        of its last call (a stub addresses its workflow id: a later start of the id is a newer
        run, which its next call reaches); ``None`` before any."""
        if self._run_id is None:
            with contextlib.suppress(WorkflowNotFound):
                self._run_id = self._store.ref(self._id).run_id
        return self._run_id

    def _ref(self) -> RunRef:
        ref = self._store.ref(self._id)
        self._run_id = ref.run_id
        return ref

    def _ride(self, what: str, call: Callable[[], T], **options: Any) -> T:
        """:meth:`RedisStore.ride`, a key of this workflow holding another kind of value (made by
        hand, another program sharing the database) said by name, not as a bare ``WRONGTYPE``."""
        try:
            return self._store.ride(what, call, **options)
        except redis.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            raise self._store.cannot_write(what, self._id, exc) from None

    def _read(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, reading this workflow, through a short Redis outage (:meth:`RedisStore.ride`)."""
        return self._ride(f"{what} of workflow {self._id!r}", call)

    def _run_ref(self, run_id: str | None) -> RunRef:
        """The current run, or the given run of this workflow (the stub keeps the current one)."""
        return self._store.ref(self._id, run_id) if run_id else self._ref()

    def _at_run(self, run_id: str) -> RunRef:
        """``run_id`` of this stub's workflow, from now on the run the stub knows (unchecked)."""
        self._run_id = run_id
        return RunRef(self._store.keys.partition(self._id), run_id, self._id)

    # ------------------------------------------------------------- actions
    def start(self, *args: Any) -> Self:
        """Start a run with ``args`` and return this stub.

        The stub's id policies apply (:meth:`make`): with ``id_conflict_policy='use_existing'``
        an open run of the id becomes the stub's run and nothing is started.

        Raises:
            ConfigurationError: the stub was made from the workflow's class and its ``handle``
                does not take ``args`` (too many, too few: the message shows its signature).
            SerializationError: an argument cannot be encoded, or does not validate against
                ``handle``'s pydantic annotation (the field named). Nothing is written.
            WorkflowAlreadyStarted: the id has an open run (``fail``), or a closed one its
                ``id_reuse_policy`` does not start again.
        """
        request = StartWorkflowInput(self._type, self._id, tuple(args))
        interceptors.run(ClientInterceptor, "start_workflow", request, self._start_run)
        return self

    def signal_with_start(self, name: str, *args: Any, start_args: Sequence[Any] = ()) -> Self:
        """Send signal ``name`` with ``args``, starting a run with ``start_args`` first if the id
        has no open run; one script does both, so two clients racing start one run and both
        signals reach it. Returns this stub (its :attr:`run_id` is the run that got the signal).

        The id conflict policy is ``use_existing`` unless the stub was made with
        ``terminate_existing``; a closed id follows the stub's ``id_reuse_policy``.

        Raises:
            ConfigurationError: a bad signal name, or ``id_conflict_policy='fail'``.
            SerializationError: an argument cannot be encoded (nothing written).
            WorkflowAlreadyStarted: the id is closed and its ``id_reuse_policy`` forbids a run.
            LimitExceeded: the open run has ``max_pending_signals`` inputs waiting or
                ``max_history_events`` events (see :mod:`durable.limits`). Nothing is written.
        """
        if not isinstance(name, str) or not name:
            raise ConfigurationError("signal name must be a non-empty string")
        check_name_length(name, "signal")
        request = StartWorkflowInput(self._type, self._id, tuple(start_args), {}, name, tuple(args))
        interceptors.run(ClientInterceptor, "start_workflow", request, self._start_run)
        return self

    def _start_run(self, request: StartWorkflowInput) -> str:
        signal = (
            signal_event(request.signal, request.signal_args, request.headers, self._code or self._type)
            if request.signal
            else None
        )
        where = "args" if signal is None else "start_args"
        payload = codec.dumps(tuple(request.args), path=where, allowed_only=True)
        if self._code is not None:  # made from the class: a call its handle refuses is refused now
            what = f"start() of workflow {self._id!r}: {self._code.__name__}.handle"
            check_call(self._code.handle, tuple(request.args), what, skip=1)
        queue = start_queue(self._type, self._queue)
        patches = start_patches(self._type, queue, self._store)
        run_id = new_run_id()  # one id for every try: a resend of a start that landed finds its run
        run = self._ride(
            f"start() of workflow {self._id!r}",
            lambda: self._store.start(
                workflow_type=self._type,
                workflow_id=self._id,
                run_id=run_id,
                args=payload,
                queue=queue,
                patches=patches,
                policy=self._policy,
                signal=signal,
                search_attributes=self._search,
                memo=self._memo,
                headers=request.headers,
            ),
            writes=self._id,
        )
        self._run_id = run.run_id
        # terminate_existing: the replaced run's 'terminate' children are closed now, not when a
        # worker reads the script's messages (as terminate() does).
        _terminate_children(self._store, run.closing)
        return run.run_id

    def signal(self, name: str, *args: Any) -> None:
        """Send signal ``name`` with ``args`` to the current run.

        Raises:
            WorkflowNotFound: unknown id.
            WorkflowClosed: the run is closed (signals are never silently dropped).
            ConfigurationError, SerializationError: its @signal handler refuses ``args`` (checked here when this process has the class).
            LimitExceeded: the name is longer than ``max_name_length``, the payload larger
                than ``max_payload_bytes`` (``PayloadTooLarge``), or the run already has
                ``max_pending_signals`` inputs waiting or ``max_history_events`` events
                (see :mod:`durable.limits`). Nothing is written.
        """
        if not isinstance(name, str) or not name:
            raise ConfigurationError("signal name must be a non-empty string")
        check_name_length(name, "signal")
        request = SignalWorkflowInput(self._id, name, tuple(args))
        interceptors.run(ClientInterceptor, "signal_workflow", request, self._send_signal)

    def _send_signal(self, request: SignalWorkflowInput) -> None:
        signal = signal_event(request.name, request.args, request.headers, self._code or self._type)
        what = f"signal({request.name!r}) of workflow {request.workflow_id!r}"
        deliver = lambda: self._store.deliver(request.workflow_id, signal, limited=True)  # noqa: E731
        self._ride(what, deliver, writes=request.workflow_id)

    def update(
        self, name: str, *args: Any, timeout: float | None = None, update_id: str | None = None
    ) -> Any:
        """Run the ``@update`` handler ``name`` with ``args`` in the current run; return its result.

        The run's validator (if any) accepts or rejects the update before anything the
        workflow sees is written; an accepted update is recorded in history and its
        handler (which may call activities, timers, ...) runs in its own branch. The client
        interceptors' ``update_workflow`` runs around the delivery (its headers are recorded
        with the update and reach the validator, the handler and its activities).
        ``update_id`` makes a retried call exactly-once: a second call with the same id
        runs nothing and returns (or raises) what the first one did. See docs/updates.md.

        Args:
            name: The ``@update`` method's name.
            timeout: Seconds to wait for the outcome (``None`` or ``math.inf``: no limit). The
                update stays delivered: call again with the same ``update_id`` to keep waiting.
            update_id: The update's id (letters, digits, ``_ . : - /``; not starting with
                a digit). Default: a new unique id.

        Raises:
            UpdateRejected: the validator raised (``.cause``), the workflow has no such
                ``@update``, or the arguments cannot be decoded.
            Exception: whatever the handler raised, as it raised it.
            WorkflowNotFound: unknown id.
            WorkflowClosed: the run is closed, or closed before the update had an outcome.
            TimeoutError: ``timeout`` passed first.
            ConfigurationError: a negative or NaN ``timeout`` (nothing is sent).
        """
        timeout = wait_seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        ref, uid, after = send_update(self._store, self._type, self._id, name, args, update_id)
        self._run_id = ref.run_id
        return update_result(wait_update(self._store, ref, uid, after, deadline), self._id, name)

    def query(self, name: str, *args: Any) -> Any:
        """Call the ``@query`` method ``name`` on the run's state, rebuilt from committed history.

        Raises:
            LimitExceeded: the name is longer than ``max_name_length`` (:mod:`durable.limits`).
        """
        if isinstance(name, str):
            check_name_length(name, "query")
        request = QueryWorkflowInput(self._id, name, tuple(args))
        return interceptors.run(ClientInterceptor, "query_workflow", request, self._query)

    def _query(self, request: QueryWorkflowInput) -> Any:
        def read() -> tuple[RunRef, list[ev.Entry]]:
            ref = self._ref()
            return ref, self._store.history(ref)

        ref, history = self._read(f"query({request.name!r})", read)

        def answer() -> Any:
            return query_history(history, request, ref.run_id, f"{ref.partition}.", self._store.hook_secrets)

        return run_limited(answer, QUERY_TIMEOUT, query_overrun(request.name, request.workflow_id))

    def cancel(self, reason: str = "") -> None:
        """Request cancellation: the workflow gets ``CancelledError`` where it waits and may clean up.

        Cooperative, as in Temporal: a run whose code returns before it waits again completes
        (``completed``, not ``cancelled``); one waiting on a child waits for the child to close
        (see :func:`~durable.child`); one continuing as new hands the request to its next run.
        """
        request = ev.CancelRequested(reason=cut_reason(reason or "cancel requested"))  # a second is dropped
        sent = new_run_id()  # one id for every try: a resend after a lost reply delivers nothing
        deliver = lambda: self._store.deliver(self._id, request, sent_id=sent)  # noqa: E731
        self._ride(f"cancel() of workflow {self._id!r}", deliver, writes=self._id)

    def terminate(self, reason: str = "") -> None:
        """Close the run now: no workflow code runs; open activities and timers are voided, its
        parent is told, and its children follow their ``parent_close_policy``: the same script
        leaves the messages a worker carries out (so a client that dies right after still closed
        them), and this call terminates the ``terminate`` ones itself too, at once (as when no
        worker runs)."""

        def terminate() -> Closing | None:
            return self._store.terminate(self._id, cut_reason(reason or "terminated"))[1]

        def again() -> Closing | None:
            try:
                return terminate()
            except WorkflowClosed:
                # The first try did it, and its reply was lost in the outage: its messages close
                # the children.
                if self._store.run_record(self._ref()).get("status") != "terminated":
                    raise
                return None

        close = self._ride(f"terminate() of workflow {self._id!r}", terminate, writes=self._id, resend=again)
        _terminate_children(self._store, close)

    # --------------------------------------------------------------- reads
    def status(self) -> str:
        """``pending``, ``running``, ``suspended``, ``cancelling``, ``completed``, ``failed``,
        ``cancelled``, ``terminated`` or ``continued``."""
        return self._read(
            "status()", lambda: str(self._store.run_record(self._ref()).get("status", "pending"))
        )

    def blocked(self) -> BlockedReason | None:
        """Why the current run cannot make progress until an operator acts (``None``: it can,
        or it is closed). :meth:`status` still says ``pending`` or ``suspended`` for it."""
        return self._read("blocked()", lambda: self._store.why_blocked(self._store.run_record(self._ref())))

    def snapshot(self) -> dict[str, Any]:
        """The run's projection: status, pending steps and waits, buffered signals, blocked
        reason (``blocked``: its message, ``blocked_kind``: its kind) and, once closed, its
        ``outcome`` (:meth:`RunOutcome.to_dict`: status, result or error type and message,
        close time)."""
        return self._read("snapshot()", lambda: run_snapshot(self._store, self._id, self._ref()))

    def history(self, run_id: str | None = None) -> list[HistoryEvent]:
        """The current run's events in order (``seq``, ``type``, ``ts``, ``data``); or those of
        ``run_id``, an earlier run of this workflow id (a continue-as-new chain, a reused id)."""
        entries = self._read("history()", lambda: self._store.history(self._run_ref(run_id)))
        return [HistoryEvent.from_entry(e) for e in entries]

    def result(self, timeout: float | None = None) -> R:
        """Wait for the run to close and return its result (follows continue-as-new).

        A stub addresses its workflow id: once the id was started again (a reused id), that is
        the newer run's result. ``describe(run_id)`` and ``history(run_id)`` read an earlier run.

        Waits without polling: the process's waits share one blocking read (``XREAD BLOCK``) on
        one connection, so any threads may wait, and they ride out an unreachable Redis for 60 s
        (a wait that cannot begin, for the store's ``client_ride_s``, within ``timeout``).
        ``timeout``: seconds (``None`` or ``math.inf``: no limit).

        Raises:
            WorkflowFailed: the run failed, was cancelled or terminated (``.status``, ``.cause``).
            WorkflowBlocked: the run is blocked, or becomes blocked while waiting (``.kind``,
                ``.reason``); raised at once, not at the timeout.
            TimeoutError: ``timeout`` seconds passed first.
            RedisUnavailable: Redis could not be read for longer than the ride-out.
            ConfigurationError: a negative or NaN ``timeout``.
        """
        timeout = wait_seconds(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        # The run this stub knew is checked current by the wait's first look (one round trip).
        current = self._run_id is not None
        ref = self._at_run(self._run_id) if self._run_id is not None else self._read("result()", self._ref)
        while True:
            try:
                # A wait that cannot begin (Redis down) is tried again, within the timeout; one that
                # began rides an outage out itself (OUTAGE_RIDE_S).
                closing = self._ride(
                    f"result() of workflow {self._id!r}",
                    lambda: wait_closing(self._store, ref, deadline, current=current),  # noqa: B023
                    until=deadline,
                )
            except TimeoutError:
                raise TimeoutError(not_closed(self._store, ref, timeout)) from None
            except RunMoved as moved:
                ref, current = self._at_run(moved.current) if moved.current else self._ref(), False
                continue
            current = False
            if isinstance(closing.event, ev.WorkflowCompleted):
                return codec.loads(closing.event.result)
            if isinstance(closing.event, ev.WorkflowContinuedAsNew):
                ref = self._at_run(closing.event.new_run_id)
                continue
            raise closing_error(closing, self._id)

    def describe(self, run_id: str | None = None) -> RunDescription:
        """Everything known about the current run (or ``run_id``, an earlier run of this id):
        status, blocked reason, outcome, pending steps, activity attempts with their errors,
        dropped inputs and history size.

        The :class:`~durable.runinfo.RunDescription` also reads as a mapping (``info["attempts"]``).
        ``history`` is ``{"events", "bytes", "budget", "near_limit"}``: the size of the run's
        history as of its last decision, its class's ``history_budget``, and whether it passed
        80% of either threshold (see :func:`durable.should_continue_as_new`).

        Raises:
            WorkflowNotFound: no such workflow id, or ``run_id`` is no run of it (or was purged).
        """
        return self._read("describe()", lambda: describe_run(self._store, self._id, self._run_ref(run_id)))
