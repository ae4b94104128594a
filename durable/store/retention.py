"""Purging closed runs: the scheduler's retention pass and ``durable purge``.

Every script here touches one partition and does bounded work (at most
``batch`` runs, or one ``count``-sized step of a scan), so a purge never holds
Redis for long however much is due: callers loop, a pipeline of one script per
partition per round trip. Which retention applies, and why 3 days by default:
:mod:`durable.retention`.

* :class:`Purger` -- the pass each worker's scheduler runs every ``interval``
  seconds: runs whose retention ended (the ``T:closed`` index, written by the
  scripts that close a run), hook tokens of purged runs, dead letters older than
  the namespace retention whose run is closed or gone.
* :func:`purge_closed_before` -- ``durable purge``: runs closed before a date,
  found through the runs index (so runs closed before retention existed, which
  have no ``T:closed`` entry, are found too), optionally of one type, or only counted.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..retention import DEFAULT_RETENTION, retention_ms
from .connect import first_line, is_transient
from .redis_store import CLOSED_STATUSES, RedisStore

log = logging.getLogger("durable.retention")

__all__ = [
    "PurgeReport",
    "Purger",
    "namespace_retention_ms",
    "purge_closed_before",
    "set_namespace_retention",
    "stored_retention_ms",
]


def set_namespace_retention(store: RedisStore, value: Any) -> int:
    """Set the namespace's retention (``timedelta``, seconds or ``"7d"``) for runs that close
    from now on; returns it in ms. Written into every partition (the closing scripts read
    their own partition's copy: one slot per script on a cluster)."""
    ms = retention_ms(value, "namespace retention")
    with store.redis.pipeline(transaction=False) as pipe:
        for p in range(store.keys.partitions):
            pipe.set(store.keys.retention(p), ms)
        pipe.execute()
    return ms


def namespace_retention_ms(store: RedisStore) -> int:
    """The namespace's retention in ms (the default when none was set)."""
    stored = stored_retention_ms(store)
    return stored if stored is not None else int(DEFAULT_RETENTION.total_seconds() * 1000)


def stored_retention_ms(store: RedisStore) -> int | None:
    """The namespace's retention as set (``--retention``), in ms; ``None``: never set (or lost)."""
    value = store.redis.get(store.keys.retention(0))
    return int(value) if value is not None else None


@dataclass
class PurgeReport:
    """What a purge removed (or, dry, would remove)."""

    runs: Counter[str] = field(default_factory=Counter)
    """Runs by status."""
    instances: int = 0
    """Instance records (the purged run was its workflow id's current run)."""
    events: int = 0
    """History events of those runs."""
    hooks: int = 0
    """Hook tokens whose run is gone."""
    dead_letters: int = 0
    """Dead letters past the cutoff whose run is closed or gone."""
    skipped_open: int = 0
    """Runs found open when the script ran (never purged)."""

    @property
    def total_runs(self) -> int:
        return sum(self.runs.values())


class Purger:
    """The scheduler's retention pass: purges runs whose retention ended, in bounded batches.

    Args:
        store: The store.
        interval: Seconds between passes (a pass that left work due runs again at once).
        batch: Runs per script call (one call per partition per round trip).
        rounds: Round trips per pass at most; what is left waits for the next pass.
        sweep_count: Hash fields / stream entries examined per partition per sweep step.
        sweep_budget_s: Longest the dead-letter sweep of one pass goes on taking steps (it also
            stops after ``rounds`` steps), so a backlog cannot stall the scheduler's timers.
    """

    def __init__(
        self,
        store: RedisStore,
        *,
        interval: float = 10.0,
        batch: int = 50,
        rounds: int = 20,
        sweep_count: int = 200,
        sweep_budget_s: float = 0.25,
    ) -> None:
        self.store = store
        self.interval = interval
        self.batch = batch
        self.rounds = rounds
        self.sweep_count = sweep_count
        self.sweep_budget_s = sweep_budget_s
        self._next = 0.0
        self._hook_cursors = ["0"] * store.keys.partitions
        self._dead_cursors = ["-"] * store.keys.partitions
        self.purged = 0
        #: Dead letters this purger deleted (expired, their run closed or gone).
        self.dead_swept = 0

    def tick(self, now: float | None = None) -> None:
        """Run a pass if one is due (called from the scheduler's loop)."""
        now = time.monotonic() if now is None else now
        if now < self._next:
            return
        try:
            backlog = self.run_pass()
        except Exception as exc:  # noqa: BLE001 - purging can wait; timers and reclaims must not
            if is_transient(exc):  # Redis unavailable for now (an outage, a slot migrating): no bug
                log.warning("retention pass failed (%s); retrying in %.0f s", first_line(exc), self.interval)
            else:
                log.exception("retention pass failed; retrying in %.0f s", self.interval)
            backlog = False
        self._next = now if backlog else now + self.interval

    def run_pass(self) -> bool:
        """One pass over every partition; returns True when runs were left due, or expired dead
        letters still being deleted when the pass's budget ran out (backlog)."""
        parts = list(range(self.store.keys.partitions))
        backlog = False
        for _ in range(self.rounds):
            replies = purge_due(self.store, parts, self.batch)
            done = sum(int(r[0]) for r in replies)
            self.purged += done
            if done:
                log.info("purged %d closed run(s) past their retention", done)
            parts = [p for p, r in zip(parts, replies, strict=True) if int(r[0]) + int(r[2]) >= self.batch]
            if not parts:
                break
        else:
            backlog = True
        self._sweep_hooks()
        return self._sweep_dead() or backlog

    def _sweep_hooks(self) -> None:
        parts = range(self.store.keys.partitions)
        calls = [([self.store.keys.hooks(p)], [self._hook_cursors[p], self.sweep_count, "0"]) for p in parts]
        for p, (cursor, _) in zip(parts, self._script("sweep_hooks", calls), strict=True):
            self._hook_cursors[p] = _s(cursor)

    def _sweep_dead(self) -> bool:
        """Delete expired dead letters: a step per partition, then again for the partitions whose
        step examined a full batch (more may be due), up to :attr:`rounds` round trips and
        :attr:`sweep_budget_s` seconds. One step per pass (200 entries every 10 s) let poison
        input above ~20 letters/s per partition outgrow its retention, and took minutes to clear
        a backlog.

        Returns True when the budget ran out while its last step still deleted letters (the
        caller runs the next pass at once, as for runs). Letters of open runs are kept and only
        walked past: a stream full of those waits for the next pass, where the scan resumes
        (after reaching the cutoff it starts over at the stream's head)."""
        k, parts = self.store.keys, list(range(self.store.keys.partitions))
        ends = time.monotonic() + self.sweep_budget_s
        before, deleted = self.dead_swept, 0
        for _ in range(self.rounds):
            calls = [([k.dead(p)], [self._dead_cursors[p], self.sweep_count, "", "0"]) for p in parts]
            replies = self._script("sweep_dead", calls)
            deleted = sum(int(gone) for _, gone in replies)
            self.dead_swept += deleted
            for p, (last, _) in zip(parts, replies, strict=True):
                self._dead_cursors[p] = "(" + _s(last) if last else "-"
            parts = [p for p in parts if self._dead_cursors[p] != "-"]
            if not parts or time.monotonic() >= ends:
                break
        if self.dead_swept > before:
            log.info("deleted %d expired dead letter(s)", self.dead_swept - before)
        return bool(parts) and deleted > 0

    def _script(self, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        return run_scripts(self.store, name, calls)


def run_scripts(store: RedisStore, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
    """Run one of the store's scripts once per ``(keys, args)`` in a round trip per server."""
    return store._script_many(name, calls, raise_on_error=True)  # noqa: SLF001 - the store's batching


def purge_due(store: RedisStore, parts: Sequence[int], batch: int) -> list[Any]:
    """Purge up to ``batch`` runs whose retention ended in each partition of ``parts``:
    ``[purged, instances removed, open skipped]`` per partition."""
    k = store.keys
    calls = [([k.closed(p), k.runs(p), k.blocked(p)], ["due", batch]) for p in parts]
    return run_scripts(store, "purge_runs", calls)


def purge_closed_before(
    store: RedisStore,
    cutoff_ms: int,
    *,
    workflow_type: str | None = None,
    dry_run: bool = False,
    batch: int = 100,
) -> PurgeReport:
    """Purge (or with ``dry_run`` only count) the runs closed before ``cutoff_ms`` (epoch ms),
    of ``workflow_type`` when given, with their instance records when current; then the hook
    tokens of runs that are gone and the dead letters older than the cutoff whose run is closed
    or gone (with ``workflow_type``, closed and of that type). Every script call handles at
    most ``batch`` runs of one partition."""
    report = PurgeReport()
    dry = "1" if dry_run else "0"
    k = store.keys
    for p in range(k.partitions):
        # Before the runs: a letter's run type is read from its record, which the purge deletes.
        start = "-"
        while True:
            args = [start, batch, cutoff_ms, dry, workflow_type or ""]
            last, gone = run_scripts(store, "sweep_dead", [([k.dead(p)], args)])[0]
            report.dead_letters += int(gone)
            if not last:
                break
            start = "(" + _s(last)
    for p in range(k.partitions):
        _purge_partition(store, p, cutoff_ms, workflow_type, dry_run, batch, report)
    for p in range(k.partitions):
        cursor = "0"
        while True:
            cursor, gone = run_scripts(store, "sweep_hooks", [([k.hooks(p)], [cursor, batch, dry])])[0]
            report.hooks += int(gone)
            if _s(cursor) == "0":
                break
    return report


def _purge_partition(
    store: RedisStore,
    p: int,
    cutoff_ms: int,
    workflow_type: str | None,
    dry_run: bool,
    batch: int,
    report: PurgeReport,
) -> None:
    """Walk partition ``p``'s runs index (created before the cutoff: a run closed before it was
    created before it) a page at a time; purge the closed ones that match."""
    k = store.keys
    offset = 0
    while True:
        rids = [
            _s(r) for r in store.redis.zrangebyscore(k.runs(p), "-inf", cutoff_ms, start=offset, num=batch)
        ]
        if not rids:
            return
        with store.redis.pipeline(transaction=False) as pipe:
            for rid in rids:
                pipe.hmget(k.run(p, rid), "status", "closed", "type", "workflow_id")
                pipe.xlen(k.history(p, rid))
            rows = pipe.execute()
        chosen: list[str] = []
        wids: list[str] = []
        for i, rid in enumerate(rids):
            status, closed, wtype, wid = (_s(v) if v is not None else None for v in rows[2 * i])
            if status is not None and status not in CLOSED_STATUSES:
                continue  # open: never purged
            if status is not None and (closed is None or int(closed) >= cutoff_ms):
                continue
            if workflow_type is not None and wtype != workflow_type:
                continue
            chosen.append(rid)
            wids.append(wid or "")
            report.runs[status or "missing"] += 1
            report.events += int(rows[2 * i + 1])
        if chosen:
            with store.redis.pipeline(transaction=False) as pipe:
                for wid in wids:
                    pipe.hget(k.instance(p, wid), "run")
                current = pipe.execute()
            report.instances += sum(1 for rid, run in zip(chosen, current, strict=True) if _s(run) == rid)
        if chosen and not dry_run:
            purged, _, skipped = run_scripts(
                store, "purge_runs", [([k.closed(p), k.runs(p), k.blocked(p)], ["ids", len(chosen), *chosen])]
            )[0]
            report.skipped_open += int(skipped)
            # Runs not chosen stay in the index ahead of the next page.
            offset += len(rids) - int(purged)
        else:
            offset += len(rids)
        if len(rids) < batch:
            return


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
