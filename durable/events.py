"""The event catalog: one small immutable dataclass per history event type.

Each class names its stored type in ``TYPE``; the class name may change, the ``TYPE`` never
does. A class whose stored name is also a public error's name carries an ``Event`` suffix.

A history entry is one msgpack map ``{"type": str, "ts": int, "data": map}`` (``ts`` in UTC
milliseconds). ``data`` is plain msgpack (ids, names, numbers); user values inside it (arguments,
results, errors, signal payloads) are payload bytes produced by :func:`durable.codec.dumps`,
so a payload hook (encryption, compression) sees exactly the user's data and nothing else.

Two families:

* **Input events** arrive from outside a decision (activity results, fired timers, signals, child
  results, hook deliveries, cancel requests). They are stamped by the Redis script that pushes
  them onto the run's inbox and copied unchanged into the history by the next decision's commit.
* **Command events** are written by a decision: what the workflow code asked for (schedule an
  activity, start a timer, ...). On replay they are checked against what the code issues again,
  by :meth:`Event.fingerprint`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from . import codec
from . import history_format as hf
from .errors import HistoryCorrupt
from .immutable import immutable


@immutable(kw_only=True)
class Event:
    """Base of every event. Subclasses list their data fields."""

    #: Data fields compared on replay (payload fields compare by canonical bytes).
    compared: ClassVar[tuple[str, ...]] = ()
    #: Fields holding codec payload bytes.
    payloads: ClassVar[tuple[str, ...]] = ()
    #: True for events written by a decision (checked on replay).
    is_command: ClassVar[bool] = False
    #: The type name in history: never change it (tests/test_replay.py pins every one).
    TYPE: ClassVar[str] = ""

    @property
    def type(self) -> str:
        """The event's stored type name (:attr:`TYPE`)."""
        return self.TYPE

    @property
    def key(self) -> tuple[str, str]:
        """What identifies a command in its run: (event type, command id)."""
        return (self.TYPE, getattr(self, "id", ""))

    def to_data(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _field_names(type(self))}

    def fingerprint(self) -> bytes:
        """Bytes that must be identical when replay issues this command again."""
        values = []
        for name in self.compared:
            value = getattr(self, name)
            if name in self.payloads and value is not None:
                value = codec.canonical(value)
            values.append(value)
        return codec.pack([self.type, *values])

    def describe(self) -> dict[str, Any]:
        """The compared fields, payloads decoded, for error messages."""
        out: dict[str, Any] = {}
        for name in self.compared:
            value = getattr(self, name)
            if name in self.payloads and value is not None:
                try:
                    value = codec.loads(value)
                except Exception:  # noqa: BLE001 - best effort for a message
                    value = f"<{len(value)} bytes>"
            out[name] = value
        return out


# --------------------------------------------------------------------- start
@immutable(kw_only=True)
class WorkflowStarted(Event):
    TYPE = "WorkflowStarted"

    workflow_type: str
    workflow_id: str
    run_id: str
    args: bytes
    queue: str = "default"
    parent: dict[str, Any] | None = None
    build_id: str = ""
    patches: list[str] = dataclasses.field(default_factory=list)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Initial search attributes, ``{name: [type, value]}`` (see durable.search).
    search_attributes: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Initial memo: a payload of a dict, or None.
    memo: bytes | None = None
    #: Interceptor headers (``{name: str | bytes}``, see durable.interceptors): tenant, trace context...
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)
    payloads = ("args", "memo")


# ---------------------------------------------------------------- activities
@immutable(kw_only=True)
class ActivityScheduled(Event):
    TYPE = "ActivityScheduled"

    id: str
    name: str
    args: bytes
    queue: str = "default"
    retry: dict[str, Any] | None = None
    timeouts: dict[str, Any] = dataclasses.field(default_factory=dict)
    local: bool = False
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)  # recorded, never compared on replay
    compared = ("name", "args", "local")  # no options: the recorded ones govern (docs/determinism.md)
    payloads = ("args",)
    is_command = True


@immutable(kw_only=True)
class ActivityCompleted(Event):
    TYPE = "ActivityCompleted"

    id: str
    result: bytes
    attempt: int = 1
    payloads = ("result",)


