"""A time limit on workflow code run outside a worker: the read-only replay of a query.

A query replays the run's history in the calling process -- the CLI, a thread of the HTTP
server, an application -- and then calls the ``@query`` method. Workflow code that busy-loops
(a bug, or the very run a worker blocked as ``runaway_decision``) held that thread for ever: the
CLI hung, and each such request took a server thread for good, until SIGTERM could not stop the
server either. A worker stops such code by giving the run up and exiting (``workers.watchdog``);
a client cannot, so :func:`run_limited` raises an exception in the running thread
(``PyThreadState_SetAsyncExc``) once the code has run :data:`QUERY_TIMEOUT` seconds without
handing control back to durable (a greenlet switch restarts the clock, as for a decision). The
seconds are the thread's CPU time: many queries of long histories at once share the interpreter,
and on the wall clock healthy code looked like a busy loop.

Python delivers that exception at the thread's next bytecode: a busy loop ends at once, a call
blocked in C (``time.sleep(600)``) only when it returns. So the code runs on a thread of its own
(at most :data:`RUNNERS` at once per process) and the caller stops waiting a moment past the limit.
"""

from __future__ import annotations

import contextvars
import ctypes
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import greenlet

from .errors import Overrun, QueryBusy, QueryFailed
from .frames import code_position, waiting_on_redis

__all__ = [
    "BLOCKED_GRACE_S",
    "QUERY_TIMEOUT",
    "RUNNERS",
    "STUCK_PER_RUN",
    "Overrun",
    "QueryOverrun",
    "code_position",
    "query_overrun",
    "run_limited",
    "waiting_on_redis",
]

QUERY_TIMEOUT = 5.0
"""Seconds a query's replay and ``@query`` method may run workflow code without yielding."""

RUNNERS = 16
"""Limited calls running at once, per process (one blocked in a call holds its slot until it
returns; with all held, a call waits for one within its limit, then fails saying so)."""

STUCK_PER_RUN = 4
"""Runner threads one run's queries may hold blocked in a call after their callers gave up;
past it that run's queries fail at once, so that one run's code cannot take every thread."""

BLOCKED_GRACE_S = 1.0
"""How long past the limit a caller waits for code that did not take its exception (blocked in
a call) before it gets the error anyway."""

SLOW_FACTOR = 6
"""How many times the limit a caller waits, past it, for code that is still running (using CPU)
but slowly: one replay among many at once shares the process's interpreter, and a long history
takes each of them that much longer. It then gets :class:`QueryBusy`, not "fix the code"."""

PROGRESS_CHECK_S = 0.5
"""How often a caller waiting past the limit looks whether the code is still using CPU."""

IDLE_CHECKS = 3
"""Looks in a row that find the code used no CPU before a caller takes it for blocked in a call."""

MONITOR_IDLE_S = 10.0
"""How long the monitor thread outlives the last limited call (a thread per query costs more
than the query: a busy server keeps one)."""

T = TypeVar("T")


@dataclass(frozen=True)
class QueryOverrun:
    """The errors of one query whose replay or ``@query`` method overran (for :func:`run_limited`):
    called with the limit and the code's position; its run's runner threads still blocked after
    their callers gave up are counted by :attr:`workflow_id`."""

    name: str
    workflow_id: str

    def __call__(self, seconds: float, where: str) -> Exception:
        return QueryFailed(
            f"@query {self.name!r} of workflow {self.workflow_id!r} did not return within {seconds:g} s: "
            f"workflow code ran without yielding at {where or 'an unknown position'} (a query replays the "
            "run's code, then calls the @query method): fix the code (a loop in the run's code, not in "
            "the @query method, blocks the run in its worker too, as a runaway decision: `durable repair "
            f"{self.workflow_id}` after the fix)",
            name=self.name,
        )

    def slow(self, seconds: float) -> Exception:
        """The code kept running (using CPU, switching greenlets) for ``seconds``: slowed by the
        other queries this process runs at once, no fault of the run's code."""
        return QueryBusy(
            f"@query {self.name!r} of workflow {self.workflow_id!r} did not return within {seconds:g} s: "
            "its replay was still running, slowed by the other queries this process runs at once; "
            "try again, or send fewer at once",
            name=self.name,
        )

    def busy(self, held: str) -> Exception:
        """No runner thread was free within the limit: ``held`` says which runs' code holds them."""
        return QueryBusy(
            f"@query {self.name!r} of workflow {self.workflow_id!r} did not start: all {RUNNERS} query "
            f"threads of this process are held by earlier queries blocked in workflow code ({held}); "
            "try again once those calls return (the runs named need a fix)",
            name=self.name,
        )


def query_overrun(name: str, workflow_id: str) -> QueryOverrun:
    """The errors of a query whose replay or method overran (for :func:`run_limited`)."""
    return QueryOverrun(name, workflow_id)


