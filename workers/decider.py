"""The decider: turns workflow tasks into commits.

For each task it loads the run (record, inbox, new history) in one round trip
shared by the batch, replays the history or reuses the run's cached driver,
lets the workflow code decide, and commits the decision as one
:class:`~durable.store.tasks.CommitPlan` (one script per run, one round trip
for the batch). Drivers hold suspended greenlets, which only the thread that
created them can resume, so the decider and its :class:`RunCache` live on the
worker's main thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import field
from typing import Any, TypeGuard

from durable import events as ev
from durable.errors import (
    EventConflict,
    HistoryCorrupt,
    HistoryTooNew,
    NondeterminismError,
    Overrun,
    SerializationError,
    UnknownTypeError,
    WorkflowClosed,
)
from durable.history_budget import one_decisions_inputs
from durable.ids import clipped
from durable.immutable import immutable
from durable.registry import get_workflow
from durable.replay import Decision, Driver
from durable.store.connect import is_redis_error, is_transient
from durable.store.redis_store import OPEN_STATUSES, ClaimedTask, RedisStore, RunRef, StaleCompletion
from durable.store.tasks import (
    ActivityTask,
    AttemptResult,
    CommitPlan,
    child_policy_message,
    child_start_message,
)

from . import faults, metrics
from .attempts import complete_batch, completion, counted
from .closings import child_result, next_run_of, say_closed
from .logging import bind_run, bound_run, unbind_run
from .preloads import Preloads
from .routing import UNKNOWN_TYPE_GRACE, Lacked, Routing, TypeNotHere
from .run_cache import RunCache
from .timeouts import attempt_deadline
from .undecidable import undecidable

log = logging.getLogger("durable.worker")
_SAID_ELSEWHERE = (WorkflowClosed, StaleCompletion, HistoryCorrupt)  # commit outcomes not logged as errors


@immutable
class Task:
    """One claimed workflow task entry: its partition, stream, entry id and fields."""

    p: int
    stream: str
    entry_id: str
    fields: dict[bytes, bytes]
    run_id: str = field(init=False)  # from ``fields`` once: a decision asks for it often

    def __post_init__(self) -> None:
        raw = self.fields.get(b"run")
        try:
            run_id = raw.decode() if raw is not None else ""
        except UnicodeDecodeError:  # not a run id anyone wrote: parked (handle_batch), not a crash
            run_id = ""
        object.__setattr__(self, "run_id", run_id)

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream, self.entry_id)


class Decider:
    """Runs workflow tasks: load run, replay (or reuse the cached driver), decide, commit."""

    def __init__(
        self,
        store: RedisStore,
        *,
        cache_size: int = 1000,
        allowed: Callable[[str], bool] = lambda _name: True,
        on_timer: Callable[[int], None] = lambda _due: None,
        runs_activity: Callable[[ev.ActivityScheduled], bool] = lambda _a: False,
        on_leased: Callable[[ActivityTask], None] = lambda _task: None,
        on_lease_dropped: Callable[[int], None] = lambda _n: None,
        claims_activity: Callable[[ev.ActivityScheduled], bool] = lambda _a: False,
        on_claimed: Callable[[ClaimedTask], None] = lambda _task: None,
        claimer: str = "",
        lease_ms: int = 30_000,
        build_id: str = "",
        compatible: tuple[str, ...] = (),
        sticky: str = "",
        unknown_type_grace: float = UNKNOWN_TYPE_GRACE,
    ) -> None:
        self.store = store
        # Tasks of a type this worker lacks go back to their queue (parked after the grace).
        self.routing = Routing(store, unknown_type_grace, on_timer)
        self.cache = RunCache(cache_size)
        # This worker's private queue: a run it decided keeps coming back here while it
        # lives, so its driver is a cache hit instead of a replay (empty: no affinity).
        self.sticky = sticky if cache_size > 0 else ""
        self.allowed = allowed
        self.on_timer = on_timer
        self.runs_activity = runs_activity
        self.on_leased = on_leased
        self.on_lease_dropped = on_lease_dropped
        # Queued activities this worker has room for (its backlog) are read for it by the commit
        # that schedules them (and begun there): no read and no begin_attempt round trip.
        self.claims_activity = claims_activity if claimer else (lambda _a: False)
        self.on_claimed = on_claimed
        self.claimer = claimer
        self.build_id = build_id
        self.builds = {build_id, *compatible} if build_id else {""}
        self.lease_ms = lease_ms
        # Local clock -> Redis clock, so eager completions are stamped on Redis's time line.
        self.clock_offset_ms = store.server_time_ms() - int(time.time() * 1000)
        # Wraps each run's replay and decision (the worker's watchdog times them).
        self.deciding: Callable[[Task], AbstractContextManager[object]] = nullcontext
        # Loads taken with the completions that woke their runs (see workers.preloads).
        self.preloads = Preloads()

    def _resolve(self, name: str) -> Any:
        if not self.allowed(name):
            raise TypeNotHere(name)
        return get_workflow(name)

    def handle(self, p: int, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """Decide one workflow task."""
        self.handle_batch([Task(p, stream, entry_id, fields)])

    def handle_batch(self, tasks: list[Task]) -> None:
        """Decide a batch of workflow tasks: one round trip loads every run, one commits
        every decision (each commit is its own atomic script)."""
        ready: list[Task] = []
        for task in tasks:
            if task.run_id:
                ready.append(task)
            else:
                self._park(
                    task,
                    "task has no run id" if b"run" not in task.fields else "task's run id is not UTF-8 text",
                )
        conflicts: dict[str, int] = {}
        while ready:
            # A run twice in one batch (a reclaimed task beside a fresh one) is decided in turn.
            this_round: dict[str, Task] = {}
            later: list[Task] = []
            for task in ready:
                if task.run_id in this_round:
                    later.append(task)
                else:
                    this_round[task.run_id] = task
            # A task whose commit met a newer history is decided again at once, on a fresh replay: the
            # other writer (an eager commit, a stale decider) may have left inputs only it will read.
            for task in self._round(list(this_round.values())):
                conflicts[task.run_id] = conflicts.get(task.run_id, 0) + 1
                if conflicts[task.run_id] <= 5:
                    later.append(task)
                else:  # inputs keep coming (signals at its close): after other work, not a reclaim's 30 s
                    self._requeue(task)
            ready = later

    def _round(self, tasks: list[Task]) -> list[Task]:
        """Decide tasks of distinct runs; returns those whose commit conflicted."""
        began = time.perf_counter()
        afters = [self.cache.seq_of(task.run_id) for task in tasks]
        # Runs loaded with the completion that woke them (complete_and_preload), if still current.
        pre = [self.preloads.take(task.run_id) for task in tasks]
        need = [
            (t.p, t.run_id, a)
            for t, a, (at, got) in zip(tasks, afters, pre, strict=True)
            if at != a or got is None
        ]
        fresh = iter(self.store.load_each(need) if need else [])
        loaded = [
            got if at == a and got is not None else next(fresh)
            for a, (at, got) in zip(afters, pre, strict=True)
        ]
        pending: list[tuple[Task, RunRef, Driver, Decision, dict[str, Any]]] = []
        for task, after, got in zip(tasks, afters, loaded, strict=True):
            if isinstance(got, HistoryCorrupt):  # its keys hold the wrong kind of value
                self._park_undecidable(task, task.run_id, None, [], got)
                continue
            record, inbox, rows = got
            # Every log line of this run's decision carries its ids (the type, once replayed).
            token = bind_run({"workflow_id": (record or {}).get("workflow_id"), "run_id": task.run_id})
            try:
                with self.deciding(task):
                    prepared = self._prepare(task, after, record, inbox, rows)
            finally:
                unbind_run(token)
            if prepared is not None:
                pending.append((task, *prepared))
        if not pending:
            return []
        faults.point("decision.before_commit")
        plans = [
            self.commit_plan(ref, record, driver, decision, task.key)
            for task, ref, driver, decision, record in pending
        ]
        try:
            results = self.store.commit_many([(p[1], plan) for p, plan in zip(pending, plans, strict=True)])
        except BaseException:
            for _, _, driver, _, _ in pending:
                driver.close()
            self._unreserve(plans)
            raise
        faults.point("decision.after_commit")
        conflicted = []
        for (task, ref, driver, decision, record), plan, result in zip(pending, plans, results, strict=True):
            if isinstance(result, WorkflowClosed):
                self.store.ack_task(*task.key)
            elif isinstance(result, EventConflict):
                conflicted.append(task)
            elif isinstance(result, HistoryCorrupt):  # its history is gone, or a key of another kind
                self._park_undecidable(task, ref.run_id, None, [], result)
            self._after_commit(ref, driver, decision, plan, result)
            if metrics.enabled():
                metrics.measured(driver.workflow_type, decision.closing, record, result, began)
        unavailable = [r for r in results if isinstance(r, Exception) and is_transient(r)]
        if unavailable:
            raise unavailable[0]  # the worker waits the outage out; these tasks stay pending
        return conflicted

    def _requeue(self, task: Task) -> None:
        try:
            self.store.requeue({task.stream: [(task.entry_id, task.fields)]})
        except Exception as exc:  # noqa: BLE001 - it stays pending: reclaimed after --claim-idle
            log.warning("could not put workflow task %s back on %s: %s", task.entry_id, task.stream, exc)

    def _unreserve(self, plans: Sequence[CommitPlan]) -> None:
        """The threads reserved for leased and claimed activities of plans never committed."""
        reserved = sum(len(plan.leased) + len(plan.claimed) for plan in plans)
        if reserved:
            self.on_lease_dropped(reserved)

    def _after_commit(
        self, ref: RunRef, driver: Driver, decision: Decision, plan: CommitPlan, result: Any
    ) -> None:
        if isinstance(result, Exception):
            self._unreserve([plan])
        if isinstance(result, EventConflict):
            log.info(
                "commit of run %s not made (%s); decided again", ref.run_id, result, extra=_ids(ref, driver)
            )
            driver.close()
        elif isinstance(result, Exception):
            driver.close()
            if not isinstance(result, _SAID_ELSEWHERE) and not is_transient(result):
                log.error(
                    "commit of run %s failed: %s; the task stays pending, retried",
                    ref.run_id,
                    result,
                    extra=_ids(ref, driver),
                )
        else:
            driver.committed()
            self.cache.put(ref.run_id, driver)
            if decision.closing is not None:
                say_closed(decision.closing, ref, driver.workflow_type, _ids(ref, driver))
            # After the commit: a scheduler woken earlier would not see the timer yet.
            for _, due in decision.timers:
                self.on_timer(due)
            for task in plan.leased:
                self.on_leased(task)
            if result.claimed:
                built = {task.activity_id: task for task, _ in plan.claimed}
                for claimed in result.claimed:
                    self.on_claimed(claimed.with_task(built))
            if len(result.claimed) < len(plan.claimed):  # a stream lost its consumer group
                self.on_lease_dropped(len(plan.claimed) - len(result.claimed))

    def apply_eager(self, results: list[AttemptResult]) -> None:
        """Commit results of activities this worker ran itself together with each run's next
        decision, in one script per run: no inbox, no workflow task. These are leased attempts
        (eager mode) and queued tasks this worker's commits claimed (the commit acks the task's
        entry). A run not in the cache, or whose history moved on meanwhile, takes the ordinary
        path: the result goes through the inbox (completion script)."""
        began = time.perf_counter()
        by_run: dict[str, list[AttemptResult]] = {}
        for result in results:
            by_run.setdefault(result.task.run_id, []).append(result)
        pending: list[tuple[RunRef, Driver, Decision, CommitPlan, list[AttemptResult]]] = []
        inbox: list[AttemptResult] = []  # the ordinary path, in one batch
        # Written to Redis a few at a time as they are decided (Redis commits the first while
        # this thread decides the rest); every written one's outcome is read, whatever happens.
        commits = self.store.commits()
        try:
            for rid, items in by_run.items():
                driver = self.cache.pop(rid)
                if driver is None:
                    inbox += items
                    continue
                decided = self._decide_eager(rid, driver, items)
                if decided is None:
                    inbox += items  # the ordinary path meets (and parks) the problem
                    continue
                ref, decision, plan = decided
                try:
                    commits.add(ref, plan)
                except BaseException:
                    self._unreserve([plan])
                    raise
                pending.append((ref, driver, decision, plan, items))
        finally:
            outcomes = commits.outcomes() if pending else []
            for (ref, driver, decision, plan, items), outcome in zip(pending, outcomes, strict=True):
                self._after_commit(ref, driver, decision, plan, outcome)
                if metrics.enabled():
                    metrics.measured(
                        driver.workflow_type, decision.closing, {}, outcome, began
                    )  # not a first
                if isinstance(outcome, Exception):
                    inbox += items
                else:
                    for result in items:
                        counted(result.task, result.record)
        if inbox:
            complete_batch(self.store, [completion(r) for r in inbox])

    def _decide_eager(
        self, rid: str, driver: Driver, items: list[AttemptResult]
    ) -> tuple[RunRef, Decision, CommitPlan] | None:
        """Run ``rid``'s cached ``driver`` on with the results in ``items``: its ref, decision
        and commit plan, or None when the code cannot go on (the driver is closed)."""
        ts = max(int(time.time() * 1000) + self.clock_offset_ms, driver.now_ms)
        entries = []
        for item in items:
            event = ev.ActivityCompleted(
                id=item.task.activity_id, result=item.payload, attempt=item.task.attempt
            )
            entries.append(ev.Entry(seq=0, ts=ts, event=event, raw=ev.encode(event, ts)))
        first = items[0].task
        ref = RunRef(first.partition, rid, first.workflow_id)
        token = bind_run(
            {"workflow_id": ref.workflow_id, "run_id": rid, "workflow_type": driver.workflow_type}
        )
        try:
            with self.deciding(Task(ref.partition, "", "", {b"run": rid.encode()})):
                decision = driver.decide(entries)
        except (NondeterminismError, UnknownTypeError, HistoryCorrupt, SerializationError, Overrun):
            driver.close()
            return None
        finally:
            unbind_run(token)
        record = {"parent": first.parent, "build": self.build_id}
        return ref, decision, self.commit_plan(ref, record, driver, decision, None, eager=items)

    def _prepare(
        self,
        task: Task,
        after: int,
        record: dict[str, Any] | None,
        inbox: list[bytes],
        rows: list[tuple[bytes, dict[bytes, bytes]]],
    ) -> tuple[RunRef, Driver, Decision, dict[str, Any]] | None:
        """Replay (or reuse the cached driver) and decide; park the task if the run cannot go on."""
        p, rid = task.p, task.run_id
        if not self._decidable(record, task):
            return None
        driver = self.cache.take(rid, record["seq"], new=record.get("status") == "pending")
        if driver is None and after:
            # Loaded for a cached driver that is gone or stale (another worker decided the run):
            # the whole history is read with its record, in one transaction. Read apart, it held
            # the events a completion committed in between, and the run was blocked as corrupt.
            record, inbox, rows = self.store.load_for_decision(p, rid, 0)
            if not self._decidable(record, task):
                return None
        ref = RunRef(p, rid, record.get("workflow_id", ""))
        try:
            if driver is None:
                driver = Driver(
                    run_id=rid, workflow_id=ref.workflow_id, resolve=self._resolve, token_prefix=f"{p}."
                )
                self._replay_leaving_patched(driver, ref, record, rows)
            if driver.undeclared_patches and self.routing.leave_to_newer_code(record, driver):
                raise TypeNotHere(driver.workflow_type, patches=driver.recorded_patches)
            run_fields = bound_run()
            if run_fields is not None:
                run_fields["workflow_type"] = driver.workflow_type
            inbox = one_decisions_inputs(inbox)
            entries, poison = [], []
            for raw in inbox:
                try:
                    entries.append(ev.decode(raw, run_id=rid))
                except HistoryCorrupt as exc:
                    poison.append((raw, str(exc)))
            decision = (
                driver.decide(entries) if not poison else self._decide_around_poison(driver, inbox, poison)
            )
        except (TypeNotHere, HistoryTooNew) as exc:  # left to a worker that can decide the run
            if driver is not None:
                driver.close()
            self.routing.lacking(
                p, task.stream, task.entry_id, task.fields, record, exc, Lacked(driver, rows)
            )
            return None
        except Exception as exc:
            if driver is not None:
                driver.close()
            if is_transient(exc) or is_redis_error(exc):
                raise  # Redis being away is no fault of the run's: its task waits
            self._park_undecidable(task, rid, driver, inbox, exc)
            return None
        except BaseException as exc:
            if driver is not None:
                driver.close()
            if isinstance(exc, Overrun):  # the watchdog stopped runaway code; it blocked the run
                return None
            raise
        return ref, driver, decision, record

    def _decidable(self, record: dict[str, Any] | None, task: Task) -> TypeGuard[dict[str, Any]]:
        """Whether this worker decides ``task``'s run now; else the task is parked (no such run),
        acked (closed or blocked) or handed to the build the run is pinned to."""
        if record is None:
            self._park(task, f"run {clipped(task.run_id)} does not exist")
            return False
        if record.get("status") not in OPEN_STATUSES or record.get("blocked"):
            self.store.ack_task(*task.key)
            return False
        pinned = record.get("build", "")
        if pinned and pinned not in self.builds:
            # Pinned to code this worker does not have: hand the task to that build's workers.
            self.store.reroute(task.stream, task.entry_id, task.run_id, record["wq"])
            return False
        return True

    def _park(self, task: Task, reason: str, **blocking: Any) -> None:
        """Set ``task`` aside for ``reason`` (``blocking``: the run it blocks, see ``park``)."""
        self.store.park(
            p=task.p,
            stream=task.stream,
            entry_id=task.entry_id,
            kind="workflow",
            reason=reason,
            fields=task.fields,
            **blocking,
        )

    def _park_undecidable(
        self, task: Task, rid: str, driver: Driver | None, inbox: list[bytes], exc: Exception
    ) -> None:
        """Park and block a run its decision raised for (:func:`~workers.undecidable.undecidable`)."""
        reason, culprit = undecidable(rid, driver, exc, self.claimer, self.build_id)
        at = inbox.index(culprit.raw) + 1 if culprit is not None and culprit.raw in inbox else 0
        self._park(task, reason, run_id=rid, block=True, input_at=at)

    def _replay_leaving_patched(self, driver: Driver, ref: RunRef, record: dict[str, Any], rows: Any) -> None:
        """:meth:`_replay`. A run this code cannot replay that recorded patches its class lacks is
        left to a live worker declaring them (:class:`TypeNotHere`; the registry read now: else
        the run is blocked)."""
        try:
            self._replay(driver, ref, record, rows)
        except Exception as exc:
            if (
                is_transient(exc)
                or is_redis_error(exc)
                or not driver.undeclared_patches
                or not self.routing.leave_to_newer_code(record, driver, fresh=True)
            ):
                raise
            raise TypeNotHere(driver.workflow_type, patches=driver.recorded_patches) from None

    def _replay(self, driver: Driver, ref: RunRef, record: dict[str, Any], rows: Any) -> None:
        """Rebuild a run's driver from its whole history (a cache miss)."""
        driver.hook_secrets = self.store.hook_secrets
        began = time.perf_counter()
        # A run no decision was committed for yet runs its code live (its logs are new).
        entries = self.store.decode_history(ref, rows, last=record["seq"])
        undecided = record.get("status") == "pending"
        driver.replay(entries, undecided=undecided)
        if not undecided:  # a new run's first decision replays nothing: no replay to count
            metrics.replayed(driver.workflow_type, time.perf_counter() - began)

    def _decide_around_poison(
        self, driver: Driver, inbox: list[bytes], poison: list[tuple[bytes, str]]
    ) -> Decision:
        bad = {raw for raw, _ in poison}
        decision = driver.decide([ev.decode(raw) for raw in inbox if raw not in bad])
        decision.consumed = len(inbox)
        decision.dropped.extend((raw, f"poison: {reason}") for raw, reason in poison)
        return decision

    def commit_plan(
        self,
        ref: RunRef,
        record: dict[str, Any],
        driver: Driver,
        decision: Decision,
        task: tuple[str, str] | None,
        *,
        eager: Sequence[AttemptResult] = (),
    ) -> CommitPlan:
        """What a decision commits: its events, the activity tasks it schedules (those this
        worker runs itself are leased to it), outbox messages, timers, the run's new state.

        ``eager``: results of attempts this worker ran, applied by the decision; the run's
        inbox (inputs that arrived meanwhile) is then left for its next workflow task.
        """
        queued, claimed, leased, claim_started = self._place_activities(ref, record, driver, decision)
        outbox = [child_start_message(ref.workflow_id, ref.run_id, c) for c in decision.children]
        outbox += [child_policy_message(policy, wid) for _cid, wid, policy in decision.cancelled_children]
        close = next_run = None
        if decision.closing is not None:
            close = ev.STATUS_OF_CLOSING[decision.closing.type]
            if isinstance(decision.closing, ev.WorkflowContinuedAsNew):
                next_run = next_run_of(ref, record, driver, decision.closing, self.build_id)
            elif record.get("parent"):
                outbox.append(child_result(record["parent"], decision.closing))
        pin = None
        if self.build_id and not record.get("build"):
            pin = (self.build_id, record.get("queue", driver.queue))
        return CommitPlan(
            expected_seq=decision.expected_seq,
            events=decision.events,
            consumed=0 if eager else decision.consumed,
            status=decision.status,
            snapshot=decision.snapshot,
            dropped=[(raw, reason, reason.startswith("poison")) for raw, reason in decision.dropped],
            carried=decision.carried,
            activities=queued,
            claimed=claimed,
            claimer=self.claimer,
            claim_started=claim_started,
            leased=leased,
            lease_due=claim_started + self.clock_offset_ms + self.lease_ms,  # now (ms) + the lease
            timers=decision.timers,
            cancelled_timers=decision.cancelled_timers,
            cancelled_activities=decision.cancelled_activities,
            outbox=outbox,
            hooks=[(h.token, h.id) for h in decision.hooks],
            expired_hooks=decision.expired_hooks,
            eager=eager,
            close=close,
            next_run=next_run,
            pin=pin,
            task=task,
            sticky=self.sticky if close is None else "",
            search_attributes=decision.search_attributes,
            memo=decision.memo,
        )

    def _place_activities(
        self, ref: RunRef, record: dict[str, Any], driver: Driver, decision: Decision
    ) -> tuple[list[ActivityTask], list[tuple[ActivityTask, int]], list[ActivityTask], int]:
        """The decision's activity tasks by where they run: queued (any worker reads them),
        claimed (read and begun for this worker by the commit, with their deadlines), leased
        (run here under a lease); and when the claimed attempts begin (ms)."""
        queued: list[ActivityTask] = []
        claimed: list[tuple[ActivityTask, int]] = []
        leased: list[ActivityTask] = []
        started = time.time()
        p = ref.partition
        for a in decision.activities:
            activity = ActivityTask(
                ref.run_id,
                ref.workflow_id,
                p,
                a.id,
                a.name,
                a.args,
                1,
                self.store.keys.activity_tasks(p, a.queue),
                a.retry,
                a.timeouts,
                driver.now_ms,
                record.get("parent"),
                a.headers or None,
            )
            if self.runs_activity(a):
                leased.append(activity)
            elif self.claims_activity(a):
                deadline = attempt_deadline(activity, started)
                claimed.append((activity, int(deadline * 1000) if deadline is not None else 0))
            else:
                queued.append(activity)
        return queued, claimed, leased, int(started * 1000)


def _ids(ref: RunRef, driver: Driver) -> dict[str, str]:
    """The run's ids for a log line written outside its binding (commits are settled per batch)."""
    return {"workflow_id": ref.workflow_id, "run_id": ref.run_id, "workflow_type": driver.workflow_type}
