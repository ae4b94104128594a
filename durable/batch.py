"""One call to every open run a ``--where`` expression selects: Temporal's batch operations
(``durable cancel --where``, ``durable terminate --where``, ``POST /api/v1/batch/...``).

The runs are read page by page, newest first, and each is sent the same call as by its id:
a run that closed (or was purged) since it was listed is skipped and counted, one that
refuses the call is named with why, and the others go on. Only open runs are selected: a
closed run takes no cancel or terminate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .blocked import HISTORY_FULL
from .client import WorkflowStub, default_store
from .errors import DurableError, WorkflowClosed, WorkflowNotFound
from .listing import list_runs
from .search import parse_where
from .store.redis_store import RedisStore, RunRef

__all__ = ["ACTIONS", "PAGE", "BatchReport", "for_open_runs", "open_runs"]

PAGE = 500
"""Runs read per page."""

ACTIONS = ("cancel", "terminate")
"""What a batch may send: the stub method of that name, with the reason."""


def open_runs(where: str, store: RedisStore | None = None) -> str:
    """``where`` narrowed to open runs. It is parsed alone first: a syntax error names its
    own positions, and a ``)`` of its own cannot close the parenthesis wrapped around it (and
    undo the narrowing).

    Raises:
        SearchQueryError: ``where`` does not parse.
    """
    if not where.strip():
        return "status = 'open'"
    parse_where(where, (store or default_store()).search_types())
    return f"({where}) and status = 'open'"


@dataclass
class BatchReport:
    """What a batch did.

    Attributes:
        done: The workflow ids the call went to, in order.
        closed: Those skipped: closed or purged since they were listed.
        refused: Workflow id -> why the call was refused.
        blocked: Of those cancelled, workflow id -> why the run is blocked (``kind: message``):
            a blocked run runs its cleanup only once it moves again (terminate ends it now).
        more: Whether it stopped at ``most`` with matching runs left.
        next: With ``more``: where the next call starts (its ``before``), the cursor
            ``"<created ms>:<run id>"`` of the last run this one went to. A cancelled run
            stays open until a worker applies the cancel, so a call without it would select
            the same runs again.
    """

    done: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)
    more: bool = False
    next: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "done": self.done,
            "closed": self.closed,
            "refused": self.refused,
            "blocked": self.blocked,
            "more": self.more,
            "next": self.next,
        }


def for_open_runs(
    where: str,
    action: str,
    reason: str = "",
    *,
    store: RedisStore | None = None,
    most: int | None = None,
    each: Callable[[str, str | None], None] | None = None,
    before: str | None = None,
) -> BatchReport:
    """Send ``action`` (one of :data:`ACTIONS`) with ``reason`` to every open run ``where`` selects.

    Args:
        where: A search expression (docs/search.md); empty: every open run.
        action: ``"cancel"`` or ``"terminate"``.
        reason: Recorded with each run, as by its id.
        most: Stop after this many runs (``more`` says whether some are left).
        each: Told each workflow id and ``None`` when done, ``"closed"`` or the refusal.
        before: Start after this run: the previous call's :attr:`BatchReport.next`.

    Raises:
        SearchQueryError: ``where`` does not parse.
        ConfigurationError: a ``before`` that is not a cursor.
        ValueError: an ``action`` not in :data:`ACTIONS`.
    """
    if action not in ACTIONS:
        raise ValueError(f"no batch action {action!r}: one of {ACTIONS}")
    store = store or default_store()
    report = BatchReport()
    query = open_runs(where, store)
    cursor: str | dict[str, Any] | None = before
    while True:
        rows = list_runs(query, limit=PAGE, before=cursor, store=store)
        live = store.live_workers() if action == "cancel" and rows else []  # once a page: why blocked
        for row in rows:
            if most is not None and len(report.done) + len(report.refused) >= most:
                report.more = True
                return report
            report.next = f"{row['created']}:{row['run_id']}"
            workflow_id = row["workflow_id"]
            try:
                getattr(WorkflowStub.load(workflow_id, store=store), action)(reason)
                ref = RunRef(row["partition"], row["run_id"], workflow_id)
                stuck = store.why_blocked(store.run_record(ref), live) if action == "cancel" else None
                if stuck is not None and stuck.kind != HISTORY_FULL:  # its cancel waits for it to move
                    report.blocked[workflow_id] = f"{stuck.kind}: {stuck.message}"
            except (WorkflowClosed, WorkflowNotFound):
                report.closed.append(workflow_id)
                outcome: str | None = "closed"
            except DurableError as exc:
                report.refused[workflow_id] = outcome = str(exc)
            else:
                report.done.append(workflow_id)
                outcome = None
            if each is not None:
                each(workflow_id, outcome)
        if len(rows) < PAGE:
            report.next = None  # nothing left to start from
            return report
        cursor = rows[-1]
