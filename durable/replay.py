"""The replay driver: (workflow class, history) -> the next decision. No I/O.

A :class:`Driver` owns one run's workflow code, executed in greenlets:

* the **root** branch runs ``handle(*args)``; each :func:`durable.all` call
  starts one branch per callable;
* every durable call builds a command event and switches to the driver (the
  *hub*); the driver resumes a branch when an input event resolves what it
  waits on;
* events are applied **one at a time, in seq order**, and runnable branches
  run to quiescence after each, so replay reproduces the live interleaving.

Replay checks every command the code issues against the recorded history by
encoded bytes (:meth:`Event.fingerprint`); a difference, or a recorded
command the code did not issue by the time replay reaches it, raises
:class:`NondeterminismError`.

Lifecycle, as a worker uses it::

    driver = Driver(run_id=..., workflow_id=...)
    driver.replay(history_entries)        # committed history, from seq 1
    decision = driver.decide(inbox)       # live: apply new inputs
    store.commit(decision)                # atomic, expected seq
    driver.committed()                    # keep it cached for next time
    ...
    driver.close()                        # always, when evicted or on error

The driver never touches Redis, the clock or randomness of its own: time is
the ``ts`` of the last applied input event, so a fresh replay of the same
history produces the same decision byte for byte.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import greenlet

from . import codec
from . import events as ev
from .activity import RetryPolicy, to_seconds
from .errors import (
    ActivityFailed,
    CancelledError,
    ChildWorkflowFailed,
    ConfigurationError,
    DurableError,
    HistoryCorrupt,
    NondeterminismError,
    SignalTimeout,
)
from .ids import check_command_id, check_workflow_id, successor_run_id
from .registry import activity_definition_for, get_workflow
from .workflow import (
    DEFAULT_VERSION,
    ContinueAsNew,
    Hook,
    Workflow,
    _duration_ms,
    effective_history_budget,
    near_history_limit,
)

_POLICIES = ("terminate", "request_cancel", "abandon")
_tls = threading.local()
log = logging.getLogger("durable.workflow")


def current_driver() -> Driver:
    """The driver of the workflow branch running on this greenlet.

    Raises:
        DurableError: outside a running workflow, inside a signal handler,
            query, ``wait_until`` predicate or side-effect function, or on a
            closed driver.
    """
    callback = getattr(_tls, "callback", None)
    if callback is not None:
        raise DurableError(f"durable calls are not allowed inside a {callback}")
    g = greenlet.getcurrent()
    if isinstance(g, _Branch):
        driver = g.driver
        if driver._callback is not None:
            raise DurableError(f"durable calls are not allowed inside a {driver._callback}")
        if driver._closed:
            raise DurableError(
                f"the driver of run {driver.run_id} is closed; this workflow code may not continue"
            )
        if driver._closing is not None:
            raise DurableError(f"run {driver.run_id} has already closed; no more durable calls")
        return driver
    raise DurableError(
        "durable workflow calls (activity, timer, await_signal, ...) can only be made inside "
        "Workflow.handle() while a worker runs it"
    )


class _Branch(greenlet.greenlet):
    """A greenlet running workflow code: the root ``handle()`` or one ``all()`` branch."""

    def __init__(self, driver: Driver, path: str, run: Callable[[], Any], parent: greenlet.greenlet) -> None:
        super().__init__(run=run, parent=parent)
        self.driver = driver
        self.path = path
        self.counter = 0
        self.wait: _Wait | None = None
        self.group: _Group | None = None
        self.index = 0


@dataclass
class _Wait:
    """What a suspended branch waits on."""

    kind: str  # activity | timer | signal | wait_until | child | hook | all
    id: str
    name: str = ""
    deadline: int | None = None
    predicate: Callable[[], bool] | None = None
    group: _Group | None = None
    child_workflow_id: str = ""
    policy: str = ""


@dataclass
class _Group:
    """One ``all()`` call: its branches' outcomes."""

    id: str
    parent: _Branch
    results: list[Any]
    branches: list[_Branch] = field(default_factory=list)
    remaining: int = 0
    first_error: BaseException | None = None
    cancelled: str | None = None  # reason, when the all() call itself was cancelled


@dataclass
class Decision:
    """What one decision asks the store to commit, atomically.

    Attributes:
        expected_seq: The last committed seq the decision is based on; the
            commit fails with ``EventConflict`` if the history moved on.
        events: Entries to append, in order (seq ``expected_seq + 1`` ...):
            consumed inbox items copied byte for byte, interleaved with the
            command events their application produced.
        consumed: How many inbox items (from the head) the decision read.
        dropped: Inbox items read but not written to history, with the reason
            (duplicates, late results); kept beside the history.
        activities: Activities to enqueue (net: not cancelled in this decision).
        timers: ``(timer id, fire_at ms)`` to add to the timers set.
        cancelled_timers: Timer ids to remove.
        cancelled_activities: Activity ids whose pending task/attempt is void.
        children: Child workflows to start.
        cancelled_children: ``(command id, child workflow id, policy)`` to act on.
        hooks: Hooks created (token -> run routing).
        closing: The closing event when the run ends, else ``None``.
        status: The run's status word after this decision.
        snapshot: The projection written with the commit.
    """

    expected_seq: int
    events: list[bytes]
    consumed: int
    dropped: list[tuple[bytes, str]]
    activities: list[ev.ActivityScheduled]
    timers: list[tuple[str, int]]
    cancelled_timers: list[str]
    cancelled_activities: list[str]
    children: list[ev.ChildStarted]
    cancelled_children: list[tuple[str, str, str]]
    hooks: list[ev.HookCreated]
    closing: ev.Event | None
    status: str
    snapshot: dict[str, Any]

    @property
    def new_events(self) -> int:
        return len(self.events)


