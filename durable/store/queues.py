"""Task streams in Redis: consumer groups, acks, parking (dead letters), build routing, and time skipping.

Each task stream has one consumer group (:data:`~durable.store.keys.GROUP`);
a task that cannot run is parked (moved to the partition's dead-letter stream
with its reason), never dropped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from .. import codec
from .. import events as ev
from ..codec.sealed import seal_text
from ..errors import DurableError, WorkflowClosed
from ..ids import clipped
from ..runinfo import classify_block
from .key_types import is_wrong_type
from .keys import GROUP, keyword_posting
from .reads import GroupRead, unread
from .records import CLOSED_STATUSES, RunRef, text
from .runs import RunStore
from .tasks import ActivityTask
from .timer_index import rearm

if TYPE_CHECKING:
    from .workers import WorkerInfo

log = logging.getLogger("durable.store")


@dataclass
class RetiredBuilds:
    """What :meth:`QueueStore.drop_retired_builds` did, as ``queue@build`` names."""

    dropped: list[str] = field(default_factory=list)
    """Builds whose task streams were deleted (they were empty)."""
    waiting: list[str] = field(default_factory=list)
    """Builds kept: some stream still holds tasks of runs pinned to them."""


@dataclass(frozen=True)
class WorkflowTaskWhere:
    """Where an open run's pending workflow task is (:meth:`QueueStore.workflow_task_where`).

    Attributes:
        stream: The task stream holding it (the run's queue's, or a worker's private one).
        consumer: The worker it was delivered to, which has not acked it (``""``: no worker
            has read it yet).
        idle_ms: Delivered: since it was delivered (or last reclaimed).
        deliveries: Delivered: how many times it was.
        backlog: Not delivered: the tasks in its stream no worker has read yet, it included.
        owner: Not delivered, in a worker's private stream: that worker (it decided the run
            last and holds its lease), else ``""``.
        wrong_kind: The kind of value the stream's key holds when it is not a stream (made by
            hand): workers do not read it (``""``: it is one, or none yet).
    """

    stream: str
    consumer: str = ""
    idle_ms: int = 0
    deliveries: int = 0
    backlog: int = 0
    owner: str = ""
    wrong_kind: str = ""


class QueueStore(RunStore):
    """Task streams: groups, acks, requeues, dead letters, build routing; the clock offset."""

    def open_read(self, group: int | None) -> GroupRead:
        """A connection for blocking task reads of ``group`` (see :meth:`read_group`)."""
        return GroupRead(self.partition_client(group) if group is not None else self.redis)

    def read_group(self, stream: str) -> int | None:
        """Which read a task stream joins: on a cluster its partition (a read over several
        slots is refused), on one Redis ``None`` (one read over every stream)."""
        return self.keys.partition_of_key(stream) if self.cluster else None

    def workflow_task_where(
        self, ref: RunRef, record: Mapping[str, Any], most: int = 500
    ) -> WorkflowTaskWhere | None:
        """Where run ``ref``'s pending workflow task is: delivered to a worker that has not
        decided it yet (among the first ``most`` of its stream's pending list), else waiting in
        its stream; ``None``: its record (``record``) says it has none. One round trip, two when
        some task of its streams is delivered (their keys share the run's slot)."""
        if str(record.get("task") or "0") != "1":
            return None
        p, host = ref.partition, str(record.get("sticky") or "")
        queue = str(record.get("wq") or self.keys.workflow_tasks(p, str(record.get("queue") or "default")))
        streams = [self.keys.workflow_tasks(p, host), queue] if host else [queue]
        with self.pipeline(queue, transaction=False) as pipe:
            for stream in streams:
                pipe.xpending_range(stream, GROUP, "-", "+", most)
                pipe.xlen(stream)
                pipe.xinfo_groups(stream)
            if host:
                pipe.get(self.keys.alive(p, host))
            per_stream = pipe.execute(raise_on_error=False)
        alive = per_stream.pop() if host else None
        looks = [(stream, *per_stream[3 * i : 3 * i + 3]) for i, stream in enumerate(streams)]
        rows = [
            (stream, row) for stream, pending, _, _ in looks if isinstance(pending, list) for row in pending
        ]
        if rows:
            with self.pipeline(queue, transaction=False) as pipe:
                for stream, row in rows:
                    pipe.xrange(stream, row["message_id"], row["message_id"])
                entries = pipe.execute(raise_on_error=False)
            for (stream, row), found in zip(rows, entries, strict=True):
                if isinstance(found, list) and found and text(found[0][1].get(b"run", b"")) == ref.run_id:
                    return WorkflowTaskWhere(
                        stream,
                        text(row["consumer"]),
                        int(row["time_since_delivered"]),
                        int(row["times_delivered"]),
                    )
        # Not delivered: where the start or commit scripts put it (a live owner's private stream).
        owner = text(alive) if isinstance(alive, bytes) else ""
        stream, _, length, groups = looks[0] if owner else looks[-1]
        wrong = text(self.redis.type(stream)) if is_wrong_type(length) else ""
        return WorkflowTaskWhere(stream, backlog=unread(length, groups), owner=owner, wrong_kind=wrong)

    def ensure_groups(self, streams: Iterable[str]) -> None:
        """Create the consumer group on each task stream (idempotent). A key of another kind is
        left as it is: the worker's read finds it and sets it aside (``workers.broken_streams``)."""
        for stream in streams:
            try:
                self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc) and not is_wrong_type(exc):
                    raise

    def park(
        self,
        *,
        p: int,
        stream: str,
        entry_id: str,
        kind: str,
        reason: str,
        fields: Mapping[Any, Any],
        run_id: str = "",
        block: bool = False,
        block_kind: str = "",
        input_at: int = 0,
    ) -> None:
        """Move a task that cannot run to the dead-letter stream (and block its run; ``block_kind``
        is one of :data:`durable.runinfo.BLOCKED_KINDS`, default: derived from ``reason``;
        ``input_at``: 1-based position of the inbox item that blocks it, 0: none).

        A key it writes that holds the wrong kind of value (the dead-letter stream, the run
        record) leaves the task pending (it comes again after ``--claim-idle``), logged as an
        ERROR naming the key: parking is how every other bad task is set aside, and its
        failure stopped the worker, and every worker that took the task after it."""
        k = self.keys
        safe = {
            key: (value if isinstance(value, bytes | str | int | float) else repr(value))
            for key, value in fields.items()
        }
        if block and not block_kind:
            # Derived here, from the plain text: the stored reason may be sealed (encrypted).
            block_kind = classify_block(reason)
        try:
            if block and run_id and "`durable repair`" in reason:
                # Which run to repair, in every view that shows the reason (status, list, the UI).
                workflow_id = self.redis.hget(k.run(p, run_id), "workflow_id")
                if workflow_id:
                    reason = reason.replace("`durable repair`", f"`durable repair {text(workflow_id)}`")
            self._run_script(
                "park",
                [k.dead(p), stream, k.run(p, run_id) if run_id else k.runs(p), k.runs(p), k.blocked(p)],
                [
                    entry_id,
                    kind,
                    seal_text(reason),
                    codec.pack(safe),
                    run_id,
                    "1" if block else "0",
                    block_kind,
                    input_at or "",
                ],
            )
        except redis.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            expected = {k.dead(p): "stream", stream: "stream", k.blocked(p): "zset"}
            wrong = self.wrong_types({**expected, **({k.run(p, run_id): "hash"} if run_id else {})})
            log.error(
                "could not park %s task %s of run %s (%s): %s; it stays pending, tried again after "
                "--claim-idle: delete or rename the key (durable makes it again)",
                kind,
                entry_id,
                clipped(run_id) if run_id else "?",
                reason,
                "; ".join(wrong) or exc,
            )
            return
        log.warning(
            "parked %s task %s of run %s: %s", kind, entry_id, clipped(run_id) if run_id else "?", reason
        )

    def current_build(self, queues: Sequence[str]) -> list[str]:
        """The current build id of each queue (``""`` when none was promoted)."""
        names = [self.keys.current_build(q) for q in queues]
        if not names:
            values: list[Any] = []
        elif self.cluster:  # the keys are in different slots
            values = self.redis.mget_nonatomic(names)
        else:
            values = self.redis.mget(names)
        return [text(v) if v is not None else "" for v in values]

    def drop_retired_builds(self, live: Sequence[WorkerInfo], keep: Iterable[str] = ()) -> RetiredBuilds:
        """Delete the empty workflow task streams of builds no worker in ``live`` serves and that
        are not their queue's current build (``lua/drop_empty_stream.lua``, one per partition),
        but none of ``keep`` (the caller's own streams: its registry entry may have lapsed).
        A build whose streams are all gone leaves :meth:`~.keys.Keys.served_builds`; one whose
        streams hold tasks (runs waiting for a worker of that build) is kept for a later pass."""
        pairs = []
        for member in self.redis.smembers(self.keys.served_builds()):
            try:
                pair = json.loads(member)
            except ValueError:
                pair = None
            if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair):
                pairs.append(pair)
            else:  # not written by a worker: it would fail this pass every time
                self.redis.srem(self.keys.served_builds(), member)
                log.warning(
                    "removed %r from %s: not a [queue, build] pair", member[:80], self.keys.served_builds()
                )
        served = {(q, b) for w in live for q in w.queues for b in w.builds}
        current = dict(zip((q for q, _ in pairs), self.current_build([q for q, _ in pairs]), strict=True))
        out, kept = RetiredBuilds(), set(keep)
        for queue, build in sorted(map(tuple, pairs)):
            if (queue, build) in served or current.get(queue) == build:
                continue
            streams = [self.keys.workflow_tasks(p, queue, build) for p in range(self.keys.partitions)]
            if kept & set(streams):
                continue
            gone = self._script_many("drop_empty_stream", [([s], []) for s in streams], raise_on_error=True)
            if all(int(g) for g in gone):
                self.redis.srem(self.keys.served_builds(), json.dumps([queue, build]))
                out.dropped.append(f"{queue}@{build}")
            else:
                out.waiting.append(f"{queue}@{build}")
        return out

    def drop_unserved_streams(self, queues: Iterable[str], keep: Iterable[str] = ()) -> list[str]:
        """Delete the empty shared task streams (workflow and activity, every partition) of
        ``queues`` -- those no live worker serves -- but none of ``keep`` (the caller's own).
        Returns the queues whose streams are all gone. Their names stay known (a few bytes
        each): a producer that noted a name once does not note it again, so a name forgotten
        under a task sent meanwhile would hide that task's backlog from ``durable workers``
        and ``/metrics``. A queue per tenant left 16 empty streams for good."""
        k, kept, dropped = self.keys, set(keep), []
        for queue in queues:
            streams = [
                s
                for p in range(k.partitions)
                for s in (k.workflow_tasks(p, queue), k.activity_tasks(p, queue))
            ]
            if kept & set(streams):
                continue
            gone = [
                int(g)
                for g in self._script_many(
                    "drop_empty_stream", [([s], []) for s in streams], raise_on_error=True
                )
            ]
            if all(gone) and 1 in gone:  # all empty now, and some were there
                dropped.append(queue)
        return dropped

    def promote_build(self, queues: Sequence[str], build: str) -> None:
        """Make ``build`` the one whose workers start the new runs of ``queues``."""
        with self.redis.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.set(self.keys.current_build(queue), build)
            pipe.execute()

    def repin(self, workflow_id: str, build: str) -> RunRef:
        """Move a run to another build id (after checking with `durable replay` that the new
        code replays its history): its workflow tasks go to that build's workers (``""``: to
        unversioned workers, the run pinned to no build)."""
        ref = self.ref(workflow_id)
        record = self.run_record(ref)
        stream = self.keys.workflow_tasks(ref.partition, record.get("queue", "default"), build)
        self.ensure_groups([stream])
        with self.pipeline(stream) as pipe:
            run_key = self.keys.run(ref.partition, ref.run_id)
            pipe.hset(run_key, mapping={"build": build, "wq": stream})
            pipe.hdel(run_key, "sticky")
            # The search index's build_id follows (see sx_keyword in lua/_lib.lua).
            if record.get("build"):
                pipe.zrem(
                    self.keys.search(ref.partition, keyword_posting("build_id", record["build"])), ref.run_id
                )
            if build:
                pipe.zadd(
                    self.keys.search(ref.partition, keyword_posting("build_id", build)),
                    {ref.run_id: record["created"]},
                )
            pipe.xadd(stream, {"run": ref.run_id})
            pipe.execute()
        return ref

    def drop_void_tasks(self, streams: Sequence[str], most: int = 500) -> int:
        """Drop the tasks of closed or purged runs from the first ``most`` entries of each of
        ``streams`` (those of queues no live worker serves, where no worker drops them as it
        reads them: ``lua/drop_void_tasks.lua``); how many were dropped."""
        partition_of = self.keys.partition_of_key
        calls = [([s], [self.keys.tag(partition_of(s)), most]) for s in streams]
        return sum(int(n) for n in self._script_many("drop_void_tasks", calls, raise_on_error=True))

    def ack_task(self, stream: str, entry_id: str) -> None:
        """Ack and delete one task entry (MULTI/EXEC; on a cluster, on the stream's node)."""
        with self.pipeline(stream) as pipe:
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()

    def requeue(self, tasks: Mapping[str, Sequence[tuple[str, Mapping[bytes, bytes]]]]) -> None:
        """Put tasks this consumer was delivered but will not run back at the ends of their
        streams (``{stream: [(entry id, fields)]}``), as new entries for any worker: one
        MULTI/EXEC per stream, all in one round trip."""
        batches = [
            [
                command
                for entry_id, fields in entries
                for command in (
                    ("XADD", stream, "*", *(part for pair in fields.items() for part in pair)),
                    ("XACK", stream, GROUP, entry_id),
                    ("XDEL", stream, entry_id),
                )
            ]
            for stream, entries in tasks.items()
            if entries
        ]
        if batches:
            self._wire.transactions(batches)

    def requeue_pending(
        self,
        streams: Iterable[str],
        consumer: str,
        most: int = 1000,
        keep: Collection[tuple[str, str]] = (),
        why: str = "it was stopping, the attempt still running past its --grace",
    ) -> int:
        """Put every task still pending for ``consumer`` on ``streams`` back at their ends, as
        new entries for any worker (``lua/requeue_pending.lua``, one call per stream, all in one
        round trip); returns how many moved.

        For a worker that is leaving, once nothing of it runs any more: what is still pending
        for it was delivered to a read it never took in (a stop or a stuck main thread), and
        would otherwise wait for another worker to reclaim it after ``--claim-idle``. Its
        blocking reads must be closed first, or the moved tasks could be delivered to them again.
        After an outage, a worker that goes on puts back the same way what the outage hid from
        it, and ``keep`` names, as ``(stream, entry id)``, the tasks it holds (left pending).
        An activity attempt it began is marked handed back (``why``: in words), so its next
        begin is neither taken for a worker's death nor described as lost.
        """
        kept: dict[str, list[str]] = {}
        for stream, entry_id in keep:
            kept.setdefault(stream, []).append(entry_id)
        calls = [([stream], [GROUP, consumer, most, why, *kept.get(stream, ())]) for stream in streams]
        if not calls:
            return 0
        return sum(int(n) for n in self._script_many("requeue_pending", calls, raise_on_error=True))

    def hand_back(
        self, stream: str, entry_id: str, member: str, due_ms: int, run: tuple[int, str, int] | None = None
    ) -> None:
        """Leave a task this worker cannot run (it lacks the type) for workers that can: ack it
        here, and at ``due_ms`` the scheduler re-adds it to its queue as a new entry
        (``member``: :func:`~durable.store.keys.handed_back_member`), so this worker does
        not read it straight back. One MULTI/EXEC: the task is never lost nor doubled.
        ``run``: ``(partition, run id, grace ms)`` of a workflow task's run, whose record then
        names the hand-back for the views (:meth:`handed_back_since`)."""
        with self.pipeline(stream) as pipe:
            pipe.zadd(self.keys.timers(self.keys.partition_of_key(stream)), {member: due_ms})
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            if run is not None:
                pipe.hset(self.keys.run(run[0], run[1]), mapping={"handed": member, "handed_grace": run[2]})
            pipe.execute()

    def handed_back_since(self, ref: RunRef) -> tuple[int, int] | None:
        """Whether run ``ref``'s workflow task waits handed back (:meth:`hand_back`): ``(since
        when no live worker could decide it (Redis ms; 0: one could), the grace before it is
        parked in ms)``; ``None``: not handed back (or by a release that did not say). Two reads
        (its record names the hand-back, the timers still hold it): only views ask."""
        member, grace = self.redis.hmget(self.keys.run(ref.partition, ref.run_id), "handed", "handed_grace")
        if member is None or self.redis.zscore(self.keys.timers(ref.partition), member) is None:
            return None
        first = text(member).rpartition("|")[2]
        return (int(first) if first.isdigit() else 0), int(grace or 0)

    def reroute(self, stream: str, entry_id: str, run_id: str, target: str) -> None:
        """Hand a workflow task to the stream of the build its run is pinned to."""
        with self.pipeline(stream) as pipe:
            pipe.xadd(target, {"run": run_id})
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()

    def repair_on(self, workflow_id: str, build: str) -> tuple[RunRef, bool]:
        """Move a run to ``build``'s workers (``""``: to unversioned ones, :meth:`repin`) and
        re-queue it, as ``durable repair --build-id`` / ``--unversioned`` do. Returns its ref
        and whether it has closed since: the move queued a task, and the new workers may finish
        the run before the re-queue, which is the repair succeeding.

        Raises:
            WorkflowClosed: the run was closed before (nothing to repair; it is not moved).
        """
        ref = self.ref(workflow_id)
        if self.run_status(ref.partition, ref.run_id) in CLOSED_STATUSES:
            self.repair(workflow_id)  # raises "is <status>; nothing to repair"
        ref = self.repin(workflow_id, build)
        try:
            self.repair(workflow_id)
        except WorkflowClosed:
            return ref, True
        return ref, False

    def repair(self, workflow_id: str, *, drop_input: bool = False) -> RunRef:
        """Re-queue a blocked run (after a fixed deploy).

        Args:
            workflow_id: The workflow whose current run is re-queued.
            drop_input: First move the inbox item that blocks the run (the first one when
                the run does not say) to the dead-letter stream.
        """
        ref = self.ref(workflow_id)
        k, p, rid = self.keys, ref.partition, ref.run_id
        result = self._run_script(
            "repair",
            [k.run(p, rid), k.inbox(p, rid), k.dead(p), k.log(p, rid), k.blocked(p)],
            [rid, "1" if drop_input else "0"],
        )
        if text(result[0]) == "CLOSED":
            status = text(result[1])
            more = (
                ": a closed run does not run again; start a new one (`durable start`). So that an "
                "error a deploy brings (a NameError, say) blocks runs instead of failing them, list it "
                "in the workflow's `block_on_errors` (docs/operations.md)"
                if status == "failed"
                else ""
            )
            raise WorkflowClosed(f"workflow {workflow_id!r} is {status}; nothing to repair{more}")
        # Deadlines a timers key deleted by hand took with it: armed again (they fire once due).
        rearm(self, ref, (self.run_record(ref).get("snapshot") or {}).get("pending") or [])
        # Activity tasks parked for this run (e.g. a type no worker had) go back to their queue;
        # its parked workflow tasks are done with (the script queued a new one). Dropped inputs
        # stay: they are data an operator set aside.
        dead = self.keys.dead(ref.partition)
        with self.redis.pipeline(transaction=False) as pipe:
            for entry_id, fields in self.redis.xrange(dead):
                if fields.get(b"run") != ref.run_id.encode():
                    continue
                if fields.get(b"kind") == b"workflow":
                    pipe.xdel(dead, entry_id)
                if fields.get(b"kind") != b"activity":
                    continue
                parked = codec.unpack(fields[b"task"])  # the task's fields, keys str or bytes
                raw_body = parked.get("body", parked.get(b"body"))
                if not isinstance(raw_body, bytes):
                    continue
                task = ActivityTask.decode(raw_body)
                pipe.xadd(task.stream, {"run": ref.run_id, "act": task.activity_id, "body": raw_body})
                pipe.xdel(dead, entry_id)
            pipe.execute()
        return ref

    def drop_uncommitted(self, workflow_id: str) -> tuple[RunRef, int]:
        """Move the history entries a commit that failed half-way wrote past the run record's count
        (its script met a key of the wrong kind: Redis does not undo a script's earlier writes)
        beside the history, put the inputs among them back in the inbox, and re-queue the run
        (``durable repair --drop-uncommitted``). Returns the run and how many entries moved.

        Raises:
            WorkflowClosed: the run is closed.
            DurableError: the run kept changing meanwhile.
        """
        for _ in range(5):
            ref = self.ref(workflow_id)
            k, p, rid = self.keys, ref.partition, ref.run_id
            seq = int(self.run_record(ref).get("seq") or 0)
            extra = self.redis.xrange(k.history(p, rid), f"0-{seq + 1}", "+")
            top = int(extra[-1][0].split(b"-")[1]) if extra else seq
            inputs = [
                entry_id.split(b"-")[1]
                for entry_id, fields in extra
                if not _is_command(fields.get(b"e", b""), rid)
            ]
            result = self._run_script(
                "drop_uncommitted",
                [k.run(p, rid), k.history(p, rid), k.inbox(p, rid), k.log(p, rid), k.blocked(p)],
                [rid, seq, top, *inputs],
            )
            if text(result[0]) == "OK":
                return ref, int(result[1])
            if text(result[0]) == "CLOSED":
                raise WorkflowClosed(f"workflow {workflow_id!r} is {text(result[1])}; nothing to repair")
        raise DurableError(f"workflow {workflow_id!r} kept changing; try again")

    # ----------------------------------------------------------------- clock
    def set_clock_offset(self, ms: int) -> None:
        """Shift the clock every script stamps time with by ``ms`` (tests only: time skipping).

        Writes ``<tag>:clock`` in every partition (deleted for 0). Workflow
        ``now()``, timer due checks and event time stamps follow it; Python-side
        waits (worker and scheduler sleeps) do not.
        """
        ms = int(ms)
        with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.keys.partitions):
                key = self.keys.clock(p)
                if ms:
                    pipe.set(key, ms)
                else:
                    pipe.delete(key)
            pipe.execute()

    def clock_offset(self) -> int:
        """The clock offset set by :meth:`set_clock_offset` (ms; 0 when none)."""
        value = self.redis.get(self.keys.clock(0))
        return int(value) if value is not None else 0

    def probe_idle(self, streams: Sequence[str]) -> tuple[bool, int | None, int]:
        """One consistent look for time skipping: ``(busy, earliest due timer ms or None, now ms)``.

        Busy: a task waits in one of ``streams`` or an activity attempt is running. ``now``
        is the scripts' clock (Redis TIME plus the offset).
        """
        k, parts = self.keys, range(self.keys.partitions)
        with self.redis.pipeline(transaction=True) as pipe:
            for stream in streams:
                pipe.xlen(stream)
            for p in parts:
                pipe.zcard(k.running(p))
            for p in parts:
                pipe.zrange(k.timers(p), 0, 0, withscores=True)
            pipe.time()
            pipe.get(k.clock(0))
            replies = pipe.execute()
        n = len(streams) + len(parts)
        busy = any(replies[:n])
        dues = [int(rows[0][1]) for rows in replies[n : n + len(parts)] if rows]
        sec, usec = replies[-2]
        now = int(sec) * 1000 + int(usec) // 1000 + int(replies[-1] or 0)
        return busy, (min(dues) if dues else None), now


def _is_command(raw: bytes, run_id: str) -> bool:
    """Whether a history entry is a command of the workflow's (not an input it took): an entry
    that does not decode is not put back in the inbox."""
    try:
        return bool(ev.decode(raw, run_id=run_id).event.is_command)
    except Exception:  # noqa: BLE001 - garbage is no input
        return True
