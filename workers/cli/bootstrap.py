"""Turn a :class:`~workers.config.WorkerConfig` into a running worker in this process, or into a
supervisor of worker processes (``--processes N``)."""

from __future__ import annotations

import logging
import os
import pkgutil
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from durable import Activity, Workflow, registry
from durable.errors import ConfigurationError
from durable.store.connect import masked_url
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.store.start_failures import StartFailure
from workers import metrics
from workers.allowed import defined_in
from workers.app import AUTO_BUILD_ID, AUTO_SHAPE, code_build_id, tune_gc
from workers.cli.core import CliError, load_apps
from workers.config import WorkerConfig
from workers.logging import configure
from workers.supervisor import PARENT_ENV, Supervisor
from workers.watchdog import stop_signals
from workers.worker import Worker

__all__ = ["CHILD_COMMAND", "configure_logging", "run_worker", "worker_supervisor"]

log = logging.getLogger("durable.worker")


def configure_logging(config: WorkerConfig) -> None:
    """Set up the process's logging as ``config`` says (a bad level or format is a CliError)."""
    try:
        configure(config.log_level, config.log_format)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _watch_parent(stop: Callable[[], None]) -> None:
    """Under a supervisor: stop when it goes away (SIGKILL leaves no chance to forward)."""
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


def _start_metrics(config: WorkerConfig, store: RedisStore) -> None:
    """Record metrics; serve them unless this is a supervised child (its supervisor serves)."""
    supervised = PARENT_ENV in os.environ and metrics.MULTIPROC_ENV in os.environ
    try:
        if supervised:
            metrics.enable()
        else:
            metrics.serve(config.metrics_port, store, config.queues, host=config.metrics_host)
    except (RuntimeError, OSError) as exc:
        raise CliError(f"--metrics-port {config.metrics_port}: {exc}") from None
    metrics.watch_store(store)


def _publish_search_types(store: RedisStore) -> None:
    """Publish the app's search attribute types; refuse to start on one Redis has with another
    type (the first published stays: runs are indexed by it)."""
    try:
        store.publish_search_types()
    except ConfigurationError as exc:
        raise CliError(str(exc)) from None


def _build_id(config: WorkerConfig, modules: list[Any]) -> str:
    """The worker's build id: ``--build-id``, its code's hash for ``auto``, ``""`` unversioned."""
    build_id = "" if config.unversioned or not config.build_id else config.build_id
    if build_id == AUTO_BUILD_ID:
        return code_build_id(modules)
    if AUTO_SHAPE.fullmatch(build_id) and build_id != (code_id := code_build_id(modules)):
        # An `auto` id given by hand (a hint said to start that build's worker): on other code?
        log.warning(
            "--build-id %s looks like a `--build-id auto` hash, but this code's is %s: if it is not "
            "that build's code, the runs pinned to %s may not replay on it (they are blocked then)",
            build_id,
            code_id,
            build_id,
        )
    return build_id


def _package_hint(modules: Sequence[ModuleType]) -> str:
    """The modules of the ``--app`` packages (not imported: their import may do anything), for
    a worker whose ``--app`` names a package that defines nothing itself."""
    inside = [
        f"{module.__name__}.{found.name}"
        for module in modules
        if hasattr(module, "__path__")
        for found in pkgutil.iter_modules(module.__path__)
    ]
    if not inside:
        return ""
    shown = ", ".join(inside[:5]) + (", ..." if len(inside) > 5 else "")
    return f"; a package's own modules are not imported: it has {shown}"


def _warn_imported_only(modules: list[Any], apps: Sequence[str]) -> None:
    """Say once which workflow and activity classes the ``--app`` modules import from modules
    outside them: a worker runs only the types its ``--app`` modules define, so such a class is
    not run here, and its runs read "no live worker ... defines workflow type ..."."""
    inside = defined_in(apps)  # as workers/allowed.py decides what this worker runs
    found = sorted(
        {
            (obj.__name__, obj.__module__)
            for module in modules
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, Workflow | Activity)
            and obj not in (Workflow, Activity)
            and not inside(obj.__module__)
        }
    )
    if found:
        log.warning(
            "the --app modules import %s from other modules: this worker runs only the types its --app "
            "modules define; add their modules (--app %s) to run them here",
            ", ".join(f"{name} ({module})" for name, module in found),
            " --app ".join(sorted({module for _, module in found})),
        )


