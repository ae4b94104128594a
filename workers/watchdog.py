"""Workflow code that does not return: found, named, and kept from freezing a worker.

Decisions run on the worker's main thread (greenlets resume only on the thread that
made them), so one workflow that busy-loops or calls ``time.sleep(20)`` stops every
run of its worker. Python cannot stop a thread from outside, so a worker that finds
such a decision gives the run up and ends:

* :class:`DecisionWatchdog` (a thread) times each decision. The clock of a decision
  starts when it begins and starts again at each greenlet switch (the workflow code
  handed control back to durable, so it is progressing) and while the deciding thread
  waits on Redis. When it passes ``timeout`` the watchdog samples the deciding
  thread's stack (``sys._current_frames``) and reports a :class:`Stuck` decision:
  the run id, the workflow code's file:line and the whole stack.
* :func:`block_runaway` records it: the run is blocked (kind ``runaway_decision``,
  reason ``decision exceeded 2 s at app.py:12 in handle; ...``), so no worker picks
  it up again until ``durable repair``; ``durable terminate`` closes it.
* The worker (:meth:`workers.worker.Worker.run` on a process's main thread) then
  hands back its other tasks and exits with :data:`RUNAWAY_EXIT`; its supervisor
  (``durable worker --processes N``, systemd) starts a fresh one.

:class:`StopDeadline` bounds a graceful stop the same way: a worker still stopping
``grace`` + :data:`STOP_MARGIN` seconds after SIGTERM logs where its main thread is
stuck and exits with :data:`STOP_TIMEOUT_EXIT`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import greenlet

from durable.errors import Overrun
from durable.frames import code_position, waiting_on_redis
from durable.store.redis_store import RedisStore
from durable.store.workers import SLOW_DECISION_S

from .decider import Decider, Task

__all__ = [
    "DEFAULT_DECISION_TIMEOUT",
    "RUNAWAY_EXIT",
    "STOP_MARGIN",
    "STOP_TIMEOUT_EXIT",
    "DecisionWatchdog",
    "StopDeadline",
    "Stuck",
    "block_runaway",
    "exit_process",
    "exit_runaway",
    "hand_back",
    "stop_signals",
]

log = logging.getLogger("durable.worker")

DEFAULT_DECISION_TIMEOUT = 2.0
"""Seconds a decision may run workflow code without yielding (``--decision-timeout``)."""

RUNAWAY_EXIT = 70
"""Exit status of a worker that gave up a runaway decision (EX_SOFTWARE): restart it."""

STOP_TIMEOUT_EXIT = 75
"""Exit status of a worker whose graceful stop did not end within ``grace + STOP_MARGIN``."""

FROZEN_S = 1.0
"""A watchdog poll this much later than due means the process did not run meanwhile (stopped
or starved): the decision's clock starts again rather than count that time against its code."""

STOP_MARGIN = 5.0
"""Seconds a stop may take beyond ``grace`` (recording results, leaving the registry)."""


@dataclass(frozen=True)
class Stuck:
    """A decision that ran workflow code for ``seconds`` without yielding.

    Attributes:
        task: The workflow task being decided (``stream``/``entry_id`` empty for an eager decision).
        timeout: The deadline it passed, in seconds.
        seconds: How long it had run without progress when it was found.
        where: The workflow code's position, ``path:line in function``.
        stack: The deciding thread's whole stack, formatted.
    """

    task: Task
    timeout: float
    seconds: float
    where: str
    stack: str

    @property
    def reason(self) -> str:
        """The blocked reason recorded on the run (it starts with ``decision exceeded``)."""
        return (
            f"decision exceeded {self.timeout:g} s at {self.where}: workflow code must not block or "
            "busy-loop (use timer() or an activity); fix the code, then `durable repair`"
        )


def _where(stack: traceback.StackSummary) -> str:
    """The innermost frame of the app's code (not durable's, not the standard library's)."""
    return code_position(stack, own=(str(Path(__file__).parent) + os.sep,))


