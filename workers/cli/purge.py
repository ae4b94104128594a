"""``durable purge``: remove closed runs (and what only they used) before their retention ends."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import click

from durable.errors import ConfigurationError
from durable.retention import parse_duration
from durable.store.retention import PurgeReport, purge_closed_before
from workers.cli.core import CliError, CliState, pass_state
from workers.cli.render import to_json

from .render import echo

__all__ = ["COMMANDS", "parse_cutoff"]


def parse_cutoff(text: str, now: float | None = None) -> int:
    """Epoch ms of a ``--closed-before`` value: an ISO date or date-time (no zone: UTC), or a
    duration ago (``7d``: closed more than seven days ago).

    Raises:
        CliError: neither.
    """
    now = time.time() if now is None else now
    try:
        return _within_time(int((now - parse_duration(text, allow_zero=True)) * 1000), now)
    except ConfigurationError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"--closed-before {text!r}: not a date (2024-05-01, 2024-05-01T12:00:00+02:00) or a duration "
            "ago (7d, 12h)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return _within_time(int(moment.timestamp() * 1000), now)


def _within_time(cutoff_ms: int, now: float) -> int:
    """``cutoff_ms`` within what it can mean: no run closed at or before 1970's first millisecond
    or after tomorrow (a date in year 9999, or 1970-01-01, purged nothing: the scripts took the
    figure for a stream id bound and failed)."""
    return max(1, min(cutoff_ms, int((now + 86_400) * 1000)))


def _lines(report: PurgeReport, dry_run: bool) -> list[str]:
    verb = "would purge" if dry_run else "purged"
    by_status = ", ".join(f"{status} {n}" for status, n in sorted(report.runs.items()))
    lines = [
        f"{verb} {report.total_runs} run(s)" + (f" ({by_status})" if by_status else ""),
        f"  instance records: {report.instances}",
        f"  history events: {report.events}",
        f"  hook tokens of gone runs: {report.hooks}",
        f"  dead letters: {report.dead_letters}",
    ]
    if report.skipped_open:
        lines.append(f"  skipped (open when reached): {report.skipped_open}")
    return lines


@click.command()
@click.option(
    "--closed-before",
    "closed_before",
    required=True,
    metavar="DATE",
    help="Purge runs closed before DATE: ISO date/time (no zone: UTC) or a duration ago (7d, 12h).",
)
@click.option("--type", "workflow_type", default=None, metavar="T", help="Only runs of workflow type T.")
@click.option("--dry-run", is_flag=True, help="Count what would be purged; delete nothing.")
@click.option(
    "--batch", default=100, show_default=True, type=click.IntRange(1, 1000), help="Runs per script call."
)
@click.option("--json", "as_json", is_flag=True, help="Print the counts as one JSON object.")
@click.option("--yes", is_flag=True, help="Purge even when DATE is now or later (every closed run).")
@pass_state
def purge(
    state: CliState,
    closed_before: str,
    workflow_type: str | None,
    dry_run: bool,
    batch: int,
    as_json: bool,
    yes: bool,
) -> None:
    """Purge closed runs before their retention ends: history, log, run record, index entries,
    the instance record when the run is its workflow id's current one; then hook tokens of gone
    runs and dead letters older than DATE whose run is closed or gone.

    Open runs are never purged. Prints the counts (with --dry-run, what would go).
    """
    cutoff = parse_cutoff(closed_before)
    if cutoff >= (time.time() - 60) * 1000 and not (dry_run or yes):
        # "Closed before 2099-01-01" (a typo for 2009?) or "0s" can only mean every closed run,
        # as `cancel --where` and `terminate --where` do, that asks to be said.
        raise CliError(
            f"--closed-before {closed_before!r} is not in the past: it purges every closed run"
            f"{f' of type {workflow_type!r}' if workflow_type else ''}; add --yes if you mean that "
            "(--dry-run counts them)"
        )
    report = purge_closed_before(
        state.existing_store, cutoff, workflow_type=workflow_type, dry_run=dry_run, batch=batch
    )
    if as_json:
        echo(
            to_json(
                {
                    "dry_run": dry_run,
                    "closed_before_ms": cutoff,
                    "runs": report.total_runs,
                    "by_status": dict(report.runs),
                    "instances": report.instances,
                    "events": report.events,
                    "hooks": report.hooks,
                    "dead_letters": report.dead_letters,
                    "skipped_open": report.skipped_open,
                }
            )
        )
        return
    for line in _lines(report, dry_run):
        echo(line)


COMMANDS = [purge]
