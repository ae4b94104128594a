"""Unit tests of the replay driver: every durable call, every error, against the simulator.

Every decision in these tests is made twice (a cached driver fed incrementally
and a fresh driver rebuilt from history; ``Sim(compare=True)``) and every
finished run is replayed from scratch (``Sim.check_replay``).
"""

from __future__ import annotations

import dataclasses
import gc
import random as _random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durable import (
    DEFAULT_VERSION,
    ActivityFailed,
    CancelledError,
    ChildWorkflowFailed,
    ConfigurationError,
    DurableError,
    HistoryCorrupt,
    NondeterminismError,
    RetryPolicy,
    SignalTimeout,
    Workflow,
    WorkflowTaskFailed,
    activity,
    all,
    await_hook,
    await_signal,
    child,
    codec,
    continue_as_new,
    create_hook,
    get_version,
    hooktokens,
    now,
    patched,
    query,
    random,
    side_effect,
    signal,
    timer,
    uuid4,
    wait_until,
)
from durable import events as ev
from durable.replay import Driver
from durable.replay.branches import Branch
from tests.sim import START_TS, Sim, entry

# ------------------------------------------------------------- activities


def rt_add(a: Any, b: Any) -> Any:
    return a + b


def rt_fail(x: Any) -> Any:
    raise ValueError(f"nope {x}")


def rt_other(a: Any, b: Any) -> Any:
    return a


SIDE_CALLS: list[Any] = []


def counted(value: Any) -> Any:
    SIDE_CALLS.append(value)
    return value


@pytest.fixture(autouse=True)
def _reset_side_calls() -> None:
    SIDE_CALLS.clear()


