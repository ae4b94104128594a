"""The schedule pass: claim due times, apply the overlap policy, start the runs.

Every worker's scheduler runs :meth:`SchedulePass.tick` on each of its passes, and
``ScheduleHandle.trigger``/``backfill`` run :meth:`SchedulePass.process` at once. Exactly
once, however many schedulers run:

1. a scheduler takes the schedule's short lock (``SET NX PX``) so one of them works on it
   at a time (a stopped holder's lock expires and another takes over);
2. ``schedule_claim.lua`` moves the due times into the schedule's claimed set and its next
   time forward, compare-and-set on the next time: a time is claimed once;
3. each claimed time is started with a deterministic workflow id and run id
   (``<schedule id>-<UTC ISO time>``): a start retried after a crash between claim and
   settle, or raced by a stale lock holder, lands on the same run (``start_run.lua`` is
   idempotent for the same run id) and cannot start a second one;
4. ``schedule_settle.lua`` records the outcome (started, skipped, buffered) if the lock is
   still ours.
"""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any

from .client import WorkflowStub
from .errors import DurableError, WorkflowAlreadyStarted, WorkflowClosed, WorkflowNotFound
from .ids import successor_run_id
from .quiet import Quiet
from .registry import start_patches, start_queue
from .schedule_spec import Schedule, ScheduleOverlap, iso, scheduled_workflow_id
from .store.connect import is_transient
from .store.key_types import is_wrong_type
from .store.records import OPEN_STATUSES
from .store.redis_store import RedisStore
from .store.schedules import ScheduleState, claim_member, parse_claim_member

log = logging.getLogger("durable.schedules")

CLAIM_BATCH = 100
"""Most scheduled times one pass claims for one schedule (a long catch-up continues next pass)."""

LOCK_MS = 30_000
"""How long a scheduler's lock on a schedule lasts if it stops without releasing it."""


class LockLost(DurableError):
    """Another scheduler took over the schedule (this one's lock expired): stop working on it."""


def action(what: str, now_ms: int, **fields: Any) -> dict[str, Any]:
    """A recent-action entry (JSON): what happened, when (ms), and its details."""
    return {"action": what, "ts": now_ms, **{k: v for k, v in fields.items() if v is not None}}


RETRY_MS = 5_000
"""How long a schedule whose pass failed waits before the next try (the others wait as long)."""


