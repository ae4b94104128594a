"""``async def`` activities: run on one event loop thread per worker process.

An activity whose function (or ``Activity.handle``) is ``async def`` returns a coroutine
when called. The attempt's activity thread hands that coroutine to the process's event
loop (a daemon thread, started on the first async attempt) and waits for it, doing
meanwhile what the coroutine must not do on the loop: the heartbeats' round trips to
Redis. So a coroutine never blocks the loop it shares with the worker's other async
attempts:

* ``activity_context().heartbeat(details)`` from the coroutine only records the details
  and wakes the attempt's thread, which sends them; when the reply says the activity was
  cancelled, the thread cancels the coroutine's task, and the attempt ends with
  :class:`~durable.ActivityCancelledError` (as a thread activity's next heartbeat raises).
* The attempt's hard deadline (start-to-close, schedule-to-close) is an
  ``asyncio.timeout``: past it the coroutine is cancelled and the attempt fails with
  :class:`~durable.ActivityTimeout` (a thread activity cannot be interrupted; the scheduler
  expires it instead). The heartbeat timeout is the scheduler's, as for threads.

An async attempt occupies its activity thread while it runs, so ``--concurrency`` bounds
async and thread activities alike.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import CancelledError, Future
from typing import Any

from durable.activity import ActivityCancelledError, ActivityContext, running_activity
from durable.errors import ActivityTimeout
from durable.store.tasks import ActivityTask

_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's activity event loop, started on first use (again after a ``fork``)."""
    global _loop
    with _lock:
        if _loop is None or _loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="durable-async-activities", daemon=True)
            thread.start()
            _loop = (os.getpid(), loop)
        return _loop[1]


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


class _Beats:
    """Heartbeats of one async attempt: recorded by the coroutine, sent by the attempt's thread."""

    def __init__(self, send: Callable[[Any], bool] | None) -> None:
        self.send = send
        self.wake = threading.Event()
        self.details: list[Any] = []  # the latest unsent details (at most one)
        self.cancelled = False
        self.task: asyncio.Task[Any] | None = None  # set by the task itself, on the loop

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
        return self.send(details)


def run_coroutine(
    coroutine: Coroutine[Any, Any, Any],
    context: ActivityContext,
    deadline: tuple[float, str] | None,
) -> Any:
    """Run an async activity's coroutine on the process's loop and return its result (or
    raise its error), sending its heartbeats from this thread meanwhile. ``deadline``: the
    attempt's hard deadline (wall clock) and which timeout it is, if any.

    Raises:
        ActivityCancelledError: a heartbeat's reply said the activity was cancelled.
        ActivityTimeout: ``deadline`` (wall clock, and which timeout it is) passed first.
    """
    loop = event_loop()
    beats = _Beats(context._heartbeat_fn)  # noqa: SLF001 - sent from this thread, not the loop
    context._heartbeat_fn = beats.record  # noqa: SLF001 - the coroutine's heartbeat must not block
    # The task sets the attempt's context in its own copy of the context (not the thread's).
    future: Future[Any] = asyncio.run_coroutine_threadsafe(
        _attempt(coroutine, context, deadline, beats), loop
    )
    future.add_done_callback(lambda _: beats.wake.set())
    while not future.done():
        beats.wake.wait()
        beats.wake.clear()
        if beats.flush() and not beats.cancelled:
            beats.cancelled = True
            # Cancel the task itself (not the future): the attempt ends when the coroutine
            # has finished its cleanup, not before.
            loop.call_soon_threadsafe(_cancel, beats)
    try:
        return future.result()
    except BaseException as exc:
        if beats.cancelled and isinstance(exc, asyncio.CancelledError | CancelledError):
            raise ActivityCancelledError(
                f"activity {context.activity_id} of run {context.run_id} was cancelled"
            ) from None
        raise


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
                return await coroutine
        except TimeoutError:
            if timeout.expired():
                assert deadline is not None
                kind = deadline[1]
                raise ActivityTimeout(
                    f"activity {context.name} ({context.activity_id}) exceeded its {kind}_timeout and was "
                    "cancelled; raise the timeout or make the activity faster",
                    kind=kind,
                ) from None
            raise
