"""The ``durable`` command: run workers, start and drive runs, inspect and replay histories.

Every command talks to the Redis given by ``--redis URL``, else
``DURABLE_REDIS_URL``, else the embedded server (started on demand). Errors
exit with status 1 and one line on stderr, ``error: ...`` (no traceback).

Arguments of workflows, signals and queries are JSON values: each positional
is parsed with ``json.loads`` and, if that fails, taken as a plain string
(``durable start Greet alice`` passes ``"alice"``; ``durable start Add 1 2``
passes two integers; quote JSON strings that look like numbers: ``'"42"'``).

``durable history ID --json`` is the export format of ``durable replay``: a
JSON array of ``{"seq", "type", "ts", "data", "raw"}``, where ``seq``, ``type``,
``ts`` and ``data`` are exactly what ``WorkflowStub.history()`` gives (made
JSON-friendly: bytes as base64 ``{"$bytes": ...}``, sets as sorted lists,
datetimes as ISO 8601, exceptions as ``{"$error": type, "message": ...}``) and
``raw`` is the stored entry, base64, from which ``replay`` rebuilds the event
losslessly.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import importlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import redis
from rich.console import Console
from rich.table import Table
from rich.text import Text

from durable import DurableError, HistoryEvent, NondeterminismError, WorkflowStub
from durable.store.redis_store import RedisStore

# --------------------------------------------------------------------------- errors


class CliError(Exception):
    """A problem the CLI reports as one ``error:`` line (bad input, missing file...)."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] + (" (…)" if len(lines) > 1 else "")


class DurableGroup(click.Group):
    """A click group that turns durable and Redis errors into one ``error:`` line, exit 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except redis.exceptions.ConnectionError as exc:
            url = ctx.obj.url if isinstance(ctx.obj, _State) and ctx.obj.url else "redis"
            _die(f"cannot reach Redis at {url}: {_one_line(exc)}")
        except redis.exceptions.RedisError as exc:
            _die(f"redis: {_one_line(exc)}")
        except CliError as exc:
            _die(str(exc))
        except DurableError as exc:
            _die(_one_line(exc))
        except TimeoutError as exc:
            _die(_one_line(exc) if str(exc) else "timed out")
        except KeyboardInterrupt:
            _die("interrupted", code=130)


def _die(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# --------------------------------------------------------------------------- state


class _State:
    """Per-invocation settings; the store is opened on first use (``replay`` needs none)."""

    def __init__(self, redis_option: str | None) -> None:
        self.redis_option = redis_option
        self.url: str | None = redis_option or os.environ.get("DURABLE_REDIS_URL") or None
        self._store: RedisStore | None = None

    @property
    def store(self) -> RedisStore:
        if self._store is None:
            from durable.store.embedded import resolve_redis_url as redis_url

            self.url = redis_url(self.redis_option)
            self._store = RedisStore(self.url)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


pass_state = click.make_pass_decorator(_State)


# --------------------------------------------------------------------------- JSON


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for what history data may hold."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, set | frozenset):
        items = list(value)
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID | Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, BaseException):
        return {"$error": type(value).__name__, "message": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, complex):
        return [value.real, value.imag]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return repr(value)


def to_json(value: Any, *, indent: int | None = None) -> str:
    return json.dumps(value, default=json_default, ensure_ascii=False, indent=indent, allow_nan=True)


def parse_args(values: Sequence[str]) -> list[Any]:
    """Each value as JSON, or as a plain string when it is not valid JSON."""
    out = []
    for value in values:
        try:
            out.append(json.loads(value))
        except ValueError:
            out.append(value)
    return out


def export_history(store: RedisStore, workflow_id: str) -> list[dict[str, Any]]:
    """The current run's history in the export format (see the module docstring)."""
    from durable.client import _public

    ref = store.ref(workflow_id)
    out = []
    for entry in store.history(ref):
        item = _public(entry).to_dict()
        item["raw"] = base64.b64encode(entry.raw).decode("ascii")
        out.append(item)
    return out


