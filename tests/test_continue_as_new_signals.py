"""Signals are addressed to a workflow id: those a run could not apply because it continued as
new (read after the continue, or arriving while that decision was made), and those it received
but never awaited, go to the next run."""

from __future__ import annotations

from typing import Any

from waiting import wait_for

from durable import (
    SignalTimeout,
    Workflow,
    WorkflowStub,
    await_signal,
    continue_as_new,
    signal,
    timer,
    wait_until,
)
from durable.store.redis_store import RedisStore
from workers.decider import Decider
from workers.worker import Worker, WorkerThread


class TakesTwoPerRun(Workflow):
    """Each run applies two signals, then continues as new with what it has; the third ends."""

    def __init__(self) -> None:
        self.got: list[str] = []

    @signal
    def add(self, item: str) -> None:
        self.got.append(item)

    def handle(self, carried: list[str] | None = None, generation: int = 0) -> dict[str, Any]:
        carried = list(carried or [])
        wait_until(lambda: len(self.got) >= 2, timeout=30)
        carried += self.got
        if generation < 2:
            continue_as_new(carried, generation + 1)
        return {"generation": generation, "items": carried}


def test_the_signals_one_decision_reads_all_apply_before_the_code_runs(store: RedisStore) -> None:
    """No worker yet: all six signals wait in the first run's inbox, so its first decision reads
    them all. They all apply before the code runs (as a Temporal activation's signals): the run
    that waits for two has six. Before, the code ran after each signal, so a run that returned
    on the second dropped the others (only noted beside its history)."""
    stub = WorkflowStub.make(TakesTwoPerRun, id="can-signals", store=store)
    stub.signal_with_start("add", "s0")
    first_run = stub.run_id
    for i in range(1, 6):
        stub.signal("add", f"s{i}")
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
        generation = lambda: ([0] + list(stub.history()[0].data["args"]))[-1]  # noqa: E731
        wait_for(lambda: generation() == 1 and stub.status() == "suspended")
        for wave in ((6, 7), (8, 9)):
            for i in wave:
                stub.signal("add", f"s{i}")
            if wave == (6, 7):
                wait_for(lambda: generation() == 2 and stub.status() == "suspended")
        result = stub.result(timeout=20)
    assert result == {"generation": 2, "items": [f"s{i}" for i in range(10)]}
    # The first run's history says they applied together: a replay applies them so too.
    signals = [e for e in stub.history(first_run) if e.type == "SignalReceived"]
    assert [e.data.get("with_previous", False) for e in signals] == [False] + [True] * 5
    # Nothing was dropped on the way (each run's log of dropped inputs is empty).
    assert all(e.get("kind") != "dropped" for e in store.log_entries(store.ref("can-signals")))


class AwaitsOnePerRun(Workflow):
    """Awaits one ``approve`` a run: the first run once ``begin`` came, then it continues as new."""

    def handle(self, generation: int = 0, got: list[str] | None = None) -> list[str]:
        got = list(got or [])
        if generation == 0:
            await_signal("begin")
            got.append(await_signal("approve"))
            continue_as_new(1, got)
        try:
            got.append(await_signal("approve", timeout=10))
        except SignalTimeout:
            got.append("timed out")
        return got


def test_signals_a_run_received_but_never_awaited_reach_the_next_run(store: RedisStore) -> None:
    # Two approvals sent before the run awaited any: it took the first and continued as new, and
    # the second, buffered in its history, was dropped with it (said nowhere): the next run
    # waited for it until its timeout (an acceptance tester's).
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
        stub = WorkflowStub.make(AwaitsOnePerRun, id="can-buffered", store=store).start()
        wait_for(lambda: stub.status() == "suspended", timeout=20)
        stub.signal("approve", "a1")
        stub.signal("approve", "a2")
        wait_for(lambda: stub.describe()["signals_buffered"] == {"approve": 2}, timeout=20)
        stub.signal("begin", None)
        assert stub.result(timeout=20) == ["a1", "a2"]


class LoopsOnNext(Workflow):
    def handle(self, generation: int = 0) -> int:
        await_signal("next")
        continue_as_new(generation + 1)


def _decide(store: RedisStore, decider: Decider, workflow_id: str) -> None:
    ref = store.ref(workflow_id)
    wq = store.redis.hget(store.keys.run(ref.partition, ref.run_id), "wq").decode()
    ((entry_id, fields),) = store.redis.xrevrange(wq, count=1)
    decider.handle(ref.partition, wq, entry_id.decode(), fields)