@pytest.fixture
def sims() -> Any:
    """Make sims; close their drivers afterwards."""
    made: list[Sim] = []

    def make(*args: Any, **kwargs: Any) -> Sim:
        s = Sim(*args, **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def only(decision: Any, type_name: str) -> list[ev.Event]:
    return [ev.decode(raw).event for raw in decision.events if ev.decode(raw).type == type_name]


# ================================================================ activity
class RTActivity(Workflow):
    def handle(self, a: int, b: int) -> Any:
        return activity(rt_add, a, b)


def test_activity_result(sims: Any) -> None:
    s = sims(RTActivity, (2, 3))
    d = s.decide()
    assert d.status == "running"
    [sched] = d.activities
    assert (sched.id, sched.name, codec.loads(sched.args)) == ("1", "rt_add", (2, 3))
    assert [e.type for e in s.history] == ["WorkflowStarted", "ActivityScheduled"]
    s.complete("1")
    d = s.decide()
    assert d.status == "completed" and isinstance(d.closing, ev.WorkflowCompleted)
    assert s.result() == 5
    assert s.calls["rt_add"] == 1
    s.check_replay()


class RTActivityFails(Workflow):
    def handle(self, catch: bool) -> Any:
        try:
            return activity(rt_fail, 7)
        except ActivityFailed as e:
            if not catch:
                raise
            return [type(e.cause).__name__, str(e.cause), e.attempts, e.activity_id, e.activity_name]


def test_activity_failure_is_raised_with_cause(sims: Any) -> None:
    s = sims(RTActivityFails, (True,))
    s.decide()
    s.complete("1")  # executes rt_fail -> ActivityFailed(attempts=3)
    s.decide()
    assert s.result() == ["ValueError", "nope 7", 3, "1", "rt_fail"]
    s.check_replay()


def test_activity_failure_uncaught_fails_run(sims: Any) -> None:
    s = sims(RTActivityFails, (False,))
    s.decide()
    s.complete("1")
    d = s.decide()
    assert d.status == "failed"
    err = s.result()
    assert isinstance(err, ActivityFailed) and "nope 7" in str(err)
    s.check_replay()


# =================================================================== timer
class RTTimer(Workflow):
    def handle(self) -> Any:
        t0 = now()
        timer(5)
        t1 = now()
        timer(timedelta(minutes=2))
        timer(0)  # no event, returns at once
        return [t0, t1, now()]


def test_timer_seconds_and_timedelta(sims: Any) -> None:
    s = sims(RTTimer)
    d = s.decide()
    assert d.timers == [("1", START_TS + 5000)]
    assert d.status == "suspended"
    s.fire("1")
    fired_at = s.clock
    d = s.decide()
    [started] = only(d, "TimerStarted")
    assert started.id == "2" and started.fire_at == fired_at + 120_000
    assert d.timers == [("2", fired_at + 120_000)]
    s.fire("2")
    d = s.decide()
    t0, t1, t2 = s.result()
    assert t0 == datetime.fromtimestamp(START_TS / 1000, tz=UTC)
    assert t1 == datetime.fromtimestamp(fired_at / 1000, tz=UTC)
    assert t2 == datetime.fromtimestamp((fired_at + 120_000) / 1000, tz=UTC)
    assert s.types().count("TimerStarted") == 2
    s.check_replay()


# ============================================================ await_signal
class RTSignals(Workflow):
    def handle(self) -> Any:
        return [await_signal("go"), await_signal("go"), await_signal("go")]


def test_await_signal_payload_forms(sims: Any) -> None:
    s = sims(RTSignals)
    d = s.decide()
    [wait] = only(d, "SignalWaitStarted")
    assert (wait.id, wait.name, wait.deadline) == ("1", "go", None)
    s.signal("go")
    s.decide()
    s.signal("go", {"a": 1})
    s.decide()
    s.signal("go", 1, (2, 3))
    s.decide()
    assert s.result() == [None, {"a": 1}, (1, (2, 3))]
    s.check_replay()


class RTBuffered(Workflow):
    def handle(self) -> Any:
        activity(rt_add, 1, 1)
        return [await_signal("go"), await_signal("go"), await_signal("go")]


def test_await_signal_buffered_signal_needs_no_wait(sims: Any) -> None:
    s = sims(RTBuffered)
    s.decide()
    s.signal("go", 1)
    s.signal("go", 2)
    d = s.decide()
    assert d.snapshot["signals_buffered"] == {"go": 2}
    s.complete("1")
    s.decide()
    assert s.types().count("SignalWaitStarted") == 1  # only the third await waited
    assert s.events("SignalWaitStarted")[0].id == "4"
    s.signal("go", 3)
    s.decide()
    assert s.result() == [1, 2, 3]
    s.check_replay()


class RTFifo(Workflow):
    def handle(self) -> Any:
        return all([lambda: ("a", await_signal("x")), lambda: ("b", await_signal("x"))])


def test_await_signal_waiters_first_come_first_served(sims: Any) -> None:
    s = sims(RTFifo)
    s.decide()
    s.signal("x", 1)
    s.signal("x", 2)
    s.decide()
    assert s.result() == [("a", 1), ("b", 2)]
    s.check_replay()


class RTSignalTimeout(Workflow):
    def handle(self) -> Any:
        try:
            first = await_signal("go", timeout=10)
        except SignalTimeout as e:
            first = f"timeout: {e}"
        activity(rt_add, 1, 1)
        return [first, await_signal("go")]


def test_await_signal_timeout_then_later_signal_stays_buffered(sims: Any) -> None:
    s = sims(RTSignalTimeout)
    d = s.decide()
    [wait] = only(d, "SignalWaitStarted")
    assert wait.deadline == START_TS + 10_000
    assert d.timers == [("1", START_TS + 10_000)]
    s.fire("1")
    s.signal("go", "late")
    d = s.decide(1)  # only the timer: SignalTimeout
    assert [a.id for a in d.activities] == ["2"]
    d = s.decide()  # the signal: buffered (nobody waits)
    assert d.snapshot["signals_buffered"] == {"go": 1}
    s.complete("2")
    d = s.decide()
    assert "SignalWaitStarted" not in [ev.decode(r).type for r in d.events]  # served from the buffer
    first, second = s.result()
    assert first.startswith("timeout") and second == "late"
    s.check_replay()


def test_await_signal_signal_first_cancels_the_timer(sims: Any) -> None:
    s = sims(RTSignalTimeout)
    s.decide()
    s.signal("go", "on time")
    d = s.decide()
    assert [e.id for e in only(d, "TimerCancelled")] == ["1"]
    assert d.cancelled_timers == ["1"]
    s.push(ev.TimerFired(id="1"))  # the scheduler raced: dropped
    s.complete("2")
    d = s.decide()
    assert len(d.dropped) == 1 and "no timer '1'" in d.dropped[0][1]
    s.signal("go", "second")
    s.decide()
    assert s.result() == ["on time", "second"]
    s.check_replay()


def test_signal_timeout_and_signal_in_same_decision_same_order_rule(sims: Any) -> None:
    """Signal applied before the TimerFired: the signal wins and the fire is dropped."""
    s = sims(RTSignalTimeout)
    s.decide()
    s.signal("go", "first")
    s.timers.pop("1")
    s.push(ev.TimerFired(id="1"))
    d = s.decide()
    assert len(d.dropped) == 1 and "no timer '1'" in d.dropped[0][1]
    assert d.cancelled_timers == ["1"]  # started in an earlier decision
    assert [a.id for a in d.activities] == ["2"]


# ============================================================== wait_until
class RTWaitUntil(Workflow):
    def __init__(self) -> None:
        self.count = 0
        self.order: list[str] = []

    @signal
    def bump(self, n: int = 1) -> None:
        self.count += n

    def take(self, name: str) -> None:
        assert wait_until(lambda: self.count >= 1)
        self.count -= 1
        self.order.append(name)

    def handle(self) -> Any:
        all([lambda: self.take("a"), lambda: self.take("b")])
        ok = wait_until(lambda: self.count >= 100, timeout=30)
        return [self.order, ok, wait_until(lambda: True)]


def test_wait_until_wakes_first_registered_and_rechecks(sims: Any) -> None:
    s = sims(RTWaitUntil)
    d = s.decide()
    assert d.events == []  # wait_until without timeout records nothing
    s.signal("bump")
    s.decide()
    d = s.driver.snapshot()  # type: ignore[union-attr]
    assert [p["kind"] for p in d["pending"]] == ["wait_until"]  # "a" woke, "b" re-checked: false
    s.signal("bump", 1)
    d = s.decide()
    [t] = only(d, "TimerStarted")
    assert t.id == "2" and d.timers == [("2", t.fire_at)]
    s.fire("2")
    s.decide()
    assert s.result() == [["a", "b"], False, True]
    s.check_replay()


def test_wait_until_both_true_at_once(sims: Any) -> None:
    s = sims(RTWaitUntil)
    s.decide()
    s.signal("bump", 2)
    s.decide()
    s.signal("bump", 100)
    d = s.decide()
    assert only(d, "TimerCancelled")[0].id == "2" and d.timers == []  # started and cancelled: net nothing
    assert s.result() == [["a", "b"], True, True]
    s.check_replay()


# ============================================================= side_effect
class RTSideEffect(Workflow):
    def handle(self) -> Any:
        t = side_effect(lambda: counted((1, [2, 3])))
        try:
            side_effect(lambda: counted(1) / 0)
        except ZeroDivisionError as e:
            err = f"{type(e).__name__}: {e}"
        activity(rt_add, 1, 2)
        return [t, type(t).__name__, type(t[1]).__name__, err]


def test_side_effect_once_and_replayed(sims: Any) -> None:
    s = sims(RTSideEffect, compare=False)
    d = s.decide()
    assert len(SIDE_CALLS) == 2
    recorded = only(d, "SideEffectRecorded")
    assert codec.loads(recorded[0].value) == (1, [2, 3]) and recorded[0].error is None
    assert isinstance(codec.loads(recorded[1].error), ZeroDivisionError) and recorded[1].value is None
    s.complete("3")
    s.decide()
    assert len(SIDE_CALLS) == 2  # the cached driver did not call again
    live = s.result()
    assert live == [(1, [2, 3]), "tuple", "list", "ZeroDivisionError: division by zero"]
    s.check_replay()  # replays, with the recorded values
    assert len(SIDE_CALLS) == 2


class RTSideEffectDurable(Workflow):
    def handle(self) -> Any:
        try:
            side_effect(lambda: timer(1))
        except DurableError as e:
            return str(e)


def test_side_effect_function_may_not_make_durable_calls(sims: Any) -> None:
    s = sims(RTSideEffectDurable)
    s.decide()
    assert "not allowed inside a side_effect function" in s.result()


class RTRandom(Workflow):
    def handle(self) -> Any:
        return [uuid4(), random()]


def test_uuid4_and_random_are_recorded(sims: Any) -> None:
    s = sims(RTRandom, compare=False)
    s.decide()
    u, r = s.result()
    assert [codec.loads(e.value) for e in s.events("SideEffectRecorded")] == [u, r]
    s.check_replay()


# =================================================================== child
class RTChild(Workflow):
    def handle(self) -> Any:
        first = child(RTActivity, 1, 2)
        try:
            child("RTActivity", 3, 4, workflow_id="explicit-child")
        except ChildWorkflowFailed as e:
            return [first, e.status, e.workflow_id]


def test_child_result_and_failure(sims: Any) -> None:
    s = sims(RTChild)
    d = s.decide()
    [c] = d.children
    assert (c.id, c.workflow_type, c.workflow_id, codec.loads(c.args)) == (
        "1",
        "RTActivity",
        "wf-1/1",
        (1, 2),
    )
    assert d.status == "running"
    s.child_done("1", 3)
    d = s.decide()
    assert d.children[0].workflow_id == "explicit-child"
    s.child_done("2", status="cancelled")
    s.decide()
    assert s.result() == [3, "cancelled", "explicit-child"]
    s.check_replay()


class RTLongChildId(Workflow):
    def handle(self) -> Any:
        try:
            return child(RTActivity, 1, 2)
        except ConfigurationError as e:
            return str(e)


def test_a_default_child_id_past_the_id_limit_is_refused_and_one_recorded_before_replays(
    sims: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent whose id is near 256 characters: its child's default id ``<id>/1`` is past
    the limit, and the engine started a child no status, signal or terminate could name."""
    s = sims(RTLongChildId, workflow_id="q" * 255)
    d = s.decide()
    assert d.children == [] and "(257 characters)" in s.result()
    assert "it is this child's default id" in s.result() and "give child() a workflow_id=" in s.result()
    s.check_replay()
    # A run that started such a child before the check replays as it was recorded.
    monkeypatch.setattr("durable.replay.commands._check_derived_id", lambda _id: None)
    before = sims(RTLongChildId, workflow_id="q" * 255)
    assert len(before.decide().children[0].workflow_id) == 257
    monkeypatch.undo()
    before.child_done("1", 3)
    before.decide()
    assert before.result() == 3
    before.check_replay()


# ===================================================================== all
class RTAll(Workflow):
    def handle(self) -> Any:
        return all(
            [
                lambda: activity(rt_add, 1, 0),
                lambda: all([lambda: activity(rt_add, 2, 0), lambda: [activity(rt_add, 3, 0), timer(1)]]),
                lambda: activity(rt_add, 4, 0),
            ]
        )


def test_all_results_in_input_order_and_ids(sims: Any) -> None:
    s = sims(RTAll)
    d = s.decide()
    assert sorted(a.id for a in d.activities) == ["1.1.1", "1.2.1.1.1", "1.2.1.2.1", "1.3.1"]
    for aid in ["1.3.1", "1.2.1.2.1", "1.1.1", "1.2.1.1.1"]:  # reverse-ish order
        s.complete(aid)
        s.decide()
    assert s.timers == {"1.2.1.2.2": s.timers["1.2.1.2.2"]}
    s.fire("1.2.1.2.2")
    s.decide()
    assert s.result() == [1, [2, [3, None]], 4]
    s.check_replay()


class RTFailFast(Workflow):
    def handle(self) -> Any:
        log: list[str] = []

        def failing() -> Any:
            return activity(rt_fail, "x")

        def sibling() -> Any:
            try:
                return activity(rt_add, 1, 1)
            except CancelledError as e:
                log.append(f"cancelled: {e}")
                log.append(activity(rt_add, "clean", "up"))
                raise

        def early() -> Any:
            try:
                return activity(rt_add, 2, 2)
            finally:
                log.append("early finally")

        try:
            all([sibling, failing, early])
        except ActivityFailed as e:
            return ["caught", e.activity_id, log]


def test_all_fail_fast_cancels_siblings_and_waits_for_their_cleanup(sims: Any) -> None:
    s = sims(RTFailFast)
    s.decide()
    s.complete("1.2.1")  # rt_fail -> ActivityFailed
    d = s.decide()
    cancelled = only(d, "ActivityCancelled")
    assert [c.id for c in cancelled] == ["1.1.1", "1.3.1"]
    assert [c.outcome_unknown for c in cancelled] == [True, True]
    assert "branch 1.2 failed" in cancelled[0].reason
    assert sorted(d.cancelled_activities) == ["1.1.1", "1.3.1"]
    assert [a.id for a in d.activities] == ["1.1.2"]  # the cleanup
    assert d.closing is None  # the error waits for the cleanup
    s.complete("1.1.2")
    s.decide()
    tag, aid, log = s.result()
    assert (tag, aid) == ("caught", "1.2.1")
    assert log[0].startswith("cancelled: branch 1.2 failed") and log[1:] == ["early finally", "cleanup"]
    s.check_replay()


class RTFailFastUnstarted(Workflow):
    def handle(self) -> Any:
        def boom() -> Any:
            raise KeyError("at once")

        try:
            all([boom, lambda: activity(rt_add, 1, 1)])
        except KeyError:
            return "caught"


def test_all_fail_fast_sibling_not_started_yet_is_cancelled(sims: Any) -> None:
    s = sims(RTFailFastUnstarted)
    d = s.decide()
    assert d.activities == [] and s.result() == "caught"
    s.check_replay()


class RTFailFastNested(Workflow):
    def handle(self) -> Any:
        after: list[str] = []

        def inner() -> Any:
            r = all([lambda: activity(rt_add, 1, 0), lambda: activity(rt_add, 2, 0)])
            after.append("inner all returned")  # must not happen: the inner all() is cancelled
            activity(rt_add, 3, 0)
            return r

        def failing() -> Any:
            timer(1)
            raise ValueError("fail")

        try:
            all([inner, failing])
        except ValueError:
            return after


def test_all_fail_fast_cancels_a_nested_all_in_its_caller(sims: Any) -> None:
    s = sims(RTFailFastNested)
    s.decide()
    s.fire("1.2.1")
    d = s.decide()
    assert [c.id for c in only(d, "ActivityCancelled")] == ["1.1.1.1.1", "1.1.1.2.1"]
    assert d.activities == []
    assert s.result() == []
    s.check_replay()


# ============================================================ cancellation
class RTSaga(Workflow):
    def handle(self, catch: bool) -> Any:
        def branch(i: int) -> Any:
            try:
                return activity(rt_add, i, 0)
            except CancelledError:
                activity(rt_add, "undo", str(i))
                raise

        try:
            all([lambda: branch(1), lambda: branch(2)])
        except CancelledError:
            activity(rt_add, "undo", "root")
            if catch:
                return "compensated"
            raise


@pytest.mark.parametrize("catch", [False, True])
def test_cancel_requested_branches_first_then_caller(sims: Any, catch: bool) -> None:
    s = sims(RTSaga, (catch,))
    s.decide()
    s.cancel("stop it")
    d = s.decide()
    assert d.status == "cancelling"
    types = [(e.type, getattr(e, "id", "")) for e in map(lambda r: ev.decode(r).event, d.events)]
    assert types == [
        ("CancelRequested", ""),
        ("ActivityCancelled", "1.1.1"),
        ("ActivityCancelled", "1.2.1"),
        ("ActivityScheduled", "1.1.2"),
        ("ActivityScheduled", "1.2.2"),
    ]
    assert sorted(d.cancelled_activities) == ["1.1.1", "1.2.1"]
    s.complete("1.2.2")
    assert s.decide().activities == []  # the root waits for every branch
    s.complete("1.1.2")
    d = s.decide()
    assert [a.id for a in d.activities] == ["2"]
    s.complete("2")
    d = s.decide()
    if catch:
        assert d.status == "completed" and s.result() == "compensated"
    else:
        assert d.status == "cancelled" and isinstance(d.closing, ev.WorkflowCancelled)
        assert d.closing.reason == "stop it"
    s.push(ev.CancelRequested(reason="again"))  # nothing to apply on a closed run
    s.check_replay()


class RTParentOfKid(Workflow):
    def handle(self) -> Any:
        try:
            return child("RTKid")
        except CancelledError:
            return "parent saw the cancel"


def test_a_cancel_waits_for_the_childs_cancellation_then_raises(sims: Any) -> None:
    """As Temporal's default: the child is asked to cancel; child() raises once it has closed."""
    s = sims(RTParentOfKid)
    assert [c.id for c in s.decide().children] == ["1"]
    s.cancel("stop")
    d = s.decide()
    assert d.status == "cancelling" and d.closing is None
    assert d.cancelled_children == [("1", "wf-1/1", "request_cancel")]
    s.cancel("again")
    assert s.decide().cancelled_children == []  # asked once
    s.child_done("1", None, status="cancelled")
    assert s.decide().status == "completed" and s.result() == "parent saw the cancel"
    s.check_replay()


def test_a_child_recorded_before_cancels_waited_replays_raising_at_once(sims: Any) -> None:
    """A ChildStarted an older durable recorded (no wait_cancel) keeps the way that run began."""
    s = sims(RTParentOfKid)
    s.decide()
    at = next(i for i, e in enumerate(s.history) if isinstance(e.event, ev.ChildStarted))
    recorded = s.history[at]
    s.history[at] = entry(recorded.seq, recorded.ts, dataclasses.replace(recorded.event, wait_cancel=False))
    s.driver.close()
    s.driver = None
    s.cancel("stop")
    d = s.decide()
    assert d.status == "completed" and s.result() == "parent saw the cancel"
    # Asked to cancel, then terminated by the close policy in the same breath, as it was.
    assert d.cancelled_children == [("1", "wf-1/1", "request_cancel"), ("1", "wf-1/1", "terminate")]


class RTCountsOne(Workflow):
    def __init__(self) -> None:
        self.got: list[Any] = []

    @signal
    def add(self, value: Any) -> None:
        self.got.append(value)

    def handle(self) -> Any:
        wait_until(lambda: len(self.got) >= 1)
        return self.got


def test_the_signals_of_one_decision_apply_before_the_code_runs(sims: Any) -> None:
    """Two signals read together, the first of which satisfies the wait: both apply, then the
    code runs once (a Temporal activation's signals); the second was dropped, the run closed."""
    s = sims(RTCountsOne)
    s.decide()
    s.signal("add", 1)
    s.signal("add", 2)
    assert s.decide().status == "completed" and s.result() == [1, 2]
    signals = [e.event for e in s.history if isinstance(e.event, ev.SignalReceived)]
    assert [e.with_previous for e in signals] == [False, True]
    s.check_replay()


def test_signals_of_separate_decisions_replay_one_at_a_time(sims: Any) -> None:
    s = sims(RTHandlers)
    s.decide()
    s.signal("add", 1)
    s.decide()
    s.signal("add", 2)
    s.decide()
    assert not any(getattr(e.event, "with_previous", False) for e in s.history)
    s.signal("done")
    s.decide()
    s.check_replay()


class RTCancelPlain(Workflow):
    def handle(self) -> Any:
        try:
            timer(100)
        except Exception:  # noqa: BLE001 - must not catch CancelledError
            return "swallowed"


def test_cancel_is_not_swallowed_by_except_exception(sims: Any) -> None:
    s = sims(RTCancelPlain)
    s.decide()
    s.cancel()
    d = s.decide()
    assert d.status == "cancelled" and d.cancelled_timers == ["1"]
    s.cancel()
    s.check_replay()


def test_late_result_after_cancel_is_dropped(sims: Any) -> None:
    s = sims(RTSaga, (True,))
    s.decide()
    s.cancel()
    s.decide()
    s.push(ev.ActivityCompleted(id="1.1.1", result=codec.dumps(1)))  # the worker finished anyway
    d = s.decide()
    assert d.events == [] and len(d.dropped) == 1 and "1.1.1" in d.dropped[0][1]


# ===================================================================== now
class RTNow(Workflow):
    def handle(self) -> Any:
        a = now()
        activity(rt_add, 1, 1)
        return [a, now()]


def test_now_is_ts_of_last_applied_input(sims: Any) -> None:
    s = sims(RTNow)
    s.decide()
    s.complete("1")
    ts = s.clock
    s.decide()
    a, b = s.result()
    assert a == datetime.fromtimestamp(START_TS / 1000, tz=UTC)
    assert b == datetime.fromtimestamp(ts / 1000, tz=UTC)
    # Command events carry now() at issue.
    assert s.history[-1].ts == ts
    s.check_replay()


# ======================================================== versions, patches
class RTVerOld(Workflow):
    def handle(self) -> Any:
        return activity(rt_add, 1, 2)


class RTVerNew(Workflow):
    def handle(self) -> Any:
        v = get_version("fee", DEFAULT_VERSION, 2)
        r = activity(rt_add, 1, 2) if v == DEFAULT_VERSION else activity(rt_add, 10, 20)
        return [v, r, get_version("fee", DEFAULT_VERSION, 2)]


class RTVerDropped(Workflow):
    def handle(self) -> Any:
        get_version("fee", 3, 4)
        return activity(rt_add, 10, 20)


def test_get_version_new_run_records_max_without_consuming_an_id(sims: Any) -> None:
    s = sims(RTVerNew)
    d = s.decide()
    [marker] = only(d, "VersionMarker")
    assert (marker.id, marker.change_id, marker.version) == ("fee", "fee", 2)
    assert [a.id for a in d.activities] == ["1"]
    s.complete("1")
    s.decide()
    assert s.result() == [2, 30, 2]
    s.check_replay()


def test_get_version_replay_of_old_history_is_default(sims: Any) -> None:
    s = sims(RTVerOld)
    s.decide()
    s.complete("1")
    s.decide()
    d = Driver(run_id="run-1", resolve=lambda _: RTVerNew)
    d.replay(s.history)
    assert d.status == "completed"
    d.close()


def test_get_version_out_of_range_is_nondeterminism(sims: Any) -> None:
    s = sims(RTVerNew)
    s.decide()
    d = Driver(run_id="run-1", resolve=lambda _: RTVerDropped)
    with pytest.raises(NondeterminismError, match=r"recorded version 2, outside .*\[3, 4\]") as info:
        d.replay(s.history)
    assert info.value.command_id == "fee"
    d.close()


class RTPatched(Workflow):
    patches = ("p1", "p2")

    def handle(self) -> Any:
        return [patched("p1"), patched("p2")]


def test_patched_answers_from_workflow_started(sims: Any) -> None:
    s = sims(RTPatched, patches=["p1"])  # started by code that declared only p1
    s.decide()
    assert s.result() == [True, False]
    s.check_replay()


class RTForgotPatch(Workflow):
    patches = ("p1",)

    def handle(self) -> Any:
        return patched("send-sms")


def test_patched_of_a_patch_the_class_does_not_declare_blocks_the_run(sims: Any) -> None:
    """It answered False in every run, new ones too, and nothing said why."""
    s = sims(RTForgotPatch, patches=["p1"])
    with pytest.raises(
        WorkflowTaskFailed, match=r"patched\('send-sms'\) in RTForgotPatch: its class does not declare"
    ):
        s.decide()


# ======================================================== continue_as_new
class RTContinue(Workflow):
    def handle(self, n: int) -> Any:
        activity(rt_add, n, 1)
        continue_as_new(n + 1, "more")


def test_continue_as_new(sims: Any) -> None:
    s = sims(RTContinue, (4,))
    s.decide()
    s.complete("1")
    d = s.decide()
    assert d.status == "continued"
    assert isinstance(d.closing, ev.WorkflowContinuedAsNew)
    assert codec.loads(d.closing.args) == (5, "more") and d.closing.new_run_id
    s.check_replay()


# ===================================================================== hooks
class RTHook(Workflow):
    def handle(self) -> Any:
        hook = create_hook("approve", {"who": "bob"})
        return [hook.token, await_hook(hook)]


def test_hook_token_recorded_and_replayed(sims: Any) -> None:
    s = sims(RTHook, compare=False)  # a fresh token per live issue: cannot compare live drivers
    d = s.decide()
    [created] = d.hooks
    assert created.id == "1" and created.token.startswith("sha256:")
    assert codec.loads(created.metadata) == {"who": "bob"}
    fresh = s.fresh_driver()  # replay returns the recorded token (no new HookCreated)
    assert fresh.decide([]).events == []
    fresh.close()
    s.resume_hook("1", "yes")
    s.decide()
    token, value = s.result()
    # History records only the token's digest; replay derives the same token again.
    assert created.token == hooktokens.digest(token) and token not in created.token and value == "yes"
    s.check_replay()


# ============================================================ @signal/@query
class RTHandlers(Workflow):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    @signal
    def add(self, value: Any) -> None:
        if value == "durable":
            timer(1)
        if value == "boom":
            raise RuntimeError("handler failed")
        self.seen.append(value)

    @query
    def seen_so_far(self) -> list[Any]:
        return list(self.seen)

    @query(name="sneaky")
    def sneaky(self) -> Any:
        return activity(rt_add, 1, 1)

    def handle(self) -> Any:
        first = activity(rt_add, 1, 1)
        self.seen.append(("activity", first))
        await_signal("done")
        return self.seen


def test_signal_handlers_apply_in_history_order(sims: Any) -> None:
    s = sims(RTHandlers)
    s.decide()
    s.signal("add", 1)
    s.complete("1")
    s.signal("add", 2)
    s.decide()
    s.signal("done")
    s.decide()
    # One decision's signals apply before its other inputs (as in a Temporal activation), and
    # its history keeps the order they applied in: replay follows it.
    assert s.result() == [1, 2, ("activity", 2)]
    assert [e.type for e in s.history[1:5]] == [
        "ActivityScheduled",
        "SignalReceived",
        "SignalReceived",
        "ActivityCompleted",
    ]
    s.check_replay()


def test_query_answers_from_replayed_state_and_commits_nothing(sims: Any) -> None:
    s = sims(RTHandlers)
    s.decide()
    s.signal("add", "x")
    s.decide()
    s.signal("add", "y")  # still in the inbox: not visible to queries
    fresh = s.fresh_driver()
    assert fresh.query("seen_so_far") == ["x"]
    with pytest.raises(DurableError, match="not allowed inside a query"):
        fresh.query("sneaky")
    with pytest.raises(DurableError, match="has no @query 'nope'"):
        fresh.query("nope")
    assert fresh.decide([]).events == []
    fresh.close()
    assert s.driver.query("seen_so_far") == ["x"]  # type: ignore[union-attr]
    assert s.decide(0).events == []


@pytest.mark.parametrize(
    ("payload", "message"),
    [("durable", "not allowed inside a signal handler 'add'"), ("boom", "handler failed")],
)
def test_signal_handler_error_fails_the_run(sims: Any, payload: str, message: str) -> None:
    s = sims(RTHandlers)
    s.decide()
    s.signal("add", payload)
    d = s.decide()
    assert d.status == "failed" and message in str(s.result())
    assert d.cancelled_activities == ["1"]  # what the run waited on is void
    s.check_replay()


# =================================================================== ids
class RTIds(Workflow):
    def handle(self, second: str) -> Any:
        activity(rt_add, 1, 1, id="charge")
        activity(rt_add, 1, 1, id=second)


def test_explicit_ids(sims: Any) -> None:
    s = sims(RTIds, ("ship",))
    s.decide()
    s.complete("charge")
    d = s.decide()
    assert [a.id for a in d.activities] == ["ship"]
    s.close()
    s = sims(RTIds, ("charge",))
    s.decide()
    s.complete("charge")
    s.decide()
    assert isinstance(s.result(), ConfigurationError) and "'charge' is used twice" in str(s.result())
    s = sims(RTIds, ("9lives",))
    s.decide()
    s.complete("charge")
    s.decide()
    assert isinstance(s.result(), ConfigurationError) and "not starting with a digit" in str(s.result())


@pytest.mark.parametrize(
    "call",
    [
        lambda: activity(rt_add, 1, 2),
        lambda: timer(1),
        lambda: await_signal("x"),
        lambda: wait_until(lambda: True),
        lambda: side_effect(lambda: 1),
        lambda: all([]),
        lambda: now(),
        lambda: uuid4(),
        lambda: get_version("c", 1, 2),
        lambda: child("RTActivity"),
    ],
)
def test_calls_outside_a_workflow_raise(call: Any) -> None:
    with pytest.raises(DurableError, match=r"can only be made inside Workflow\.handle\(\)"):
        call()


# ========================================================== nondeterminism
class RTNdBase(Workflow):
    def handle(self) -> Any:
        activity(rt_add, 1, 2)
        timer(10)
        await_signal("go")
        return activity(rt_add, 3, 4)


class RTNdName(Workflow):
    def handle(self) -> Any:
        activity(rt_other, 1, 2)


class RTNdArgs(Workflow):
    def handle(self) -> Any:
        activity(rt_add, 1, 3)


class RTNdTimer(Workflow):
    def handle(self) -> Any:
        activity(rt_add, 1, 2)
        timer(11)


class RTNdSignal(Workflow):
    def handle(self) -> Any:
        activity(rt_add, 1, 2)
        timer(10)
        await_signal("went")


class RTNdMissing(Workflow):
    def handle(self) -> Any:
        activity(rt_add, 1, 2)
        await_signal("go")  # the timer is gone


class RTNdExtra(Workflow):
    def handle(self) -> Any:
        timer(1, id="new")  # issued before the recorded activity
        activity(rt_add, 1, 2)


def base_history(sims: Any) -> Sim:
    s = sims(RTNdBase)
    s.decide()
    s.complete("1")
    s.decide()
    s.fire("2")
    s.decide()
    s.signal("go")
    s.decide()
    s.complete("4")
    s.decide()
    s.check_replay()
    return s


@pytest.mark.parametrize(
    ("variant", "command_id", "recorded", "issued"),
    [
        (RTNdName, "1", "'name': 'rt_add'", "'name': 'rt_other'"),
        (RTNdArgs, "1", "'args': (1, 2)", "'args': (1, 3)"),
        # Its due times are epoch ms: the durations are said (an operator subtracted them).
        (RTNdTimer, "2", "'fire_at': ", "a timer of 10 s in history, of 11 s now (its duration changed"),
        (RTNdSignal, "3", "'name': 'go'", "'name': 'went'"),
    ],
)
def test_changed_command_is_nondeterminism(
    sims: Any, variant: type[Workflow], command_id: str, recorded: str, issued: str | None
) -> None:
    s = base_history(sims)
    d = Driver(run_id="run-1", resolve=lambda _: variant)
    with pytest.raises(NondeterminismError) as info:
        d.replay(s.history)
    err = info.value
    assert err.run_id == "run-1" and err.command_id == command_id
    assert "run-1" in str(err) and repr(command_id) in str(err)
    assert recorded in str(err) and "recorded:" in str(err) and "now:" in str(err)
    if issued:
        assert issued in str(err)
    assert err.recorded is not None and err.issued is not None
    d.close()
    assert not [b for b in gc.get_objects() if isinstance(b, Branch) and b.runtime is d and not b.dead]


class RTNdOptions(Workflow):
    """RTNdBase with other activity options: queue, retry policy, timeouts."""

    def handle(self) -> Any:
        activity(
            rt_add, 1, 2, queue="elsewhere", retry=RetryPolicy(max_attempts=9), start_to_close_timeout=20
        )
        timer(10)
        await_signal("go")
        return activity(rt_add, 3, 4, schedule_to_close_timeout=60)


def test_changed_activity_options_replay_and_the_recorded_ones_stay(sims: Any) -> None:
    """An edit of an activity's options is no divergence (it blocked every run that had scheduled
    the activity): the recorded options govern the activity scheduled then; the history keeps them."""
    s = base_history(sims)
    recorded = [e for e in s.history if getattr(e.event, "TYPE", "") == "ActivityScheduled"]
    d = Driver(run_id="run-1", resolve=lambda _: RTNdOptions)
    d.replay(s.history)  # no NondeterminismError
    assert d.status == "completed"
    assert [e.event.queue for e in recorded] == ["default", "default"]
    d.close()


def test_recorded_command_not_issued_is_nondeterminism(sims: Any) -> None:
    s = base_history(sims)
    d = Driver(run_id="run-1", resolve=lambda _: RTNdMissing)
    with pytest.raises(NondeterminismError) as info:
        d.replay(s.history)
    assert info.value.command_id in ("2", "3")  # the timer went missing; the wait moved up
    assert "seq" in str(info.value)
    d.close()


def test_command_issued_mid_replay_that_history_lacks(sims: Any) -> None:
    s = base_history(sims)
    d = Driver(run_id="run-1", resolve=lambda _: RTNdExtra)
    with pytest.raises(NondeterminismError, match="history has no such command") as info:
        d.replay(s.history)
    assert info.value.command_id == "new"
    d.close()


class RTNdWaitFirst(Workflow):
    def handle(self) -> Any:
        await_signal("go")  # takes id 1, where history has the activity
        activity(rt_add, 1, 2)


def test_a_command_of_another_kind_at_a_recorded_id_names_what_history_has(sims: Any) -> None:
    s = base_history(sims)
    d = Driver(run_id="run-1", resolve=lambda _: RTNdWaitFirst)
    with pytest.raises(NondeterminismError) as info:
        d.replay(s.history)
    message = str(info.value)
    assert (
        "SignalWaitStarted '1' was issued while replaying seq 1, but the history has ActivityScheduled '1'"
        in message
    )
    assert info.value.recorded is not None and "rt_add" in str(info.value.recorded)
    d.close()


class RTOrderA(Workflow):
    def handle(self) -> Any:
        timer(1)
        return all([lambda: activity(rt_add, 1, 0, id="a"), lambda: activity(rt_add, 2, 0, id="b")])


class RTOrderB(Workflow):
    def handle(self) -> Any:
        timer(1)
        return all([lambda: activity(rt_add, 2, 0, id="b"), lambda: activity(rt_add, 1, 0, id="a")])


def test_reordered_commands_are_nondeterminism(sims: Any) -> None:
    s = sims(RTOrderA)
    s.decide()
    s.fire("1")
    s.decide()
    d = Driver(run_id="run-1", resolve=lambda _: RTOrderB)
    with pytest.raises(NondeterminismError, match="reordered"):
        d.replay(s.history)
    d.close()


def test_nondeterminism_on_the_cached_path_too(sims: Any) -> None:
    """A driver that fails stays failed: later decide() calls re-raise until it is closed."""
    s = base_history(sims)
    d = Driver(run_id="run-1", resolve=lambda _: RTNdArgs)
    with pytest.raises(NondeterminismError):
        d.replay(s.history)
    with pytest.raises(NondeterminismError):
        d.decide([])
    d.close()


# ========================================================= corrupt history
def test_history_corrupt_unknown_type() -> None:
    raw = codec.pack({"type": "Bogus", "ts": 1, "data": {}})
    with pytest.raises(HistoryCorrupt, match=r"run r7 seq 5: unknown event type 'Bogus'") as info:
        ev.decode(raw, run_id="r7", seq=5)
    assert info.value.seq == 5 and info.value.run_id == "r7"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xc1", "not valid msgpack"),
        (codec.pack([1, 2]), "not a durable event"),
        (
            codec.pack({"type": "ActivityCompleted", "ts": 1, "data": {"id": "1"}}),
            r"missing field\(s\) \['result'\]",
        ),
        (codec.pack({"type": "ActivityCompleted", "ts": "x", "data": {}}), "malformed ts or data"),
    ],
)
def test_history_corrupt_malformed_entry(raw: bytes, message: str) -> None:
    with pytest.raises(HistoryCorrupt, match=message):
        ev.decode(raw, run_id="r7", seq=2)


