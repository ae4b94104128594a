"""A time limit on workflow code run outside a worker: the read-only replay of a query.

A query replays the run's history in the calling process -- the CLI, a thread of the HTTP
server, an application -- and then calls the ``@query`` method. Workflow code that busy-loops
(a bug, or the very run a worker blocked as ``runaway_decision``) held that thread for ever: the
CLI hung, and each such request took a server thread for good, until SIGTERM could not stop the
server either. A worker stops such code by giving the run up and exiting (``workers.watchdog``);
a client cannot, so :func:`run_limited` raises an exception in the running thread
(``PyThreadState_SetAsyncExc``) once the code has run :data:`QUERY_TIMEOUT` seconds without
handing control back to durable (a greenlet switch restarts the clock, as for a decision).

Python delivers that exception at the thread's next bytecode: a busy loop ends at once, a call
blocked in C (``time.sleep(600)``) only when it returns. So the code runs on a thread of its own
(:data:`RUNNERS` of them per process) and the caller stops waiting a moment past the limit.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import ctypes
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import greenlet
import redis

from .errors import Overrun, QueryFailed

__all__ = [
    "BLOCKED_GRACE_S",
    "QUERY_TIMEOUT",
    "RUNNERS",
    "Overrun",
    "code_position",
    "query_overrun",
    "run_limited",
    "waiting_on_redis",
]

QUERY_TIMEOUT = 5.0
"""Seconds a query's replay and ``@query`` method may run workflow code without yielding."""

RUNNERS = 16
"""Threads limited code runs on, per process (queries at once; one blocked in a call holds one)."""

BLOCKED_GRACE_S = 1.0
"""How long past the limit a caller waits for code that did not take its exception (blocked in
a call) before it gets the error anyway."""

MONITOR_IDLE_S = 10.0
"""How long the monitor thread outlives the last limited call (a thread per query costs more
than the query: a busy server keeps one)."""

T = TypeVar("T")

_OWN = tuple(str(Path(path).parent) + os.sep for path in (__file__, greenlet.__file__ or ""))
_IO = tuple(str(p) + os.sep for p in (Path(__file__).parent / "store", Path(redis.__file__ or "").parent))
_PATHS = sysconfig.get_paths()
_STDLIB = tuple({_PATHS["stdlib"] + os.sep, _PATHS["platstdlib"] + os.sep})
_SITE = tuple({_PATHS["purelib"] + os.sep, _PATHS["platlib"] + os.sep})


def code_position(stack: Sequence[traceback.FrameSummary], own: tuple[str, ...] = ()) -> str:
    """The innermost frame of the app's code in ``stack`` (not durable's, greenlet's, the
    standard library's, nor under the ``own`` folders), as ``path:line in function``."""
    chosen = stack[-1] if stack else None
    for frame in reversed(stack):
        path = frame.filename
        generated = path.startswith("<")  # code made at run time ("<string>": a dataclass's __init__)
        if (
            not generated
            and not path.startswith(_OWN + own)
            and (not path.startswith(_STDLIB) or path.startswith(_SITE))
        ):
            chosen = frame
            break
    if chosen is None:
        return "an unknown position"
    path = chosen.filename
    try:
        path = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        pass
    if path.startswith(".." + os.sep):
        path = chosen.filename
    return f"{path}:{chosen.lineno} in {chosen.name}"


def waiting_on_redis(stack: traceback.StackSummary) -> bool:
    """Whether ``stack`` is in durable's store or redis-py: workflow code never calls them, so
    durable itself is loading or recording, and a slow Redis is not a runaway."""
    return any(frame.filename.startswith(_IO) for frame in stack)


def query_overrun(name: str, workflow_id: str) -> Callable[[float, str], Exception]:
    """The error of a query whose replay or method overran (for :func:`run_limited`)."""

    def error(seconds: float, where: str) -> Exception:
        return QueryFailed(
            f"@query {name!r} of workflow {workflow_id!r} did not return within {seconds:g} s: workflow "
            f"code ran without yielding at {where or 'an unknown position'} (a query replays the run's "
            "code, then calls the @query method): fix the code (a loop in the run's code, not in the "
            "@query method, blocks the run in its worker too, as a runaway decision: `durable repair "
            f"{workflow_id}` after the fix)",
            name=name,
        )

    return error


class _Watch:
    def __init__(self, thread_id: int, seconds: float) -> None:
        self.thread_id = thread_id
        self.seconds = seconds
        self.mark = time.monotonic()  # the code last showed progress (a greenlet switch)
        self.where = ""  # set when it overran
        self.fired = False


_lock = threading.Lock()
_watches: dict[int, _Watch] = {}
_monitor: threading.Thread | None = None
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def run_limited(fn: Callable[[], T], seconds: float, overrun: Callable[[float, str], Exception]) -> T:
    """``fn()``, stopped once it runs ``seconds`` without a greenlet switch.

    It runs on one of :data:`RUNNERS` threads of the process while the caller waits: code
    blocked in a call (``time.sleep(600)``) gets its exception only when the call returns, and
    the caller does not wait for that (:data:`BLOCKED_GRACE_S` after the limit it gets the error;
    the runner stays held meanwhile, so a process never has more than :data:`RUNNERS` of them).

    Args:
        fn: The code to run.
        seconds: The limit (0 or less: none). Not applied under a debugger (``sys.gettrace()``).
        overrun: Builds the error raised instead, from the limit and the code's position.
    """
    if seconds <= 0 or sys.gettrace() is not None or threading.get_ident() in _watches:
        return fn()
    runner: list[int] = []
    context = contextvars.copy_context()  # the caller's (interceptors' headers, the test kit's)
    future = _runners().submit(context.run, _limited, fn, seconds, overrun, runner)
    try:
        return future.result(timeout=seconds + BLOCKED_GRACE_S)
    except concurrent.futures.TimeoutError:
        if not runner:  # it never started: every runner is held by a blocked call
            future.cancel()
            raise overrun(
                seconds, f"no free query thread: all {RUNNERS} are held by code blocked in a call"
            ) from None
        frame = sys._current_frames().get(runner[0])
        where = code_position(traceback.extract_stack(frame)) if frame is not None else ""
        del frame
        raise overrun(seconds, f"{where} (blocked in a call)" if where else "") from None


def _runners() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(RUNNERS, thread_name_prefix="durable-limited")
        return _pool


def _limited(
    fn: Callable[[], T], seconds: float, overrun: Callable[[float, str], Exception], runner: list[int]
) -> T:
    """``fn()`` on this thread, an :class:`Overrun` raised in it past ``seconds`` without a switch."""
    ident = threading.get_ident()
    runner.append(ident)
    watch = _Watch(ident, seconds)

    def switched(event: str, args: Any) -> None:
        watch.mark = time.monotonic()
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
                if not watch.fired and now - watch.mark >= watch.seconds:
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
