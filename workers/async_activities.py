"""``async def`` activities: run on one event loop thread per worker process.

An activity whose function (or ``Activity.handle``) is ``async def`` returns a coroutine
when called. :func:`awaiting` makes the activity's function the innermost call of the
activity interceptors' chain such that the coroutine runs to its end right there: the
attempt's activity thread hands it to the process's event loop (a daemon thread, started on
the first async attempt) and waits for it, doing meanwhile what the coroutine must not do on
the loop: the round trips to Redis. So a coroutine never blocks the loop it shares with the
worker's other async attempts:

* The coroutine's task runs in a copy of the thread's context at that point, so what the
  interceptors set around the call (a contextvar, OpenTelemetry's current span: spans the
  coroutine opens are children of its ``RunActivity`` span) reaches the coroutine, and the
  interceptors see its result or error, after its whole run, as for a thread activity.
* ``activity_context().heartbeat(details)`` from the coroutine only records the details
  and wakes the attempt's thread, which sends them; when the reply says the activity was
  cancelled, the thread cancels the coroutine's task, and the attempt ends with
  :class:`~durable.ActivityCancelledError` (as a thread activity's next heartbeat raises).
* The attempt's hard deadline (start-to-close, schedule-to-close) is an
  ``asyncio.timeout``: past it the coroutine is cancelled and the attempt fails with
  :class:`~durable.ActivityTimeout` (a thread activity cannot be interrupted; the scheduler
  expires it instead). The scheduler's expiry is due at the same deadline, so shortly before
  it (:data:`HOLD_LEAD_S`) and again before recording its timeout, the thread asks with one
  script whether the attempt is still current and, if so, holds that expiry off
  (:data:`EXPIRY_HOLD_S`). Either the worker or (when it was first, or the worker died) the
  scheduler records the timeout: one outcome counted, and no discarded duplicate in the
  attempt log unless the two still meet (the completion script then keeps the first).
* The heartbeat timeout is the scheduler's, as for threads. Once it passed with no heartbeat
  sent, the thread asks Redis (now and then) whether the attempt is still current, and cancels
  the coroutine when the scheduler expired it; the worker then records nothing (the
  scheduler did). A thread activity learns it only at its next heartbeat.

An async attempt occupies its activity thread while it runs, so ``--concurrency`` bounds
async and thread activities alike.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import TYPE_CHECKING, Any

from durable.activity import ActivityCancelledError, ActivityContext, running_activity
from durable.errors import ActivityTimeout, frame_text
from durable.store.tasks import ActivityTask

if TYPE_CHECKING:
    from durable.store.redis_store import RedisStore

EXPIRY_HOLD_S = 5.0
"""How far past an async attempt's hard deadline the worker holds off the scheduler's expiry of
it (near the deadline, and once its own timer ended the attempt, while it records the timeout):
should the worker die meanwhile, the scheduler expires the attempt that much later."""

HOLD_LEAD_S = 0.5
"""This long before an async attempt's hard deadline, the worker holds off the scheduler's
expiry of it (to :data:`EXPIRY_HOLD_S` past the deadline): at the deadline its own timer ends
the attempt and it records the timeout, and the scheduler, due at the same moment, would
record it a second time, discarded (a race the completion script settles, visibly)."""

RECHECK_S = (0.05, 0.1, 0.25, 0.5, 1.0)
"""Past its heartbeat deadline (plus the first of these), a quiet attempt is asked about after
each of these waits, then every last one, until the scheduler has expired it: the scheduler
acts at the deadline itself, unless it is behind or down."""

Hold = Callable[[int], bool]
"""``hold(ms)``: whether the attempt is no longer current (the scheduler expired it, or the
activity was cancelled or the attempt recorded); if it still is, ``ms`` > 0 pushes the
scheduler's expiry of it to ``ms`` from now (the heartbeat script, without details)."""

# Marks on an attempt's exception, read by workers.attempts. Dunder names: the codec never
# records them with the error.
_RECORDED = "__durable_recorded_elsewhere__"
_TIMED_OUT_HERE = "__durable_timed_out_here__"

STALL_S = 2.0
"""The loop not getting to its callbacks for this long: a coroutine blocks it (logged, see
:class:`_Watchdog`)."""

log = logging.getLogger("durable.worker")
_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None
_watchdog: _Watchdog | None = None  # the loop's, once it runs


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's activity event loop, started on first use (again after a ``fork``)."""
    global _loop, _watchdog
    with _lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="durable-async-activities", daemon=True)
            thread.start()
            _watchdog = _Watchdog(loop, thread)
            _watchdog.start()
            _loop = (os.getpid(), loop)
        return _loop[1]