class DecisionWatchdog:
    """Times the decisions of one deciding thread; reports one that runs past ``timeout``.

    The decider wraps each decision in ``with watchdog.deciding(task):`` (cheap: no
    lock, no allocation). With a debugger or tracer on the deciding thread
    (``sys.gettrace()``) decisions are not timed: stepping through code is not a runaway.

    Args:
        timeout: Seconds without progress that make a decision a runaway.
        on_stuck: Called on the watchdog thread, once per stuck decision.
    """

    @classmethod
    def attach(cls, decider: Decider, timeout: float, on_stuck: Callable[[Stuck], None]) -> DecisionWatchdog:
        """A watchdog timing ``decider``'s decisions (``timeout`` 0: no deadline, but a decision
        running past :data:`SLOW_DECISION_S` is still logged and named by :meth:`slow`)."""
        watchdog = cls(timeout, on_stuck)
        decider.deciding = watchdog.deciding
        return watchdog

    def __init__(self, timeout: float, on_stuck: Callable[[Stuck], None]) -> None:
        self.timeout = timeout
        self.on_stuck = on_stuck
        self._poll = min(0.25, timeout / 4) if timeout > 0 else 0.25
        self._warned: Task | None = None
        self._next: Task | None = None
        self._task: Task | None = None
        self._thread_id = 0
        self._mark = 0.0  # monotonic time the deciding thread last showed progress
        self._reported: Task | None = None
        self._traced: set[int] = set()
        self._previous_trace: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._interrupted: Task | None = None

    # --------------------------------------------------- the deciding thread
    def deciding(self, task: Task) -> DecisionWatchdog:
        """A context manager timing the decision of ``task`` (use on the deciding thread)."""
        self._next = task
        return self

    def __enter__(self) -> None:
        if sys.gettrace() is not None:
            return
        ident = threading.get_ident()
        if ident not in self._traced:
            self._traced.add(ident)
            self._previous_trace = greenlet.settrace(self._switched)
        self._thread_id = ident
        self._mark = time.monotonic()
        self._task = self._next

    def __exit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self._task = None
        if self._interrupted is not None:  # not delivered yet: it must not hit the next decision
            self._interrupted = None
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)

    def interrupt(self, stuck: Stuck) -> None:
        """Stop ``stuck``'s workflow code with :class:`~durable.errors.Overrun`, raised in the
        deciding thread at its next bytecode (a busy loop at once; a call blocked in C when it
        returns). For a worker that is a thread of a larger process (tests): it cannot exit, and
        the loop kept a core busy for the rest of the process (any thread)."""
        if self._task is stuck.task and self._thread_id:
            self._interrupted = stuck.task
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self._thread_id), ctypes.py_object(Overrun)
            )

    def _switched(self, event: str, args: Any) -> None:
        self._mark = time.monotonic()
        if self._previous_trace is not None:
            self._previous_trace(event, args)

    # ---------------------------------------------------- the watchdog thread
    def start(self) -> None:
        """Start watching (a daemon thread)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="durable-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._poll):
            now = time.monotonic()
            if now - last > self._poll + FROZEN_S:
                # The whole process was stopped (SIGSTOP, a paused VM) or starved of CPU: that
                # time is not the workflow code's; a healthy run was blocked as a runaway.
                self._mark = max(self._mark, now)
            last = now
            try:
                self.check()
                self._warn_slow()
            except Exception:  # noqa: BLE001 - the watchdog must outlive one bad report
                log.exception("decision watchdog: could not report a stuck decision")

    def check(self) -> Stuck | None:
        """Sample the deciding thread once; report (and return) a decision past its deadline."""
        task = self._task
        if task is None or task is self._reported or self.timeout <= 0:
            return None
        sampled = self._sample(task, self.timeout)
        if sampled is None:
            return None
        seconds, stack = sampled
        self._reported = task
        stuck = Stuck(task, self.timeout, seconds, _where(stack), "".join(stack.format()))
        self.on_stuck(stuck)
        return stuck

    def slow(self) -> tuple[str, str]:
        """``(run id, words)`` of the decision running workflow code without yielding for more
        than :data:`SLOW_DECISION_S` (``("", "")``: none), for the worker's registry entry:
        ``("r-1", "45 s at app.py:12 in handle (--decision-timeout off)")``. Any thread."""
        task = self._task
        sampled = None if task is None else self._sample(task, SLOW_DECISION_S)
        if task is None or sampled is None:
            return "", ""
        seconds, stack = sampled
        deadline = f"--decision-timeout {self.timeout:g} s" if self.timeout > 0 else "--decision-timeout off"
        return task.run_id, f"{seconds:.0f} s at {_where(stack)} ({deadline})"

    def _warn_slow(self) -> None:
        """Log once a decision that passed :data:`SLOW_DECISION_S` (with no deadline, or a long
        one, nothing else says why the worker's other runs wait)."""
        task = self._task
        if task is None or task is self._warned or task is self._reported:
            return
        run_id, words = self.slow()
        if run_id and task is self._task:
            self._warned = task
            log.warning(
                "run %s: its decision has run workflow code for %s without yielding; this worker decides "
                "nothing else until it returns (workflow code must not block or busy-loop: use timer() "
                "or an activity)",
                run_id,
                words,
            )

    def _sample(self, task: Task, seconds: float) -> tuple[float, traceback.StackSummary] | None:
        """How long ``task``'s decision has gone without progress and where, if ``seconds`` or more
        (``None``: less, another decision, or the thread waits on Redis)."""
        now = time.monotonic()
        if now - self._mark < seconds:
            return None
        frame = sys._current_frames().get(self._thread_id)
        if frame is None or task is not self._task:
            return None
        stack = traceback.extract_stack(frame)
        del frame
        if waiting_on_redis(stack):
            self._mark = now
            return None
        return now - self._mark, stack


def block_runaway(store: RedisStore, stuck: Stuck) -> None:
    """Log a stuck decision with its stack and block its run (kind ``runaway_decision``).

    The run's workflow task is parked, so no worker decides it again until ``durable
    repair``. An eager decision has no task of its own: only the run is blocked.
    """
    task = stuck.task
    log.error(
        "run %s: decision exceeded %g s (%.1f s without yielding) at %s; blocking the run. "
        "Workflow code stack:\n%s",
        task.run_id,
        stuck.timeout,
        stuck.seconds,
        stuck.where,
        stuck.stack.rstrip(),
    )
    try:
        _park(store, stuck)
    except Exception:  # noqa: BLE001 - exit anyway: the task stays pending, and a run whose
        # decision keeps ending its worker is blocked after 5 deliveries
        log.exception("run %s: could not record the block", task.run_id)


def _park(store: RedisStore, stuck: Stuck) -> None:
    task = stuck.task
    store.park(
        p=task.p,
        # Any key of the run's partition: with no entry id, park acks nothing.
        stream=task.stream or store.keys.run(task.p, task.run_id),
        entry_id=task.entry_id,
        kind="workflow",
        reason=stuck.reason,
        fields=task.fields,
        run_id=task.run_id,
        block=True,
        block_kind="runaway_decision",
    )


def hand_back(store: RedisStore, batch: Sequence[Task], *, but: Task) -> None:
    """Put the workflow tasks of ``batch`` (all ``but`` the stuck one) back on their streams
    for other workers (this one is about to exit: they would wait for ``--claim-idle``)."""
    by_stream: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}
    for task in batch:
        if task.key != but.key:
            by_stream.setdefault(task.stream, []).append((task.entry_id, task.fields))
    try:
        store.requeue(by_stream)
    except Exception:  # noqa: BLE001 - they stay pending: reclaimed after --claim-idle
        log.exception("could not hand %d workflow tasks back", sum(map(len, by_stream.values())))


