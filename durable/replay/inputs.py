"""Applying events: input events resume branches, branches finish, runs close."""

from __future__ import annotations

import functools
import inspect
import os
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import codec, interceptors, typed_args
from .. import events as ev
from ..errors import (
    ActivityFailed,
    CancelledError,
    ChildWorkflowFailed,
    DurableError,
    HistoryCorrupt,
    NondeterminismError,
    SerializationError,
    SignalTimeout,
    WorkflowTaskFailed,
    error_text,
    frame_text,
)
from ..ids import successor_run_id
from ..interceptors import HandleInput, HandleSignalInput, WorkflowInboundInterceptor
from ..limits import current
from ..workflow import ContinueAsNew
from .branches import Branch, Wait, signal_value
from .updates import Updates, check_arguments


def undecodable_input(event: ev.Event) -> str | None:
    """Why a new signal or hook payload cannot be decoded (``None``: it can).

    Checked before the input is applied, so the workflow never sees it. Only inputs
    from outside (anyone allowed to signal) are checked: an activity or child result
    this worker cannot decode blocks the run until a deploy brings the type.
    """
    if isinstance(event, ev.SignalReceived):
        what, payload = f"SignalReceived {event.name!r}", event.payload
    elif isinstance(event, ev.HookResumed):
        what, payload = f"HookResumed {event.id!r}", event.payload
    else:
        return None
    try:
        codec.loads(payload)
    except SerializationError as exc:
        return f"{what}: {exc}"
    return None


@functools.cache
def _signature(func: Callable[..., Any]) -> inspect.Signature | None:
    """A handler's signature, worked out once: every new signal is checked against it."""
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):  # no signature to check against: the call says
        return None


def _binds(method: Callable[..., Any], args: tuple[Any, ...] | list[Any]) -> bool:
    """Whether a bound handler takes ``args`` (False too when that cannot be told cheaply)."""
    func = getattr(method, "__func__", None)
    signature = _signature(func) if func is not None else None
    if signature is None:
        return False
    try:
        signature.bind(None, *args)
    except TypeError:
        return False
    return True


