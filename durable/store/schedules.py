"""Schedules in Redis: records, claimed and buffered times, the runs they started, the indexes.

All keys of one schedule share the partition of its id (``keys.schedule_keys``), so each
script touches one slot. Which time is due and what the overlap policy does is decided in
:mod:`durable.schedule_pass`; every change here is one script in ``lua/schedule_*.lua``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from .base import StoreBase
from .keys import SENT_TTL_MS
from .memory import is_oom
from .records import text

SEP = "|"
"""Separator inside a claimed-time member: ``<scheduled ms>|<kind>|<overlap>``."""


def claim_member(scheduled_ms: int, kind: str, overlap: str) -> str:
    """The claimed/buffered member of one scheduled time."""
    return f"{scheduled_ms}{SEP}{kind}{SEP}{overlap}"


def parse_claim_member(member: str) -> tuple[int, str, str]:
    """``(scheduled ms, kind, overlap)`` of a claimed/buffered member."""
    ms, kind, overlap = member.split(SEP, 2)
    return int(ms), kind, overlap


@dataclass
class ScheduleState:
    """One consistent read of a schedule (see :meth:`ScheduleStore.schedule_state`).

    Attributes:
        record: The record's fields as text (``spec``, ``next``, ``paused``, ``fired``, ...);
            ``args`` stays bytes (a payload).
        claimed: ``(member, start due ms)`` of claimed times not yet started, soonest first.
        buffer: Members buffered by the overlap policy, oldest first.
        runs: ``(workflow id, scheduled ms)`` of the runs it started that were open when last seen.
        actions: Recent actions, newest first.
    """

    record: dict[str, Any]
    claimed: list[tuple[str, int]] = field(default_factory=list)
    buffer: list[str] = field(default_factory=list)
    runs: list[tuple[str, int]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)


def _record(raw: dict[Any, Any]) -> dict[str, Any]:
    return {text(k): (v if text(k) == "args" else text(v)) for k, v in raw.items()}


class ScheduleStore(StoreBase):
    """Schedules: their records and the scripts that claim and settle their times."""

    def _schedule_call(self, name: str, schedule_id: str, args: Sequence[Any]) -> str:
        p = self.keys.partition(schedule_id)
        return text(self._run_script(name, self.keys.schedule_keys(p, schedule_id), [schedule_id, *args]))

    def schedule_save(
        self,
        schedule_id: str,
        *,
        mode: str,
        spec: str,
        args: bytes,
        next_ms: int | None,
        paused: bool | None = None,
        note: str | None = None,
        action: dict[str, Any] | None = None,
    ) -> str:
        """Create (``mode="create"``) or update a schedule; ``'OK'``, ``'EXISTS'`` or ``'MISSING'``.
        ``paused``/``note``: ``None`` keeps the current one (a note ``""`` clears it)."""
        return self._schedule_call(
            "schedule_save",
            schedule_id,
            [
                mode,
                spec,
                args,
                "" if next_ms is None else next_ms,
                "" if paused is None else ("1" if paused else "0"),
                "" if note is None else "=" + note,  # '=' marks a note to set, even an empty one
                json.dumps(action) if action else "",
            ],
        )

    def schedule_state(self, schedule_id: str, actions: int = 20) -> ScheduleState | None:
        """The schedule's record, claimed and buffered times, runs and recent actions (one MULTI);
        ``None``: no such schedule."""
        p = self.keys.partition(schedule_id)
        keys = self.keys.schedule_keys(p, schedule_id)[:5]  # record, claimed, buffer, runs, actions
        try:
            raw, got_claimed, got_buffer, got_runs, got_actions = self._schedule_reads(keys, actions, True)
        except redis.ResponseError as exc:
            if not is_oom(exc):
                raise
            # At maxmemory Redis refuses the EXEC, reads and all: read them one after another,
            # so that `schedule list` can say what is wrong (Redis refusing writes) at all.
            raw, got_claimed, got_buffer, got_runs, got_actions = self._schedule_reads(keys, actions, False)
        if not raw:
            return None
        return ScheduleState(
            record=_record(raw),
            claimed=[(text(m), int(s)) for m, s in got_claimed],
            buffer=[text(m) for m in got_buffer],
            runs=[(text(m), int(s)) for m, s in got_runs],
            actions=[json.loads(a) for a in got_actions],
        )

    def _schedule_reads(self, keys: Sequence[str], actions: int, transaction: bool) -> list[Any]:
        record, claimed, buffer, runs, recent = keys
        with self.pipeline(record, transaction=transaction) as pipe:
            pipe.hgetall(record)
            pipe.zrange(claimed, 0, -1, withscores=True)
            pipe.lrange(buffer, 0, -1)
            pipe.zrange(runs, 0, -1, withscores=True)
            pipe.lrange(recent, 0, actions - 1)
            return list(pipe.execute())

    def schedule_claim(
        self,
        schedule_id: str,
        *,
        token: str,
        expected: int | None,
        next_ms: int | None,
        last_ms: int | None,
        count: int,
        items: Sequence[tuple[int, str]],
        action: dict[str, Any] | None = None,
    ) -> str:
        """Claim scheduled times (``items``: ``(start due ms, member)``) and move the next time
        from ``expected`` to ``next_ms`` (``expected=None``: add the items only: trigger, backfill).
        ``'OK'``, ``'STALE'`` (another scheduler claimed first), ``'LOST'`` or ``'MISSING'``."""
        pairs: list[Any] = [x for due, member in items for x in (due, member)]
        return self._schedule_call(
            "schedule_claim",
            schedule_id,
            [
                token,
                "*" if expected is None else expected,
                "" if next_ms is None else next_ms,
                "" if last_ms is None else last_ms,
                count,
                json.dumps(action) if action else "",
                *pairs,
            ],
        )

    def schedule_settle(
        self,
        schedule_id: str,
        *,
        token: str,
        op: str,
        member: str = "",
        workflow_id: str = "",
        scheduled_ms: int = 0,
        action: dict[str, Any] | None = None,
    ) -> str:
        """Settle one time (``op``: start_claimed, start_buffered, skip, buffer, replace_buffer,
        drop_buffered, forget; see ``lua/schedule_settle.lua``); ``'OK'``, ``'GONE'``, ``'LOST'`` or ``'MISSING'``."""
        return self._schedule_call(
            "schedule_settle",
            schedule_id,
            [token, op, member, workflow_id, scheduled_ms, json.dumps(action) if action else ""],
        )

    def schedule_failing(self, schedule_id: str, note: str) -> None:
        """Note on the schedule's record why its passes fail (``"<ms>|<error>"``; ``""``
        clears it): ``describe`` says it (a stalled schedule said "active", no reason)."""
        p = self.keys.partition(schedule_id)
        self._run_script("schedule_failing", [self.keys.schedule(p, schedule_id)], [note])

    def schedule_lock(self, schedule_id: str, token: str, ttl_ms: int) -> bool:
        """Take the schedule's lock for ``ttl_ms`` (``False``: another scheduler holds it)."""
        p = self.keys.partition(schedule_id)
        return bool(self.redis.set(self.keys.schedule_keys(p, schedule_id)[5], token, nx=True, px=ttl_ms))

    def schedule_unlock(self, schedule_id: str, token: str) -> None:
        """Release the lock if it is still ours."""
        p = self.keys.partition(schedule_id)
        self._run_script("schedule_unlock", [self.keys.schedule_keys(p, schedule_id)[5]], [token])

    def schedule_delete(self, schedule_id: str, *, call_id: str = "") -> bool:
        """Delete the schedule (its runs are left alone); ``False``: there was none.

        ``call_id``: the client call's id; the same call sent again after its reply was lost
        finds the note its delete left (``True``), and a resend whose first try never ran still
        finds no schedule (``False``)."""
        p = self.keys.partition(schedule_id)
        keys = self.keys.schedule_keys(p, schedule_id)
        args: list[Any] = [schedule_id]
        if call_id:
            keys.append(self.keys.sent_input(p, call_id))
            args.append(SENT_TTL_MS)
        return text(self._run_script("schedule_delete", keys, args)) == "1"

    def schedule_ids(self) -> list[str]:
        """Every schedule id, sorted."""
        ids: set[str] = set()
        for p in range(self.keys.partitions):
            ids.update(text(m) for m in self.redis.smembers(self.keys.schedules_all(p)))
        return sorted(ids)

    def schedule_work(self, now_ms: int, limit: int = 500) -> tuple[list[str], int | None]:
        """Schedules to look at now (a time due, or claimed/buffered times waiting) and the
        soonest next time of the others (ms; ``None``: none)."""
        parts = range(self.keys.partitions)
        replies: list[Any] = []
        for p in parts:
            due, busy = self.keys.schedules_due(p), self.keys.schedules_busy(p)
            with self.pipeline(due, transaction=False) as pipe:
                pipe.zrangebyscore(due, "-inf", now_ms, start=0, num=limit)
                pipe.smembers(busy)
                pipe.zrange(due, 0, 0, withscores=True)
                got = pipe.execute(raise_on_error=False)
            failed = next((r for r in got if isinstance(r, Exception)), None)
            if failed is not None:
                self.skip_migrating(p, failed)  # its schedules wait; the others' run
                continue
            replies.append(got)
        work: dict[str, None] = {}
        soonest: int | None = None
        for ids, busy_ids, first in replies:
            work.update((text(m), None) for m in ids)
            work.update((text(m), None) for m in busy_ids)
            if first:
                score = int(first[0][1])
                soonest = score if soonest is None else min(soonest, score)
        return list(work), soonest

    def instance_statuses(self, workflow_ids: Sequence[str]) -> list[str | None]:
        """The status of each workflow id's current run (``None``: no such workflow), in one
        pipelined round trip (``describe`` asks it for every pending child of a fan-out)."""
        if not workflow_ids:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for wid in workflow_ids:
                pipe.hget(self.keys.instance(self.keys.partition(wid), wid), "status")
            replies = pipe.execute()
        return [None if status is None else text(status) for status in replies]

    def mark_scheduled_run(self, workflow_id: str, run_id: str, schedule_id: str, scheduled_ms: int) -> None:
        """Record on the run which schedule started it and for which time (``durable describe``
        and the run record show them; the WorkflowStarted options carry them too)."""
        p = self.keys.partition(workflow_id)
        self.redis.hset(
            self.keys.run(p, run_id), mapping={"schedule_id": schedule_id, "scheduled_at": scheduled_ms}
        )
