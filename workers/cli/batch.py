"""``durable cancel --where EXPR`` and ``durable terminate --where EXPR``: the open runs an
expression selects (:mod:`durable.batch`), counted and confirmed first (``--yes`` for scripts)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from durable import WorkflowStub
from durable.batch import for_open_runs, open_runs
from durable.listing import count_runs
from durable.store.redis_store import RedisStore
from workers.cli.core import CliError

__all__ = ["run_batch"]


def run_batch(
    store: RedisStore, where: str, verb: str, act: Callable[[WorkflowStub], None], *, yes: bool
) -> None:
    """Apply ``act`` to every open run matching ``where``; ``verb`` names it (``terminate``).
    Each workflow id is printed as its call is sent, refusals on stderr, then a summary.

    Raises:
        CliError: Some match, without ``--yes`` and no terminal to ask on.
    """
    total = count_runs(open_runs(where), store=store)
    if not total:
        click.echo(f"no open run matches {where!r}")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise CliError(f"{total} open runs match {where!r}: pass --yes to {verb} them")
        click.confirm(f"{verb} {total} open runs matching {where!r}?", abort=True)

    def said(workflow_id: str, outcome: str | None) -> None:
        if outcome is None:
            click.echo(workflow_id)
        elif outcome != "closed":
            click.echo(f"{workflow_id}: {outcome}", err=True)

    report = for_open_runs(where, act, store=store, each=said)
    summary = f"{verb}: {len(report.done)} of {total} runs"
    summary += f"; {len(report.closed)} had closed meanwhile" if report.closed else ""
    summary += f"; {len(report.refused)} refused (above)" if report.refused else ""
    click.echo(summary, err=True)
    if report.refused:
        sys.exit(1)
