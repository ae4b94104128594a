"""The worker: claims workflow, activity and outbox tasks and runs them.

One worker process has:

* the **main thread**, which blocks on ``XREADGROUP`` reads of its task streams (``reader.py``:
  one for workflow and outbox tasks, one for activity tasks while a thread is free; on a Redis
  Cluster one per partition each; all waited on together), decides workflow tasks itself
  (greenlets resume only on the thread that made them: the run cache lives here) and carries
  out outbox messages, its workflow tasks including a private stream of the runs it decided
  last (sticky: their drivers are in its cache); streams of the wrong kind are set aside
  (``broken_streams.py``);
* ``concurrency`` **activity threads** (``activity_host.py`` over ``threads.py``);
* the **scheduler** thread (``scheduler.py``), which also keeps the worker's lease alive.

SIGTERM/SIGINT (and SIGHUP unless ignored): stop claiming, let in-flight activities finish (up
to ``grace`` seconds), exit (at the latest ``grace`` + 5 s later, whatever the workflows do). A
task still unfinished stays in the consumer group's pending list and another worker reclaims it:
nothing is lost. A decision that runs workflow code past ``decision_timeout`` blocks its run
(``watchdog.py``). A task of a type this worker lacks is left for a worker that has it
(``routing.py``). SIGUSR1 drains it: it starts no new run, finishes the runs pinned to its build,
then stops as above (``membership.py``: how the last process of an old build outlives a deploy).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from durable import registry
from durable.store.connect import consumer_name, is_missing_group, is_transient
from durable.store.keys import private_queue
from durable.store.memory import OomEpisode
from durable.store.outage import Incident, retry_transient
from durable.store.reads import Reply
from durable.store.redis_store import RedisStore
from durable.store.tasks import AttemptOutcome

from .activity_host import ActivityHost
from .allowed import Allowed
from .app import AUTO_BUILD_ID, code_build_id, load_app, tune_gc  # noqa: F401 - re-exported (examples)
from .attempts import complete_and_preload
from .broken_streams import BrokenStreams
from .crash_loops import block_if_decision_crash_loop, fail_if_crash_loop
from .decider import UNKNOWN_TYPE_GRACE, Decider, Task
from .membership import Membership
from .outbox import handle_outbox
from .reader import TaskReader
from .scheduler import Scheduler
from .watchdog import (
    DEFAULT_DECISION_TIMEOUT,
    STOP_MARGIN,
    DecisionWatchdog,
    StopDeadline,
    Stuck,
    block_runaway,
    exit_runaway,
    hand_back,
    stop_signals,
)
from .worker_thread import WorkerThread  # noqa: F401 - re-exported (tests, examples)

log = logging.getLogger("durable.worker")

WORKFLOW, OUTBOX, ACTIVITY = "workflow", "outbox", "activity"
"""What a task stream holds; the worker registers each stream it reads under one."""

DECISIONS, ACTIVITIES = "decisions", "activities"
"""The read lanes: workflow and outbox tasks in large batches; activity tasks, as many as free threads."""


class Worker:
    """A worker serving some queues.

    Args:
        store: The store (default: from ``DURABLE_REDIS_URL`` / embedded).
        queues: Queue names to serve (workflow and activity tasks).
        concurrency: Activity threads.
        app: Module names whose workflows/activities this worker may run; with none, every registered
            type is allowed (in-process tests).
        cache_size: Live runs kept in the cache.
        grace: Seconds to let in-flight activities finish on shutdown.
        claim_idle_ms: A task idle this long with a silent worker is reclaimed.
        sticky_timeout_ms: A workflow task left unread this long in a worker's private
            (sticky) stream goes to its run's shared queue (0: only when that worker's lease lapses).
        block_ms: Longest blocking read (bounds how fast a stop is noticed).
        max_deliveries: A workflow task delivered more often than this (its decision keeps killing
            workers) is parked and its run blocked.
        build_id: The build id of this worker's code. Runs it decides first are pinned to it: their
            workflow tasks go only to workers of that build (or declaring it compatible). Empty:
            unversioned, nothing pinned.
        compatible: Build ids whose pinned runs this worker may also decide.
        promote: Make ``build_id`` the queues' current build at once, so new runs start on this
            worker's code (older builds keep only their pinned runs). Without it the build becomes
            current only when the current one has no live worker left (see :mod:`workers.membership`).
        decision_timeout: Seconds a decision may run workflow code without yielding; past it the run
            is blocked and, when this worker runs on the process's main thread, the process exits
            with :data:`~workers.watchdog.RUNAWAY_EXIT` for its supervisor to restart (0: none).
        eager: Run the activities its decisions schedule on its own queues itself, under a lease,
            and commit each result together with the run's next decision (one script per step
            instead of four). Local activities always run this way.
        unknown_type_grace: Seconds a task waits for a live worker of its queue that has its type
            before it is parked (its run blocked).
        types_complete: Its ``app`` modules were loaded and their plain-function activities
            registered before it started (``durable worker`` does so), so its registry entry
            names everything it runs and the views may call a type it lacks missing at once.
    """

    restart_in_place = False
    """After a runaway decision its process starts again itself (a ``durable worker`` no
    supervisor runs) instead of exiting for a supervisor to restart."""

    def __init__(
        self,
        store: RedisStore | None = None,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 8,
        app: Sequence[str] = (),
        cache_size: int = 1000,
        grace: float = 30.0,
        claim_idle_ms: int = 30_000,
        sticky_timeout_ms: int = 5_000,
        block_ms: int = 1000,
        max_deliveries: int = 5,
        eager: bool = False,
        build_id: str = "",
        compatible: Sequence[str] = (),
        promote: bool = False,
        decision_timeout: float = DEFAULT_DECISION_TIMEOUT,
        unknown_type_grace: float = UNKNOWN_TYPE_GRACE,
        types_complete: bool = False,
    ) -> None:
        self.store = store or RedisStore()
        self.queues = list(queues)
        self.concurrency = concurrency
        self.app = list(app)
        self.types_complete = types_complete
        self.grace = grace
        self.block_ms = block_ms
        self.max_deliveries = max_deliveries
        self.consumer = consumer_name()
        allowed = Allowed(self.app)
        self._workflow_ok = allowed.workflow
        self._activity_ok = allowed.activity
        self.build_id = build_id
        self.session_queue = private_queue(self.consumer)  # only this worker serves it: its sessions
        self._plan_streams(list(compatible), cache_size)
        self._reclaimed: deque[tuple[str, str, dict[bytes, bytes]]] = deque()
        self.broken = BrokenStreams(self.store)  # streams whose key holds another kind: not read
        # On a cluster a read over several partitions' streams is CROSSSLOT: one read per partition.
        self.reader = TaskReader(
            self.store.open_read,  # type: ignore[arg-type]
            self.consumer,
            group_of=self.store.read_group,
            on_moved=self.store.refresh_topology,
            on_migrating=self.store.partition_migrating,
        )
        # The loop's Redis outages (said once); a quiet spell ends one: reads may work while OOM refuses writes.
        self._outage = Incident(log, "worker loop", settle=3.0)
        # Writes refused at maxmemory (shared with the scheduler): said once, with the remedies;
        # meanwhile nothing of this worker's is taken for abandoned.
        self._oom = OomEpisode(log, f"worker {self.consumer}")
        #: Starts the embedded Redis again if it died (set for one; see :meth:`_wait_out`).
        self.revive_redis: Callable[[], bool] | None = None
        self._revive_at = 0.0
        self._stop = threading.Event()
        self.joined = threading.Event()  # set once in the registry and serving (WorkerThread waits)
        self.membership = self._make_membership(compatible, promote, (claim_idle_ms, sticky_timeout_ms))
        self.scheduler = self._make_scheduler(claim_idle_ms, sticky_timeout_ms)
        self.eager = eager
        self.activities = ActivityHost(
            self.store,
            concurrency=concurrency,
            queues=self.queues,
            allowed=self._activity_ok,
            identity=(self.consumer, self.session_queue),
            eager=eager,
            wake=self.reader.wake,
            on_timer=self.scheduler.notify,
        )
        self.decider = self._make_decider(cache_size, claim_idle_ms, compatible, unknown_type_grace)
        self.activities.unserved = self.decider.routing.activity
        self.membership.threads = self.activities.hung.check  # its entry says which threads hang
        self.decisions = 0
        self._batch: list[Task] = []  # the workflow tasks being decided (handed back by a runaway)
        self._handed: list[Task] = []  # workflow tasks the completions read for this worker
        self._take_back = False  # an outage cut a pass short: see _take_back_unseen
        self._owns_process = False
        self._stop_deadline = StopDeadline()
        self.watchdog = DecisionWatchdog.attach(self.decider, decision_timeout, self._runaway)
        self.membership.deciding = self.watchdog.slow  # its entry names a stalled decision

    def _make_decider(
        self, cache_size: int, claim_idle_ms: int, compatible: Sequence[str], grace: float
    ) -> Decider:
        return Decider(
            self.store,
            cache_size=cache_size,
            allowed=self._workflow_ok,
            on_timer=self.scheduler.notify,
            runs_activity=self.activities.runs_here,
            on_leased=self.activities.run_leased,
            on_lease_dropped=self.activities.lease_dropped,
            claims_activity=self.activities.claims_here,
            on_claimed=self.activities.run_claimed,
            claimer=self.consumer,
            lease_ms=claim_idle_ms,
            build_id=self.build_id,
            compatible=tuple(compatible),
            sticky=self.session_queue,
            unknown_type_grace=grace,
        )

    def _make_membership(
        self, compatible: Sequence[str], promote: bool, timeouts: tuple[int, int]
    ) -> Membership:
        """The registry entry: this worker's build, queues and the types its app defines."""
        membership = Membership(
            self.store,
            name=self.consumer,
            build=self.build_id,
            compatible=compatible,
            queues=self.queues,
            workflows=[n for n in registry.workflows() if self._workflow_ok(n)],
            activities=[n for n in registry.activities() if self._activity_ok(n)],
            promote=promote,
            complete=self.types_complete,
            timeouts=timeouts,
        )
        membership.on_drained = self._drained
        return membership

    def _make_scheduler(self, claim_idle_ms: int, sticky_timeout_ms: int = 5_000) -> Scheduler:
        return Scheduler(
            self.store,
            streams=self.workflow_streams + self.sticky_streams + self.activity_streams + self.outbox_streams,
            paused=lambda: self._outage.active,
            oom=self._oom,
            consumer=self.consumer,
            reclaimed=self._on_reclaimed,
            in_flight=lambda: list(self.activities.in_flight),
            leases=lambda: list(self.activities.leases),
            session_queue=self.session_queue,
            claim_idle_ms=claim_idle_ms,
            sticky_timeout_ms=sticky_timeout_ms,
            heartbeat=self.membership.heartbeat,
            left_alone=lambda: self.membership.left_alone(self._activities_of),
        )

    def _plan_streams(self, compatible: list[str], cache_size: int) -> None:
        """The task streams this worker reads, and what each holds (:attr:`stream_kinds`).

        Versioned workers (a build id) read the streams of runs pinned to their build
        and to builds declared compatible; a queue's unpinned streams (new runs) only while
        their build is the queue's current one. Unversioned workers read unpinned only.
        """
        keys = self.store.keys
        parts = range(keys.partitions)
        self.builds = [self.build_id, *compatible] if self.build_id else []
        self.pinned_streams = [
            keys.workflow_tasks(p, q, b) for b in self.builds for q in self.queues for p in parts
        ]
        self._unpinned_of = {q: [keys.workflow_tasks(p, q) for p in parts] for q in self.queues}
        self.unpinned_streams = [s for q in self.queues for s in self._unpinned_of[q]]
        self.workflow_streams = self.pinned_streams + self.unpinned_streams
        self._activities_of = {q: [keys.activity_tasks(p, q) for p in parts] for q in self.queues}
        shared_activity_streams = [s for q in self.queues for s in self._activities_of[q]]
        # Its private (session) streams are created with the others, not when a session first
        # uses one: a read of a stream without its group fails. Its lease's end deletes them
        # (Scheduler.release, or another worker's sweep: LeaseStore.unstick).
        self._session_streams = [keys.activity_tasks(p, self.session_queue) for p in parts]
        self.activity_streams = shared_activity_streams + self._session_streams
        # Workflow tasks of runs this worker decided last (their drivers are in its cache).
        self.sticky_streams = (
            [keys.workflow_tasks(p, self.session_queue) for p in parts] if cache_size > 0 else []
        )
        self.outbox_streams = [keys.outbox(p) for p in parts]
        # What a leaving worker hands back (its private streams go with its lease: Scheduler.release).
        self.shared_streams = self.workflow_streams + shared_activity_streams + self.outbox_streams
        self.stream_kinds: dict[str, str] = dict.fromkeys(
            self.workflow_streams + self.sticky_streams, WORKFLOW
        )
        self.stream_kinds.update(dict.fromkeys(self.outbox_streams, OUTBOX))
        self.stream_kinds.update(dict.fromkeys(self.activity_streams, ACTIVITY))

    # ------------------------------------------------------------ lifecycle
    @property
    def busy(self) -> int:
        """Activity attempts running on this worker's threads right now."""
        return self.activities.busy

    @property
    def activities_run(self) -> int:
        """Activity attempts this worker has run."""
        return self.activities.activities_run

    def stop(self) -> None:
        """Ask the worker to stop claiming and shut down (thread-safe)."""
        self._stop.set()
        self.reader.wake()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self._stop_deadline.arm(self.grace + STOP_MARGIN)  # first: whatever the rest does
            log.info("received %s: finishing in-flight work, then exiting", signal.Signals(signum).name)
            self.stop()

        self._stop_deadline.start()
        for signum in stop_signals():
            signal.signal(signum, handler)
        signal.signal(signal.SIGUSR1, lambda _signum, _frame: self.drain())

    def drain(self) -> None:
        """Start no new run from now on; stop once no open run pinned to this worker's build is
        left on its queues (at once when unversioned). SIGUSR1 with signal handlers installed;
        thread- and signal-safe (the scheduler's heartbeat counts the runs left)."""
        self.membership.drain()

    def _drained(self) -> None:
        if self._owns_process:  # bounded like a signal's stop
            self._stop_deadline.arm(self.grace + STOP_MARGIN)
        self.stop()

    def run(self) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT with signal handlers installed)."""
        retry_transient(self._join, self._outage, stop=self._stop)
        self.scheduler.start()
        self._owns_process = threading.current_thread() is threading.main_thread()
        self.watchdog.start()
        log.info(
            "worker %s serving queues %s (%d activity threads)", self.consumer, self.queues, self.concurrency
        )
        try:
            while not self._stop.is_set():
                try:
                    self._pass()
                except Exception as exc:
                    if is_transient(exc):
                        self._wait_out(exc)
                    elif self.broken.set_aside(
                        exc, self.scheduler.streams + self._session_streams
                    ) or self.broken.met(exc):
                        continue  # a key of the wrong kind: its stream set aside, or said; the worker goes on
                    elif is_missing_group(exc):  # a stream of ours was deleted (another worker
                        # took this one for dead while it stalled, handed its tasks back): make it
                        log.warning("task stream gone (%s); recreating the consumer groups", exc)
                        retry_transient(self._ensure_groups, self._outage, stop=self._stop)
                    else:
                        raise
                else:
                    if self._outage.recovered():
                        self.scheduler.rejoin()  # its registry entry may have lapsed meanwhile
            self.reader.unblock()  # a stopping worker takes no new task (old code, in a deploy)
            with contextlib.suppress(Exception):  # the views count it out; not if Redis is down
                self.membership.stopping()
            while self.reader.outstanding:
                # Tasks delivered to the last read are ours: finish them rather than leave
                # them to a reclaim after --claim-idle. No read may stay outstanding, or it
                # would take tasks this stopping worker never sees.
                self._handle(self.reader.read({}, block_ms=self.block_ms) or [])
        finally:
            self._shutdown()

    def _join(self) -> None:
        self._ensure_groups()
        self.membership.join()
        # Said at once: a supervisor counts this process as started from its report of the join
        # (``on_joined``), and a kill between the two counted as a failure to start.
        self.joined.set()
        # The lease first: the runs this worker decides from now on come back to it.
        self.scheduler.renew_lease()

    def _wait_out(self, exc: BaseException) -> None:
        """Pause: ``exc`` says Redis is unavailable for now. Results in hand stay for the next
        pass, tasks read but not finished stay pending in Redis."""
        delay = self._outage.failed(exc)
        self._take_back = True
        self._oom.failed(exc, "a write of the worker loop")
        if self.revive_redis is not None and time.monotonic() >= self._revive_at:
            self._revive_at = time.monotonic() + 5.0  # a server that will not start is not hammered
            try:
                if self.revive_redis():
                    log.warning("the embedded Redis had died; started it again on its data (AOF)")
            except Exception as revive_error:  # noqa: BLE001 - the outage goes on; said each try
                log.warning("the embedded Redis died and could not be started again: %s", revive_error)
        if self.store.cluster:
            try:
                self.store.refresh_topology()
            except Exception as refresh_error:  # noqa: BLE001 - the next pass tries again
                log.debug("cluster slot map not refreshed: %s", refresh_error)
        self._stop.wait(delay)

    def _ensure_groups(self) -> None:
        self.store.ensure_groups(
            self.workflow_streams + self.sticky_streams + self.activity_streams + self.outbox_streams
        )

    def _shutdown(self) -> None:
        self.watchdog.stop()
        self.activities.finish(self.grace, meanwhile=self.scheduler.hand_back_own)
        self._requeue_unread()
        self._leave()
        self._forget_consumer()
        self.decider.cache.clear()
        self._stop_deadline.cancel()
        log.info("worker %s stopped", self.consumer)

    def _forget_consumer(self) -> None:
        """Delete this worker's consumer from the groups of the shared streams it read (its
        private streams went with its lease), else every start would leave one behind in each.
        After :meth:`_leave`: its scheduler no longer reclaims tasks into it. Where it still holds
        pending tasks (their hand-back failed), it stays for others to reclaim them first."""
        try:
            _, held = self.store.forget_consumer(self.shared_streams, self.consumer)
        except Exception as exc:  # noqa: BLE001 - live workers' sweeps delete it later
            log.warning("could not delete this worker's consumer from the task streams: %s", exc)
            return
        if held:
            log.warning("%d task stream(s) still hold tasks pending for this worker: reclaimed later", held)

    def _runaway(self, stuck: Stuck) -> None:
        """A decision runs workflow code that does not yield (called on the watchdog thread)."""
        block_runaway(self.store, stuck)
        if not self._owns_process:  # a thread of a larger process (tests): stop the code instead
            self.watchdog.interrupt(stuck)
        else:  # the main thread will not return: hand back, finish, leave, end the process
            hand_back(self.store, self._batch, but=stuck.task)
            self.activities.finish(self.grace)
            self._requeue_unread()
            self._leave()
            exit_runaway(self.consumer, stuck, restart=self.restart_in_place and not self._stop.is_set())

    def _take_back_unseen(self) -> None:
        """First thing after an outage cut a pass short: put back at the ends of their streams
        the workflow tasks and outbox messages still pending for this worker, and the activity
        tasks pending for it that it does not hold. Those are what the outage interrupted:
        commits Redis refused or dropped, messages not carried out, activity tasks a commit
        claimed or a read delivered whose replies were lost, a hand-back cut short. They would
        otherwise wait for a reclaim after --claim-idle, their runs shown as pending or "running
        on" this worker with nothing saying why. Raises while Redis is still unavailable: the
        loop waits that out, and this runs again."""
        # Outstanding reads may have been delivered tasks: dropped, those stay pending and go back
        # below (else they would come in a reply after being put back: twice).
        self.reader.drop()
        self.activities.hand_back_left()
        held = self.activities.held() | {(s, e) for s, e, _ in self._reclaimed}
        held |= {(t.stream, t.entry_id) for t in self._handed}
        streams = self._decision_streams() + self.outbox_streams + self.activity_streams
        moved = self.store.requeue_pending(streams, self.consumer, keep=held, why="after a Redis outage")
        self._take_back = False
        if moved:  # every pass of a Redis hovering at maxmemory puts some back: its episode says it
            level = logging.DEBUG if self._oom.active else logging.INFO
            log.log(level, "put back %d task(s) the Redis outage left unfinished", moved)

    def _requeue_unread(self) -> None:
        """Close the task reads, then put back at the end of their streams the tasks still
        pending for this worker: delivered to a read it never took in (its main thread is
        stuck, or it stops after an error) or handed to an activity thread that did not finish
        within the grace. Without this they would wait for a reclaim after ``--claim-idle``."""
        self.reader.close()
        try:
            moved = self.store.requeue_pending(self.shared_streams, self.consumer)  # the default why: a stop
        except Exception as exc:  # noqa: BLE001 - Redis away as it stops: a line, not a traceback
            log.warning("could not hand back its unfinished tasks (%s): reclaimed after --claim-idle", exc)
            return
        if moved:
            log.warning("handed back %d task(s) this worker was delivered but did not finish", moved)

    def _leave(self) -> None:
        self.scheduler.stop()
        try:
            self.membership.leave()
            self.scheduler.release()
        except Exception:  # noqa: BLE001 - the lease and the registry entry expire by themselves
            pass

    # ----------------------------------------------------------------- loop
    def _on_reclaimed(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        self._reclaimed.append((stream, entry_id, fields))
        self.reader.wake()

    def _decision_streams(self) -> list[str]:
        unpinned = [s for q in self.membership.poll() for s in self._unpinned_of[q]]
        return self.sticky_streams + self.pinned_streams + unpinned

    def _pass(self) -> None:
        if self._take_back or self.activities.left_over:
            self._take_back_unseen()
        self.activities.record(self.decider.apply_eager, self._complete)
        self.activities.shed()
        self.decider.cache.drop_closed(self.store.runs_open)
        if self._handed:
            handed, self._handed = self._handed, []
            self._decide(handed)
        while self._reclaimed:
            # Taken off the line once handled: an outage meanwhile leaves it first for the next
            # pass (it is this worker's now, and would otherwise wait for another reclaim).
            self._redeliver(*self._reclaimed[0])
            self._reclaimed.popleft()
        # Activity tasks only for a free thread (or the small prefetch of microsecond activities,
        # workers.pace): the rest stay in their queue's backlog, where any worker (and `durable
        # workers`) sees them. COUNT is per stream: each gets a share.
        lanes = {DECISIONS: (self.broken.usable(self._decision_streams() + self.outbox_streams), 64)}
        room = self.activities.read_room()
        if room > 0:
            # (A draining worker leaves the shared ones to the other workers: membership.py.)
            streams = [s for q in self.membership.activity_queues() for s in self._activities_of[q]]
            streams = self.broken.usable(streams + self._session_streams)
            lanes[ACTIVITIES] = (streams, max(1, min(self.concurrency, room // len(streams))))
        idle = not (self._reclaimed or self.activities.results_in_hand)
        response = self.reader.read(lanes, block_ms=self.block_ms, wait=idle)
        try:
            self._handle(response or [])
        finally:
            # A load is good for the pass that took it and the next (until its run's task is decided).
            self.decider.preloads.end_pass()

    def _redeliver(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """Handle a task the scheduler reclaimed from a worker that stopped responding."""
        kind = self.stream_kinds.get(stream)
        if kind == WORKFLOW and block_if_decision_crash_loop(
            self.store, stream, entry_id, fields, self.max_deliveries
        ):
            return  # the same decision keeps dying with its worker: its run is blocked, the task kept
        if kind == ACTIVITY and fail_if_crash_loop(
            self.store, stream, entry_id, fields, consumer=self.consumer, on_timer=self.scheduler.notify
        ):
            return  # its attempt kept killing workers: failed (the retry policy decides)
        self._dispatch(kind, stream, entry_id, fields, redelivered=True)

    def _complete(self, outcomes: list[AttemptOutcome]) -> None:
        """Record queued activities' results, loading the runs they wake for this pass's decisions.
        The woken tasks that land in this worker's sticky streams come back read for it (no read
        round trip): they are decided right after, in this pass."""
        self.decider.preloads.forget(o.task.run_id for o in outcomes)
        loads, handed = complete_and_preload(
            self.store, outcomes, self.decider.cache.seq_of, taker=self.consumer, sticky=self.session_queue
        )
        self.decider.preloads.add(loads)
        partition_of = self.store.keys.partition_of_key
        self._handed += [Task(partition_of(t.stream), t.stream, t.entry_id, t.fields) for t in handed]

    def _handle(self, response: list[tuple[str, Reply]]) -> None:
        decisions: list[Task] = []
        # COUNT is per stream, so one read over many activity streams may bring more tasks
        # than this worker should hold (or tasks of a type it prefetches none of): the excess
        # goes back to its streams for others.
        excess: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}
        partition_of = self.store.keys.partition_of_key
        for lane, reply in response:
            for stream, entries in reply:
                if lane == ACTIVITIES:
                    for entry_id, fields in entries:
                        if self.activities.takes(fields):
                            self._dispatch(ACTIVITY, stream, entry_id, fields)
                        else:
                            excess.setdefault(stream, []).append((entry_id, fields))
                elif self.stream_kinds.get(stream) == OUTBOX:
                    for entry_id, fields in entries:
                        self._dispatch(OUTBOX, stream, entry_id, fields)
                else:
                    p = partition_of(stream)
                    decisions += [Task(p, stream, entry_id, fields) for entry_id, fields in entries]
        if excess:
            self.activities.hand_back_excess(excess)
        if decisions:
            self._decide(decisions)

    def _decide(self, decisions: list[Task]) -> None:
        self._batch = decisions
        self.decider.handle_batch(decisions)
        self._batch = []
        self.decisions += len(decisions)

    def _dispatch(
        self,
        kind: str | None,
        stream: str,
        entry_id: str,
        fields: dict[bytes, bytes],
        *,
        redelivered: bool = False,
    ) -> None:
        p = self.store.keys.partition_of_key(stream)
        if kind == OUTBOX:
            handle_outbox(self.store, p, stream, entry_id, fields)
        elif kind == WORKFLOW:
            self.decider.handle(p, stream, entry_id, fields)
            self.decisions += 1
        elif kind == ACTIVITY:
            self.activities.submit(stream, entry_id, fields, redelivered=redelivered)
        else:  # pragma: no cover - only our streams are read
            log.error("task from unknown stream %s", stream)
