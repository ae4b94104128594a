"""What the client's reads of one run build from the store: its snapshot (the projection
``WorkflowStub.snapshot`` returns) and its :class:`~durable.runinfo.RunDescription`
(``WorkflowStub.describe``, ``durable describe``)."""

from __future__ import annotations

from typing import Any

from . import events as ev
from .dropped import dropped_inputs
from .history_budget import history_info
from .registry import get_workflow
from .runinfo import BlockedReason, RunDescription, RunOutcome, outcome_of, with_attempts, with_children
from .store.held import busy_queues, starved_queues
from .store.redis_store import CLOSED_STATUSES, OPEN_STATUSES, RedisStore, RunRef
from .store.search import stored_attributes, stored_memo
from .store.timer_index import OVERDUE_MS, unarmed
from .store.workers import WorkerInfo, stalled_decision, takes_new_runs


def run_snapshot(store: RedisStore, workflow_id: str, ref: RunRef) -> dict[str, Any]:
    """The run's projection, with its blocked reason and, once closed, its outcome."""
    record = store.run_record(ref)
    snap = dict(record.get("snapshot") or {})
    blocked = store.why_blocked(record)
    outcome = run_outcome(store, ref, record)
    snap.update(
        workflow_id=workflow_id,
        run_id=ref.run_id,
        type=record.get("type"),
        status=record.get("status"),
        seq=record.get("seq"),
        created=record.get("created"),
        closed=record.get("closed"),
        blocked=blocked.message if blocked else None,
        blocked_kind=blocked.kind if blocked else None,
        outcome=outcome.to_dict() if outcome else None,
        build_id=record.get("build") or None,
        search_attributes=stored_attributes(record.get("sa")),
        memo=stored_memo(record.get("memo")),
    )
    snap.setdefault("pending", [])
    return snap


def run_outcome(store: RedisStore, ref: RunRef, record: dict[str, Any]) -> RunOutcome | None:
    """How a closed run ended, from its closing entry (``None``: open, or no closing entry)."""
    if record.get("status") not in CLOSED_STATUSES:
        return None
    closing = store.last_entry(ref)
    if closing is None or not isinstance(closing.event, ev.CLOSING):
        return None
    return outcome_of(closing, record.get("closed"))


def _pending_with_attempts(
    store: RedisStore,
    ref: RunRef,
    pending: list[dict[str, Any]],
    live: list[WorkerInfo],
    why: BlockedReason | None,
    log: list[dict[str, Any]],
    closed: bool = False,
) -> list[dict[str, Any]]:
    begun = store.pending_attempts(ref.partition, ref.run_id, pending)  # with their backlogs
    now_ms = store.server_time_ms() if begun and live else None
    kids = [str(s["workflow_id"]) for s in pending if s.get("kind") == "child" and s.get("workflow_id")]
    statuses = dict(zip(kids, store.instance_statuses(kids), strict=True))
    seen = {w.name: w.seen for w in live}
    stopping = {w.name for w in live if w.stopping}
    steps = with_attempts(pending, begun, seen, now_ms, starved_queues(live), stopping, busy_queues(live))
    # A result recorded but not yet decided on (its worker stopped, say) has no attempt running:
    # the log's last record of the activity says it completed.
    last = {str(e.get("act")): e for e in log if e.get("kind") == "attempt"}
    stalls = {w.name: w.async_stall for w in live if w.async_stall}
    for step in steps:
        if step.get("worker_alive") and (stall := stalls.get(str(step.get("worker")))):
            # Only the worker's log said it: "running" for 20 s, for an activity of 50 ms.
            step["state"] += (
                f" (that worker's event loop of async activities has not run for {stall}: an async def "
                "activity there waits until it does)"
            )
        done = last.get(str(step.get("id"))) if step.get("kind") == "activity" else None
        if done is not None and "state" not in step and done.get("outcome") == "completed":
            step["state"] = (
                f"attempt {done.get('attempt')} completed; its result waits for the run's next decision"
            )
        elif _parked_for_its_type(step, why):
            # Its task is a dead letter: "queued, waiting for a worker" would never come true.
            step["state"] = f"not begun: its task is parked ({why.kind}, the run's blocked reason says why)"  # type: ignore[union-attr]
    return with_children(steps, statuses, why, parent_closed=closed)


def _parked_for_its_type(step: dict[str, Any], why: BlockedReason | None) -> bool:
    """Whether ``step`` is an activity whose type no worker defines, its task parked for it."""
    return (
        why is not None
        and why.kind == "unknown_type"
        and step.get("kind") == "activity"
        and f"activity type {step.get('name')!r}" in why.message
    )