class SchedulePass:
    """Claims and starts the due times of every schedule (see the module docstring).

    Args:
        store: The store.
        lock_ms: Lifetime of a scheduler's lock on one schedule.
        limit: Most due schedules one tick takes per partition.
    """

    def __init__(self, store: RedisStore, *, lock_ms: int = LOCK_MS, limit: int = 500) -> None:
        self.store = store
        self.lock_ms = lock_ms
        self.limit = limit
        #: Runs started by this pass (tests, benchmarks).
        self.started = 0
        self._base = (0, 0.0)
        self._said = Quiet()  # the schedules' failures said

    def clock(self) -> int:
        """Redis server time (ms) as of the last :meth:`tick`, advanced by the local monotonic
        clock since (a time per start without a round trip each)."""
        ms, mono = self._base
        return ms + int((time.monotonic() - mono) * 1000)

    def tick(self) -> int | None:
        """Work on every schedule with a time due or a start waiting; returns the soonest next
        time (ms) of the others (``None``: no active schedule)."""
        now = self.store.server_time_ms()
        self._base = (now, time.monotonic())
        ids, soonest = self.store.schedule_work(now, self.limit)
        # Several schedulers walk the due schedules in different orders: they share the work
        # instead of queueing behind each other's locks.
        random.shuffle(ids)
        failed = False
        for schedule_id in ids:
            try:
                self.process(schedule_id, self.clock())
            except LockLost:
                log.warning("schedule %s: another scheduler took over (lock expired)", schedule_id)
            except Exception as exc:  # noqa: BLE001 - one bad schedule must not stop the others
                if is_transient(exc):
                    raise  # Redis unavailable or refusing writes: the caller says so once, not per schedule
                failed = True
                self._failed(schedule_id, exc)
        # A schedule that fails is still due: tried again after a pause, not at once (a pass a
        # millisecond, a traceback each: 95,000 lines a minute for a key of the wrong kind).
        return soonest if not failed or soonest is None else max(soonest, now + RETRY_MS)

    def _failed(self, schedule_id: str, exc: Exception) -> None:
        """Say a failed pass of ``schedule_id``: with its traceback the first time, then the same
        error once a minute; and note it on the schedule, for ``describe`` (a schedule stalled on
        a failing start said "active", and no reason)."""
        if is_wrong_type(exc):
            exc = self.store.wrong_type_error(exc)  # which key: Redis's error names none
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        try:
            self.store.schedule_failing(schedule_id, f"{self.clock()}|{type(exc).__name__}: {line}")
        except Exception as unnoted:  # noqa: BLE001 - the record itself may be the key at fault
            log.debug("schedule %s: its failure not noted: %s", schedule_id, unnoted)
        said = (schedule_id, line)
        first = self._said.first(said)
        if not self._said.due(said):
            return
        log.error(
            "schedule %s: pass failed; retrying in %d s: %s: %s",
            schedule_id,
            RETRY_MS // 1000,
            type(exc).__name__,
            exc,
            exc_info=first and exc.__traceback__ is not None,
        )

    def process(self, schedule_id: str, now_ms: int | None = None) -> bool:
        """Claim the schedule's due times and settle its waiting starts (``False``: another
        scheduler holds it; it will)."""
        token = os.urandom(12).hex()
        if not self.store.schedule_lock(schedule_id, token, self.lock_ms):
            return False
        try:
            state = self.store.schedule_state(schedule_id)
            if state is None:
                return True
            if now_ms is None:
                self._base = (self.store.server_time_ms(), time.monotonic())
            now = self.clock()
            spec = Schedule.from_json(state.record["spec"])
            state.claimed += self._claim_due(schedule_id, spec, state, token, now)
            _Settle(self, schedule_id, spec, state, token, now).run()
            if state.record.get("failing"):
                self.store.schedule_failing(schedule_id, "")  # it passes again
        finally:
            self.store.schedule_unlock(schedule_id, token)
        return True

    def _claim_due(
        self, schedule_id: str, spec: Schedule, state: ScheduleState, token: str, now: int
    ) -> list[tuple[str, int]]:
        record = state.record
        if record.get("paused") == "1" or not record.get("next"):
            return []
        first = int(record["next"])
        if first > now:
            return []
        fired = int(record.get("fired") or 0)
        window_start = now - int(float(spec.catchup_window) * 1000)  # type: ignore[arg-type]
        missed = None
        t: int | None = first
        if first < window_start:
            # Times older than the catch-up window are recorded as missed, not started.
            t = spec.next_after(window_start - 1)
            missed = action(
                "missed", now, first=iso(first), until=iso(window_start), reason="catch-up window"
            )
        times: list[int] = []
        while t is not None and t <= now and len(times) < CLAIM_BATCH:
            if spec.max_runs is not None and fired + len(times) >= spec.max_runs:
                t = None
                break
            times.append(t)
            t = spec.next_after(t)
        if t is not None and spec.max_runs is not None and fired + len(times) >= spec.max_runs:
            t = None
        overlap = str(spec.overlap)
        items = [
            (ms + spec.jitter_ms(schedule_id, ms), claim_member(ms, "scheduled", overlap)) for ms in times
        ]
        reply = self.store.schedule_claim(
            schedule_id,
            token=token,
            expected=first,
            next_ms=t,
            last_ms=times[-1] if times else int(record.get("last") or 0) or None,
            count=len(times),
            items=[(due, member) for due, member in items],
            action=missed,
        )
        if reply == "LOST":
            raise LockLost(schedule_id)
        return [(member, due) for due, member in items] if reply == "OK" else []

    def start_run(self, schedule_id: str, spec: Schedule, args: bytes, scheduled_ms: int, kind: str) -> str:
        """Start the run of one scheduled time (idempotent: deterministic ids); its workflow id."""
        workflow_id = scheduled_workflow_id(schedule_id, scheduled_ms)
        run_id = successor_run_id(workflow_id, scheduled_ms)  # derived, so a retry is the same run
        queue = start_queue(spec.workflow, spec.queue)
        try:
            self.store.start(
                workflow_type=spec.workflow,
                workflow_id=workflow_id,
                run_id=run_id,
                args=args,
                queue=queue,
                patches=start_patches(spec.workflow, queue, self.store),
                options={"schedule_id": schedule_id, "scheduled_at": scheduled_ms, "schedule_kind": kind},
            )
        except WorkflowAlreadyStarted:
            try:
                current = self.store.ref(workflow_id).run_id
            except WorkflowNotFound:
                current = run_id  # closed and purged meanwhile: nothing to tell apart
            if current != run_id:  # another's run (started by hand under this id): not ours
                raise _IdTaken(
                    f"workflow id {workflow_id} is taken by run {current}, not started by this schedule: "
                    "this time is not started"
                ) from None
            return workflow_id  # our own start, sent again after a crash or a lost reply
        self.store.mark_scheduled_run(workflow_id, run_id, schedule_id, scheduled_ms)
        self.started += 1
        return workflow_id