def run_worker(
    config: WorkerConfig,
    store: RedisStore,
    on_joined: Callable[[str], None] | None = None,
    *,
    restart_in_place: bool = False,
) -> bool:
    """Import the app, build the worker ``config`` describes on ``store`` and run it until a stop
    signal (or its drain's end); ``on_joined`` is called with its build id (on a thread of its
    own) once the worker is in the registry. ``restart_in_place``: no supervisor runs it, so
    after a runaway decision it starts again itself. Returns whether it stopped because it drained."""
    # A stop (or drain) signal while the app modules are imported must not kill the process
    # half-way: remember it and stop (drain) the worker as soon as it exists.
    early: list[int] = []
    for signum in (*stop_signals(), signal.SIGUSR1):
        signal.signal(signum, lambda num, _frame: early.append(num))
    modules = load_apps(config.apps)
    for clash in registry.name_clashes(config.apps):
        log.warning("%s", clash)
    _warn_imported_only(modules, config.apps)
    _publish_search_types(store)
    if config.gc_threshold:
        tune_gc(config.gc_threshold)
    build_id = _build_id(config, modules)
    worker = Worker(
        store,
        queues=list(config.queues) or ["default"],
        concurrency=config.concurrency,
        app=list(config.apps),
        cache_size=config.cache_size,
        claim_idle_ms=config.claim_idle_ms,
        sticky_timeout_ms=int(config.sticky_timeout * 1000),
        grace=config.grace,
        decision_timeout=config.decision_timeout,
        unknown_type_grace=config.unknown_type_grace,
        eager=config.eager,
        build_id=build_id,
        compatible=config.compatible,
        promote=config.promote,
        types_complete=True,  # load_apps registered the modules' functions too
    )
    worker.restart_in_place = restart_in_place
    log.info(
        "redis: %s; build id: %s; decision timeout: %s",
        # Named so that commands run from another folder can be pointed at the same Redis.
        masked_url(config.redis_url) + (" (embedded)" if config.embedded_dir else ""),
        build_id or "(unversioned)",
        f"{config.decision_timeout:g} s" if config.decision_timeout > 0 else "off",
    )
    info = worker.membership.info
    own = [name for name in (*info.workflows, *info.activities) if not name.startswith("durable.")]
    if not own:  # (durable.* are the library's own, e.g. the session activity)
        # Most likely the wrong module: the worker would serve its queues and never run anything.
        log.warning(
            "--app %s defines no workflow and no activity: this worker runs nothing "
            "(point --app at the module that defines them%s)",
            ", ".join(config.apps),
            _package_hint(modules),
        )
    if config.metrics_port:
        _start_metrics(config, store)
    if config.embedded_dir:  # the project's own server: a worker starts it again if it dies
        worker.revive_redis = EmbeddedRedis(config.embedded_dir).revive
    if on_joined is not None:
        threading.Thread(
            target=lambda: worker.joined.wait() and on_joined(build_id), name="durable-joined", daemon=True
        ).start()
    worker.install_signal_handlers()
    # Through the handler, so the stop is bounded (grace + a margin) like a signal's.
    stop = lambda: os.kill(os.getpid(), signal.SIGTERM)  # noqa: E731
    if signal.SIGUSR1 in early:
        worker.drain()
    if set(early) - {signal.SIGUSR1}:
        stop()
    _watch_parent(stop)
    worker.run()
    return worker.membership.drained


#: The hidden ``durable`` command a supervised worker process runs.
CHILD_COMMAND = "worker-process"


def worker_supervisor(
    config: WorkerConfig, processes: int, *, store: Any = None, **options: Any
) -> Supervisor:
    """A supervisor of ``processes`` worker processes, each configured by ``config``.

    ``options`` are :class:`Supervisor`'s keyword arguments (backoff, ``kill_after``...).
    With ``config.metrics_port`` the supervisor serves the children's metrics (and the
    task queues of ``store``) on that port of ``config.metrics_host``.

    Raises:
        RuntimeError: ``--metrics-port`` without ``prometheus-client``.
        OSError: the metrics port cannot be bound.
    """
    env = dict(os.environ)
    env.update(config.to_env())
    metrics_dir = None
    if config.metrics_port:
        if not metrics.available():
            metrics.serve(config.metrics_port, None, ())  # raises, naming the extra to install
        metrics_dir = tempfile.mkdtemp(prefix="durable-metrics-")
        env[metrics.MULTIPROC_ENV] = metrics_dir
        try:
            metrics.serve(
                config.metrics_port, store, config.queues, host=config.metrics_host, multiproc_dir=metrics_dir
            )
        except BaseException:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            raise
    argv = [sys.executable, "-m", "workers.cli", CHILD_COMMAND]
    if store is not None:
        options.setdefault("on_start_failure", _start_failure_note(store, tuple(config.queues)))
    return Supervisor(argv, processes, env=env, metrics_dir=metrics_dir, **options)


def _start_failure_note(store: Any, queues: tuple[str, ...]) -> Callable[[str | None, float], None]:
    """What a supervisor tells when its worker processes die before joining (or one joined):
    written where ``durable status`` / ``durable workers`` read it."""
    me = f"{socket.gethostname()}:{os.getpid()}"

    def note(error: str | None, retry_s: float) -> None:
        if error is None:
            store.clear_start_failure(me)
        else:
            store.say_start_failure(StartFailure(me, queues, error, retry_s))

    return note