class _Watch:
    def __init__(self, thread_id: int, seconds: float) -> None:
        self.thread_id = thread_id
        self.seconds = seconds
        self.mark = time.monotonic()  # the code last showed progress (a greenlet switch)
        self.clock = _cpu_clock(thread_id)
        self.cpu_mark = time.thread_time()  # (called on the watched thread) its CPU time then
        self.where = ""  # set when it overran
        self.fired = False

    def overran(self, now: float) -> bool:
        """Whether the code has run past the limit since its last switch: the limit in its
        thread's CPU time (waiting for the interpreter behind other threads is no fault of the
        code's), or on the wall clock a second past its caller's wait (:data:`SLOW_FACTOR` times
        the limit and the grace): code that sleeps in a loop uses next to no CPU and is stopped
        all the same, once its caller has its answer (``QueryBusy`` for a replay slowed by
        others, not "fix the code" for healthy code)."""
        wall = now - self.mark
        if wall < self.seconds:
            return False
        if self.clock is None or wall >= self.seconds * SLOW_FACTOR + BLOCKED_GRACE_S + 1.0:
            return True
        return _cpu_s(self.clock) - self.cpu_mark >= self.seconds


def _cpu_clock(thread_id: int) -> int | None:
    """The CPU-time clock of thread ``thread_id`` (``None`` where the platform has none)."""
    try:
        return time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):
        return None


def _cpu_s(clock: int | None) -> float:
    """A thread's CPU time by its clock (0 once the thread is gone)."""
    try:
        return time.clock_gettime(clock) if clock is not None else 0.0
    except OSError:
        return 0.0


_lock = threading.Lock()
_watches: dict[int, _Watch] = {}
_monitor: threading.Thread | None = None
_slot_count: threading.BoundedSemaphore | None = None
_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_stuck: dict[str, list[str]] = {}  # per workflow id: where its runners are blocked
_idle = [0]  # runner threads free for a job (counted as their job ends)
# Runner threads started: at most RUNNERS (one is started only with a slot held and none idle).
_threads = 0