# --------------------------------------------------------------------------- rendering


def _console(err: bool = False) -> Console:
    console = Console(stderr=err, highlight=False, soft_wrap=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 160  # pipes and CliRunner: do not fold tables at 80 columns
    return console


def _fmt_ms(ms: Any, fmt: str = "%Y-%m-%d %H:%M:%S.%f") -> str:
    if not isinstance(ms, int | float) or ms <= 0:
        return ""
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC).strftime(fmt)[:-3]


def _short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else to_json(value)
    return text if len(text) <= width else text[: width - 1] + "…"


_SUMMARY_SKIP = {"id", "run_id", "workflow_id", "signal_id", "timeouts", "options", "build_id", "patches"}


def summarize(event: HistoryEvent) -> str:
    """A one-line summary of an event's data for tables."""
    data = event.data
    parts = []
    for key, value in data.items():
        if key in _SUMMARY_SKIP or value in (None, "", [], {}, False):
            continue
        parts.append(f"{key}={_short(value, 60)}")
    return _short(", ".join(parts), 100)


def history_table(events: Sequence[HistoryEvent], title: str | None = None) -> Table:
    table = Table(title=title, show_lines=False)
    table.add_column("seq", justify="right", no_wrap=True)
    table.add_column("time (UTC)", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("id", no_wrap=True)
    table.add_column("data", overflow="fold")
    for e in events:
        style = "red" if e.type in ("WorkflowFailed", "ActivityFailed", "ChildFailed") else None
        table.add_row(
            str(e.seq),
            _fmt_ms(e.ts, "%H:%M:%S.%f"),
            Text(e.type, style=style or ""),
            str(e.data.get("id", "")),
            summarize(e),
        )
    return table


# --------------------------------------------------------------------------- app loading


def _load(modules: Sequence[str]) -> list[ModuleType]:
    from workers.worker import load_app

    try:
        return load_app(modules)
    except ImportError as exc:
        raise CliError(f"cannot import app module: {exc}") from None


# --------------------------------------------------------------------------- group


@click.group(cls=DurableGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis",
    "redis_option",
    metavar="URL",
    default=None,
    help="Redis URL (default: $DURABLE_REDIS_URL, else the embedded server in .durable/).",
)
@click.version_option(package_name="durable", prog_name="durable")
@click.pass_context
def cli(ctx: click.Context, redis_option: str | None) -> None:
    """durable: durable workflows on Redis Streams.

    Errors exit with status 1 and one `error: ...` line on stderr.
    Workflow, signal and query arguments are JSON values (or plain strings).
    """
    state = _State(redis_option)
    ctx.obj = state
    ctx.call_on_close(state.close)


# --------------------------------------------------------------------------- worker

_worker_options: list[Callable[[Any], Any]] = [
    click.option(
        "--app",
        "apps",
        multiple=True,
        required=True,
        metavar="MODULE",
        help="Module defining workflows/activities (repeatable).",
    ),
    click.option(
        "--queue",
        "queues",
        multiple=True,
        default=("default",),
        show_default=True,
        help="Task queue to serve (repeatable).",
    ),
    click.option(
        "--concurrency", default=8, show_default=True, type=click.IntRange(1), help="Activity threads."
    ),
    click.option(
        "--cache-size", default=1000, show_default=True, type=click.IntRange(0), help="Runs cached."
    ),
    click.option(
        "--eager/--no-eager",
        default=False,
        show_default=True,
        help="Run scheduled activities of served queues in this worker and commit each result with "
        "the next decision (fewer round trips per step).",
    ),
    click.option(
        "--claim-idle",
        default=30.0,
        show_default=True,
        type=click.FloatRange(0.1),
        help="Seconds a task may sit with a silent worker before another worker reclaims it.",
    ),
    click.option(
        "--build-id",
        default=None,
        help="Build id of this code (default: a hash of the --app modules' source). Runs this worker "
        "decides first are pinned to it; new runs go to the newest build's workers.",
    ),
    click.option(
        "--compatible-build-id",
        "compatible",
        multiple=True,
        metavar="BUILD",
        help="Also decide runs pinned to BUILD (repeatable): this code replays their histories.",
    ),
    click.option("--unversioned", is_flag=True, help="No build id: pin nothing, take any unpinned run."),
    click.option(
        "--gc-threshold",
        default=10_000,
        show_default=True,
        type=click.IntRange(0),
        help="Allocations between the garbage collector's young-generation passes (Python's default "
        "is 700); 0 leaves the collector as Python sets it. See docs/operations.md.",
    ),
    click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        help="Log format.",
    ),
    click.option("--log-level", default="INFO", show_default=True, help="Log level."),
]


