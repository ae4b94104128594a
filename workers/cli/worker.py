"""Commands that run workers: ``worker`` (one process, or N under a supervisor) and ``dev``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from durable.errors import ConfigurationError
from durable.ids import check_build_id
from durable.limits import check_queue_name
from durable.retention import ENV, duration_text
from durable.store.redis_store import RedisStore
from durable.store.retention import namespace_retention_ms, set_namespace_retention
from workers.cli.bootstrap import configure_logging, log, run_worker, worker_supervisor
from workers.cli.core import CliError, CliState, Seconds, find_apps, load_apps, pass_state
from workers.cli.server import serve_in_background
from workers.config import WorkerConfig, mask_url
from workers.supervisor import DRAINED_EXIT, READY_FD_ENV, joined_message

from .render import echo

__all__ = ["COMMANDS"]


def _checked_queues(queues: tuple[str, ...]) -> tuple[str, ...]:
    """The ``--queue`` names, each one that ``start`` would take (a worker of a name no run can
    use would wait for nothing, and ``@...`` names are workers' private queues)."""
    try:
        return tuple(check_queue_name(q) for q in queues)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="'--queue'") from None


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
        callback=lambda _ctx, _param, queues: _checked_queues(queues),
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
        type=Seconds(0.1),
        help="Seconds a task may sit with a silent worker before another worker reclaims it.",
    ),
    click.option(
        "--sticky-timeout",
        default=5.0,
        show_default=True,
        type=Seconds(),
        help="Seconds a run's next workflow task may wait unread for the worker that has the run "
        "cached before any worker takes it (0: until that worker's --claim-idle lease lapses).",
    ),
    click.option(
        "--grace",
        default=30.0,
        show_default=True,
        type=Seconds(),
        help="Seconds a stop (SIGTERM/SIGINT) lets running activities finish; the process ends at the "
        "latest 5 s after that, whatever its workflows do.",
    ),
    click.option(
        "--decision-timeout",
        default=2.0,
        show_default=True,
        type=Seconds(),
        metavar="SECONDS",
        help="Longest a decision may run workflow code without yielding (a busy loop, time.sleep): "
        "past it the run is blocked (`durable repair` after the fix) and the worker process exits "
        "for its supervisor to restart. 0: no deadline.",
    ),
    click.option(
        "--unknown-type-grace",
        default=60.0,
        show_default=True,
        type=Seconds(),
        metavar="SECONDS",
        help="A task of a workflow or activity type this worker's --app lacks is left for a worker of "
        "the queue that has it; once no live worker has served the type this long, the task is parked "
        "and its run blocked (`durable repair` after starting such a worker).",
    ),
    click.option(
        "--build-id",
        default=None,
        metavar="BUILD",
        help="Pin runs to this build (default: unversioned, runs continue on whatever code the live "
        "workers have). Runs this worker decides first are pinned to BUILD; 'auto' = a hash of the "
        "--app sources and of the project modules they import. New runs go to the queue's current build: see --promote.",
    ),
    click.option(
        "--promote",
        is_flag=True,
        help="Make --build-id the queues' current build now (new runs go to it). Without it a build "
        "becomes current only when the current one has no live worker left.",
    ),
    click.option(
        "--compatible-build-id",
        "compatible",
        multiple=True,
        metavar="BUILD",
        help="Also decide runs pinned to BUILD (repeatable): this code replays their histories.",
    ),
    click.option(
        "--unversioned",
        is_flag=True,
        help="No build id (the default; overrides --build-id): pin nothing, take any unpinned run.",
    ),
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
    click.option(
        "--metrics-port",
        default=0,
        show_default=True,
        type=click.IntRange(0, 65535),
        metavar="PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (needs the `metrics` extra; with "
        "--processes N one port shows the sum of every process). 0: off. See docs/observability.md.",
    ),
    click.option(
        "--metrics-host",
        default=WorkerConfig.metrics_host,
        show_default=True,
        metavar="HOST",
        help="Address the --metrics-port listens on: this host only by default; 0.0.0.0 (every "
        "interface) lets a Prometheus scraper on another host or outside the worker's container reach it.",
    ),
]