RESTARTS_ENV = "DURABLE_RUNAWAY_RESTARTS"
"""When a worker process restarted itself in place after runaway decisions (epoch seconds)."""

MAX_RESTARTS = 5
"""Restarts in place within a minute after which a worker exits instead: the runs it blocks
are not the cause (the blocks did not hold, say), and a loop would hide it."""


def exit_runaway(consumer: str, stuck: Stuck, *, restart: bool = False) -> None:
    """End a worker process whose main thread is stuck in ``stuck`` (:data:`RUNAWAY_EXIT`).

    ``restart``: a ``durable worker`` no supervisor runs starts again in place (the same command
    line, the same pid), as a supervisor would start it: exited, it stayed down, every other run
    of its queues waiting for someone to notice (Temporal fails the workflow task and serves on).
    """
    where = f"run {stuck.task.run_id} is stuck in workflow code at {stuck.where}; the run is blocked"
    now = time.time()
    recent = [t for t in _restarts() if now - t < 60]
    if restart and len(recent) < MAX_RESTARTS:
        os.environ[RESTARTS_ENV] = ",".join(f"{t:.3f}" for t in [*recent, now])
        log.critical(
            "worker %s restarts in place (%d in the last minute): %s", consumer, len(recent) + 1, where
        )
        _flush_logs()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    exit_process(
        RUNAWAY_EXIT,
        f"worker {consumer} exits ({RUNAWAY_EXIT}): {where}, its other runs continue on other workers"
        + (f" ({MAX_RESTARTS} restarts in place within a minute)" if restart else "")
        + ". Run workers under a supervisor (durable worker --processes N, systemd Restart=on-failure) "
        "to have it restarted.",
    )


