"""What a client can know about one run besides its status word: whether it is blocked
(and why), and how it ended. :meth:`WorkflowStub.describe` returns a :class:`RunDescription`."""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import codec, hooktokens
from . import events as ev
from .blocked import (  # noqa: F401 - their first home: still imported from here
    BLOCKED_KINDS,
    DATA_LOST,
    NO_LIVE_WORKER,
    BlockedReason,
    blocked_reason,
    blocked_text,
    classify_block,
)
from .errors import ApplicationError, DurableError, WorkflowFailed, error_text
from .store.records import HEARTBEAT_S, OPEN_STATUSES, REGISTRY_TTL_MS

if TYPE_CHECKING:
    from .store.activities import AttemptBegun


@dataclass(frozen=True)
class RunOutcome:
    """How a closed run ended.

    Attributes:
        status: ``completed``, ``failed``, ``cancelled``, ``terminated`` or ``continued``.
        closed: When it closed (UTC ms).
        result: The return value (``completed`` only).
        error_type: The failure's type name (``failed``), or the closing event's name
            (``WorkflowCancelled``, ``WorkflowTerminated``); ``None`` when it completed.
        error_message: The failure's message, or the cancel/terminate reason.
        continued_as: The next run's id (``continued`` only).
        error_traceback: The failure's traceback, as recorded (``failed`` only; ``None`` when
            none was recorded; not in :meth:`to_dict`: a run description has ``raised_at``).
    """

    status: str
    closed: int | None
    result: Any = None
    error_type: str | None = None
    error_message: str | None = None
    continued_as: str | None = None
    error_traceback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] | None = None
        if self.error_type is not None:
            error = {"type": self.error_type, "message": self.error_message or ""}
        out: dict[str, Any] = {
            "status": self.status,
            "closed": self.closed,
            "result": self.result,
            "error": error,
        }
        if self.continued_as:
            out["continued_as"] = self.continued_as
        return out

    def reason(self, most: int = 200) -> str:
        """Why it ended, in one line of at most ``most`` characters: the failure
        (``TypeError: ...``), the cancel or terminate reason, the next run; ``""`` when it
        completed."""
        if self.continued_as:
            return f"as run {self.continued_as}"
        if self.error_type is None:
            return ""
        message = (self.error_message or "").strip().split("\n", 1)[0]
        said = message if self.status in ("cancelled", "terminated") else f"{self.error_type}: {message}"
        return said if len(said) <= most else said[: most - 1] + "…"


def _decoded(payload: bytes) -> Any:
    try:
        return codec.view(payload)
    except DurableError as exc:
        return f"<undecodable payload: {exc}>"


def outcome_of(closing: ev.Entry, closed: int | None) -> RunOutcome:
    """The outcome recorded by a run's closing event."""
    event = closing.event
    status = ev.STATUS_OF_CLOSING[closing.type]
    when = closed if closed is not None else closing.ts
    if isinstance(event, ev.WorkflowCompleted):
        return RunOutcome(status, when, result=_decoded(event.result))
    if isinstance(event, ev.WorkflowFailedEvent):
        cause = _decoded(event.error)
        if isinstance(cause, ApplicationError) and cause.type_name:
            type_name = cause.type_name
        elif isinstance(cause, BaseException):
            type_name = type(cause).__name__
        else:
            type_name = "Undecodable"
        trace = getattr(cause, "__durable_traceback__", None) or getattr(cause, "remote_traceback", None)
        return RunOutcome(
            status, when, error_type=type_name, error_message=str(cause), error_traceback=trace or None
        )
    if isinstance(event, ev.WorkflowContinuedAsNew):
        return RunOutcome(status, when, continued_as=event.new_run_id)
    return RunOutcome(status, when, error_type=closing.type, error_message=getattr(event, "reason", ""))


def last_frame(traceback_text: str) -> str:
    """``file:line in function`` of a formatted traceback's innermost frame of the user's code
    (``""``: none): a durable call's error (``ActivityFailed``) is raised inside durable, and the
    line to look at is the workflow's call. All frames durable's: its innermost one."""
    found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', traceback_text)
    # The user's own code: not durable's, nor a library's (json.loads raising pointed at
    # decoder.py:353 in raw_decode, not at the line calling it).
    own = (
        [f for f in found if not _durable_file(f[0]) and not _library_file(f[0])]
        or [f for f in found if not _durable_file(f[0])]
        or found
    )
    return f"{own[-1][0]}:{own[-1][1]} in {own[-1][2]}" if own else ""


