"""Property test of the replay driver: random workflow programs in a random world.

A program is a small AST (tuples) interpreted by one generic workflow,
``PropWorkflow``: activities (some failing, caught), timers, ``await_signal``
with and without timeout, ``wait_until`` on a counter that a ``@signal``
handler bumps, side effects (some raising), nested ``all()`` of sub-programs,
``try/except CancelledError`` cleanups, and raises caught by a guard. The
simulator (:mod:`tests.sim`) batches completions into decisions in a random
order, duplicates and delays deliveries, sends signals at random points and
now and then a cancel request.

Asserted for every example:

1. replaying the final history from scratch reproduces every command event
   byte for byte (and the closing), without calling any side-effect function;
2. the cached driver fed incrementally and a driver rebuilt from scratch
   before every decision produce identical decisions (checked by the sim);
3. mutating one recorded command (activity name or args, timer fire_at,
   signal name) makes the replay raise ``NondeterminismError``;
4. closed drivers leave no live greenlets.
"""

from __future__ import annotations

import gc
import random as _random
from typing import Any

import greenlet
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable import (
    ActivityFailed,
    CancelledError,
    NondeterminismError,
    SignalTimeout,
    Workflow,
    activity,
    all,
    await_signal,
    codec,
    now,
    side_effect,
    signal,
    timer,
    wait_until,
)
from durable import events as ev
from durable.replay import Driver
from durable.replay.branches import Branch
from tests.sim import Sim

SIDE_CALLS: list[Any] = []


class ProgError(Exception):
    pass


def prop_echo(k: Any) -> Any:
    return ["ok", k]


def prop_fail(k: Any) -> Any:
    raise ValueError(f"activity {k} failed")


def side(value: int, fail: bool) -> int:
    SIDE_CALLS.append(value)
    if fail:
        raise ProgError(f"side effect {value} failed")
    return value


class PropWorkflow(Workflow):
    def __init__(self) -> None:
        self.count = 0

    @signal
    def bump(self, n: int = 1) -> None:
        self.count += n

    def handle(self, prog: Any, catch_cancel: bool) -> Any:
        try:
            return self.run(prog)
        except CancelledError:
            if not catch_cancel:
                raise
            return ["cancel caught", activity(prop_echo, "undo")]

    def run(self, prog: Any) -> list[Any]:
        return [self.step(node) for node in prog]

    def step(self, node: Any) -> Any:  # noqa: C901 - one branch per node type
        op = node[0]
        if op == "act":
            _, k, fail = node
            try:
                return activity(prop_fail if fail else prop_echo, k)
            except ActivityFailed as e:
                return ["failed", type(e.cause).__name__, str(e.cause)]
        if op == "timer":
            timer(node[1])
            return now()
        if op == "sig":
            _, name, timeout = node
            try:
                return await_signal(name, timeout=timeout)
            except SignalTimeout:
                return "timeout"
        if op == "until":
            _, threshold, timeout = node
            return wait_until(lambda: self.count >= threshold, timeout=timeout)
        if op == "se":
            _, value, fail = node
            try:
                return side_effect(lambda: side(value, fail))
            except ProgError as e:
                return str(e)
        if op == "now":
            return now()
        if op == "raise":
            raise ProgError("raised")
        if op == "all":
            return all([lambda p=p: self.run(p) for p in node[1]])
        if op == "cleanup":
            _, body, cleanup = node
            try:
                return self.run(body)
            except CancelledError:
                self.run(cleanup)
                raise
        if op == "guard":
            try:
                return self.run(node[1])
            except (ProgError, ActivityFailed) as e:
                return ["guarded", str(e)]
        raise AssertionError(f"unknown node {node!r}")


# ------------------------------------------------------------- strategies
leaf = st.one_of(
    st.tuples(st.just("act"), st.integers(0, 9), st.booleans()),
    st.tuples(st.just("timer"), st.integers(0, 30)),
    st.tuples(st.just("sig"), st.sampled_from(["s1", "s2"]), st.none() | st.integers(1, 60)),
    st.tuples(st.just("until"), st.integers(1, 3), st.none() | st.integers(1, 60)),
    st.tuples(st.just("se"), st.integers(0, 9), st.booleans()),
    st.just(("now",)),
)


