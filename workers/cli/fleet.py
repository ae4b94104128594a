"""Commands about the workers: ``workers`` (who is live, what they serve), ``promote`` and
``drain``.

Also the CLI's view of a run no live worker can move -- pinned to a build none serves, or on a
queue none serves (:func:`mark_unserved`): ``list`` shows it as blocked (``status`` and
``describe`` through the store's ``why_blocked``), with the reason, computed on read from the
worker registry.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from durable import registry
from durable.blocked import HISTORY_FULL
from durable.history_budget import history_full_reason
from durable.retention import duration_text
from durable.runinfo import NO_LIVE_WORKER, span
from durable.store.child_blocks import runs_blocked_by_children
from durable.store.held import STARVED_QUEUE, starved, starved_queues, starved_reason, threads_note
from durable.store.key_types import REMEDY
from durable.store.records import HEARTBEAT_S, OPEN_STATUSES
from durable.store.redis_store import RedisStore
from durable.store.retention import namespace_retention_ms
from durable.store.run_list import RunPage, parse_cursor
from durable.store.workers import (
    WorkerInfo,
    drain_targets,
    no_worker_reason,
    served_queues,
    stalled_decision,
    takes_new_runs,
)
from workers.cli.core import CliError, CliState, pass_state
from workers.cli.render import console, to_json
from workers.config import mask_url

from .render import echo, styled

__all__ = [
    "COMMANDS",
    "blocked_page",
    "fleet_report",
    "mark_blocked_children",
    "mark_unserved",
    "marked",
]


def mark_unserved(records: Iterable[MutableMapping[str, Any]], live: Sequence[WorkerInfo]) -> None:
    """Set ``blocked`` (and ``blocked_kind``) on each open run record whose history is full with
    only inputs to wait on (:func:`~durable.history_budget.history_full_reason`), or that no
    live worker can move (:func:`~durable.store.workers.no_worker_reason`: its pinned build, or its queue, has no
    live worker), or whose activity waits on a queue whose live workers' threads are all held by
    hung activities (:func:`~durable.store.held.starved_reason`: restart them); records blocked
    for another reason keep theirs."""
    starved_at = starved_queues(live)
    for record in records:
        reason = no_worker_reason(record, live)
        full = history_full_reason(record) if record.get("status") in OPEN_STATUSES else None
        if full and not record.get("blocked"):  # as describe puts it first: nothing can move it
            record["blocked"] = full
            record["blocked_kind"] = HISTORY_FULL
        elif reason:
            record["blocked"] = reason
            record["blocked_kind"] = NO_LIVE_WORKER
        elif (held := starved_reason(record, starved_at)) is not None:
            record["blocked"] = held
            record["blocked_kind"] = STARVED_QUEUE


def mark_blocked_children(
    store: RedisStore, records: Sequence[MutableMapping[str, Any]], live: Sequence[WorkerInfo]
) -> None:
    """Set ``blocked`` (and ``blocked_kind``) on each open run record not blocked itself that
    waits on a blocked child (:func:`~durable.store.child_blocks.runs_blocked_by_children`:
    bounded, a few pipelined reads for all the rows), as ``describe`` says it."""
    rows = [r for r in records if not r.get("blocked") and r.get("status") in OPEN_STATUSES]
    for record, reason in zip(
        rows, runs_blocked_by_children(store, rows, lambda r: no_worker_reason(r, live)), strict=True
    ):
        if reason is not None:
            record["blocked"] = reason.message
            record["blocked_kind"] = reason.kind


def marked(
    store: RedisStore, records: list[dict[str, Any]], live: Sequence[WorkerInfo]
) -> list[dict[str, Any]]:
    """``records`` with the runs no live worker can move (:func:`mark_unserved`) and the open
    runs waiting on a blocked child (:func:`mark_blocked_children`) marked blocked, as every
    runs list shows them."""
    mark_unserved(records, live)
    mark_blocked_children(store, records, live)
    return records


_UNSERVED_CHUNK = 500
_UNSERVED_SCAN = 20_000
_BOTTOM = (-1, "")  # below every (created ms, run id): a list read to its end


def blocked_page(store: RedisStore, *, limit: int, cursor: str | None = None, **filters: Any) -> RunPage:
    """The runs a ``blocked`` list holds (``durable list --status blocked``, the API's
    ``status=blocked``): the open runs blocked on record, those no live worker can move
    (:func:`~durable.store.workers.no_worker_reason`: no live worker serves their queue or
    build, or defines their type), and those waiting on a pending child blocked for any of
    these reasons, newest first, marked as :func:`marked` marks them.

    Two reads merged newest first: the blocked index, and the open runs of the same span
    (checked against the live workers; at most 20,000 read per page). The page holds only what
    both have read; ``next`` resumes where the shallower one stopped, so no run is skipped or
    repeated however many newer runs are not blocked.

    Args:
        store: The store.
        limit: At most this many runs.
        cursor: The ``next`` of the previous page, or a time (runs created before it).
        filters: ``workflow_type``, ``id_prefix``, ``since_ms``, ``until_ms`` of
            :meth:`~durable.store.run_list.RunQueries.list_runs_page`.

    Raises:
        ValueError: a malformed cursor.
    """
    live = store.live_workers()
    recorded = store.list_runs_page(status="blocked", cursor=cursor, limit=limit, **filters)
    found = {(r["created"], r["run_id"]): r for r in marked(store, recorded.runs, live)}
    recorded_end, scanned = _end(recorded.next), recorded.scanned
    while True:
        chunk = store.list_runs_page(cursor=cursor, limit=_UNSERVED_CHUNK, scan=_UNSERVED_CHUNK, **filters)
        scanned += chunk.scanned
        for record in marked(store, chunk.runs, live):
            if record.get("blocked") and record.get("status") in OPEN_STATUSES:
                found.setdefault((record["created"], record["run_id"]), record)
        cursor, open_end = chunk.next, _end(chunk.next)
        if open_end <= recorded_end or scanned >= _UNSERVED_SCAN:
            break
        if sum(key >= open_end for key in found) >= limit:
            break
    frontier = max(recorded_end, open_end)  # both reads are complete down to here
    keys = sorted((key for key in found if key >= frontier), reverse=True)
    if len(keys) >= limit:
        keys = keys[:limit]
        frontier = keys[-1]
    following = None if frontier == _BOTTOM else f"{frontier[0]}:{frontier[1]}"
    return RunPage(runs=[found[key] for key in keys], next=following, scanned=scanned)


def _end(cursor: str | None) -> tuple[int, str]:
    """Down to where a page's read went: its ``next`` cursor, or the bottom (read to the end)."""
    return parse_cursor(cursor) if cursor else _BOTTOM