def _restarts() -> list[float]:
    out = []
    for text in os.environ.get(RESTARTS_ENV, "").split(","):
        try:
            out.append(float(text))
        except ValueError:
            continue
    return out


def _flush_logs() -> None:
    for handler in [*logging.getLogger().handlers, *log.handlers]:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001, S110 - exiting anyway
            pass
    sys.stderr.flush()


def exit_process(code: int, message: str) -> None:
    """Log ``message``, flush every log handler and end the process at once with ``code``.

    ``os._exit``: the main thread is stuck in code that will not return, so neither
    ``sys.exit`` nor the interpreter's shutdown (which joins threads) could finish.
    """
    log.critical(message)
    _flush_logs()
    os._exit(code)


class StopDeadline:
    """Ends the process if a graceful stop has not finished some seconds after it began.

    :meth:`start` it before installing the stop signal's handler; the handler calls
    :meth:`arm`, which only stores a time: a signal handler may interrupt its own
    thread anywhere (even a second handler the first), so it must not take a lock or
    start a thread. A daemon thread polls for the deadline.
    """

    def __init__(self) -> None:
        self._due: tuple[float, float] | None = None  # (monotonic deadline, seconds)
        self._cancelled = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread that waits for an armed deadline (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._wait, name="durable-stop-deadline", daemon=True)
            self._thread.start()

    def arm(self, seconds: float) -> None:
        """Begin the countdown (signal-safe; a second call keeps the first countdown)."""
        if self._due is None:
            self._due = (time.monotonic() + seconds, seconds)

    def cancel(self) -> None:
        """The stop completed: no forced exit."""
        self._cancelled = True

    def _wait(self) -> None:
        while not self._cancelled:
            time.sleep(0.2)
            due = self._due
            if due is not None and time.monotonic() >= due[0] and not self._cancelled:
                self._expired(due[1])

    @staticmethod
    def _expired(seconds: float) -> None:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
        exit_process(
            STOP_TIMEOUT_EXIT,
            f"worker still stopping {seconds:g} s after the stop signal (grace + {STOP_MARGIN:g} s), its "
            f"main thread at {_where(stack)}; exiting now, other workers reclaim its unfinished tasks. "
            f"Main thread:\n{''.join(stack.format()).rstrip()}",
        )


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT, and SIGHUP unless ignored (``nohup``, a supervisor's child, which the
    supervisor reloads): a hangup stops a worker gracefully rather than kill it mid-activity."""
    hangup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hangup)
