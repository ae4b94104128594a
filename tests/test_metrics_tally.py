"""Counters tallied per thread on the hot path and drained in batches (workers/tally.py)."""

from __future__ import annotations

import threading

from workers.tally import Tally


def test_a_drain_returns_each_threads_counts_once() -> None:
    tally = Tally([])
    tally.add(("a",))

    def work() -> None:
        for _ in range(1000):
            tally.add(("a",))
            tally.add(("b", "x"), 2)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tally.drain() == {("a",): 4001, ("b", "x"): 8000}
    assert tally.drain() == {}
    tally.add(("a",), 3)
    assert tally.drain() == {("a",): 3}
