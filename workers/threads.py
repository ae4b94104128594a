"""The activity threads: a fixed set of threads running submitted calls in order.

Lighter than ``concurrent.futures.ThreadPoolExecutor`` on the hot path: no
Future per call (the calls hand their results over themselves), one lock-free
``SimpleQueue``. A call's exception is logged; the thread carries on. Each thread notes when its
current call began (:meth:`ActivityThreads.stalled`), so the worker holds no tasks behind threads
stuck in long activities, and which call that is (:meth:`ActivityThreads.running`), so the worker
can say which attempts hold its threads (:mod:`workers.hung`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from durable.errors import ConfigurationError

log = logging.getLogger("durable.worker")


class ActivityThreads:
    """``n`` daemon threads, each first running ``initializer(*initargs)``."""

    def __init__(
        self,
        n: int,
        *,
        name: str = "durable-activity",
        initializer: Callable[..., None] = lambda: None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._initializer = initializer
        self._initargs = initargs
        # When each thread's current call began (monotonic s; 0.0: idle). Each slot is written by
        # its own thread only and read whole (a float), so no lock on the hot path.
        self._began = [0.0] * n
        # Each thread's current call (None: idle), written and read like ``_began``.
        self._current: list[tuple[Callable[..., None], tuple[Any, ...]] | None] = [None] * n
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), name=f"{name}_{i}", daemon=True) for i in range(n)
        ]
        for started, thread in enumerate(self._threads):
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread": a limit of the system's
                for _ in range(started):
                    self._calls.put(None)  # the threads started stop
                raise ConfigurationError(
                    f"cannot start {n} activity threads: the system refused thread {started + 1} "
                    f"({exc}); lower --concurrency"
                ) from None

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the next free thread."""
        self._calls.put((fn, args))

    def stalled(self, longer_than: float) -> int:
        """How many threads have been running their current call for more than ``longer_than`` s."""
        since = time.monotonic() - longer_than
        return sum(1 for began in self._began if 0.0 < began < since)

    def running(self) -> list[tuple[float, Callable[..., None], tuple[Any, ...]]]:
        """The calls running now: when each began (monotonic s), its function and arguments."""
        out = []
        for began, call in zip(list(self._began), list(self._current), strict=True):
            if began and call is not None:
                out.append((began, call[0], call[1]))
        return out

    def take_waiting(self) -> list[tuple[Callable[..., None], tuple[Any, ...]]]:
        """Take back, in order, the calls no thread has started yet (to give them back or submit
        them again)."""
        out: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return out
            if call is None:  # shutting down: the threads' stop marks stay
                self._calls.put(None)
                return out
            out.append(call)

    def shutdown(self) -> None:
        """Drop the calls not started yet; the threads exit after their current call."""
        try:
            while True:
                self._calls.get_nowait()
        except queue.Empty:
            pass
        for _ in self._threads:
            self._calls.put(None)

    def _serve(self, i: int) -> None:
        self._initializer(*self._initargs)
        while True:
            call = self._calls.get()
            if call is None:
                return
            fn, args = call
            self._current[i] = call
            self._began[i] = time.monotonic()
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a call must not take its thread down
                _say_failed(fn)
            finally:
                self._began[i] = 0.0
                self._current[i] = None


def _say_failed(fn: Callable[..., None]) -> None:
    """Log a call that raised, with its traceback when that can be formatted: an error whose
    own attributes raise made the log call raise too, and the thread died with it (its
    attempts then showed "running" for ever)."""
    name = getattr(fn, "__name__", fn)
    try:
        log.exception("activity thread: %s failed", name)
    except BaseException as err:  # noqa: BLE001 - the thread outlives a broken error
        log.error("activity thread: %s failed (its error could not be formatted: %r)", name, type(err))
