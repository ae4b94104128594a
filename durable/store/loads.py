"""A decision's load: the reads of one run (record fields, inbox, new history), and how they
are grouped into transactions, on one Redis or per partition on a Redis Cluster.

Kept apart from the stores that send them: a load goes out on its own (``RunStore.load_many``)
or rides along after the completion scripts that wake its runs
(``ActivityStore.complete_then_load``), in the same round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .. import events as ev
from ..errors import HistoryCorrupt
from .keys import Keys
from .records import DECISION_FIELDS, decision_record
from .wire import Command, stream_rows

Rows = list[tuple[bytes, dict[bytes, bytes]]]
"""History stream entries as read: ``[(entry id, {field: value})]``."""

Loaded = tuple[dict[str, Any] | None, list[bytes], Rows]
"""What a decision loads: the run record's decision fields, the inbox, the history rows."""

RunToLoad = tuple[int, str, int]
"""``(partition, run id, after seq)``: a run to load, with the history after ``after seq``."""


def load_commands(keys: Keys, p: int, run_id: str, after_seq: int) -> list[Command]:
    """The three reads of a decision's load: record fields, inbox, history after ``after_seq``."""
    return [
        ("HMGET", keys.run(p, run_id), *DECISION_FIELDS),
        ("LRANGE", keys.inbox(p, run_id), 0, -1),
        ("XRANGE", keys.history(p, run_id), f"0-{after_seq + 1}", "+"),
    ]


def batches(keys: Keys, runs: Sequence[RunToLoad], *, cluster: bool) -> list[tuple[list[int], list[Command]]]:
    """The transactions that load ``runs``: ``(indexes of the runs it loads, its commands)``.
    One for all on one Redis; on a cluster one per partition (a MULTI stays in one slot)."""
    if not cluster:
        return [(list(range(len(runs))), [c for run in runs for c in load_commands(keys, *run)])]
    by_partition: dict[int, list[int]] = {}
    for i, (p, _, _) in enumerate(runs):
        by_partition.setdefault(p, []).append(i)
    return [
        (indexes, [c for i in indexes for c in load_commands(keys, *runs[i])])
        for indexes in by_partition.values()
    ]


def loaded(n_runs: int, groups: Sequence[list[int]], results: Sequence[Sequence[Any]]) -> list[Loaded]:
    """The loads, in the order of the runs, from each transaction's replies (three per run)."""
    replies: list[Any] = [None] * (3 * n_runs)
    for indexes, got in zip(groups, results, strict=True):
        for n, i in enumerate(indexes):
            replies[3 * i : 3 * i + 3] = got[3 * n : 3 * n + 3]
    return [
        (decision_record(replies[i]), replies[i + 1], stream_rows(replies[i + 2]))
        for i in range(0, len(replies), 3)
    ]


def decode_history(
    run_id: str,
    rows: Iterable[tuple[bytes, dict[bytes, bytes]]],
    first: int | None = 1,
    last: int | None = None,
) -> list[ev.Entry]:
    """Decode run ``run_id``'s history rows (``(entry id, fields)``), checking they are whole:
    seq ``first`` (``None``: any) and on without a gap, up to ``last`` when given (the run
    record's count).

    Raises:
        HistoryCorrupt: an entry that is not an event, a gap, or a history shorter or longer
            than ``last`` -- named, with what to do.
    """
    out: list[ev.Entry] = []
    expected = first
    for entry_id, fields in rows:
        seq = int(entry_id.split(b"-")[1])
        if expected is not None and seq != expected:
            raise HistoryCorrupt(
                f"run {run_id}: its history skips from seq {expected - 1} to seq {seq} (entries "
                "were deleted from its stream); restore Redis from a backup, or `durable terminate` "
                "the run and start it again",
                run_id=run_id,
                seq=expected,
            )
        expected = seq + 1
        raw = fields.get(b"e")
        if raw is None:
            raise HistoryCorrupt(
                f"run {run_id} seq {seq}: history entry has no 'e' field (foreign entry?)",
                run_id=run_id,
                seq=seq,
            )
        out.append(ev.decode(raw, run_id=run_id, seq=seq))
    held = out[-1].seq if out else (first or 1) - 1
    if last is not None and held != last:
        why = (
            "entries past it were written by a commit that failed half-way (a Redis error inside its "
            "script, such as a key of the wrong type); mend that key, then `durable repair "
            "--drop-uncommitted` moves them beside the history (its inputs back to the inbox) and the "
            "run is decided again; or"
            if held > last
            else "its last entries were deleted from its stream;"
        )
        raise HistoryCorrupt(
            f"run {run_id}: its history holds {held} events but the run record counts {last}: "
            f"{why} restore Redis from a backup, or `durable terminate` the run and start it again",
            run_id=run_id,
            seq=min(held, last) + 1,
        )
    return out
