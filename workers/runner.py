"""What a worker does with one task: decide a run, or run an activity attempt.

Kept apart from the worker loop (``worker.py``) so each can be read top to
bottom: the loop claims tasks; these functions turn one task into one
commit.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durable import codec
from durable import events as ev
from durable.activity import ActivityContext, RetryPolicy, _set_context
from durable.errors import (
    ActivityTimeout,
    DurableError,
    EventConflict,
    HistoryCorrupt,
    NondeterminismError,
    NonRetryableError,
    SerializationError,
    UnknownTypeError,
    WorkflowClosed,
)
from durable.ids import successor_run_id
from durable.registry import get_activity, get_workflow
from durable.replay import Decision, Driver
from durable.store.redis_store import (
    OPEN_STATUSES,
    RedisStore,
    RunRef,
    StaleCompletion,
    child_result_message,
)

from . import faults

log = logging.getLogger("durable.worker")


def _type_names(exc: BaseException) -> set[str]:
    names = set()
    for klass in type(exc).__mro__:
        names.add(klass.__name__)
        names.add(f"{klass.__module__}.{klass.__qualname__}")
    type_name = getattr(exc, "type_name", "")
    if type_name:
        names.add(type_name)
        names.add(type_name.rsplit(".", 1)[-1])
    return names


class RunCache:
    """LRU of live drivers (suspended greenlets + last applied seq), per worker thread.

    A hit makes a decision cost O(new events) instead of O(history). Evicted
    drivers are closed: suspended greenlets in cycles are never collected.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._drivers: OrderedDict[str, Driver] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def take(self, run_id: str, seq: int) -> Driver | None:
        driver = self._drivers.pop(run_id, None)
        if driver is not None and driver.seq == seq:
            self.hits += 1
            return driver
        if driver is not None:
            driver.close()
        self.misses += 1
        return None

    def put(self, run_id: str, driver: Driver) -> None:
        if self.size <= 0 or driver.closed_run:
            driver.close()
            return
        self._drivers[run_id] = driver
        while len(self._drivers) > self.size:
            _, old = self._drivers.popitem(last=False)
            old.close()

    def seq_of(self, run_id: str) -> int:
        """The seq the cached driver of ``run_id`` has applied (0 when not cached)."""
        driver = self._drivers.get(run_id)
        return driver.seq if driver is not None else 0

    def pop(self, run_id: str) -> Driver | None:
        """Take the cached driver of ``run_id`` out, whatever its seq (eager commits)."""
        return self._drivers.pop(run_id, None)

    def clear(self) -> None:
        for driver in self._drivers.values():
            driver.close()
        self._drivers.clear()

    def __len__(self) -> int:
        return len(self._drivers)