@immutable(kw_only=True)
class ActivityFailedEvent(Event):
    TYPE = "ActivityFailed"

    id: str
    error: bytes
    attempts: int = 1
    payloads = ("error",)


@immutable(kw_only=True)
class ActivityCancelled(Event):
    TYPE = "ActivityCancelled"

    id: str
    reason: str = ""
    outcome_unknown: bool = False
    is_command = True


# -------------------------------------------------------------------- timers
@immutable(kw_only=True)
class TimerStarted(Event):
    TYPE = "TimerStarted"

    id: str
    fire_at: int
    compared = ("fire_at",)
    is_command = True


@immutable(kw_only=True)
class TimerFired(Event):
    TYPE = "TimerFired"

    id: str


@immutable(kw_only=True)
class TimerCancelled(Event):
    TYPE = "TimerCancelled"

    id: str
    is_command = True


# ------------------------------------------------------------------- signals
@immutable(kw_only=True)
class SignalWaitStarted(Event):
    TYPE = "SignalWaitStarted"

    id: str
    name: str
    deadline: int | None = None
    compared = ("name", "deadline")
    is_command = True


@immutable(kw_only=True)
class SignalReceived(Event):
    TYPE = "SignalReceived"

    name: str
    payload: bytes
    signal_id: str = ""
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)
    with_previous: bool = False  # applied with the signal before it: the code did not run between
    payloads = ("payload",)

    def to_data(self) -> dict[str, Any]:  # with_previous only when set: a client's signal stays as it was
        return {k: v for k, v in Event.to_data(self).items() if k != "with_previous" or v}


# ------------------------------------------------------- recorded values
@immutable(kw_only=True)
class SideEffectRecorded(Event):
    TYPE = "SideEffectRecorded"

    id: str
    value: bytes | None = None
    error: bytes | None = None
    payloads = ("value", "error")
    is_command = True


@immutable(kw_only=True)
class VersionMarker(Event):
    TYPE = "VersionMarker"

    id: str
    change_id: str
    version: int
    compared = ("change_id",)
    is_command = True


# ------------------------------------------------------------------ children
@immutable(kw_only=True)
class ChildStarted(Event):
    TYPE = "ChildStarted"

    id: str
    workflow_type: str
    workflow_id: str
    args: bytes
    queue: str = "default"
    policy: str = "terminate"
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)  # the child run's; never compared
    wait_cancel: bool = False  # a cancel waits for the child to close; not compared (False: as before)
    compared = ("workflow_type", "workflow_id", "args", "queue", "policy")
    payloads = ("args",)
    is_command = True


@immutable(kw_only=True)
class ChildCompleted(Event):
    TYPE = "ChildCompleted"

    id: str
    result: bytes
    payloads = ("result",)


@immutable(kw_only=True)
class ChildFailed(Event):
    TYPE = "ChildFailed"

    id: str
    error: bytes | None = None
    status: str = "failed"
    payloads = ("error",)


# --------------------------------------------------------------------- hooks
@immutable(kw_only=True)
class HookCreated(Event):
    TYPE = "HookCreated"

    id: str
    name: str
    token: str
    metadata: bytes
    compared = ("name", "metadata")
    payloads = ("metadata",)
    is_command = True


@immutable(kw_only=True)
class HookResumed(Event):
    TYPE = "HookResumed"

    id: str
    payload: bytes
    payloads = ("payload",)


# ------------------------------------------------------------------- updates
@immutable(kw_only=True)
class UpdateRequested(Event):
    """An update on the inbox; its decision writes UpdateAccepted or UpdateRejected instead."""

    TYPE = "UpdateRequested"

    id: str
    name: str
    args: bytes
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)  # the client's (durable.interceptors)
    payloads = ("args",)


@immutable(kw_only=True)
class UpdateAccepted(Event):
    """An update the validator accepted: replay runs its handler again from here."""

    TYPE = "UpdateAccepted"

    id: str
    name: str
    args: bytes
    headers: dict[str, Any] = dataclasses.field(default_factory=dict)  # the update's: replay hands them on
    payloads = ("args",)


