"""Commands that look without changing anything: describe, history, list, count."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from durable import SearchQueryError, WorkflowStub, count_runs, list_runs
from durable.client import HistoryEvent
from durable.runinfo import NO_LIVE_WORKER
from durable.search import parse_where
from durable.store.records import CLOSED_STATUSES, OPEN_STATUSES
from durable.store.run_list import list_row
from durable.untrusted import decimal
from workers.cli.core import CliError, CliState, load_apps, pass_state
from workers.cli.export import export_history
from workers.cli.fleet import blocked_page, marked
from workers.cli.render import (
    console,
    dead_letters_table,
    describe_tables,
    history_table,
    runs_table,
    to_json,
)
from workers.config import mask_url

from .render import echo, styled

__all__ = ["COMMANDS"]

T = TypeVar("T")


_RUN_HELP = "An earlier run of ID (`durable list` shows each run; default: the current one)."


@click.command()
@click.argument("workflow_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
@click.option("--run", "run_id", default=None, metavar="RUN_ID", help=_RUN_HELP)
@pass_state
def describe(state: CliState, workflow_id: str, as_json: bool, run_id: str | None) -> None:
    """Status, blocked reason, pending steps and activity attempts of workflow ID."""
    info = WorkflowStub.load(workflow_id, store=state.existing_store).describe(run_id).to_dict()
    if as_json:
        echo(to_json(info, indent=2))
        return
    out = console()
    for table in describe_tables(info, mask_url(state.url or "")):
        out.print(table)


@click.command()
@click.argument("workflow_id", metavar="ID")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="A JSON array of {seq, type, ts, data, raw}: the export format of `durable replay`.",
)
@click.option("--run", "run_id", default=None, metavar="RUN_ID", help=_RUN_HELP)
@click.option(
    "--after", default=0, type=click.IntRange(0), metavar="SEQ", help="The table's events after SEQ."
)
@click.option(
    "--limit",
    default=1000,
    show_default=True,
    type=click.IntRange(1),
    help="At most N events in the table (--json exports the whole history).",
)
@pass_state
def history(
    state: CliState, workflow_id: str, as_json: bool, run_id: str | None, after: int, limit: int
) -> None:
    """The events of workflow ID's current run (or --run's), as a table or (--json) for export.

    `durable history ID --json > run.json` then `durable replay run.json --app M`
    checks that today's code still decides as that history says. A long history's table is
    paged: `--after SEQ` (the caption says the next one).
    """
    store = state.existing_store
    if as_json:
        echo(to_json(export_history(store, workflow_id, run_id), indent=1))
        return
    WorkflowStub.load(workflow_id, store=store)  # reads its record: one of another kind is said
    ref = store.ref(workflow_id, run_id)
    entries = store.history(ref, after, count=limit + 1)
    events = [HistoryEvent.from_entry(e) for e in entries[:limit]]
    table = history_table(events, title=f"{workflow_id} (run {ref.run_id})")
    if len(entries) > limit:
        table.caption = f"more events follow: durable history {workflow_id} --after {events[-1].seq}"
    console().print(table)


_WHERE_HELP = (
    "Only runs matching EXPR, e.g. \"customer = 'acme' and status = 'open' and started > "
    "'2026-11-01'\" (docs/search.md)."
)
_APP_HELP = "Import module M first: its search attribute declarations give the types (repeatable)."


@click.command(name="list")
@click.option("--where", "where", default=None, metavar="EXPR", help=_WHERE_HELP)
@click.option("--app", "apps", multiple=True, metavar="M", help=_APP_HELP)
@click.option(
    "--status",
    "status_",
    default=None,
    type=click.Choice(sorted(OPEN_STATUSES | CLOSED_STATUSES) + ["blocked"]),
    help="Only runs with this status (or 'blocked').",
)
@click.option("--type", "workflow_type", default=None, help="Only runs of this workflow type.")
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="At most N rows (1..10,000).",
)
@click.option(
    "--before",
    "before",
    default=None,
    metavar="MS[:RUN_ID]",
    callback=lambda _ctx, _param, value: _before(value),
    help="Paging: the runs after MS:RUN_ID (the hint under a full page), or created before MS.",
)
@click.option("--dead", is_flag=True, help="Show the dead-letter stream (parked tasks) instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_state
def list_(
    state: CliState,
    where: str | None,
    apps: tuple[str, ...],
    status_: str | None,
    workflow_type: str | None,
    limit: int,
    before: tuple[int, str | None] | None,
    dead: bool,
    as_json: bool,
) -> None:
    """Runs, newest first; a full page ends with the --before MS:RUN_ID of the next one."""
    store = state.existing_store
    url = mask_url(state.url or "")
    if dead:
        letters = store.dead_letters(count=limit)
        if as_json:
            echo(to_json(letters, indent=1))
        else:
            console().print(dead_letters_table(letters, url, store.dead_letter_count()))
        return
    before_ms, before_run_id = before or (None, None)
    # A status is an indexed word: listed through the index, a page holds `limit` such runs
    # however many newer runs have another (a window of the newest records came back empty).
    following: str | None = None
    cursor = None if before is None else f"{before_ms}:{before_run_id}" if before_run_id else str(before_ms)
    if status_ == "blocked" and where is not None:
        raise CliError(
            "--status blocked cannot be combined with --where (blocked is worked out on read, not "
            "indexed): list the blocked runs, then narrow them with --type"
        )
    paged = status_ == "blocked" or (workflow_type is not None and where is None and status_ is None)
    if status_ == "blocked":
        # Blocked is not one indexed word (no live worker, a blocked child are computed on
        # read): the API's blocked page, which reads until it has `limit` or says where to go on.
        page = blocked_page(store, limit=limit, cursor=cursor, workflow_type=workflow_type)
        runs, following = page.runs, page.next
    elif paged:
        # A type is matched on the records: the API's page, which reads on until it has `limit`
        # or says where to go on (a window of the newest runs held none of an older type, and
        # the list said "runs (0)" with no cursor).
        page = store.list_runs_page(workflow_type=workflow_type, cursor=cursor, limit=limit)
        runs, following = page.runs, page.next
    elif where is not None or status_ is not None:
        if where is not None:
            load_apps(apps)
            _searched(lambda: parse_where(where, store.search_types()))  # its errors, at its positions
        expr = _with_filters(where or "", status_, workflow_type)
        limit = min(limit, 1000)
        runs = _searched(lambda: list_runs(expr, limit=limit, before=cursor, store=store))
    else:
        runs = store.list_runs(
            workflow_type=workflow_type, limit=limit, before_ms=before_ms, before_run_id=before_run_id
        )
    if status_ != "blocked":
        runs = marked(store, runs, store.live_workers())
        if not paged and runs and len(runs) >= limit:
            # The last row's (ms, run id), not its ms alone: runs of the same ms are not skipped.
            following = f"{runs[-1]['created']}:{runs[-1]['run_id']}"
    # Why no run can move whatever its row says: Redis refusing writes at maxmemory (one INFO
    # memory, a read that works under OOM; refused by an ACL, nothing is said).
    problem = store.memory_state().reason
    if as_json:
        if problem:
            echo(f"warning: {problem}", err=True)  # stdout stays the array
        echo(to_json([list_row(r) for r in runs], indent=1))
        if following:  # on stderr, as the warning: stdout stays the array
            echo(f"more: --before {following}", err=True)
        return
    out = console()
    out.print(runs_table(runs, url))
    if problem:
        # Under the table: the last thing on the screen, however many rows scrolled by.
        out.print(styled(problem, style="bold red"))
        if any(r.get("blocked_kind") == NO_LIVE_WORKER for r in runs):
            out.print(styled(_HEARTBEATS_NOTE, style="red"))
    if following:
        echo(f"more: --before {following}")


_HEARTBEATS_NOTE = (
    "workers' registry heartbeats cannot be written meanwhile: a run shown blocked for no live "
    "worker may well have one"
)


def _before(value: str | None) -> tuple[int, str | None] | None:
    """``--before MS[:RUN_ID]`` as ``(ms, run id or None)``."""
    if value is None:
        return None
    ms, _, rid = value.strip().partition(":")
    if (created := decimal(ms)) is None:
        raise click.BadParameter(f"{value!r}: expected MS or MS:RUN_ID (the hint under a full page)")
    return created, rid or None


@click.command()
@click.option("--where", "where", default="", metavar="EXPR", help=_WHERE_HELP)
@click.option("--app", "apps", multiple=True, metavar="M", help=_APP_HELP)
@click.option("--json", "as_json", is_flag=True, help='Print {"count": N}.')
@pass_state
def count(state: CliState, where: str, apps: tuple[str, ...], as_json: bool) -> None:
    """How many runs match --where EXPR (every run without it)."""
    load_apps(apps)
    store = state.existing_store
    n = _searched(lambda: count_runs(where, store=store))
    echo(to_json({"count": n}) if as_json else str(n))


def _with_filters(where: str, status: str | None, workflow_type: str | None) -> str:
    """``--where`` with ``--status``/``--type`` added as conditions."""
    if status == "blocked":
        raise CliError("--status blocked cannot be combined with --where (blocked is not indexed)")
    if status is None and workflow_type is None:
        return where
    parts = [f"({where})"] if where.strip() else []
    for name, value in (("status", status), ("type", workflow_type)):
        if value is not None:
            parts.append(f"{name} = '{value.replace(chr(39), chr(39) * 2)}'")
    return " and ".join(parts)


def _searched(call: Callable[[], T]) -> T:
    """Run a search; a bad expression is one error naming its position (and pointing at it)."""
    try:
        return call()
    except SearchQueryError as exc:
        raise CliError(str(exc)) from None


COMMANDS = [describe, history, list_, count]