def worker_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_worker_options):
        fn = option(fn)
    return fn


def _configure_logging(level: str, fmt: str) -> None:
    from workers.logging import configure

    try:
        configure(level, fmt)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _watch_parent(stop: Callable[[], None]) -> None:
    """Under a supervisor: stop when it goes away (SIGKILL leaves no chance to forward)."""
    from workers.supervisor import PARENT_ENV

    raw = os.environ.get(PARENT_ENV, "")
    if not raw.isdigit():
        return
    parent = int(raw)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                stop()
                return

    threading.Thread(target=watch, name="durable-parent-watch", daemon=True).start()


def _run_worker(state: _State, apps: Sequence[str], queues: Sequence[str], options: dict[str, Any]) -> None:
    import signal as _signal

    from workers.worker import Worker

    # A stop signal while the app modules are imported must not kill the process
    # half-way: remember it and stop the worker as soon as it exists.
    early: list[int] = []
    for signum in (_signal.SIGTERM, _signal.SIGINT):
        _signal.signal(signum, lambda num, _frame: early.append(num))
    from workers.worker import code_build_id

    modules = _load(apps)
    if options["gc_threshold"]:
        from workers.worker import tune_gc

        tune_gc(options["gc_threshold"])
    build_id = "" if options["unversioned"] else (options["build_id"] or code_build_id(modules))
    worker = Worker(
        state.store,
        queues=list(queues) or ["default"],
        concurrency=options["concurrency"],
        app=list(apps),
        cache_size=options["cache_size"],
        claim_idle_ms=int(options["claim_idle"] * 1000),
        eager=options["eager"],
        build_id=build_id,
        compatible=tuple(options["compatible"]),
    )
    logging.getLogger("durable.worker").info("build id: %s", build_id or "(unversioned)")
    worker.install_signal_handlers()
    if early:
        worker.stop()
    _watch_parent(worker.stop)
    worker.run()


@cli.command()
@worker_options
@click.option(
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Worker processes (more than 1: a supervisor starts and restarts them).",
)
@pass_state
def worker(
    state: _State,
    apps: tuple[str, ...],
    queues: tuple[str, ...],
    log_format: str,
    log_level: str,
    processes: int,
    **options: Any,
) -> None:
    """Serve workflow and activity tasks of QUEUEs, running the --app modules' code.

    SIGTERM/SIGINT: stop claiming, let running activities finish, exit 0.
    """
    _configure_logging(log_level, log_format)
    if processes == 1:
        _run_worker(state, apps, queues, options)
        return
    from workers.supervisor import Supervisor, child_argv

    url = state.store.url or ""
    args = ["--redis", url, "worker", "--processes", "1"]
    for app in apps:
        args += ["--app", app]
    for queue in queues:
        args += ["--queue", queue]
    for build in options["compatible"]:
        args += ["--compatible-build-id", build]
    args += ["--concurrency", str(options["concurrency"]), "--cache-size", str(options["cache_size"])]
    args += ["--claim-idle", str(options["claim_idle"]), "--eager" if options["eager"] else "--no-eager"]
    args += ["--gc-threshold", str(options["gc_threshold"])]
    if options["unversioned"]:
        args.append("--unversioned")
    elif options["build_id"]:
        args += ["--build-id", options["build_id"]]
    args += ["--log-format", log_format, "--log-level", log_level]
    supervisor = Supervisor(child_argv(args), processes)
    supervisor.install_signal_handlers()
    code = supervisor.run()
    if code:
        sys.exit(code)


