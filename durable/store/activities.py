"""Activity attempts in Redis: their outcomes, heartbeats and deadlines, and due timers.

An activity's state lives in the run's activity hash (its current task body and
the fields :mod:`durable.store.keys` names); a running attempt's deadline is a
member of the partition's running set; a timer or a retry's backoff is a member
of its timers set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import redis

from .. import codec
from .. import events as ev
from ..codec.sealed import seal_fields
from ..immutable import immutable
from . import loads
from .key_types import KeyTypes, is_wrong_type
from .keys import (
    GROUP,
    attempt_field,
    attempt_member,
    heartbeat_field,
    parse_attempt_member,
    parse_begun_by,
    retry_member,
    started_field,
    worker_field,
)
from .loads import Loaded, RunToLoad
from .reads import unread
from .records import ClaimedTask, text
from .tasks import ActivityTask, AttemptOutcome
from .wire import transaction_result

log = logging.getLogger("durable.store")


class Begun(NamedTuple):
    """Whether an attempt may run (:meth:`ActivityStore.begin_attempt`).

    Attributes:
        ok: The run is open and the attempt current: run it.
        reason: Why it may not run (``ok`` false).
        details: The activity's last heartbeat details (encoded), if any were recorded.
        now_ms: When it began (the scripts' clock: Redis time plus any test offset).
    """

    ok: bool
    reason: str = ""
    details: bytes | None = None
    now_ms: int = 0


class Completions(NamedTuple):
    """What :meth:`ActivityStore.complete_then_load` did.

    Attributes:
        replies: Per outcome, ``('OK', 1)`` when its completion enqueued its run's workflow task
            (no task was pending), ``('OK', 0)`` when one was; ``('RETRY', due ms)``,
            ``('STALE', 0)``.
        loads: The loads of the runs asked for, in their order (``None``: none asked, or a load
            failed; the runs are loaded again when decided).
        handed: Workflow tasks read for the calling worker from its private streams
            (``began_ms`` 0).
    """

    replies: list[tuple[str, int]]
    loads: list[Loaded] | None
    handed: list[ClaimedTask]


@immutable(slots=False)
class AttemptBegun:
    """A pending activity's current attempt, as ``durable describe`` shows it.

    Attributes:
        attempt: The attempt number.
        started_ms: When it began (ms; 0: it waits for a worker, or for its retry time).
        worker: The worker that began it ("" when it has not begun).
        backlog: When it has not begun: the activity tasks waiting in its queue's streams for a
            worker (over every partition; ``None``: not counted).
        retry_due_ms: When it waits for its retry time: when that is (ms; its task is queued
            then); ``None`` otherwise.
        leased: It has not begun, and is leased to a worker (eager mode, a local activity):
            it waits for one of that worker's threads, not in its queue.
    """

    attempt: int
    started_ms: int = 0
    worker: str = ""
    backlog: int | None = None
    retry_due_ms: int | None = None
    leased: bool = False


def _in_queue(b: AttemptBegun) -> bool:
    """Whether an attempt waits in its queue for any worker (not begun, not leased, no retry time)."""
    return not b.worker and not b.leased and b.retry_due_ms is None


class Begins(NamedTuple):
    """How often an activity's current attempt has begun (:meth:`ActivityStore.attempt_begins`).

    Attributes:
        attempt: The current attempt's number.
        begins: How many times it began (a reclaimed or re-run attempt begins again; 0: never).
            Each begin whose outcome never came ended with its worker process.
        worker: The worker that began it last (``""``: never begun).
        started_ms: When it began last (ms; 0: never).
    """

    attempt: int
    begins: int = 0
    worker: str = ""
    started_ms: int = 0


class ActivityStore(KeyTypes):
    """Activity attempts: record their outcomes, heartbeats and deadlines; fire due timers."""

    _timers_said: frozenset[int] = frozenset()  # partitions whose timers' wrong kind was said
    _keys_said: frozenset[str] = frozenset()  # keys of the wrong kind due timers were left for

    def complete_activity(self, outcome: AttemptOutcome) -> tuple[str, int]:
        """Finish an attempt (see :meth:`complete_args`); returns ``('OK'|'RETRY'|'STALE', due ms
        of the retry or 0)``."""
        return self.complete_many([outcome])[0]

    def complete_many(self, outcomes: Sequence[AttemptOutcome]) -> list[tuple[str, int]]:
        """Finish several attempts in one round trip (each one atomic on its own)."""
        calls = [self.complete_args(outcome) for outcome in outcomes]
        replies = self._script_many("complete_activity", calls, raise_on_error=True)
        return [(text(reply[0]), int(reply[1]) if text(reply[0]) == "RETRY" else 0) for reply in replies]

    def complete_then_load(
        self,
        outcomes: Sequence[AttemptOutcome],
        runs: Sequence[RunToLoad],
        *,
        taker: str = "",
        sticky: str = "",
    ) -> Completions:
        """:meth:`complete_many`, then the decision loads of ``runs`` in the same round trip (on a
        cluster, one write per node), after the completions.

        ``taker``, ``sticky``: the calling worker's consumer name and private queue. A completion
        that enqueues its run's workflow task then also reads, for the worker, the oldest task
        waiting in the worker's private stream of that partition (where the task went when the
        run is sticky to it), so the worker decides it without a read of its own.
        """
        calls = [self.complete_args(outcome, taker=taker, sticky=sticky) for outcome in outcomes]
        sha = self._scripts["complete_activity"].sha
        groups = loads.batches(self.keys, runs, cluster=self.cluster) if runs else []
        replies, results = self._wire.execute_then_transactions(
            [("EVALSHA", sha, len(keys), *keys, *args) for keys, args in calls],
            [commands for _, commands in groups],
        )
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        done = [(text(r[0]), int(r[1]) if text(r[0]) != "STALE" else 0) for r in replies]
        handed = [
            ClaimedTask.read(keys[7], *r[2])
            for (keys, _), r in zip(calls, replies, strict=True)
            if len(r) > 2
        ]
        if not runs:
            return Completions(done, None, handed)
        try:
            read = [transaction_result(result) for result in results]
        except redis.RedisError:
            return Completions(done, None, handed)
        return Completions(done, loads.loaded(len(runs), [indexes for indexes, _ in groups], read), handed)

    def complete_args(
        self, outcome: AttemptOutcome, *, taker: str = "", sticky: str = ""
    ) -> tuple[list[str], list[Any]]:
        """Keys and arguments of the completion script (``lua/complete_activity.lua``); with
        ``taker``, it reads the woken task for that worker (:meth:`complete_then_load`)."""
        k, task = self.keys, outcome.task
        p, rid = task.partition, task.run_id
        event = outcome.event
        type_name, data = ev.encode_input_data(event) if event is not None else ("", b"")
        keys = [k.run(p, rid), k.inbox(p, rid), k.activities(p, rid), k.log(p, rid)]
        keys += [k.timers(p), k.running(p), outcome.stream]
        args = [
            rid,
            task.activity_id,
            task.attempt,
            outcome.entry_id,
            outcome.outcome,
            type_name,
            data,
            outcome.retry_delay_ms,
            outcome.next_task.encode() if outcome.next_task is not None else b"",
            # An error message or traceback may quote user data: encrypted like payloads.
            codec.pack(seal_fields(outcome.record)),
        ]
        if taker:
            keys.append(k.workflow_tasks(p, sticky))
        if taker or outcome.kept:
            args.append(taker)
        if outcome.kept:
            args.append("1")
        return keys, args

    def heartbeat(self, task: ActivityTask, details: bytes, extend_ms: int) -> bool:
        """Record a heartbeat of ``task``'s attempt (push its deadline by ``extend_ms`` unless 0);
        returns True when the activity was cancelled or superseded."""
        k, p = self.keys, task.partition
        result = self._run_script(
            "heartbeat",
            [k.activities(p, task.run_id), k.running(p)],
            [task.run_id, task.activity_id, task.attempt, details, extend_ms],
        )
        return int(result) == 1

    def begin_attempt(
        self,
        task: ActivityTask,
        stream: str,
        entry_id: str,
        due_ms: int,
        started_ms: int,
        worker: str = "",
    ) -> Begun:
        """Begin ``task``'s attempt before its code runs (``lua/begin_attempt.lua``), in one round trip.

        Refused unless the run is open and the attempt is still the activity's current one
        (a terminated, cancelled or closed run's queued tasks become no-ops here; the task
        entry ``entry_id`` of ``stream`` is then acked and deleted). A begun attempt is marked
        started at ``started_ms`` by ``worker`` (which ``describe`` checks is alive), gets its
        deadline ``due_ms`` (0: none), and the activity's last heartbeat details.
        """
        # Every activity attempt passes here: the raw pipeline (one EVALSHA, on a cluster
        # redis-py's) skips the Script object's layers (~9 % of a worker's CPU in W2).
        reply = self._script_many(
            "begin_attempt",
            [
                (
                    [*self._attempt_keys(task, stream), self.keys.log(task.partition, task.run_id)],
                    [task.run_id, task.activity_id, task.attempt, entry_id, due_ms, started_ms, worker],
                )
            ],
            raise_on_error=True,
        )[0]
        if text(reply[0]) != "OK":
            return Begun(False, text(reply[1]))
        return Begun(True, "", bytes(reply[1]) or None, int(reply[2]))

    def _attempt_keys(self, task: ActivityTask, last: str) -> list[str]:
        """The keys of the scripts that begin or give back an attempt: its run, its activities
        hash, its partition's running set, then ``last`` (its stream, or the sessions set)."""
        k, p = self.keys, task.partition
        return [k.run(p, task.run_id), k.activities(p, task.run_id), k.running(p), last]

    def attempt_started(self, p: int, run_id: str, activity_id: str) -> int | None:
        """When the current attempt of an activity started (ms), if it registered a deadline."""
        value = self.redis.hget(self.keys.activities(p, run_id), started_field(activity_id))
        return int(value) if value is not None else None

    def attempts_begun(self, p: int, run_id: str, activity_ids: Sequence[str]) -> dict[str, AttemptBegun]:
        """Of each pending activity in ``activity_ids``: its current attempt, and when and by
        which worker that attempt began (``started_ms`` 0 and ``worker`` "": not begun yet)."""
        if not activity_ids:
            return {}
        fields = [
            f for aid in activity_ids for f in (attempt_field(aid), started_field(aid), worker_field(aid))
        ]
        values = self.redis.hmget(self.keys.activities(p, run_id), fields)
        out = {}
        for i, aid in enumerate(activity_ids):
            current, started, begun_by = values[3 * i : 3 * i + 3]
            if current is None:
                continue  # no longer pending
            attempt = int(current)
            began, worker, _ = parse_begun_by(text(begun_by or b""))
            if began == attempt:
                out[aid] = AttemptBegun(attempt, int(started or 0), worker)
            else:  # the last attempt begun is an older one: this one waits for a worker
                out[aid] = AttemptBegun(attempt)
        return out

    def attempt_begins(self, p: int, run_id: str, activity_id: str) -> Begins | None:
        """How often the current attempt of a pending activity has begun, and who began it last
        (``None``: the activity is not pending)."""
        fields = (attempt_field(activity_id), started_field(activity_id), worker_field(activity_id))
        current, started, begun_by = self.redis.hmget(self.keys.activities(p, run_id), fields)
        if current is None:
            return None
        attempt = int(current)
        began, worker, begins = parse_begun_by(text(begun_by or b""))
        if began != attempt:
            return Begins(attempt)
        return Begins(attempt, begins, worker, int(started or 0))

    def rerun_leased(self, task: ActivityTask) -> bool:
        """Put the current attempt of a leased activity whose lease lapsed (its worker died) in
        its queue's stream, as the same attempt (``lua/rerun_attempt.lua``), once; False when
        another scheduler did, or the attempt is no longer current, or its run closed."""
        k, p, rid = self.keys, task.partition, task.run_id
        keys = [k.run(p, rid), k.activities(p, rid), k.sessions(p), k.running(p)]
        return int(self._run_script("rerun_attempt", keys, [rid, task.activity_id, task.attempt])) == 1

    def return_tasks(self, worker: str, tasks: Sequence[tuple[str, str, ActivityTask, bool]]) -> int:
        """Give back activity tasks ``worker`` holds but never started, ``(stream, entry id, task,
        begun by its claim)`` each: to the end of their streams, for any worker, with a begin by
        the claim undone (``lua/return_task.lua``), in one round trip. Returns how many went back
        (the others were taken over by another worker meanwhile)."""
        calls = [
            (
                self._attempt_keys(t, stream),
                [GROUP, worker, entry_id, t.run_id, t.activity_id, t.attempt, 1 if claimed else 0],
            )
            for stream, entry_id, t, claimed in tasks
        ]
        return sum(int(n) for n in self._script_many("return_task", calls, raise_on_error=True))

    def return_leases(self, tasks: Sequence[ActivityTask]) -> int:
        """Give back leased attempts a worker holds but never started: each to its activity
        queue's stream as the same attempt, its lease or deadline dropped
        (``lua/return_lease.lua``), in one round trip. Returns how many went to their queues
        (the others have nothing to run: no longer current, or their run closed)."""
        calls = [
            (self._attempt_keys(t, self.keys.sessions(t.partition)), [t.run_id, t.activity_id, t.attempt])
            for t in tasks
        ]
        return sum(int(n) for n in self._script_many("return_lease", calls, raise_on_error=True))

    def pending_attempts(
        self, p: int, run_id: str, steps: Sequence[Mapping[str, Any]]
    ) -> dict[str, AttemptBegun]:
        """:meth:`attempts_begun` for a run's pending ``steps`` (its snapshot's), each attempt not
        begun yet with what it waits for: its retry time (``retry_due_ms``), the thread of the
        worker it is leased to (``leased``), or else a worker, with the ``backlog`` of its queue
        (:meth:`queued_activity_tasks`): what ``durable describe`` says of it."""
        queue_of = {str(s["id"]): str(s.get("queue") or "") for s in steps if s.get("kind") == "activity"}
        begun = self.attempts_begun(p, run_id, list(queue_of))
        idle = [aid for aid, b in begun.items() if not b.worker]
        if idle:
            # A retry waits for its time (a timer) before its task is queued; a leased attempt
            # (eager mode, a local activity) has its lease or deadline before it begins.
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.zmscore(self.keys.timers(p), [retry_member(run_id, aid) for aid in idle])
                pipe.zmscore(
                    self.keys.running(p), [attempt_member(run_id, aid, begun[aid].attempt) for aid in idle]
                )
                due, held = pipe.execute()
            for aid, ms, lease in zip(idle, due, held, strict=True):
                if ms is not None:
                    begun[aid] = replace(begun[aid], retry_due_ms=int(ms))
                elif lease is not None:
                    begun[aid] = replace(begun[aid], leased=True)
        waiting = {queue_of[aid] for aid in idle if _in_queue(begun[aid]) and queue_of[aid]}
        if not waiting:
            return begun
        backlog = self.queued_activity_tasks(sorted(waiting))
        return {
            aid: replace(b, backlog=backlog[queue_of[aid]]) if _in_queue(b) and queue_of[aid] else b
            for aid, b in begun.items()
        }

    def queued_activity_tasks(self, queues: Sequence[str]) -> dict[str, int]:
        """Per queue, the activity tasks waiting in its streams (over every partition) that no
        worker has read yet: a stream's length less its pending entries (acknowledged tasks are
        deleted). What a worker took but has not started counts as pending, not here: so workers
        read no more than they can start (:mod:`workers.pace`)."""
        streams = [(q, self.keys.activity_tasks(p, q)) for q in queues for p in range(self.keys.partitions)]
        out = dict.fromkeys(queues, 0)
        for indexes in self._by_node([stream for _, stream in streams]).values():
            with self.pipeline(streams[indexes[0]][1], transaction=False) as pipe:
                for i in indexes:
                    pipe.xlen(streams[i][1])
                    pipe.xinfo_groups(streams[i][1])
                replies = pipe.execute(raise_on_error=False)
            for n, i in enumerate(indexes):
                out[streams[i][0]] += unread(replies[2 * n], replies[2 * n + 1])
        return out

    def activity_state(
        self, p: int, run_id: str, activity_id: str
    ) -> tuple[ActivityTask | None, bytes | None]:
        """(current attempt, last heartbeat details) of a pending activity (``None``: not pending)."""
        key = self.keys.activities(p, run_id)
        body, details = self.redis.hmget(key, activity_id, heartbeat_field(activity_id))
        return (ActivityTask.decode(body) if body is not None else None), details

    def delivery_count(self, stream: str, entry_id: str) -> int:
        """How many times a pending task entry has been delivered (0 if it is not pending)."""
        rows = self.redis.xpending_range(stream, GROUP, min=entry_id, max=entry_id, count=1)
        return int(rows[0]["times_delivered"]) if rows else 0

    # ------------------------------------------------------ timers, deadlines
    def fire_timers(self, parts: Sequence[int], limit: int = 500) -> list[tuple[int, int, int]]:
        """Fire due timers and retries of partitions ``parts`` (one script each, one round trip):
        ``(members taken, next due ms or -1, workflow timers and retry backoffs fired)`` per
        partition (the first also counts hand-backs of tasks, workflow timeouts and members of
        closed runs)."""
        calls = [([self.keys.timers(p)], [self.keys.tag(p), limit]) for p in parts]
        replies = self._script_many("fire_timers", calls, raise_on_error=False)
        out = []
        later: int | None = None  # members left for a key of the wrong kind: tried again in 5 s
        for p, reply in zip(parts, replies, strict=True):
            if not isinstance(reply, Exception):
                next_due = int(reply[1])
                if len(reply) > 3 and reply[3]:
                    self._say_left(p, reply[3])
                    later = later or self.server_time_ms() + 5_000  # one read for all partitions
                    next_due = max(next_due, later)
                out.append((int(reply[0]), next_due, int(reply[2])))
                self._timers_said = self._timers_said - {p}
            elif is_wrong_type(reply):
                # One partition's timers (or a key they write) of another kind: the others fire on.
                if p not in self._timers_said:
                    self._timers_said = self._timers_said | {p}
                    wrong = self.wrong_types({self.keys.timers(p): "zset", self.keys.running(p): "zset"})
                    log.error(
                        "timers of partition %d cannot fire: %s (made by hand, or by another program "
                        "sharing the database); delete or rename the key -- the other partitions' fire",
                        p,
                        "; ".join(wrong) or reply,
                    )
                out.append((0, -1, 0))
            else:
                self.skip_migrating(p, reply)  # that partition's timers wait; the others' fire
                out.append((0, -1, 0))
        return out

    def _say_left(self, p: int, left: Sequence[Sequence[bytes]]) -> None:
        """Say, once per key, the due timers of partition ``p`` left in place because a key of their
        run holds another kind of value."""
        for member, key, kind, expected in left:
            said = text(key)
            if said in self._keys_said:
                continue
            self._keys_said = self._keys_said | {said}
            log.error(
                "timer %s of partition %d cannot fire: %s is a %s, not a %s (made by hand, or by another "
                "program sharing the database); it stays due and fires once the key is deleted or renamed",
                text(member),
                p,
                said,
                text(kind),
                text(expected),
            )

    def expired_attempts(self, p: int, now_ms: int, limit: int = 100) -> list[tuple[str, str, int]]:
        """Attempts whose start-to-close or heartbeat deadline has passed: (run, activity, attempt)."""
        members = self.redis.zrangebyscore(self.keys.running(p), "-inf", now_ms, start=0, num=limit)
        out, foreign = [], []
        for member in members:
            try:
                out.append(parse_attempt_member(member.decode()))
            except ValueError:  # UnicodeDecodeError too: no attempt of ours; it would come back every pass
                foreign.append(member)
        if foreign:
            self.redis.zrem(self.keys.running(p), *foreign)
            log.warning(
                "removed %d member(s) of %s that name no attempt (run|activity|attempt): %s",
                len(foreign),
                self.keys.running(p),
                ", ".join(repr(m[:80]) for m in foreign[:5]),
            )
        return out

    def take_expiry(
        self, p: int, run_id: str, activity_id: str, attempt: int, now_ms: int, hold_ms: int
    ) -> bool:
        """Take an attempt's passed deadline to deal with it (``lua/take_expiry.lua``): whether this
        call took it. Every worker's scheduler reads the expired deadlines; the one that takes it
        deals with the attempt, so a timeout is recorded once. The deadline moves ``hold_ms`` on
        until what deals with it removes it: a taker that dies first leaves it to another."""
        member = attempt_member(run_id, activity_id, attempt)
        return (
            int(self._run_script("take_expiry", [self.keys.running(p)], [member, now_ms, now_ms + hold_ms]))
            == 1
        )

    def drop_deadline(self, p: int, run_id: str, activity_id: str, attempt: int) -> bool:
        """Forget an attempt's deadline (dealt with, or of an attempt no longer current): whether
        this call removed it."""
        return bool(self.redis.zrem(self.keys.running(p), attempt_member(run_id, activity_id, attempt)))

    def next_deadlines(self, parts: Sequence[int]) -> list[int | None]:
        """The earliest running-attempt deadline (ms) of each partition in ``parts``, if any."""
        with self.redis.pipeline(transaction=False) as pipe:
            for p in parts:
                pipe.zrange(self.keys.running(p), 0, 0, withscores=True)
            firsts = pipe.execute(raise_on_error=False)
        out: list[int | None] = []
        for p, first in zip(parts, firsts, strict=True):
            if isinstance(first, Exception):
                self.skip_migrating(p, first)  # its deadlines wait; the others' expire
                first = None
            out.append(int(first[0][1]) if first else None)
        return out