def run_limited(fn: Callable[[], T], seconds: float, overrun: QueryOverrun) -> T:
    """``fn()``, stopped once it runs ``seconds`` without a greenlet switch.

    It runs on a thread of its own while the caller waits: code blocked in a call
    (``time.sleep(600)``) gets its exception only when the call returns, and the caller does not
    wait for that (:data:`BLOCKED_GRACE_S` after the limit it gets the error). Such a thread is a
    daemon (a CLI exits), and holds one of the process's :data:`RUNNERS` slots meanwhile.

    Args:
        fn: The code to run.
        seconds: The limit (0 or less: none). Not applied under a debugger (``sys.gettrace()``).
        overrun: Builds the error raised instead, from the limit and the code's position.
    """
    if seconds <= 0 or sys.gettrace() is not None or threading.get_ident() in _watches:
        return fn()
    label = overrun.workflow_id
    with _lock:
        stuck = list(_stuck.get(label, ()))
    if len(stuck) >= STUCK_PER_RUN:  # this run's code holds enough threads already: its fault
        raise overrun(
            seconds, f"{stuck[-1]} (blocked in a call; {len(stuck)} earlier queries of it still are)"
        )
    deadline = time.monotonic() + seconds + BLOCKED_GRACE_S
    slots = _slots()
    if not slots.acquire(timeout=seconds + BLOCKED_GRACE_S):
        raise overrun.busy(_held())
    context = contextvars.copy_context()  # the caller's (interceptors' headers, the test kit's)
    outcome: list[Any] = []
    done = threading.Event()
    runner: list[int] = []
    left: list[str] = []  # where its code was blocked when the caller gave up

    def run() -> None:
        try:
            outcome.append((True, context.run(_limited, fn, seconds, overrun, runner)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
            outcome.append((False, exc))
        finally:
            with _lock:
                if left:
                    _stuck[label].remove(left[0])
                    if not _stuck[label]:
                        del _stuck[label]
                done.set()
            slots.release()
            _idle_again()

    _submit(run)
    if not done.wait(max(0.0, deadline - time.monotonic())):
        _wait_while_running(done, runner, seconds, overrun)
    if not done.is_set():
        frame = sys._current_frames().get(runner[0]) if runner else None
        where = code_position(traceback.extract_stack(frame)) if frame is not None else ""
        del frame
        with _lock:
            if not done.is_set():  # still blocked: counted against its run until it returns
                left.append(where or "a call that does not return")
                _stuck.setdefault(label, []).append(left[0])
        raise overrun(seconds, f"{where} (blocked in a call)" if where else "a call that does not return")
    ok, value = outcome[0]
    if ok:
        return value
    raise value


def _wait_while_running(
    done: threading.Event, runner: list[int], seconds: float, overrun: QueryOverrun
) -> None:
    """Past the limit: wait on while the code still uses CPU (slowed by other threads, not
    blocked in a call), up to :data:`SLOW_FACTOR` times the limit, then raise ``QueryBusy``;
    return once it is done or uses no CPU (blocked: the caller says so)."""
    clock = _cpu_clock(runner[0]) if runner else None
    if clock is None:
        return
    cap = time.monotonic() + seconds * (SLOW_FACTOR - 1)
    used, idle = _cpu_s(clock), 0
    while time.monotonic() < cap:
        if done.wait(PROGRESS_CHECK_S):
            return
        now_used = _cpu_s(clock)
        # A call blocked in C uses no CPU at all; one of 16 replays sharing the interpreter gets
        # a thin and uneven share, now and then none in one window: blocked after IDLE_CHECKS.
        idle = idle + 1 if now_used - used < 0.001 else 0
        if idle >= IDLE_CHECKS:
            return
        used = now_used
    raise overrun.slow(seconds * SLOW_FACTOR)


def _held() -> str:
    """Which runs' queries hold runner threads blocked in a call, in words: ``spin-1 x12 at
    app.py:9 in handle, o-7 at app.py:30 in handle`` (held by calls still in their limit: none)."""
    with _lock:
        held = {label: list(where) for label, where in _stuck.items()}
    if not held:
        return "calls still within their limit"
    return ", ".join(
        f"{label}{f' x{len(where)}' if len(where) > 1 else ''} at {where[-1]}"
        for label, where in sorted(held.items(), key=lambda item: -len(item[1]))
    )


def _submit(job: Callable[[], None]) -> None:
    """Run ``job`` on an idle runner thread, or on a new one if none is idle (daemons, reused: a
    thread per call cost more than the call). A job marks its thread idle before its caller
    wakes (:func:`_idle_again`), so calls one after another reuse one thread."""
    global _threads
    with _lock:
        if _idle[0] > 0:
            _idle[0] -= 1  # taken now: two calls at once never count on one idle thread
            _jobs.put(job)
            return
        _threads += 1
        name = f"durable-limited-{_threads}"
    threading.Thread(target=_serve, args=(job,), name=name, daemon=True).start()


def _serve(job: Callable[[], None]) -> None:
    while True:
        job()
        job = _jobs.get()


def _idle_again() -> None:
    with _lock:
        _idle[0] += 1


def _slots() -> threading.BoundedSemaphore:
    global _slot_count
    with _lock:
        if _slot_count is None:
            _slot_count = threading.BoundedSemaphore(RUNNERS)
        return _slot_count


def _limited(fn: Callable[[], T], seconds: float, overrun: QueryOverrun, runner: list[int]) -> T:
    """``fn()`` on this thread, an :class:`Overrun` raised in it past ``seconds`` without a switch."""
    ident = threading.get_ident()
    runner.append(ident)
    watch = _Watch(ident, seconds)

    def switched(event: str, args: Any) -> None:
        watch.mark, watch.cpu_mark = time.monotonic(), time.thread_time()
        if previous is not None:
            previous(event, args)

    previous = greenlet.settrace(switched)
    try:
        try:
            _watch(watch)
            return fn()
        finally:
            greenlet.settrace(previous)
            _unwatch(watch)
    except Overrun:
        raise overrun(seconds, watch.where) from None


def _watch(watch: _Watch) -> None:
    global _monitor
    with _lock:
        _watches[watch.thread_id] = watch
        if _monitor is None or not _monitor.is_alive():
            _monitor = threading.Thread(target=_loop, name="durable-time-limit", daemon=True)
            _monitor.start()


def _unwatch(watch: _Watch) -> None:
    with _lock:
        _watches.pop(watch.thread_id, None)
        if watch.fired:  # an exception not delivered yet must not hit the caller's later code
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(watch.thread_id), None)


def _loop() -> None:
    global _monitor
    idle_since = time.monotonic()
    while True:
        time.sleep(0.05)
        with _lock:
            now = time.monotonic()
            if _watches:
                idle_since = now
            elif now - idle_since > MONITOR_IDLE_S:  # started again by the next call
                _monitor = None
                return
            for watch in _watches.values():
                if not watch.fired and watch.overran(now):
                    _fire(watch, now)


def _fire(watch: _Watch, now: float) -> None:
    frame = sys._current_frames().get(watch.thread_id)
    stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
    del frame
    if waiting_on_redis(stack):  # durable reading Redis (a hook secret), not workflow code looping
        watch.mark = now
        return
    watch.where = code_position(stack)
    watch.fired = True
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(watch.thread_id), ctypes.py_object(Overrun))