def describe_run(store: RedisStore, workflow_id: str, ref: RunRef) -> RunDescription:
    """Everything known about one run (see :meth:`durable.WorkflowStub.describe`)."""
    record = store.run_record(ref)
    # One registry read serves the blocked reason and the pending attempts' workers.
    live = store.live_workers() if record.get("status", "pending") in OPEN_STATUSES else []
    snap = dict(record.get("snapshot") or {})
    snap.update(type=record.get("type"), seq=record.get("seq"))
    history = history_info(snap, get_workflow)
    log = store.log_entries(ref)
    outcome, blocked = run_outcome(store, ref, record), store.why_blocked(record, live)
    for name in ("status", "type", "seq", "pending", "blocked", "blocked_kind", "outcome", "build_id"):
        snap.pop(name, None)
    snap.update(
        search_attributes=stored_attributes(record.get("sa")),
        memo=stored_memo(record.get("memo")),
        queue=record.get("queue"),
        schedule_id=record.get("schedule_id") or None,
    )
    if record.get("status", "pending") in OPEN_STATUSES:
        _add_undecided(snap, store.undecided_inputs(ref))
    described = RunDescription(
        workflow_id=workflow_id,
        run_id=ref.run_id,
        type=record.get("type"),
        status=str(record.get("status", "pending")),
        blocked=blocked,
        outcome=outcome,
        created=record.get("created"),
        closed=record.get("closed"),
        seq=record.get("seq"),
        build_id=record.get("build") or None,
        pending=_pending_with_attempts(
            store,
            ref,
            (record.get("snapshot") or {}).get("pending") or [],
            live,
            blocked,
            log,
            closed=record.get("status", "pending") not in OPEN_STATUSES,
        ),
        history=history,
        attempts=[e for e in log if e.get("kind") == "attempt"],
        dropped=dropped_inputs(log),
        extra=snap,
        workflow_task=task_in_words(store, ref, record, live) if blocked is None else None,
        purge_at=_purge_at(store, ref) if record.get("closed") else None,
    )
    _mark_unarmed(store, ref, described)
    return described


def _mark_unarmed(store: RedisStore, ref: RunRef, described: RunDescription) -> None:
    """Mark (``"unarmed"``) the overdue deadlines of an open run with no task pending that its
    partition's timers index lacks: no scheduler will fire them (the views say so, not "no live
    worker's scheduler has fired it"). Redis is read only for a run waiting on a deadline."""
    if described.status not in OPEN_STATUSES or described.blocked or described.workflow_task:
        return
    if all(step.get("deadline") is None for step in described.pending):
        return
    now_ms = store.server_time_ms()
    overdue = [
        step for step in described.pending if now_ms - int(step.get("deadline") or now_ms) > OVERDUE_MS
    ]
    missing = unarmed(store, ref, overdue) if overdue else set()
    for step in overdue:
        if str(step.get("id")) in missing:
            step["unarmed"] = True


def _purge_at(store: RedisStore, ref: RunRef) -> int | None:
    """When retention purges the closed run ``ref`` (its score in the partition's closed index)."""
    score = store.redis.zscore(store.keys.closed(ref.partition), ref.run_id)
    return int(score) if score is not None else None


def _add_undecided(snap: dict[str, Any], inputs: list[ev.Event]) -> None:
    """Say the inputs no decision has taken yet: a run never decided (no worker yet) or blocked
    has a snapshot that does not know them. ``signals_undecided`` counts its signals by name
    (``signals_buffered``: those the code received and awaits none for); ``updates_undecided``
    lists its updates (``{"name", "id"}``: a caller may be waiting on one); a cancel request
    counts in ``cancel_requested``."""
    undecided: dict[str, int] = {}
    for event in inputs:
        if isinstance(event, ev.SignalReceived):
            undecided[event.name] = undecided.get(event.name, 0) + 1
    snap["signals_undecided"] = undecided
    snap["updates_undecided"] = [
        {"name": e.name, "id": e.id} for e in inputs if isinstance(e, ev.UpdateRequested)
    ]
    snap.setdefault("signals_buffered", {})
    snap["cancel_requested"] = bool(snap.get("cancel_requested")) or any(
        isinstance(e, ev.CancelRequested) for e in inputs
    )


def _handed_back(
    store: RedisStore, ref: RunRef, record: dict[str, Any], live: list[WorkerInfo], first: int, grace_ms: int
) -> str:
    """A workflow task a worker that cannot decide it handed back (workers.routing), in words:
    it said "not in its stream: deleted by hand?" while it waited for the right worker."""
    queue, name = str(record.get("queue") or "default"), str(record.get("type") or "?")
    started = next(iter(store.history(ref, count=1)), None)
    recorded = (
        started.event.patches if started is not None and isinstance(started.event, ev.WorkflowStarted) else []
    )
    build = str(record.get("build") or "")
    if build:  # as the workers route it: a pinned run's build, else the workers of new runs
        deciders, which = [w for w in live if queue in w.queues and build in w.builds], f" of build {build!r}"
    else:
        current = store.current_build([queue])[0]
        deciders = takes_new_runs(queue, current, live)
        which = f" of build {current!r} (it takes the queue's new runs)" if current else ""
    typed = [w for w in deciders if name in w.workflows]
    if not typed:
        lacks = f"no live worker of queue {queue!r}{which} defines workflow type {name!r}"
    elif recorded and not any(set(recorded) <= set(w.patches.get(name, ())) for w in typed):
        lacks = (
            f"no live worker of queue {queue!r}{which} declares the patches {list(recorded)!r} the run recorded "
            "(the code that started it is newer than the workers')"
        )
    else:
        lacks = "a worker could not decide it (the workers' WARNING says why: a newer release of durable decided it?)"
    if not first:
        return "its workflow task was handed back by a worker that cannot decide it, to one that can"
    waited = max(0, store.server_time_ms() - first) // 1000
    return (
        f"{lacks}, for {waited} s: its workflow task waits for a worker that can decide it, then is parked and "
        f"the run blocked after {grace_ms // 1000} s (--unknown-type-grace); deploy such a worker"
    )