def worker_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options ``worker`` and ``dev`` share (what a :class:`WorkerConfig` holds)."""
    for option in reversed(_worker_options):
        fn = option(fn)
    return retention_option(fn)


retention_option = click.option(
    "--retention",
    envvar=ENV,
    default=None,
    metavar="DURATION",
    help=f"Namespace retention of closed runs (30s, 5m, 1h, 7d), stored in Redis for runs closing from "
    f"now on; a workflow class's `retention` overrides it [env: {ENV}; unset: keep the stored one, "
    "else 3d].",
)


def _open_store(state: CliState) -> RedisStore:
    """The worker's store, once Redis answers (:meth:`CliState.store_when_up`)."""
    return state.store_when_up("worker startup", log)


def _apply_retention(store: RedisStore, options: dict[str, Any]) -> None:
    """Set the namespace's retention, saying so when it changes: it holds for every worker."""
    value = options.pop("retention", None)
    if not value:
        return
    if str(value).strip().isdigit():  # seconds? days? A worker must not guess for the namespace.
        raise CliError(f"--retention {value}: give a unit (30s, 5m, 12h, 7d)")
    before = namespace_retention_ms(store)
    try:
        now = set_namespace_retention(store, value)
    except ConfigurationError as exc:
        raise CliError(f"--retention: {exc}") from None
    if now != before:
        log.warning(
            "namespace retention changed from %s to %s (--retention of this worker): every run "
            "closing from now on is purged %s after it closes, whichever worker closes it%s",
            duration_text(before),
            duration_text(now),
            duration_text(now),
            "; after that its result, history and describe are gone" if now < SHORT_RETENTION_MS else "",
        )


SHORT_RETENTION_MS = 3_600_000
"""A namespace retention below this gets a reminder of what goes with a purged run."""


def _check_builds(options: dict[str, Any]) -> None:
    """Refuse --compatible-build-id on an unversioned worker: it reads no build's runs, so the
    option did nothing, and the runs it was meant for stayed waiting."""
    try:
        for build, option in [(options["build_id"], "--build-id")] + [
            (b, "--compatible-build-id") for b in options["compatible"]
        ]:
            if build is not None:
                check_build_id(build, option)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    if options["compatible"] and (not options["build_id"] or options["unversioned"]):
        raise click.UsageError(
            "--compatible-build-id needs --build-id: only a versioned worker decides runs pinned to a "
            "build; start `durable worker --build-id NEW --compatible-build-id OLD`, or move a run to "
            "unversioned workers with `durable repair ID --unversioned`"
        )


def _config(state: CliState, store: RedisStore, options: dict[str, Any]) -> WorkerConfig:
    """The one :class:`WorkerConfig` of this command line (``store``'s URL, resolved)."""
    return WorkerConfig(
        redis_url=store.url or "",
        apps=tuple(options["apps"]),
        queues=tuple(options["queues"]),
        concurrency=options["concurrency"],
        cache_size=options["cache_size"],
        eager=options["eager"],
        claim_idle=options["claim_idle"],
        sticky_timeout=options["sticky_timeout"],
        grace=options["grace"],
        decision_timeout=options["decision_timeout"],
        unknown_type_grace=options["unknown_type_grace"],
        build_id=options["build_id"],
        compatible=tuple(options["compatible"]),
        unversioned=options["unversioned"],
        promote=options["promote"],
        gc_threshold=options["gc_threshold"],
        log_format=options["log_format"],
        log_level=options["log_level"],
        metrics_port=options["metrics_port"],
        metrics_host=options["metrics_host"],
        embedded_dir=state.embedded_dir,
    )