class Driver:
    """Replays one run's history into greenlets and produces its decisions.

    Args:
        run_id: The run (for error messages and derived ids).
        workflow_id: The workflow instance id.
        resolve: Maps a workflow type name to its class (default: the registry).
        token_prefix: Prepended to hook tokens (the store routes tokens by it).
        read_only: For queries: code stops at the first command history does
            not hold (no side-effect function runs, nothing new is decided).
    """

    def __init__(
        self,
        *,
        run_id: str = "",
        workflow_id: str = "",
        resolve: Callable[[str], type[Workflow]] = get_workflow,
        token_prefix: str = "",
        read_only: bool = False,
    ) -> None:
        self.run_id = run_id
        self._token_prefix = token_prefix
        self._read_only = read_only
        self.workflow_id = workflow_id
        self._resolve = resolve
        self._hub: greenlet.greenlet = greenlet.getcurrent()
        self._instance: Workflow | None = None
        self._started: ev.WorkflowStarted | None = None
        self._root: _Branch | None = None
        self._branches: list[_Branch] = []
        self._runnable: deque[tuple[_Branch, Any, BaseException | None]] = deque()
        self._waits: dict[tuple[str, str], _Branch] = {}
        self._signal_waiters: dict[str, list[_Branch]] = {}
        self._wait_until: list[_Branch] = []
        self._signals: dict[str, deque[bytes]] = {}
        self._hook_payloads: dict[str, bytes] = {}
        self._hooks: set[str] = set()
        self._ids: set[str] = set()
        self._versions: dict[str, int] = {}
        self._recorded: dict[tuple[str, str], ev.Entry] = {}
        self._matched: set[tuple[str, str]] = set()
        self._at_seq: dict[int, ev.Entry] = {}
        self._cursor = 0  # replay: seq of the last input applied or command matched
        self._seq = 0
        self._pos = 0
        self._history_end = 0
        self._bytes_end = 0  # raw bytes of the history up to _history_end
        self._bytes_at: dict[int, int] = {}  # replay: seq -> raw bytes of the history up to it
        self._budget_warned = False
        self._budget: dict[str, int] | None = None  # the class's history budget, once known
        self._now = 0
        self._out: list[bytes] = []
        self._new: list[ev.Event] = []
        self._dropped: list[tuple[bytes, str]] = []
        self._close_actions: tuple[list[str], list[str], list[tuple[str, str, str]]] = ([], [], [])
        self._child_cancels: list[tuple[str, str, str]] = []
        self._closing: ev.Event | None = None
        self._cancel_reason: str | None = None
        self._fatal: BaseException | None = None
        self._callback: str | None = None
        self._closed = False

    # ------------------------------------------------------------ properties
    @property
    def seq(self) -> int:
        """Last committed seq this driver has applied."""
        return self._seq

    @property
    def closed_run(self) -> bool:
        """True when the run has closed (a closing event was issued or replayed)."""
        return self._closing is not None

    @property
    def status(self) -> str:
        if self._closing is not None:
            return ev.STATUS_OF_CLOSING[self._closing.type]
        if self._started is None:
            return "pending"
        if self._cancel_reason is not None:
            return "cancelling"
        if any(b.wait is not None and b.wait.kind in ("activity", "child") for b in self._live()):
            return "running"
        return "suspended"

    @property
    def now_ms(self) -> int:
        """The workflow's current time (UTC ms): ``ts`` of the last applied input."""
        return self._now

    @property
    def started(self) -> ev.WorkflowStarted | None:
        """The run's WorkflowStarted event, once replayed."""
        return self._started

    @property
    def workflow_type(self) -> str:
        return self._started.workflow_type if self._started else ""

    @property
    def queue(self) -> str:
        return self._started.queue if self._started else "default"

    # --------------------------------------------------------------- public
    def replay(self, entries: Sequence[ev.Entry]) -> Driver:
        """Apply committed history (from the driver's current seq on).

        Commands the code issues while the last entry is applied are new: they
        become part of the next :meth:`decide`.
        """
        self._enter()
        if not entries:
            return self
        self._history_end = entries[-1].seq
        size = self._bytes_end
        for entry in entries:
            size += len(entry.raw)
            self._bytes_at[entry.seq] = size
        self._bytes_end = size
        for expected, entry in enumerate(entries, self._seq + 1):
            if entry.seq != expected:  # checked before any code runs
                raise HistoryCorrupt(
                    f"run {self.run_id}: history jumps from seq {expected - 1} to {entry.seq}",
                    run_id=self.run_id,
                    seq=entry.seq,
                )
            if entry.event.is_command:
                key = entry.event.key
                if key in self._recorded:
                    raise HistoryCorrupt(
                        f"run {self.run_id} seq {entry.seq}: command {key[0]} {key[1]!r} is recorded twice",
                        run_id=self.run_id,
                        seq=entry.seq,
                    )
                self._recorded[key] = entry
                self._at_seq[entry.seq] = entry
        for entry in entries:
            self._apply_committed(entry)
        self._recorded.clear()
        self._matched.clear()
        self._at_seq.clear()
        self._bytes_at.clear()
        return self

    def decide(self, inbox: Sequence[ev.Entry] = ()) -> Decision:
        """Apply new inbox items live and return the decision to commit."""
        self._enter()
        for item in inbox:
            self._pos = self._history_end + 1 + len(self._out)
            if self._closing is not None:
                self._dropped.append((item.raw, f"run closed before {item.type} was applied"))
                continue
            mark = len(self._out)
            self._out.append(item.raw)
            reason = self._deliver(item.event, item.ts)
            if reason is not None:
                del self._out[mark]
                self._dropped.append((item.raw, reason))
                continue
            self._run()
        return self._decision(consumed=len(inbox))

    def committed(self) -> None:
        """The last decision was committed: its events are now history."""
        self._seq += len(self._out)
        self._history_end = self._seq
        self._bytes_end += sum(len(raw) for raw in self._out)
        self._out = []
        self._new = []
        self._dropped = []
        self._child_cancels = []
        self._close_actions = ([], [], [])

    def query(self, name: str, args: Sequence[Any] = ()) -> Any:
        """Answer a ``@query`` method from the replayed state (commits nothing)."""
        self._enter()
        if self._instance is None:
            raise DurableError(f"run {self.run_id} has not started; nothing to query")
        method = type(self._instance)._queries.get(name)
        if method is None:
            known = sorted(type(self._instance)._queries)
            raise DurableError(f"workflow {self.workflow_type!r} has no @query {name!r}; it has {known}")
        return self._guarded(f"query {name!r}", lambda: getattr(self._instance, method)(*args))

    def snapshot(self, status: str | None = None) -> dict[str, Any]:
        """The run's projection: status, pending steps and waits, buffered signals, history size.

        Args:
            status: :attr:`status`, when the caller has it already.
        """
        events, size = self._history_total()
        budget = self.history_budget()
        pending = []
        for b in self._live():
            w = b.wait
            if w is None or w.kind == "all":
                continue
            item: dict[str, Any] = {"kind": w.kind, "id": w.id}
            if w.name:
                item["name"] = w.name
            if w.deadline is not None:
                item["deadline"] = w.deadline
            if w.child_workflow_id:
                item["workflow_id"] = w.child_workflow_id
                item["policy"] = w.policy
            pending.append(item)
        return {
            "status": status or self.status,
            "pending": pending,
            "signals_buffered": {k: len(v) for k, v in self._signals.items() if v},
            "cancel_requested": self._cancel_reason is not None,
            "history_events": events,
            "history_bytes": size,
            "history_budget": budget,
            "near_history_limit": near_history_limit(events, size, budget),
        }

    def close(self) -> None:
        """Kill every live greenlet (GreenletExit). Idempotent; call on the owning thread.

        Suspended greenlets form reference cycles that are never collected, so
        a driver that is evicted, conflicts or fails must be closed.
        """
        if self._closed:
            return
        self._closed = True
        for b in reversed(self._branches):
            if not b.dead:
                try:
                    b.throw(greenlet.GreenletExit)
                except BaseException:  # noqa: BLE001 - code in finally blocks may raise anything
                    pass
        self._branches.clear()
        self._runnable.clear()
        self._waits.clear()
        self._signal_waiters.clear()
        self._wait_until.clear()
        self._root = None
        self._instance = None

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._now / 1000, tz=UTC)

    def history_length(self) -> int:
        """Events in the history at this point of the code (deterministic: replay sees what live saw)."""
        return self._history_size()[0]

    def history_bytes(self) -> int:
        """Raw bytes of the history at this point of the code (deterministic, like :meth:`history_length`)."""
        return self._history_size()[1]

    def history_budget(self) -> dict[str, int]:
        """The run's history budget (its class's ``history_budget`` over the defaults)."""
        if self._budget is None or self._instance is None:
            budget = effective_history_budget(type(self._instance) if self._instance is not None else None)
            if self._instance is None:
                return budget
            self._budget = budget
        return dict(self._budget)

    def should_continue_as_new(self) -> bool:
        events, size = self._history_size()
        return near_history_limit(events, size, self.history_budget())

    def _history_size(self) -> tuple[int, int]:
        """(events, bytes) of the history as the calling code sees it.

        Live, that is the committed history plus this decision's events so far.
        While replaying, the same point is the last entry applied or matched
        (``_cursor``), so a replayed call answers what the live call answered.
        """
        if self._replaying():
            return self._cursor, self._bytes_at.get(self._cursor, self._bytes_end)
        return self._history_total()

    def _history_total(self) -> tuple[int, int]:
        """(events, bytes) of the committed history plus every event of the current decision."""
        return (
            self._history_end + len(self._out),
            self._bytes_end + sum(len(raw) for raw in self._out),
        )

    def info(self) -> dict[str, Any]:
        return {"workflow_id": self.workflow_id, "run_id": self.run_id, "type": self.workflow_type}

    # ------------------------------------------------------- durable calls
    def call_activity(
        self,
        target: Any,
        args: tuple[Any, ...],
        *,
        id: str | None,  # noqa: A002
        queue: str | None,
        retry: RetryPolicy | None,
        timeouts: tuple[Any, Any, Any],
        local: bool,
    ) -> Any:
        branch = self._branch()
        definition = activity_definition_for(target)
        cid = self._next_id(branch, id)
        policy = retry or definition.retry
        if policy is not None and not isinstance(policy, RetryPolicy):
            raise ConfigurationError(f"retry= must be a RetryPolicy, not {type(policy).__name__}")
        start_to_close, schedule_to_close, heartbeat = timeouts
        event = ev.ActivityScheduled(
            id=cid,
            name=definition.name,
            args=codec.dumps(tuple(args), path="args"),
            queue=queue or definition.queue or self.queue,
            retry=policy.to_dict() if policy is not None else None,
            timeouts={
                "start_to_close": _pick(
                    start_to_close, definition.start_to_close_timeout, "start_to_close_timeout"
                ),
                "schedule_to_close": _pick(
                    schedule_to_close, definition.schedule_to_close_timeout, "schedule_to_close_timeout"
                ),
                "heartbeat": _pick(heartbeat, definition.heartbeat_timeout, "heartbeat_timeout"),
            },
            local=local,
        )
        self._issue(event)
        return self._suspend(branch, _Wait("activity", cid, name=definition.name))

    def call_timer(self, duration: Any, *, id: str | None) -> None:  # noqa: A002
        branch = self._branch()
        ms = _duration_ms(duration, "timer duration")
        cid = self._next_id(branch, id)
        if ms <= 0:
            return
        fire_at = self._now + ms
        self._issue(ev.TimerStarted(id=cid, fire_at=fire_at))
        self._suspend(branch, _Wait("timer", cid, deadline=fire_at))

    def call_await_signal(self, name: str, timeout: Any, *, id: str | None) -> Any:  # noqa: A002
        branch = self._branch()
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"await_signal needs a signal name (str), got {name!r}")
        cid = self._next_id(branch, id)
        buffered = self._signals.get(name)
        if buffered:
            return _signal_value(buffered.popleft())
        deadline = self._deadline(timeout, "await_signal timeout")
        if deadline is not None and deadline <= self._now:
            raise SignalTimeout(f"no signal {name!r} (timeout 0)")
        self._issue(ev.SignalWaitStarted(id=cid, name=name, deadline=deadline))
        self._signal_waiters.setdefault(name, []).append(branch)
        return self._suspend(branch, _Wait("signal", cid, name=name, deadline=deadline))

    def call_wait_until(self, predicate: Callable[[], bool], timeout: Any, *, id: str | None) -> bool:  # noqa: A002
        branch = self._branch()
        if not callable(predicate):
            raise ConfigurationError("wait_until needs a callable predicate")
        cid = self._next_id(branch, id)
        if self._guarded("wait_until predicate", predicate):
            return True
        deadline = self._deadline(timeout, "wait_until timeout")
        if deadline is not None:
            if deadline <= self._now:
                return False
            self._issue(ev.TimerStarted(id=cid, fire_at=deadline))
        self._wait_until.append(branch)
        return bool(self._suspend(branch, _Wait("wait_until", cid, deadline=deadline, predicate=predicate)))

    def call_side_effect(self, fn: Callable[[], Any], *, id: str | None) -> Any:  # noqa: A002
        branch = self._branch()
        cid = self._next_id(branch, id)
        recorded = self._recorded_for(("SideEffectRecorded", cid))
        if recorded is not None:
            assert isinstance(recorded, ev.SideEffectRecorded)
            event = recorded
        elif self._replaying():
            # History has no such command: fail without calling the function.
            self._issue(ev.SideEffectRecorded(id=cid))
            raise AssertionError("unreachable: _issue raises while replaying")  # pragma: no cover
        else:
            if self._read_only:
                self._stop_at_frontier()
            value = error = None
            try:
                result = self._guarded("side_effect function", fn, inside_branch=True)
                value = codec.dumps(result, path="side_effect value")
            except Exception as exc:  # noqa: BLE001 - recorded, re-raised below and on replay
                error = codec.dumps(exc, path="side_effect error")
            event = ev.SideEffectRecorded(id=cid, value=value, error=error)
        self._issue(event)
        if event.error is not None:
            raise codec.loads(event.error)
        return codec.loads(event.value) if event.value is not None else None

    def call_get_version(self, change_id: str, min_supported: int, max_supported: int) -> int:
        self._branch()
        check_command_id(change_id)
        if (
            not (isinstance(min_supported, int) and isinstance(max_supported, int))
            or min_supported > max_supported
        ):
            raise ConfigurationError("get_version needs integers min_supported <= max_supported")
        version = self._versions.get(change_id)
        if version is None:
            recorded = self._recorded_for(("VersionMarker", change_id))
            if recorded is not None:
                assert isinstance(recorded, ev.VersionMarker)
                version = recorded.version
                self._issue(recorded)
            elif self._replaying():
                version = DEFAULT_VERSION
            else:
                version = max_supported
                self._issue(ev.VersionMarker(id=change_id, change_id=change_id, version=version))
            self._versions[change_id] = version
        if not min_supported <= version <= max_supported:
            raise self._nondeterminism(
                f"get_version({change_id!r}): this run recorded version {version}, outside the supported "
                f"range [{min_supported}, {max_supported}] of the code now deployed",
                change_id,
                version,
                (min_supported, max_supported),
            )
        return version

    def call_patched(self, patch_id: str) -> bool:
        self._branch()
        assert self._started is not None
        return patch_id in self._started.patches

    def call_child(
        self,
        workflow: Any,
        args: tuple[Any, ...],
        *,
        id: str | None,  # noqa: A002
        workflow_id: str | None,
        queue: str | None,
        policy: str,
    ) -> Any:
        branch = self._branch()
        if isinstance(workflow, str):
            type_name, child_queue = workflow, None
        elif isinstance(workflow, type) and issubclass(workflow, Workflow):
            type_name, child_queue = workflow.name, workflow.queue
        else:
            raise ConfigurationError(f"child() needs a Workflow subclass or its name, not {workflow!r}")
        if policy not in _POLICIES:
            raise ConfigurationError(f"parent_close_policy must be one of {_POLICIES}, not {policy!r}")
        cid = self._next_id(branch, id)
        child_id = check_workflow_id(workflow_id) if workflow_id is not None else f"{self.workflow_id}/{cid}"
        self._issue(
            ev.ChildStarted(
                id=cid,
                workflow_type=type_name,
                workflow_id=child_id,
                args=codec.dumps(tuple(args), path="args"),
                queue=queue or child_queue or self.queue,
                policy=policy,
            )
        )
        return self._suspend(
            branch, _Wait("child", cid, name=type_name, child_workflow_id=child_id, policy=policy)
        )

    def call_all(self, fns: list[Callable[[], Any]], *, id: str | None) -> list[Any]:  # noqa: A002
        branch = self._branch()
        if not all(callable(f) for f in fns):
            raise ConfigurationError("all() takes a list of callables, e.g. [lambda: activity(A), ...]")
        cid = self._next_id(branch, id)
        if not fns:
            return []
        group = _Group(id=cid, parent=branch, results=[None] * len(fns), remaining=len(fns))
        for index, fn in enumerate(fns):
            child = self._spawn(f"{cid}.{index + 1}", fn)
            child.group, child.index = group, index
            group.branches.append(child)
            self._runnable.append((child, None, None))
        return self._suspend(branch, _Wait("all", cid, group=group))

    def call_continue_as_new(self, args: tuple[Any, ...]) -> None:
        self._branch()
        raise ContinueAsNew(args)

    def call_create_hook(self, name: str, metadata: Any, *, id: str | None) -> Hook:  # noqa: A002
        branch = self._branch()
        if not isinstance(name, str) or not name:
            raise ConfigurationError("create_hook needs a name (str)")
        cid = self._next_id(branch, id)
        recorded = self._recorded_for(("HookCreated", cid))
        token = (
            recorded.token
            if isinstance(recorded, ev.HookCreated)
            else self._token_prefix + secrets.token_urlsafe(24)
        )
        self._issue(
            ev.HookCreated(id=cid, name=name, token=token, metadata=codec.dumps(metadata, path="metadata"))
        )
        self._hooks.add(cid)
        return Hook(cid, name, token)

    def call_await_hook(self, hook: Hook, timeout: Any) -> Any:
        branch = self._branch()
        if not isinstance(hook, Hook) or hook.id not in self._hooks:
            raise ConfigurationError("await_hook needs a Hook returned by create_hook() in this run")
        if hook.id in self._hook_payloads:
            return _signal_value(self._hook_payloads.pop(hook.id))
        deadline = self._deadline(timeout, "await_hook timeout")
        if deadline is not None:
            self._issue(ev.TimerStarted(id=hook.id, fire_at=deadline))
        self._waits[("hook", hook.id)] = branch
        return self._suspend(branch, _Wait("hook", hook.id, name=hook.name, deadline=deadline))

    # ----------------------------------------------------------- machinery
    def _enter(self) -> None:
        if self._closed:
            raise DurableError(f"driver of run {self.run_id} is closed")
        self._hub = greenlet.getcurrent()
        self._raise_fatal()

    def _live(self) -> list[_Branch]:
        # Prune finished branches as we go: a long-lived cached run that calls
        # all() in a loop must not keep every dead greenlet until close().
        self._branches = [b for b in self._branches if not b.dead]
        return self._branches

    def _branch(self) -> _Branch:
        g = greenlet.getcurrent()
        assert isinstance(g, _Branch) and g.driver is self
        return g

    def _next_id(self, branch: _Branch, explicit: str | None) -> str:
        # Explicit ids consume a number too: adding id= to a call later keeps
        # every other generated id of the branch stable.
        branch.counter += 1
        if explicit is None:
            cid = f"{branch.path}.{branch.counter}" if branch.path else str(branch.counter)
        else:
            cid = check_command_id(explicit)
        if cid in self._ids:
            raise ConfigurationError(
                f"command id {cid!r} is used twice in run {self.run_id}; ids must be unique"
            )
        self._ids.add(cid)
        return cid

    def _deadline(self, timeout: Any, what: str) -> int | None:
        if timeout is None:
            return None
        return self._now + _duration_ms(timeout, what)

    def _replaying(self) -> bool:
        """True while applying a committed entry that is not the last one."""
        return self._pos < self._history_end

    def _recorded_for(self, key: tuple[str, str]) -> ev.Event | None:
        entry = self._recorded.get(key)
        return entry.event if entry is not None else None

    def _issue(self, event: ev.Event) -> None:
        """Check a command against history; record it when it is new."""
        key = event.key
        entry = self._recorded.get(key)
        if entry is not None:
            if key in self._matched:
                raise self._nondeterminism(f"command {key[0]} {key[1]!r} issued twice", key[1], None, None)
            if entry.event.fingerprint() != event.fingerprint():
                raise self._nondeterminism(
                    f"{key[0]} {key[1]!r} differs from history (seq {entry.seq})",
                    key[1],
                    entry.event.describe(),
                    event.describe(),
                )
            if entry.seq != self._cursor + 1:
                # Commands follow the input whose application issued them, in issue
                # order: a command issued earlier than recorded, or out of order, moved.
                there = self._at_seq.get(self._cursor + 1)
                what = f"{there.type} {there.event.key[1]!r}" if there is not None else "an input"
                raise self._nondeterminism(
                    f"{key[0]} {key[1]!r} was issued as seq {self._cursor + 1}, but history records it at "
                    f"seq {entry.seq} and has {what} at seq {self._cursor + 1} (commands reordered?)",
                    key[1],
                    entry.event.describe(),
                    event.describe(),
                )
            self._cursor = entry.seq
            self._matched.add(key)
            return
        if self._read_only:
            self._stop_at_frontier()
            return
        if self._replaying():
            raise self._nondeterminism(
                f"{key[0]} {key[1]!r} was issued while replaying seq {self._pos}, but the history has no such "
                "command (code changed before this point?)",
                key[1],
                None,
                event.describe(),
            )
        self._out.append(ev.encode(event, self._now))
        self._new.append(event)

    def _stop_at_frontier(self) -> None:
        """Read-only replay reached code beyond the committed history: park this branch for good."""
        g = greenlet.getcurrent()
        if isinstance(g, _Branch) and g.driver is self:
            g.wait = _Wait("frontier", "")
            self._hub.switch()
            raise AssertionError("a branch parked at the frontier was resumed")  # pragma: no cover

    def _nondeterminism(self, what: str, command_id: str, recorded: Any, issued: Any) -> NondeterminismError:
        detail = ""
        if recorded is not None or issued is not None:
            detail = f" (recorded: {recorded!r}; now: {issued!r})"
        err = NondeterminismError(
            f"nondeterminism in run {self.run_id} ({self.workflow_type}): {what}{detail}. The run is blocked; "
            "deploy code that decides as before (use get_version/patched for changes), then `durable repair`",
            run_id=self.run_id,
            command_id=command_id,
            recorded=recorded,
            issued=issued,
        )
        if self._fatal is None:
            self._fatal = err
        return err

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _guarded(self, what: str, fn: Callable[[], Any], *, inside_branch: bool = False) -> Any:
        """Run user code that must not make durable calls."""
        if inside_branch:
            previous, self._callback = self._callback, what
            try:
                return fn()
            finally:
                self._callback = previous
        previous_tls = getattr(_tls, "callback", None)
        _tls.callback = what
        try:
            return fn()
        finally:
            _tls.callback = previous_tls

    def _suspend(self, branch: _Branch, wait: _Wait) -> Any:
        branch.wait = wait
        if wait.kind in ("activity", "child", "timer"):
            self._waits[(wait.kind, wait.id)] = branch
        if wait.deadline is not None and wait.kind != "timer":
            self._waits[("timer", wait.id)] = branch
        return self._hub.switch()

    def _resume(self, branch: _Branch, value: Any = None, exc: BaseException | None = None) -> None:
        wait = branch.wait
        if wait is not None:
            self._waits.pop((wait.kind, wait.id), None)
            if wait.deadline is not None:
                self._waits.pop(("timer", wait.id), None)
        branch.wait = None
        self._runnable.append((branch, value, exc))

    def _spawn(self, path: str, fn: Callable[[], Any]) -> _Branch:
        branch: _Branch

        def main(start: Any = None) -> None:
            try:
                if isinstance(start, BaseException):
                    raise start  # cancelled before it ever ran (see _run)
                result = fn()
            except greenlet.GreenletExit:
                return
            except BaseException as exc:  # noqa: BLE001 - every outcome is routed
                if not self._closed:  # closing: a finally block raised; nothing to route
                    self._branch_done(branch, None, exc)
                return
            if not self._closed:
                self._branch_done(branch, result, None)

        branch = _Branch(self, path, main, self._hub)
        self._branches.append(branch)
        return branch

    def _run(self) -> None:
        """Run runnable branches to quiescence, then wake true ``wait_until`` waiters one by one."""
        hub = self._hub
        while True:
            while self._runnable and self._fatal is None:
                branch, value, exc = self._runnable.popleft()
                if branch.dead:
                    continue
                branch.parent = hub
                if exc is None:
                    branch.switch(value)
                elif branch:  # started: raise at its suspension point
                    branch.throw(exc)
                else:  # never started: throw() would kill it without running main()
                    branch.switch(exc)
            if self._fatal is not None or not self._wake_one_waiter():
                break
        self._raise_fatal()
        if self._closing is not None:
            for b in self._live():
                if b is not greenlet.getcurrent():
                    try:
                        b.throw(greenlet.GreenletExit)
                    except BaseException:  # noqa: BLE001
                        pass

    def _wake_one_waiter(self) -> bool:
        for branch in list(self._wait_until):
            wait = branch.wait
            assert wait is not None and wait.predicate is not None
            try:
                ready = self._guarded("wait_until predicate", wait.predicate)
            except Exception as exc:  # noqa: BLE001 - raised in the waiting code
                self._wait_until.remove(branch)
                self._resume(branch, exc=exc)
                return True
            if ready:
                self._wait_until.remove(branch)
                if wait.deadline is not None:
                    self._issue(ev.TimerCancelled(id=wait.id))
                self._resume(branch, True)
                return True
        return False

    # ------------------------------------------------------ applying events
    def _apply_committed(self, entry: ev.Entry) -> None:
        if entry.seq != self._seq + 1:
            raise HistoryCorrupt(
                f"run {self.run_id}: history jumps from seq {self._seq} to {entry.seq}",
                run_id=self.run_id,
                seq=entry.seq,
            )
        self._pos = entry.seq
        event = entry.event
        if event.is_command:
            if event.key not in self._matched:
                raise self._nondeterminism(
                    f"history records {event.type} {event.key[1]!r} at seq {entry.seq}, but the code did not "
                    "issue it by then",
                    event.key[1],
                    event.describe(),
                    None,
                )
        else:
            self._cursor = entry.seq
            reason = self._deliver(event, entry.ts)
            if reason is not None:
                raise self._nondeterminism(
                    f"history applies {event.type} at seq {entry.seq} but the code cannot take it ({reason})",
                    getattr(event, "id", ""),
                    event.describe(),
                    None,
                )
            self._run()
        self._seq = entry.seq

    def _deliver(self, event: ev.Event, ts: int) -> str | None:
        """Route one input event; returns why it was dropped, or None when applied."""
        if self._closing is not None:
            return "run already closed"
        if isinstance(event, ev.WorkflowStarted):
            if self._started is not None:
                return "duplicate WorkflowStarted"
            self._now = ts
            self._start(event)
            return None
        if self._started is None:
            raise HistoryCorrupt(
                f"run {self.run_id}: history does not begin with WorkflowStarted ({event.type} first)",
                run_id=self.run_id,
                seq=self._pos,
            )
        self._now = ts
        if isinstance(event, ev.ActivityCompleted | ev.ActivityFailed):
            branch = self._waits.get(("activity", event.id))
            if branch is None:
                return f"no activity {event.id!r} is pending (duplicate or late result)"
            if isinstance(event, ev.ActivityCompleted):
                self._resume(branch, codec.loads(event.result))
            else:
                self._resume(branch, exc=self._activity_error(event, branch))
            return None
        if isinstance(event, ev.TimerFired):
            return self._timer_fired(event.id)
        if isinstance(event, ev.SignalReceived):
            self._signal(event)
            return None
        if isinstance(event, ev.ChildCompleted | ev.ChildFailed):
            branch = self._waits.get(("child", event.id))
            if branch is None:
                return f"no child {event.id!r} is pending"
            if isinstance(event, ev.ChildCompleted):
                self._resume(branch, codec.loads(event.result))
            else:
                assert branch.wait is not None
                cause = codec.loads(event.error) if event.error is not None else None
                self._resume(
                    branch,
                    exc=ChildWorkflowFailed(
                        f"child workflow {branch.wait.child_workflow_id!r} {event.status}"
                        + (f": {type(cause).__name__}: {cause}" if cause is not None else ""),
                        workflow_id=branch.wait.child_workflow_id,
                        status=event.status,
                        cause=cause,
                    ),
                )
            return None
        if isinstance(event, ev.HookResumed):
            if event.id not in self._hooks:
                return f"no hook {event.id!r} in this run"
            branch = self._waits.get(("hook", event.id))
            if branch is None:
                if event.id in self._hook_payloads:
                    return f"hook {event.id!r} was already resumed"
                self._hook_payloads[event.id] = event.payload
            else:
                self._hooks.discard(event.id)
                if branch.wait is not None and branch.wait.deadline is not None:
                    self._issue(ev.TimerCancelled(id=event.id))
                self._resume(branch, _signal_value(event.payload))
            return None
        if isinstance(event, ev.CancelRequested):
            if self._cancel_reason is not None:
                return "cancel already requested"
            self._cancel_reason = event.reason or "cancel requested"
            if self._root is not None and not self._root.dead:
                self._cancel_branch(self._root, self._cancel_reason)
            return None
        if isinstance(event, ev.WorkflowTerminated):
            self._closing = event
            return None
        raise HistoryCorrupt(
            f"run {self.run_id} seq {self._pos}: {event.type} cannot be applied as an input",
            run_id=self.run_id,
            seq=self._pos,
        )

    def _start(self, event: ev.WorkflowStarted) -> None:
        self._started = event
        if not self.workflow_id:
            self.workflow_id = event.workflow_id
        if not self.run_id:
            self.run_id = event.run_id
        cls = self._resolve(event.workflow_type)
        instance = cls()
        self._instance = instance
        args = codec.loads(event.args)
        self._root = self._spawn("", lambda: instance.handle(*args))
        self._runnable.append((self._root, None, None))

    def _activity_error(self, event: ev.ActivityFailed, branch: _Branch) -> ActivityFailed:
        assert branch.wait is not None
        cause = codec.loads(event.error)
        cause_text = f"{getattr(cause, 'type_name', '') or type(cause).__name__}: {cause}"
        return ActivityFailed(
            f"activity {branch.wait.name} ({event.id}) failed after {event.attempts} attempt(s): {cause_text}",
            activity_id=event.id,
            activity_name=branch.wait.name,
            attempts=event.attempts,
            cause=cause if isinstance(cause, BaseException) else None,
        )

    def _timer_fired(self, timer_id: str) -> str | None:
        branch = self._waits.get(("timer", timer_id))
        if branch is None or branch.wait is None:
            return f"no timer {timer_id!r} is pending (cancelled or fired already)"
        wait = branch.wait
        if wait.kind == "timer":
            self._resume(branch, None)
        elif wait.kind == "signal":
            self._signal_waiters[wait.name].remove(branch)
            self._resume(branch, exc=SignalTimeout(f"no signal {wait.name!r} before the deadline"))
        elif wait.kind == "wait_until":
            self._wait_until.remove(branch)
            self._resume(branch, False)
        elif wait.kind == "hook":
            self._resume(branch, exc=SignalTimeout(f"hook {wait.name!r} was not resumed before the deadline"))
        else:  # pragma: no cover - deadlines exist only on the kinds above
            return f"timer {timer_id!r} has no waiter"
        return None

    def _signal(self, event: ev.SignalReceived) -> None:
        assert self._instance is not None
        handler = type(self._instance)._signals.get(event.name)
        if handler is not None:
            args = codec.loads(event.payload)
            try:
                self._guarded(
                    f"signal handler {event.name!r}", lambda: getattr(self._instance, handler)(*args)
                )
            except Exception as exc:  # noqa: BLE001 - an error in a handler fails the run
                self._close(ev.WorkflowFailed(error=codec.dumps(exc, path="error")))
            return
        waiters = self._signal_waiters.get(event.name)
        if waiters:
            branch = waiters.pop(0)
            assert branch.wait is not None
            if branch.wait.deadline is not None:
                self._issue(ev.TimerCancelled(id=branch.wait.id))
            self._resume(branch, _signal_value(event.payload))
        else:
            self._signals.setdefault(event.name, deque()).append(event.payload)

    # -------------------------------------------------------- cancellation
    def _cancel_branch(self, branch: _Branch, reason: str) -> None:
        """Throw CancelledError at a branch's suspension point; ``all()`` branches first."""
        wait = branch.wait
        if wait is None:
            # Runnable but not run yet: an all() branch that has not started, or one
            # resumed earlier in this pass. It gets CancelledError instead when it runs
            # (a branch that never started raises it before running any code).
            self._runnable = deque(
                (b, None, CancelledError(reason)) if b is branch else (b, v, e) for b, v, e in self._runnable
            )
            return
        if wait.kind == "all":
            group = wait.group
            assert group is not None
            # The all() call itself is cancelled: its caller gets CancelledError
            # (not the partial results) once every branch has finished.
            group.cancelled = reason
            for sibling in group.branches:
                if not sibling.dead:
                    self._cancel_branch(sibling, reason)
            return
        self._void_wait(branch, wait, reason)
        self._resume(branch, exc=CancelledError(reason))

    def _void_wait(self, branch: _Branch, wait: _Wait, reason: str) -> None:
        """Record that what a branch waited on is no longer wanted."""
        if wait.kind == "activity":
            self._issue(ev.ActivityCancelled(id=wait.id, reason=reason, outcome_unknown=True))
        elif wait.kind == "timer":
            self._issue(ev.TimerCancelled(id=wait.id))
        elif wait.kind == "signal":
            self._signal_waiters[wait.name].remove(branch)
        elif wait.kind == "wait_until":
            self._wait_until.remove(branch)
        elif wait.kind == "child":
            self._child_cancels.append((wait.id, wait.child_workflow_id, "request_cancel"))
        if wait.deadline is not None and wait.kind in ("signal", "wait_until", "hook"):
            self._issue(ev.TimerCancelled(id=wait.id))

    def _branch_done(self, branch: _Branch, result: Any, exc: BaseException | None) -> None:
        if branch is self._root:
            self._root_done(result, exc)
            return
        group = branch.group
        assert group is not None
        if exc is None:
            group.results[branch.index] = result
        elif group.first_error is None and not isinstance(exc, CancelledError):
            group.first_error = exc
            reason = f"branch {branch.path} failed: {type(exc).__name__}: {exc}"
            for sibling in group.branches:
                if sibling is not branch and not sibling.dead:
                    self._cancel_branch(sibling, reason)
        elif isinstance(exc, NondeterminismError | ContinueAsNew):
            group.first_error = group.first_error or exc
        group.remaining -= 1
        if group.remaining == 0:
            if group.first_error is not None:
                self._resume(group.parent, exc=group.first_error)
            elif group.cancelled is not None:
                self._resume(group.parent, exc=CancelledError(group.cancelled))
            else:
                self._resume(group.parent, group.results)

    def _root_done(self, result: Any, exc: BaseException | None) -> None:
        if isinstance(exc, NondeterminismError) or self._fatal is not None:
            self._fatal = self._fatal or exc
            return
        closing: ev.Event
        if exc is None:
            try:
                closing = ev.WorkflowCompleted(result=codec.dumps(result, path="result"))
            except DurableError as err:
                closing = ev.WorkflowFailed(error=codec.dumps(err, path="error"))
        elif isinstance(exc, ContinueAsNew):
            try:
                closing = ev.WorkflowContinuedAsNew(
                    args=codec.dumps(exc.args_, path="args"),
                    new_run_id=successor_run_id(self.run_id, self._now),
                )
            except DurableError as err:
                closing = ev.WorkflowFailed(error=codec.dumps(err, path="error"))
        elif isinstance(exc, CancelledError):
            closing = ev.WorkflowCancelled(reason=str(exc) or self._cancel_reason or "cancelled")
        else:
            closing = ev.WorkflowFailed(error=codec.dumps(exc, path="error"))
        self._close(closing)

    def _close(self, closing: ev.Event) -> None:
        try:
            self._issue(closing)
        except NondeterminismError:
            return
        self._closing = closing
        # Whatever live code still waits on is void now (only a failing signal
        # handler closes a run while branches are suspended).
        timers, activities, children = self._close_actions
        for b in self._live():
            w = b.wait
            if w is None:
                continue
            if w.kind == "activity":
                activities.append(w.id)
            if w.kind == "timer" or w.deadline is not None:
                timers.append(w.id)
            if w.kind == "child":
                children.append((w.id, w.child_workflow_id, w.policy))

    # ------------------------------------------------------------ decision
    def _warn_near_limit(self) -> None:
        """Log once per run, when the decision about to be committed passes 80% of the budget."""
        if self._budget_warned or self._read_only or self._instance is None:
            return
        budget = self.history_budget()
        if near_history_limit(self._history_end, self._bytes_end, budget):
            self._budget_warned = True  # an earlier decision passed it (and warned)
            return
        events, size = self._history_total()
        if near_history_limit(events, size, budget):
            self._budget_warned = True
            log.warning(
                "run %s of workflow %r (%s) is near its history budget: %d events, %d bytes of %s; "
                "call continue_as_new() when should_continue_as_new() is true",
                self.run_id,
                self.workflow_id,
                self.workflow_type,
                events,
                size,
                budget,
            )

    def _decision(self, consumed: int) -> Decision:
        self._warn_near_limit()
        status = self.status
        scheduled: dict[str, ev.ActivityScheduled] = {}
        timers: dict[str, int] = {}
        cancelled_timers: list[str] = []
        cancelled_activities: list[str] = []
        children: list[ev.ChildStarted] = []
        hooks: list[ev.HookCreated] = []
        for event in self._new:
            if isinstance(event, ev.ActivityScheduled):
                scheduled[event.id] = event
            elif isinstance(event, ev.ActivityCancelled):
                if scheduled.pop(event.id, None) is None:
                    cancelled_activities.append(event.id)
            elif isinstance(event, ev.TimerStarted):
                timers[event.id] = event.fire_at
            elif isinstance(event, ev.SignalWaitStarted) and event.deadline is not None:
                timers[event.id] = event.deadline
            elif isinstance(event, ev.TimerCancelled):
                if timers.pop(event.id, None) is None:
                    cancelled_timers.append(event.id)
            elif isinstance(event, ev.ChildStarted):
                children.append(event)
            elif isinstance(event, ev.HookCreated):
                hooks.append(event)
        close_timers, close_activities, close_children = self._close_actions
        for tid in close_timers:
            if timers.pop(tid, None) is None:
                cancelled_timers.append(tid)
        for aid in close_activities:
            if scheduled.pop(aid, None) is None:
                cancelled_activities.append(aid)
        return Decision(
            expected_seq=self._seq,
            events=list(self._out),
            consumed=consumed,
            dropped=list(self._dropped),
            activities=list(scheduled.values()),
            timers=list(timers.items()),
            cancelled_timers=cancelled_timers,
            cancelled_activities=cancelled_activities,
            children=children,
            cancelled_children=[*self._child_cancels, *close_children],
            hooks=hooks,
            closing=self._closing if any(e is self._closing for e in self._new) else None,
            status=status,
            snapshot=self.snapshot(status),
        )


def _pick(override: Any, default: float | None, what: str) -> float | None:
    return to_seconds(override, what) if override is not None else default


def _signal_value(payload: bytes) -> Any:
    """A signal's arguments as ``await_signal`` returns them: one -> it, none -> None, more -> tuple."""
    args = codec.loads(payload)
    if isinstance(args, tuple | list):
        if len(args) == 0:
            return None
        if len(args) == 1:
            return args[0]
        return tuple(args)
    return args


def replay_history(entries: Sequence[ev.Entry], workflow: type[Workflow] | None = None) -> Driver:
    """Replay a whole history with today's code; raises NondeterminismError on divergence.

    Returns the driver (closed) so callers can read its status.
    """
    resolve = (lambda _name: workflow) if workflow is not None else get_workflow
    driver = Driver(resolve=resolve)
    try:
        driver.replay(entries)
    finally:
        driver.close()
    return driver
