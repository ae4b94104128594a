"""The driver's state and the greenlet machinery every other part of it builds on."""

from __future__ import annotations

import traceback
from abc import abstractmethod
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import greenlet

from .. import events as ev
from ..errors import ConfigurationError, DurableError, NondeterminismError, Overrun, WorkflowTimeout
from ..frames import app_frame, code_position
from ..ids import check_command_id
from ..interceptors import RunInfo
from ..limits import LIMIT_REASON, current, limit_error
from ..options import Seconds, duration_ms
from ..registry import get_workflow
from ..runtime import WorkflowRuntime, forbid_durable_calls
from ..workflow import Workflow, effective_history_budget
from .branches import Branch, Wait


class DriverCore(WorkflowRuntime):
    """One run's replay state: branches, waits, the recorded history, the decision being built.

    :class:`~durable.replay.Driver` is this plus the durable calls
    (:mod:`.commands`), the application of input events (:mod:`.inputs`) and
    the lifecycle (:mod:`.driver`).
    """

    #: A check of recorded history against this code (``durable replay``, ``replay_history``):
    #: no run is blocked by what it finds.
    offline = False

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
        # Its class outlives close() (which drops the instance): a blocked reason names its patches.
        self._class: type[Workflow] | None = None
        self._started: ev.WorkflowStarted | None = None
        self._root: Branch | None = None
        self._branches: list[Branch] = []
        self._runnable: deque[tuple[Branch, Any, BaseException | None]] = deque()
        self._waits: dict[tuple[str, str], Branch] = {}
        self._signal_waiters: dict[str, list[Branch]] = {}
        self._wait_until: list[Branch] = []
        # Signals applied with no handler nor waiter, by name: (event, its time stamp, its seq),
        # for a later await_signal, or the next run if this one continues as new first.
        self._signals: dict[str, deque[tuple[ev.SignalReceived, int, int]]] = {}
        self._hook_payloads: dict[str, bytes] = {}
        self._hooks: set[str] = set()
        self._hooks_expired: set[str] = set()  # waits ended without a resume: tokens void
        self._expired_now: list[str] = []  # ... in the decision being made
        self._ids: set[str] = set()
        self._run_info: RunInfo | None = None
        self._update_ids: set[str] = set()  # updates applied (accepted or rejected) in this run
        self._versions: dict[str, int] = {}
        self._recorded: dict[tuple[str, str], ev.Entry] = {}
        self._matched: set[tuple[str, str]] = set()
        self._at_seq: dict[int, ev.Entry] = {}
        self._cursor = 0  # replay: seq of the last input applied or command matched
        self._seq = 0
        self._pos = 0
        self._history_end = 0
        #: The highest history format (durable.history_format) of the entries applied so far.
        self.history_format = 1
        self._bytes_end = 0  # raw bytes of the history up to _history_end
        self._bytes_at: dict[int, int] = {}  # replay: seq -> raw bytes of the history up to it
        self._budget_warned = False
        self._budget: dict[str, int] | None = None  # the class's history budget, once known
        self._now = 0
        self._out: list[bytes] = []
        self._sized = (0, 0)  # (events of _out counted, their bytes): see _out_size
        self._new: list[ev.Event] = []
        self._dropped: list[tuple[bytes, str]] = []
        self._carried: list[bytes] = []
        self._close_actions: tuple[list[str], list[str], list[tuple[str, str, str]]] = ([], [], [])
        self._child_cancels: list[tuple[str, str, str]] = []
        # Children whose wait a cancel ended (child() raised CancelledError, the cancel passed on)
        # and whose outcome has not come: still open, so the run's close applies their policy.
        self._detached_children: dict[str, tuple[str, str]] = {}
        self._closing: ev.Event | None = None
        # A decision's signals apply together, the code running once after the last of them (as
        # a Temporal activation's): after a signal the run is owed until the next input is
        # another signal (recorded with_previous) or something else comes (see _run_owed).
        self._owed = False
        self._cancel_reason: str | None = None
        self._fatal: BaseException | None = None
        # Read-only (a query): what the code raised where history holds no failure, at this seq.
        self._raised_at: tuple[BaseException, int] | None = None
        # A limit stopped the code (its reason, the run is then terminated); in replay, the seq
        # of such a recorded termination, past which the code never ran.
        self._halt: str | None = None
        self._limit_end: int | None = None
        self._pending: Counter[str] = Counter()  # branches waiting on an activity / a child
        self._callback: str | None = None
        self._closed = False
        self._search: dict[str, Any] = {}  # search attributes: name -> [type, value]
        self._memo: dict[str, Any] = {}
        self._replay_pass = False  # inside replay() of history an earlier decision already made

    @property
    def seq(self) -> int:
        """Last committed seq this driver has applied."""
        return self._seq

    @property
    def is_replaying(self) -> bool:
        """True while the code re-runs for history already decided (or answers a query): what
        it does now was done, and logged, before. The workflow logger is silent meanwhile."""
        return self._replay_pass or self._read_only

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
    def recorded_patches(self) -> tuple[str, ...]:
        """The patches the run recorded at start (``Workflow.patches`` of the code that started it)."""
        started = self.started
        return tuple(started.patches) if started is not None else ()

    @property
    def declared_patches(self) -> tuple[str, ...]:
        """``Workflow.patches`` of this process's class (what a run it starts records)."""
        return tuple(self._class.patches) if self._class is not None else ()

    @property
    def undeclared_patches(self) -> tuple[str, ...]:
        """The recorded patches this process's class does not declare: its code may predate them."""
        if self._class is None:
            return ()
        declared = set(self.declared_patches)
        return tuple(p for p in self.recorded_patches if p not in declared)

    @property
    def workflow_type(self) -> str:
        return self._started.workflow_type if self._started else ""

    @property
    def queue(self) -> str:
        return self._started.queue if self._started else "default"

    def run_info(self) -> RunInfo:
        """The run as interceptors see it (``headers``: its WorkflowStarted's)."""
        headers = self._started.headers if self._started is not None else {}
        info = self._run_info
        if info is None or info.headers is not headers:  # one per run, not per decision
            info = self._run_info = RunInfo(self.workflow_id, self.run_id, self.workflow_type, headers)
        return info

    def _headers(self) -> dict[str, Any]:
        """The headers an activity or child call starts with: a copy of its branch's, else the run's."""
        current = greenlet.getcurrent()
        if isinstance(current, Branch) and current.headers is not None:
            return dict(current.headers)
        return dict(self._started.headers) if self._started is not None and self._started.headers else {}

    def history_budget(self) -> dict[str, int]:
        """The run's history budget (its class's ``history_budget`` over the defaults)."""
        if self._budget is None or self._instance is None:
            budget = effective_history_budget(type(self._instance) if self._instance is not None else None)
            if self._instance is None:
                return budget
            self._budget = budget
        return dict(self._budget)

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
            self._bytes_end + self._out_size(),
        )

    def _enter(self) -> None:
        if self._closed:
            raise DurableError(f"driver of run {self.run_id} is closed")
        self._hub = greenlet.getcurrent()
        self._raise_fatal()

    def _live(self) -> list[Branch]:
        # Prune finished branches as we go: a long-lived cached run that calls
        # all() in a loop must not keep every dead greenlet until close().
        self._branches = [b for b in self._branches if not b.dead]
        return self._branches

    def _branch(self) -> Branch:
        g = greenlet.getcurrent()
        assert isinstance(g, Branch) and g.runtime is self
        return g

    def _next_id(self, branch: Branch, explicit: str | None) -> str:
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

    def _deadline(self, timeout: Seconds | None, what: str) -> int | None:
        if timeout is None:
            return None
        return self._now + duration_ms(timeout, what)

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
                    f"{key[0]} {key[1]!r} differs from history (seq {entry.seq}){_changed(entry, event, self._now)}",
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
        if self._replaying() and self._limit_end == self._cursor + 1:
            # History records that a limit terminated the run here: this command never ran.
            self._halt = "replayed limit"
            self._stop_at_frontier()
            return
        if self._replaying():
            # Another kind of command under the same id is the usual case (an activity where a
            # signal wait was): name it, it is what the code used to do there.
            other = next((e for (_, cid), e in self._recorded.items() if cid == key[1]), None)
            recorded = "no such command" if other is None else f"{other.type} {key[1]!r} at seq {other.seq}"
            raise self._nondeterminism(
                f"{key[0]} {key[1]!r} was issued while replaying seq {self._pos}, but the history has "
                f"{recorded} (code changed before this point?)",
                key[1],
                None if other is None else other.event.describe(),
                event.describe(),
            )
        raw = ev.encode(event, self._now)
        past = self._past_limit(len(raw)) if event.type not in ev.STATUS_OF_CLOSING else None
        if past is not None:
            # This command would pass the limit: stop the code here (the decision terminates the
            # run), not once the decision is made; a decision that closed the run was never
            # checked, and one all() of 100,000 side effects was one commit blocking Redis. The
            # run's own close is no command: it always fits (a full run can be cancelled).
            self._halt = past
            self._stop_at_frontier()
            return
        self._out.append(raw)
        self._new.append(event)

    def _past_limit(self, size: int) -> str | None:
        """Why one more event of ``size`` bytes would pass the history limits, or None."""
        limits = current()
        events = self._history_end + len(self._out) + 1
        if events > limits.max_history_events:
            return self._history_full("max_history_events", events)
        total = self._bytes_end + self._out_size() + size
        if total > limits.max_history_bytes:
            return self._history_full("max_history_bytes", total)
        return None

    def _out_size(self) -> int:
        """Bytes of the current decision's events, counted once each (commands only append;
        what changes an event already counted resets the count)."""
        counted, size = self._sized
        size += sum(len(raw) for raw in self._out[counted:])
        self._sized = (len(self._out), size)
        return size

    def _history_full(self, field: str, total: int) -> str:
        """The termination reason of a history of ``total`` (events or bytes) past ``field``."""
        err = limit_error(field, f"run {self.run_id} ({self.workflow_type}) history", total)
        return f"{LIMIT_REASON}{err} (continue_as_new() before should_continue_as_new() turns true keeps it short)"

    def _stop_at_frontier(self) -> None:
        """Read-only replay reached code beyond the committed history: park this branch for good."""
        g = greenlet.getcurrent()
        if isinstance(g, Branch) and g.runtime is self:
            g.wait = Wait("frontier", "")
            self._hub.switch()
            raise AssertionError("a branch parked at the frontier was resumed")  # pragma: no cover

    def _nondeterminism(self, what: str, command_id: str, recorded: Any, issued: Any) -> NondeterminismError:
        detail = ""
        if recorded is not None or issued is not None:
            detail = f" (recorded: {recorded!r}; now: {issued!r})"
        if self._read_only:
            then = (
                "This process's code does not replay the run's history (the run itself is not "
                "affected): query it with the code its workers run"
            )
        elif self.offline:
            then = (
                "Deployed, this code would block the run: make it decide as before (use "
                "get_version/patched for changes) before deploying it"
            )
        else:
            then = (
                "The run is blocked; deploy code that decides as before (use get_version/patched for "
                "changes), then `durable repair`"
            )
        where = _issued_at()
        err = NondeterminismError(
            f"nondeterminism in run {self.run_id} ({self.workflow_type}): {what}"
            f"{f' (issued at {where})' if where else ''}{detail}. {then}",
            run_id=self.run_id,
            command_id=command_id,
            recorded=recorded,
            issued=issued,
            where=where,
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
        with forbid_durable_calls(what):
            return fn()

    def _check_pending(self, kind: str, field: str) -> None:
        """Before a new activity or child: past its pending limit, stop the code (live only).

        The decision then terminates the run (:meth:`Inputs._terminate_for_limit`). Only
        live code is checked, so replay follows history whatever the limits are now.
        """
        if self._replaying() or self._read_only or self._pending[kind] < getattr(current(), field):
            return
        err = limit_error(
            field,
            f"run {self.run_id} ({self.workflow_type}) would have too many pending {kind} calls",
            self._pending[kind] + 1,
        )
        self._halt = f"{LIMIT_REASON}{err}"
        self._stop_at_frontier()

    def _suspend(self, branch: Branch, wait: Wait) -> Any:
        branch.wait = wait
        if wait.kind in ("activity", "child"):
            self._pending[wait.kind] += 1
        if wait.kind in ("activity", "child", "timer"):
            self._waits[(wait.kind, wait.id)] = branch
        if wait.deadline is not None and wait.kind != "timer":
            self._waits[("timer", wait.id)] = branch
        return self._hub.switch()

    def _resume(self, branch: Branch, value: Any = None, exc: BaseException | None = None) -> None:
        wait = branch.wait
        if wait is not None:
            if wait.kind in ("activity", "child"):
                self._pending[wait.kind] -= 1
            self._waits.pop((wait.kind, wait.id), None)
            if wait.deadline is not None:
                self._waits.pop(("timer", wait.id), None)
        branch.wait = None
        self._runnable.append((branch, value, exc))

    def _spawn(self, path: str, fn: Callable[[], Any]) -> Branch:
        branch: Branch

        def main(start: Any = None) -> None:
            try:
                if isinstance(start, BaseException):
                    raise start  # cancelled before it ever ran (see _run)
                result = fn()
            except greenlet.GreenletExit:
                return
            except Overrun as exc:  # a time limit stopped the code: the replay ends, nothing is routed
                self._fatal = self._fatal or exc
                return
            except BaseException as exc:  # noqa: BLE001 - every outcome is routed
                if not self._closed:  # closing: a finally block raised; nothing to route
                    self._branch_done(branch, None, exc)
                return
            if not self._closed:
                self._branch_done(branch, result, None)

        branch = Branch(self, path, main, self._hub)
        self._branches.append(branch)
        return branch

    def _run(self) -> None:
        """Run runnable branches to quiescence, then wake true ``wait_until`` waiters one by one."""
        hub = self._hub
        while True:
            while self._runnable and self._fatal is None and self._halt is None:
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
            if self._fatal is not None or self._halt is not None or not self._wake_one_waiter():
                break
        self._raise_fatal()
        if self._closing is not None:
            self._kill_live()

    def _run_owed(self) -> None:
        """Run the code the signals applied since it last ran are owed."""
        self._owed = False
        self._run()

    def _kill_live(self) -> None:
        """End every live branch but the caller's (the run closed)."""
        self._runnable.clear()
        for b in self._live():
            if b is not greenlet.getcurrent():
                try:
                    b.throw(greenlet.GreenletExit)
                except BaseException:  # noqa: BLE001
                    pass

    def _wake_one_waiter(self) -> bool:
        if not self._wait_until:  # the common case: no wait_until() pending (no copy to make)
            return False
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

    @abstractmethod
    def _branch_done(self, branch: Branch, result: Any, exc: BaseException | None) -> None:
        """Route the outcome of a branch that finished (see :mod:`.inputs`)."""

    def _timeout_error(self, event: ev.WorkflowTimeoutFired) -> WorkflowTimeout:
        """The cause a timed-out run fails with, from history alone (replay builds the same)."""
        assert self._started is not None
        options = self._started.options
        limit = options.get("execution_timeout_ms" if event.timeout == "execution" else "run_timeout_ms")
        within = f" of {limit / 1000:g} s" if isinstance(limit, int) else ""
        scope = "across its runs" if event.timeout == "execution" else "for this run"
        return WorkflowTimeout(
            f"workflow {self.workflow_id!r} timed out: its {event.timeout} timeout{within} ({scope}) passed",
            timeout=event.timeout,
        )

    def check_call_allowed(self) -> None:
        if self._callback is not None:
            raise DurableError(f"durable calls are not allowed inside a {self._callback}")
        if self._closed:
            raise DurableError(
                f"the driver of run {self.run_id} is closed; this workflow code may not continue"
            )
        if self._closing is not None:
            raise DurableError(f"run {self.run_id} has already closed; no more durable calls")


def _issued_at() -> str:
    """``file:line in function`` of the workflow code issuing the command being checked (``""``
    when no workflow code is running: the hub found a recorded command the code did not issue)."""
    if not isinstance(greenlet.getcurrent(), Branch):
        return ""
    stack = traceback.extract_stack()
    return code_position(stack) if app_frame(stack) is not None else ""


def _changed(entry: ev.Entry, event: ev.Event, now_ms: int) -> str:
    """What changed, in words, where the events' fields do not say it plainly: a timer's due
    time is epoch ms in both (an operator subtracted them to see "2 s became 3 s")."""
    if isinstance(event, ev.TimerStarted) and isinstance(entry.event, ev.TimerStarted):
        was, now = (entry.event.fire_at - entry.ts) / 1000, (event.fire_at - now_ms) / 1000
        return (
            f": a timer of {was:g} s in history, of {now:g} s now (its duration changed: runs that "
            "started the old one need it kept, behind patched())"
        )
    return ""
