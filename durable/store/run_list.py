"""The runs list of the operator surface: every partition's runs, newest first, filtered and paged.

:meth:`RunQueries.list_runs_page` reads the ``T:runs`` index of every partition
(run ids scored by their creation time) in chunks, merges them newest first and
reads only the light fields of each candidate's record (one pipelined ``HMGET``
per chunk). A page ends after ``limit`` matching runs or after ``scan`` candidates
(a rare filter over a large namespace), whichever comes first; either way its
``next`` cursor resumes where it stopped, so paging never skips nor repeats a run,
even among runs created in the same millisecond.

:meth:`RunQueries.list_runs` is the client's simpler list (``durable.list_runs``): whole records,
newest first, paged by creation time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from ..runinfo import blocked_reason
from .base import StoreBase
from .key_types import is_wrong_type
from .records import OPEN_STATUSES, decode_run, text
from .search import stored_attributes

__all__ = ["LIST_FIELDS", "ROW_FIELDS", "RunPage", "RunQueries", "list_row", "parse_cursor"]

LIST_FIELDS = (
    "workflow_id",
    "type",
    "status",
    "blocked",
    "blocked_kind",
    "queue",
    "build",
    "updated",
    "closed",
    "parent",
)
"""The run-record fields a list row carries (the snapshot and payloads are for describe)."""

ROW_FIELDS = (*LIST_FIELDS, "run_id", "partition", "created", "search_attributes")
"""The fields of a runs-list row, as ``durable list --json`` and ``GET /api/v1/workflows`` give it."""


def list_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """A runs-list row of a run record (:data:`ROW_FIELDS`; ``build`` as ``build_id``; search
    attributes decoded): none of the record's index or bookkeeping fields."""
    row = {k: record[k] for k in ROW_FIELDS if k in record}
    if row.get("status", "pending") not in OPEN_STATUSES:
        # Closed (terminated, say) while blocked: not blocked any more, as describe says; the
        # list showed "blocked ... repair it" for runs a repair refuses.
        row.pop("blocked", None)
        row.pop("blocked_kind", None)
    if "search_attributes" not in row:
        row["search_attributes"] = stored_attributes(record.get("sa"))
    row["build_id"] = row.pop("build", None) or None
    return row


_CHUNK = 200


@dataclass
class RunPage:
    """One page of :meth:`RunQueries.list_runs_page`.

    Attributes:
        runs: The matching run records, newest first (``run_id``, ``partition``, ``created``
            added to the :data:`LIST_FIELDS`, and an open run's ``snapshot``).
        next: The cursor of the next page (``"<created ms>:<run id>"``), or ``None``: no
            older run is left to look at.
        scanned: Candidates read for this page.
    """

    runs: list[dict[str, Any]] = field(default_factory=list)
    next: str | None = None
    scanned: int = 0


def _unreadable(key: str, exc: Exception) -> dict[str, Any]:
    """The row of a run whose record cannot be read (``WRONGTYPE``: made another kind of value by
    hand, or by another program sharing the database); it failed the whole list for everyone."""
    if not is_wrong_type(exc):
        raise exc
    return {
        "workflow_id": "?",
        "status": "pending",
        "blocked": f"HistoryCorrupt: its run record {key} is not a hash (made by hand, or by another program "
        "sharing the database): delete or rename the key, then start the run again",
        "blocked_kind": "history_corrupt",
        "snapshot": {},
    }


def parse_cursor(cursor: str) -> tuple[int, str]:
    """``(created ms, run id)`` of a page cursor; a bare number is a time (all runs before it).

    Raises:
        ValueError: not a cursor.
    """
    ms, _, rid = cursor.partition(":")
    return int(ms), rid