@cli.command()
@worker_options
@pass_state
def dev(
    state: _State,
    apps: tuple[str, ...],
    queues: tuple[str, ...],
    log_format: str,
    log_level: str,
    **options: Any,
) -> None:
    """Local development: the embedded Redis (unless --redis/DURABLE_REDIS_URL) and one worker."""
    _configure_logging(log_level, log_format)
    store = state.store
    click.echo(f"durable dev: Redis at {store.url}", err=True)
    click.echo(f"  export DURABLE_REDIS_URL={store.url}", err=True)
    _run_worker(state, apps, queues, options)


# --------------------------------------------------------------------------- client commands


def _stub(state: _State, workflow_id: str) -> WorkflowStub:
    return WorkflowStub.load(workflow_id, store=state.store)


@cli.command()
@click.argument("workflow_type", metavar="TYPE")
@click.argument("args", nargs=-1, metavar="[ARGS_JSON]...")
@click.option("--id", "workflow_id", default=None, help="Workflow id (default: generated).")
@click.option("--app", "apps", multiple=True, metavar="MODULE", help="Import the type's module first.")
@click.option("--queue", default=None, help="Task queue (default: the class's, else 'default').")
@click.option("--wait/--no-wait", default=False, show_default=True, help="Wait and print the result.")
@click.option("--timeout", type=float, default=None, help="Seconds to wait with --wait.")
@pass_state
def start(
    state: _State,
    workflow_type: str,
    args: tuple[str, ...],
    workflow_id: str | None,
    apps: tuple[str, ...],
    queue: str | None,
    wait: bool,
    timeout: float | None,
) -> None:
    """Start a run of workflow TYPE with ARGS (JSON values).

    Prints `workflow_id: ...` and `run_id: ...`; with --wait, then the result as
    one JSON line (a failed run exits 1 with an error line). An unregistered TYPE
    is started by name: a worker whose --app defines it will run it.
    """
    if apps:
        _load(apps)
    stub = WorkflowStub.make(workflow_type, id=workflow_id, queue=queue, store=state.store)
    stub.start(*parse_args(args))
    click.echo(f"workflow_id: {stub.id}")
    click.echo(f"run_id: {stub.run_id}")
    if wait:
        click.echo(to_json(stub.result(timeout=timeout)))


@cli.command()
@click.argument("workflow_id", metavar="ID")
@click.argument("name")
@click.argument("args", nargs=-1, metavar="[ARGS_JSON]...")
@pass_state
def signal(state: _State, workflow_id: str, name: str, args: tuple[str, ...]) -> None:
    """Send signal NAME with ARGS (JSON values) to workflow ID's current run."""
    _stub(state, workflow_id).signal(name, *parse_args(args))
    click.echo(f"signal {name!r} sent to {workflow_id}")


@cli.command()
@click.argument("workflow_id", metavar="ID")
@click.argument("name")
@click.argument("args", nargs=-1, metavar="[ARGS_JSON]...")
@click.option(
    "--app", "apps", multiple=True, required=True, metavar="MODULE", help="Module defining the workflow."
)
@pass_state
def query(state: _State, workflow_id: str, name: str, args: tuple[str, ...], apps: tuple[str, ...]) -> None:
    """Call the @query method NAME on workflow ID's state (replayed here from its history)."""
    _load(apps)
    click.echo(to_json(_stub(state, workflow_id).query(name, *parse_args(args))))


@cli.command()
@click.argument("workflow_id", metavar="ID")
@click.option("--reason", default="", help="Why (recorded).")
@pass_state
def cancel(state: _State, workflow_id: str, reason: str) -> None:
    """Request cancellation: the workflow gets CancelledError where it waits and may clean up."""
    _stub(state, workflow_id).cancel(reason)
    click.echo(f"cancellation requested for {workflow_id}")