@dataclass(frozen=True)
class Task:
    """One claimed task entry: its partition, stream, entry id and fields."""

    p: int
    stream: str
    entry_id: str
    fields: dict[bytes, bytes]

    @property
    def run_id(self) -> str:
        raw = self.fields.get(b"run")
        return raw.decode() if raw is not None else ""

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
        on_leased: Callable[[dict[str, Any]], None] = lambda _body: None,
        on_lease_dropped: Callable[[int], None] = lambda _n: None,
        lease_ms: int = 30_000,
        build_id: str = "",
        compatible: tuple[str, ...] = (),
        sticky: str = "",
    ) -> None:
        self.store = store
        self.cache = RunCache(cache_size)
        # This worker's private queue: a run it decided keeps coming back here while it
        # lives, so its driver is a cache hit instead of a replay (empty: no affinity).
        self.sticky = sticky if cache_size > 0 else ""
        self.allowed = allowed
        self.on_timer = on_timer
        self.runs_activity = runs_activity
        self.on_leased = on_leased
        self.on_lease_dropped = on_lease_dropped
        self.build_id = build_id
        self.builds = {build_id, *compatible} if build_id else {""}
        self.lease_ms = lease_ms
        # Local clock -> Redis clock, so eager completions are stamped on Redis's time line.
        self.clock_offset_ms = store.server_time_ms() - int(time.time() * 1000)

    def _resolve(self, name: str) -> Any:
        if not self.allowed(name):
            raise UnknownTypeError(
                f"workflow type {name!r} is not defined in this worker's --app modules; start a worker "
                "with the module that defines it"
            )
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
                self.store.park(
                    p=task.p,
                    stream=task.stream,
                    entry_id=task.entry_id,
                    kind="workflow",
                    reason="task has no run id",
                    fields=task.fields,
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
            # A task whose commit met a newer history is decided again at once, on a
            # fresh replay: the other writer (an eager commit, a stale decider) may have
            # left inputs in the inbox that only this task will read.
            for task in self._round(list(this_round.values())):
                conflicts[task.run_id] = conflicts.get(task.run_id, 0) + 1
                if conflicts[task.run_id] <= 5:
                    later.append(task)
            ready = later

    def _round(self, tasks: list[Task]) -> list[Task]:
        """Decide tasks of distinct runs; returns those whose commit conflicted."""
        afters = []
        for task in tasks:
            afters.append(self.cache.seq_of(task.run_id))
        loaded = self.store.load_many(
            [(t.p, t.run_id, after) for t, after in zip(tasks, afters, strict=True)]
        )
        pending: list[tuple[Task, RunRef, Driver, Decision, dict[str, Any]]] = []
        for task, after, (record, inbox, rows) in zip(tasks, afters, loaded, strict=True):
            prepared = self._prepare(task, after, record, inbox, rows)
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
            results = self.store.commit_many(
                [(p[1], plan) for p, (plan, _) in zip(pending, plans, strict=True)]
            )
        except BaseException:
            for _, _, driver, _, _ in pending:
                driver.close()
            raise
        faults.point("decision.after_commit")
        conflicted = []
        for (task, ref, driver, decision, _), (_, leased), result in zip(
            pending, plans, results, strict=True
        ):
            if isinstance(result, WorkflowClosed):
                self._ack_only(task.key)
            elif isinstance(result, EventConflict):
                conflicted.append(task)
            self._after_commit(ref, driver, decision, leased, result)
        return conflicted

    def _after_commit(
        self, ref: RunRef, driver: Driver, decision: Decision, leased: list[dict[str, Any]], result: Any
    ) -> None:
        if isinstance(result, Exception) and leased:
            self.on_lease_dropped(len(leased))
        if isinstance(result, EventConflict):
            log.info("conflict committing run %s; another decider won, discarding", ref.run_id)
            driver.close()
        elif isinstance(result, Exception):
            driver.close()
            if not isinstance(result, WorkflowClosed | StaleCompletion):
                log.error(
                    "commit of run %s failed: %s; the task stays pending and is retried", ref.run_id, result
                )
        else:
            driver.committed()
            self.cache.put(ref.run_id, driver)
            # After the commit: a scheduler woken earlier would not see the timer yet.
            for _, due in decision.timers:
                self.on_timer(due)
            for body in leased:
                self.on_leased(body)

    def apply_eager(self, results: list[tuple[dict[str, Any], bytes, dict[str, Any]]]) -> None:
        """Commit results of activities this worker ran itself together with each run's next
        decision, in one script per run (eager mode): no inbox, no workflow task.

        A run not in the cache, or whose history moved on meanwhile, takes the
        ordinary path: the result goes through the inbox (completion script).
        """
        by_run: dict[str, list[tuple[dict[str, Any], bytes, dict[str, Any]]]] = {}
        for item in results:
            by_run.setdefault(item[0]["rid"], []).append(item)
        pending = []
        inbox: list[tuple[dict[str, Any], bytes, dict[str, Any]]] = []  # the ordinary path, in one batch
        for rid, items in by_run.items():
            driver = self.cache.pop(rid)
            if driver is None:
                inbox += items
                continue
            ts = max(int(time.time() * 1000) + self.clock_offset_ms, driver.now_ms)
            entries = []
            for b, payload, _ in items:
                event = ev.ActivityCompleted(id=b["aid"], result=payload, attempt=int(b["attempt"]))
                entries.append(ev.Entry(seq=0, ts=ts, event=event, raw=ev.encode(event, ts)))
            first = items[0][0]
            ref = RunRef(first["p"], rid, first["wid"])
            try:
                decision = driver.decide(entries)
            except (NondeterminismError, UnknownTypeError, HistoryCorrupt, SerializationError):
                # The ordinary path meets (and parks) the problem with a fresh replay.
                driver.close()
                inbox += items
                continue
            plan, leased = self.commit_plan(
                ref, {"parent": first.get("parent"), "build": self.build_id}, driver, decision, None
            )
            plan["eager"] = [(b["aid"], int(b["attempt"]), codec.pack(r)) for b, _, r in items]
            # The applied results came from this worker, not from the inbox: the inbox
            # (inputs that arrived meanwhile) is left for the run's next workflow task.
            plan["consumed"] = 0
            pending.append((ref, driver, decision, leased, plan, items))
        if pending:
            outcomes = self.store.commit_many([(ref, plan) for ref, _, _, _, plan, _ in pending])
            for (ref, driver, decision, leased, _, items), result in zip(pending, outcomes, strict=True):
                self._after_commit(ref, driver, decision, leased, result)
                if isinstance(result, Exception):
                    inbox += items
        if inbox:
            complete_batch(
                self.store, [completion(b, payload, r, stream=b["stream"]) for b, payload, r in inbox]
            )

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
        if record is None:
            self.store.park(
                p=p,
                stream=task.stream,
                entry_id=task.entry_id,
                kind="workflow",
                reason=f"run {rid} does not exist",
                fields=task.fields,
            )
            return None
        if record.get("status") not in OPEN_STATUSES or record.get("blocked"):
            self._ack_only(task.key)
            return None
        pinned = record.get("build", "")
        if pinned and pinned not in self.builds:
            # Pinned to code this worker does not have: hand the task to that build's workers.
            self.store.reroute(p, task.stream, task.entry_id, rid, record["wq"])
            return None
        ref = RunRef(p, rid, record.get("workflow_id", ""))
        driver = self.cache.take(rid, record["seq"])
        try:
            if driver is None:
                if after != 0:
                    rows = self.store.redis.xrange(self.store.keys.history(p, rid), "-", "+")
                driver = Driver(
                    run_id=rid, workflow_id=ref.workflow_id, resolve=self._resolve, token_prefix=f"{p}."
                )
                driver.replay(self.store.decode_history(ref, rows))
            entries, poison = [], []
            for raw in inbox:
                try:
                    entries.append(ev.decode(raw, run_id=rid))
                except HistoryCorrupt as exc:
                    poison.append((raw, str(exc)))
            decision = (
                driver.decide(entries) if not poison else self._decide_around_poison(driver, inbox, poison)
            )
        except (NondeterminismError, UnknownTypeError, HistoryCorrupt, SerializationError) as exc:
            if driver is not None:
                driver.close()
            self.store.park(
                p=p,
                stream=task.stream,
                entry_id=task.entry_id,
                kind="workflow",
                reason=f"{type(exc).__name__}: {exc}",
                fields=task.fields,
                run_id=rid,
                block=True,
            )
            return None
        except BaseException:
            if driver is not None:
                driver.close()
            raise
        return ref, driver, decision, record

    def _decide_around_poison(
        self, driver: Driver, inbox: list[bytes], poison: list[tuple[bytes, str]]
    ) -> Decision:
        good = []
        bad = {raw for raw, _ in poison}
        for raw in inbox:
            if raw not in bad:
                good.append(ev.decode(raw))
        decision = driver.decide(good)
        decision.consumed = len(inbox)
        decision.dropped.extend((raw, f"poison: {reason}") for raw, reason in poison)
        return decision

    def _ack_only(self, task: tuple[str, str]) -> None:
        self.store.ack_task(task[0], task[1])

    def commit_plan(
        self,
        ref: RunRef,
        record: dict[str, Any],
        driver: Driver,
        decision: Decision,
        task: tuple[str, str] | None,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The commit arguments of a decision (activity task bodies, outbox messages, ...),
        and the bodies of the activities leased to this worker (to run once committed)."""
        keys = self.store.keys
        p, rid = ref.partition, ref.run_id
        activities = []
        leased: list[tuple[str, str, bytes, int]] = []
        leased_bodies: list[dict[str, Any]] = []
        lease_due = int(time.time() * 1000) + self.clock_offset_ms + self.lease_ms
        for a in decision.activities:
            stream = keys.activity_tasks(p, a.queue)
            body_dict = {
                "rid": rid,
                "wid": ref.workflow_id,
                "p": p,
                "aid": a.id,
                "name": a.name,
                "args": a.args,
                "attempt": 1,
                "retry": a.retry,
                "timeouts": a.timeouts,
                "stream": stream,
                "scheduled": driver.now_ms,
                "parent": record.get("parent"),
            }
            body = codec.pack(body_dict)
            if self.runs_activity(a):
                leased.append((stream, a.id, body, lease_due))
                leased_bodies.append(body_dict)
            else:
                activities.append((stream, a.id, body))
        outbox = [self._child_start(ref, c) for c in decision.children]
        outbox += [
            codec.pack({"kind": policy, "wid": wid}) for _cid, wid, policy in decision.cancelled_children
        ]
        close = None
        next_run = None
        parent = record.get("parent")
        if decision.closing is not None:
            close = ev.STATUS_OF_CLOSING[decision.closing.type]
            if isinstance(decision.closing, ev.WorkflowContinuedAsNew):
                next_run = self._next_run(ref, record, driver, decision.closing)
            elif parent:
                outbox.append(self._child_result(parent, decision.closing))
        pin = None
        if self.build_id and not record.get("build"):
            pin = (self.build_id, keys.workflow_tasks(p, record.get("queue", driver.queue), self.build_id))
        plan = dict(
            pin=pin,
            expected_seq=decision.expected_seq,
            events=decision.events,
            consumed=decision.consumed,
            dropped=[(raw, reason, reason.startswith("poison")) for raw, reason in decision.dropped],
            activities=activities,
            timers=[(f"t|{rid}|{tid}", due) for tid, due in decision.timers],
            untimers=[f"t|{rid}|{tid}" for tid in decision.cancelled_timers],
            cancel_activities=decision.cancelled_activities,
            outbox=outbox,
            hooks=[(h.token, h.id) for h in decision.hooks],
            leased=leased,
            status=decision.status,
            snapshot=decision.snapshot,
            close=close,
            next_run=next_run,
            task=task,
            sticky=self.sticky if close is None else "",
        )
        return plan, leased_bodies

    def _child_start(self, ref: RunRef, child: ev.ChildStarted) -> bytes:
        return codec.pack(
            {
                "kind": "start",
                "type": child.workflow_type,
                "wid": child.workflow_id,
                "rid": successor_run_id(f"{ref.run_id}/{child.id}", 0),
                "args": child.args,
                "queue": child.queue,
                "parent": {
                    "wid": ref.workflow_id,
                    "rid": ref.run_id,
                    "cid": child.id,
                    "policy": child.policy,
                },
            }
        )

    @staticmethod
    def _child_result(parent: dict[str, Any], closing: ev.Event) -> bytes:
        if isinstance(closing, ev.WorkflowCompleted):
            event: ev.Event = ev.ChildCompleted(id=parent["cid"], result=closing.result)
        elif isinstance(closing, ev.WorkflowFailedEvent):
            event = ev.ChildFailed(id=parent["cid"], error=closing.error, status="failed")
        else:
            event = ev.ChildFailed(id=parent["cid"], status=ev.STATUS_OF_CLOSING[closing.type])
        return child_result_message(parent, event)

    def _next_run(
        self, ref: RunRef, record: dict[str, Any], driver: Driver, closing: ev.WorkflowContinuedAsNew
    ) -> dict[str, Any]:
        keys, p = self.store.keys, ref.partition
        started = driver.started
        assert started is not None
        new_rid = closing.new_run_id
        # The next run keeps the build id (and the patches): same code, same routing.
        build = record.get("build") or self.build_id
        data = ev.WorkflowStarted(
            workflow_type=started.workflow_type,
            workflow_id=ref.workflow_id,
            run_id=new_rid,
            args=closing.args,
            queue=started.queue,
            parent=started.parent,
            build_id=build,
            patches=list(started.patches),
            options={**started.options, "continued_from": ref.run_id},
        ).to_data()
        return {
            "rid": new_rid,
            "wid": ref.workflow_id,
            "type": started.workflow_type,
            "queue": started.queue,
            "data": codec.pack(data),
            "parent": codec.pack(started.parent) if started.parent else b"",
            "run": keys.run(p, new_rid),
            "history": keys.history(p, new_rid),
            "wq": keys.workflow_tasks(p, started.queue, build),
            "runs": keys.runs(p),
            "build": build,
        }


def handle_outbox(store: RedisStore, p: int, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> None:
    """Carry out one cross-partition message (child start, child result, child cancel)."""
    from durable.errors import WorkflowAlreadyStarted, WorkflowNotFound

    try:
        msg = codec.unpack(fields[b"m"])
        kind = msg["kind"]
    except Exception as exc:  # noqa: BLE001 - poison message: park it, never drop it
        store.park(
            p=p, stream=stream, entry_id=entry_id, kind="outbox", reason=f"undecodable: {exc}", fields=fields
        )
        return
    try:
        if kind == "start":
            try:
                store.start(
                    workflow_type=msg["type"],
                    workflow_id=msg["wid"],
                    run_id=msg["rid"],
                    args=msg["args"],
                    queue=msg["queue"],
                    parent=msg["parent"],
                )
            except (WorkflowAlreadyStarted, DurableError) as exc:
                parent = msg["parent"]
                failed = ev.ChildFailed(
                    id=parent["cid"], error=codec.dumps(exc, path="error"), status="failed"
                )
                try:
                    store.deliver(parent["wid"], failed, run_id=parent["rid"])
                except (WorkflowClosed, WorkflowNotFound):
                    pass
        elif kind == "deliver":
            event = ev.CATALOG[msg["type"]](**msg["data"])
            try:
                store.deliver(msg["wid"], event, run_id=msg["rid"])
            except (WorkflowClosed, WorkflowNotFound):
                log.info("parent %s closed before child result arrived; dropped", msg["wid"])
        elif kind in ("request_cancel", "terminate"):
            try:
                if kind == "terminate":
                    store.terminate(msg["wid"], "parent closed (policy terminate)")
                else:
                    store.deliver(msg["wid"], ev.CancelRequested(reason="parent requested cancel"))
            except (WorkflowClosed, WorkflowNotFound):
                pass
        elif kind == "abandon":
            pass
        else:
            store.park(
                p=p,
                stream=stream,
                entry_id=entry_id,
                kind="outbox",
                reason=f"unknown message kind {kind!r}",
                fields=fields,
            )
            return
    except Exception as exc:  # noqa: BLE001
        log.exception("outbox message %s failed; it stays pending and will be retried", entry_id)
        raise exc
    faults.point("outbox.before_ack")
    store.ack_task(stream, entry_id)


_BODY_FIELDS = frozenset({"rid", "wid", "p", "aid", "name", "args", "attempt", "stream"})


def run_activity(
    store: RedisStore,
    stream: str,
    entry_id: str,
    fields: dict[bytes, bytes],
    *,
    allowed: Callable[[str], bool] = lambda _n: True,
    redelivered: bool = False,
    on_timer: Callable[[int], None] = lambda _due: None,
    on_result: Callable[[dict[str, Any], bytes, dict[str, Any]], None] | None = None,
) -> str:
    """Run one activity attempt from a task stream and record its outcome (see
    :func:`execute_attempt`). Returns the outcome word."""
    p = store.keys.partition_of_key(stream)
    try:
        body = codec.unpack(fields[b"body"])
        missing = _BODY_FIELDS - body.keys()
        if missing:
            raise ValueError(f"missing field(s) {sorted(missing)}")
        rid, aid, attempt = body["rid"], body["aid"], int(body["attempt"])
    except Exception as exc:  # noqa: BLE001
        store.park(
            p=p,
            stream=stream,
            entry_id=entry_id,
            kind="activity",
            reason=f"undecodable activity task: {exc}",
            fields=fields,
        )
        return "parked"
    if redelivered:
        current, _ = store.activity_state(p, rid, aid)
        if current is None or codec.unpack(current).get("attempt") != attempt:
            note = {"note": "redelivered attempt no longer current"}
            store.complete_activity(
                **attempt_outcome(body, "skipped", note, stream=stream, entry_id=entry_id)
            )
            return "stale"
    return execute_attempt(
        store, body, stream=stream, entry_id=entry_id, allowed=allowed, on_timer=on_timer, on_result=on_result
    )


def execute_attempt(
    store: RedisStore,
    body: dict[str, Any],
    *,
    stream: str,
    entry_id: str = "",
    allowed: Callable[[str], bool] = lambda _n: True,
    on_timer: Callable[[int], None] = lambda _due: None,
    on_result: Callable[[dict[str, Any], bytes, dict[str, Any]], None] | None = None,
) -> str:
    """Run one attempt of an activity task body and record what happened.

    A failure is recorded at once (retry timer or ActivityFailed). A result is
    recorded with the completion script, or handed to ``on_result`` when the
    caller commits it itself together with the run's next decision (eager mode).
    """
    p, rid, aid, attempt, name = body["p"], body["rid"], body["aid"], int(body["attempt"]), body["name"]
    try:
        if not allowed(name):
            raise UnknownTypeError(f"activity {name!r} is not defined in this worker's --app modules")
        definition = get_activity(name)
        args = codec.loads(body["args"])
    except (UnknownTypeError, SerializationError) as exc:
        store.park(
            p=p,
            stream=stream,
            entry_id=entry_id,
            kind="activity",
            reason=f"{type(exc).__name__}: {exc}",
            fields={"body": codec.pack(body)},
            run_id=rid,
            # The run cannot go on without this activity: block it, visibly, until a
            # worker that has the activity is deployed and `durable repair` re-queues it.
            block=True,
        )
        return "parked"
    timeouts = body.get("timeouts") or {}
    heartbeat_timeout = timeouts.get("heartbeat")
    started = time.time()
    deadline = attempt_deadline(body, started)
    if deadline is not None:
        store.set_deadline(p, rid, aid, attempt, int(deadline * 1000), int(started * 1000))
        on_timer(int(deadline * 1000))
    _, details = store.activity_state(p, rid, aid) if attempt > 1 else (None, None)

    def heartbeat(value: Any) -> bool:
        extend = 0
        if heartbeat_timeout:
            # Push the deadline by one heartbeat timeout, never past the attempt's hard limits.
            hard = attempt_deadline(dict(body, timeouts=dict(timeouts, heartbeat=None)), started)
            due = time.time() + heartbeat_timeout
            extend = max(1, int(((min(due, hard) if hard else due) - time.time()) * 1000))
        details = codec.dumps(value, path="details") if value is not None else b""
        return store.heartbeat(p, rid, aid, attempt, details, extend)

    ctx = ActivityContext(
        workflow_id=body["wid"],
        run_id=rid,
        activity_id=aid,
        name=name,
        attempt=attempt,
        heartbeat_details=codec.loads(details) if details else None,
        heartbeat_fn=heartbeat,
    )
    _set_context(ctx)
    try:
        result = definition.fn(*args)
        payload = codec.dumps(result, path="result")
        faults.point("activity.after_effect")
    except BaseException as exc:  # noqa: BLE001 - every failure is recorded
        if not isinstance(exc, Exception):
            raise
        return fail_attempt(
            store, body, exc, stream=stream, entry_id=entry_id, started=started, on_timer=on_timer
        )
    finally:
        _set_context(None)
    record = {"duration_ms": int((time.time() - started) * 1000)}
    if on_result is not None:
        on_result(body, payload, record)
        return "completed"
    complete(store, body, payload, record, stream=stream, entry_id=entry_id)
    return "completed"


def attempt_outcome(
    body: dict[str, Any],
    outcome: str,
    record: dict[str, Any],
    *,
    stream: str,
    entry_id: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """The completion-script arguments (see ``RedisStore.complete_args``) for one attempt of
    the activity task ``body``: its identity from the body, what happened from the caller."""
    return {
        "p": body["p"],
        "run_id": body["rid"],
        "activity_id": body["aid"],
        "attempt": int(body["attempt"]),
        "stream": stream,
        "entry_id": entry_id,
        "outcome": outcome,
        "event": None,
        "record": record,
        **extra,
    }


def completion(
    body: dict[str, Any], payload: bytes, record: dict[str, Any], *, stream: str, entry_id: str = ""
) -> dict[str, Any]:
    """The completion-script arguments recording an attempt's result through the run's inbox."""
    event = ev.ActivityCompleted(id=body["aid"], result=payload, attempt=int(body["attempt"]))
    return attempt_outcome(body, "completed", record, stream=stream, entry_id=entry_id, event=event)


def attempt_failed(
    body: dict[str, Any], error: BaseException, record: dict[str, Any], *, stream: str, entry_id: str = ""
) -> dict[str, Any]:
    """The completion-script arguments failing an activity for good with ``error``."""
    attempts = int(body["attempt"])
    event = ev.ActivityFailedEvent(id=body["aid"], error=codec.dumps(error, path="error"), attempts=attempts)
    return attempt_outcome(body, "failed", record, stream=stream, entry_id=entry_id, event=event)


def complete(
    store: RedisStore,
    body: dict[str, Any],
    payload: bytes,
    record: dict[str, Any],
    *,
    stream: str,
    entry_id: str = "",
) -> None:
    """Record an attempt's result through the run's inbox (the ordinary, non-eager path)."""
    complete_batch(store, [completion(body, payload, record, stream=stream, entry_id=entry_id)])


def complete_batch(store: RedisStore, completions: list[dict[str, Any]]) -> None:
    """Record several attempts' results in one round trip; late results are logged as discarded."""
    for args, (outcome, _) in zip(completions, store.complete_many(completions), strict=True):
        if outcome == "STALE":
            log.info(
                "late result of activity %s (run %s, attempt %d) discarded",
                args["activity_id"],
                args["run_id"],
                args["attempt"],
            )


def attempt_deadline(body: dict[str, Any], started: float) -> float | None:
    """When an attempt started at ``started`` must have finished (or heartbeated), if ever."""
    timeouts = body.get("timeouts") or {}
    limits = [started + t for t in (timeouts.get("start_to_close"), timeouts.get("heartbeat")) if t]
    if timeouts.get("schedule_to_close"):
        limits.append(body["scheduled"] / 1000 + timeouts["schedule_to_close"])
    return min(limits) if limits else None


def timeout_kind(body: dict[str, Any], started_ms: int | None, now_ms: int) -> str:
    """Which timeout an expired attempt hit: schedule_to_close, start_to_close, heartbeat, or
    ``lease`` (the worker running a leased attempt stopped renewing it: it died)."""
    timeouts = body.get("timeouts") or {}
    if not any(timeouts.values()):
        return "lease"
    if (
        timeouts.get("schedule_to_close")
        and now_ms >= body["scheduled"] + timeouts["schedule_to_close"] * 1000
    ):
        return "schedule_to_close"
    if (
        timeouts.get("start_to_close")
        and started_ms is not None
        and now_ms >= started_ms + timeouts["start_to_close"] * 1000
    ):
        return "start_to_close"
    return "heartbeat" if timeouts.get("heartbeat") else "start_to_close"


def fail_attempt(
    store: RedisStore,
    body: dict[str, Any],
    exc: BaseException,
    *,
    stream: str,
    entry_id: str,
    started: float,
    on_timer: Callable[[int], None] = lambda _due: None,
) -> str:
    """Record a failed attempt: schedule the retry, or fail the activity for good."""
    aid, attempt = body["aid"], int(body["attempt"])
    policy = RetryPolicy.from_dict(body.get("retry"))
    names = _type_names(exc)
    timeouts = body.get("timeouts") or {}
    delay = policy.delay(attempt)
    final_reason = ""
    if isinstance(exc, NonRetryableError | SerializationError):
        final_reason = "non-retryable error"
    elif isinstance(exc, ActivityTimeout) and exc.kind == "schedule_to_close":
        final_reason = "schedule_to_close_timeout passed"
    elif names & set(policy.non_retryable_errors):
        final_reason = "error type listed in non_retryable_errors"
    elif policy.max_attempts and attempt >= policy.max_attempts:
        final_reason = f"max_attempts={policy.max_attempts} reached"
    elif (
        timeouts.get("schedule_to_close")
        and time.time() + delay > body["scheduled"] / 1000 + timeouts["schedule_to_close"]
    ):
        final_reason = "schedule_to_close_timeout would pass before the next attempt"
    record = {
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
        "duration_ms": int((time.time() - started) * 1000),
    }
    if final_reason:
        record["final"] = final_reason
        error = (
            exc
            if not final_reason.startswith("schedule_to_close")
            else ActivityTimeout(
                f"activity {body['name']} ({aid}) exceeded schedule_to_close_timeout; last error: {exc}",
                kind="schedule_to_close",
            )
        )
        store.complete_activity(**attempt_failed(body, error, record, stream=stream, entry_id=entry_id))
        return "failed"
    next_body = dict(body, attempt=attempt + 1)
    record["retry_in_s"] = delay
    outcome, due = store.complete_activity(
        **attempt_outcome(
            body,
            "retry",
            record,
            stream=stream,
            entry_id=entry_id,
            retry_delay_ms=int(delay * 1000),
            next_body=codec.pack(next_body),
        )
    )
    if outcome == "RETRY":
        on_timer(due)
    return "retry"
