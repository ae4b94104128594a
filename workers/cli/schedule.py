"""``durable schedule``: create, list, describe, pause, unpause, trigger, backfill, update, delete."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from durable import Schedule, ScheduleDescription, ScheduleHandle, ScheduleOverlap, registry
from durable.retention import duration_text
from durable.schedule_spec import MIN_INTERVAL_S, iso, parse_moment
from durable.schedules import skip_reason
from durable.store.redis_store import RedisStore
from workers.cli.core import CliState, load_apps, parse_args, pass_state
from workers.cli.fleet import check_startable
from workers.cli.render import to_json

from .render import echo

__all__ = ["COMMANDS"]

_POLICIES = click.Choice([p.value for p in ScheduleOverlap])


def _spec_options(create: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The spec options of ``create`` (``update`` takes the same, all optional)."""
    options = [
        click.option(
            "--workflow", "workflow", required=create, metavar="TYPE", help="Workflow type to start."
        ),
        click.option(
            "--args",
            "args",
            multiple=True,
            metavar="JSON",
            help="An argument of every run (JSON, else a string); repeat for several.",
        ),
        click.option(
            "--cron", default=None, metavar="EXPR", help="Five-field cron expression ('*/5 * * * *')."
        ),
        click.option(
            "--every",
            default=None,
            metavar="DURATION",
            help=f"Interval: 30s, 5m, 1h, 1d (at least {MIN_INTERVAL_S:g}s).",
        ),
        click.option("--timezone", default=None, metavar="TZ", help="IANA zone of --cron (default UTC)."),
        click.option("--jitter", default=None, metavar="D", help="Random start delay below D (e.g. 10s)."),
        click.option(
            "--overlap", default=None, metavar="POLICY", help=f"One of {', '.join(_POLICIES.choices)}."
        ),
        click.option(
            "--start-at",
            "start_at",
            default=None,
            metavar="T",
            help="No time before T (ISO; UTC; update: none clears).",
        ),
        click.option(
            "--end-at",
            "end_at",
            default=None,
            metavar="T",
            help="No time after T (ISO; UTC; update: none clears).",
        ),
        click.option(
            "--max-runs",
            "max_runs",
            default=None,
            metavar="N",
            help="Stop after N times (update: none clears).",
        ),
        click.option(
            "--catchup-window",
            "catchup_window",
            default=None,
            metavar="D",
            help="Times missed while no scheduler ran fire if at most D old (default 60s).",
        ),
        click.option(
            "--queue", default=None, help="Task queue of the runs (default: the class's, else 'default')."
        ),
        click.option(
            "--app",
            "apps",
            multiple=True,
            metavar="MODULE",
            help="Import the type's module first; TYPE must be defined there.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the schedule as JSON."),
    ]
    if create:
        options.append(click.option("--paused", is_flag=True, help="Create it paused."))

    def apply(fn: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return apply


CLEARABLE = ("start_at", "end_at", "max_runs")
"""Options ``schedule update`` clears when given ``none`` (``--end-at none``: no end any more)."""


def _changes(fields: dict[str, Any]) -> dict[str, Any]:
    """The spec fields given on the command line (``--args`` parsed as JSON values; ``none``
    for one of :data:`CLEARABLE`: cleared)."""
    out = {k: v for k, v in fields.items() if v not in (None, ())}
    if "args" in out:
        out["args"] = tuple(parse_args(out["args"]))
    for name in CLEARABLE:
        if isinstance(out.get(name), str) and out[name].strip().lower() == "none":
            out[name] = None
    if isinstance(out.get("max_runs"), str):
        try:
            out["max_runs"] = int(out["max_runs"])
        except ValueError:
            raise click.BadParameter(
                f"{out['max_runs']!r} is not a number (or none)", param_hint="--max-runs"
            ) from None
    return out


def _lines(desc: ScheduleDescription) -> list[str]:
    spec = desc.spec
    # Older versions stored "paused"/"unpaused" as the note of a pause without one: it only
    # repeats the state.
    note = desc.note if desc.note not in ("paused", "unpaused") else ""
    when = f"cron {spec.cron!r} ({spec.timezone})" if spec.cron else f"every {_interval(spec.every)}"
    lines = [
        f"schedule: {desc.id}",
        f"workflow: {spec.workflow} {to_json(list(spec.args))}"
        + (f" on queue {spec.queue}" if spec.queue else ""),
        f"when: {when}, overlap {spec.overlap}"
        + (f", jitter {spec.jitter:g}s" if spec.jitter else "")
        + (f", max runs {spec.max_runs}" if spec.max_runs else "")
        + (f", from {iso(parse_moment(spec.start_at, 'start_at'))}" if spec.start_at is not None else "")
        + (f", until {iso(spec.end_ms)}" if spec.end_ms is not None else ""),
        f"state: {desc.state}"
        + (f" ({note})" if note else "")
        + (", paused" if desc.paused and desc.state != "paused" else "")
        + f"; fired {desc.fired}, started {desc.started}",
        "next: " + (", ".join(desc.next_times) if desc.next_times else "-"),
    ]
    if desc.overdue:
        lines.append(f"overdue: {desc.overdue}")
    if desc.held_up:
        lines.append(f"held up: {desc.held_up}")
    if desc.buffered:
        more = f" (and {len(desc.buffered) - 5} more)" if len(desc.buffered) > 5 else ""
        lines.append(f"buffered ({len(desc.buffered)}): " + ", ".join(desc.buffered[:5]) + more)
    for claimed in desc.claimed:  # a time waiting out its jitter
        lines.append(f"claimed: {claimed['scheduled_at']}, starts at {claimed['starts_at']}")
    shown = [
        f"{r['workflow_id']} ({r['status']}"
        + (f", blocked: {r['blocked']}" if r.get("blocked") else "")
        + ")"
        for r in desc.running
    ]
    lines.append("running: " + (", ".join(shown) or "-"))
    lines.append("recent actions:")
    for item in desc.recent_actions[:10]:
        details = ", ".join(
            f"{k}={v}" for k, v in item.items() if k not in ("action", "ts", "at") and v not in (None, [], "")
        )
        lines.append(f"  {item.get('at')}  {item['action']}" + (f"  {details}" if details else ""))
    return lines


def _echo(desc: ScheduleDescription, as_json: bool) -> None:
    if as_json:
        echo(to_json(desc.to_dict()))
    else:
        for line in _lines(desc):
            echo(line)


def _handle(state: CliState, schedule_id: str) -> ScheduleHandle:
    return ScheduleHandle(schedule_id, store=state.existing_store)


def _check_workflow(store: RedisStore, spec: Schedule, apps: tuple[str, ...]) -> str | None:
    """As ``durable start`` does: refuse a type the ``--app`` modules do not define; the
    warning to print when no live worker of the runs' queue runs the type."""
    return check_startable(store, spec.workflow, registry.start_queue(spec.workflow, spec.queue), apps)


def _warn_ended(desc: ScheduleDescription) -> None:
    if desc.state.startswith("ended"):
        end = desc.spec.to_dict()["end_at"]
        if end is None:  # its times run out before year 9999 ends (a Feb 29 from 9997 on)
            said = "it has no scheduled time left before 9999-12-31T23:59:59Z"
        else:
            said = f"end_at {end} " + (
                "is already past" if "passed" in desc.state else "comes before its first scheduled time"
            )
        echo(f"warning: schedule {desc.id} will never fire: {said}", err=True)


@click.group()
def schedule() -> None:
    """Start runs on a cron expression or an interval (see docs/schedules.md).

    Every worker fires the due times; each scheduled time starts one run, whose
    workflow id is `<schedule id>-<UTC ISO time>`.
    """


@schedule.command("create")
@click.argument("schedule_id", metavar="ID")
@_spec_options(create=True)
@pass_state
def create(state: CliState, schedule_id: str, apps: tuple[str, ...], as_json: bool, **fields: Any) -> None:
    """Create schedule ID: run --workflow TYPE on --cron EXPR or --every DURATION.

    Everything is checked first: on bad input nothing is written.
    """
    if apps:
        load_apps(apps)
    spec = Schedule(**_changes(fields))
    warning = _check_workflow(state.store, spec, apps) if apps else None
    handle = ScheduleHandle.create(schedule_id, spec, store=state.store)
    desc = handle.describe(runs=False)
    if warning:
        echo(warning, err=True)
    _warn_ended(desc)
    if as_json:
        echo(to_json(desc.to_dict()))
        return
    echo(f"schedule {schedule_id} created; next: {', '.join(desc.next_times[:3]) or '-'}")


@schedule.command("update")
@click.argument("schedule_id", metavar="ID")
@_spec_options(create=False)
@pass_state
def update(state: CliState, schedule_id: str, apps: tuple[str, ...], as_json: bool, **fields: Any) -> None:
    """Change schedule ID's options (the others stay); checked first, nothing written on bad input."""
    changes = _changes(fields)
    if not changes:
        raise click.UsageError("nothing to change: give the options to change (e.g. --every 5m)")
    if apps:
        load_apps(apps)
    handle = _handle(state, schedule_id)
    # Checked before anything is written, on the spec as it will be.
    warning = (
        _check_workflow(state.existing_store, handle.spec.with_changes(**changes), apps) if apps else None
    )
    handle.update(**changes)
    desc = handle.describe(runs=False)
    if warning:
        echo(warning, err=True)
    if as_json:
        echo(to_json(desc.to_dict()))
        return
    echo(f"schedule {schedule_id} updated; next: {', '.join(desc.next_times[:3]) or '-'}")


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array.")
@pass_state
def list_(state: CliState, as_json: bool) -> None:
    """Every schedule: id, workflow, when, state, next time."""
    items = ScheduleHandle.list(store=state.existing_store)
    if as_json:
        echo(to_json([d.to_dict() for d in items]))
        return
    if not items:
        echo("no schedules")
        return
    for d in items:
        when = (
            f"cron '{d.spec.cron}' {d.spec.timezone}" if d.spec.cron else f"every {_interval(d.spec.every)}"
        )
        nxt = d.next_times[0] if d.next_times else "-"
        echo(f"{d.id}  {d.spec.workflow}  {when}  {d.state}  next {nxt}  started {d.started}")
        if d.overdue:
            echo(f"  overdue: {d.overdue}")
        if d.held_up:
            echo(f"  held up: {d.held_up}")


@schedule.command("describe")
@click.argument("schedule_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_state
def describe(state: CliState, schedule_id: str, as_json: bool) -> None:
    """Schedule ID: its spec, the next 5 times, recent actions and the open runs it started."""
    _echo(_handle(state, schedule_id).describe(), as_json)


def _simple(name: str, verb: str) -> click.Command:
    @click.argument("schedule_id", metavar="ID")
    @click.option("--note", default="", help="Why (shown by describe).")
    @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    @pass_state
    def command(state: CliState, schedule_id: str, note: str, as_json: bool) -> None:
        getattr(_handle(state, schedule_id), name)(note)
        if as_json:
            echo(to_json({"id": schedule_id, "paused": name == "pause", "note": note}))
        else:
            echo(f"schedule {schedule_id} {verb}")

    command.__doc__ = f"{name.capitalize()} schedule ID." + (
        " Times passing meanwhile are not made up." if name == "pause" else " It fires from the next time on."
    )
    return schedule.command(name)(command)


_simple("pause", "paused")
_simple("unpause", "unpaused")


@schedule.command("trigger")
@click.argument("schedule_id", metavar="ID")
@click.option(
    "--overlap", type=_POLICIES, default=None, help="Overlap policy for this run (default: the schedule's)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@pass_state
def trigger(state: CliState, schedule_id: str, overlap: str | None, as_json: bool) -> None:
    """Start a run of schedule ID now (its overlap policy applies).

    Prints `workflow_id: ...`; or `buffered: ...` when the policy holds the run until the
    open one closes; or `skipped: ...` when the policy dropped it (nothing starts).
    """
    handle = _handle(state, schedule_id)
    policy = overlap or str(handle.spec.overlap)
    wid = handle.trigger(overlap=overlap)
    if wid is None:
        reason = skip_reason(policy)
        if as_json:
            echo(to_json({"id": schedule_id, "outcome": "skipped", "workflow_id": None, "reason": reason}))
        else:
            echo(f"skipped: {reason}; use --overlap allow_all to start one anyway")
        return
    # Not started yet: buffered by the policy (or, rarely, still being settled by a worker).
    started = state.existing_store.instance_statuses([wid])[0] is not None
    if as_json:
        echo(
            to_json({"id": schedule_id, "outcome": "started" if started else "buffered", "workflow_id": wid})
        )
    elif started:
        echo(f"workflow_id: {wid}")
    else:
        echo(f"buffered: {wid} starts when the open run closes (overlap {policy})")


@schedule.command("backfill")
@click.argument("schedule_id", metavar="ID")
@click.option("--from", "start", required=True, metavar="T", help="First time (ISO; no zone: UTC).")
@click.option("--to", "end", required=True, metavar="T", help="Last time, inclusive.")
@click.option(
    "--overlap", type=_POLICIES, default=None, help="Policy between these runs (default: the schedule's)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the scheduled times and outcomes as JSON.")
@pass_state
def backfill(
    state: CliState, schedule_id: str, start: str, end: str, overlap: str | None, as_json: bool
) -> None:
    """Start the runs of schedule ID's times between --from and --to, as if it had run then.

    Prints how many started, were buffered or were skipped by the overlap policy (and why).
    """
    done = _handle(state, schedule_id).backfill(start, end, overlap=overlap)
    if as_json:
        echo(to_json({"id": schedule_id, **done.to_dict()}))
        return
    counts = [f"{len(done.started)} started"]
    if done.existing:
        counts.append(f"{len(done.existing)} had started already (their runs exist)")
    if done.buffered:
        counts.append(f"{len(done.buffered)} buffered (start one by one as the open run closes)")
    if done.pending:
        counts.append(f"{len(done.pending)} still being settled (see describe)")
    if done.skipped:
        counts.append(f"{len(done.skipped)} skipped: {done.skip_reason}")
    span = f" ({done[0]} .. {done[-1]})" if done else ""
    echo(f"backfill of {schedule_id}: {len(done)} scheduled time(s){span}; " + ", ".join(counts))
    if done.skipped:
        others = "allow_all" if "buffer_all" in (done.skip_reason or "") else "allow_all or buffer_all"
        echo(f"use --overlap {others} to start every one")


@schedule.command("delete")
@click.argument("schedule_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_state
def delete(state: CliState, schedule_id: str, as_json: bool) -> None:
    """Delete schedule ID (the runs it started go on)."""
    _handle(state, schedule_id).delete()
    echo(to_json({"id": schedule_id, "deleted": True}) if as_json else f"schedule {schedule_id} deleted")


COMMANDS = [schedule]


def _interval(every: Any) -> str:
    """``every`` as it is written (``30m``, ``1h``, ``90s``), not in seconds (``1800s``)."""
    ms = round(float(every) * 1000)
    return duration_text(ms) if ms % 1000 == 0 else f"{float(every):g}s"
