"""A parent blocked through its child: a pending child that cannot move holds its parent too.

``why_blocked`` of a run that waits on a child asks this module whether one of its pending
children is blocked for any reason the child's own ``why_blocked`` would give -- a reason
recorded on the child's run record (nondeterminism, unknown type, ...) or one computed from
the worker registry (no live worker serves the child's queue or build, or defines its type).
(Redis refusing writes at ``maxmemory`` blocks the parent itself, before its children are read.)

Bounded, so a status call stays cheap whatever the fan-out:

* per run, only its first :data:`CHILDREN_CHECKED` pending children are read, and each level
  below reads no more runs than the first (a fan-out of fan-outs is not read in full);
* a child that is open and not blocked itself is looked into in turn, down to
  :data:`CHILD_DEPTH` levels (a parent -> child -> grandchild chain); deeper descendants are
  not read, so a run blocked four levels down makes its great-grandparent look unblocked;
* each level is two pipelined round trips for all the runs of that level (the children's
  current run ids, then their records), never one per child.

The listings (``durable list`` and ``GET /api/v1/workflows``) use :func:`runs_blocked_by_children`
for the open rows they show: one more pipelined read of those runs' snapshots first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import codec
from ..runinfo import DATA_LOST, NO_LIVE_WORKER, BlockedReason, blocked_reason
from .base import StoreBase
from .origins import data_losses, loss_note
from .records import OPEN_STATUSES, RunRef, decode_run, text

__all__ = [
    "CHILDREN_CHECKED",
    "CHILD_DEPTH",
    "blocked_children",
    "children_gone",
    "own_reason",
    "pending_children",
    "runs_blocked_by_children",
]

CHILDREN_CHECKED = 20
"""How many of a run's pending children are read for a blocked one (a fan-out of thousands is
not read on every status call)."""

CHILD_DEPTH = 3
"""How many levels of descendants are read: children, grandchildren, great-grandchildren."""

CHILD_FIELDS = ("workflow_id", "status", "blocked", "blocked_kind", "queue", "build", "type", "snapshot")
"""What a child's own reason is computed from (the snapshot: its pending activities and children)."""

NoWorker = Callable[[Mapping[str, Any]], "str | None"]
"""A run record -> why no live worker can move it (``no_worker_reason`` against the live workers)."""


def pending_children(record: Mapping[str, Any]) -> list[str]:
    """The workflow ids of the first :data:`CHILDREN_CHECKED` children ``record`` waits on."""
    return [
        str(step["workflow_id"])
        for step in (record.get("snapshot") or {}).get("pending") or ()
        if step.get("kind") == "child" and step.get("workflow_id")
    ][:CHILDREN_CHECKED]


def own_reason(record: Mapping[str, Any], no_worker: NoWorker) -> BlockedReason | None:
    """Why ``record`` cannot move by itself: its recorded reason, else that no live worker can
    move it (kind :data:`~durable.runinfo.NO_LIVE_WORKER`); ``None``: neither."""
    recorded = blocked_reason(record)
    if recorded is not None or record.get("status", "pending") not in OPEN_STATUSES:
        return recorded
    unserved = no_worker(record)
    return BlockedReason(kind=NO_LIVE_WORKER, message=unserved) if unserved else None