def check_defined(workflow_type: str, apps: Sequence[str]) -> None:
    """Refuse (:class:`CliError`) a type the loaded ``--app`` modules do not define (none loaded:
    any type may be named), naming the nearest one."""
    if apps and workflow_type not in registry.workflows():
        known = sorted(registry.workflows())
        near = difflib.get_close_matches(workflow_type, known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f" (it defines: {', '.join(known) or 'none'})"
        raise CliError(f"workflow type {workflow_type!r} is not defined in --app {', '.join(apps)}{hint}")


def check_startable(store: RedisStore, workflow_type: str, queue: str, apps: Sequence[str]) -> str | None:
    """Before ``durable start``: refuse a type the loaded ``--app`` modules do not define
    (:func:`check_defined`); return a warning when no live worker of ``queue`` runs the type."""
    check_defined(workflow_type, apps)
    live = store.live_workers()
    # As the views count them: a stopping or draining worker (or one of a build not current)
    # starts no new run, so it does not count here either.
    (current,) = store.current_build([queue])
    if any(workflow_type in w.workflows for w in takes_new_runs(queue, current, live)):
        return None
    others = [w for w in live if queue in w.queues and workflow_type in w.workflows]
    why = "".join(f"; worker {w.name} is {w.state}" for w in others if w.state != "serving")
    return (
        f"warning: no live worker on queue {queue!r} runs workflow type {workflow_type!r}{why}; "
        "the run waits until one starts (see `durable workers`)"
    )


def _worker_row(w: WorkerInfo, now: int) -> dict[str, Any]:
    """One worker of :func:`fleet_report`."""
    return {
        "name": w.name,
        "host": w.host,
        "pid": w.pid,
        "build_id": w.build or None,
        "compatible": list(w.compatible),
        # The release of durable it runs (None: an older release, which did not say).
        "release": w.release or None,
        "queues": list(w.queues),
        "workflows": list(w.workflows),
        # Per workflow type, the patches its class declares (old and new code look alike else).
        "patches": {name: list(ids) for name, ids in w.patches.items()},
        "activities": list(w.activities),
        "started": w.started,
        "last_heartbeat": w.seen,
        "heartbeat_age_s": round(max(0, now - w.seen) / 1000, 1),
        # Activity threads held by abandoned attempts (Python cannot stop a thread).
        "threads": w.threads or None,
        "threads_held": w.held,
        "stuck": list(w.stuck),
        "starved": starved(w),
        "threads_note": threads_note(w),
        # How soon it takes over what a gone worker left (None: its release does not say).
        "claim_idle_ms": w.claim_idle_ms or None,
        "sticky_timeout_ms": w.sticky_timeout_ms if w.claim_idle_ms else None,
        # Stopping: it takes no new task, finishes its running activities, then leaves.
        "stopping_since": w.stopping or None,
        # Draining: it starts no new run, finishes the runs pinned to its build, then stops.
        "draining_since": w.draining or None,
        "pinned_left": w.pinned_left if w.draining else None,
        # A decision past SLOW_DECISION_S without yielding: its main thread waits for it.
        "deciding_run": w.deciding_run or None,
        "deciding_note": stalled_decision(w) or None,
    }


def fleet_report(store: RedisStore) -> dict[str, Any]:
    """What ``durable workers --json`` prints: the live workers; per queue which build is
    current and which workers start its new runs; and per queue its ``backlog``
    (:meth:`~durable.store.workers.WorkerRegistry.queue_backlog`). A queue tasks were sent to
    that no live worker serves is listed too while tasks wait on it (its ``workers`` empty).
    Each worker's ``threads`` (its activity threads), ``threads_held`` and ``stuck`` (those held
    by attempts past their timeout or of closed runs, described: Python cannot stop a thread),
    ``starved`` (all of them are: it runs no activity, restart it) and ``threads_note`` (in words).
    ``redis_memory`` is :meth:`~durable.store.memory.MemoryStore.memory_state`; ``problem`` its
    reason while Redis refuses writes (``maxmemory``), else ``None``; ``warnings`` the settings
    of Redis that can lose durable's data and a Redis nearly full
    (:func:`~durable.store.memory.setup_hazards`), and the data a worker found lost within a day
    (:mod:`durable.store.origins`); ``retention`` the namespace's retention of closed runs (``3d``)."""
    live = store.live_workers()
    now = store.server_time_ms()
    served = served_queues(live)
    candidates = sorted({*served, *store.known_queues()})
    current = dict(zip(candidates, store.current_build(candidates), strict=True))
    backlog = store.queue_backlog(candidates, {w.build for w in live} | set(current.values()))
    queues = [
        q for q in candidates if q in served or backlog[q]["workflow_tasks"] or backlog[q]["activity_tasks"]
    ]
    per_queue = {}
    for queue in queues:
        build = current[queue]
        starters = takes_new_runs(queue, build, live)
        per_queue[queue] = {
            "current_build": build or None,
            "current_build_live": any(w.build == build for w in starters) if build else None,
            "new_runs_to": sorted({w.build or "(unversioned)" for w in starters}),
            "workers": sorted(w.name for w in live if queue in w.queues),
        }
    workers = [_worker_row(w, now) for w in live]
    report: dict[str, Any] = {
        "workers": workers,
        "queues": per_queue,
        "backlog": {q: backlog[q] for q in queues},
    }
    # At maxmemory the workers' heartbeats are refused: the list above may miss live workers.
    memory = store.memory_state()
    report["redis_memory"] = memory.to_dict()
    report["problem"] = memory.reason
    report["warnings"] = (
        list(memory.hazards)
        + [loss.message() for loss in store.recent_data_losses()]
        + store.wrong_kind_warnings()
        + [
            f"task stream {stream} of queue {queue!r} holds another kind of value, not a stream {REMEDY}; "
            "workers do not read it until it is one again"
            for queue in candidates
            for stream in backlog[queue].get("unreadable", ())
        ]
        + [failure.words() for failure in store.start_failures()]  # restarting workers that die at start
        + [
            f"worker {w.name}: its event loop of async activities has not run for {w.async_stall}: every "
            "async def activity of it waits meanwhile; that activity makes a blocking call"
            for w in live
            if w.async_stall
        ]
    )
    # Set by any worker's --retention, for every run closing from now on: shown where workers are.
    report["retention"] = duration_text(namespace_retention_ms(store))
    return report


def _workers_table(report: dict[str, Any], redis_url: str) -> Table:
    table = Table(
        title=f"live workers ({len(report['workers'])})", title_justify="left", caption=f"redis: {redis_url}"
    )
    for col in ("worker", "pid", "build", "queues", "workflows", "activities", "threads", "heartbeat"):
        table.add_column(col, overflow="fold")
    for w in report["workers"]:
        table.add_row(
            w["name"],
            str(w["pid"]),
            (w["build_id"] or "(unversioned)")
            + "".join(f"\n+{b}" for b in w["compatible"])
            + f"\ndurable {w['release'] or '(older release)'}",
            ", ".join(w["queues"]),
            ", ".join(
                f"{n} ({', '.join(w['patches'][n])})" if w["patches"].get(n) else n for n in w["workflows"]
            ),
            ", ".join(w["activities"]),
            _threads_cell(w),
            f"{w['heartbeat_age_s']} s ago" + _state_note(w),
        )
    return table


def _state_note(w: dict[str, Any]) -> str:
    """What a stopping or draining worker does meanwhile, and for how long (Redis time); a
    decision that stalls its main thread."""
    stalled = f"\nstalled: {w['deciding_note']}" if w["deciding_note"] else ""
    since = w["stopping_since"] or w["draining_since"]
    if not since:
        return stalled
    took = _span(w["last_heartbeat"] + w["heartbeat_age_s"] * 1000 - since)
    if w["stopping_since"]:
        return f"\nstopping for {took}: finishing its activities, no new task{stalled}"
    left = w["pinned_left"]
    return (
        f"\ndraining for {took}: {left} open run{'s' if left != 1 else ''} pinned to its build left; "
        f"no new run, stops once none is{stalled}"
    )


def _span(ms: float) -> str:
    """A duration for the workers table: whole seconds, minutes or hours past 2 min (a drain
    may last days: :func:`durable.runinfo.span`)."""
    s = max(0.0, ms / 1000)
    return f"{s:.0f} s" if s < 120 else span(s)


def _threads_cell(w: dict[str, Any]) -> Text | str:
    """A worker's activity threads; in red when attempts past their timeout (or of closed runs)
    hold some (restart it when they hold all)."""
    if not w["threads_held"]:
        return w["threads_note"]
    # The attempts themselves are in --json (``stuck``): the table stays readable.
    lines = [w["threads_note"], "it runs no activity: restart it" if w["starved"] else "see --json: stuck"]
    return styled("\n".join(lines), style="bold red" if w["starved"] else "red")


def _queues_table(report: dict[str, Any]) -> Table:
    table = Table(title="queues", title_justify="left")
    for col in ("queue", "current build", "new runs go to", "workers", "tasks (workflow/activity)", "oldest"):
        table.add_column(col, overflow="fold")
    for queue, q in report["queues"].items():
        current = q["current_build"] or "(none)"
        if q["current_build_live"] is False:
            current = styled(f"{current} (no live worker)", style="red")
        starters = ", ".join(q["new_runs_to"])
        b = report["backlog"][queue]
        table.add_row(
            queue,
            current,
            starters or styled("no live worker takes new runs", style="bold red"),
            str(len(q["workers"])) if q["workers"] else styled("none serves it", style="bold red"),
            f"{b['workflow_tasks']} / {b['activity_tasks']}",
            "-" if b["lag_ms"] is None else f"{b['lag_ms'] / 1000:.1f} s ago",
        )
    return table


@click.command(name="workers")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@pass_state
def workers_(state: CliState, as_json: bool) -> None:
    """The live workers: build ids, queues, the types they run, last heartbeat; and per queue
    (those served, and those tasks wait on that no live worker serves), which build takes new
    runs and the tasks waiting."""
    report = fleet_report(state.existing_store)
    if as_json:
        echo(to_json(report, indent=1))
        return
    out = console()
    if report["problem"]:
        # First: the tables below are what the registry still holds, not the truth.
        out.print(styled(report["problem"], style="bold red"))
        out.print(
            styled(
                "workers' registry heartbeats cannot be written meanwhile: a worker missing below "
                "may well be alive",
                style="red",
            )
        )
    out.print(_workers_table(report, mask_url(state.url or "")))
    if report["queues"]:
        out.print(_queues_table(report))
    out.print(
        f"closed runs are kept {report['retention']} (the namespace's retention; a workflow class may set its own)"
    )
    for warning in report["warnings"]:  # last on the screen: nothing else says it
        out.print(styled(f"warning: {warning}", style="bold yellow"))


@click.command()
@click.argument("build")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    default=("default",),
    show_default=True,
    help="Queue whose new runs go to BUILD (repeatable).",
)
@pass_state
def promote(state: CliState, build: str, queues: tuple[str, ...]) -> None:
    """Make BUILD the current build of QUEUEs: their new runs start on BUILD's workers.

    Runs already pinned to other builds stay with them. Unversioned workers keep taking
    new runs whatever the current build.
    """
    store = state.existing_store
    before = store.current_build(queues)
    store.promote_build(queues, build)
    live = store.live_workers()
    for queue, old in zip(queues, before, strict=True):
        was = "it was current already" if old == build else f"was {old or 'none'}"
        echo(f"queue {queue}: new runs go to build {build} ({was})")
        if not any(queue in w.queues and w.build == build for w in live):
            echo(
                f"warning: no live worker of build {build} serves queue {queue}: start its workers first "
                "(meanwhile a live worker of another build takes the new runs back within seconds)",
                err=True,
            )