def _composite(sub: st.SearchStrategy[list[Any]]) -> st.SearchStrategy[list[Any]]:
    # A branch of all() sometimes ends in a raise: fail-fast of its siblings.
    branch = st.one_of(sub, sub.map(lambda p: [*p, ("raise",)]))
    node = st.one_of(
        leaf,
        st.tuples(st.just("all"), st.lists(branch, min_size=1, max_size=3)),
        st.tuples(st.just("cleanup"), sub, sub),
        st.tuples(
            st.just("guard"), st.lists(st.tuples(st.just("all"), st.lists(branch, min_size=1, max_size=3)))
        ),
    )
    return st.lists(node, max_size=5)


_blocks = st.recursive(st.lists(leaf, min_size=1, max_size=4), _composite, max_leaves=20)
#: A program: a few blocks in sequence (hypothesis draws small recursive values).
programs = st.lists(_blocks, min_size=1, max_size=3).map(lambda blocks: [n for b in blocks for n in b])


def send_signal(sim: Sim) -> None:
    r = sim.rng.random()
    if r < 0.4:
        sim.signal("bump", sim.rng.randint(1, 2))
    else:
        name = sim.rng.choice(["s1", "s2"])
        args = sim.rng.choice([(), (sim.rng.randint(0, 9),), ("a", (1, 2))])
        sim.signal(name, *args)


def live_branches() -> list[Branch]:
    """Live greenlets of this module's runs (other tests' workers may hold their own)."""
    gc.collect()
    return [
        o
        for o in gc.get_objects()
        if isinstance(o, Branch) and not o.dead and o.runtime.workflow_type == PropWorkflow.name
    ]


def mutate(sim: Sim, rng: _random.Random) -> list[ev.Entry] | None:
    """The final history with one recorded command changed, or None if it has none to change."""
    kinds = ("ActivityScheduled", "TimerStarted", "SignalWaitStarted")
    candidates = [i for i, e in enumerate(sim.history) if e.type in kinds]
    if not candidates:
        return None
    i = rng.choice(candidates)
    old = sim.history[i]
    event = old.event
    if isinstance(event, ev.ActivityScheduled):
        if rng.random() < 0.5:
            new: ev.Event = ev.ActivityScheduled(**{**event.to_data(), "name": event.name + "_v2"})
        else:
            new = ev.ActivityScheduled(**{**event.to_data(), "args": codec.dumps(("changed",))})
    elif isinstance(event, ev.TimerStarted):
        new = ev.TimerStarted(id=event.id, fire_at=event.fire_at + 1)
    else:
        assert isinstance(event, ev.SignalWaitStarted)
        new = ev.SignalWaitStarted(id=event.id, name=event.name + "x", deadline=event.deadline)
    history = list(sim.history)
    history[i] = ev.decode(ev.encode(new, old.ts), seq=old.seq)
    return history


def run_example(prog: Any, catch_cancel: bool, rng: _random.Random, cancel_rate: float) -> Sim:
    sim = Sim(PropWorkflow, (prog, catch_cancel), rng=rng)
    try:
        sim.run(signals=send_signal, cancel_rate=cancel_rate, max_steps=600)
    finally:
        sim.close()
    return sim


@pytest.mark.timeout(300)  # 100 simulated runs: ~30 s on a slow 2-core machine, more under load
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
@given(
    prog=programs,
    catch_cancel=st.booleans(),
    rng=st.randoms(use_true_random=False),
    cancel_rate=st.sampled_from([0.0, 0.0, 0.03, 0.15]),
)
def test_random_programs_replay_deterministically(
    prog: Any, catch_cancel: bool, rng: _random.Random, cancel_rate: float
) -> None:
    # (2) is checked inside the simulator at every decision (compare=True).
    sim = run_example(prog, catch_cancel, rng, cancel_rate)
    assert sim.closing is not None

    # (1) full replay reproduces every command byte for byte, calling nothing.
    calls_before = len(SIDE_CALLS)
    activity_calls = sum(sim.calls.values())
    driver = sim.check_replay()
    assert len(SIDE_CALLS) == calls_before
    assert sum(sim.calls.values()) == activity_calls
    assert driver.status == ev.STATUS_OF_CLOSING[sim.closing.type]
    # Every decision consumed its inputs: each inbox item is in history or dropped, once.
    delivered = sum(len(raws) for raws in sim.inputs_per_decision)
    inputs = sum(1 for e in sim.history[1:] if not e.event.is_command)
    assert delivered == inputs + len(sim.dropped)

    # Bookkeeping: the run closed with nothing outstanding, each command settled once.
    assert sim.history[-1].event is not None and sim.history[-1].type == sim.closing.type
    settled: dict[str, int] = {}
    for e in sim.history:
        if e.type in (
            "ActivityCompleted",
            "ActivityFailed",
            "ActivityCancelled",
            "TimerFired",
            "TimerCancelled",
        ):
            settled[e.event.id] = settled.get(e.event.id, 0) + 1  # type: ignore[attr-defined]
    for e in sim.history:
        if e.type in ("ActivityScheduled", "TimerStarted") or (
            e.type == "SignalWaitStarted" and e.event.deadline is not None  # type: ignore[attr-defined]
        ):
            assert settled.get(e.event.id) == 1, (e.type, e.event.id)  # type: ignore[attr-defined]

    # (3) one mutated command -> NondeterminismError on replay.
    mutated = mutate(sim, rng)
    if mutated is not None:
        d = Driver(run_id=sim.run_id, workflow_id=sim.workflow_id)
        try:
            d.replay(mutated)
        except NondeterminismError as err:
            assert err.run_id == sim.run_id
        else:
            raise AssertionError("a mutated command replayed without NondeterminismError")
        finally:
            d.close()

    # (4) closed drivers leave no live greenlets.
    del driver, sim
    assert live_branches() == []


