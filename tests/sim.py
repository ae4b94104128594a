"""A deterministic in-memory simulator of the world around ONE run, for the pure replay driver.

This is not a Redis fake. It plays the part of everything outside a decision:
the start script (``WorkflowStarted`` at seq 1), the activity workers (it
calls the activity's Python function and counts the calls), the timer
scheduler, clients sending signals and cancel requests, and a lossy network
(duplicate and late deliveries). Each input is stamped with the simulated
clock when it is pushed onto the inbox, as the Redis script would.

A decision takes a prefix of the inbox, asks the driver for the decision,
appends ``decision.events`` to the history with consecutive seqs and then
calls ``committed()``. Two drivers can be kept side by side:

* the **cached** driver lives for the whole run and is fed incrementally;
* a **fresh** driver is rebuilt from the committed history before every
  decision (``compare=True``), and its decision must be identical.

Everything is driven by a ``random.Random``, so a seed reproduces a run.
"""

from __future__ import annotations

import random as _random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from durable import codec
from durable import events as ev
from durable.registry import get_activity
from durable.replay import Decision, Driver
from durable.workflow import Workflow

START_TS = 1_700_000_000_000
#: ``Sim.complete(id)`` without a result: execute the activity's function.
EXECUTE: Any = object()


def entry(seq: int, ts: int, event: ev.Event) -> ev.Entry:
    """A history entry as the store would hand it to the driver."""
    return ev.decode(ev.encode(event, ts), seq=seq)


def inbox_item(event: ev.Event, ts: int) -> ev.Entry:
    """An inbox item (seq 0) stamped with ``ts``."""
    return ev.decode(ev.encode(event, ts))


def decision_key(d: Decision) -> tuple[Any, ...]:
    """Everything a decision asks the store to do, comparable with ``==``."""
    return (
        d.expected_seq,
        d.events,
        d.consumed,
        d.dropped,
        [ev.encode(a, 0) for a in d.activities],
        d.timers,
        d.cancelled_timers,
        d.cancelled_activities,
        [ev.encode(c, 0) for c in d.children],
        d.cancelled_children,
        [ev.encode(h, 0) for h in d.hooks],
        ev.encode(d.closing, 0) if d.closing is not None else None,
        d.status,
        d.snapshot,
    )


