"""A decision's load: the reads of one run (record fields, inbox, new history), and how they
are grouped into transactions, on one Redis or per partition on a Redis Cluster.

Kept apart from the stores that send them: a load goes out on its own (``RunStore.load_many``)
or rides along after the completion scripts that wake its runs
(``ActivityStore.complete_then_load``), in the same round trip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
