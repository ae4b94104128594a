"""Updates in the pure replay driver: admission, handler branches, outcomes, replay (tests/sim.py)."""

from __future__ import annotations

from typing import Any

import pytest

from durable import (
    ConfigurationError,
    NondeterminismError,
    Workflow,
    activity,
    await_signal,
    codec,
    register_activity,
    signal,
    timer,
    update,
)
from durable import events as ev
from durable.replay import Driver
from tests.sim import Sim


@register_activity(name="upd_double")
def upd_double(x: int) -> int:
    return 2 * x


class UpdCounter(Workflow):
    """Waits for 'stop'; updates change its total, one through an activity and a timer."""

    def __init__(self) -> None:
        self.total = 0

    def handle(self) -> int:
        await_signal("stop")
        return self.total

    @update
    def add(self, n: int) -> int:
        self.total += n
        return self.total

    @add.validator
    def _check_add(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"cannot add {n}")

    @update(name="add_double")
    def add_double(self, n: int) -> int:
        doubled = activity(upd_double, n)
        timer(5)
        self.total += doubled
        return self.total

    @update
    def boom(self) -> None:
        raise KeyError("boom")

    @signal
    def note(self, text: str) -> None:
        self.total += 1000


@pytest.fixture
def sim() -> Any:
    s = Sim(UpdCounter)
    yield s
    s.close()


def request(s: Sim, uid: str, name: str, *args: Any) -> bytes:
    return s.push(ev.UpdateRequested(id=uid, name=name, args=codec.dumps(tuple(args))))


def outcome(s: Sim, uid: str) -> ev.Event:
    [found] = [
        e.event
        for e in s.history
        if isinstance(e.event, ev.UpdateCompleted | ev.UpdateRejectedEvent) and e.event.id == uid
    ]
    return found


def test_accepted_update_runs_its_handler_and_records_the_result(sim: Sim) -> None:
    sim.decide()
    request(sim, "u1", "add", 5)
    sim.decide()
    assert sim.types()[-2:] == ["UpdateAccepted", "UpdateCompleted"]
    done = outcome(sim, "u1")
    assert isinstance(done, ev.UpdateCompleted) and codec.loads(done.result) == 5
    sim.signal("stop")
    sim.decide()
    assert sim.result() == 5
    sim.check_replay()


def test_rejected_update_is_invisible_to_the_workflow(sim: Sim) -> None:
    sim.decide()
    request(sim, "u1", "add", -3)
    request(sim, "u2", "nope")
    sim.decide()
    assert sim.types()[-2:] == ["UpdateRejected", "UpdateRejected"]
    first, second = outcome(sim, "u1"), outcome(sim, "u2")
    assert isinstance(first, ev.UpdateRejectedEvent) and isinstance(codec.loads(first.error), ValueError)
    unknown = codec.loads(second.error)
    assert isinstance(unknown, ConfigurationError) and "no @update 'nope'" in str(unknown)
    assert "add_double" in str(unknown)
    sim.signal("stop")
    sim.decide()
    assert sim.result() == 0  # the rejected add(-3) never ran
    sim.check_replay()


def test_handler_with_activity_and_timer_interleaves_with_signals(sim: Sim) -> None:
    sim.decide()
    request(sim, "u1", "add_double", 4)
    d = sim.decide()
    [sched] = d.activities
    assert sched.id == "update:u1.1" and d.status == "running"
    sim.signal("note", "x")  # a signal handler runs while the update waits
    sim.complete(sched.id)
    d = sim.decide()
    [(tid, _)] = d.timers
    sim.fire(tid)
    sim.decide()
    done = outcome(sim, "u1")
    assert isinstance(done, ev.UpdateCompleted) and codec.loads(done.result) == 1008
    sim.signal("stop")
    sim.decide()
    assert sim.result() == 1008
    sim.check_replay()


def test_handler_error_is_the_update_outcome_not_the_runs(sim: Sim) -> None:
    sim.decide()
    request(sim, "u1", "boom")
    sim.decide()
    done = outcome(sim, "u1")
    assert isinstance(done, ev.UpdateCompleted) and isinstance(codec.loads(done.error), KeyError)
    assert sim.closing is None
    sim.signal("stop")
    sim.decide()
    assert sim.result() == 0
    sim.check_replay()


def test_a_repeated_update_id_is_applied_once(sim: Sim) -> None:
    sim.decide()
    request(sim, "u1", "add", 2)
    request(sim, "u1", "add", 2)
    d = sim.decide()
    assert [reason for _, reason in d.dropped] == ["update 'u1' was already applied in this run"]
    sim.signal("stop")
    sim.decide()
    assert sim.result() == 2
    sim.check_replay()


def test_replay_without_the_handler_is_nondeterminism(sim: Sim) -> None:
    sim.decide()
    request(sim, "u1", "add", 1)
    sim.decide()

    class Without(Workflow):
        name = "UpdCounterWithout"

        def handle(self) -> int:
            await_signal("stop")
            return 0

    driver = Driver(resolve=lambda _name: Without)
    try:
        with pytest.raises(NondeterminismError, match="no @update 'add'"):
            driver.replay(list(sim.history))
    finally:
        driver.close()