def test_history_corrupt_seq_gap(sims: Any) -> None:
    s = base_history(sims)
    gapped = [s.history[0], *(ev.Entry(e.seq + 1, e.ts, e.event, e.raw) for e in s.history[1:])]
    d = Driver(run_id="run-1")
    with pytest.raises(HistoryCorrupt, match=r"run run-1: history jumps from seq 1 to 3") as info:
        d.replay(gapped)
    assert info.value.seq == 3
    d.close()


def test_history_corrupt_structure() -> None:
    d = Driver(run_id="r1")
    with pytest.raises(HistoryCorrupt, match="does not begin with WorkflowStarted"):
        d.replay([entry(1, START_TS, ev.TimerFired(id="1"))])
    d.close()
    started = ev.WorkflowStarted(workflow_type="RTTimer", workflow_id="w", run_id="r1", args=codec.dumps(()))
    twice = [
        entry(1, START_TS, started),
        entry(2, START_TS, ev.TimerStarted(id="1", fire_at=START_TS + 5000)),
        entry(3, START_TS, ev.TimerStarted(id="1", fire_at=START_TS + 5000)),
    ]
    d = Driver(run_id="r1")
    with pytest.raises(HistoryCorrupt, match="recorded twice"):
        d.replay(twice)
    d.close()