@click.command()
@click.argument("names", nargs=-1)
@click.option(
    "--build-id",
    "builds",
    multiple=True,
    metavar="BUILD",
    help="Drain every live worker of BUILD (repeatable).",
)
@pass_state
def drain(state: CliState, names: tuple[str, ...], builds: tuple[str, ...]) -> None:
    """Ask workers to drain: each starts no new run, finishes the runs pinned to its build, then
    stops by itself. From any machine, what `kill -USR1` of the worker does on its own.

    NAMES are worker names as `durable workers` lists them. A worker reads the ask at its next
    heartbeat (within 2 s); `durable workers` then shows how many pinned runs it has left. An
    unversioned worker pins nothing: it stops gracefully at once.
    """
    if not names and not builds:
        raise CliError("name the workers to drain (`durable workers` lists them), or give --build-id BUILD")
    store = state.existing_store
    live = store.live_workers()
    try:
        chosen = drain_targets(live, names, builds)
    except LookupError as exc:
        raise CliError(str(exc.args[0])) from None
    store.ask_drain(w.name for w in chosen)
    for queue in sorted({q for w in chosen for q in w.queues}):
        if not any(queue in w.queues and w not in chosen and w.state == "serving" for w in live):
            echo(
                f"warning: no other live worker serves queue {queue}: its new runs wait for one "
                f"(`durable worker --app YOUR_APP --queue {queue}`)",
                err=True,
            )
    lines = _drain_confirmations(store, [w.name for w in chosen])
    for line in lines:
        echo(line)
    if silent := sum(_NOT_CONFIRMED in line for line in lines):
        # A deploy script must not take an unanswered ask (a stalled worker, one of a release
        # before drains) for a drain under way.
        raise CliError(
            f"{silent} of {len(lines)} worker(s) did not confirm the drain; the ask stays: "
            "`durable workers` shows when they do, or stop them (SIGTERM)"
        )


