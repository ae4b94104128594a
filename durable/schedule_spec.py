"""What a schedule is: :class:`Schedule` (the spec), its overlap policy, and its times.

A leaf of the schedules feature: no store, no client. The spec is validated
when it is built, so bad input fails before anything is written; the times
(cron in a time zone, or a fixed interval) are computed here, by every
scheduler alike, so they agree on which scheduled time is due.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import ConfigurationError
from .ids import check_workflow_id
from .limits import check_queue_name
from .registry import check_name
from .retention import parse_duration

__all__ = [
    "MAX_INTERVAL_S",
    "MIN_INTERVAL_S",
    "Schedule",
    "ScheduleOverlap",
    "check_schedule_id",
    "parse_moment",
    "scheduled_workflow_id",
]

_CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
_CRONSIM_FIELDS = {"minute": 0, "hour": 1, "day-of-month": 2, "month": 3, "day-of-week": 4}
_SCHEDULE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}$")
_DEFAULT_CATCHUP_S = 60.0

MIN_INTERVAL_S = 1.0
"""Shortest ``every`` interval (seconds). Each scheduled time is a claim, a start and a settle
in Redis plus a run: a sub-second interval floods the schedulers and the workers (at 1 ms one
schedule asked for ~1,000 runs a second), and scheduled workflow ids are unique per ms only."""

MIN_CATCHUP_S = 1.0
"""The shortest ``catchup_window`` (seconds)."""

MAX_INTERVAL_S = 100 * 366 * 86_400.0
"""Longest ``every`` interval (seconds): 100 years."""

FIRST_MS = int(datetime(1, 1, 2, tzinfo=UTC).timestamp() * 1000)
LAST_MS = int(datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC).timestamp() * 1000)
"""The range of times a schedule may name: a datetime (and a workflow id's ISO time) holds no
other. A schedule's times end at the last one (it has ended then)."""


class ScheduleOverlap(enum.StrEnum):
    """What a schedule does when a time comes while a run it started is still open.

    The policies of Temporal and Laravel Workflow v2:

    * ``skip`` -- drop the new time (the default);
    * ``buffer_one`` -- start it when the open run closes; further times meanwhile are dropped;
    * ``buffer_all`` -- start every time, one after the other, each when the previous closed;
    * ``allow_all`` -- start it at once, whatever is running;
    * ``cancel_other`` -- request cancellation of the open run, start the new one once it closed;
    * ``terminate_other`` -- terminate the open run and start the new one at once.
    """

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    BUFFER_ALL = "buffer_all"
    ALLOW_ALL = "allow_all"
    CANCEL_OTHER = "cancel_other"
    TERMINATE_OTHER = "terminate_other"

    @classmethod
    def parse(cls, value: ScheduleOverlap | str) -> ScheduleOverlap:
        """The policy named ``value``.

        Raises:
            ConfigurationError: an unknown policy (the message lists the valid ones).
        """
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(p.value for p in cls)
            raise ConfigurationError(f"unknown overlap policy {value!r}: use one of {valid}") from None


def check_schedule_id(schedule_id: object) -> str:
    """Validate a schedule id: 1-200 characters from letters, digits, ``_ . : -``.

    Raises:
        ConfigurationError: naming the id and the rule.
    """
    if not isinstance(schedule_id, str) or not _SCHEDULE_ID.match(schedule_id):
        raise ConfigurationError(
            f"invalid schedule id {schedule_id!r}: use 1-200 characters from letters, digits, _ . : -, "
            "not starting with . : or -"
        )
    return schedule_id


def parse_moment(value: datetime | str | float | int, what: str) -> int:
    """Epoch ms of a moment: a timezone-aware datetime, an ISO string (no zone: UTC) or epoch seconds.

    Raises:
        ConfigurationError: none of these.
    """
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigurationError(
                f"{what} {value!r}: not a date-time (write e.g. 2024-05-01T12:00:00Z or 2024-05-01)"
            ) from None
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return _in_range(int(value * 1000), what, value)
    else:
        raise ConfigurationError(
            f"{what} must be a datetime, an ISO date-time or epoch seconds, not {value!r}"
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return _in_range(int(moment.timestamp() * 1000), what, value)


def _in_range(ms: int, what: str, value: object) -> int:
    if not FIRST_MS <= ms <= LAST_MS:
        raise ConfigurationError(
            f"{what} {value!r} is outside the times a schedule can name (0001-01-02 to 9999-12-31T23:59:59Z)"
        )
    return ms


def _iso(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{ms % 1000:03d}" if ms % 1000 else "") + "Z"


def scheduled_workflow_id(schedule_id: str, scheduled_ms: int) -> str:
    """The workflow id of the run a schedule starts for a scheduled time: ``<id>-<UTC ISO time>``.

    Deterministic, so a start retried after a crash (or raced by another scheduler) lands on the
    same workflow id and run id and cannot start twice.
    """
    return f"{schedule_id}-{_iso(scheduled_ms)}"


def _duration_s(value: Any, what: str, *, zero: bool = False) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        if zero and value.strip() in ("0", "0s"):
            return 0.0
        try:
            seconds = parse_duration(value)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{what}: {exc}") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ConfigurationError(
            f"{what} must be a duration (30s, 5m, 1h, seconds or timedelta), not {value!r}"
        )
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        raise ConfigurationError(f"{what} must be a positive duration, got {value!r}")
    return seconds


def _interval_s(value: Any) -> float:
    seconds = _duration_s(value, "every")
    if seconds < MIN_INTERVAL_S:
        raise ConfigurationError(
            f"every {value!r} is {seconds:g}s: the shortest interval is {MIN_INTERVAL_S:g}s "
            "(MIN_INTERVAL_S; shorter ones flood the scheduler); for more often, use several schedules "
            "or a workflow that loops"
        )
    if seconds > MAX_INTERVAL_S:
        raise ConfigurationError(
            f"every {value!r} is {seconds:g}s: the longest interval is 100 years (MAX_INTERVAL_S); for "
            "a single run at a time, start one with a start delay, or give the schedule an end_at"
        )
    return seconds


def _check_args(args: Any) -> tuple[Any, ...]:
    # tuple("abc") would silently make three arguments 'a', 'b', 'c'.
    if not isinstance(args, list | tuple):
        hint = f" (one argument: args=({args!r},))" if isinstance(args, str | bytes) else ""
        raise ConfigurationError(
            f"args must be a list or tuple of arguments, not {type(args).__name__} {args!r}{hint}"
        )
    return tuple(args)


def check_cron(expr: str) -> str:
    """Validate a standard five-field cron expression with cronsim.

    Raises:
        ConfigurationError: the message names the field, its text and its column (1-based).
    """
    if not isinstance(expr, str):
        raise ConfigurationError(f"cron expression must be a string, not {expr!r}")
    parts = [(m.start(), m.group()) for m in re.finditer(r"\S+", expr)]
    if len(parts) != 5:
        raise ConfigurationError(
            f"invalid cron expression {expr!r}: {len(parts)} field(s), a cron expression has 5 "
            "(minute hour day-of-month month day-of-week), e.g. '*/5 * * * *'"
        )
    try:
        CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        index = next((i for name, i in _CRONSIM_FIELDS.items() if name in str(exc)), None)
        if index is None:
            raise ConfigurationError(f"invalid cron expression {expr!r}: {exc}") from None
        column, text = parts[index]
        raise ConfigurationError(
            f"invalid cron expression {expr!r}: field {index + 1} ({_CRON_FIELDS[index]}) {text!r} "
            f"at column {column + 1} is not valid ({exc})"
        ) from None
    return expr


@functools.lru_cache(maxsize=256)
def _cron_gap_s(expr: str, timezone: str) -> float:
    """The shortest interval (seconds) between a valid cron's times in ``timezone``, over its
    first 64 times from 2001 (a jitter this long or longer would start runs out of order)."""
    times = CronSim(expr, datetime(2001, 1, 1, tzinfo=ZoneInfo(timezone)))
    shortest, last = math.inf, None
    for _ in range(64):
        try:
            moment = next(times).timestamp()
        except (StopIteration, ValueError, OverflowError):
            break
        if last is not None and moment > last:
            shortest = min(shortest, moment - last)
        last = moment
    return shortest


def check_timezone(name: str) -> str:
    """Validate an IANA time zone name (``Europe/Berlin``, ``UTC``).

    Raises:
        ConfigurationError: unknown zone.
    """
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigurationError(
            f"unknown time zone {name!r}: use an IANA name such as UTC, Europe/Berlin, America/New_York"
        ) from None
    return name


@dataclass(frozen=True)
class Schedule:
    """When and what a schedule starts. Validated when built: bad input raises
    :class:`~durable.errors.ConfigurationError` before anything is written.

    Exactly one of ``cron`` and ``every`` is given.

    Args:
        workflow: The workflow type name (or a ``Workflow`` subclass: its name).
        args: Arguments of every run it starts: a list or tuple (a lone string is refused).
        cron: A standard five-field cron expression (``*/5 * * * *``), read in ``timezone``.
        every: An interval (``30s``, ``5m``, seconds or a timedelta), at most 100 years, at least
            :data:`MIN_INTERVAL_S` (1 s); times are aligned to ``start_at`` if given, else to
            the Unix epoch (``1h`` fires on the hour).
        timezone: IANA zone the cron expression is read in; DST is handled as cron does
            (a time in the skipped hour fires once at the jump, a repeated hour fires once).
        jitter: Each start waits a random delay below this (deterministic per time).
        overlap: :class:`ScheduleOverlap` policy when a started run is still open.
        start_at: No time before this (datetime, ISO string or epoch seconds).
        end_at: No time after this.
        max_runs: Stop after this many scheduled times (triggers and backfills do not count).
        paused: Create the schedule paused (read back: whether it is paused now).
        catchup_window: Times missed while no scheduler ran still fire when they are at most
            this old when a scheduler comes back (default 60 s); older ones are recorded as missed.
        queue: Task queue of the runs (default: the workflow class's, else ``default``).
        note: Free text shown by describe (e.g. why it is paused).
    """

    workflow: str
    args: tuple[Any, ...] = ()
    cron: str | None = None
    every: float | str | timedelta | None = None
    timezone: str = "UTC"
    jitter: float | str | timedelta = 0.0
    overlap: ScheduleOverlap | str = ScheduleOverlap.SKIP
    start_at: datetime | str | float | int | None = None
    end_at: datetime | str | float | int | None = None
    max_runs: int | None = None
    paused: bool = False
    catchup_window: float | str | timedelta = _DEFAULT_CATCHUP_S
    queue: str | None = None
    note: str = ""
    _start_ms: int | None = field(default=None, init=False, repr=False, compare=False)
    _end_ms: int | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        workflow = getattr(self.workflow, "name", self.workflow)
        if isinstance(self.workflow, type) and self.queue is None:
            object.__setattr__(self, "queue", getattr(self.workflow, "queue", None))
        object.__setattr__(self, "workflow", check_name(workflow, "workflow"))
        object.__setattr__(self, "args", _check_args(self.args))
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(
                "a schedule needs exactly one of cron (e.g. '*/5 * * * *') and every (e.g. 30s)"
            )
        if self.cron is not None:
            object.__setattr__(self, "cron", " ".join(check_cron(self.cron).split()))
        else:
            object.__setattr__(self, "every", _interval_s(self.every))
        object.__setattr__(self, "timezone", check_timezone(self.timezone))
        if self.every is not None and self.timezone != "UTC":
            raise ConfigurationError(
                f"timezone {self.timezone!r} applies to cron only: an every interval is aligned to "
                "start_at or the Unix epoch in any zone; drop it, or use cron"
            )
        object.__setattr__(self, "jitter", _duration_s(self.jitter, "jitter", zero=True))
        gap = self.every if self.every is not None else _cron_gap_s(str(self.cron), self.timezone)
        if self.jitter and self.jitter >= gap:  # type: ignore[operator]
            interval = "interval" if self.every is not None else "shortest interval between the cron's times"
            raise ConfigurationError(
                f"jitter {self.jitter:g}s is not shorter than the {interval} ({gap:g}s): runs would "
                "start out of their order, or two at once; keep it below the interval"
            )
        window = _duration_s(self.catchup_window, "catchup_window", zero=True)
        if window < MIN_CATCHUP_S:
            # A scheduler fires a time a few ms (under load, some 100 ms) after it is due: with a
            # shorter window every time counts as missed, and the schedule never starts a run.
            raise ConfigurationError(
                f"catchup_window {self.catchup_window!r} is {window:g}s: the shortest is "
                f"{MIN_CATCHUP_S:g}s (a time fires a little after it is due; shorter, every time "
                "would be recorded as missed)"
            )
        object.__setattr__(self, "catchup_window", window)
        object.__setattr__(self, "overlap", ScheduleOverlap.parse(self.overlap))
        start = None if self.start_at is None else parse_moment(self.start_at, "start_at")
        end = None if self.end_at is None else parse_moment(self.end_at, "end_at")
        if start is not None and end is not None and end < start:
            raise ConfigurationError(f"end_at ({_iso(end)}) is before start_at ({_iso(start)})")
        object.__setattr__(self, "_start_ms", start)
        object.__setattr__(self, "_end_ms", end)
        if self.max_runs is not None and (
            isinstance(self.max_runs, bool) or not isinstance(self.max_runs, int) or self.max_runs < 1
        ):
            raise ConfigurationError(f"max_runs must be an int >= 1, got {self.max_runs!r}")
        if not isinstance(self.paused, bool):  # "no" would have created it paused
            raise ConfigurationError(f"paused must be True or False, got {self.paused!r}")
        if self.queue is not None:
            check_queue_name(self.queue)  # as start() and workers do: a run no worker could serve
        check_note(self.note)

    # ------------------------------------------------------------------ times
    @property
    def every_ms(self) -> int | None:
        """The interval in ms (``None``: a cron schedule)."""
        return None if self.every is None else round(float(self.every) * 1000)  # type: ignore[arg-type]

    @property
    def end_ms(self) -> int | None:
        """``end_at`` in epoch ms (``None``: no end)."""
        return self._end_ms

    def _raw_after(self, after_ms: int) -> Iterator[int]:
        """Times strictly after ``after_ms``, ignoring start/end."""
        every = self.every_ms
        if every is not None:
            anchor = self._start_ms or 0
            k = (after_ms - anchor) // every + 1
            while True:
                yield anchor + k * every
                k += 1
        assert self.cron is not None
        try:
            start = datetime.fromtimestamp(after_ms / 1000, ZoneInfo(self.timezone))
        except (ValueError, OverflowError):  # past year 9999 in that zone: no more times
            return
        moments = iter(CronSim(self.cron, start))
        while True:
            try:
                moment = next(moments)
            except (ValueError, OverflowError):  # past year 9999: no more times
                return
            yield int(moment.timestamp() * 1000)

    def times_after(self, after_ms: int) -> Iterator[int]:
        """Scheduled times (epoch ms) strictly after ``after_ms``, within start_at/end_at (and
        not past :data:`LAST_MS`), in order."""
        if self._start_ms is not None:
            after_ms = max(after_ms, self._start_ms - 1)
        end = LAST_MS if self._end_ms is None else min(self._end_ms, LAST_MS)
        if after_ms >= end:
            return
        for ms in self._raw_after(after_ms):
            if ms > end:
                return
            yield ms

    def next_after(self, after_ms: int) -> int | None:
        """The first scheduled time strictly after ``after_ms`` (``None``: the schedule has ended)."""
        return next(self.times_after(after_ms), None)

    def upcoming(self, after_ms: int, count: int = 5) -> list[int]:
        """The next ``count`` scheduled times after ``after_ms``."""
        out: list[int] = []
        for ms in self.times_after(after_ms):
            if len(out) >= count:
                break
            out.append(ms)
        return out

    def jitter_ms(self, schedule_id: str, scheduled_ms: int) -> int:
        """The start delay of one scheduled time: below ``jitter``, the same in every scheduler."""
        limit = int(float(self.jitter) * 1000)  # type: ignore[arg-type]
        if limit <= 0:
            return 0
        digest = hashlib.sha256(f"{schedule_id}|{scheduled_ms}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % limit

    # --------------------------------------------------------------- storage
    def to_json(self) -> str:
        """The spec as stored (args are stored apart, as a payload)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("args",) and f.init}
        data["overlap"] = str(self.overlap)
        data["start_at"], data["end_at"] = self._start_ms, self._end_ms
        data.pop("_start_ms", None)
        data.pop("_end_ms", None)
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, args: tuple[Any, ...] = ()) -> Schedule:
        """A spec read back from :meth:`to_json`."""
        data = json.loads(text)
        for name in ("start_at", "end_at"):
            if data.get(name) is not None:
                data[name] = data[name] / 1000
        if data.get("every") is not None and data["every"] < MIN_INTERVAL_S:
            # Stored before the minimum existed: read it (so it can be listed, paused, updated
            # or deleted) at the minimum rather than refuse it or keep flooding.
            data["every"] = MIN_INTERVAL_S
        if data.get("every") is not None and data["every"] > MAX_INTERVAL_S:
            data["every"] = MAX_INTERVAL_S  # likewise: longer, its times were past year 9999
        for name in ("start_at", "end_at"):
            if data.get(name) is not None:
                data[name] = min(max(data[name], FIRST_MS / 1000), LAST_MS / 1000)
        if data.get("catchup_window") is not None and data["catchup_window"] < MIN_CATCHUP_S:
            data["catchup_window"] = MIN_CATCHUP_S  # likewise: shorter, it never started a run
        if data.get("every") is not None:  # stored before these were checked: as they acted
            data["timezone"] = "UTC"
            if (data.get("jitter") or 0.0) >= data["every"]:
                data["jitter"] = data["every"] / 2
        elif data.get("jitter") and data.get("cron"):
            try:
                gap = _cron_gap_s(" ".join(check_cron(data["cron"]).split()), data.get("timezone") or "UTC")
            except ConfigurationError:
                gap = math.inf  # the spec's own check says what is wrong with it
            data["jitter"] = min(data["jitter"], gap / 2)
        queue = data.get("queue")
        try:
            check_queue_name(queue) if queue is not None else None
        except ConfigurationError:
            # Stored before schedules checked queue names as workers do: readable, so that it can
            # be shown (its runs say no worker serves it), updated or deleted.
            data["queue"] = None
            spec = cls(args=args, **data)
            object.__setattr__(spec, "queue", queue)
            return spec
        return cls(args=args, **data)

    def to_dict(self) -> dict[str, Any]:
        """Plain fields for describe / ``--json`` (times as ISO strings)."""
        data = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        data["overlap"] = str(self.overlap)
        data["args"] = list(self.args)
        data["start_at"] = None if self._start_ms is None else _iso(self._start_ms)
        data["end_at"] = None if self._end_ms is None else _iso(self._end_ms)
        return data

    def with_changes(self, **changes: Any) -> Schedule:
        """A copy with ``changes`` (validated again).

        Raises:
            ConfigurationError: an unknown field (the message lists the valid ones), or a bad value.
        """
        current = {
            f.name: getattr(self, f.name) for f in fields(self) if f.init and not f.name.startswith("_")
        }
        unknown = sorted(set(changes) - set(current))
        if unknown:
            raise ConfigurationError(
                f"unknown schedule field(s) {', '.join(map(repr, unknown))}: "
                f"valid ones are {', '.join(current)}"
            )
        current["start_at"] = None if self._start_ms is None else self._start_ms / 1000
        current["end_at"] = None if self._end_ms is None else self._end_ms / 1000
        if "cron" in changes and changes["cron"] is not None:
            current["every"] = None
        if "every" in changes and changes["every"] is not None:
            current["cron"] = None
            current["timezone"] = "UTC"  # the cron's zone goes with it (an interval has none)
        current.update(changes)
        return replace(self, **current)


def iso(ms: int | None) -> str | None:
    """A stored epoch-ms time as a UTC ISO string (``None`` stays ``None``; one out of a
    datetime's range, stored before times were checked, as its ms)."""
    if ms is None:
        return None
    return _iso(ms) if FIRST_MS <= ms <= LAST_MS else f"{ms} ms after 1970 (out of range)"


MAX_NOTE = 1000
"""Longest schedule note (characters): notes are kept with every recent action and listed."""


def check_note(note: object) -> str:
    """Validate a schedule note: text of at most :data:`MAX_NOTE` characters.

    Raises:
        ConfigurationError: not a string, or too long.
    """
    if not isinstance(note, str):
        raise ConfigurationError(f"a schedule note must be a string, not {type(note).__name__}")
    if len(note) > MAX_NOTE:
        raise ConfigurationError(f"a schedule note holds at most {MAX_NOTE} characters, not {len(note):,}")
    return note


def check_ids(schedule_id: str) -> str:
    """Validate ``schedule_id`` and that the workflow ids it makes are valid."""
    check_schedule_id(schedule_id)
    check_workflow_id(scheduled_workflow_id(schedule_id, 0))
    return schedule_id