# ========================================================== dropped inputs
def test_duplicate_activity_completion_is_dropped(sims: Any) -> None:
    s = sims(RTNdBase)
    s.decide()
    raw = s.complete("1")
    s.push(ev.decode(raw).event)  # delivered twice in one batch
    d = s.decide()
    assert d.events.count(raw) == 1 and d.consumed == 2
    assert len(d.dropped) == 1 and "duplicate or late" in d.dropped[0][1]
    s.push(ev.decode(raw).event)  # and once more, later
    d = s.decide()
    assert d.events == [] and len(d.dropped) == 1
    assert s.types().count("ActivityCompleted") == 1
    s.check_replay()


# ================================================================ closing
def live_branches(driver: Driver) -> list[Branch]:
    gc.collect()
    return [b for b in gc.get_objects() if isinstance(b, Branch) and b.runtime is driver and not b.dead]


class RTFinally(Workflow):
    def handle(self) -> Any:
        def waiter(i: int) -> Any:
            try:
                return activity(rt_add, i, 0)
            finally:
                FINALLY.append(i)
                activity(rt_add, "in finally", "")  # refused: the driver is closing

        return all([lambda: waiter(1), lambda: waiter(2)])


FINALLY: list[int] = []


def test_close_kills_greenlets_and_refuses_calls(sims: Any) -> None:
    FINALLY.clear()
    s = sims(RTFinally, compare=False)
    s.decide()
    driver = s.driver
    assert driver is not None and len(live_branches(driver)) == 3
    s.close()
    assert sorted(FINALLY) == [1, 2]  # finally blocks ran (GreenletExit)
    assert live_branches(driver) == []
    with pytest.raises(DurableError, match="closed"):
        driver.decide([])
    with pytest.raises(DurableError, match="closed"):
        driver.replay([])
    driver.close()  # idempotent


