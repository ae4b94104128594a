"""The :class:`Driver`: one run's lifecycle (replay, decide, commit, query, close)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import greenlet

from .. import codec, interceptors, registry
from .. import events as ev
from ..active_driver import set_active
from ..errors import (
    DurableError,
    HistoryCorrupt,
    NondeterminismError,
    QueryFailed,
    SerializationError,
    message_of,
)
from ..history_format import require as require_format
from ..interceptors import DecisionInput, HandleQueryInput, QueryWorkflowInput, WorkflowInboundInterceptor
from ..limits import LIMIT_REASON
from ..registry import get_workflow
from ..runtime import current_runtime
from ..workflow import Workflow, near_history_limit
from .commands import Commands
from .decision import Decision, build_decision
from .inputs import Inputs, undecodable_input
from .updates import check_arguments

log = logging.getLogger("durable.workflow")

_CLOSES_ANYWAY = (ev.CancelRequested, ev.WorkflowTerminated, ev.WorkflowTimeoutFired)
"""Inputs that close the run (or ask its code to): never refused for the history limits, so a
full run can still be cancelled, terminated or timed out."""


class Driver(Commands, Inputs):
    """Replays one run's history into greenlets and produces its decisions.

    Args:
        run_id: The run (for error messages and derived ids).
        workflow_id: The workflow instance id.
        resolve: Maps a workflow type name to its class (default: the registry).
        token_prefix: Prepended to hook tokens (the store routes tokens by it).
        read_only: For queries: code stops at the first command history does
            not hold (no side-effect function runs, nothing new is decided).
    """

    #: The inbox item :meth:`decide` is applying; when it raises, the item that blocks the run.
    applying: ev.Entry | None = None

    @property
    def seq_at(self) -> int:
        """The seq of the history entry being applied (the last one applied, between them)."""
        return self._pos

    def replay(self, entries: Sequence[ev.Entry], *, undecided: bool = False) -> Driver:
        """Apply committed history (from the driver's current seq on).

        Commands the code issues while the last entry is applied are new: they
        become part of the next :meth:`decide`.

        Args:
            entries: The history entries.
            undecided: No decision of this run was ever committed (its first): the code
                runs live, so the workflow logger is not silenced (:attr:`is_replaying`).
        """
        self.history_format = max(self.history_format, require_format(entries, self.run_id))
        self._enter()
        previous = set_active(self)
        self._replay_pass = not undecided
        try:
            return self._replay(entries)
        finally:
            self._replay_pass = False
            set_active(previous)

    def _replay(self, entries: Sequence[ev.Entry]) -> Driver:
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
            elif isinstance(entry.event, ev.WorkflowTerminated) and entry.event.reason.startswith(
                LIMIT_REASON
            ):
                self._limit_end = entry.seq
        for entry in entries:
            self._apply_committed(entry)
        if self._owed:
            self._run_owed()
        # Cancel requests to children replayed here were sent by the commits that recorded them.
        self._child_cancels = []
        self._recorded.clear()
        self._matched.clear()
        self._at_seq.clear()
        self._bytes_at.clear()
        return self

    def decide(self, inbox: Sequence[ev.Entry] = ()) -> Decision:
        """Apply new inbox items live and return the decision to commit (through the
        ``decide`` interceptors, see :mod:`durable.interceptors`)."""
        self.history_format = max(self.history_format, require_format(inbox, self.run_id))
        if not interceptors.active(WorkflowInboundInterceptor):
            return self._decide_live(inbox)
        request = DecisionInput(self.run_info(), inbox)
        decision: Decision = interceptors.run(
            WorkflowInboundInterceptor, "decide", request, lambda i: self._decide_live(i.inbox)
        )
        return decision

    def _decide_live(self, inbox: Sequence[ev.Entry]) -> Decision:
        # The workflow logger speaks only while this driver decides live.
        self._enter()
        previous = set_active(self)
        try:
            return self._decide(inbox)
        finally:
            set_active(previous)

    def _decide(self, inbox: Sequence[ev.Entry]) -> Decision:
        # Signals first (as Temporal applies an activation's): one that came with the input the
        # code returns on is applied, not dropped for a closed run. History keeps the order.
        signals_first = sorted(inbox, key=lambda item: not isinstance(item.event, ev.SignalReceived))
        for item in signals_first:
            joins = self._owed and isinstance(item.event, ev.SignalReceived) and self._closing is None
            if self._owed and not joins:
                self._run_owed_live()
            self.applying = item
            self._pos = self._history_end + 1 + len(self._out)
            if self._closing is not None:
                self._after_close(item)
                continue
            poison = undecodable_input(item.event)
            if poison is not None:  # a bad signal is a dead letter, not a crash of the run
                self._dropped.append((item.raw, f"poison: {poison}"))
                continue
            event, raw = item.event, item.raw
            if isinstance(event, ev.UpdateRequested):  # validated here, live only
                admitted = self._admit_update(event, item.ts)
                if isinstance(admitted, str):
                    self._dropped.append((raw, admitted))
                    continue
                event, raw = admitted
            past = None if isinstance(event, _CLOSES_ANYWAY) else self._past_limit(len(raw))
            if past is not None:  # applied, it would pass a history limit: the run ends here
                self._stop_for_limit(item, past)
                continue
            mark = len(self._out)
            self._out.append(raw)
            reason = self._deliver(event, item.ts)
            if reason is not None:
                del self._out[mark]
                self._sized = (0, 0)
                self._dropped.append((item.raw, reason))
                continue
            if isinstance(event, ev.SignalReceived):
                if joins:  # recorded so: a replay applies it with the one before, as here
                    self._out[mark] = ev.encode(dataclasses.replace(event, with_previous=True), item.ts)
                    self._sized = (0, 0)
                self._owed = True
                continue
            self._run_owed_live()
        if self._owed:
            self._run_owed_live()
        self.applying = None
        if self._closing is None:
            broken = self._halt or self._history_limit()
            if broken is not None:
                self._terminate_for_limit(broken)
        return self._decision(consumed=len(inbox))

    def _after_close(self, item: ev.Entry) -> None:
        """An input read after the run closed: a signal or cancel after a continue-as-new goes to
        the next run of the id; anything else is kept with the dropped inputs."""
        if isinstance(self._closing, ev.WorkflowContinuedAsNew) and isinstance(
            item.event, ev.SignalReceived | ev.CancelRequested
        ):
            self._carried.append(item.raw)  # the next run of the id applies it
        else:
            self._dropped.append((item.raw, f"run closed before {item.type} was applied"))

    def _stop_for_limit(self, item: ev.Entry, reason: str) -> None:
        """Terminate the run for ``reason`` before an input that would pass a history limit, and
        keep that input with the dropped ones (``describe().dropped``): one decision applying many
        large results wrote them all, then terminated the run, 3.6 MB under a 1 MB limit."""
        if self._owed:
            self._run_owed_live()  # the signals before it get their code run, as recorded
        if self._closing is not None:  # that code closed the run (continue_as_new: carried on)
            self._after_close(item)
            return
        self._terminate_for_limit(reason)
        self._dropped.append((item.raw, f"run terminated before {item.type} was applied: {reason}"))

    def _run_owed_live(self) -> None:
        self._run_owed()
        if self._halt is not None and self._closing is None:
            self._terminate_for_limit(self._halt)  # the inputs after it are dropped

    def committed(self) -> None:
        """The last decision was committed: its events are now history."""
        self._seq += len(self._out)
        self._history_end = self._seq
        self._bytes_end += self._out_size()
        self._out = []
        self._sized = (0, 0)
        self._new = []
        self._dropped = []
        self._carried = []
        self._expired_now = []
        self._child_cancels = []
        self._close_actions = ([], [], [])

    def query(self, name: str, args: Sequence[Any] = (), *, headers: Mapping[str, Any] | None = None) -> Any:
        """Answer a ``@query`` method from the replayed state (commits nothing)."""
        self._enter()
        if self._instance is None:
            raise DurableError(f"run {self.run_id} has not started; nothing to query")
        method = type(self._instance)._queries.get(name)
        if method is None:
            raise _no_query(self.workflow_type, type(self._instance), name)
        check_arguments(getattr(self._instance, method), args, f"@query {name!r}")
        request = HandleQueryInput(self.run_info(), name, tuple(args), headers or {})
        previous = set_active(self)  # a query answers from history: the workflow logger is silent
        try:
            result = self._guarded(
                f"query {name!r}",
                lambda: interceptors.run(
                    WorkflowInboundInterceptor,
                    "handle_query",
                    request,
                    lambda i: getattr(self._instance, method)(*i.args),
                ),
            )
        # SystemExit, KeyboardInterrupt too: raised on in a server's thread or the CLI, they ended
        # them (the code runs on a runner thread: a real Ctrl-C reaches the caller's, not this one).
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # the handler's fault: said as the query's
            raise QueryFailed(
                f"@query {name!r} of workflow {self.workflow_type!r} raised {type(exc).__name__}: "
                f"{message_of(exc)}",
                name=name,
                cause=exc,
            ) from exc
        finally:
            set_active(previous)
        try:  # as an update's result: a value the CLI, the HTTP API and other clients can carry
            codec.dumps(result, path=f"the result of @query {name!r}")
        except SerializationError as exc:
            raise QueryFailed(str(exc), name=name, cause=exc) from exc
        return result

    def snapshot(self, status: str | None = None, total: tuple[int, int] | None = None) -> dict[str, Any]:
        """The run's projection: status, pending steps and waits, buffered signals, history size.

        Args:
            status: :attr:`status`, when the caller has it already.
            total: :meth:`_history_total`, when the caller has it already.
        """
        events, size = total or self._history_total()
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
            if w.queue:
                item["queue"] = w.queue
            if w.child_workflow_id:
                item["workflow_id"] = w.child_workflow_id
                item["policy"] = w.policy
                if w.cancelled is not None:
                    item["cancel_asked"] = True
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

    def _warn_near_limit(self, events: int, size: int) -> None:
        """Log once per run (per cache load), at a decision whose code had should_continue_as_new()
        true from its start (the history before it passed 80% of the budget) and did not close the
        run (continue as new); ``events``, ``size``: the history with the decision. A loop that
        continues as new once it is true (the guide's) is never told to, though a decision of it
        crossed 80%."""
        if self._budget_warned or self._read_only or self._instance is None:
            return
        if self._closing is not None:  # it continues as new or ends: nothing more to grow
            return
        budget = self._budget or self.history_budget()
        if near_history_limit(self._history_end, self._bytes_end, budget):
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

    def _buffered_signals(self, decision: Decision) -> list[bytes]:
        """When ``decision`` continues the run as new: the signals it received and never awaited,
        in the order they came, as inbox items of the next run (they were dropped with this one,
        said nowhere, though a signal is addressed to the workflow id)."""
        if not isinstance(decision.closing, ev.WorkflowContinuedAsNew):
            return []
        waiting = sorted((pos, ts, event) for queue in self._signals.values() for event, ts, pos in queue)
        return [ev.encode(event, ts) for _, ts, event in waiting]

    def _decision(self, consumed: int) -> Decision:
        total = self._history_total()  # once: the budget warning and the snapshot both need it
        self._warn_near_limit(*total)
        status = self.status
        new = self._new
        decision = build_decision(
            expected_seq=self._seq,
            events=list(self._out),
            consumed=consumed,
            dropped=list(self._dropped),
            new=new,
            close_actions=self._close_actions,
            child_cancels=self._child_cancels,
            closing=self._closing
            if self._closing is not None and any(e is self._closing for e in new)
            else None,
            status=status,
            snapshot=self.snapshot(status, total),
        )
        decision.expired_hooks = list(self._expired_now)
        decision.carried = self._buffered_signals(decision) + self._carried
        kinds = {type(e) for e in new}
        if ev.SearchAttributesUpserted in kinds:
            decision.search_attributes = dict(self._search)
        if ev.MemoUpserted in kinds:
            decision.memo = codec.dumps(self._memo, path="memo")
        return decision

    @property
    def search_attributes(self) -> dict[str, Any]:
        """The run's search attributes as stored (``{name: [type, value]}``), at this point."""
        return dict(self._search)

    @property
    def memo(self) -> dict[str, Any]:
        """The run's memo at this point."""
        return dict(self._memo)


def current_driver() -> Driver:
    """The driver of the workflow branch running on this greenlet.

    Raises:
        DurableError: outside a running workflow, inside a signal handler,
            query, ``wait_until`` predicate or side-effect function, or on a
            closed driver.
    """
    runtime = current_runtime()
    if not isinstance(runtime, Driver):
        raise DurableError(f"this workflow code runs on {type(runtime).__name__}, not a replay Driver")
    return runtime


def query_history(
    entries: Sequence[ev.Entry],
    request: QueryWorkflowInput,
    run_id: str,
    token_prefix: str,
    hook_secrets: Callable[[], tuple[bytes, ...]],
) -> Any:
    """Answer the query ``request`` from a run's committed history (a read-only replay)."""
    require_format(entries, run_id)  # before the code is looked at: this release cannot replay it
    started = entries[0].event if entries else None
    if isinstance(started, ev.WorkflowStarted):  # an unknown name is refused before any code runs
        cls = registry.workflows().get(started.workflow_type)
        if cls is not None and request.name not in cls._queries:
            raise _no_query(started.workflow_type, cls, request.name)
    driver = Driver(run_id=run_id, workflow_id=request.workflow_id, read_only=True, token_prefix=token_prefix)
    driver.hook_secrets = hook_secrets
    try:
        driver.replay(entries)
        return driver.query(request.name, request.args, headers=request.headers)
    finally:
        driver.close()


def _no_query(workflow_type: str, cls: type[Workflow], name: str) -> DurableError:
    return DurableError(f"workflow {workflow_type!r} has no @query {name!r}; it has {sorted(cls._queries)}")


def replay_history(entries: Sequence[ev.Entry], workflow: type[Workflow] | None = None) -> Driver:
    """Replay a whole history with today's code; raises NondeterminismError on divergence.

    Returns the driver (closed) so callers can read its status.
    """
    resolve = (lambda _name: workflow) if workflow is not None else get_workflow
    started = entries[0].event if entries else None
    if isinstance(started, ev.WorkflowStarted):  # named by errors found before it is applied
        driver = Driver(resolve=resolve, run_id=started.run_id, workflow_id=started.workflow_id)
    else:
        driver = Driver(resolve=resolve)
    driver.offline = True
    try:
        driver.replay(entries)
    except NondeterminismError as err:
        if (
            isinstance(started, ev.WorkflowStarted)
            and workflow is not None
            and workflow.name != started.workflow_type
        ):
            # A new version under another name is a way to test a change; a wrong class is not.
            err.add_note(
                f"the history is of workflow type {started.workflow_type!r}, replayed with class "
                f"{workflow.__qualname__} (type {workflow.name!r}): is it the class you meant?"
            )
        raise
    finally:
        driver.close()
    return driver