def blocked_children(
    store: StoreBase,
    records: Sequence[Mapping[str, Any]],
    no_worker: NoWorker,
    depth: int = CHILD_DEPTH,
    budget: int | None = None,
) -> list[BlockedReason | None]:
    """Per record (a decoded run record with its snapshot), the first pending child that is
    blocked, as the parent's reason naming it (:meth:`BlockedReason.through`); ``None``: none of those read is.

    Args:
        store: The store to read the children from.
        records: The parents' run records.
        no_worker: See :data:`NoWorker`.
        depth: Levels of descendants still to read (see :data:`CHILD_DEPTH`).
        budget: Most runs read per level (default: :data:`CHILDREN_CHECKED` per record given;
            the levels below keep it, so a fan-out of fan-outs is not read in full).
    """
    wanted = [pending_children(r) for r in records]
    budget = CHILDREN_CHECKED * len(records) if budget is None else budget
    ids = list(dict.fromkeys(wid for kids in wanted for wid in kids))[:budget]
    if not ids or depth < 1:
        return [None] * len(records)
    records_of = dict(zip(ids, _child_records(store, ids), strict=True))
    # A child not started yet (its start is on its way from another partition) is left out,
    # unless its partition's data was lost: then it never will be.
    children = {wid: rec for wid, rec in records_of.items() if rec is not None}
    reasons = {wid: own_reason(rec, no_worker) for wid, rec in children.items()}
    parents = {
        wid: str(r.get("workflow_id") or "") for r, kids in zip(records, wanted, strict=True) for wid in kids
    }
    reasons.update(_lost_children(store, [wid for wid, rec in records_of.items() if rec is None], parents))
    # An open child that is not blocked itself may wait on a blocked one in turn.
    deeper = [w for w, rec in children.items() if reasons[w] is None and rec.get("status") in OPEN_STATUSES]
    if deeper and depth > 1:
        below = blocked_children(store, [children[w] for w in deeper], no_worker, depth - 1, budget)
        reasons.update(zip(deeper, below, strict=True))
    out: list[BlockedReason | None] = []
    for kids in wanted:
        found = next(((wid, reasons[wid]) for wid in kids if reasons.get(wid) is not None), None)
        if found and found[1] and found[1].kind == DATA_LOST and found[1].child == found[0]:
            out.append(found[1])  # it says so itself: the child is not blocked, it is gone
        else:
            out.append(BlockedReason.through(found[0], found[1]) if found and found[1] else None)
    return out


def children_gone(store: StoreBase, runs: Sequence[RunRef]) -> list[BlockedReason | None]:
    """Per run, a child it waits on that does not exist
    and never will (:data:`~durable.runinfo.DATA_LOST`, as ``durable status`` says); ``None``:
    none. What a ``result()`` waiting on the run raises, found on read (two reads: the runs'
    snapshots, then their children)."""
    if not runs:
        return []
    with store.redis.pipeline(transaction=False) as pipe:
        for ref in runs:
            pipe.hget(store.keys.run(ref.partition, ref.run_id), "snapshot")
        snapshots = pipe.execute()
    records = [
        {**(decode_run({"snapshot": raw}) if raw else {}), "workflow_id": ref.workflow_id}
        for ref, raw in zip(runs, snapshots, strict=True)
    ]
    # The runs' own children only: a descendant's loss is not this waiter's to raise.
    found = blocked_children(store, records, lambda _: None, depth=1)
    return [r if r is not None and r.kind == DATA_LOST else None for r in found]


def _lost_children(
    store: StoreBase, missing: Sequence[str], parents: Mapping[str, str]
) -> dict[str, BlockedReason]:
    """The children of ``missing`` (no run of theirs exists) that never will: their partition's
    data was lost, or (``parents``: each one's parent workflow id, ``""`` unknown) no start of
    theirs is on its way (:func:`_vanished`). One round trip when any is missing, none otherwise."""
    if not missing:
        return {}
    k = store.keys
    lost = {loss.partition: loss for loss in data_losses(store, {k.partition(wid) for wid in missing})}
    out = {
        wid: BlockedReason.child_gone(wid, loss_note(lost[p]))
        for wid in missing
        if (p := k.partition(wid)) in lost
    }
    out.update(_vanished(store, [wid for wid in missing if wid not in out and parents.get(wid)], parents))
    return out


OUTBOX_READ = 1_000
"""Outbox messages read for a child's start; a longer outbox (a backlog) says nothing is gone."""

_VANISHED = (
    " (no run of it is left, and no start of it is on its way: its keys were evicted under an "
    "allkeys-* maxmemory policy or deleted)"
)