def _after_the_load(store: RedisStore, monkeypatch: Any, then: Any) -> None:
    """``then()`` runs once, right after the next decision loaded its run: an input arriving
    while that decision is made."""
    loaded = store.load_each

    def load(runs: Any) -> Any:
        got = loaded(runs)
        monkeypatch.setattr(store, "load_each", loaded)
        then()
        return got

    monkeypatch.setattr(store, "load_each", load)


def test_a_cancel_that_came_with_or_during_a_continue_as_new_reaches_the_next_run(
    store: RedisStore, monkeypatch: Any
) -> None:
    """A cancel sent while a run continued as new was dropped ("run closed"): cancel() had
    returned, and the workflow looped on (7 runs in 8 in an acceptance pass)."""
    decider = Decider(store)
    with_it = WorkflowStub.make(LoopsOnNext, id="can-cancel-with", store=store).start()
    _decide(store, decider, with_it.id)
    with_it.signal("next")
    with_it.cancel("stop the loop")  # in the same batch as the signal it continues on
    _decide(store, decider, with_it.id)
    _decide(store, decider, with_it.id)
    assert with_it.status() == "cancelled" and list(with_it.history()[0].data["args"]) == [1]  # the next run

    during = WorkflowStub.make(LoopsOnNext, id="can-cancel-during", store=store).start()
    _decide(store, decider, during.id)
    during.signal("next")
    _after_the_load(store, monkeypatch, lambda: during.cancel("stop the loop"))
    _decide(store, decider, during.id)
    _decide(store, decider, during.id)
    assert during.status() == "cancelled"
    decider.cache.clear()


class AddsUntilItsTimer(Workflow):
    def __init__(self) -> None:
        self.got: list[str] = []

    @signal
    def add(self, item: str) -> None:
        self.got.append(item)

    def handle(self) -> list[str]:
        timer(0.05)
        return self.got


def test_a_signal_arriving_while_the_run_closes_is_applied_not_dropped(
    store: RedisStore, monkeypatch: Any
) -> None:
    """A signal that arrived after the closing decision read the inbox was dropped beside the
    history ("run closed"), though signal() had said it was delivered: now the close is decided
    again, the signal applied first."""
    decider = Decider(store)
    stub = WorkflowStub.make(AddsUntilItsTimer, id="close-race", store=store).start()
    _decide(store, decider, stub.id)  # its timer
    wait_for(lambda: store.fire_timers([store.ref(stub.id).partition])[0][2], timeout=5)
    _after_the_load(store, monkeypatch, lambda: stub.signal("add", "late"))
    _decide(store, decider, stub.id)
    assert stub.result(timeout=5) == ["late"]
    assert not stub.describe().dropped
    decider.cache.clear()


def test_a_run_closing_under_a_stream_of_signals_is_decided_again_after_other_work(
    store: RedisStore, monkeypatch: Any
) -> None:
    """Past 5 refused closes in a row (a signal after each load) its task was left pending for
    the reclaim, 30 s, while the signals piled up to LimitExceeded: it goes back to its stream."""
    decider = Decider(store)
    stub = WorkflowStub.make(AddsUntilItsTimer, id="close-storm", store=store).start()
    _decide(store, decider, stub.id)
    wait_for(lambda: store.fire_timers([store.ref(stub.id).partition])[0][2], timeout=5)
    loaded, sent = store.load_each, []

    def load(runs: Any) -> Any:
        got = loaded(runs)
        if len(sent) < 6:
            sent.append(f"s{len(sent)}")
            stub.signal("add", sent[-1])
        return got

    monkeypatch.setattr(store, "load_each", load)
    ref = store.ref(stub.id)
    wq = store.redis.hget(store.keys.run(ref.partition, ref.run_id), "wq").decode()
    (before,) = [entry_id for entry_id, _ in store.redis.xrange(wq)]
    _decide(store, decider, stub.id)  # 6 closes refused: the task goes back to its stream
    assert stub.status() != "completed"
    (after,) = [entry_id for entry_id, _ in store.redis.xrange(wq)]
    assert after > before  # a new entry at the end, for any worker's next read
    _decide(store, decider, stub.id)
    assert stub.result(timeout=5) == sent
    decider.cache.clear()