class CapturingDriver(Driver):
    """A driver that records the bytes of every command the code issues (checked or new)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.issued: list[bytes] = []

    def _issue(self, event: ev.Event) -> None:
        super()._issue(event)
        self.issued.append(ev.encode(event, self._now))


@dataclass
class Sim:
    """The outside world of one run.

    Args:
        workflow: The workflow class (or registered name).
        args: Arguments of ``handle()``.
        rng: Source of every random choice (order, batching, faults).
        compare: Rebuild a fresh driver before every decision and check that
            its decision is identical to the cached driver's.
        activities: Optional overrides ``name -> fn`` for executing activities
            (default: the registered function).
        patches: ``WorkflowStarted.patches``.
    """

    workflow: type[Workflow] | str
    args: tuple[Any, ...] = ()
    rng: _random.Random = field(default_factory=lambda: _random.Random(0))
    compare: bool = True
    activities: dict[str, Callable[..., Any]] = field(default_factory=dict)
    patches: list[str] = field(default_factory=list)
    run_id: str = "run-1"
    workflow_id: str = "wf-1"
    clock: int = START_TS
    #: Probability of duplicate / late deliveries in :meth:`step`.
    fault_rate: float = 0.15
    #: Workflow type name -> class, for the drivers (default: the registry).
    resolve: Callable[[str], type[Workflow]] | None = None

    def __post_init__(self) -> None:
        name = self.workflow if isinstance(self.workflow, str) else self.workflow.name
        self.type_name = name
        started = ev.WorkflowStarted(
            workflow_type=name,
            workflow_id=self.workflow_id,
            run_id=self.run_id,
            args=codec.dumps(tuple(self.args)),
            patches=list(self.patches),
        )
        self.history: list[ev.Entry] = [entry(1, self.clock, started)]
        self.inbox: list[bytes] = []
        self.pending_activities: dict[str, ev.ActivityScheduled] = {}
        self.timers: dict[str, int] = {}
        self.pending_children: dict[str, ev.ChildStarted] = {}
        self.hooks: dict[str, ev.HookCreated] = {}
        #: Raw inputs already delivered once (duplicates are re-pushed from here).
        self.delivered: list[bytes] = []
        #: Inputs whose command was cancelled: a late delivery must be dropped.
        self.late: list[bytes] = []
        self.calls: Counter[str] = Counter()
        self.decisions: list[Decision] = []
        self.inputs_per_decision: list[list[bytes]] = []
        self.dropped: list[tuple[bytes, str]] = []
        self.cancel_sent = False
        self.driver: Driver | None = None
        self.closing: ev.Event | None = None

    # ------------------------------------------------------------- inputs
    def tick(self, ms: int | None = None) -> int:
        self.clock += self.rng.randint(1, 500) if ms is None else ms
        return self.clock

    def push(self, event: ev.Event, ts: int | None = None) -> bytes:
        """Put an input on the inbox, stamped like the Redis script would."""
        raw = ev.encode(event, self.tick() if ts is None else ts)
        self.inbox.append(raw)
        return raw

    def execute(self, activity_id: str) -> ev.Event:
        """Run a pending activity's function once (an activity worker); return its outcome event."""
        sched = self.pending_activities[activity_id]
        fn = self.activities.get(sched.name) or get_activity(sched.name).fn
        self.calls[sched.name] += 1
        args = codec.loads(sched.args)
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the activity failed for good
            return ev.ActivityFailedEvent(id=activity_id, error=codec.dumps(exc), attempts=3)
        return ev.ActivityCompleted(id=activity_id, result=codec.dumps(result))

    def complete(
        self, activity_id: str, result: Any = EXECUTE, *, error: BaseException | None = None
    ) -> bytes:
        """Deliver an activity's outcome; without ``result``/``error`` the function is executed."""
        if result is EXECUTE and error is None:
            event = self.execute(activity_id)
        elif error is not None:
            event = ev.ActivityFailedEvent(id=activity_id, error=codec.dumps(error), attempts=3)
        else:
            event = ev.ActivityCompleted(id=activity_id, result=codec.dumps(result))
        self.pending_activities.pop(activity_id, None)
        raw = self.push(event)
        self.delivered.append(raw)
        return raw

    def fire(self, timer_id: str) -> bytes:
        """The scheduler fires a timer: stamped no earlier than its fire_at."""
        fire_at = self.timers.pop(timer_id)
        self.clock = max(self.clock, fire_at)
        raw = self.push(ev.TimerFired(id=timer_id), ts=self.clock)
        self.delivered.append(raw)
        return raw

    def signal(self, name: str, *args: Any) -> bytes:
        return self.push(ev.SignalReceived(name=name, payload=codec.dumps(tuple(args))))

    def cancel(self, reason: str = "user cancel") -> bytes:
        self.cancel_sent = True
        return self.push(ev.CancelRequested(reason=reason))

    def child_done(self, command_id: str, result: Any = None, *, status: str | None = None) -> bytes:
        self.pending_children.pop(command_id, None)
        if status is None:
            return self.push(ev.ChildCompleted(id=command_id, result=codec.dumps(result)))
        error = codec.dumps(result) if result is not None else None
        return self.push(ev.ChildFailed(id=command_id, error=error, status=status))

    def resume_hook(self, hook_id: str, *args: Any) -> bytes:
        return self.push(ev.HookResumed(id=hook_id, payload=codec.dumps(tuple(args))))

    def duplicate(self) -> bytes | None:
        """Re-deliver an input already delivered (at-least-once delivery)."""
        if not self.delivered:
            return None
        raw = self.rng.choice(self.delivered)
        item = ev.decode(raw)
        return self.push(item.event)

    def deliver_late(self) -> bytes | None:
        """Deliver the outcome of an activity or timer the workflow cancelled."""
        if not self.late:
            return None
        raw = self.late.pop(self.rng.randrange(len(self.late)))
        return self.push(ev.decode(raw).event)

    # ---------------------------------------------------------- decisions
    def fresh_driver(self, history: Iterable[ev.Entry] | None = None, cls: type[Driver] = Driver) -> Driver:
        kwargs: dict[str, Any] = {"resolve": self.resolve} if self.resolve is not None else {}
        driver = cls(run_id=self.run_id, workflow_id=self.workflow_id, **kwargs)
        # As a worker does: a run no decision was committed for yet runs its code live.
        driver.replay(list(self.history if history is None else history), undecided=not self.decisions)
        return driver

    def decide(self, n: int | None = None) -> Decision:
        """One decision over the first ``n`` inbox items (default: all)."""
        if self.closing is not None:
            raise AssertionError("the run is closed")
        n = len(self.inbox) if n is None else n
        raws, self.inbox = self.inbox[:n], self.inbox[n:]
        items = [ev.decode(raw) for raw in raws]
        fresh_key = None
        if self.compare:
            fresh = self.fresh_driver()
            try:
                fresh_key = decision_key(fresh.decide(items))
            finally:
                fresh.close()
        if self.driver is None:
            self.driver = self.fresh_driver()
        try:
            decision = self.driver.decide(items)
        except BaseException:
            self.driver.close()
            self.driver = None
            raise
        if fresh_key is not None and fresh_key != decision_key(decision):
            raise AssertionError(
                "cached and fresh drivers decided differently:\n"
                f"cached: {decision_key(decision)!r}\nfresh:  {fresh_key!r}"
            )
        self._commit(decision)
        self.inputs_per_decision.append(raws)
        return decision

    def _commit(self, d: Decision) -> None:
        assert d.expected_seq == self.history[-1].seq, (d.expected_seq, self.history[-1].seq)
        seq = self.history[-1].seq
        for raw in d.events:
            seq += 1
            self.history.append(ev.decode(raw, run_id=self.run_id, seq=seq))
        assert self.driver is not None
        self.driver.committed()
        self.decisions.append(d)
        self.dropped.extend(d.dropped)
        for a in d.activities:
            self.pending_activities[a.id] = a
        for tid, at in d.timers:
            self.timers[tid] = at
        for aid in d.cancelled_activities:
            sched = self.pending_activities.pop(aid, None)
            if sched is not None and self.rng.random() < 0.5:
                # The worker finishes anyway: a late result.
                self.late.append(ev.encode(self.execute_late(sched), 0))
        for tid in d.cancelled_timers:
            if self.timers.pop(tid, None) is not None and self.rng.random() < 0.5:
                self.late.append(ev.encode(ev.TimerFired(id=tid), 0))
        for c in d.children:
            self.pending_children[c.id] = c
        for cid, _wf, _policy in d.cancelled_children:
            self.pending_children.pop(cid, None)
        for h in d.hooks:
            self.hooks[h.id] = h
        if d.closing is not None:
            self.closing = d.closing

    def execute_late(self, sched: ev.ActivityScheduled) -> ev.Event:
        self.pending_activities[sched.id] = sched
        try:
            return self.execute(sched.id)
        finally:
            self.pending_activities.pop(sched.id, None)

    # ------------------------------------------------------- random driving
    def step(self, *, signals: Callable[[Sim], None] | None = None, cancel_rate: float = 0.0) -> Decision:
        """Push a random batch of inputs, then decide over a random prefix of the inbox."""
        rng = self.rng
        if self.driver is None and len(self.history) == 1:
            return self.decide()  # the first decision: run handle() up to its first wait
        pushed = 0
        ready: list[tuple[str, str]] = [("a", aid) for aid in self.pending_activities]
        ready += [("t", tid) for tid in self.timers]
        rng.shuffle(ready)
        for kind, ident in ready[: rng.randint(0, len(ready))]:
            if kind == "a":
                self.complete(ident)
            else:
                self.fire(ident)
            pushed += 1
        if signals is not None and rng.random() < 0.3:
            signals(self)
            pushed += 1
        if rng.random() < self.fault_rate and self.duplicate() is not None:
            pushed += 1
        if rng.random() < self.fault_rate and self.deliver_late() is not None:
            pushed += 1
        if not self.cancel_sent and rng.random() < cancel_rate:
            self.cancel()
            pushed += 1
        if not self.inbox:
            # Nothing happened by chance: make progress.
            if ready:
                kind, ident = ready[0]
                self.complete(ident) if kind == "a" else self.fire(ident)
            elif signals is not None:
                signals(self)
            else:
                self.cancel()
        n = rng.randint(1, len(self.inbox))
        return self.decide(n)

    def run(
        self,
        *,
        signals: Callable[[Sim], None] | None = None,
        cancel_rate: float = 0.0,
        max_steps: int = 400,
    ) -> ev.Event:
        """Drive the run until it closes; returns the closing event."""
        for _ in range(max_steps):
            if self.closing is not None:
                return self.closing
            self.step(signals=signals, cancel_rate=cancel_rate)
        if self.closing is None:
            raise AssertionError(f"run did not close in {max_steps} steps: {self.snapshot()}")
        return self.closing

    def check_replay(self, cls: type[Driver] | None = None) -> CapturingDriver:
        """Replay the whole history from scratch and check it reproduces every command byte for byte.

        Returns the (closed) driver. Activities are never executed by a replay;
        callers check their own side-effect counters.
        """
        driver = self.fresh_driver(cls=cls or CapturingDriver)
        assert isinstance(driver, CapturingDriver)
        try:
            commands = [e.raw for e in self.history if e.event.is_command]
            assert driver.issued == commands, "replay issued different command bytes"
            if self.closing is not None:
                assert driver.closed_run and driver.status == ev.STATUS_OF_CLOSING[self.closing.type]
                assert driver.decide([]).events == []
        finally:
            driver.close()
        return driver

    # --------------------------------------------------------------- views
    def snapshot(self) -> dict[str, Any]:
        return self.decisions[-1].snapshot if self.decisions else {}

    def result(self) -> Any:
        """The decoded outcome: the result, or the exception the run failed with."""
        c = self.closing
        if isinstance(c, ev.WorkflowCompleted):
            return codec.loads(c.result)
        if isinstance(c, ev.WorkflowFailedEvent):
            return codec.loads(c.error)
        return c

    def types(self) -> list[str]:
        return [e.type for e in self.history]

    def events(self, type_name: str) -> list[ev.Event]:
        return [e.event for e in self.history if e.type == type_name]

    def close(self) -> None:
        if self.driver is not None:
            self.driver.close()
            self.driver = None