class RunQueries(StoreBase):
    """Reads of many runs at once for the operator surface (``durable server``)."""

    def list_runs_page(
        self,
        *,
        status: str | None = None,
        workflow_type: str | None = None,
        id_prefix: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        cursor: str | None = None,
        limit: int = 50,
        scan: int = 20_000,
    ) -> RunPage:
        """Runs of every partition, newest first, whose record matches every filter given.

        Args:
            status: A status word, or ``blocked`` (open runs with a recorded blocked reason).
            workflow_type: The workflow type name.
            id_prefix: The start of the workflow id.
            since_ms: Only runs created at or after this time (UTC ms).
            until_ms: Only runs created at or before this time (UTC ms).
            cursor: The ``next`` of the previous page (or a time: runs created before it).
            limit: At most this many runs.
            scan: At most this many candidates read (the page then ends early, with a cursor).

        Raises:
            ValueError: a malformed cursor.
        """
        page = RunPage()
        top: tuple[int, str] | None = None
        if cursor:
            ms, rid = parse_cursor(cursor)
            top = (ms, rid) if rid else (ms - 1, "\U0010ffff")
        if until_ms is not None and (top is None or (until_ms, "\U0010ffff") < top):
            top = (until_ms, "\U0010ffff")
        lower = since_ms if since_ms is not None else None
        # Blocked runs have their own index: old ones are found without scanning every run.
        index = self.keys.blocked if status == "blocked" else self.keys.runs
        while len(page.runs) < limit and page.scanned < scan:
            batch, more = self._candidates(index, top, lower, min(_CHUNK, scan - page.scanned))
            if not batch:
                return page
            records = self._light_records(batch)
            for (created, p, rid), raw in zip(batch, records, strict=True):
                page.scanned += 1
                top = (created, rid)
                if raw and _matches(raw, status, workflow_type, id_prefix):
                    raw.update(run_id=rid, partition=p, created=created)
                    page.runs.append(raw)
                    if len(page.runs) >= limit:
                        break
            if not more and top == (batch[-1][0], batch[-1][2]):
                return page
        page.next = f"{top[0]}:{top[1]}" if top is not None else None
        return page

    def blocked_runs(
        self, *, workflow_type: str | None = None, kind: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every open run with a recorded blocked reason (newest first), optionally only those of
        one workflow type and/or one :data:`durable.runinfo.BLOCKED_KINDS` kind -- what
        ``durable repair --blocked`` re-queues after a fixed deploy."""
        cursor = None
        while True:
            page = self.list_runs_page(
                status="blocked", workflow_type=workflow_type, cursor=cursor, limit=500
            )
            for run in page.runs:
                if kind is None or getattr(blocked_reason(run), "kind", None) == kind:
                    yield run
            if page.next is None:
                return
            cursor = page.next

    def _candidates(
        self, index: Callable[[int], str], top: tuple[int, str] | None, lower: int | None, count: int
    ) -> tuple[list[tuple[int, int, str]], bool]:
        """The next ``count`` (or fewer) run ids of ``index`` (a partition's runs by creation
        time) below ``top`` over all partitions, newest first, and whether older ones may remain.

        Each partition gives its ``count`` newest below ``top`` (plus those tied with ``top``'s
        millisecond, filtered here: a zset cannot seek inside a score). Only candidates no
        partition can still precede are returned: those at or above the highest last item of
        the partitions that had more.
        """
        upper = "+inf" if top is None else str(top[0])
        low = "-inf" if lower is None else str(lower)
        with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.keys.partitions):
                if top is not None:
                    pipe.zcount(index(p), top[0], top[0])
            ties = pipe.execute() if top is not None else [0] * self.keys.partitions
        with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.keys.partitions):
                pipe.zrevrangebyscore(
                    index(p), upper, low, start=0, num=count + int(ties[p]), withscores=True
                )
            replies = pipe.execute()
        merged: list[tuple[int, int, str]] = []
        horizon: tuple[int, str] | None = None
        for p, rows in enumerate(replies):
            if len(rows) >= count + int(ties[p]) and rows:
                last = (int(rows[-1][1]), text(rows[-1][0]))
                horizon = last if horizon is None or last > horizon else horizon
            for member, score in rows:
                key = (int(score), text(member))
                if top is None or key < top:
                    merged.append((key[0], p, key[1]))
        merged.sort(key=lambda c: (c[0], c[2]), reverse=True)
        if horizon is not None:
            merged = [c for c in merged if (c[0], c[2]) >= horizon]
        return merged[:count], horizon is not None or len(merged) > count

    def _light_records(self, batch: list[tuple[int, int, str]]) -> list[dict[str, Any] | None]:
        """The :data:`LIST_FIELDS` of each run, and an open run's snapshot of its pending steps and
        its history's length: the rows say from them when an activity it waits on has no live
        worker to run it, or its history is full with only inputs to wait on."""
        fields = (*LIST_FIELDS, "snapshot", "seq")
        with self.redis.pipeline(transaction=False) as pipe:
            for _, p, rid in batch:
                pipe.hmget(self.keys.run(p, rid), fields)
            replies = pipe.execute(raise_on_error=False)
        out: list[dict[str, Any] | None] = []
        for (_, p, rid), values in zip(batch, replies, strict=True):
            if isinstance(values, Exception):  # one run's record of another kind: its row says so
                out.append(_unreadable(self.keys.run(p, rid), values))
                continue
            if values[0] is None:  # purged meanwhile
                out.append(None)
                continue
            raw = {k: v for k, v in zip(fields, values, strict=True) if v is not None}
            if text(raw.get("status", b"pending")) not in OPEN_STATUSES:
                raw.pop("snapshot", None)  # a closed run waits on nothing: not decoded
            out.append(decode_run(raw))
        return out

    def list_runs(
        self,
        *,
        status: str | None = None,
        workflow_type: str | None = None,
        limit: int = 50,
        before_ms: int | None = None,
        before_run_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Runs of every partition, newest first (``created`` desc, then ``run_id`` desc among
        runs of one millisecond), filtered by status and type.

        Page with ``before_ms`` and ``before_run_id`` = the ``created`` and ``run_id`` of the
        last row of the previous page: no run of that millisecond is skipped. ``before_ms``
        alone lists the runs created before that time.
        """
        upper = "+inf"
        ties = [0] * self.keys.partitions
        if before_ms is not None and before_run_id:
            # The cursor's own ms is read too (a zset cannot seek inside a score): its runs
            # at or above the cursor are dropped below.
            upper = str(before_ms)
            with self.redis.pipeline(transaction=False) as pipe:
                for p in range(self.keys.partitions):
                    pipe.zcount(self.keys.runs(p), before_ms, before_ms)
                ties = [int(n) for n in pipe.execute()]
        elif before_ms is not None:
            upper = f"({before_ms}"
        top = (before_ms, before_run_id) if before_ms is not None and before_run_id else None
        candidates: list[tuple[int, str, int]] = []
        for p in range(self.keys.partitions):
            rows = self.redis.zrevrangebyscore(
                self.keys.runs(p), upper, "-inf", start=0, num=limit * 4 + ties[p], withscores=True
            )
            keys = ((int(score), text(rid)) for rid, score in rows)
            candidates += [(created, rid, p) for created, rid in keys if top is None or (created, rid) < top]
        candidates.sort(reverse=True)  # (ms, run id) desc: the index's order, the cursor's too
        out: list[dict[str, Any]] = []
        for created, rid, p in candidates:
            try:
                raw = self.redis.hgetall(self.keys.run(p, rid))
            except redis.ResponseError as exc:  # one run's record of another kind: its row says so
                raw, record = {"status": b"pending"}, _unreadable(self.keys.run(p, rid), exc)
            else:
                record = decode_run(raw) if raw else {}
            if not raw:
                continue
            if (
                status is not None
                and record.get("status") != status
                and not (
                    status == "blocked" and record.get("blocked") and record.get("status") in OPEN_STATUSES
                )
            ):
                continue
            if workflow_type is not None and record.get("type") != workflow_type:
                continue
            record.update(run_id=rid, partition=p, created=created)
            out.append(record)
            if len(out) >= limit:
                break
        return out


def _matches(
    record: dict[str, Any], status: str | None, workflow_type: str | None, id_prefix: str | None
) -> bool:
    if status == "blocked":
        if not (record.get("blocked") and record.get("status") in OPEN_STATUSES):
            return False
    elif status is not None and record.get("status") != status:
        return False
    if workflow_type is not None and record.get("type") != workflow_type:
        return False
    return id_prefix is None or str(record.get("workflow_id", "")).startswith(id_prefix)