@click.command()
@worker_options
@click.option(
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Worker processes (more than 1: a supervisor starts and restarts them).",
)
@pass_state
def worker(state: CliState, processes: int, **options: Any) -> None:
    """Serve workflow and activity tasks of QUEUEs, running the --app modules' code.

    SIGTERM/SIGINT: stop claiming, let running activities finish (up to --grace), exit 0; a
    stop still unfinished 5 s later (workflow code that never returns) exits 75. A decision past
    --decision-timeout blocks its run; the process then starts again in place (with --processes
    N its supervisor starts a new one), or exits 70 after 5 such restarts within a minute. SIGHUP, with --processes N > 1: a deploy
    without a gap; the processes are replaced one at a time by new ones (the code on disk now),
    each new one serving before the old one stops; one that cannot start stops the reload and
    leaves the others running. A single process stops on SIGHUP as on SIGTERM.
    """
    _check_builds(options)
    find_apps(options["apps"])  # a typo must not start an embedded Redis first
    if processes == 1:
        load_apps(options["apps"])  # nor an app that fails at import (its children import it)
    store = _open_store(state)
    _apply_retention(store, options)
    config = _config(state, store, options)
    configure_logging(config)
    if processes == 1:
        run_worker(config, store, restart_in_place=True)
        return
    try:
        supervisor = worker_supervisor(config, processes, store=store)
    except (RuntimeError, OSError) as exc:  # --metrics-port: no prometheus-client, port taken
        raise CliError(f"--metrics-port {config.metrics_port}: {exc}") from None
    supervisor.install_signal_handlers()
    code = supervisor.run()
    if supervisor.startup_error is not None:
        # No child could start: the one line a single worker process would have printed
        # (already naming the Redis), not "error:" about the supervisor.
        echo(supervisor.startup_error, err=True)
    if code:
        sys.exit(code)


@click.command(name="worker-process", hidden=True)
@pass_state
def worker_process(state: CliState) -> None:
    """One supervised worker process: its configuration comes from the supervisor's environment."""
    try:
        config = WorkerConfig.from_env(os.environ)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    configure_logging(config)
    state.url = config.redis_url
    # A terminal's hangup reaches the whole process group: what SIGHUP means (a reload, which
    # replaces this process once its successor joined) is the supervisor's to carry out.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    load_apps(config.apps)  # first, as a single worker does: its error line is the same
    if run_worker(config, _open_store(state), on_joined=_join_report()):
        sys.exit(DRAINED_EXIT)  # its supervisor does not start it again


def _join_report() -> Callable[[str], None] | None:
    """What tells the supervisor, on the pipe it named, that this worker is in the registry, and
    its build id (a reload drains the last process of a build it replaces).

    Until then its death is a failure to start, which the supervisor stops retrying when every
    process fails so; from then on ``durable status`` counts the worker.
    """
    raw = os.environ.pop(READY_FD_ENV, "")  # popped: the app's own subprocesses are no child of ours
    if not raw.isdigit():
        return None
    fd = int(raw)

    def report(build: str) -> None:
        try:
            os.write(fd, joined_message(build))
        except OSError:
            pass  # the supervisor is gone: the parent watch stops this worker
        finally:
            os.close(fd)

    return report


@click.command()
@worker_options
@click.option(
    "--port", default=8233, show_default=True, type=click.IntRange(1, 65535), help="The server's port."
)
@click.option("--no-server", is_flag=True, help="Do not serve the HTTP API and web UI.")
@pass_state
def dev(state: CliState, port: int, no_server: bool, **options: Any) -> None:
    """Local development: the embedded Redis (unless --redis/DURABLE_REDIS_URL), one worker, and
    the HTTP API and web UI on 127.0.0.1 (no tokens; needs the server extra)."""
    _check_builds(options)
    store = _open_store(state)
    _apply_retention(store, options)
    config = _config(state, store, options)
    configure_logging(config)
    load_apps(config.apps)  # an app that does not import says so before a banner promising a UI
    shown = mask_url(config.redis_url)
    echo(f"durable dev: Redis at {shown}", err=True)
    echo(f"  export DURABLE_REDIS_URL={shown}", err=True)
    if not no_server:
        try:
            url = serve_in_background(store, port)
        except CliError as exc:  # the port is taken: the worker runs all the same
            echo(f"  (no web UI: {exc}; or --no-server)", err=True)
        else:
            if url:
                echo(f"  web UI and API at {url}", err=True)
            else:
                echo("  (no web UI: pip install -e '.[server]' in durable's checkout)", err=True)
    run_worker(config, store, restart_in_place=True)


COMMANDS = [worker, worker_process, dev]
