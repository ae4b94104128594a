"""Schedules from Python: :class:`ScheduleHandle` creates, describes and drives one schedule.

Example:
    ```python
    from durable import Schedule, ScheduleHandle

    handle = ScheduleHandle.create(
        "nightly-report",
        Schedule(workflow="Report", args=("eu",), cron="0 2 * * *", timezone="Europe/Berlin"),
    )
    print(handle.describe().next_times)
    handle.trigger()          # one run now (None: the overlap policy skipped it)
    handle.pause("maintenance")
    ```

Every worker's scheduler fires the due times (see :mod:`durable.schedule_pass`); the runs
started get the workflow id ``<schedule id>-<UTC ISO time>`` and carry the schedule id and
the scheduled time (``WorkflowStarted`` options, and the run record's ``schedule_id`` and
``scheduled_at`` fields).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from . import codec
from .client import default_store
from .errors import ConfigurationError, DurableError, WorkflowNotFound
from .ids import new_run_id
from .registry import check_start
from .schedule_health import Lateness, failing, held_up
from .schedule_pass import MAX_BUFFERED, SchedulePass, action
from .schedule_spec import (
    Schedule,
    ScheduleOverlap,
    check_ids,
    check_note,
    iso,
    parse_moment,
    scheduled_workflow_id,
)
from .store.redis_store import RedisStore
from .store.schedules import ScheduleState, claim_member, parse_claim_member

T = TypeVar("T")

__all__ = [
    "BackfillResult",
    "Schedule",
    "ScheduleDescription",
    "ScheduleExists",
    "ScheduleHandle",
    "ScheduleNotFound",
    "ScheduleOverlap",
]

MAX_BACKFILL = 10_000
"""Most scheduled times one backfill may start (split a longer range)."""

SETTLE_WAIT_S = 5.0
"""How long trigger/backfill wait for a worker's scheduler that holds the schedule's lock to
let go, so they can say what happened to their times (started, buffered or skipped)."""


class ScheduleNotFound(DurableError):
    """No schedule with that id."""


class ScheduleExists(DurableError):
    """A schedule with that id exists already (update or delete it)."""


@dataclass
class ScheduleDescription:
    """What ``describe`` shows about a schedule.

    Attributes:
        id: The schedule id.
        spec: Its :class:`Schedule` (its ``paused`` and ``note`` are the current ones).
        paused: Whether it is paused; ``note`` says why (when given).
        state: ``active``, ``paused``, ``done (max_runs reached)``, ``ended (end_at passed)`` or
            ``ended (no scheduled time before end_at)``: a done or ended schedule fires no more.
        next_times: The next 5 scheduled times (UTC ISO; none while paused or ended).
        recent_actions: Newest first: started (with ``workflow_id``, ``scheduled_at``,
            ``late_ms`` and the run's ``status`` now: a schedule whose runs fail says so),
            skipped, buffered, missed, paused, unpaused, updated, ...
        running: The open runs it started: ``workflow_id``, ``scheduled_at``, ``status`` and
            (read for the first :data:`RUNS_EXPLAINED`) ``blocked``: why it does not move, or
            ``None`` (every later time waits for it, or is skipped, by the overlap policy).
        buffered: Scheduled times waiting for the overlap policy.
        claimed: Scheduled times claimed whose run starts later, each ``{"scheduled_at",
            "starts_at"}``: a time waiting out the spec's ``jitter`` (or, for a moment, being
            started).
        fired: Scheduled times claimed so far (what ``max_runs`` counts).
        started: Runs started (scheduled, triggered, backfilled).
        overdue: Why an active schedule's next time passed more than :data:`~durable.schedule_health.OVERDUE_AFTER_S`
            ago without firing (no live worker runs a scheduler, Redis refuses writes, or live
            workers do and their logs say why); ``""`` when it is on time.
        held_up: Why an active schedule fires but starts nothing: its last times were skipped
            (or wait buffered) behind a run it started that is still open, named with its
            status and, blocked, why; or its scheduler's passes fail, with the last error
            (a start Redis refuses) (``""``: it is not held up). ``durable schedule list``
            shows it: such a schedule fires on time, so nothing else there says it.
    """

    id: str
    spec: Schedule
    paused: bool
    note: str
    next_times: list[str]
    recent_actions: list[dict[str, Any]]
    running: list[dict[str, Any]]
    buffered: list[str]
    fired: int
    started: int
    created: int | None = None
    updated: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    state: str = "active"
    claimed: list[dict[str, str]] = field(default_factory=list)
    overdue: str = ""
    held_up: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly fields (what ``durable schedule describe --json`` prints)."""
        return {
            "id": self.id,
            "spec": self.spec.to_dict(),
            "paused": self.paused,
            "state": self.state,
            "note": self.note,
            "next_times": self.next_times,
            "recent_actions": self.recent_actions,
            "running": self.running,
            "buffered": self.buffered,
            "claimed": self.claimed,
            "fired": self.fired,
            "started": self.started,
            "created": self.created,
            "updated": self.updated,
            "overdue": self.overdue,
            "held_up": self.held_up,
        }