_NOT_CONFIRMED = "it has not said so"
DRAIN_CONFIRM_S = 2 * HEARTBEAT_S + 1
"""How long ``durable drain`` waits for each worker to say it drains (it reads the ask with its
heartbeat)."""


def _drain_confirmations(store: RedisStore, names: list[str]) -> list[str]:
    """Per worker asked, what its registry entry says within :data:`DRAIN_CONFIRM_S`: draining and
    how many pinned runs it has left, stopping or gone (nothing was pinned), or no answer yet."""
    deadline = time.monotonic() + DRAIN_CONFIRM_S
    while True:
        now = {w.name: w for w in store.live_workers()}
        answered = {n: now.get(n) for n in names if n not in now or now[n].state != "serving"}
        if len(answered) == len(names) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    lines = []
    for name in names:
        w = now.get(name)
        if name not in answered:
            lines.append(
                f"worker {name}: asked to drain, but {_NOT_CONFIRMED} within {DRAIN_CONFIRM_S:.0f} s (it "
                "reads the ask with its heartbeat: stalled, or an older release?); `durable workers` shows it once it does"
            )
        elif w is None or w.stopping or not w.pinned_left:
            lines.append(f"worker {name}: drained (no run pinned to its build was open): stopping")
        else:
            left = f"{w.pinned_left} open run{'s' if w.pinned_left != 1 else ''}"
            lines.append(
                f"worker {name}: draining (build {w.build}): {left} pinned to its build left; it stops once none is"
            )
    return lines


COMMANDS = [workers_, promote, drain]