def test_completed_run_leaves_no_live_greenlets(sims: Any) -> None:
    s = sims(RTAll)
    s.run()
    driver = s.driver
    assert driver is not None and live_branches(driver) == []
    s.close()


def test_random_runs_agree(sims: Any) -> None:
    """A quick seeded smoke run of the random driver over a few workflows."""
    for seed in range(20):
        s = sims(RTSaga, (seed % 2 == 0,), rng=_random.Random(seed))
        s.run(cancel_rate=0.3)
        s.check_replay()
        s.close()


class RTFanA(Workflow):
    def handle(self) -> Any:
        return all([lambda n=n: activity(rt_add, n, 0) for n in (1, 2, 3)])


class RTFanB(Workflow):  # the last two branches' arguments swapped
    def handle(self) -> Any:
        return all([lambda n=n: activity(rt_add, n, 0) for n in (1, 3, 2)])


def test_a_divergence_inside_all_names_the_branch_that_diverged(sims: Any) -> None:
    """It named a bogus ActivityCancelled of an unchanged sibling: the diverging branch's error
    cancelled the siblings, and the cancel, not in history either, raised over it."""
    s = sims(RTFanA)
    s.decide()
    d = Driver(run_id="run-1", resolve=lambda _: RTFanB)
    with pytest.raises(NondeterminismError) as caught:
        d.replay(s.history)
    d.close()
    assert "ActivityCancelled" not in str(caught.value), caught.value
    assert "ActivityScheduled '1.2.1'" in str(caught.value) and "(2, 0)" in str(caught.value), caught.value
    # ... and the line of workflow code that issued it (the developer's first question).
    assert "test_replay.py:" in caught.value.where and caught.value.where.endswith(" in <lambda>")
    assert f"(issued at {caught.value.where})" in str(caught.value)
