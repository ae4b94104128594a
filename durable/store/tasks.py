"""Typed records the worker hands the store, and the only code that encodes or decodes them.

* :class:`ActivityTask` -- an activity task body: one attempt of one activity.
  Stored msgpack-encoded (stream entries, the activity hash, dead letters) under
  short field names (``rid``, ``wid``, ``p``, ``aid``...) that existing data and
  the Lua scripts keep using; only :meth:`ActivityTask.encode` and
  :meth:`ActivityTask.decode` know them.
* :class:`CommitPlan` -- everything one decision commits; the store turns it
  into the commit script's argument (:func:`commit_payload`).
* :class:`AttemptOutcome` -- what happened to one attempt, for the completion
  script; :class:`AttemptResult` -- a result a worker commits itself (eager).
* Outbox messages (child start, child result, cancel), which cross partitions.

All are frozen, slotted dataclasses built positionally on the hot path: they
cost what the dicts they replace cost, and a misspelt field is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import codec
from .. import events as ev
from ..codec.plain import packer
from ..ids import successor_run_id
from ..immutable import immutable

_REQUIRED = frozenset({"rid", "wid", "p", "aid", "name", "args", "attempt", "stream"})


@immutable
class ActivityTask:
    """One attempt of one activity, as its task body says.

    Attributes:
        run_id: The run that scheduled the activity.
        workflow_id: That run's workflow id.
        partition: The run's partition.
        activity_id: The activity's command id in the run.
        name: The activity type.
        args: The encoded arguments.
        attempt: Which attempt this is (1 first).
        stream: The activity task stream its attempts go to.
        retry: The retry policy as a dict (``None``: the default policy).
        timeouts: ``start_to_close``, ``schedule_to_close``, ``heartbeat`` (seconds, or absent).
        scheduled: When the activity was scheduled (ms, the run's clock).
        parent: The run's parent (child workflows), if any.
        headers: Interceptor headers the workflow sent with the call (see durable.interceptors).
    """

    run_id: str
    workflow_id: str
    partition: int
    activity_id: str
    name: str
    args: bytes
    attempt: int
    stream: str
    retry: dict[str, Any] | None = None
    timeouts: dict[str, Any] | None = None
    scheduled: int = 0
    parent: dict[str, Any] | None = None
    headers: dict[str, Any] | None = None

    def encode(self) -> bytes:
        """The stored body (field names and order as every earlier version wrote them; ``hdr``
        only when there are headers, so a body without them is byte for byte as before)."""
        body = {
            "rid": self.run_id,
            "wid": self.workflow_id,
            "p": self.partition,
            "aid": self.activity_id,
            "name": self.name,
            "args": self.args,
            "attempt": self.attempt,
            "retry": self.retry,
            "timeouts": self.timeouts,
            "stream": self.stream,
            "scheduled": self.scheduled,
            "parent": self.parent,
        }
        if self.headers:
            body["hdr"] = self.headers
        return codec.pack(body)

    @staticmethod
    def decode(raw: bytes) -> ActivityTask:
        """A stored body as a task.

        Raises:
            ValueError: a required field is missing (a foreign or damaged entry).
            Exception: whatever msgpack raises on bytes that are not a body.
        """
        body = codec.unpack(raw)
        if not isinstance(body, dict):
            raise ValueError(f"task body is a {type(body).__name__}, not a map")
        missing = _REQUIRED - body.keys()
        if missing:
            raise ValueError(f"missing field(s) {sorted(missing)}")
        get = body.get
        return ActivityTask(
            body["rid"],
            body["wid"],
            body["p"],
            body["aid"],
            body["name"],
            body["args"],
            int(body["attempt"]),
            body["stream"],
            get("retry"),
            get("timeouts"),
            get("scheduled") or 0,
            get("parent"),
            get("hdr") or None,
        )

    def next_attempt(self) -> ActivityTask:
        """The same activity's next attempt."""
        return ActivityTask(
            self.run_id,
            self.workflow_id,
            self.partition,
            self.activity_id,
            self.name,
            self.args,
            self.attempt + 1,
            self.stream,
            self.retry,
            self.timeouts,
            self.scheduled,
            self.parent,
            self.headers,
        )

    def timeout(self, kind: str) -> float | None:
        """The ``kind`` timeout in seconds (``start_to_close``...), or ``None`` when not set."""
        return (self.timeouts or {}).get(kind) or None

    @property
    def lease(self) -> tuple[int, str, str, int]:
        """``(partition, run id, activity id, attempt)``: which attempt a lease is for."""
        return (self.partition, self.run_id, self.activity_id, self.attempt)


@immutable
class AttemptResult:
    """An attempt's result before it is recorded: its task, the encoded value, the log record,
    and the task stream entry it ran from (``entry_id`` ``""``: a leased attempt, no entry),
    which whatever records the result acks."""

    task: ActivityTask
    payload: bytes
    record: dict[str, Any]
    stream: str = ""
    entry_id: str = ""


@immutable
class AttemptOutcome:
    """What happened to one attempt, for the completion script.

    Attributes:
        task: The attempt.
        outcome: ``completed`` or ``failed`` (``event`` goes to the run's inbox),
            ``retry`` (``next_task`` is scheduled after ``retry_delay_ms``), or anything
            else (only logged, e.g. ``skipped``).
        record: The attempt's log record (duration, error, traceback...).
        stream: The task stream the attempt's task entry is in.
        entry_id: That entry, acked by the script (``""``: none, e.g. a leased attempt).
        event: The inbox event (ActivityCompleted / ActivityFailed).
        retry_delay_ms: The backoff before ``next_task``.
        next_task: The next attempt (``retry`` only).
        kept: A key of the wrong kind refused this outcome before and the worker kept it: an
            absent activities hash is then that key being mended (deleted, then the hash
            renamed back), not "no longer pending", and the outcome is kept again, not
            discarded as late.
    """

    task: ActivityTask
    outcome: str
    record: dict[str, Any]
    stream: str
    entry_id: str = ""
    event: ev.Event | None = None
    retry_delay_ms: int = 0
    next_task: ActivityTask | None = None
    kept: bool = False


@immutable
class NextRun:
    """The run a continue-as-new starts, in the same commit (same workflow id, same partition)."""

    run_id: str
    workflow_id: str
    workflow_type: str
    queue: str
    started: bytes
    parent: bytes
    build: str


@immutable
class CommitPlan:
    """Everything one decision commits, atomically, against its expected seq.

    Attributes:
        expected_seq: The seq the decision was made on.
        events: History entries to append (encoded events).
        consumed: Inbox items the decision read (from the head).
        status: The run's status after the decision.
        snapshot: The run's projection.
        dropped: ``(raw, reason, poison)`` inbox items not applied (poison: also a dead letter).
        activities: Activity tasks to enqueue on their streams.
        claimed: ``(task, deadline ms or 0)``: activity tasks enqueued like ``activities`` and
            read, in the same script, for ``claimer`` (the committing worker, which has room in its
            backlog for each: a thread free, or one soon for activities that take microseconds),
            their attempts begun at ``claim_started`` (ms) when no older task waited on their
            stream (:class:`ClaimedTask`).
        claimer: The consumer name ``claimed`` are read for.
        claim_started: When the claimed attempts begin (ms, the worker's clock, as begin_attempt).
        leased: Activity tasks this worker runs itself, under a lease until ``lease_due``.
        lease_due: When the leases of ``leased`` run out (ms, Redis clock).
        timers: ``(timer id, due ms)`` to set.
        cancelled_timers: Timer ids to remove.
        cancelled_activities: Activity ids whose task or attempt is void.
        outbox: Cross-partition messages (see :func:`child_start_message`...).
        hooks: ``(token digest, hook id)`` of hooks created.
        expired_hooks: Ids of hooks whose wait ended: their tokens are deleted.
        eager: Results of attempts this worker ran, applied by this decision.
        close: The closing status word when the run ends.
        next_run: The run a continue-as-new starts.
        carried: Signals read after the run continued as new: pushed to ``next_run``'s inbox
            (as are the inputs that arrive while the decision is made), not dropped.
        pin: ``(build id, queue)``: pin the run to this worker's build (first versioned decision).
        task: ``(stream, entry id)`` of the workflow task to ack (``None``: eager, no task).
        sticky: The committing worker's private queue: the run's next tasks go there.
        search_attributes: The run's search attributes after the decision, when it upserted
            some (``{name: [type, value]}``); ``None``: unchanged.
        memo: The run's memo after the decision (a payload), when it upserted it.
    """

    expected_seq: int
    events: Sequence[bytes]
    consumed: int
    status: str
    snapshot: dict[str, Any]
    dropped: Sequence[tuple[bytes, str, bool]] = ()
    activities: Sequence[ActivityTask] = ()
    claimed: Sequence[tuple[ActivityTask, int]] = ()
    claimer: str = ""
    claim_started: int = 0
    leased: Sequence[ActivityTask] = ()
    lease_due: int = 0
    timers: Sequence[tuple[str, int]] = ()
    cancelled_timers: Sequence[str] = ()
    cancelled_activities: Sequence[str] = ()
    outbox: Sequence[bytes] = ()
    hooks: Sequence[tuple[str, str]] = ()
    expired_hooks: Sequence[str] = ()
    eager: Sequence[AttemptResult] = ()
    close: str | None = None
    next_run: NextRun | None = None
    carried: Sequence[bytes] = ()
    pin: tuple[str, str] | None = None
    task: tuple[str, str] | None = None
    sticky: str = ""
    search_attributes: dict[str, Any] | None = None
    memo: bytes | None = None


def pack_plan(plan: dict[str, Any]) -> bytes:
    """The commit script's argument: Lua's cmsgpack predates msgpack's bin type, so bytes go as
    raw strings."""
    packed: bytes = packer(use_bin_type=False).pack(plan)
    return packed


# ----------------------------------------------------------------- outbox messages


def child_start_message(workflow_id: str, run_id: str, child: ev.ChildStarted) -> bytes:
    """An outbox message starting the child ``child`` of run ``run_id`` (another partition)."""
    return codec.pack(
        {
            "kind": "start",
            "type": child.workflow_type,
            "wid": child.workflow_id,
            "rid": successor_run_id(f"{run_id}/{child.id}", 0),
            "args": child.args,
            "queue": child.queue,
            "parent": {"wid": workflow_id, "rid": run_id, "cid": child.id, "policy": child.policy},
            "headers": child.headers,
        }
    )


def child_policy_message(policy: str, workflow_id: str, reason: str = "") -> bytes:
    """An outbox message applying a parent's close policy (``request_cancel``, ``terminate``,
    ``abandon``) to its child ``workflow_id`` (``reason``: why, when not the parent's own close)."""
    return codec.pack(
        {"kind": policy, "wid": workflow_id, "reason": reason}
        if reason
        else {"kind": policy, "wid": workflow_id}
    )


def children_to_close(snapshot: dict[str, Any]) -> list[tuple[str, str]]:
    """``(policy, workflow id)`` of each pending child of a run's ``snapshot`` its parent close
    policy acts on when the run is closed from outside its code (terminated, or replaced by
    ``terminate_existing``); a child with policy ``abandon`` is left alone."""
    out = []
    for item in snapshot.get("pending", []):
        policy = item.get("policy") or "terminate"
        if item.get("kind") == "child" and item.get("workflow_id") and policy != "abandon":
            out.append((policy, str(item["workflow_id"])))
    return out


def child_result_message(parent: dict[str, Any], event: ev.Event) -> bytes:
    """An outbox message delivering a child's outcome to its parent run (another partition)."""
    return codec.pack(
        {
            "kind": "deliver",
            "wid": parent["wid"],
            "rid": parent["rid"],
            "type": event.type,
            "data": event.to_data(),
        }
    )