class BackfillResult(builtins.list[str]):
    """What :meth:`ScheduleHandle.backfill` returns: the scheduled times it covered (UTC ISO;
    a plain list of them, as before), and what the overlap policy did with each.

    Attributes:
        started: Times whose run started.
        existing: Times whose run existed already (started by an earlier backfill or trigger,
            or by the schedule itself: the same workflow id): not started again.
        buffered: Times waiting for an open run to close; they start then.
        skipped: Times the overlap policy dropped: no run starts for them.
        pending: Times not settled yet when it returned (a scheduler that held the schedule
            settles them; ``describe`` shows the outcome).
        skip_reason: Why times were skipped (``None``: none was).
    """

    def __init__(
        self, times: builtins.list[str], outcome: dict[str, builtins.list[str]], reason: str
    ) -> None:
        super().__init__(times)
        self.started = outcome["started"]
        self.existing = outcome.get("existing", [])
        self.buffered = outcome["buffered"]
        self.skipped = outcome["skipped"]
        self.pending = outcome["pending"]
        self.skip_reason = reason if self.skipped else None

    def to_dict(self) -> dict[str, Any]:
        """As ``durable schedule backfill --json`` and the API print it: ``scheduled`` (the times)
        and each outcome's times, with ``skip_reason``."""
        return {
            "scheduled": list(self),
            "started": self.started,
            "existing": self.existing,
            "buffered": self.buffered,
            "skipped": self.skipped,
            "pending": self.pending,
            "skip_reason": self.skip_reason,
        }


def skip_reason(policy: ScheduleOverlap | str) -> str:
    """Why the overlap policy ``policy`` skips a time (what ``durable schedule`` prints)."""
    if policy == ScheduleOverlap.BUFFER_ONE:
        return "a time is buffered already (overlap buffer_one)"
    if policy == ScheduleOverlap.BUFFER_ALL:
        return f"the buffer is full ({MAX_BUFFERED} times wait; overlap buffer_all)"
    return f"a run is open (overlap {policy})"


def _spec_of(state: ScheduleState) -> Schedule:
    args = state.record.get("args") or b""
    spec = Schedule.from_json(state.record["spec"], tuple(codec.loads(args)) if args else ())
    # The record holds the current pause state and note (pause/unpause change them, not the
    # stored spec of older versions): one answer for spec.paused and describe's paused.
    return replace(spec, paused=state.record.get("paused") == "1", note=state.record.get("note", ""))


def _run_state(spec: Schedule, record: dict[str, Any], paused: bool) -> str:
    fired = int(record.get("fired") or 0)
    if spec.max_runs is not None and fired >= spec.max_runs:
        return "done (max_runs reached)"
    if not record.get("next"):
        if spec.end_ms is None:
            return "ended"
        if spec.end_ms <= time.time() * 1000:
            return "ended (end_at passed)"
        return "ended (no scheduled time before end_at)"
    return "paused" if paused else "active"