@immutable(kw_only=True)
class UpdateRejectedEvent(Event):
    """An update refused before its handler ran (validator, unknown name, bad arguments); in history
    for the caller to read, replay skips it (the workflow never sees it)."""

    TYPE = "UpdateRejected"

    id: str
    name: str
    error: bytes
    payloads = ("error",)


@immutable(kw_only=True)
class UpdateCompleted(Event):
    """The handler of an accepted update returned (``result``) or raised (``error``)."""

    TYPE = "UpdateCompleted"

    id: str
    result: bytes | None = None
    error: bytes | None = None
    payloads = ("result", "error")
    is_command = True


# ------------------------------------------------- search attributes and memo
@immutable(kw_only=True)
class SearchAttributesUpserted(Event):
    """``upsert_search_attributes``: ``{name: [type, value]}``, a ``None`` value removes it."""

    TYPE = "SearchAttributesUpserted"

    id: str
    attributes: dict[str, Any]
    compared = ("attributes",)
    is_command = True


@immutable(kw_only=True)
class MemoUpserted(Event):
    """``upsert_memo``: a payload of the changed keys (a ``None`` value removes a key)."""

    TYPE = "MemoUpserted"

    id: str
    memo: bytes
    compared = ("memo",)
    payloads = ("memo",)
    is_command = True


# ------------------------------------------------------------- cancellation
@immutable(kw_only=True)
class CancelRequested(Event):
    TYPE = "CancelRequested"

    reason: str = ""


# ------------------------------------------------------------ workflow timeouts
@immutable(kw_only=True)
class WorkflowTimeoutFired(Event):
    """A run's workflow timeout passed (``timeout``: ``run`` or ``execution``); applying it
    closes the run as failed with :class:`~durable.errors.WorkflowTimeout`."""

    TYPE = "WorkflowTimeoutFired"

    timeout: str


# ------------------------------------------------------------ run closings
@immutable(kw_only=True)
class WorkflowCompleted(Event):
    TYPE = "WorkflowCompleted"

    result: bytes
    payloads = ("result",)
    is_command = True


@immutable(kw_only=True)
class WorkflowFailedEvent(Event):
    TYPE = "WorkflowFailed"

    error: bytes
    payloads = ("error",)
    is_command = True


@immutable(kw_only=True)
class WorkflowCancelled(Event):
    TYPE = "WorkflowCancelled"

    reason: str = ""
    is_command = True


@immutable(kw_only=True)
class WorkflowTerminated(Event):
    TYPE = "WorkflowTerminated"

    reason: str = ""


@immutable(kw_only=True)
class WorkflowContinuedAsNew(Event):
    TYPE = "WorkflowContinuedAsNew"

    args: bytes
    new_run_id: str = ""
    payloads = ("args",)
    is_command = True


CLOSING: tuple[type[Event], ...] = (
    WorkflowCompleted,
    WorkflowFailedEvent,
    WorkflowCancelled,
    WorkflowTerminated,
    WorkflowContinuedAsNew,
)

#: Terminal status word written for each closing event.
STATUS_OF_CLOSING: dict[str, str] = {
    WorkflowCompleted.TYPE: "completed",
    WorkflowFailedEvent.TYPE: "failed",
    WorkflowCancelled.TYPE: "cancelled",
    WorkflowTerminated.TYPE: "terminated",
    WorkflowContinuedAsNew.TYPE: "continued",
}

_ALL: tuple[type[Event], ...] = (
    WorkflowStarted,
    ActivityScheduled,
    ActivityCompleted,
    ActivityFailedEvent,
    ActivityCancelled,
    TimerStarted,
    TimerFired,
    TimerCancelled,
    SignalWaitStarted,
    SignalReceived,
    SideEffectRecorded,
    VersionMarker,
    ChildStarted,
    ChildCompleted,
    ChildFailed,
    HookCreated,
    HookResumed,
    UpdateRequested,
    UpdateAccepted,
    UpdateRejectedEvent,
    UpdateCompleted,
    CancelRequested,
    WorkflowTimeoutFired,
    SearchAttributesUpserted,
    MemoUpserted,
    *CLOSING,
)


@immutable(kw_only=True)
class NewerEvent(Event):
    """An event of a type a newer release wrote (its format past this release's): read and
    shown as stored (``durable history``), refused by replay (:mod:`durable.history_format`)."""

    type_name: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def type(self) -> str:
        return self.type_name

    def to_data(self) -> dict[str, Any]:
        return dict(self.data)