def _vanished(
    store: StoreBase, missing: Sequence[str], parents: Mapping[str, str]
) -> dict[str, BlockedReason]:
    """Of ``missing`` children, those whose start is not in their parent's partition's outbox (a
    start goes there with the parent's commit and leaves it once the child's run exists) and that
    still do not exist after that read (the outbox is read first: a start carried out between the
    two reads is found by the second)."""
    if not missing:
        return {}
    k = store.keys
    outboxes = sorted({k.partition(parents[wid]) for wid in missing})
    with store.redis.pipeline(transaction=False) as pipe:
        for p in outboxes:
            pipe.xrange(k.outbox(p), count=OUTBOX_READ)
        read = dict(zip(outboxes, pipe.execute(), strict=True))
    on_its_way = {wid for wid in missing if _start_queued(read[k.partition(parents[wid])], wid)}
    left = [wid for wid in missing if wid not in on_its_way]
    if not left:
        return {}
    again = _child_records(store, left)
    return {
        wid: BlockedReason.child_gone(wid, _VANISHED)
        for wid, rec in zip(left, again, strict=True)
        if rec is None
    }


def _start_queued(entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]], child_id: str) -> bool:
    """Whether an outbox read holds a message starting ``child_id`` (a full read: maybe)."""
    if len(entries) >= OUTBOX_READ:
        return True
    named = codec.pack(child_id)
    for _, fields in entries:
        raw = fields.get(b"m", b"")
        if named in raw:
            try:
                msg = codec.unpack(raw)
            except Exception:  # noqa: BLE001 - a garbled message names no child
                continue
            if isinstance(msg, dict) and msg.get("kind") == "start" and msg.get("wid") == child_id:
                return True
    return False


def runs_blocked_by_children(
    store: StoreBase, rows: Sequence[Mapping[str, Any]], no_worker: NoWorker
) -> list[BlockedReason | None]:
    """:func:`blocked_children` of the open ones among list rows. A row without its
    ``snapshot`` (the light fields of ``list_runs_page``) has it read first by ``partition``
    and ``run_id``: one pipelined round trip for all of them."""
    out: list[BlockedReason | None] = [None] * len(rows)
    open_rows = [i for i, r in enumerate(rows) if r.get("status") in OPEN_STATUSES]
    unread = [
        i for i in open_rows if "snapshot" not in rows[i] and "run_id" in rows[i] and "partition" in rows[i]
    ]
    snaps: dict[int, Mapping[str, Any]] = {i: rows[i] for i in open_rows if "snapshot" in rows[i]}
    if unread:
        with store.redis.pipeline(transaction=False) as pipe:
            for i in unread:
                pipe.hget(store.keys.run(int(rows[i]["partition"]), str(rows[i]["run_id"])), "snapshot")
            replies = pipe.execute()
        # The parent's id goes along: a child of it that is missing is looked for in its outbox.
        snaps.update(
            (i, {**(decode_run({"snapshot": s}) if s else {}), "workflow_id": rows[i].get("workflow_id")})
            for i, s in zip(unread, replies, strict=True)
        )
    order = sorted(snaps)
    for i, reason in zip(order, blocked_children(store, [snaps[i] for i in order], no_worker), strict=True):
        out[i] = reason
    return out


def _child_records(store: StoreBase, ids: Sequence[str]) -> list[dict[str, Any] | None]:
    """The current run record (:data:`CHILD_FIELDS`) of each workflow id (``None``: not started
    yet, or purged): two pipelined round trips for all of them."""
    k = store.keys
    with store.redis.pipeline(transaction=False) as pipe:
        for wid in ids:
            pipe.hget(k.instance(k.partition(wid), wid), "run")
        runs = pipe.execute()
    with store.redis.pipeline(transaction=False) as pipe:
        for wid, rid in zip(ids, runs, strict=True):
            pipe.hmget(k.run(k.partition(wid), text(rid) if rid else "-"), CHILD_FIELDS)
        values = pipe.execute()
    out: list[dict[str, Any] | None] = []
    for wid, row in zip(ids, values, strict=True):
        raw = {name: v for name, v in zip(CHILD_FIELDS, row, strict=True) if v is not None}
        out.append(decode_run({"workflow_id": wid, **raw}) if raw.get("status") else None)
    return out