class _IdTaken(DurableError):
    """A scheduled time's workflow id has an open run the schedule did not start."""


MAX_BUFFERED = 1000
"""Times a ``buffer_all`` schedule holds while its run is open (as Temporal's default): past it
a time is skipped, recorded as ``buffer full``, instead of a backlog that grows for ever."""

_BUFFER_KEEPS = {
    ScheduleOverlap.BUFFER_ONE: 1,
    ScheduleOverlap.BUFFER_ALL: MAX_BUFFERED,
    ScheduleOverlap.CANCEL_OTHER: 1,
}
"""How many buffered times each policy holds (the others hold none)."""


class _Settle:
    """Settles one schedule's waiting starts under its lock: buffered first, then claimed times
    whose start is due, each by its overlap policy."""

    def __init__(
        self,
        owner: SchedulePass,
        schedule_id: str,
        spec: Schedule,
        state: ScheduleState,
        token: str,
        now: int,
    ) -> None:
        self.owner = owner
        self.store = owner.store
        self.id = schedule_id
        self.spec = spec
        self.state = state
        self.token = token
        self.now = now
        self.open: list[str] = []
        self.buffer = list(state.buffer)

    def _now(self) -> int:
        return self.owner.clock()

    def _settle(self, op: str, **kw: Any) -> str:
        reply = self.store.schedule_settle(self.id, token=self.token, op=op, **kw)
        if reply == "LOST":
            raise LockLost(self.id)
        return reply

    def run(self) -> None:
        self._prune_runs()
        policy = ScheduleOverlap.parse(self.spec.overlap)
        self._fit_buffer(policy)
        # Paused, buffered times wait for the unpause; a trigger or a backfill (claimed while
        # paused, by an operator) still starts, as Temporal's do.
        while self.buffer and not self.spec.paused and (not self.open or policy == ScheduleOverlap.ALLOW_ALL):
            member = self.buffer.pop(0)
            self._start(member, "start_buffered")
        ready = sorted((due, member) for member, due in self.state.claimed if due <= self.now)
        for due, member in ready:
            self._claimed(member, due)

    def _fit_buffer(self, policy: ScheduleOverlap) -> None:
        """Drop the buffered scheduled times the schedule's overlap policy no longer keeps
        (updated from buffer_all to skip, say, they would go on starting one by one), each
        recorded. A trigger's or a backfill's time keeps the policy it was given (``trigger
        --overlap buffer_one`` on a ``skip`` schedule starts once the open run closes)."""
        if policy == ScheduleOverlap.ALLOW_ALL:
            return  # all of them start now
        kept: list[str] = []
        held: dict[ScheduleOverlap, int] = {}
        for member in self.buffer:
            ms, kind, own = parse_claim_member(member)
            applies = policy if kind == "scheduled" else ScheduleOverlap.parse(own)
            if held.get(applies, 0) < _BUFFER_KEEPS.get(applies, 0):
                held[applies] = held.get(applies, 0) + 1
                kept.append(member)
                continue
            why = f"overlap is {policy} now: this buffered time is dropped"
            entry = action("skipped", self._now(), reason=why, scheduled_at=iso(ms), kind=kind)
            self._settle("drop_buffered", member=member, action=entry)
        self.buffer = kept

    def _prune_runs(self) -> None:
        ids = [wid for wid, _ in self.state.runs]
        for wid, status in zip(ids, self.store.instance_statuses(ids), strict=True):
            if status in OPEN_STATUSES:
                self.open.append(wid)
            else:
                self._settle("forget", workflow_id=wid)

    def _start(self, member: str, op: str) -> str:
        ms, kind, _ = parse_claim_member(member)
        try:
            wid = self.owner.start_run(self.id, self.spec, self.state.record.get("args") or b"", ms, kind)
        except _IdTaken as taken:  # recorded as skipped, not as a start that did not happen
            entry = action("skipped", self._now(), reason=str(taken), scheduled_at=iso(ms), kind=kind)
            self._settle("skip" if op == "start_claimed" else "drop_buffered", member=member, action=entry)
            return ""
        now = self._now()
        due = ms + (self.spec.jitter_ms(self.id, ms) if kind == "scheduled" else 0)
        entry = action(
            "started", now, scheduled_at=iso(ms), kind=kind, workflow_id=wid, late_ms=max(0, now - due)
        )
        self._settle(op, member=member, workflow_id=wid, scheduled_ms=ms, action=entry)
        self.open.append(wid)
        return wid

    def _claimed(self, member: str, due: int) -> None:
        ms, kind, overlap = parse_claim_member(member)
        wid = scheduled_workflow_id(self.id, ms)
        policy = ScheduleOverlap.parse(overlap)
        if self.store.instance_statuses([wid])[0] is not None or not self.open or policy == "allow_all":
            # Already started (a retry after a crash) is settled as started by the same call.
            self._start(member, "start_claimed")
            return
        entry = {"scheduled_at": iso(ms), "kind": kind, "running": list(self.open)}
        full = policy in _BUFFER_KEEPS and len(self.buffer) >= _BUFFER_KEEPS[policy]
        if policy == ScheduleOverlap.SKIP or (full and policy != ScheduleOverlap.CANCEL_OTHER):
            reason = f"buffer full ({len(self.buffer)} waiting)" if full else "a run is open"
            self._settle("skip", member=member, action=action("skipped", self._now(), reason=reason, **entry))
        elif policy in (ScheduleOverlap.BUFFER_ONE, ScheduleOverlap.BUFFER_ALL):
            self._settle("buffer", member=member, action=action("buffered", self._now(), **entry))
            self.buffer.append(member)
        elif policy == ScheduleOverlap.CANCEL_OTHER:
            self._close_open(cancel=True)
            replaced = len(self.buffer)
            self._settle(
                "replace_buffer",
                member=member,
                action=action(
                    "buffered", self._now(), reason="cancelling the open run", replaced=replaced, **entry
                ),
            )
            self.buffer = [member]
        else:  # terminate_other
            self._close_open(cancel=False)
            self._start(member, "start_claimed")

    def _close_open(self, *, cancel: bool) -> None:
        reason = f"schedule {self.id}: overlap policy {'cancel_other' if cancel else 'terminate_other'}"
        for wid in list(self.open):
            stub: WorkflowStub[Any] = WorkflowStub(self.store, "", wid)
            try:
                if cancel:
                    stub.cancel(reason)
                else:
                    stub.terminate(reason)
                    self.open.remove(wid)
            except (WorkflowClosed, WorkflowNotFound):
                if wid in self.open:
                    self.open.remove(wid)