def loop_stall() -> str:
    """How long the event loop of async activities has not run, and where it is stuck (``""``:
    it runs, or there is none): what the worker's registry entry says (``async_stall``)."""
    watchdog = _watchdog
    if watchdog is None or not watchdog.where:
        return ""
    return f"{time.monotonic() - watchdog.last:.0f} s (stuck at {watchdog.where})"


class _Watchdog:
    """Says when an ``async def`` activity blocks the loop with a synchronous call (``time.sleep``,
    a blocking client, a CPU loop): every async attempt of the process waits meanwhile, and
    their heartbeats and timeouts with them, so the worker logs it (once per stall) with the
    line the loop is stuck at."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.loop, self.thread = loop, thread
        self.last = time.monotonic()
        self.where = ""  # while stalled: where the loop is stuck

    def start(self) -> None:
        self.loop.call_soon_threadsafe(self._tick)
        threading.Thread(target=self._watch, name="durable-async-watchdog", daemon=True).start()

    def _tick(self) -> None:
        self.last = time.monotonic()
        self.loop.call_later(STALL_S / 8, self._tick)

    def _watch(self) -> None:
        stalled = 0.0
        while self.thread.is_alive():
            time.sleep(STALL_S / 4)
            lag = time.monotonic() - self.last
            if lag > STALL_S and not stalled:
                stalled = lag
                self.where = self._where()
                log.warning(
                    "the event loop of async activities has not run for %.1f s (stuck at %s): an async def "
                    "activity makes a blocking call, and every async activity of this worker waits "
                    "meanwhile; await an async API (asyncio.sleep, an async client) or make it a plain "
                    "def activity (it gets a thread of its own)",
                    lag,
                    self.where,
                )
            elif lag <= STALL_S and stalled:
                stalled, self.where = 0.0, ""
                log.info("the event loop of async activities runs again")

    def _where(self) -> str:
        """``file:line in function`` of the innermost frame of the loop's thread outside the
        standard library (the blocking call's caller), else its innermost frame."""
        frame = sys._current_frames().get(self.thread.ident or -1)  # noqa: SLF001 - a stack, read only
        if frame is None:
            return "an unknown place"
        stack = traceback.extract_stack(frame)
        stdlib = sysconfig.get_paths()["stdlib"]
        own = [f for f in stack if not f.filename.startswith(stdlib)] or stack
        return frame_text(own[-1])


def hard_deadline(task: ActivityTask, started: float) -> tuple[float, str] | None:
    """When an attempt started at ``started`` must end whatever it does, and which timeout
    that is (``start_to_close`` or ``schedule_to_close``); ``None`` when neither is set."""
    limits = []
    start_to_close, schedule_to_close = task.timeout("start_to_close"), task.timeout("schedule_to_close")
    if start_to_close:
        limits.append((started + start_to_close, "start_to_close"))
    if schedule_to_close:
        limits.append((task.scheduled / 1000 + schedule_to_close, "schedule_to_close"))
    return min(limits) if limits else None


def recorded_elsewhere(exc: BaseException) -> bool:
    """Whether the attempt that raised ``exc`` was no longer current when it ended (the scheduler
    expired it and recorded its outcome, or its activity ended otherwise): recording ``exc``
    would only add a discarded duplicate to the attempt log."""
    return bool(getattr(exc, _RECORDED, False))


def timed_out_here(exc: BaseException) -> str:
    """The kind of deadline (``start_to_close``, ``schedule_to_close``) at which the worker's own
    timer ended the attempt that raised ``exc``; ``""`` when it did not."""
    return exc.kind if isinstance(exc, ActivityTimeout) and getattr(exc, _TIMED_OUT_HERE, False) else ""


def awaiting(
    fn: Callable[..., Any], store: RedisStore, task: ActivityTask, context: ActivityContext, started: float
) -> Callable[..., Any]:
    """``fn``, for the innermost call of the activity interceptors' chain: when it returns a
    coroutine (an ``async def`` activity), the coroutine runs there to its end (see the module
    docstring) and the call returns its result. ``started``: when the attempt began."""
    return partial(_call, fn, store, task, context, started)


def _call(
    fn: Callable[..., Any],
    store: RedisStore,
    task: ActivityTask,
    context: ActivityContext,
    started: float,
    *args: Any,
) -> Any:
    value = fn(*args)
    if not inspect.iscoroutine(value):
        return value

    def hold(ms: int) -> bool:
        return store.heartbeat(task, b"", ms)

    deadline = hard_deadline(task, started)
    return run_coroutine(value, context, deadline, heartbeat_timeout=task.timeout("heartbeat"), hold=hold)


class _Beats:
    """Heartbeats of one async attempt: recorded by the coroutine, sent by the attempt's thread,
    which also watches the attempt's deadlines with ``hold`` (see :data:`Hold`)."""

    def __init__(
        self,
        send: Callable[[Any], bool] | None,
        deadline: tuple[float, str] | None,
        heartbeat_timeout: float | None,
        hold: Hold | None,
    ) -> None:
        self.send = send
        self.wake = threading.Event()
        self.details: list[Any] = []  # the latest unsent details (at most one)
        self.cancelled = False
        self.task: asyncio.Task[Any] | None = None  # set by the task itself, on the loop
        self.timed_out = False  # set on the loop when the hard deadline cancelled the coroutine
        self.superseded = False  # the attempt is no longer current (the scheduler expired it)
        self.abandoned = False  # its result can no longer count (cancel_abandoned): cancel it
        self.hold = hold
        now = time.monotonic()
        self.deadline = deadline[0] if deadline is not None and hold is not None else None
        # Monotonic times of the next hold-off of the scheduler's expiry, and heartbeat check.
        self.hold_at = now + self.deadline - time.time() - HOLD_LEAD_S if self.deadline else math.inf
        self.heartbeat_timeout = float(heartbeat_timeout or 0) if hold is not None else 0.0
        self.check_at = now + self.heartbeat_timeout + RECHECK_S[0] if self.heartbeat_timeout else math.inf
        self.checks = 0
        self.held = False

    def record(self, details: Any) -> bool:
        """The context's heartbeat function inside the coroutine: never blocks the loop."""
        self.details[:] = [details]
        self.wake.set()
        return False  # cancellation arrives as the task's cancel, at the coroutine's next await

    def flush(self) -> bool:
        """Send the latest details (on the attempt's thread); whether the activity is cancelled."""
        if not self.details or self.send is None:
            return False
        details = self.details.pop()
        cancelled = self.send(details)
        now = time.monotonic()
        if self.heartbeat_timeout:  # the scheduler's heartbeat deadline moved: so does the check
            self.checks = 0
            self.check_at = now + self.heartbeat_timeout + RECHECK_S[0]
        if self.held:  # a heartbeat sets the expiry back to the hard deadline at most: hold again
            self.held, self.hold_at = False, now
        return cancelled

    def wait_s(self) -> float | None:
        """How long the thread may wait for a heartbeat before it has to ask about the attempt."""
        soonest = min(self.hold_at, self.check_at)
        return None if soonest == math.inf else max(0.0, soonest - time.monotonic())

    def watch(self) -> bool:
        """Hold off the scheduler's expiry near the hard deadline, check a quiet attempt past
        its heartbeat deadline; whether the attempt is no longer current (cancel the coroutine)."""
        now = time.monotonic()
        if self.hold is None or min(self.hold_at, self.check_at) > now:
            return False
        ms = 0
        if self.hold_at <= now and self.deadline is not None:
            self.held, self.hold_at = True, math.inf  # until a heartbeat sets the expiry back
            ms = max(1, int((self.deadline - time.time() + EXPIRY_HOLD_S) * 1000))
        if self.check_at <= now:
            self.checks += 1
            self.check_at = now + RECHECK_S[min(self.checks, len(RECHECK_S) - 1)]
        try:
            self.superseded = self.hold(ms)
        except Exception:  # noqa: BLE001 - Redis unavailable for now: asked again at the next check
            return False
        return self.superseded


def run_coroutine(
    coroutine: Coroutine[Any, Any, Any],
    context: ActivityContext,
    deadline: tuple[float, str] | None,
    *,
    heartbeat_timeout: float | None = None,
    hold: Hold | None = None,
) -> Any:
    """Run an async activity's coroutine on the process's loop, in a copy of this thread's
    context, and return its result (or raise its error), sending its heartbeats from this
    thread meanwhile. ``deadline``: the attempt's hard deadline (wall clock) and which timeout
    it is, if any; ``hold``: see :data:`Hold` (without it, the worker cannot tell whether the
    scheduler expired the attempt: it records every timeout, and never checks a quiet one).

    Raises:
        ActivityCancelledError: a heartbeat's reply said the activity was cancelled, or the
            heartbeat timeout passed and the scheduler expired the attempt.
        ActivityTimeout: ``deadline`` (wall clock, and which timeout it is) passed first.
    """
    loop = event_loop()
    beats = _Beats(context._heartbeat_fn, deadline, heartbeat_timeout, hold)  # noqa: SLF001 - sent here
    key = (context.run_id, context.activity_id, context.attempt)
    _running[key] = beats
    context._heartbeat_fn = beats.record  # noqa: SLF001 - the coroutine's heartbeat must not block
    # The copy is taken here, inside the interceptors' chain: what they set is in it.
    future: Future[Any] = Future()
    attempt = _attempt(coroutine, context, deadline, beats)
    loop.call_soon_threadsafe(_start, loop, attempt, contextvars.copy_context(), future)
    future.add_done_callback(lambda _: beats.wake.set())
    try:
        while not future.done():
            beats.wake.wait(beats.wait_s())
            beats.wake.clear()
            # Heartbeats go on being sent after a cancel: the coroutine's cleanup may send some.
            cancelled = beats.flush()
            if not beats.cancelled and (cancelled or beats.watch() or beats.abandoned):
                beats.cancelled = True
                # Cancel the task itself (not the future): the attempt ends when the coroutine
                # has finished its cleanup, not before.
                loop.call_soon_threadsafe(_cancel, beats)
    finally:
        _running.pop(key, None)
    try:
        return future.result()
    except _Escaped as escaped:
        raise escaped.error from None  # recorded as the attempt's failure (SystemExit: 2)
    except BaseException as exc:
        if beats.cancelled and isinstance(exc, asyncio.CancelledError | CancelledError):
            error = ActivityCancelledError(
                f"activity {context.activity_id} of run {context.run_id} was cancelled"
                + (" (no longer current: timed out or cancelled)" if beats.superseded else "")
            )
            if beats.superseded:
                setattr(error, _RECORDED, True)
            raise error from None
        if beats.timed_out and isinstance(exc, ActivityTimeout):
            _claim_timeout(exc, hold)
        raise


def _claim_timeout(exc: ActivityTimeout, hold: Hold | None) -> None:
    """Mark ``exc`` (the attempt's own timer ended it) for the worker to record, unless the
    scheduler expired the attempt first; then the scheduler stands back while it does."""
    setattr(exc, _TIMED_OUT_HERE, True)
    if hold is None:
        return
    try:
        if hold(int(EXPIRY_HOLD_S * 1000)):
            setattr(exc, _RECORDED, True)
    except Exception:  # noqa: BLE001 - Redis unavailable: recorded anyway (refused if the scheduler was first)
        pass


class _Escaped(Exception):  # noqa: N818 - a carrier, not an error of its own
    """A ``SystemExit`` or ``KeyboardInterrupt`` an attempt's coroutine raised (``sys.exit()``
    in a library it calls), carried to the attempt's thread as a plain exception: asyncio lets
    those two out of a task's step, which would end the loop and hang every async attempt."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


async def _contained(coroutine: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coroutine
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _Escaped(exc) from None


def _start(
    loop: asyncio.AbstractEventLoop,
    coroutine: Coroutine[Any, Any, Any],
    context: contextvars.Context,
    future: Future[Any],
) -> None:
    """On the loop: the attempt's task, in ``context``; its end settles ``future``."""
    try:
        task = loop.create_task(coroutine, context=context)
    except Exception as exc:  # the attempt's thread waits on the future: never leave it pending
        coroutine.close()
        future.set_exception(exc)
        return
    task.add_done_callback(partial(_settle, future))


def _settle(future: Future[Any], task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        future.cancel()
    elif (error := task.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(task.result())


_running: dict[tuple[str, str, int], _Beats] = {}  # the attempts running now, by (run, activity, attempt)


def cancel_abandoned(run_id: str, activity_id: str, attempt: int) -> bool:
    """Cancel the coroutine of an async attempt whose result can no longer count (its run closed,
    the attempt was superseded): whether it is one. A thread cannot be stopped; a coroutine can,
    at its next await (its ``CancelledError`` lets it clean up)."""
    beats = _running.get((run_id, activity_id, attempt))
    if beats is None:
        return False
    beats.abandoned = beats.superseded = True  # its outcome is no one's to record
    beats.wake.set()
    return True


def _cancel(beats: _Beats) -> None:
    if beats.task is not None:
        beats.task.cancel()


async def _attempt(
    coroutine: Coroutine[Any, Any, Any],
    context: ActivityContext,
    deadline: tuple[float, str] | None,
    beats: _Beats,
) -> Any:
    beats.task = asyncio.current_task()
    if beats.cancelled:  # cancelled before the loop got to it
        coroutine.close()
        raise asyncio.CancelledError
    remaining = None if deadline is None else max(0.0, deadline[0] - time.time())
    with running_activity(context):
        timeout = asyncio.timeout(remaining)
        try:
            async with timeout:
                result = await _contained(coroutine)
        except TimeoutError:
            if timeout.expired():
                raise _timed_out(context, deadline, beats) from None
            raise
        # It swallowed the cancel and returned late, or it never awaited, so the loop never ran
        # the timer: past its deadline all the same (a thread activity's late result fails too).
        if timeout.expired() or (deadline is not None and time.time() > deadline[0]):
            raise _timed_out(context, deadline, beats)
        return result


def _timed_out(
    context: ActivityContext, deadline: tuple[float, str] | None, beats: _Beats
) -> ActivityTimeout:
    assert deadline is not None
    kind = deadline[1]
    beats.timed_out = True
    return ActivityTimeout(
        f"activity {context.name} ({context.activity_id}) exceeded its {kind}_timeout and was "
        "cancelled; raise the timeout or make the activity faster",
        kind=kind,
    )