#: Every event class by its stored type name (what :func:`decode` reads).
CATALOG: dict[str, type[Event]] = {cls.TYPE: cls for cls in _ALL}

_FIELDS: dict[type[Event], tuple[frozenset[str], frozenset[str]]] = {}
_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """An event class's field names in declaration order, cached (``to_data`` is on the hot path)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _field_sets(cls: type[Event]) -> tuple[frozenset[str], frozenset[str]]:
    """(all field names, required field names) of an event class, cached."""
    sets = _FIELDS.get(cls)
    if sets is None:
        fields = dataclasses.fields(cls)
        names = frozenset(f.name for f in fields)
        required = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        sets = _FIELDS[cls] = (names, required)
    return sets


@immutable
class Entry:
    """One event as stored: its position, time stamp and exact bytes (``raw``: a commit copies an
    inbox item into the history as it came, never re-stamped; a signal ``with_previous`` re-encoded)."""

    seq: int
    ts: int
    event: Event
    raw: bytes
    format: int = 1  # the history format replaying it needs (durable.history_format)

    @property
    def type(self) -> str:
        return self.event.type


def encode(event: Event, ts: int) -> bytes:
    """The stored bytes of an event with its time stamp (UTC ms), and the history format it needs
    when older releases would replay it differently (:mod:`durable.history_format`)."""
    data = event.to_data()
    needed = hf.needed_by(event.TYPE, data)
    if needed == 1:
        return codec.pack({"type": event.TYPE, "ts": ts, "data": data})
    return codec.pack({"type": event.TYPE, "ts": ts, "data": data, "f": needed})


def encode_input_data(event: Event) -> tuple[str, bytes]:
    """(type, packed data) of an input event, for a script that stamps ``ts`` itself."""
    return event.type, codec.pack(event.to_data())


def decode(raw: bytes, *, run_id: str = "", seq: int = 0) -> Entry:
    """Decode one stored entry; malformed or unknown entries raise :class:`HistoryCorrupt`
    naming the run and seq: nothing is skipped, so history is never silently reinterpreted
    (a newer release's type, marked so, is a :class:`NewerEvent`)."""
    where = f"run {run_id or '?'} seq {seq}"
    try:
        envelope = codec.unpack(raw)
    except Exception as exc:
        raise HistoryCorrupt(
            f"{where}: entry is not valid msgpack ({exc}); it was not written by durable",
            run_id=run_id,
            seq=seq,
        ) from None
    if not isinstance(envelope, dict) or not {"type", "ts", "data"} <= envelope.keys():
        raise HistoryCorrupt(
            f"{where}: entry is not a durable event (expected a map with type, ts, data)",
            run_id=run_id,
            seq=seq,
        )
    type_name, ts, data = envelope["type"], envelope["ts"], envelope["data"]
    cls = CATALOG.get(type_name) if isinstance(type_name, str) else None
    needed = hf.mark(envelope, where, run_id=run_id, seq=seq) if "f" in envelope else 1
    if cls is None and needed > hf.HISTORY_FORMAT and isinstance(ts, int) and isinstance(data, dict):
        return Entry(
            seq=seq, ts=ts, event=NewerEvent(type_name=str(type_name), data=data), raw=raw, format=needed
        )
    if cls is None:
        raise HistoryCorrupt(
            f"{where}: unknown event type {type_name!r}; upgrade durable or inspect the entry",
            run_id=run_id,
            seq=seq,
        )
    if not isinstance(ts, int) or not isinstance(data, dict):
        raise HistoryCorrupt(f"{where}: {type_name} has a malformed ts or data", run_id=run_id, seq=seq)
    names, required = _field_sets(cls)
    missing = required - data.keys()
    if missing:
        raise HistoryCorrupt(
            f"{where}: {type_name} is missing field(s) {sorted(missing)}", run_id=run_id, seq=seq
        )
    try:
        event = cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise HistoryCorrupt(f"{where}: {type_name} is malformed: {exc}", run_id=run_id, seq=seq) from None
    return Entry(seq=seq, ts=ts, event=event, raw=raw, format=needed)
