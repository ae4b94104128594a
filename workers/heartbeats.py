"""An activity attempt's heartbeats, throttled: code may call ``heartbeat()`` for every item of a
loop, and Redis sees at most one write per interval.

As Temporal's SDKs do, a heartbeat within the interval of the last write is not written at once:
its details are kept (the latest win; a heartbeat without details keeps the ones waiting) and
written by the next heartbeat past the interval or, once the code has been quiet for an interval,
by the process's flusher thread, so the attempt's heartbeat deadline is still pushed by it. A cancel learnt from a write is raised by the next ``heartbeat()``.
When the attempt fails, its latest details are written before the failure is recorded: the
retry resumes from them.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from durable import codec

__all__ = ["MAX_INTERVAL_S", "UNTHROTTLED_BELOW_S", "AttemptHeartbeat", "Flusher", "interval_for"]

log = logging.getLogger("durable.worker")

MAX_INTERVAL_S = 1.0
"""Longest wait between an attempt's heartbeat writes: how late a cancel may be seen, at most."""

Send = Callable[[bytes, float], bool]
"""Writes (details, wall time of the heartbeat); whether the activity was cancelled."""


UNTHROTTLED_BELOW_S = 1.0
"""Heartbeat timeouts shorter than this are not throttled: every heartbeat is written, as
before. Held back, a loop's heartbeats no longer do I/O, so CPU-bound loops keep the interpreter
busy, and a write (two turns at the interpreter behind them) took most of a 0.2 s timeout: 23 of
192 attempts timed out falsely (none unthrottled)."""


def interval_for(heartbeat_timeout: float | None) -> float:
    """The throttle interval of an attempt: a quarter of its heartbeat timeout (a heartbeat
    waiting for its write still lands well inside the deadline it pushes), at most
    :data:`MAX_INTERVAL_S`; 0 (every heartbeat written) under :data:`UNTHROTTLED_BELOW_S`."""
    if heartbeat_timeout:
        return 0.0 if heartbeat_timeout < UNTHROTTLED_BELOW_S else min(MAX_INTERVAL_S, heartbeat_timeout / 4)
    return MAX_INTERVAL_S


class Flusher:
    """One thread per process that writes the heartbeats waiting for their interval to end."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the flusher's thread at monotonic time ``when``."""
        with self._cond:
            heapq.heappush(self._due, (when, next(self._order), fn))
            if self._thread is None or not self._thread.is_alive():  # started again after a fork
                self._thread = threading.Thread(target=self._run, name="durable-heartbeats", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                _, _, fn = heapq.heappop(self._due)
            try:
                fn()
            except Exception:  # one attempt's write must not stop the others'
                log.exception("a throttled heartbeat could not be written")


FLUSHER = Flusher()


class AttemptHeartbeat:
    """The heartbeat function of one attempt (``ActivityContext``'s ``heartbeat_fn``).

    Args:
        send: Writes a heartbeat (see :data:`Send`).
        interval: Shortest time between two writes, in seconds.
        flusher: Writes the heartbeats held back (default: the process's).
    """

    def __init__(self, send: Send, interval: float, flusher: Flusher = FLUSHER) -> None:
        self._send = send
        self._interval = interval
        self._flusher = flusher
        self._cond = threading.Condition()
        self._waiting: tuple[bytes, float] | None = None  # (details or b"", wall time) not written yet
        self._written_at = -float("inf")  # monotonic time of the last write's start
        self._called_at = -float("inf")  # monotonic time of the last heartbeat() call
        self._writing = False
        self._flush_due = False
        self._closed = False
        self.cancelled = False

    def __call__(self, details: Any) -> bool:
        """A heartbeat with ``details`` (``None``: keep the last ones); whether the activity is
        cancelled. Details that cannot be encoded raise here, in the activity's code."""
        payload = codec.dumps(details, path="details") if details is not None else b""
        with self._cond:
            self._called_at = time.monotonic()
            self._hold(payload)
            if self._writing or self._called_at - self._written_at < self._interval:
                self._flush_later()
                return self.cancelled
            waiting = self._take()
        return self._write(waiting)

    def close(self, *, flush: bool) -> None:
        """The attempt ended: nothing more is written, except (``flush``) the details waiting."""
        with self._cond:
            while self._writing:  # the flusher's write in flight lands first
                self._cond.wait()
            self._closed = True
            waiting = self._take() if flush and self._waiting and self._waiting[0] else None
        if waiting is not None:
            self._write(waiting)

    def _hold(self, details: bytes) -> None:
        if not details and self._waiting is not None:
            details = self._waiting[0]  # a heartbeat without details keeps the ones waiting
        self._waiting = (details, time.time())

    def _take(self) -> tuple[bytes, float]:
        waiting, self._waiting = self._waiting, None
        assert waiting is not None
        self._writing, self._written_at = True, time.monotonic()
        return waiting

    def _flush_later(self, at: float | None = None) -> None:
        if not self._flush_due:
            self._flush_due = True
            self._flusher.at(at or max(self._written_at + self._interval, time.monotonic()), self._flush)

    def _flush(self) -> None:
        with self._cond:
            self._flush_due = False
            if self._closed or self._waiting is None:
                return
            if self._writing:  # written once the write in flight is done
                self._flush_later()
                return
            if time.monotonic() - self._called_at < self._interval:
                # The code still heartbeats: its own next call writes (on its thread, which has its
                # turn at the interpreter; the flusher's write waited behind CPU-bound activities,
                # and held their heartbeats back past a 0.2 s heartbeat timeout). Looked at again
                # once it has been quiet for an interval.
                self._flush_later(self._called_at + self._interval)
                return
            waiting = self._take()
        self._write(waiting)

    def _write(self, waiting: tuple[bytes, float]) -> bool:
        cancelled = False
        try:
            cancelled = self._send(*waiting)
        finally:
            with self._cond:
                self._writing = False
                self.cancelled = self.cancelled or cancelled
                if self._waiting is not None and not self._closed:
                    self._flush_later()
                self._cond.notify_all()
        return self.cancelled