def _library_file(path: str) -> bool:
    """Whether ``path`` is the standard library's or an installed package's (by its path: the
    traceback may come from another machine), or Python's own (``<frozen ...>``)."""
    parts = path.replace("\\", "/")
    return (
        "/site-packages/" in parts
        or "/dist-packages/" in parts
        or bool(_STDLIB.search(parts))
        or path.startswith("<")
    )


_STDLIB = re.compile(r"/lib/python3\.\d+/")


def _durable_file(path: str) -> bool:
    """Whether ``path`` is a module of this package (by its path below a ``durable`` folder: the
    traceback may come from a worker where the package is installed elsewhere)."""
    parts = path.replace("\\", "/").split("/")
    return any(
        parts[i] == "durable" and "/".join(parts[i + 1 :]) in _PACKAGE_FILES for i in range(len(parts) - 1)
    )


_PACKAGE_FILES = frozenset(
    str(f.relative_to(Path(__file__).parent)).replace("\\", "/") for f in Path(__file__).parent.rglob("*.py")
)


def failure_text(event: ev.WorkflowFailedEvent) -> tuple[str, bool]:
    """A run's failure in words for a log line, with where it was raised; and whether it is a
    bug of the code (not an error of a durable call such as ``ActivityFailed``)."""
    cause = _decoded(event.error)
    if not isinstance(cause, BaseException):
        return str(cause), False
    where = last_frame(getattr(cause, "__durable_traceback__", None) or "")
    bug = not isinstance(cause, DurableError) or (
        isinstance(cause, ApplicationError) and bool(cause.type_name)
    )
    return error_text(cause) + (f" ({where})" if where else ""), bug


def closing_error(entry: ev.Entry, workflow_id: str) -> WorkflowFailed:
    """What ``result()`` raises for a run that closed other than completed (``entry`` closed it)."""
    status = ev.STATUS_OF_CLOSING[entry.type]
    cause = None
    if isinstance(entry.event, ev.WorkflowFailedEvent):
        cause = codec.loads(entry.event.error)
        message = f"workflow {workflow_id!r} failed: {error_text(cause)}"
    else:
        reason = getattr(entry.event, "reason", "")
        message = f"workflow {workflow_id!r} was {status}" + (f": {reason}" if reason else "")
    return WorkflowFailed(message, status=status, cause=cause if isinstance(cause, BaseException) else None)


