"""The activity side of a worker: its threads, the backlog they may hold, leases, results in hand.

The worker's main thread reads activity tasks and decides workflow tasks; everything that runs
on an activity thread, and the bookkeeping shared with it, lives here:

* queued activity tasks (read from a stream) run on a thread and their results come back to the
  main thread, which records them in batches (:meth:`ActivityHost.record`);
* leased activities (eager mode, local activities) are started by the decider's commit and their
  results, in eager mode, are committed with the run's next decision;
* the backlog: how many activities this worker holds, running or waiting for a thread: one per
  free thread, and beyond that only a small prefetch of activities known to take microseconds
  (:mod:`workers.pace`), so that tasks it cannot start now stay in their queue's backlog.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from durable import events as ev
from durable.activity import set_worker_identity
from durable.errors import error_text
from durable.store.activities import Begun
from durable.store.connect import is_redis_error, is_transient
from durable.store.outage import Incident
from durable.store.redis_store import ClaimedTask, RedisStore
from durable.store.tasks import ActivityTask, AttemptOutcome, AttemptResult

from .attempts import (
    Unserved,
    complete_batch,
    completion,
    execute_attempt,
    record_in_hand,
    run_activity,
)
from .hung import HungWatch
from .pace import BACKLOG_MS, MOST_PER_THREAD, STALLED_S, Pace, task_name
from .threads import ActivityThreads
from .timeouts import attempt_deadline

log = logging.getLogger("durable.worker")

__all__ = ["BACKLOG_MS", "MOST_PER_THREAD", "ActivityHost"]  # the bounds, re-exported (tests)


class Queued(NamedTuple):
    """An activity task read from (or claimed in) ``stream``, on its way to a thread.

    Attributes:
        stream: Its task stream.
        entry_id: Its entry there (pending for this worker until it is acked or given back).
        fields: The entry's fields.
        redelivered: Reclaimed from another worker.
        begun: Its attempt was begun already, by the commit that claimed it for this worker.
        task: Its body, decoded already (a claimed task), else ``None``.
    """

    stream: str
    entry_id: str
    fields: dict[bytes, bytes]
    redelivered: bool
    begun: Begun | None
    task: ActivityTask | None

    def decoded(self) -> ActivityTask:
        """Its task (raises on a body that does not decode: its thread parks it)."""
        return self.task or ActivityTask.decode(self.fields[b"body"])


class ActivityHost:
    """A worker's activity threads and what they share with its main thread.

    Args:
        store: The worker's store.
        concurrency: Activity threads.
        queues: The queues the worker serves (eager mode leases only their activities).
        allowed: Whether an activity type may run here.
        identity: The worker's consumer name and session queue (what an activity sees).
        eager: Commit leased activities' results with the run's next decision.
        wake: Interrupts the main thread's blocking read (a result is in hand).
        on_timer: Tells the scheduler of a new due time (a retry).
    """

    def __init__(
        self,
        store: RedisStore,
        *,
        concurrency: int,
        queues: Sequence[str],
        allowed: Callable[[str], bool],
        identity: tuple[str, str],
        eager: bool,
        wake: Callable[[], None],
        on_timer: Callable[[int], None],
    ) -> None:
        self.store = store
        self.concurrency = concurrency
        self.queues = list(queues)
        self.allowed = allowed
        self.eager = eager
        self.wake = wake
        self.on_timer = on_timer
        self.unserved: Unserved | None = None  # set once the worker's routing exists
        self.consumer = identity[0]
        self._claimable = {*self.queues, identity[1]}  # its queues and its session queue
        self._pool = ActivityThreads(concurrency, initializer=set_worker_identity, initargs=identity)
        # Which attempts hold the threads, and those abandoned (the registry heartbeat asks it).
        self.hung = HungWatch(store, self.running, concurrency, identity[0])
        self.busy = 0
        self._lock = threading.Lock()
        self.in_flight: dict[tuple[str, str], float] = {}
        self._reserved = 0
        self.pace = Pace(concurrency)  # recent run times per activity type: the prefetch they allow
        self._refused_at = 0.0  # when :meth:`takes` last refused a task a read brought (monotonic)
        # Leased attempts running here without a deadline of their own: (p, run, activity, attempt).
        self.leases: set[tuple[int, str, str, int]] = set()
        self.eager_done: deque[AttemptResult] = deque()
        # Results of queued activity tasks, recorded by the main thread in batches.
        self.completed: deque[AttemptOutcome] = deque()
        self.activities_run = 0
        # Tasks a read brought beyond this worker's room whose hand-back an outage cut short.
        self._not_given_back: list[tuple[str, str, dict[bytes, bytes]]] = []
        # Beginning an attempt that Redis refuses (OOM, a stall): its task goes back (see left_over).
        self._taking = Incident(
            log, "activity thread pool (beginning attempts)", until="putting their tasks back"
        )

    @property
    def results_in_hand(self) -> bool:
        """Whether finished attempts wait for the main thread to record them. Those a key of the
        wrong kind refused (kept) do not count: they are tried again at every pass, but do not
        make every pass a non-blocking one (a busy loop of failing scripts, thousands a second)."""
        return bool(self.eager_done) or any(not o.kept for o in list(self.completed))

    def held(self) -> set[tuple[str, str]]:
        """``(stream, entry id)`` of every task this host holds: on its threads or waiting for
        one, or finished with its result not yet recorded (still pending in Redis until then)."""
        # In this order: a thread puts its result in hand before it leaves in_flight.
        with self._lock:
            held = set(self.in_flight)
            held |= {(s, e) for s, e, _ in self._not_given_back}
        return held | {(r.stream, r.entry_id) for r in list(self.completed) + list(self.eager_done)}

    def record(
        self,
        apply_eager: Callable[[list[AttemptResult]], None],
        complete: Callable[[list[AttemptOutcome]], None] | None = None,
    ) -> None:
        """Record the results in hand (main thread): queued ones in one batch (by ``complete``
        if given), eager ones through ``apply_eager`` (with their runs' next decisions)."""
        if self.completed or self.eager_done:
            record_in_hand(self.store, self.completed, self.eager_done, apply_eager, complete)

    def running(self) -> list[tuple[float, ActivityTask]]:
        """The attempts on the threads now: when each began (this host's clock, s) and its task."""
        out = []
        offset = time.time() - time.monotonic()
        for began, fn, args in self._pool.running():
            try:  # the calls :meth:`run_leased` and :meth:`submit` hand to the threads
                task = args[0].decoded() if fn == self._activity else args[0]
            except Exception:  # noqa: BLE001 - an undecodable task is parked at once: not held
                continue
            out.append((began + offset, task))
        return out

    # ------------------------------------------------------------ backlog
    def runs_here(self, scheduled: ev.ActivityScheduled) -> bool:
        """Whether this worker runs an activity its decision scheduled, under a lease.

        Local activities always do; in eager mode, others do while :meth:`takes` one of its
        type (a free thread, or a small prefetch of an activity known to take microseconds).
        The rest go to the activity queue, where any worker can take them, so one worker never
        hoards a fan-out of slow work.
        """
        if not self.allowed(scheduled.name):
            return False
        if scheduled.local:
            return self._reserve(scheduled.name, bounded=False)
        return self.eager and scheduled.queue in self.queues and self._reserve(scheduled.name)

    def claims_here(self, scheduled: ev.ActivityScheduled) -> bool:
        """Whether the commit of the decision that scheduled this queued activity should read
        its task for this worker (:meth:`run_claimed`): a queue it serves, a type it has, and
        room (:meth:`takes`), so the task starts without a read and a begin round trip of its
        own. Otherwise it waits in its stream, in the queue's backlog, for any worker.
        (Claiming only for a free thread left most of a busy worker's tasks to that slower path.)
        """
        if scheduled.queue not in self._claimable or not self.allowed(scheduled.name):
            return False
        return self._reserve(scheduled.name)

    def _reserve(self, name: str, *, bounded: bool = True) -> bool:
        """Take a place for a leased or claimed activity of type ``name`` (``bounded``: only if
        :meth:`takes` one); given back by :meth:`lease_dropped` or when it is run."""
        with self._lock:
            if bounded and not self._room(name):
                return False
            self._reserved += 1
            return True

    def takes(self, fields: dict[bytes, bytes]) -> bool:
        """Whether this worker may take one more activity task (a read's ``fields``) now: a thread
        is free, or the task is in the small prefetch :mod:`workers.pace` allows (an activity type
        known to take microseconds, on threads that are turning over). Its type is decoded only
        in the second case: with a thread free, the task runs whatever it is."""
        with self._lock:
            if self.busy + self._reserved < self.concurrency:
                return True
        name = task_name(fields)
        with self._lock:
            if self._room(name):
                return True
        # Reads ask for no prefetch a while: a read for it brought a type that gets none (it goes
        # back to its stream), and would bring it back at once, over and over.
        self._refused_at = time.monotonic()
        return False

    def _room(self, name: str) -> bool:  # under self._lock
        held = self.busy + self._reserved
        if held < self.concurrency:
            return True
        return held < self.pace.limit(name, self._pool.stalled(STALLED_S))

    def read_room(self) -> int:
        """How many activity tasks a read may bring now (:meth:`takes` decides each of them):
        the free threads, plus the prefetch of the fastest type while no thread is stalled."""
        with self._lock:
            held = self.busy + self._reserved
        free = self.concurrency - held
        if self._pool.stalled(STALLED_S) or time.monotonic() - self._refused_at < STALLED_S:
            return max(0, free)
        return max(free, self.pace.most() - held)

    def waiting(self) -> int:
        """Activities this worker holds that no thread runs yet (taken as prefetch)."""
        with self._lock:
            return max(0, self.busy + self._reserved - self.concurrency)

    def shed(self) -> None:
        """Give back the tasks waiting here behind threads stalled in long attempts, beyond what
        the prefetch allows now (main thread, every pass; cheap unless a thread stalled).

        A task taken as prefetch (an activity type that took microseconds: read, claimed by this
        worker's commit, or leased in eager mode) waits for a thread here, where no other worker
        can take it, and a claimed one is said to run here (its claim began its attempt). When
        the type turns slow, or a hung attempt holds the thread, it would wait for as long as
        that takes (forever, for a thread held by a hung attempt), and its timeout would run
        meanwhile: it goes back to its queue for any worker instead."""
        stalled = self._pool.stalled(STALLED_S)
        if stalled and self.waiting():
            self._give_back(stalled)

    def hand_back_excess(self, excess: dict[str, list[tuple[str, dict[bytes, bytes]]]]) -> None:
        """Put tasks a read brought beyond this worker's room back at the ends of their streams,
        for any worker (main thread). Those an outage kept from going back are remembered for
        :meth:`hand_back_left`, rather than left pending here until a reclaim after --claim-idle
        while ``durable status`` says they wait on their queue."""
        try:
            self.store.requeue(excess)
        except BaseException:
            # Some may have gone back before the reply was lost: hand_back_left moves only those
            # still pending here.
            with self._lock:
                self._not_given_back += [(s, e, f) for s, items in excess.items() for e, f in items]
            raise

    @property
    def left_over(self) -> bool:
        """Whether tasks wait for :meth:`hand_back_left`: their hand-back, or their attempt's
        beginning, met Redis unavailable (the worker's loop puts them back at its next pass)."""
        return bool(self._not_given_back)

    def hand_back_left(self) -> None:
        """Put back the tasks :meth:`hand_back_excess` could not (the first pass after an outage):
        each only if it is still pending for this worker (``lua/return_task.lua``), so a hand-back
        that went through before its reply was lost does not queue a task twice. Raises while
        Redis is still unavailable (they stay remembered)."""
        with self._lock:
            left = list(self._not_given_back)
        if not left:
            return
        tasks, undecodable = [], []
        for stream, entry_id, fields in left:
            try:
                tasks.append((stream, entry_id, ActivityTask.decode(fields[b"body"]), False))
            except Exception:  # noqa: BLE001 - a reclaim hands it to a worker, which parks it
                undecodable.append(entry_id)
        self.store.return_tasks(self.consumer, tasks)
        done = {(s, e) for s, e, _ in left}
        with self._lock:  # (activity threads may have added some meanwhile)
            self._not_given_back = [t for t in self._not_given_back if (t[0], t[1]) not in done]
        if undecodable:
            log.warning("%d task(s) with a body that does not decode wait for a reclaim", len(undecodable))

    def _give_back(self, stalled: int | None) -> None:
        """Take the calls no thread started; keep, with ``stalled`` given, what the pace allows
        beside that many stalled threads, and give the others back: queued tasks to the end of
        their streams, leased attempts to their queues (``None``: all of them: the worker stops)."""
        calls = self._pool.take_waiting()
        with self._lock:
            held = self.busy + self._reserved - len(calls)
        keep: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        queued: list[tuple[Queued, ActivityTask]] = []
        leased: list[ActivityTask] = []
        for fn, args in calls:
            task = _returnable(args[0]) if fn == self._activity else args[0]
            if task is None or (stalled is not None and held < self.pace.limit(task.name, stalled)):
                keep.append((fn, args))
                held += 1
            elif fn == self._activity:
                queued.append((args[0], task))
            else:
                leased.append(task)
        for fn, args in keep:
            self._pool.submit(fn, *args)
        moved = (self._return_queued(queued) if queued else 0) + (
            self._return_leased(leased) if leased else 0
        )
        if moved:
            log.info(
                "gave back %d activity task(s) (%s) that waited for a thread here%s, for any worker",
                moved,
                ", ".join(sorted({t.name for _, t in queued} | {t.name for t in leased})),
                "" if stalled is None else f", behind {stalled} thread(s) busy with long attempts",
            )

    def _return_queued(self, queued: list[tuple[Queued, ActivityTask]]) -> int:
        """Queued tasks to the end of their streams, a claim's begin undone; how many went."""
        try:
            self.store.return_tasks(
                self.consumer, [(q.stream, q.entry_id, task, q.begun is not None) for q, task in queued]
            )
        except Exception:  # noqa: BLE001 - they wait here for a thread, as they did
            self._keep_waiting([(self._activity, (q,)) for q, _ in queued])
            return 0
        with self._lock:
            self.busy -= len(queued)
            for q, _ in queued:
                self.in_flight.pop((q.stream, q.entry_id), None)
        return len(queued)

    def _return_leased(self, leased: list[ActivityTask]) -> int:
        """Leased attempts to their queues, their leases dropped; how many went. The leases stop
        being renewed first: once an attempt is back in its queue, its member in the running set
        is the next worker's to set."""
        renewed = {task.lease for task in leased} & self.leases
        self.leases -= renewed
        try:
            self.store.return_leases(leased)
        except Exception:  # noqa: BLE001 - they wait here for a thread, as they did
            self.leases |= renewed
            self._keep_waiting([(self._leased_activity, (task,)) for task in leased])
            return 0
        with self._lock:
            self.busy -= len(leased)
        return len(leased)

    def _keep_waiting(self, calls: list[tuple[Callable[..., None], tuple[Any, ...]]]) -> None:
        """Calls that could not be given back (Redis failed): they wait here for a thread again."""
        log.warning("could not give back %d activity task(s) waiting for a thread", len(calls), exc_info=True)
        for fn, args in calls:
            self._pool.submit(fn, *args)

    def lease_dropped(self, n: int) -> None:
        """``n`` activities reserved by :meth:`runs_here` were not leased after all."""
        with self._lock:
            self._reserved -= n

    # ------------------------------------------------------------ leased (eager, local)
    def run_leased(self, task: ActivityTask) -> None:
        """Run an activity the decider's commit leased to this worker."""
        # Renewed while it waits for a thread and while it runs (unless the attempt has
        # deadlines of its own, which then rule).
        if attempt_deadline(task, time.time()) is None:
            self.leases.add(task.lease)
        with self._lock:
            self._reserved -= 1
            self.busy += 1
        self._pool.submit(self._leased_activity, task)

    def _leased_activity(self, task: ActivityTask) -> None:
        try:
            execute_attempt(
                self.store,
                task,
                stream=task.stream,
                allowed=self.allowed,
                on_timer=self.on_timer,
                on_result=self._eager_result if self.eager else None,
                on_ran=self.pace.ran,
            )
            self.activities_run += 1
            self._taking.recovered()
        except Exception as exc:  # noqa: BLE001 - the lease expires and the attempt is retried
            if is_transient(exc):  # its lease lapses: the attempt is taken again
                self._taking.failed(exc)
            else:
                log.exception(
                    "leased activity %s of run %s could not be recorded", task.activity_id, task.run_id
                )
        finally:
            self.leases.discard(task.lease)
            with self._lock:
                self.busy -= 1

    def _eager_result(self, result: AttemptResult) -> None:
        self.eager_done.append(result)
        self.wake()

    # ------------------------------------------------------------ queued
    def submit(
        self,
        stream: str,
        entry_id: str,
        fields: dict[bytes, bytes],
        *,
        redelivered: bool,
        begun: Begun | None = None,
        task: ActivityTask | None = None,
    ) -> None:
        """Run an activity task read from ``stream`` on a thread (``begun``: its attempt was
        begun already, by the commit that claimed it; ``task``: its body, decoded already)."""
        with self._lock:
            self.busy += 1
            self.in_flight[(stream, entry_id)] = time.time()
        self._pool.submit(self._activity, Queued(stream, entry_id, fields, redelivered, begun, task))

    def run_claimed(self, claimed: ClaimedTask) -> None:
        """Run a task the decider's commit read for this worker (reserved by :meth:`claims_here`)."""
        with self._lock:
            self._reserved -= 1
        begun = Begun(True, now_ms=claimed.began_ms) if claimed.began_ms else None
        self.submit(
            claimed.stream,
            claimed.entry_id,
            claimed.fields,
            redelivered=False,
            begun=begun,
            task=claimed.task,
        )

    def _queued_result(self, result: AttemptResult) -> None:
        self.completed.append(completion(result))
        self.wake()

    def _activity(self, queued: Queued) -> None:
        stream, entry_id, fields, redelivered, begun, task = queued
        outcome = ""
        # A task this worker's commit claimed (and began): its run is most likely in this
        # worker's cache, so its result is committed with the run's next decision, as an
        # eager one is (one round trip instead of a completion, then a commit).
        on_result = self._eager_result if begun is not None else self._queued_result
        try:
            outcome = run_activity(
                self.store,
                stream,
                entry_id,
                fields,
                allowed=self.allowed,
                redelivered=redelivered,
                on_timer=self.on_timer,
                on_result=on_result,
                unserved=self.unserved,
                begun=begun,
                on_ran=self.pace.ran,
                task=task,
            )
            self.activities_run += 1
            self._taking.recovered()
        except Exception as exc:  # noqa: BLE001 - see below
            if is_transient(exc):  # one WARNING an outage; the main loop puts the task back
                self._taking.failed(exc)
                with self._lock:
                    self._not_given_back.append((stream, entry_id, fields))
            elif is_redis_error(exc):  # likewise, but no outage: the error says what to mend
                log.exception(
                    "activity task %s on %s could not be recorded; it will be retried", entry_id, stream
                )
            else:  # a fault of ours that a retry would meet again, forever: park it, visibly
                self._park_unrecordable(stream, entry_id, fields, exc)
        finally:
            with self._lock:
                self.busy -= 1
                self.in_flight.pop((stream, entry_id), None)
        if outcome == "void":
            # A void task (its run closed, its activity no longer wanted) frees its thread at
            # once: read the next task now, not when the blocking read times out.
            self.wake()

    def _park_unrecordable(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], exc: Exception
    ) -> None:
        """Move a task whose outcome could not be recorded to the dead letters, blocking its run
        (``durable repair`` re-queues it after a fix), instead of re-running it at each reclaim."""
        log.error(
            "activity task %s on %s could not be recorded; it is parked", entry_id, stream, exc_info=exc
        )
        try:
            task = ActivityTask.decode(fields[b"body"])
            self.store.park(
                p=task.partition,
                stream=stream,
                entry_id=entry_id,
                kind="activity",
                reason=f"activity {task.name} ({task.activity_id}): its outcome could not be recorded: "
                f"{error_text(exc)}; fix the cause, then `durable repair`",
                fields=fields,
                run_id=task.run_id,
                block=True,
            )
        except Exception:  # noqa: BLE001 - left pending: reclaimed (and tried again) later
            log.exception("activity task %s on %s could not be parked either", entry_id, stream)

    # ------------------------------------------------------------ shutdown
    def finish(self, grace: float, meanwhile: Callable[[], None] = lambda: None) -> None:
        """Let running attempts finish (up to ``grace`` seconds), recording each result as it
        comes (through the inbox: no more decisions are made here), and stop the threads.
        ``meanwhile`` is called after each recording (the worker hands its runs' new workflow
        tasks to other workers)."""
        # Tasks no thread started go back to their streams now, for the workers that go on.
        self._give_back(None)
        began = time.time()
        deadline, look = began + grace, began + 1.0
        # Results a Redis outage refuses (``unrecorded``), and those handed over but not tried yet,
        # are tried again until the grace is over, as the loop rides an outage out: given up at
        # once, their work ran again elsewhere.
        unrecorded: list[AttemptOutcome] = []
        while (self.busy or unrecorded or self.completed or self.eager_done) and time.time() < deadline:
            # Recorded now, not once the slowest attempt is done: its run would wait for the
            # whole stop (up to the grace), shown as still running on this worker.
            unrecorded = self._record_on_stop(unrecorded)
            meanwhile()
            if not self.busy:
                time.sleep(0.2 if unrecorded else 0)
                continue
            if time.time() >= look:  # about once a second: it reads the runs of long attempts
                look = time.time() + 1.0
                if self.hung.all_abandoned():
                    # Past their timeout, their run closed or their attempt over: their results
                    # would not count, and Python cannot stop their threads.
                    log.info(
                        "not waiting for the %d activities still running: their attempts are abandoned",
                        self.busy,
                    )
                    break
            time.sleep(0.05)
        unrecorded = self._record_on_stop(unrecorded)
        meanwhile()
        if unrecorded:
            log.error(
                "could not record %d finished activities on shutdown (Redis unavailable?); they run "
                "again elsewhere (after --claim-idle, or once their lease lapses)",
                len(unrecorded),
            )
        if self.busy:
            log.warning(
                "%d activities still running after %.0f s; their tasks go back to their queues (leased "
                "ones once their lease lapses)",
                self.busy,
                time.time() - began,
            )
        self._pool.shutdown()

    def _record_on_stop(self, unrecorded: list[AttemptOutcome]) -> list[AttemptOutcome]:
        """Record the results handed over since, with ``unrecorded`` (a try that failed);
        returns what is still unrecorded (tried again on the next call)."""
        batch = list(unrecorded)
        while self.completed:
            batch.append(self.completed.popleft())
        while self.eager_done:
            batch.append(completion(self.eager_done.popleft()))
        if not batch:
            return []
        try:
            complete_batch(self.store, batch)
        except Exception as exc:  # noqa: BLE001 - said once, at the end, if it keeps failing
            log.debug("recording %d results on shutdown failed (tried again): %s", len(batch), exc)
            return batch
        return []


def _returnable(queued: Queued) -> ActivityTask | None:
    """The task of a queued call waiting for a thread, to give it back (``None``: a body that does
    not decode, which its thread parks)."""
    try:
        return queued.decoded()
    except Exception:  # noqa: BLE001 - parked by the thread that runs it
        return None