def task_in_words(
    store: RedisStore, ref: RunRef, record: dict[str, Any], live: list[WorkerInfo]
) -> str | None:
    """Where an open run's pending workflow task is, in words (``None``: none is pending): the
    run moves when a worker decides it, so a run that waits on nothing else says what that
    waits for. (A blocked run's reason says more.)"""
    if record.get("status", "pending") not in OPEN_STATUSES:
        return None
    where = store.workflow_task_where(ref, record)
    if where is not None and not where.consumer and not where.backlog:
        # Read again: a worker may have taken it between the pipeline's reads.
        where = store.workflow_task_where(ref, store.run_record(ref))
        if where is not None and not where.consumer and not where.backlog and not where.wrong_kind:
            handed = store.handed_back_since(ref)
            if handed is not None:
                return _handed_back(store, ref, record, live, *handed)
            return (
                f"its workflow task is not in its stream {where.stream} (the record says one is pending, "
                "the stream holds none: deleted or trimmed by hand?): `durable repair "
                f"{ref.workflow_id}` queues it again"
            )
    if where is None:
        return None
    if where.wrong_kind:  # set aside by the workers: nothing else says why the run waits
        return (
            f"its workflow task cannot be read: its task stream {where.stream} is a {where.wrong_kind}, not a "
            "stream (made by hand, or by another program sharing the database): rename it aside or delete "
            "it, and durable makes it anew; then `durable repair` the run"
        )
    live_names = {w.name for w in live}
    stalled = {w.name: w for w in live if w.deciding_run}
    if where.owner:
        said = (
            f"its workflow task waits on the private queue of worker {where.owner}, which decided the "
            f"run last (backlog {where.backlog})"
        )
        if where.owner not in live_names:
            said += (
                "; that worker is gone (stopped or died): the task goes back to the run's queue "
                f"after --sticky-timeout ({_flag_value(live, 'sticky_timeout_ms', 5_000)})"
            )
        elif where.owner in stalled:
            said += "; " + stalled_decision(stalled[where.owner])
        return said
    if not where.consumer:
        queue = where.stream.rpartition(":wq:")[2]
        said = f"its workflow task waits on queue {queue!r} for a worker (backlog {where.backlog})"
        serving = [w.name for w in live if queue in w.queues]
        if serving and all(name in stalled for name in serving):
            said += "; " + "; ".join(stalled_decision(stalled[name]) for name in serving)
        return said
    again = (
        f" (its delivery {where.deliveries}: earlier ones were not decided either)"
        if where.deliveries > 1
        else ""
    )
    said = (
        f"its workflow task was delivered to worker {where.consumer} {where.idle_ms / 1000:.0f} s ago"
        f"{again} and is not decided yet"
    )
    if where.consumer not in live_names:
        said += (
            "; that worker is gone (stopped or died): another takes the task over after --claim-idle "
            f"({_flag_value(live, 'claim_idle_ms', 30_000)})"
        )
    elif where.consumer in stalled:
        said += "; " + stalled_decision(stalled[where.consumer])
        if stalled[where.consumer].deciding_run == ref.run_id:
            said += (
                ". Fix the code and restart the worker with a --decision-timeout (the run is then "
                f"blocked for `durable repair`), or `durable terminate {ref.workflow_id}`"
            )
    return said


def _flag_value(live: list[WorkerInfo], name: str, default_ms: int) -> str:
    """A worker flag's value (``claim_idle_ms``, ``sticky_timeout_ms``) as the live workers said
    it in their registry entries, in words: the first of them to act takes the task on, so the
    least of their values counts (0, a sticky sweep turned off, counts for none)."""
    current = [w for w in live if w.claim_idle_ms]  # entries of releases that say their flags
    if not current:
        return f"{default_ms / 1000:g} s by default"
    said = sorted({getattr(w, name) for w in current} - {0})
    if not said:
        return "off on every live worker: the task moves once that worker's lease lapses, after --claim-idle"
    if len(said) == 1:
        return f"{said[0] / 1000:g} s on the live workers"
    return f"{said[0] / 1000:g}-{said[-1] / 1000:g} s on the live workers: the least counts"