def _action(action: dict[str, Any], status_of: dict[str, str | None]) -> dict[str, Any]:
    """A recorded action with its time in ISO and, for a run it started, that run's status now
    (``None``: purged, or not read)."""
    out = {**action, "at": iso(action.get("ts"))}
    if action.get("workflow_id"):
        out["status"] = status_of.get(str(action["workflow_id"]))
    return out


RUNS_EXPLAINED = 3
"""A schedule's open runs whose blocked reason ``describe`` reads (each is a few reads)."""


class ScheduleHandle:
    """A handle on one schedule (its id), like ``WorkflowStub`` for a workflow.

    Args:
        schedule_id: The schedule id.
        store: The store (default: the process-wide one).
    """

    def __init__(self, schedule_id: str, *, store: RedisStore | None = None) -> None:
        self._id = check_ids(schedule_id)
        self._store = store or default_store()

    @property
    def id(self) -> str:
        """The schedule id."""
        return self._id

    # ------------------------------------------------------------- creation
    @classmethod
    def create(cls, schedule_id: str, spec: Schedule, *, store: RedisStore | None = None) -> ScheduleHandle:
        """Create a schedule. Everything is validated first: on bad input nothing is written.

        Raises:
            ConfigurationError: bad id or spec.
            SerializationError: an argument cannot be encoded.
            ScheduleExists: the id is taken.
        """
        if not isinstance(spec, Schedule):
            raise ConfigurationError(f"ScheduleHandle.create needs a Schedule, not {spec!r}")
        handle = cls(schedule_id, store=store)
        check_start(spec.workflow, tuple(spec.args), f"schedule {schedule_id}")
        args = codec.dumps(tuple(spec.args), path="args", allowed_only=True)

        def save(again: bool = False) -> str:
            now = handle._store.server_time_ms()
            reply = handle._store.schedule_save(
                handle._id,
                mode="create",
                spec=spec.to_json(),
                args=args,
                next_ms=spec.next_after(now),
                paused=spec.paused,
                note=spec.note,
                action=action("created", now, paused=spec.paused or None),
            )
            if reply == "EXISTS" and again:
                state = handle._store.schedule_state(handle._id)
                if state is not None and _spec_of(state).to_json() == spec.to_json():
                    return "OK"  # the first try created it; its reply was lost in the outage
            return reply

        if handle._ride("create()", save, resend=lambda: save(again=True)) == "EXISTS":
            raise ScheduleExists(
                f"schedule {schedule_id!r} already exists; update it (`durable schedule update`) or delete it first"
            )
        return handle

    @staticmethod
    def list(*, store: RedisStore | None = None) -> list[ScheduleDescription]:
        """Every schedule, described as :meth:`ScheduleHandle.describe` does, by id."""
        store = store or default_store()

        def described() -> builtins.list[ScheduleDescription]:
            out = []
            lateness = Lateness(store)  # one read of the clock, Redis's memory and the workers for all
            for schedule_id in store.schedule_ids():
                try:
                    out.append(ScheduleHandle(schedule_id, store=store)._describe(True, lateness))
                except ScheduleNotFound:
                    continue  # deleted meanwhile
            return out

        return store.ride("ScheduleHandle.list()", described)

    # --------------------------------------------------------------- reads
    def _ride(self, what: str, call: Callable[[], T], *, resend: Callable[[], T] | None = None) -> T:
        """``call()`` through a short Redis outage, as the workflow stubs' calls
        (:meth:`RedisStore.ride`); each call sent again is safe to repeat."""
        return self._store.ride(f"{what} of schedule {self._id!r}", call, resend=resend)

    def _state(self) -> ScheduleState:
        state = self._store.schedule_state(self._id)
        if state is None:
            raise ScheduleNotFound(f"no schedule with id {self._id!r} (`durable schedule list` shows them)")
        return state

    @property
    def spec(self) -> Schedule:
        """The schedule's current spec."""
        return self._ride("spec", lambda: _spec_of(self._state()))

    def describe(self, *, runs: bool = True) -> ScheduleDescription:
        """The spec, state, next 5 times, recent actions and the open runs it started.

        Args:
            runs: Read the status of the runs it started (``False``: list them unread).
        """
        return self._ride("describe()", lambda: self._describe(runs, Lateness(self._store)))

    def _describe(self, runs: bool, lateness: Lateness) -> ScheduleDescription:
        state = self._state()
        spec = _spec_of(state)
        record = state.record
        nxt = record.get("next")
        upcoming: list[int] = []
        if nxt and not spec.paused:
            upcoming = [int(nxt), *spec.upcoming(int(nxt), 4)]
            if spec.max_runs is not None:
                upcoming = upcoming[: max(0, spec.max_runs - int(record.get("fired") or 0))]
        ids = [wid for wid, _ in state.runs]
        started = [str(a["workflow_id"]) for a in state.actions if a.get("workflow_id")]
        asked = list(dict.fromkeys([*ids, *started]))
        status_of = dict(zip(asked, self._store.instance_statuses(asked), strict=True)) if runs else {}
        statuses = [status_of.get(wid, "?") for wid in ids]
        run_state = _run_state(spec, record, spec.paused)
        running = [
            {"workflow_id": wid, "scheduled_at": iso(ms), "status": status}
            for (wid, ms), status in zip(state.runs, statuses, strict=True)
            if status is not None
            and status not in ("completed", "failed", "cancelled", "terminated", "continued")
        ]
        for run in running[:RUNS_EXPLAINED] if runs else ():
            # The open run every later time waits on (or is skipped for): why it does not move.
            run["blocked"] = self._blocked(str(run["workflow_id"]))
        return ScheduleDescription(
            id=self._id,
            spec=spec,
            paused=spec.paused,
            state=run_state,
            note=spec.note,
            next_times=[t for t in (iso(ms) for ms in upcoming) if t],
            recent_actions=[_action(a, status_of) for a in state.actions],
            running=running,
            buffered=[iso(int(m.split("|", 1)[0])) or "" for m in state.buffer],
            claimed=[
                {"scheduled_at": iso(int(m.split("|", 1)[0])) or "", "starts_at": iso(due) or ""}
                for m, due in state.claimed
            ],
            fired=int(record.get("fired") or 0),
            started=int(record.get("started") or 0),
            created=int(record["created"]) if record.get("created") else None,
            updated=int(record["updated"]) if record.get("updated") else None,
            overdue=lateness.why(spec, upcoming[0]) if run_state == "active" and upcoming else "",
            held_up=failing(record.get("failing"))
            or (held_up(state.actions, running, len(state.buffer)) if run_state == "active" else ""),
        )

    def _blocked(self, workflow_id: str) -> str | None:
        try:
            reason = self._store.why_blocked(self._store.run_record(self._store.ref(workflow_id)))
        except WorkflowNotFound:
            return None  # purged meanwhile
        return reason.message if reason is not None else None

    # ------------------------------------------------------------- actions
    def _save(
        self, state: ScheduleState, spec: Schedule, args: bytes, *, note: str | None, what: str
    ) -> None:
        """Write ``spec`` (its ``paused`` is the new pause state); ``note``: the new note
        (``""`` clears it), ``None`` keeps the old one."""
        if note is not None:
            check_note(note)
        now = self._store.server_time_ms()
        last = int(state.record.get("last") or 0)
        fired = int(state.record.get("fired") or 0)
        ended = spec.max_runs is not None and fired >= spec.max_runs
        # Never a time already claimed, nor one that passed while paused.
        next_ms = None if ended else spec.next_after(max(now, last))
        reply = self._store.schedule_save(
            self._id,
            mode="update",
            spec=spec.to_json(),
            args=args,
            next_ms=next_ms,
            paused=spec.paused,
            note=note,
            action=action(what, now, note=note or None),
        )
        if reply == "MISSING":
            raise ScheduleNotFound(f"no schedule with id {self._id!r} (deleted meanwhile)")

    def _set_paused(self, paused: bool, note: str, what: str) -> None:
        state = self._state()
        spec = replace(_spec_of(state), paused=paused)
        # A pause or unpause without a note clears the old one: it said why of a former state.
        self._save(state, spec, state.record.get("args") or b"", note=note, what=what)

    def pause(self, note: str = "") -> None:
        """Stop firing until :meth:`unpause` (times passing meanwhile are not made up).
        ``note`` (why) is shown by describe until the next pause, unpause or note update."""
        self._ride("pause()", lambda: self._set_paused(True, note, "paused"))

    def unpause(self, note: str = "") -> None:
        """Fire again from the next scheduled time after now (clears the pause note, or sets ``note``)."""
        self._ride("unpause()", lambda: self._set_paused(False, note, "unpaused"))

    def update(self, **changes: Any) -> Schedule:
        """Change fields of the spec (``cron=``, ``every=``, ``args=``, ``overlap=``, ``paused=``,
        ``note=``, ...); the new spec is validated first: on bad input nothing is written, and
        when nothing changes nothing is written or recorded. Returns the new spec.

        Raises:
            ConfigurationError: an unknown field (the message lists the valid ones) or a bad value.
        """
        # Sent again after its reply was lost, the spec it wrote is current: nothing more is written.
        return self._ride("update()", lambda: self._update(changes))

    def _update(self, changes: dict[str, Any]) -> Schedule:
        state = self._state()
        current = _spec_of(state)
        if "paused" in changes:
            changes["paused"] = bool(changes["paused"])
        spec = current.with_changes(**changes)
        if spec == current:
            return current
        if (spec.workflow, spec.args) != (current.workflow, current.args):  # (pausing one stored before: not)
            check_start(spec.workflow, tuple(spec.args), f"schedule {self._id}")
        args = codec.dumps(tuple(spec.args), path="args", allowed_only=True)
        self._save(state, spec, args, note=spec.note if "note" in changes else None, what="updated")
        return spec

    def trigger(self, *, overlap: ScheduleOverlap | str | None = None) -> str | None:
        """Start a run now, outside the schedule; the overlap policy (the schedule's, or
        ``overlap``) applies, as in Temporal. Returns its workflow id, or ``None`` when the
        policy skipped it (a run is open): nothing started.

        Returns:
            The run's workflow id (``<schedule id>-<now>``) when it started, or when the policy
            buffered it (it starts under that id once the open run closes); ``None`` when the
            policy skipped it: nothing started and nothing will (``describe()`` shows the
            ``skipped`` action). ``overlap="allow_all"`` starts one whatever runs.
        """
        # The time is read once: a claim sent again (its reply lost) is the same claim.
        spec, now = self._ride("trigger()", lambda: (_spec_of(self._state()), self._store.server_time_ms()))
        policy = ScheduleOverlap.parse(overlap or spec.overlap)
        entry = action("triggered", now, scheduled_at=iso(now))
        outcome = self._ride("trigger()", lambda: self._fire([now], "trigger", policy, entry))
        return None if outcome["skipped"] else scheduled_workflow_id(self._id, now)

    def backfill(
        self, start: Any, end: Any, *, overlap: ScheduleOverlap | str | None = None
    ) -> BackfillResult:
        """Start the runs of the scheduled times between ``start`` and ``end`` (inclusive; datetimes,
        ISO strings or epoch seconds), as if the schedule had run then. The overlap policy (the
        schedule's, or ``overlap``) applies between them: use ``allow_all`` or ``buffer_all`` to
        start every one. Returns their scheduled times (UTC ISO), a :class:`BackfillResult` that
        also says which started, were buffered or were skipped (and why).

        Raises:
            ConfigurationError: bad times, end before start, or more than
                :data:`MAX_BACKFILL` times.
        """
        start_ms, end_ms = parse_moment(start, "backfill start"), parse_moment(end, "backfill end")
        if end_ms < start_ms:
            raise ConfigurationError(f"backfill end ({iso(end_ms)}) is before its start ({iso(start_ms)})")
        spec = self._ride("backfill()", lambda: _spec_of(self._state()))
        policy = ScheduleOverlap.parse(overlap or spec.overlap)
        times: list[int] = []
        for ms in spec.times_after(start_ms - 1):
            if ms > end_ms:
                break
            if len(times) >= MAX_BACKFILL:
                raise ConfigurationError(
                    f"backfill {iso(start_ms)}..{iso(end_ms)} covers more than {MAX_BACKFILL} scheduled times; "
                    "split the range"
                )
            times.append(ms)
        # A time whose run exists (an earlier backfill, or the schedule's own firing: the same
        # workflow id) is not claimed again: it would be counted as started a second time.
        ids = [scheduled_workflow_id(self._id, ms) for ms in times]
        statuses = self._ride("backfill()", lambda: self._store.instance_statuses(ids))
        existing = [ms for ms, status in zip(times, statuses, strict=True) if status is not None]
        fresh = [ms for ms, status in zip(times, statuses, strict=True) if status is None]
        now = self._ride("backfill()", self._store.server_time_ms)
        entry = action("backfilled", now, first=iso(start_ms), last=iso(end_ms), times=len(fresh))
        outcome = self._ride("backfill()", lambda: self._fire(fresh, "backfill", policy, entry))
        outcome["existing"] = existing
        named = {k: [iso(ms) or "" for ms in v] for k, v in outcome.items()}
        return BackfillResult([iso(ms) or "" for ms in times], named, skip_reason(policy))

    def _fire(
        self, times: builtins.list[int], kind: str, policy: ScheduleOverlap, entry: dict[str, Any]
    ) -> dict[str, builtins.list[int]]:
        """Claim ``times`` (start due now), settle them, and say what happened to each:
        ``started``, ``buffered``, ``skipped`` or ``pending``."""
        members = [claim_member(ms, kind, str(policy)) for ms in times]
        now = self._store.server_time_ms()
        reply = self._store.schedule_claim(
            self._id,
            token="",
            expected=None,
            next_ms=None,
            last_ms=None,
            count=0,
            items=[(now, m) for m in members],
            action=entry,
        )
        if reply == "MISSING":
            raise ScheduleNotFound(f"no schedule with id {self._id!r}")
        sched = SchedulePass(self._store)
        deadline = time.monotonic() + SETTLE_WAIT_S
        while True:
            # False: a worker's scheduler holds the schedule; it settles our times, or we do
            # once its lock is free.
            sched.process(self._id)
            state = self._state()
            claimed = {m for m, _ in state.claimed}.intersection(members)
            if not claimed or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        buffered = set(state.buffer)
        outcome: dict[str, builtins.list[int]] = {"started": [], "buffered": [], "skipped": [], "pending": []}
        settled = [parse_claim_member(m)[0] for m in members if m not in claimed and m not in buffered]
        statuses = self._store.instance_statuses([scheduled_workflow_id(self._id, ms) for ms in settled])
        # Settled, not buffered, and no run under its id: the policy dropped it.
        ran = {ms for ms, status in zip(settled, statuses, strict=True) if status is not None}
        for member in members:
            ms = parse_claim_member(member)[0]
            key = "pending" if member in claimed else "buffered" if member in buffered else None
            outcome[key or ("started" if ms in ran else "skipped")].append(ms)
        return outcome

    def delete(self) -> None:
        """Delete the schedule (the runs it started go on).

        Raises:
            ScheduleNotFound: no such schedule.
        """
        call_id = new_run_id()  # one id for every try: a resend finds the note of its delete
        delete = lambda: self._store.schedule_delete(self._id, call_id=call_id)  # noqa: E731
        if not self._ride("delete()", delete):
            raise ScheduleNotFound(f"no schedule with id {self._id!r}")
