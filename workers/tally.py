"""Counts added on the hot path, per thread, read together now and then.

An increment of a ``prometheus-client`` counter in multiprocess mode takes a lock and
writes an mmap'd file (~1 us); a worker step makes several. :class:`Tally` makes each
a dict add in the calling thread's own dict; :meth:`Tally.drain` sums them for a
periodic write (``workers.metrics.flush``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("durable.metrics")

Key = tuple[Any, ...]


class Tally(threading.local):
    """Per-thread counts by key; only a thread's own code adds to its dict."""

    def __init__(self, every: list[dict[Key, int]]) -> None:
        # Run again in each thread on its first use (a threading.local), with the same list.
        self.counts: dict[Key, int] = {}
        self.every = every
        every.append(self.counts)

    def add(self, key: Key, n: int = 1) -> None:
        """Count ``n`` more of ``key`` in this thread."""
        counts = self.counts
        counts[key] = counts.get(key, 0) + n

    def drain(self) -> dict[Key, int]:
        """The counts added (by any thread) since the previous drain."""
        with _drain_lock:
            totals: dict[Key, int] = {}
            for counts in list(self.every):
                for key, n in counts.copy().items():  # copy(): one C call, safe while its thread adds
                    totals[key] = totals.get(key, 0) + n
            written = _written.setdefault(id(self.every), {})
            out = {key: n - written.get(key, 0) for key, n in totals.items() if n > written.get(key, 0)}
            written.update(totals)
            return out


_drain_lock = threading.Lock()
_written: dict[int, dict[Key, int]] = {}  # per tally (its list of dicts): the counts drained


def every(period: float, call: Callable[[], None], name: str) -> None:
    """Call ``call`` every ``period`` seconds on a daemon thread, logging what it raises."""

    def loop() -> None:
        while True:
            time.sleep(period)
            try:
                call()
            except Exception:  # noqa: BLE001 - one failed call must not end the calls
                log.exception("%s failed", name)

    threading.Thread(target=loop, name=name, daemon=True).start()
