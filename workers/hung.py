"""Activity threads held by abandoned attempts, found and said (the worker's heartbeat).

Python cannot stop a thread: an activity whose code never returns keeps its activity thread for
as long as the process lives, even once its attempt was abandoned -- its start-to-close or
schedule-to-close deadline passed (the scheduler failed or retried it already), its attempt is
over by the store's record (its heartbeat timeout passed without a heartbeat and the scheduler
ended it, or the activity was cancelled), or its run closed (terminated, cancelled, failed...).
Its thread does no useful work any more, yet the worker counts it busy and takes no task for it.
When every thread is held so, the worker runs no activity at all while it still looks healthy.

:class:`HungWatch` looks at the threads on every registry heartbeat: it logs a WARNING once per
abandoned attempt, an ERROR once when all the threads are held by such attempts, and gives the
registry entry its ``threads``, ``held`` and ``stuck`` fields (``durable workers``, and
``describe``/``status`` of a run whose activity waits on a queue whose workers have no usable
thread: :mod:`durable.store.held`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from durable.store.records import CLOSED_STATUSES, HEARTBEAT_S
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask
from durable.store.workers import running_entry

from .async_activities import cancel_abandoned
from .attempts import task_ids
from .timeouts import attempt_deadline

log = logging.getLogger("durable.worker")

__all__ = ["CLOSED_CHECK_S", "RUNNING_LISTED", "STUCK_LISTED", "HeldThread", "HungWatch"]

CLOSED_CHECK_S = 10.0
"""How often a long-running attempt's run and activity are read to know whether the run closed
or the attempt is over (per attempt: a worker of hundreds of long activities does not read them
all every heartbeat)."""

STUCK_LISTED = 20
"""How many held threads the registry entry describes (``held`` counts them all)."""

RUNNING_LISTED = 3
"""How many running attempts the registry entry describes (``busy`` counts them all)."""


@dataclass(frozen=True)
class HeldThread:
    """One activity thread's current attempt.

    Attributes:
        task: The attempt's task (activity name and id, run and workflow ids, attempt number).
        started: When the thread began it (this host's clock, s).
        deadline: When its start-to-close or schedule-to-close timeout ends it (``None``: none).
        run_closed: Its run's status when that run is closed or gone (``""``: open, or not read).
        over: Why the attempt is over when the store says it is no longer the activity's current
            one (the scheduler ended it: a heartbeat timeout; or the activity was cancelled;
            ``""``: current, or not read).
    """

    task: ActivityTask
    started: float
    deadline: float | None
    run_closed: str = ""
    over: str = ""

    def abandoned(self, now: float) -> bool:
        """Whether the attempt's result can no longer count: its deadline passed, its run closed,
        or its attempt is over."""
        return bool(self.run_closed or self.over) or (self.deadline is not None and now > self.deadline)

    def describe(self, now: float) -> str:
        """A short description (the registry's ``stuck``; it starts with the activity's name)."""
        t = self.task
        since = datetime.fromtimestamp(self.started, tz=UTC).strftime("%H:%M:%S")
        head = f"{t.name} ({t.activity_id}, attempt {t.attempt}) of workflow {t.workflow_id} run {t.run_id}"
        if self.deadline is not None and now > self.deadline:
            return f"{head}, since {since} UTC: {now - self.deadline:.0f} s past its {_timeout(t)} timeout"
        if self.run_closed:
            return f"{head}, since {since} UTC: its run is {self.run_closed}"
        return f"{head}, since {since} UTC: {self.over}"

    def briefly(self, now: float) -> str:
        """``fetch of workflow o-1 for 25 s (no timeout)``: a running attempt, for the registry."""
        t = self.task
        return running_entry(t.name, t.workflow_id, now - self.started, timeout=self.deadline is not None)


def _timeout(task: ActivityTask) -> str:
    """The hard timeouts of ``task`` in words (``start_to_close 2 s``)."""
    kinds = [(k, task.timeout(k)) for k in ("start_to_close", "schedule_to_close")]
    return " / ".join(f"{k} {v:g} s" for k, v in kinds if v)


def _over(task: ActivityTask, current: int | None) -> str:
    """Why an attempt that is no longer current is over, in words (``current``: the activity's
    current attempt, ``None`` when it is no longer pending)."""
    heartbeat = task.timeout("heartbeat")
    why = (
        f"no heartbeat within its heartbeat {heartbeat:g} s timeout, or cancelled"
        if heartbeat
        else "cancelled or superseded"
    )
    now_is = "the activity is no longer pending" if current is None else f"attempt {current} is current"
    return f"its attempt is over ({why}): {now_is}"


class HungWatch:
    """Finds the activity threads held by abandoned attempts, says so, and counts them.

    Args:
        store: The worker's store (a long-running attempt's run status is read from it).
        running: The attempts on the threads now: when each began (this host's clock) and its task.
        threads: How many activity threads the worker has.
        worker: The worker's name (for the log lines).
    """

    def __init__(
        self,
        store: RedisStore,
        running: Callable[[], list[tuple[float, ActivityTask]]],
        threads: int,
        worker: str,
    ) -> None:
        self.store = store
        self.running = running
        self.threads = threads
        self.worker = worker
        self._warned: set[tuple[str, str, int]] = set()  # abandoned attempts said already
        self._abandoned_before: set[tuple[str, str, int]] = set()  # seen abandoned at the last look
        # Last read of a long attempt: (when, its run's status if closed, why the attempt is over).
        self._closed: dict[tuple[str, str, int], tuple[float, str, str]] = {}
        self._starved = False  # the ERROR was said (said again once a thread freed up and was held again)

    def held(self, now: float | None = None) -> list[HeldThread]:
        """The attempts running on the threads now, each with whether its run is closed or the
        attempt is over."""
        now = time.time() if now is None else now
        out = []
        for started, task in self.running():
            deadline = attempt_deadline(task, started, heartbeat=False)
            closed = over = ""
            if (deadline is None or now <= deadline) and now - started > HEARTBEAT_S:
                closed, over = self._fate(task, now)  # only long calls: a short one is read for nothing
            out.append(HeldThread(task, started, deadline, closed, over))
        live = {_key(h.task) for h in out}
        self._closed = {k: v for k, v in self._closed.items() if k in live}
        return out

    def all_abandoned(self) -> bool:
        """Whether attempts run on the threads and every one of them is abandoned, read afresh
        (a stopping worker need not wait for attempts whose results cannot count)."""
        self._closed.clear()
        now = time.time()
        held = self.held(now)
        return bool(held) and all(h.abandoned(now) for h in held)

    def check(self) -> tuple[int, int, tuple[str, ...], int, tuple[str, ...]]:
        """Look at the threads (every heartbeat): log what is new, and return the registry's
        ``(threads, held, stuck, busy, running)``: the thread count, how many abandoned attempts
        hold one, the first :data:`STUCK_LISTED` of them described, how many threads run an
        attempt at all, and the first :data:`RUNNING_LISTED` attempts that are not abandoned."""
        now = time.time()
        on_threads = self.held(now)
        # An attempt whose own result just closed its run is on its thread a moment longer: only
        # one seen abandoned at two looks in a row is said and counted (16 activities finishing
        # together were each said to hold a thread, their results "not to count").
        seen = {_key(h.task) for h in on_threads if h.abandoned(now)}
        abandoned = [h for h in on_threads if _key(h.task) in seen & self._abandoned_before]
        self._abandoned_before = seen
        for h in abandoned:
            if _key(h.task) not in self._warned:
                self._warned.add(_key(h.task))
                self._warn(h, now)
        self._warned &= {_key(h.task) for h in abandoned}
        starved = len(abandoned) >= self.threads > 0
        if starved and not self._starved:
            log.error(
                "worker %s can run no activity: all its %d activity threads are held by abandoned "
                "attempts (%s), and Python cannot stop a thread; its queues' activity tasks wait for "
                "other workers meanwhile. Restart it (a graceful stop hands its tasks back; under "
                "`durable worker --processes N`, `kill %d` and its supervisor starts a new one), and "
                "make those activities return: a timeout in their own blocking calls, heartbeats",
                self.worker,
                self.threads,
                "; ".join(h.describe(now) for h in abandoned[:3]) + ("; ..." if len(abandoned) > 3 else ""),
                os.getpid(),
            )
        self._starved = starved
        stuck = tuple(h.describe(now) for h in abandoned[:STUCK_LISTED])
        running = tuple(h.briefly(now) for h in on_threads if not h.abandoned(now))[:RUNNING_LISTED]
        return self.threads, len(abandoned), stuck, len(on_threads), running

    def _warn(self, h: HeldThread, now: float) -> None:
        t = h.task
        fate = f"its run is {h.run_closed}" if h.run_closed else h.over
        if (h.deadline is None or now <= h.deadline) and cancel_abandoned(t.run_id, t.activity_id, t.attempt):
            log.info(  # a coroutine can be stopped, as a thread cannot
                "async activity %s (%s) of run %s: %s, so its result will not count: cancelled it",
                t.name,
                t.activity_id,
                t.run_id,
                fate,
                extra=task_ids(t),
            )
            return
        if h.deadline is not None and now > h.deadline:
            what = f"has run past its timeout ({_timeout(t)}) for {now - h.deadline:.0f} s"
            fate = "the scheduler failed or retried the attempt already"
        else:
            what = f"has run for {now - h.started:.0f} s"
        log.warning(
            "activity %s (%s) of run %s %s and still holds an activity thread (Python cannot stop a "
            "thread): %s, so its result will not count, and the thread stays held until the activity's "
            "code returns. Give its blocking calls a timeout of their own, or heartbeat (a heartbeat "
            "of an abandoned attempt raises, ending it)",
            t.name,
            t.activity_id,
            t.run_id,
            what,
            fate,
            extra=task_ids(t),
        )

    def _fate(self, task: ActivityTask, now: float) -> tuple[str, str]:
        """``(run, over)``: the run's status if it is closed (``gone``: its record is not there any
        more), and why the attempt is over when it is no longer the activity's current one (the
        scheduler ended it, or it was cancelled); ``""`` each when not so. Read at most every
        :data:`CLOSED_CHECK_S` per attempt."""
        key = _key(task)
        read = self._closed.get(key)
        if read is not None and now - read[0] < CLOSED_CHECK_S:
            return read[1], read[2]
        try:
            status = self.store.run_status(task.partition, task.run_id) or "gone"
            closed = status if status == "gone" or status in CLOSED_STATUSES else ""
            over = ""
            if not closed:
                begun = self.store.attempt_begins(task.partition, task.run_id, task.activity_id)
                current = None if begun is None else begun.attempt
                over = _over(task, current) if current != task.attempt else ""
        except Exception as exc:  # noqa: BLE001 - the heartbeat must go on; read again next time
            log.debug("could not read the state of run %s: %s", task.run_id, exc)
            return (read[1], read[2]) if read else ("", "")
        self._closed[key] = (now, closed, over)
        return closed, over


def _key(task: ActivityTask) -> tuple[str, str, int]:
    return task.run_id, task.activity_id, task.attempt
