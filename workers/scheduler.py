"""The scheduler: due timers, retry backoff, expired attempts, dead workers' tasks.

Every worker runs one, in a thread. Several schedulers may run at once: each
action is a script (or a claim) that is safe to repeat, so the worst case of
two schedulers racing is a no-op.

It sleeps until the earliest due timer it knows of (capped at ``max_sleep``),
and its own worker wakes it early when a decision adds an earlier timer, so a
timer fires at its due time, not at the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from durable.errors import ActivityTimeout, SessionLost
from durable.quiet import Quiet
from durable.schedule_pass import SchedulePass
from durable.store.connect import is_transient
from durable.store.memory import OomEpisode
from durable.store.outage import Incident
from durable.store.redis_store import RedisStore
from durable.store.retention import Purger
from durable.store.tasks import ActivityTask
from durable.store.workers import HEARTBEAT_S, WorkerInfo, served_queues

from . import faults, metrics
from .attempts import attempt_began, attempt_failed, fail_attempt, task_ids
from .broken_streams import said_wrong_kind
from .logging import bind_run, unbind_run
from .timeouts import timeout_kind
from .worker_deaths import lapsed_lease

log = logging.getLogger("durable.scheduler")

CLOSES_INTERVAL_S = 1.0
"""How often a worker that records metrics counts the runs closed outside decisions."""

EXPIRY_HOLD_MS = 30_000
"""How long an attempt's passed deadline a scheduler took stays its own to deal with: should it
die first, another scheduler takes the attempt this much later."""


class Scheduler:
    """Fires timers and retries, expires attempts, reclaims stale tasks.

    Args:
        store: The store.
        streams: Task streams to reclaim from: this worker's queues, and its private (sticky)
            streams, where only its own reclaim retries a task it read but could not finish
            (a commit refused at ``maxmemory``, a read whose reply was lost).
        paused: True while the worker's loop waits out a Redis outage: no reclaim meanwhile
            (the loop could not handle what it claims, and each claim counts as a delivery
            toward ``max_deliveries``, which would block healthy runs as crash loops).
        consumer: This worker's consumer name (reclaimed tasks come to it).
        reclaimed: Called with ``(stream, entry_id, fields)`` for each reclaimed task.
        claim_idle_ms: A task idle this long in another consumer's pending list
            is taken as abandoned (its worker died). Live workers refresh theirs.
        max_sleep: Longest sleep between scans, in seconds.
        heartbeat: Called every :data:`~durable.store.workers.HEARTBEAT_S` (the worker's
            registry entry and current-build failover), and at every pass while an outage
            lasts (see :meth:`tick`).
        sticky_timeout_ms: A workflow task left unread this long in a worker's private
            (sticky) stream goes to its run's shared queue (0: only once that worker's
            lease lapses, after ``claim_idle_ms``).
        left_alone: Streams not to reclaim from for now (a draining worker leaves the shared
            activity tasks to the others: :meth:`workers.membership.Membership.activity_queues`).
    """

    def __init__(
        self,
        store: RedisStore,
        *,
        streams: list[str],
        consumer: str,
        reclaimed: Callable[[str, str, dict[bytes, bytes]], None],
        in_flight: Callable[[], list[tuple[str, str]]] = list,
        leases: Callable[[], list[tuple[int, str, str, int]]] = list,
        session_queue: str = "",
        claim_idle_ms: int = 30_000,
        max_sleep: float = 1.0,
        heartbeat: Callable[[], None] = lambda: None,
        sticky_timeout_ms: int = 5_000,
        paused: Callable[[], bool] = lambda: False,
        oom: OomEpisode | None = None,
        left_alone: Callable[[], Collection[str]] = tuple,
    ) -> None:
        self.store = store
        self.streams = streams
        self.consumer = consumer
        self.reclaimed = reclaimed
        self.in_flight = in_flight
        self.leases = leases
        self.session_queue = session_queue
        self.claim_idle_ms = claim_idle_ms
        self.max_sleep = max_sleep
        self.heartbeat = heartbeat
        self.paused = paused
        self.left_alone = left_alone
        #: Writes refused at maxmemory (the worker's, shared): while on, nothing is reclaimed.
        self.oom = oom or OomEpisode(log, f"worker {consumer}")
        keys = store.keys
        # This worker's private streams: a task pending there is its own, never a dead worker's.
        self._private = {
            stream
            for p in range(keys.partitions)
            for stream in (keys.workflow_tasks(p, session_queue), keys.activity_tasks(p, session_queue))
            if session_queue
        }
        self._last_beat = time.time()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._next_due = float("inf")
        self._said = Quiet()  # the failed passes' errors said
        self._thread: threading.Thread | None = None
        self._last_claim = 0.0
        self.sticky_timeout_ms = sticky_timeout_ms
        self._next_sweep = 0.0
        self.fired = 0
        #: Purges closed runs whose retention ended (bounded batches, every ``purger.interval`` s).
        self.purger = Purger(store)
        self._outage = Incident(log, "scheduler", settle=3.0)
        # Redis time (ms) this scheduler reached Redis again after an outage (or first did):
        # heartbeats could not be written before, so none is timed out sooner than one heartbeat
        # timeout after it (a Redis restart of 12 s failed every heartbeating attempt).
        self._back_at_ms: int | None = None
        #: Claims and starts the due times of schedules (exactly once across schedulers).
        self.schedules = SchedulePass(store)
        self._next_closes = 0.0
        self._next_consumers = 0.0

    def start(self) -> None:
        if metrics.enabled():
            try:  # the closes streams and their group exist from now on: later closes get counted
                metrics.count_closes(self.store)
            except Exception as exc:  # noqa: BLE001 - each pass tries again
                log.warning("metrics: closes outside decisions not counted yet: %s", exc)
        self._thread = threading.Thread(target=self._loop, name="durable-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def rejoin(self) -> None:
        """Redis answers the worker's loop again after an outage: pass now rather than at the
        end of this scheduler's own backoff (the pass renews the registry entry, see :meth:`tick`)."""
        self._wake.set()

    def notify(self, due_ms: int) -> None:
        """A timer due at ``due_ms`` was added: wake up early if it is sooner than planned."""
        if due_ms / 1000 < self._next_due:
            self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            # While a pass runs, any notification must cut the following sleep short.
            self._next_due = float("inf")
            try:
                sleep = self.tick()
                self._outage.recovered()
            except Exception as exc:  # noqa: BLE001 - keep scheduling whatever happens
                if self.oom.failed(exc, "a scheduler write (lease, timers, retries)"):
                    sleep = 1.0  # said once per episode (with the remedies); no line per pass
                elif is_transient(exc):
                    sleep = self._outage.failed(exc)  # logged once per outage
                else:
                    # The same fault a second: its traceback once, then a line once a minute (a key
                    # of the wrong kind logged a traceback every second until it was mended).
                    said = str(exc).splitlines()[0][:300] if str(exc) else repr(exc)
                    first = self._said.first(said)
                    if said_wrong_kind(self.store, exc, "a scheduler pass (tried again every second)"):
                        pass  # named (Redis's error names no key), no traceback: not a bug of ours
                    elif self._said.due(said):
                        log.error("scheduler pass failed; retrying in 1 s: %s", said, exc_info=first)
                    sleep = 1.0
                    # A fault of the pass's own (odd data, a bug) is no reason for this live worker
                    # to look gone: its heartbeat is kept whatever part of the pass failed.
                    self._beat(time.time())
            self._next_due = time.time() + sleep
            self._wake.wait(sleep)
            self._wake.clear()

    def tick(self) -> float:
        """One pass over every partition; returns seconds until the next due timer (capped)."""
        now = time.time()
        next_due = now + self.max_sleep
        now_ms = self.store.server_time_ms()
        if self._back_at_ms is None or self._outage.active or self.oom.active:  # (writes refused too)
            self._back_at_ms = now_ms
        parts = range(self.store.keys.partitions)
        for p, (fired, due, timers) in zip(parts, self.store.fire_timers(parts), strict=True):
            metrics.timers_fired(p, timers, due, now_ms)
            if fired:
                faults.point("timers.after_fire")
            self.fired += fired
            if due >= 0:
                next_due = min(next_due, due / 1000)
        # One read of every running set when nothing expired (the usual case).
        for p, deadline in zip(parts, self.store.next_deadlines(parts), strict=True):
            if deadline is not None and deadline <= now_ms:
                self._expire_attempts(p, now_ms)
                deadline = self.store.next_deadlines([p])[0]
            if deadline is not None:  # one left past due waits for its heartbeat: looked at again
                next_due = min(next_due, max(deadline / 1000, now + 0.5))
        next_due = min(next_due, self._sweep_sticky(now))
        if now - self._last_claim >= self.claim_idle_ms / 3000:
            self._last_claim = now
            self._refresh_in_flight()
            # Not while writes are refused: a task pending here for long is then one this worker
            # could not finish (or whose idle time it could not reset), not a dead worker's.
            if not self.paused() and not self.oom.active:
                self._reclaim()
            self._check_workers()
        self._beat(now)
        self.purger.tick()
        if metrics.enabled() and now >= self._next_closes:
            self._next_closes = now + CLOSES_INTERVAL_S
            metrics.count_closes(self.store)
        soonest = self.schedules.tick()
        if soonest is not None:
            next_due = min(next_due, soonest / 1000)
        return max(0.0, next_due - time.time())

    def _beat(self, now: float) -> None:
        """Renew this worker's registry entry when due. While an outage lasts, as the loop or this
        scheduler sees it, every pass that gets through renews it: Redis may be back without it
        (it lapsed, or a restart lost it), and until then the views take this live worker for
        gone (no_live_worker)."""
        if now - self._last_beat < HEARTBEAT_S and not self.paused() and not self._outage.active:
            return
        self._last_beat = now
        try:
            self.heartbeat()
            self.oom.wrote()  # the registry entry is a write: Redis takes them again
        except Exception as exc:  # noqa: BLE001 - the next heartbeat retries; the entry lives 5 of them
            if self.oom.failed(exc, "the registry heartbeat"):
                pass  # said once per episode; the worker goes on working
            elif is_transient(exc):
                self._outage.failed(exc)  # one line per outage, not per heartbeat
            elif not said_wrong_kind(self.store, exc, "the worker's registry heartbeat"):
                log.warning("worker heartbeat failed: %s", exc)

    def _sweep_sticky(self, now: float) -> float:
        """Hand back sticky workflow tasks left unread past the sticky timeout; returns when
        to look again (the oldest unread one's timeout, else half the timeout from now)."""
        if not self.sticky_timeout_ms:
            return float("inf")
        if now >= self._next_sweep:
            moved, wait_ms = self.store.sweep_sticky(self.sticky_timeout_ms)
            if moved:
                log.warning(
                    "%d workflow task(s) waited %.1f s unread in a worker's private stream (that worker "
                    "died or is stuck): handed back to their runs' queues",
                    moved,
                    self.sticky_timeout_ms / 1000,
                )
            wait = wait_ms if wait_ms is not None else self.sticky_timeout_ms // 2
            self._next_sweep = now + wait / 1000
        return self._next_sweep

    def hand_back_own(self) -> None:
        """This worker is stopping (it reads no more tasks): the workflow tasks of its runs that
        land in its private stream meanwhile (their results recorded as its last activities
        finish, signals) go to the runs' queues at once for the workers that go on, and the
        runs stop being sticky to it, instead of waiting there for the sticky timeout."""
        if not self.session_queue:
            return
        try:
            self.store.sweep_sticky(0, host=self.session_queue)
        except Exception as exc:  # noqa: BLE001 - the others' sweeps move them after the timeout
            log.debug("could not hand back this worker's sticky tasks while stopping: %s", exc)

    def _expire_attempts(self, p: int, now_ms: int) -> None:
        own = set(self.leases())
        for rid, aid, attempt in self.store.expired_attempts(p, now_ms):
            task, _ = self.store.activity_state(p, rid, aid)
            if self._renew_own(p, (rid, aid, attempt), task, now_ms, own):
                continue
            if self._heartbeat_resuming(p, (rid, aid, attempt), task, now_ms):
                continue
            if not self.store.take_expiry(p, rid, aid, attempt, now_ms, EXPIRY_HOLD_MS):
                continue  # another worker's scheduler took this expiry
            if task is None or task.attempt != attempt:
                self.store.drop_deadline(p, rid, aid, attempt)  # of an attempt no longer current
                continue
            started_ms = self.store.attempt_started(p, rid, aid)
            kind = timeout_kind(task, started_ms, now_ms)
            error: Exception = ActivityTimeout(
                f"activity {task.name} ({aid}) attempt {attempt} timed out ({kind})", kind=kind
            )
            if kind == "lease":
                # A leased attempt's worker died (a live one renews its leases): the attempt runs
                # again from its queue, unless its worker died running it too often.
                lost = lapsed_lease(self.store, task)
                if lost is None:  # run again (its deadline went with it), or nothing to run
                    self.store.drop_deadline(p, rid, aid, attempt)
                    continue
                error = lost
            ids = {"workflow_id": task.workflow_id, "run_id": rid, "activity_id": aid, "attempt": attempt}
            token = bind_run({**ids, "activity_type": task.name})
            try:  # fail_attempt's WARNING says it (ActivityTimeout ... timed out (kind)): one line, not two
                outcome = fail_attempt(
                    self.store,
                    task,
                    error,
                    stream=task.stream,
                    entry_id="",
                    started=attempt_began(started_ms, now_ms),
                    on_timer=self.notify,
                )
            finally:
                unbind_run(token)
            metrics.timed_out(task.name, task.stream, kind, outcome)

    def _heartbeat_resuming(
        self, p: int, attempt: tuple[str, str, int], task: ActivityTask | None, now_ms: int
    ) -> bool:
        """Whether the expired ``attempt`` timed out on its heartbeat within one heartbeat timeout
        of this scheduler reaching Redis again: its worker could not write a heartbeat during the
        outage, and has that long to write one now (as a server measures Temporal's)."""
        heartbeat = task.timeout("heartbeat") if task is not None and task.attempt == attempt[2] else 0
        if task is None or not heartbeat or now_ms >= (self._back_at_ms or 0) + heartbeat * 1000:
            return False
        return (
            timeout_kind(task, self.store.attempt_started(p, attempt[0], attempt[1]), now_ms) == "heartbeat"
        )

    def _renew_own(
        self,
        p: int,
        attempt: tuple[str, str, int],
        task: ActivityTask | None,
        now_ms: int,
        own: set[tuple[int, str, str, int]],
    ) -> bool:
        """Whether the expired ``attempt`` is one this worker runs whose lease merely lapsed (its
        renewal was refused at maxmemory, or lost): then renewed here rather than failed."""
        lease = (p, *attempt)
        if task is None or lease not in own:
            return False
        if timeout_kind(task, self.store.attempt_started(p, attempt[0], attempt[1]), now_ms) != "lease":
            return False  # a real timeout of the attempt: it fails as usual
        self.store.extend_leases([lease], now_ms + self.claim_idle_ms)
        return True

    def _refresh_in_flight(self) -> None:
        # Reset the idle time of tasks this worker is still working on, so other
        # workers' reclaim passes only ever take tasks of dead workers.
        self.store.touch_claims(self.consumer, self.in_flight())
        # Likewise push the leases of attempts this worker runs itself (eager, local):
        # only a dead worker's lease runs out.
        leases = self.leases()
        if leases:
            self.store.extend_leases(leases, self.store.server_time_ms() + self.claim_idle_ms)

    def release(self) -> None:
        """Give up this worker's lease at once (graceful stop): its sessions fail fast, the
        workflow tasks waiting in its private stream go back to their runs' queues, and its
        private streams are deleted (an activity stream that still holds session tasks only
        once another worker's sweep has failed them)."""
        if self.session_queue:
            self.store.release_worker(self.session_queue)

    def renew_lease(self) -> None:
        """Take or renew this worker's lease (its sessions' host lease and its sticky runs')."""
        if self.session_queue:
            self.store.renew_worker(self.session_queue, self.consumer, self.claim_idle_ms)

    def _check_workers(self) -> None:
        """Renew this worker's lease; clean up after workers whose lease ran out (they died)."""
        self.renew_lease()
        for p, host, session, _ in self.store.dead_workers(self.session_queue):
            if session:
                self._fail_lost_sessions(p, host)
            # unstick checks the lease again, atomically: a worker that renewed meanwhile keeps its
            # tasks. Also for a session host: it deletes the private activity stream the failures
            # emptied, or keeps it (and the host listed) if a task arrived meanwhile, for the next pass.
            moved = self.store.unstick(p, host)
            if moved > 0:
                log.warning(
                    "worker %s stopped: %d workflow task(s) it held (partition %d) went back to their queues",
                    host,
                    moved,
                    p,
                )
        self._drop_dead_consumers()

    def _drop_dead_consumers(self) -> None:
        """Every ``claim_idle_ms``, delete from the groups of task streams the consumers of
        workers that are gone (a worker stopping cleanly deletes its own; one killed cannot):
        each start adds one per stream, and nothing else ever removes them. Only consumers with
        no pending entry, idle for ``claim_idle_ms`` and of no live worker: a dead worker's
        pending tasks are reclaimed first (:meth:`_reclaim`), its consumer goes at a later pass.
        The streams are this worker's and those of queues no live worker serves (no one else
        would clean them); and the empty streams of retired builds go (see
        :meth:`~durable.store.queues.QueueStore.drop_retired_builds`) and those of unserved queues
        (:meth:`~durable.store.queues.QueueStore.drop_unserved_streams`), and from the unserved
        queues the tasks of runs closed or purged since they were queued (no worker reads them
        to drop them: :meth:`~durable.store.queues.QueueStore.drop_void_tasks`)."""
        now = time.monotonic()
        if now < self._next_consumers:
            return
        self._next_consumers = now + self.claim_idle_ms / 1000
        try:
            workers = self.store.live_workers()
            live = [w.name for w in workers] + [self.consumer]
            queues = self._unserved_queues(workers)
            unserved = self._streams_of(queues)
            deleted, held = self.store.drop_dead_consumers(self.streams + unserved, live, self.claim_idle_ms)
            retired = self.store.drop_retired_builds(workers, keep=self.streams)
            void = self.store.drop_void_tasks(unserved)
            emptied = self.store.drop_unserved_streams(queues, keep=self.streams)
        except Exception as exc:  # noqa: BLE001 - they wait for the next pass; timers must not
            if not said_wrong_kind(self.store, exc, "the sweep of dead workers' consumers"):
                log.warning("dead workers' consumers not deleted yet: %s", exc)
            return
        if deleted:
            log.info(
                "deleted %d consumer(s) of stopped workers from the task streams' groups (%d kept "
                "until their pending tasks are reclaimed)",
                deleted,
                held,
            )
        if retired.dropped:
            log.info("deleted the empty task streams of retired builds %s", ", ".join(retired.dropped))
        if void:
            log.info("dropped %d task(s) of closed runs from queues no live worker serves", void)
        if emptied:
            log.info("deleted the empty task streams of %d queue(s) no live worker serves", len(emptied))

    def _unserved_queues(self, workers: list[WorkerInfo]) -> list[str]:
        """The queues tasks were sent to that no live worker serves."""
        return sorted(set(self.store.known_queues()) - set(served_queues(workers)))

    def _streams_of(self, queues: list[str]) -> list[str]:
        """The shared task streams of ``queues``."""
        keys = self.store.keys
        return [
            stream
            for q in queues
            for p in range(keys.partitions)
            for stream in (keys.workflow_tasks(p, q), keys.activity_tasks(p, q))
        ]

    def _fail_lost_sessions(self, p: int, host: str) -> None:
        """Fail the queued session tasks of the dead session host ``host`` in partition ``p``."""
        stream, entries = self.store.session_tasks(p, host)
        for entry_id, fields in entries:
            self._fail_session_task(p, stream, entry_id, fields, host)

    def _fail_session_task(
        self, p: int, stream: str, entry_id: str, fields: dict[bytes, bytes], host: str
    ) -> None:
        try:
            task = ActivityTask.decode(fields[b"body"])
        except Exception:  # noqa: BLE001 - not ours to interpret: park it with the reason
            self.store.park(
                p=p,
                stream=stream,
                entry_id=entry_id,
                kind="activity",
                reason="undecodable session task",
                fields={"raw": repr(fields)[:500]},
            )
            return
        error = SessionLost(
            f"worker session host {host} stopped; activity {task.name} ({task.activity_id}) cannot run "
            "there — open a new worker_session()"
        )
        log.warning("%s", error)
        record = {"error": str(error), "final": "session host lost"}
        self.store.complete_activity(attempt_failed(task, error, record, stream=stream, entry_id=entry_id))

    def _reclaim(self) -> None:
        busy, skip = set(self.in_flight()), set(self.left_alone())
        for stream in self.streams:
            if stream in skip:
                continue
            for entry_id, fields in self.store.reclaim(stream, self.consumer, self.claim_idle_ms):
                if (stream, entry_id) in busy:
                    # Ours and still running: its idle time went unrefreshed (a refused or lost
                    # write), it is not abandoned. Claiming it again just reset its idle time.
                    continue
                if stream in self._private:
                    log.warning(
                        "retrying task %s of this worker's private stream %s: it read it but did not "
                        "finish it (a write refused or a reply lost)",
                        entry_id,
                        stream,
                    )
                else:
                    log.warning(
                        "reclaimed task %s from %s: pending for %.0f s (its worker stopped responding, "
                        "or could not finish it)",
                        entry_id,
                        stream,
                        self.claim_idle_ms / 1000,
                        extra=_task_ids(fields),  # a run followed by its id: the crash path too
                    )
                self.reclaimed(stream, entry_id, fields)


def _task_ids(fields: dict[bytes, bytes]) -> dict[str, object]:
    """The run ids a task's fields carry, for its log lines (a workflow task names its run, an
    activity task's body the attempt); ``{}`` for one that says nothing readable."""
    try:
        if b"body" in fields:
            return dict(task_ids(ActivityTask.decode(fields[b"body"])))
        return {"run_id": fields[b"run"].decode()} if b"run" in fields else {}
    except Exception:  # noqa: BLE001 - a malformed task is parked by whoever reads it, said there
        return {}
