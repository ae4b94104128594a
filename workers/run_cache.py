"""The run cache: a worker's live drivers (suspended workflow greenlets), by run."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from durable.replay import Driver

from . import metrics

CLOSED_CHECK_S = 10.0
"""How often the cache asks Redis which of its runs were closed behind its back."""

IsOpen = Callable[[Sequence[tuple[str, str]]], list[bool]]
"""Reads whether each (workflow id, run id) is an open run (one round trip)."""


class RunCache:
    """LRU of live drivers (suspended greenlets + last applied seq), per worker thread.

    A hit makes a decision cost O(new events) instead of O(history). Evicted
    drivers are closed: suspended greenlets in cycles are never collected.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._drivers: OrderedDict[str, Driver] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self._next_check = time.monotonic() + CLOSED_CHECK_S

    def take(self, run_id: str, seq: int, *, new: bool = False) -> Driver | None:
        """The cached driver of ``run_id`` at ``seq`` (``None``: a miss). ``new``: the run was
        never decided, so it cannot be cached: not counted as a lookup (every start was a miss)."""
        driver = self._drivers.pop(run_id, None)
        # The gauge follows every change (a taken run is back only if put back: one that closed is not).
        metrics.cache_size(len(self._drivers))
        if driver is not None and driver.seq == seq:
            self.hits += 1
            metrics.cache_lookup(True)
            return driver
        if driver is not None:
            driver.close()
        if not new:
            self.misses += 1
            metrics.cache_lookup(False)
        return None

    def put(self, run_id: str, driver: Driver) -> None:
        if self.size <= 0 or driver.closed_run:
            driver.close()
            metrics.cache_size(len(self._drivers))
            return
        self._drivers[run_id] = driver
        while len(self._drivers) > self.size:
            _, old = self._drivers.popitem(last=False)
            old.close()
        metrics.cache_size(len(self._drivers))

    def seq_of(self, run_id: str) -> int:
        """The seq the cached driver of ``run_id`` has applied (0 when not cached)."""
        driver = self._drivers.get(run_id)
        return driver.seq if driver is not None else 0

    def pop(self, run_id: str) -> Driver | None:
        """Take the cached driver of ``run_id`` out, whatever its seq (eager commits: a hit when
        found; when not, the result goes through the inbox and that decision's lookup counts)."""
        driver = self._drivers.pop(run_id, None)
        metrics.cache_size(len(self._drivers))
        if driver is not None:
            self.hits += 1
            metrics.cache_lookup(True)
        return driver

    def drop_closed(self, is_open: IsOpen) -> int:
        """Every :data:`CLOSED_CHECK_S`, close the drivers of runs closed without a decision of
        this worker (terminated, purged): no task of theirs comes back, so they would hold their
        greenlets until the LRU reached them. Returns how many were dropped."""
        now = time.monotonic()
        if now < self._next_check or not self._drivers:
            return 0
        self._next_check = now + CLOSED_CHECK_S
        cached = list(self._drivers.items())
        still = is_open([(d.workflow_id, run_id) for run_id, d in cached])
        dropped = 0
        for (run_id, driver), open_ in zip(cached, still, strict=True):
            if not open_ and self._drivers.get(run_id) is driver:
                del self._drivers[run_id]
                driver.close()
                dropped += 1
        if dropped:
            metrics.cache_size(len(self._drivers))
        return dropped

    def clear(self) -> None:
        for driver in self._drivers.values():
            driver.close()
        self._drivers.clear()
        metrics.cache_size(0)

    def __len__(self) -> int:
        return len(self._drivers)