def with_attempts(
    pending: list[dict[str, Any]],
    begun: Mapping[str, AttemptBegun],
    live: Mapping[str, int],
    now_ms: int | None = None,
    starved: Mapping[str, str] | None = None,
    stopping: Collection[str] = (),
    busy: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``pending`` (a run's pending steps) with, on each activity step ``begun`` has, its current
    ``attempt``, when it ``started`` and on which ``worker`` (``None``: not begun yet), whether
    that worker is among the ``live`` ones (``worker_alive``; ``live`` maps each to its last
    heartbeat, Redis time in ms), and all that in words (``state``, what ``durable describe``
    and the UI show).

    With ``now_ms`` the step also gets ``heartbeat_age_s``, and a worker silent for more than
    two heartbeats is said to be so: it may have died, and is taken for gone only once its
    registry entry lapses (:data:`~durable.store.records.REGISTRY_TTL_MS`).

    ``starved``: per queue whose live workers have no usable activity thread (all held by hung
    activities: :func:`durable.store.held.starved_queues`), why; a step not begun on such a queue
    gets it as ``starved``, and its ``state`` says it. ``stopping``: the live workers that are
    stopping (an attempt running on one is finished there first). ``busy``: likewise per queue
    whose live workers run an attempt on every thread (:func:`durable.store.held.busy_queues`),
    set as ``busy`` on a step queued there."""
    out = []
    for step in pending:
        b = begun.get(str(step.get("id"))) if step.get("kind") == "activity" else None
        if b is not None:
            alive = (b.worker in live) if b.worker else None
            seen = live.get(b.worker) if alive else None
            age = max(0.0, (now_ms - seen) / 1000) if seen and now_ms else None
            step = {
                **step,
                "attempt": b.attempt,
                "started": b.started_ms or None,
                "worker": b.worker or None,
                "worker_alive": alive,
                "heartbeat_age_s": age,
                "backlog": b.backlog,
                "state": _attempt_state(b, alive, step.get("queue") or "?", age, b.worker in stopping),
            }
            queued = not b.worker and not b.leased and b.retry_due_ms is None
            why = (starved or {}).get(str(step.get("queue"))) if not b.worker else None
            if why:
                step.update(starved=why, state=f"{step['state']}: {why}")
            elif queued and (waits := (busy or {}).get(str(step.get("queue")))):
                step.update(busy=waits, state=f"{step['state']}: {waits}")
        out.append(step)
    return out


def with_children(
    pending: list[dict[str, Any]],
    statuses: Mapping[str, str | None],
    blocked: BlockedReason | None = None,
    parent_closed: bool = False,
) -> list[dict[str, Any]]:
    """``pending`` with, on each child step, the status of its child's current run
    (``child_status``, from ``statuses`` by workflow id; ``None``: not started yet) and the
    child's workflow id and status in words (``state``, what ``durable describe`` shows).
    ``blocked``: the parent's reason; when it names a child (:attr:`BlockedReason.child`), that
    child's ``state`` also says why it is blocked. ``parent_closed``: the steps are what a closed
    run waited on as it closed (no outcome reaches it any more)."""
    out = []
    for step in pending:
        child_id = step.get("workflow_id") if step.get("kind") == "child" else None
        if child_id:
            status = statuses.get(str(child_id))
            state = _child_state(str(child_id), status, parent_closed)
            if step.get("cancel_asked") and status in OPEN_STATUSES:
                state += " (asked to cancel: this run's cancel waits for it to close)"
            if blocked is not None and blocked.child == str(child_id) and blocked.kind == DATA_LOST:
                state = f"child {child_id}: no run of it exists{blocked.child_message}"
            elif blocked is not None and blocked.child == str(child_id):
                state += ", blocked: " + blocked.child_message
            step = {**step, "child_status": status, "state": state}
        out.append(step)
    return out


def _child_state(child_id: str, status: str | None, parent_closed: bool = False) -> str:
    if status is None:
        # The parent's decision queued the child's start; another partition's outbox delivers it.
        return f"child {child_id}: not started yet (its start is on its way)"
    if status in OPEN_STATUSES or parent_closed:  # a closed parent takes no outcome any more
        return f"child {child_id}: {status}"
    return f"child {child_id}: {status} (its outcome reaches this run with its next decision)"


def _attempt_state(
    b: AttemptBegun, alive: bool | None, queue: str, heartbeat_age_s: float | None, stopping: bool = False
) -> str:
    if not b.worker:
        return _not_begun(b, queue)
    if alive:
        since = utc_text(b.started_ms)
        state = f"attempt {b.attempt}: running on {b.worker} since {since} UTC"
        if stopping:
            state += " (that worker is stopping: it finishes this attempt first, up to its --grace)"
        if heartbeat_age_s is not None and heartbeat_age_s > 2 * HEARTBEAT_S:
            state += (
                f", but that worker's last heartbeat was {heartbeat_age_s:.0f} s ago (one comes every "
                f"{HEARTBEAT_S:.0f} s): it may have died or be stalled; it is taken for gone "
                f"{REGISTRY_TTL_MS // 1000} s after its last heartbeat"
            )
        return state
    return (
        f"attempt {b.attempt}: began on {b.worker}, which is gone (stopped or died); another worker "
        "takes the task over: the next free one if that worker handed it back as it stopped, else "
        "after --claim-idle or the activity's timeout"
    )


def _not_begun(b: AttemptBegun, queue: str) -> str:
    """An attempt no worker has started, in words: a retry waits for its time, or its task waits
    in its queue's backlog (workers take only tasks they can start now: ``workers/pace.py``)."""
    if b.retry_due_ms is not None:
        due = utc_text(b.retry_due_ms)
        return f"attempt {b.attempt}: not begun: waiting for its retry time ({due} UTC), then queued on {queue!r}"
    if b.leased:
        return f"attempt {b.attempt}: not begun: leased to a worker (eager mode or a local activity), waiting for one of its threads"
    backlog = "" if b.backlog is None else f" (backlog {b.backlog})"
    return f"attempt {b.attempt}: not begun: queued on {queue!r}, waiting for a worker{backlog}"


def _next_attempt(step: Mapping[str, Any], failed: Mapping[str, Any], now_ms: int) -> str:
    """``, next attempt in 4 s`` for an activity ``step`` waiting for the backoff after its
    ``failed`` attempt (``""`` when not known, or when the next attempt has begun already)."""
    record = failed.get("record") or {}
    delay, ts = record.get("retry_in_s"), failed.get("ts")
    if step.get("worker") or delay is None or ts is None or failed.get("outcome") != "retry":
        return ""
    if int(failed.get("attempt") or 0) != int(step.get("attempt") or 0) - 1:
        return ""  # the failure logged is not the one before the pending attempt
    # As the completion script sets the retry timer: its log entry's time plus the delay in ms.
    due = int(ts) + int(float(delay) * 1000)
    wait_s = (due - now_ms) / 1000
    if wait_s <= 0:
        # Past due: the attempt waits in its queue for a worker (or for the scheduler to fire it).
        return ", next attempt due now" if wait_s > -1 else f", next attempt due {span(-wait_s)} ago"
    at = utc_text(due)
    return f", next attempt in {span(wait_s)}" + (f" (at {at} UTC)" if wait_s >= 60 else "")


LAST_DATE_MS = 253_402_300_799_999
"""The last UTC millisecond of the year 9999, the last a date is written for: a retry or timer
set for ages can be due later (``after 9999-12-31``)."""


def past_dates(ms: float) -> bool:
    """Whether ``ms`` (UTC) comes after the last date :func:`utc_text` writes."""
    return ms > LAST_DATE_MS


def utc_text(ms: float) -> str:
    """UTC milliseconds as ``2026-12-03 18:05:29`` (a time past the year 9999, as a retry or timer
    set for ages can be: ``after 9999-12-31``)."""
    if past_dates(ms):
        return "after 9999-12-31"
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError, OSError):  # before the year 1, NaN: no date to write
        return f"{ms} ms"


def from_now(at_ms: float, now_ms: float) -> str:
    """How far ``at_ms`` is from ``now_ms`` (UTC ms), in words: ``in 5 min``, ``12 s ago``."""
    seconds = (at_ms - now_ms) / 1000
    return f"in {span(seconds)}" if seconds >= 0 else f"{span(-seconds)} ago"


def span(seconds: float) -> str:
    """``seconds`` in words short enough for a status line: ``0.4 s``, ``12 s``, ``5 min``, ``2.5 h``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class RunDescription(Mapping[str, Any]):
    """One run as :meth:`WorkflowStub.describe` sees it.

    It also reads as the mapping :meth:`to_dict` returns (``info["attempts"]``,
    ``info.get("pending")``), as ``describe()`` did when it returned a dict.

    Attributes:
        workflow_id: The workflow id.
        run_id: The run described (the workflow id's current run).
        type: The workflow type name.
        status: The status word (see :meth:`WorkflowStub.status`).
        blocked: Why the run cannot make progress, or ``None``.
        outcome: How it ended, or ``None`` while open.
        created: When the run started (UTC ms).
        closed: When it closed (UTC ms), or ``None``.
        seq: Its history length.
        build_id: The build it is pinned to, or ``None``.
        pending: Its pending steps and waits (``kind``, ``id``, ``name``, ``deadline``...); an
            activity's also its ``queue``, current ``attempt``, when it ``started`` and on which
            ``worker`` (``None``: not begun yet), whether that worker is alive (``worker_alive``)
            and how long ago it last sent a heartbeat (``heartbeat_age_s``), the tasks waiting in
            its queue when it has not begun (``backlog``), and that in words (``state``); a
            child's also its ``workflow_id``, the status of its current run (``child_status``;
            ``None``: not started yet) and both in words (``state``).
        history: ``{"events", "bytes", "budget", "near_limit"}``.
        attempts: Activity attempts with their outcomes and errors.
        dropped: Inputs read but not applied: ``reason``, ``ts``, and what was dropped --
            ``input`` (``signal``, ``update``, ``cancel``... the kind), ``name`` (the signal's or
            update's), ``id`` (an update's) and ``preview`` (its payload, short; sealed under a
            payload hook), see :mod:`durable.dropped`.
        extra: Other snapshot fields (``signals_buffered``, ``cancel_requested``...).
        workflow_task: Where the open run's pending workflow task is, in words: waiting on its
            queue (with the backlog), or delivered to a worker that has not decided it yet
            (``None``: none is pending, or the run is blocked or closed).
        purge_at: When the closed run is purged by retention (UTC ms; ``None``: open, or
            closed before retention existed).
    """

    workflow_id: str
    run_id: str
    type: str | None
    status: str
    blocked: BlockedReason | None
    outcome: RunOutcome | None
    created: int | None
    closed: int | None
    seq: int | None
    build_id: str | None
    pending: list[dict[str, Any]] = field(default_factory=list)
    history: dict[str, Any] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    workflow_task: str | None = None
    purge_at: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready but for payload values): ``blocked`` is the reason's message
        and ``blocked_kind`` its kind; ``outcome`` is :meth:`RunOutcome.to_dict` or ``None``;
        ``raised_at`` (a failed run's, when recorded) is where its error was raised."""
        out = dict(self.extra)
        if self.outcome is not None and self.outcome.error_traceback:
            out["raised_at"] = last_frame(self.outcome.error_traceback)
        out.update(
            workflow_id=self.workflow_id,
            run_id=self.run_id,
            type=self.type,
            status=self.status,
            seq=self.seq,
            created=self.created,
            closed=self.closed,
            blocked=self.blocked.message if self.blocked else None,
            blocked_kind=self.blocked.kind if self.blocked else None,
            build_id=self.build_id,
            outcome=self.outcome.to_dict() if self.outcome else None,
            pending=self.pending,
            history=self.history,
            attempts=self.attempts,
            dropped=self.dropped,
            workflow_task=self.workflow_task,
            purge_at=self.purge_at,
        )
        return out

    def retrying(self, now_ms: int | None = None) -> list[str]:
        """A line per pending activity past its first attempt, with its last error (what
        ``durable status`` adds to the status word: an activity failing on every attempt), and
        when its next attempt is due while it waits for its backoff (``next attempt in 4 s``).

        Args:
            now_ms: The time to count the wait from (UTC ms; default: this host's clock).
        """
        last: dict[str, dict[str, Any]] = {}
        for entry in self.attempts:
            if entry.get("outcome") in ("retry", "failed"):
                last[str(entry.get("act"))] = entry
        now = int(time.time() * 1000) if now_ms is None else now_ms
        lines = []
        for step in self.pending:
            failed = last.get(str(step.get("id")))
            if step.get("kind") == "activity" and int(step.get("attempt") or 1) > 1 and failed:
                error = (failed.get("record") or {}).get("error") or "?"
                lines.append(
                    f"activity {step.get('name')} ({step.get('id')}) retrying: attempt {step.get('attempt')}"
                    f"{_next_attempt(step, failed, now)}, last error {error}"
                )
        return lines

    def running(self) -> list[str]:
        """A line per pending activity whose first attempt a worker has begun: on which worker,
        since when, and whether that worker still looks alive (what ``durable status`` adds to
        the status word: what the run is doing). Later attempts are :meth:`retrying`'s."""
        return [
            f"activity {step.get('name')} ({step.get('id')}) {step.get('state')}"
            for step in self.pending
            if step.get("kind") == "activity" and step.get("worker") and int(step.get("attempt") or 0) == 1
        ]

    def queued(self) -> list[str]:
        """A line per pending activity whose first attempt no worker has started, with its queue's
        backlog (what ``durable status`` adds to the status word: the run waits for a worker)."""
        lines = []
        for step in self.pending:
            if (
                step.get("kind") == "activity"
                and int(step.get("attempt") or 0) == 1
                and not step.get("worker")
            ):
                backlog = step.get("backlog")
                # No worker has a usable thread, or none a free one; else none took it yet.
                why = step.get("starved") or step.get("busy") or "waiting for a worker"
                lines.append(
                    f"activity {step.get('name')} ({step.get('id')}) queued on {step.get('queue')!r}: {why}"
                    + ("" if backlog is None else f" (backlog {backlog})")
                )
        return lines

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass(frozen=True)
class HistoryEvent:
    """One event of a run's history, as ``WorkflowStub.history()`` returns it.

    Attributes:
        seq: Position in the run's history, from 1, contiguous.
        type: Event name, e.g. ``ActivityScheduled``.
        ts: UTC milliseconds.
        data: The event's fields, payloads decoded; command events carry
            their command id as ``data["id"]``.
    """

    seq: int
    type: str
    ts: int
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """``seq``, ``type``, ``ts`` and ``data`` as decoded (a UUID, a tuple...), not JSON-ready:
        ``durable history --json`` prints them made so (``$bytes``, ISO times, strings)."""
        return {"seq": self.seq, "type": self.type, "ts": self.ts, "data": self.data}

    @classmethod
    def from_entry(cls, entry: ev.Entry) -> HistoryEvent:
        """The public view of a stored history entry: payloads decoded for display
        (:func:`durable.codec.view`: a dataclass whose class is not loaded here shows as
        ``{"__type__": ..., <its fields>}``), an undecodable one shown as a
        ``<undecodable payload: ...>`` string instead of failing the whole read."""
        data = entry.event.to_data()
        for name in entry.event.payloads:
            value = data.get(name)
            if value is not None:
                try:
                    data[name] = codec.view(value)
                except DurableError as exc:
                    data[name] = f"<undecodable payload: {exc}>"
        if isinstance(entry.event, ev.HookCreated):
            data["token"] = hooktokens.mask(data.get("token"))  # never printed, even as a digest in full
        return cls(seq=entry.seq, type=entry.type, ts=entry.ts, data=data)