def count_objects() -> tuple[int, int]:
    """(greenlets, drivers) of this module's runs still in memory."""
    gc.collect()
    objects = gc.get_objects()
    greenlets = sum(
        1 for o in objects if isinstance(o, Branch) and o.runtime.workflow_type == PropWorkflow.name
    )
    drivers = sum(1 for o in objects if isinstance(o, Driver) and o.workflow_type == PropWorkflow.name)
    return greenlets, drivers


PROG = [
    ("act", 1, False),
    ("all", [[("act", 2, True), ("timer", 5)], [("cleanup", [("sig", "s1", None)], [("act", 3, False)])]]),
    ("until", 2, 30),
    ("se", 4, False),
    ("guard", [("raise",)]),
]


def test_memory_stays_flat_over_many_runs() -> None:
    for seed in range(20):
        run_example(PROG, seed % 2 == 0, _random.Random(seed), 0.1)
    assert count_objects() == (0, 0)
    greenlets_before = sum(1 for o in gc.get_objects() if isinstance(o, greenlet.greenlet))
    for seed in range(20, 220):
        run_example(PROG, seed % 2 == 0, _random.Random(seed), 0.1)
    # Every branch greenlet and every driver of 200 closed runs was collected.
    assert count_objects() == (0, 0)
    gc.collect()
    assert sum(1 for o in gc.get_objects() if isinstance(o, greenlet.greenlet)) <= greenlets_before + 5


def random_program(rng: _random.Random, depth: int = 0) -> list[Any]:
    """A larger program than hypothesis tends to draw (for the seeded test below)."""
    prog: list[Any] = []
    for _ in range(rng.randint(1, 6 if depth == 0 else 3)):
        r = rng.random()
        if depth < 3 and r < 0.15:
            branches = [random_program(rng, depth + 1) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.3:
                branches[rng.randrange(len(branches))].append(("raise",))
            node: Any = ("all", branches)
            prog.append(("guard", [node]) if rng.random() < 0.5 else node)
        elif depth < 3 and r < 0.25:
            prog.append(("cleanup", random_program(rng, depth + 1), random_program(rng, depth + 1)))
        else:
            prog.append(
                rng.choice(
                    [
                        ("act", rng.randint(0, 9), rng.random() < 0.2),
                        ("timer", rng.randint(0, 30)),
                        ("sig", rng.choice(["s1", "s2"]), rng.choice([None, rng.randint(1, 60)])),
                        ("until", rng.randint(1, 3), rng.choice([None, rng.randint(1, 60)])),
                        ("se", rng.randint(0, 9), rng.random() < 0.2),
                        ("now",),
                    ]
                )
            )
    return prog


def test_seeded_large_programs() -> None:
    for seed in range(60):
        rng = _random.Random(seed)
        prog = random_program(rng)
        sim = run_example(prog, rng.random() < 0.5, rng, rng.choice([0.0, 0.05]))
        assert sim.closing is not None
        sim.check_replay()
        mutated = mutate(sim, rng)
        if mutated is not None:
            d = Driver(run_id=sim.run_id)
            try:
                d.replay(mutated)
                raise AssertionError(f"seed {seed}: mutated history replayed")
            except NondeterminismError:
                pass
            finally:
                d.close()
    assert live_branches() == []