@cli.command()
@click.argument("workflow_id", metavar="ID")
@click.option("--reason", default="", help="Why (recorded).")
@pass_state
def terminate(state: _State, workflow_id: str, reason: str) -> None:
    """Close workflow ID's run now; no workflow code runs."""
    _stub(state, workflow_id).terminate(reason)
    click.echo(f"terminated {workflow_id}")


@cli.command()
@click.argument("workflow_id", metavar="ID")
@pass_state
def status(state: _State, workflow_id: str) -> None:
    """Print the status word of workflow ID's current run."""
    click.echo(_stub(state, workflow_id).status())


@cli.command()
@click.argument("workflow_id", metavar="ID")
@click.option("--timeout", type=float, default=None, help="Seconds to wait (default: forever).")
@pass_state
def result(state: _State, workflow_id: str, timeout: float | None) -> None:
    """Wait for workflow ID to close; print its result as JSON (a failed run exits 1)."""
    click.echo(to_json(_stub(state, workflow_id).result(timeout=timeout)))


@cli.command()
@click.argument("workflow_id", metavar="ID")
@click.option(
    "--build-id",
    default=None,
    help="Also move the run to this build's workers (check first with `durable replay` that the "
    "new code replays its history).",
)
@pass_state
def repair(state: _State, workflow_id: str, build_id: str | None) -> None:
    """Re-queue a blocked run (after deploying code that decides as its history says)."""
    if build_id:
        state.store.repin(workflow_id, build_id)
    ref = state.store.repair(workflow_id)
    click.echo(f"re-queued {workflow_id} (run {ref.run_id})" + (f" on build {build_id}" if build_id else ""))


@cli.command()
@click.argument("workflow_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
@pass_state
def describe(state: _State, workflow_id: str, as_json: bool) -> None:
    """Status, blocked reason, pending steps and activity attempts of workflow ID."""
    info = _stub(state, workflow_id).describe()
    if as_json:
        click.echo(to_json(info, indent=2))
        return
    console = _console()
    closed = info.get("closed")
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("workflow id", str(info.get("workflow_id")))
    head.add_row("run id", str(info.get("run_id")))
    head.add_row("type", str(info.get("type")))
    head.add_row("status", str(info.get("status")))
    head.add_row("history length", str(info.get("seq", "")))
    head.add_row("created", _fmt_ms(info.get("created")))
    if closed:
        head.add_row("closed", _fmt_ms(closed))
    if info.get("blocked"):
        head.add_row("blocked", Text(str(info["blocked"]), style="bold red"))
    if info.get("signals_buffered"):
        head.add_row("signals buffered", to_json(info["signals_buffered"]))
    if info.get("cancel_requested"):
        head.add_row("cancel requested", "yes")
    console.print(head)
    pending = info.get("pending") or []
    if pending:
        table = Table(title="pending steps", title_justify="left")
        for col in ("kind", "id", "name", "deadline"):
            table.add_column(col)
        for item in pending:
            name = item.get("name") or item.get("workflow_id") or ""
            table.add_row(
                str(item.get("kind", "")), str(item.get("id", "")), str(name), _fmt_ms(item.get("deadline"))
            )
        console.print(table)
    attempts = info.get("attempts") or []
    if attempts:
        table = Table(title="activity attempts", title_justify="left")
        for col in ("activity", "attempt", "outcome", "error", "duration", "time (UTC)"):
            table.add_column(col, overflow="fold")
        for item in attempts:
            record = item.get("record") if isinstance(item.get("record"), dict) else {}
            duration = record.get("duration_ms")
            outcome = str(item.get("outcome", ""))
            table.add_row(
                str(item.get("act", "")) + (f" ({record['name']})" if record.get("name") else ""),
                str(item.get("attempt", "")),
                Text(outcome, style="red" if outcome in ("failed", "retry") else ""),
                _short(record.get("error", ""), 80),
                f"{duration} ms" if duration is not None else "",
                _fmt_ms(item.get("ts")),
            )
        console.print(table)
    dropped = info.get("dropped") or []
    if dropped:
        table = Table(title="dropped inputs", title_justify="left")
        table.add_column("time (UTC)")
        table.add_column("reason", overflow="fold")
        for item in dropped:
            table.add_row(_fmt_ms(item.get("ts")), str(item.get("reason", "")))
        console.print(table)


@cli.command()
@click.argument("workflow_id", metavar="ID")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="A JSON array of {seq, type, ts, data, raw}: the export format of `durable replay`.",
)
@pass_state
def history(state: _State, workflow_id: str, as_json: bool) -> None:
    """The events of workflow ID's current run, as a table or (--json) for export.

    `durable history ID --json > run.json` then `durable replay run.json --app M`
    checks that today's code still decides as that history says.
    """
    if as_json:
        click.echo(to_json(export_history(state.store, workflow_id), indent=1))
        return
    stub = _stub(state, workflow_id)
    events = stub.history()
    _console().print(history_table(events, title=f"{workflow_id} (run {stub.run_id})"))


