"""``durable cancel --where EXPR`` and ``durable terminate --where EXPR``: the open runs an
expression selects (:mod:`durable.batch`), counted and confirmed first (``--yes`` for scripts)."""

from __future__ import annotations

import sys

import click

from durable.batch import for_open_runs, open_runs
from durable.listing import count_runs
from durable.store.redis_store import RedisStore
from workers.cli.core import CliError

from .render import echo

__all__ = ["WHERE", "YES", "one_or_where", "run_batch"]


def one_or_where(action: str, workflow_id: str | None, where: str | None) -> str | None:
    """The ``--where`` expression of a batch, or ``None`` for one run by id (exactly one given)."""
    if (workflow_id is None) == (where is None):
        raise CliError(f"{action} takes a workflow ID or --where EXPR (its open runs), one of them")
    return where


WHERE = click.option(
    "--where",
    default=None,
    metavar="EXPR",
    help="Instead of ID: every open run this expression selects (as `durable list --where`).",
)
YES = click.option("--yes", is_flag=True, help="With --where: no confirmation asked.")


def run_batch(store: RedisStore, where: str, action: str, reason: str, *, yes: bool) -> None:
    """Send ``action`` (``cancel``, ``terminate``) to every open run matching ``where``. Each
    workflow id is printed as its call is sent, refusals on stderr, then a summary.

    Raises:
        CliError: Some match, without ``--yes`` and no terminal to ask on.
    """
    total = count_runs(open_runs(where), store=store)
    if not total:
        echo(f"no open run matches {where!r}")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise CliError(f"{total} open runs match {where!r}: pass --yes to {action} them")
        click.confirm(f"{action} {total} open runs matching {where!r}?", abort=True)

    def said(workflow_id: str, outcome: str | None) -> None:
        if outcome is None:
            echo(workflow_id)
        elif outcome != "closed":
            echo(f"{workflow_id}: {outcome}", err=True)

    report = for_open_runs(where, action, reason, store=store, each=said)
    summary = f"{action}: {len(report.done)} of {total} runs"
    summary += f"; {len(report.closed)} had closed meanwhile" if report.closed else ""
    summary += f"; {len(report.refused)} refused (above)" if report.refused else ""
    if report.blocked:  # as `durable cancel ID` says it of one
        summary += (
            f"; {len(report.blocked)} of them are blocked, so their cancel takes effect only once they move "
            f"again (`durable terminate --where` ends them now): {', '.join(sorted(report.blocked)[:5])}"
            + (" ..." if len(report.blocked) > 5 else "")
        )
    echo(summary, err=True)
    if report.refused:
        sys.exit(1)