class Inputs(Updates):
    """How history drives the code: one input event at a time, then the code runs to quiescence."""

    def _apply_committed(self, entry: ev.Entry) -> None:
        if self._owed and not (isinstance(entry.event, ev.SignalReceived) and entry.event.with_previous):
            self._run_owed()
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
                what = f"history records {event.type} {event.key[1]!r} at seq {entry.seq}, but the code did not issue it by then"
                if self._raised_at is not None:  # the code stopped there: what it raised is the news
                    raised, pos = self._raised_at
                    at = _where(raised)
                    what = (
                        f"the code raised {error_text(raised)}{f' ({at})' if at else ''} while replaying seq "
                        f"{pos}, but the history goes on (code changed before this point?)"
                    )
                raise self._nondeterminism(what, event.key[1], event.describe(), None)
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
            self._owed = isinstance(event, ev.SignalReceived)  # the next may join it (with_previous)
            if not self._owed:
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
        if isinstance(event, ev.ActivityCompleted | ev.ActivityFailedEvent):
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
            return self._signal(event)
        if isinstance(event, ev.ChildCompleted | ev.ChildFailed):
            return self._child_closed(event)
        if isinstance(event, ev.HookResumed):
            return self._hook_resumed(event)
        if isinstance(event, ev.UpdateAccepted | ev.UpdateRejectedEvent):
            return self._update_input(event)
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
        if isinstance(event, ev.WorkflowTimeoutFired):
            self._close(ev.WorkflowFailedEvent(error=codec.dumps(self._timeout_error(event), path="error")))
            return None
        raise HistoryCorrupt(
            f"run {self.run_id} seq {self._pos}: {event.type} cannot be applied as an input",
            run_id=self.run_id,
            seq=self._pos,
        )

    def _child_closed(self, event: ev.ChildCompleted | ev.ChildFailed) -> str | None:
        branch = self._waits.get(("child", event.id))
        if branch is None:
            self._detached_children.pop(event.id, None)  # closed: no policy to apply any more
            return f"no child {event.id!r} is pending"
        assert branch.wait is not None
        if branch.wait.cancelled is not None:  # its cancellation completed (or it closed anyway)
            self._resume(branch, exc=CancelledError(branch.wait.cancelled))
        elif isinstance(event, ev.ChildCompleted):
            self._resume(branch, codec.loads(event.result))
        else:
            cause = codec.loads(event.error) if event.error is not None else None
            self._resume(
                branch,
                exc=ChildWorkflowFailed(
                    f"child workflow {branch.wait.child_workflow_id!r} {event.status}"
                    + (f": {error_text(cause)}" if cause is not None else ""),
                    workflow_id=branch.wait.child_workflow_id,
                    status=event.status,
                    cause=cause,
                ),
            )
        return None

    def _hook_resumed(self, event: ev.HookResumed) -> str | None:
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
            self._resume(branch, signal_value(event.payload))
        return None

    def _expire_hook(self, hook_id: str) -> None:
        """A wait on a hook ended without a resume (deadline, cancel): the token dies with it."""
        self._hooks.discard(hook_id)
        self._hooks_expired.add(hook_id)
        self._expired_now.append(hook_id)

    def _start(self, event: ev.WorkflowStarted) -> None:
        self._started = event
        if not self.workflow_id:
            self.workflow_id = event.workflow_id
        if not self.run_id:
            self.run_id = event.run_id
        self._search = dict(event.search_attributes or {})
        memo = codec.loads(event.memo) if event.memo is not None else None
        self._memo = dict(memo) if isinstance(memo, dict) else {}
        cls = self._resolve(event.workflow_type)
        try:
            instance = cls()
        except Exception as exc:  # the code's bug: blocked until a deploy fixes it, as handle()'s
            at = _where(exc)
            err = WorkflowTaskFailed(
                f"{error_text(exc)} raised in {cls.__name__}.__init__{f' ({at})' if at else ''}: no "
                f"code of the run can run; deploy a fix, then `durable repair {self.workflow_id}`",
                run_id=self.run_id,
                error_type=type(exc).__name__,
                where=at,
            )
            raise err from exc
        self._instance, self._class = instance, cls
        # Replaying: WorkflowStarted is not the last entry (a decision followed it).
        request = HandleInput(self.run_info(), tuple(codec.loads(event.args)), self._replaying())
        self._root = self._spawn(
            "",
            lambda: interceptors.run(
                WorkflowInboundInterceptor, "handle", request, lambda i: _call_handle(instance, i.args)
            ),
        )
        self._runnable.append((self._root, None, None))

    def _activity_error(self, event: ev.ActivityFailedEvent, branch: Branch) -> ActivityFailed:
        assert branch.wait is not None
        cause = codec.loads(event.error)
        # By the error's type (a SerializationError's type_name is the value's that did not encode).
        cause_text = error_text(cause) if isinstance(cause, BaseException) else str(cause)
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
            self._expire_hook(wait.id)
            self._resume(branch, exc=SignalTimeout(f"hook {wait.name!r} was not resumed before the deadline"))
        else:  # pragma: no cover - deadlines exist only on the kinds above
            return f"timer {timer_id!r} has no waiter"
        return None

    def _signal(self, event: ev.SignalReceived) -> str | None:
        """Apply a signal; returns why a new one is dropped instead (a poison input)."""
        call = None
        if self._pos > self._history_end:
            # Decided live only. A dropped signal is kept beside the history (the run's log and
            # a dead letter), never in it, so no replay meets it; a signal in the history was
            # applied when it was recorded, and a replay applies it again as it was then.
            try:
                # Guarded as the handler is (the conversion used to run inside its call).
                call = self._guarded(f"signal handler {event.name!r}", lambda: self._signal_call(event))
            except Exception as exc:  # noqa: BLE001 - a validator's own error refuses the payload too
                why = str(exc) if isinstance(exc, DurableError) else error_text(exc)
                return f"poison: SignalReceived {event.name!r}: {why}"
        if not interceptors.active(WorkflowInboundInterceptor):
            self._apply_signal(event, call)
            return None
        # A committed signal was applied (and intercepted) by the decision that committed it.
        replaying = self._pos <= self._history_end
        request = HandleSignalInput(self.run_info(), event.name, event.payload, event.headers, replaying)
        interceptors.run(
            WorkflowInboundInterceptor, "handle_signal", request, lambda _i: self._apply_signal(event, call)
        )
        return None

    def _signal_call(self, event: ev.SignalReceived) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """The ``@signal`` handler and the arguments it gets (converted by its annotations), or
        ``None`` without a handler (``await_signal`` returns the payload as it was decoded).

        Raises:
            DurableError: the payload does not fit the handler: not an argument list, arguments
                its signature does not take, or one that does not convert to its declared type.
        """
        assert self._instance is not None
        attr = type(self._instance)._signals.get(event.name)
        if attr is None:
            return None
        args = codec.loads(event.payload)
        what = f"signal {event.name!r} of workflow {self.workflow_type!r}"
        if not isinstance(args, tuple | list):
            raise SerializationError(f"{what}: the payload is {type(args).__name__}, not a list of arguments")
        method = getattr(self._instance, attr)
        if not _binds(method, args):
            check_arguments(method, args, what)  # raises, naming the signature as written
        return typed_args.prepared(method, tuple(args))

    def _apply_signal(
        self, event: ev.SignalReceived, call: tuple[Callable[..., Any], tuple[Any, ...]] | None
    ) -> None:
        assert self._instance is not None
        handler = type(self._instance)._signals.get(event.name)
        if handler is not None:
            fn, args = call or (getattr(self._instance, handler), codec.loads(event.payload))
            try:
                self._guarded(f"signal handler {event.name!r}", lambda: fn(*args))
            # SystemExit too, as from handle(): it ended every worker that took the run.
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - an error in a handler fails the run
                if self._blocks(exc):
                    raise self._task_failed(exc, f"signal handler {event.name!r}") from exc
                self._close(ev.WorkflowFailedEvent(error=codec.dumps(exc, path="error")), raised=exc)
            return
        waiters = self._signal_waiters.get(event.name)
        if waiters:
            branch = waiters.pop(0)
            assert branch.wait is not None
            if branch.wait.deadline is not None:
                self._issue(ev.TimerCancelled(id=branch.wait.id))
            self._resume(branch, signal_value(event.payload))
        else:
            self._signals.setdefault(event.name, deque()).append((event, self._now, self._pos))

    def _cancel_branch(self, branch: Branch, reason: str) -> None:
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
        if wait.kind == "child" and wait.wait_cancel:
            # Asked to cancel, the child runs its cleanup; the branch raises once it has closed
            # (_child_closed): the run does not close, and apply its close policy, meanwhile.
            if wait.cancelled is None:
                wait.cancelled = reason
                self._child_cancels.append((wait.id, wait.child_workflow_id, "request_cancel"))
            return
        self._void_wait(branch, wait, reason)
        self._resume(branch, exc=CancelledError(reason))

    def _void_wait(self, branch: Branch, wait: Wait, reason: str) -> None:
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
            self._detached_children[wait.id] = (wait.child_workflow_id, wait.policy)
        elif wait.kind == "hook":
            self._expire_hook(wait.id)
        if wait.deadline is not None and wait.kind in ("signal", "wait_until", "hook"):
            self._issue(ev.TimerCancelled(id=wait.id))

    def _branch_done(self, branch: Branch, result: Any, exc: BaseException | None) -> None:
        if branch is self._root:
            self._root_done(result, exc)
            return
        if branch.update_id is not None:
            self._update_done(branch, result, exc)
            return
        group = branch.group
        assert group is not None
        if exc is None:
            group.results[branch.index] = result
        elif isinstance(exc, NondeterminismError):
            # Replay is over: cancelling the siblings would issue commands history lacks too, and
            # their error would hide this one (the first divergence, the one to report).
            group.first_error = group.first_error or exc
        elif group.first_error is None and not isinstance(exc, CancelledError):
            group.first_error = exc
            reason = f"branch {branch.path} failed: {error_text(exc)}"
            for sibling in group.branches:
                if sibling is not branch and not sibling.dead:
                    self._cancel_branch(sibling, reason)
        elif isinstance(exc, ContinueAsNew):
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
                closing = ev.WorkflowFailedEvent(error=codec.dumps(err, path="error"))
        elif isinstance(exc, ContinueAsNew):
            try:
                closing = ev.WorkflowContinuedAsNew(
                    args=codec.dumps(exc.args_, path="args"),
                    new_run_id=successor_run_id(self.run_id, self._now),
                )
            except DurableError as err:
                closing = ev.WorkflowFailedEvent(error=codec.dumps(err, path="error"))
        elif isinstance(exc, CancelledError):
            closing = ev.WorkflowCancelled(reason=str(exc) or self._cancel_reason or "cancelled")
        elif self._blocks(exc):
            self._task_failed(exc, "handle()")
            return
        else:
            closing = ev.WorkflowFailedEvent(error=codec.dumps(exc, path="error"))
        self._close(closing, raised=exc)

    def _blocks(self, exc: BaseException) -> bool:
        """Whether an error raised out of workflow code blocks the run instead of failing it."""
        if self._instance is None or isinstance(exc, DurableError):
            return False
        return isinstance(exc, type(self._instance).block_on_errors)

    def _task_failed(self, exc: BaseException, where: str) -> WorkflowTaskFailed:
        """Stop the decision on a blocking error (nothing of it is committed); the decider parks
        the run with this message until a fixed deploy is repaired in."""
        at = _where(exc)
        name = type(self._instance).__name__
        err = WorkflowTaskFailed(
            f"{error_text(exc)} raised in {where} of {self.workflow_type}"
            f"{f' ({at})' if at else ''}; the run is blocked, not failed ({name}.block_on_errors): "
            "deploy a fix, then `durable repair`",
            run_id=self.run_id,
            error_type=type(exc).__name__,
            where=at,
        )
        err.__cause__ = exc  # the worker logs its traceback
        self._fatal = self._fatal or err
        return err

    def _close(self, closing: ev.Event, raised: BaseException | None = None) -> None:
        if self._read_only and raised is not None and closing.key not in self._recorded:
            self._raised_at = (raised, self._pos)  # said if history goes on past this point
        elif (
            raised is not None
            and self._replay_pass
            and not self._replaying()
            and closing.key not in self._recorded
        ):
            # Raised applying history whose decisions went on from this point (a @signal handler
            # that gained a parameter, an old result read another way): the code changed, and the
            # run is blocked for a fix; failed, it could not be repaired (its last input being
            # the one replayed, no recorded command said so).
            at = _where(raised)
            self._nondeterminism(
                f"the code raised {error_text(raised)}{f' ({at})' if at else ''} while replaying seq "
                f"{self._pos}, which the code that recorded it went on from (code changed?)",
                closing.key[1],
                None,
                None,
            )
            return
        try:
            self._issue(closing)
        except NondeterminismError as err:
            if raised is not None and self._fatal is err:
                # The code failed where its history goes on: what it raised is the news (say a
                # TypeError of a changed handle() signature), not the failure event it implies.
                at = _where(raised)
                self._fatal = None
                self._nondeterminism(
                    f"the code raised {error_text(raised)}{f' ({at})' if at else ''} while replaying seq "
                    f"{self._pos}, but the history goes on (code changed before this point?)",
                    err.command_id,
                    err.recorded,
                    None,
                )
            return
        self._closing = closing
        self._void_on_close()

    def _terminate_for_limit(self, reason: str) -> None:
        """Close the run as terminated because it broke a limit (live decisions only).

        The ``WorkflowTerminated`` goes into the history as an input (as ``durable terminate``
        writes it), so a replay closes the run at the same point whatever the limits are then.
        """
        event = ev.WorkflowTerminated(reason=reason)
        self._out.append(ev.encode(event, self._now))
        self._new.append(event)
        self._closing = event
        self._void_on_close()
        self._kill_live()

    def _history_limit(self) -> str | None:
        """Why this decision's history breaks ``max_history_events``/``max_history_bytes``, or None."""
        events, size = self._history_total()
        limits = current()
        if events > limits.max_history_events:
            return self._history_full("max_history_events", events)
        if size > limits.max_history_bytes:
            return self._history_full("max_history_bytes", size)
        return None

    def _void_on_close(self) -> None:
        # Whatever live code still waits on is void now (only a failing signal
        # handler or a broken limit closes a run while branches are suspended).
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
        # Children a cancel detached from their child() call, still open: the policy applies to
        # them too (it said "terminate", and such a child outlived its parent for good).
        children.extend((cid, wid, policy) for cid, (wid, policy) in self._detached_children.items())


