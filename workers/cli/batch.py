"""Cancel or terminate every open run a ``--where`` expression selects (``durable cancel
--where EXPR``, ``durable terminate --where EXPR``), as Temporal's batch operations do.

The runs are counted first and the count confirmed (``--yes`` for scripts), then each is sent
the same call as by its id, page by page (newest first): a run that closed meanwhile is
skipped and said, one that refuses the call is said and the others go on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from durable import WorkflowStub
from durable.errors import DurableError, WorkflowClosed, WorkflowNotFound
from durable.listing import count_runs, list_runs
from durable.store.redis_store import RedisStore
from workers.cli.core import CliError

__all__ = ["PAGE", "open_runs", "run_batch"]

PAGE = 500
"""Runs read per page of the batch."""


def open_runs(where: str) -> str:
    """``where`` narrowed to open runs (a closed run takes no cancel or terminate)."""
    return f"({where}) and status = 'open'" if where.strip() else "status = 'open'"


def run_batch(
    store: RedisStore, where: str, verb: str, act: Callable[[WorkflowStub], None], *, yes: bool
) -> None:
    """Apply ``act`` to every open run matching ``where``; ``verb`` names it (``terminate``).

    Raises:
        CliError: More than none match, without ``--yes`` and no terminal to ask on.
    """
    query = open_runs(where)
    total = count_runs(query, store=store)
    if not total:
        click.echo(f"no open run matches {where!r}")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise CliError(f"{total} open runs match {where!r}: pass --yes to {verb} them")
        click.confirm(f"{verb} {total} open runs matching {where!r}?", abort=True)
    done, closed, refused = 0, 0, 0
    before: dict | None = None
    while True:
        rows = list_runs(query, limit=PAGE, before=before, store=store)
        for row in rows:
            workflow_id = row["workflow_id"]
            try:
                act(WorkflowStub.load(workflow_id, store=store))
            except (WorkflowClosed, WorkflowNotFound):
                closed += 1  # closed (or purged) since it was listed
                continue
            except DurableError as exc:
                refused += 1
                click.echo(f"{workflow_id}: {exc}", err=True)
                continue
            done += 1
            click.echo(workflow_id)
        if len(rows) < PAGE:
            break
        before = rows[-1]
    said = f"{verb}: {done} of {total} runs"
    said += f"; {closed} had closed meanwhile" if closed else ""
    said += f"; {refused} refused (above)" if refused else ""
    click.echo(said, err=True)
    if refused:
        sys.exit(1)