@cli.command(name="list")
@click.option("--status", "status_", default=None, help="Only runs with this status (or 'blocked').")
@click.option("--type", "workflow_type", default=None, help="Only runs of this workflow type.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1), help="At most N rows.")
@click.option(
    "--before", "before_ms", type=int, default=None, metavar="MS", help="Only runs created before (paging)."
)
@click.option("--dead", is_flag=True, help="Show the dead-letter stream (parked tasks) instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_state
def list_(
    state: _State,
    status_: str | None,
    workflow_type: str | None,
    limit: int,
    before_ms: int | None,
    dead: bool,
    as_json: bool,
) -> None:
    """Runs, newest first; page with --before = the last row's created (ms)."""
    store = state.store
    console = _console()
    if dead:
        letters = store.dead_letters(count=limit)
        if as_json:
            click.echo(to_json(letters, indent=1))
            return
        table = Table(title=f"dead letters ({len(letters)})", title_justify="left")
        for col in ("partition", "entry", "kind", "run", "reason"):
            table.add_column(col, overflow="fold")
        for item in letters:
            table.add_row(
                str(item.get("partition", "")),
                str(item.get("id", "")),
                str(item.get("kind", "")),
                str(item.get("run", "")),
                str(item.get("reason", "")),
            )
        console.print(table)
        return
    runs = store.list_runs(status=status_, workflow_type=workflow_type, limit=limit, before_ms=before_ms)
    if as_json:
        click.echo(
            to_json(
                [
                    {k: v for k, v in r.items() if k not in ("snapshot", "result", "error", "args")}
                    for r in runs
                ],
                indent=1,
            )
        )
        return
    table = Table(title=f"runs ({len(runs)})", title_justify="left")
    for col in ("workflow id", "run id", "type", "status", "created (UTC)", "created ms", "blocked"):
        table.add_column(col, overflow="fold")
    for r in runs:
        table.add_row(
            str(r.get("workflow_id", "")),
            str(r.get("run_id", "")),
            str(r.get("type", "")),
            str(r.get("status", "")),
            _fmt_ms(r.get("created")),
            str(r.get("created", "")),
            Text(str(r.get("blocked") or ""), style="red"),
        )
    console.print(table)


# --------------------------------------------------------------------------- replay


def _history_files(target: Path) -> list[Path]:
    if target.is_dir():
        files = sorted(p for p in target.iterdir() if p.suffix == ".json" and p.is_file())
        if not files:
            raise CliError(f"no .json history files in {target}")
        return files
    if not target.exists():
        raise CliError(f"no such file or directory: {target}")
    return [target]


def load_export(path: Path) -> list[Any]:
    """Rebuild the stored entries of an exported history file (``history --json``)."""
    from durable import events as ev

    try:
        items = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"{path}: not a JSON history export ({exc})") from None
    return ev.from_export(items, str(path))


@cli.command()
@click.argument("target", metavar="FILE_OR_DIR", type=click.Path(path_type=Path))
@click.option(
    "--app", "apps", multiple=True, required=True, metavar="MODULE", help="Module(s) with today's code."
)
def replay(target: Path, apps: tuple[str, ...]) -> None:
    """Replay exported histories (`durable history ID --json`) against today's code.

    Prints OK or DIVERGED per file; exits 1 if any diverged or could not be read.
    Needs no Redis.
    """
    from durable.replay import replay_history

    _load(apps)
    bad = 0
    for path in _history_files(target):
        try:
            entries = load_export(path)
            replay_history(entries)
        except NondeterminismError as exc:
            bad += 1
            click.echo(f"DIVERGED {path}: {_one_line(exc)}")
        except (DurableError, CliError) as exc:
            bad += 1
            click.echo(f"ERROR {path}: {_one_line(exc)}")
        else:
            click.echo(f"OK {path} ({len(entries)} events)")
    if bad:
        sys.exit(1)


# --------------------------------------------------------------------------- check


@cli.command()
@click.option(
    "--app", "apps", multiple=True, required=True, metavar="MODULE", help="Module(s) with the workflows."
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as a JSON array.")
def check(apps: tuple[str, ...], as_json: bool) -> None:
    """Lint the workflows of the --app modules for calls that break replay.

    Flags wall-clock reads, randomness, environment, network, file I/O,
    threads and time.sleep inside Workflow subclasses, each with file:line
    and the durable alternative. Exits 1 if anything is flagged, 0 if not.
    Silence a line with `# durable: ignore`. Needs no Redis.
    """
    from workers.lint import check_modules, findings_table

    findings, classes = check_modules(_load(apps))
    if as_json:
        click.echo(to_json([f.to_dict() for f in findings], indent=1))
    elif findings:
        _console().print(findings_table(findings))
    else:
        click.echo(f"OK: no determinism problems in {classes} workflow class(es)")
    if findings:
        sys.exit(1)


# --------------------------------------------------------------------------- demo


def load_example(name: str = "order") -> ModuleType:
    """``examples/<name>.py`` of the source checkout, imported as ``examples.<name>``.

    ``examples`` is not an installed package, so it is found next to the
    ``workers`` package (an editable install or a checkout) when it cannot be imported.
    """
    module_name = f"examples.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    if path.is_file():
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(module_name, None)
                raise
            return module
    try:
        return importlib.import_module(module_name)
    except ImportError:
        raise CliError(
            f"the demo needs examples/{name}.py from the durable source checkout (looked in {path.parent}); "
            "run it from a checkout installed with `pip install -e .`"
        ) from None


@cli.command()
@click.option(
    "--timeout", type=float, default=60.0, show_default=True, help="Seconds to wait for the result."
)
@pass_state
def demo(state: _State, timeout: float) -> None:
    """Run the order demo: a worker thread, one order workflow, its approval signal, its history."""
    example = load_example("order")
    store = state.store
    console = _console()
    console.print(f"[bold]durable demo[/bold]: Redis at {store.url}")
    summary = example.demo(store, timeout=timeout)
    console.print(f"workflow [bold]{summary['workflow_id']}[/bold], run {summary['run_id']}: completed")
    console.print_json(to_json(summary["result"]))
    console.print(history_table(summary["history"], title="history"))


# --------------------------------------------------------------------------- hooks


@cli.group(cls=DurableGroup)
def hook() -> None:
    """Hooks: durable callbacks a workflow creates with create_hook()."""


@hook.command(name="resume")
@click.argument("token", metavar="TOKEN")
@click.argument("payload", metavar="[PAYLOAD_JSON]", required=False, default=None)
@pass_state
def hook_resume(state: _State, token: str, payload: str | None) -> None:
    """Deliver PAYLOAD_JSON (default: null) to the hook with TOKEN; a token works once.

    PAYLOAD_JSON is a JSON value, or a plain string when it is not valid JSON.
    An unknown or used token exits 1 with one error line.
    """
    value = parse_args([payload])[0] if payload is not None else None
    WorkflowStub.resume_hook(token, value, store=state.store)
    click.echo("hook resumed")


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (``durable = workers.cli:main``)."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="durable")


if __name__ == "__main__":
    main()