_DURABLE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _call_handle(instance: Any, args: tuple[Any, ...]) -> Any:
    """``instance.handle(*args)``; arguments it cannot take (a run started by type name, or before
    a deploy changed the signature) fail the run with a TypeError naming the method, where it is
    defined and what it takes: Python's own names none of them, and its traceback ends here."""
    handle = type(instance).handle
    mismatch = typed_args.call_mismatch(handle, args, skip=1)
    if mismatch is not None:
        code = getattr(inspect.unwrap(handle), "__code__", None)  # (pydantic-typed: its wrapper's)
        where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        name = f"{type(instance).__name__}.handle{where}"
        raise TypeError(f"{name} {mismatch}; the run was started with {len(args)} argument(s)")
    result = instance.handle(*args)
    if inspect.iscoroutine(result) or inspect.isgenerator(result) or inspect.isasyncgen(result):
        # ``handle = some_async_def`` set after the class statement (the class check missed it).
        getattr(result, "close", lambda: None)()  # no "never awaited" warning (an async generator has none)
        raise TypeError(
            f"{type(instance).__name__}.handle returned a {type(result).__name__}: workflow code is plain "
            "synchronous Python (a def, not async def or a generator); its durable calls suspend it"
        )
    return result


def _where(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of workflow code that raised ``exc``
    (durable's own frames left out: a call with the wrong arguments fails in the caller's);
    ``""`` when none is known."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith((_DURABLE, "<"))
    ]
    return frame_text(frames[-1]) if frames else ""
