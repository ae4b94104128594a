"""Schedules from Python: :class:`ScheduleHandle` creates, describes and drives one schedule.

Example:
    ```python
    from durable import Schedule, ScheduleHandle

    handle = ScheduleHandle.create(
        "nightly-report",
        Schedule(workflow="Report", args=("eu",), cron="0 2 * * *", timezone="Europe/Berlin"),
    )
    print(handle.describe().next_times)
    handle.trigger()          # one run now
    handle.pause("maintenance")
    ```

Every worker's scheduler fires the due times (see :mod:`durable.schedule_pass`); the runs
started get the workflow id ``<schedule id>-<UTC ISO time>`` and carry the schedule id and
the scheduled time (``WorkflowStarted`` options, and the run record's ``schedule_id`` and
``scheduled_at`` fields).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any

from . import codec
from .client import default_store
from .errors import ConfigurationError, DurableError
from .schedule_pass import SchedulePass, action
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
from .store.schedules import ScheduleState, claim_member

__all__ = [
    "Schedule",
    "ScheduleDescription",
    "ScheduleExists",
    "ScheduleHandle",
    "ScheduleNotFound",
    "ScheduleOverlap",
]

MAX_BACKFILL = 10_000
"""Most scheduled times one backfill may start (split a longer range)."""


class ScheduleNotFound(DurableError):
    """No schedule with that id."""


class ScheduleExists(DurableError):
    """A schedule with that id exists already (update or delete it)."""


@dataclass
class ScheduleDescription:
    """What ``describe`` shows about a schedule.

    Attributes:
        id: The schedule id.
        spec: Its :class:`Schedule`.
        paused: Whether it is paused; ``note`` says why (when given).
        next_times: The next 5 scheduled times (UTC ISO; none while paused or ended).
        recent_actions: Newest first: started (with ``workflow_id``, ``scheduled_at``,
            ``late_ms``), skipped, buffered, missed, paused, unpaused, updated, ...
        running: The open runs it started: ``workflow_id``, ``scheduled_at``, ``status``.
        buffered: Scheduled times waiting for the overlap policy.
        fired: Scheduled times claimed so far (what ``max_runs`` counts).
        started: Runs started (scheduled, triggered, backfilled).
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

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly fields (what ``durable schedule describe --json`` prints)."""
        return {
            "id": self.id,
            "spec": self.spec.to_dict(),
            "paused": self.paused,
            "note": self.note,
            "next_times": self.next_times,
            "recent_actions": self.recent_actions,
            "running": self.running,
            "buffered": self.buffered,
            "fired": self.fired,
            "started": self.started,
            "created": self.created,
            "updated": self.updated,
        }


def _spec_of(state: ScheduleState) -> Schedule:
    args = state.record.get("args") or b""
    return Schedule.from_json(state.record["spec"], tuple(codec.loads(args)) if args else ())


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
        args = codec.dumps(tuple(spec.args), path="args")
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
        if reply == "EXISTS":
            raise ScheduleExists(
                f"schedule {schedule_id!r} already exists; update it (`durable schedule update`) or delete it first"
            )
        return handle

    @staticmethod
    def list(*, store: RedisStore | None = None) -> list[ScheduleDescription]:
        """Every schedule, described, by id."""
        store = store or default_store()
        out = []
        for schedule_id in store.schedule_ids():
            try:
                out.append(ScheduleHandle(schedule_id, store=store).describe(runs=False))
            except ScheduleNotFound:
                continue  # deleted meanwhile
        return out

    # --------------------------------------------------------------- reads
    def _state(self) -> ScheduleState:
        state = self._store.schedule_state(self._id)
        if state is None:
            raise ScheduleNotFound(f"no schedule with id {self._id!r} (`durable schedule list` shows them)")
        return state

    @property
    def spec(self) -> Schedule:
        """The schedule's current spec."""
        return _spec_of(self._state())

    def describe(self, *, runs: bool = True) -> ScheduleDescription:
        """The spec, state, next 5 times, recent actions and the open runs it started.

        Args:
            runs: Read the status of the runs it started (``False``: list them unread).
        """
        state = self._state()
        spec = _spec_of(state)
        record = state.record
        paused = record.get("paused") == "1"
        nxt = record.get("next")
        upcoming: list[int] = []
        if nxt and not paused:
            upcoming = [int(nxt), *spec.upcoming(int(nxt), 4)]
            if spec.max_runs is not None:
                upcoming = upcoming[: max(0, spec.max_runs - int(record.get("fired") or 0))]
        ids = [wid for wid, _ in state.runs]
        statuses = self._store.instance_statuses(ids) if runs else ["?"] * len(ids)
        running = [
            {"workflow_id": wid, "scheduled_at": iso(ms), "status": status}
            for (wid, ms), status in zip(state.runs, statuses, strict=True)
            if status is not None
            and status not in ("completed", "failed", "cancelled", "terminated", "continued")
        ]
        return ScheduleDescription(
            id=self._id,
            spec=spec,
            paused=paused,
            note=record.get("note", ""),
            next_times=[t for t in (iso(ms) for ms in upcoming) if t],
            recent_actions=[{**a, "at": iso(a.get("ts"))} for a in state.actions],
            running=running,
            buffered=[iso(int(m.split("|", 1)[0])) or "" for m in state.buffer],
            fired=int(record.get("fired") or 0),
            started=int(record.get("started") or 0),
            created=int(record["created"]) if record.get("created") else None,
            updated=int(record["updated"]) if record.get("updated") else None,
        )

    # ------------------------------------------------------------- actions
    def _save(
        self, state: ScheduleState, spec: Schedule, args: bytes, *, paused: bool, note: str | None, what: str
    ) -> None:
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
            paused=paused,
            note=note,
            action=action(what, now, note=note or None),
        )
        if reply == "MISSING":
            raise ScheduleNotFound(f"no schedule with id {self._id!r} (deleted meanwhile)")

    def pause(self, note: str = "") -> None:
        """Stop firing until :meth:`unpause` (times passing meanwhile are not made up)."""
        state = self._state()
        self._save(
            state,
            _spec_of(state),
            state.record.get("args") or b"",
            paused=True,
            note=note or "paused",
            what="paused",
        )

    def unpause(self, note: str = "") -> None:
        """Fire again from the next scheduled time after now."""
        state = self._state()
        self._save(
            state,
            _spec_of(state),
            state.record.get("args") or b"",
            paused=False,
            note=note or "unpaused",
            what="unpaused",
        )

    def update(self, **changes: Any) -> Schedule:
        """Change fields of the spec (``cron=``, ``every=``, ``args=``, ``overlap=``, ...); the new
        spec is validated first: on bad input nothing is written. Returns the new spec."""
        state = self._state()
        paused = changes.pop("paused", None)
        spec = _spec_of(state).with_changes(**changes)
        args = codec.dumps(tuple(spec.args), path="args")
        is_paused = state.record.get("paused") == "1" if paused is None else bool(paused)
        self._save(state, spec, args, paused=is_paused, note=None, what="updated")
        return spec

    def trigger(self, *, overlap: ScheduleOverlap | str | None = None) -> str:
        """Start a run now (outside the schedule; the overlap policy applies). Returns its
        workflow id (``<schedule id>-<now>``)."""
        state = self._state()
        spec = _spec_of(state)
        policy = str(ScheduleOverlap.parse(overlap or spec.overlap))
        now = self._store.server_time_ms()
        self._claim(
            [(now, claim_member(now, "trigger", policy))], action("triggered", now, scheduled_at=iso(now))
        )
        SchedulePass(self._store).process(self._id)
        return scheduled_workflow_id(self._id, now)

    def backfill(
        self, start: Any, end: Any, *, overlap: ScheduleOverlap | str | None = None
    ) -> builtins.list[str]:
        """Start the runs of the scheduled times between ``start`` and ``end`` (inclusive; datetimes,
        ISO strings or epoch seconds), as if the schedule had run then. The overlap policy (the
        schedule's, or ``overlap``) applies between them: use ``allow_all`` or ``buffer_all`` to
        start every one. Returns their scheduled times (UTC ISO).

        Raises:
            ConfigurationError: bad times, end before start, or more than
                :data:`MAX_BACKFILL` times.
        """
        start_ms, end_ms = parse_moment(start, "backfill start"), parse_moment(end, "backfill end")
        if end_ms < start_ms:
            raise ConfigurationError(f"backfill end ({iso(end_ms)}) is before its start ({iso(start_ms)})")
        state = self._state()
        spec = _spec_of(state)
        policy = str(ScheduleOverlap.parse(overlap or spec.overlap))
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
        now = self._store.server_time_ms()
        items = [(now, claim_member(ms, "backfill", policy)) for ms in times]
        self._claim(items, action("backfilled", now, first=iso(start_ms), last=iso(end_ms), times=len(times)))
        SchedulePass(self._store).process(self._id)
        return [iso(ms) or "" for ms in times]

    def _claim(self, items: builtins.list[tuple[int, str]], entry: dict[str, Any]) -> None:
        reply = self._store.schedule_claim(
            self._id, token="", expected=None, next_ms=None, last_ms=None, count=0, items=items, action=entry
        )
        if reply == "MISSING":
            raise ScheduleNotFound(f"no schedule with id {self._id!r}")

    def delete(self) -> None:
        """Delete the schedule (the runs it started go on).

        Raises:
            ScheduleNotFound: no such schedule.
        """
        if not self._store.schedule_delete(self._id):
            raise ScheduleNotFound(f"no schedule with id {self._id!r}")
