"""Signals are addressed to a workflow id: those a run could not apply because it continued as
new (read after the continue, or arriving while that decision was made), and those it received
but never awaited, go to the next run."""

from __future__ import annotations

from typing import Any

from waiting import wait_for

from durable import SignalTimeout, Workflow, WorkflowStub, await_signal, continue_as_new, signal, wait_until
from durable.store.redis_store import RedisStore
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


def test_signals_a_run_read_after_it_continued_as_new_reach_the_next_run(store: RedisStore) -> None:
    # No worker yet: all six signals wait in the first run's inbox, so its first decision reads
    # them all; after the second the run continues as new, the other four are the next runs'.
    stub = WorkflowStub.make(TakesTwoPerRun, id="can-signals", store=store)
    stub.signal_with_start("add", "s0")
    for i in range(1, 6):
        stub.signal("add", f"s{i}")
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
        result = stub.result(timeout=20)
    assert result == {"generation": 2, "items": [f"s{i}" for i in range(6)]}
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
