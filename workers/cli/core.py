"""The ``durable`` group: its ``--redis`` option, the per-invocation state, error lines, app loading."""

from __future__ import annotations

import logging
import math
import os
import re
import site
import sys
import sysconfig
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import click
import redis

import durable
from durable import DurableError, codec
from durable.config import check_namespace
from durable.options import MAX_DURATION_S
from durable.release import release
from durable.store.connect import (
    MAX_CLIENTS_FIX,
    BadRedisUrl,
    closed_by_redis,
    cluster_node_url,
    is_max_clients,
    login_refused,
    not_redis,
)
from durable.store.embedded import EmbeddedRedis
from durable.store.key_types import is_wrong_type
from durable.store.outage import Incident, retry_transient
from durable.store.redis_store import RedisStore
from durable.untrusted import NestedTooDeeply, json_loads
from workers.app import app_path, missing_app
from workers.config import mask_secrets, mask_url
from workers.logging import logs_json
from workers.worker import load_app

from .render import echo

__all__ = [
    "CliError",
    "CliState",
    "DurableGroup",
    "cli",
    "find_apps",
    "load_apps",
    "one_line",
    "parse_args",
    "pass_state",
]


class CliError(Exception):
    """A problem the CLI reports as one ``error:`` line (bad input, missing file...)."""


class NoRedisHere(CliError):
    """No Redis is configured and no embedded server runs here (the line names no Redis)."""


def one_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message (``(…)`` when more followed)."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] + (" (…)" if len(lines) > 1 else "")


# --------------------------------------------------------------------------- state


class CliState:
    """Per-invocation settings; the store is opened on first use (``replay`` and ``check`` need none).

    ``url`` is the Redis URL once known: given (``--redis``, ``$DURABLE_REDIS_URL``) or
    resolved to the embedded server's.
    """

    def __init__(self, redis_option: str | None, namespace: str | None = None) -> None:
        self.url: str | None = redis_option or os.environ.get("DURABLE_REDIS_URL") or None
        # Where the URL came from, for the error line of one that does not parse.
        self._given = (self.url, "--redis" if redis_option else "$DURABLE_REDIS_URL")
        #: ``--namespace``, or None: the store reads ``$DURABLE_NAMESPACE`` (default ``durable``).
        self.namespace = namespace
        #: The embedded server's data dir once ``url`` was resolved to it ("": a given URL).
        self.embedded_dir = ""
        self._store: RedisStore | None = None

    @property
    def store(self) -> RedisStore:
        """The store; with no URL configured, the embedded server is started (or reused)."""
        return self._open(start_embedded=True)

    def store_when_up(self, what: str, log: logging.Logger) -> RedisStore:
        """:attr:`store`, once Redis answers: a process (a worker, the server) started while
        Redis is stalled, loading or not up yet waits (a WARNING says for what, once), as a
        running worker does. Read-only commands fail at once instead (an operator waits)."""
        shown = mask_url(self.url) if self.url else "the embedded Redis"
        return retry_transient(lambda: self.store, Incident(log, f"{what} (Redis at {shown})"))

    @property
    def existing_store(self) -> RedisStore:
        """The store of a Redis that already exists: never starts a new embedded server.

        Commands that address existing runs use it: a new, empty server could only
        answer "no workflow with id ..." and would be left running. The project's server
        that was stopped or crashed is restarted (with a note on stderr) when its data is
        in the data dir: the runs asked about are there.
        """
        return self._open(start_embedded=False)

    def _open(self, *, start_embedded: bool) -> RedisStore:
        if self._store is None:
            if self.url is None:
                self.url = _embedded_url(start_embedded)
                self.embedded_dir = str(EmbeddedRedis().data_dir)
            try:
                # An operator's command answers at once, not after riding out an outage.
                self._store = RedisStore(self.url, namespace=self.namespace, client_ride_s=0)
            except BadRedisUrl as exc:
                url, source = self._given
                raise CliError(f"{source}: {exc}" if url == self.url else str(exc)) from None
        return self._store

    @property
    def talked_to(self) -> str | None:
        """The URL of the Redis this invocation opened, or None (it opened none)."""
        return self.url if self._store is not None else None

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def _embedded_url(start: bool) -> str:
    server = EmbeddedRedis()
    if start:
        fresh = not server.has_data()
        url = server.ensure()
        if fresh and server.started_pid is not None:
            # A new, empty server: said once, so that a command run from the wrong folder does
            # not quietly work against a Redis none of the project's runs are in.
            echo(
                f"note: started a new embedded Redis in {server.data_dir} (pid {server.started_pid}); "
                "runs started here are kept there",
                err=True,
            )
        return url
    if server.is_running():
        return server.url
    if server.has_data():
        # The project's own server, stopped or crashed: its runs are on disk, and a command run
        # from the project folder must find them. A folder without data gets no server.
        url = server.ensure()
        if server.started_pid is not None:
            echo(
                f"note: the embedded Redis in {server.data_dir} was not running; "
                f"restarted it (pid {server.started_pid})",
                err=True,
            )
        return url
    raise NoRedisHere(
        f"no Redis here: no --redis URL, no $DURABLE_REDIS_URL and no embedded server running in "
        f"{server.data_dir}; point at yours with --redis URL or `export DURABLE_REDIS_URL=...`, "
        "or run the command from the project folder (a worker logs the URL of its Redis when it starts)"
    )


pass_state = click.make_pass_decorator(CliState)


# --------------------------------------------------------------------------- errors


_ARGV = "durable.argv"  # ctx.meta: the subcommand's line, as the group resolved it


class DurableGroup(click.Group):
    """A click group that turns durable and Redis errors into one ``error:`` line, exit 1.

    The line names the Redis the command talked to (password masked).
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except redis.exceptions.AuthenticationError as exc:
            die(login_refused(_url_of(ctx, opened=False), exc))
        except redis.exceptions.InvalidResponse as exc:
            die(not_redis(_url_of(ctx, opened=False), exc))
        except redis.exceptions.MovedError:  # a cluster client follows MOVED itself
            die(cluster_node_url(_url_of(ctx, opened=False)))
        except redis.exceptions.TimeoutError as exc:
            where = mask_url(_url_of(ctx, opened=False) or "redis")
            die(
                f"Redis at {where} did not answer in time ({one_line(exc).rstrip('.')}): it may be stalled "
                "(stopped by a signal, busy with a long command, swapping) or unreachable over the "
                f"network; check it with `redis-cli -u {where} ping`"
            )
        except redis.exceptions.ConnectionError as exc:
            fix = (
                f"; it has as many connections as its maxclients allows: {MAX_CLIENTS_FIX}"
                if is_max_clients(exc)
                else f"; Redis closed the connection: if it is at its maxclients, {MAX_CLIENTS_FIX}"
                if closed_by_redis(exc)
                else ""
            )
            where = mask_url(_url_of(ctx, opened=False) or "redis")
            die(f"cannot reach Redis at {where}: {one_line(exc).rstrip('.')}{fix}{_stopped_embedded(where)}")
        except NoRedisHere as exc:
            die(str(exc))
        except redis.exceptions.RedisClusterException as exc:  # not a RedisError
            die(f"Redis Cluster at {mask_url(_url_of(ctx, opened=False) or 'redis')}: {one_line(exc)}")
        except redis.exceptions.ClusterDownError as exc:
            die(
                f"redis: {one_line(exc).rstrip('.')}: a master of some of its slots is unreachable and "
                "no replica took over; `redis-cli --cluster check HOST:PORT` names it",
                _url_of(ctx, opened=False),
            )
        except redis.exceptions.RedisError as exc:
            if is_wrong_type(exc):
                die(self._wrong_kind(ctx, ctx.meta.get(_ARGV, []), exc), _url_of(ctx))
            # Named even when it failed while opening (on a cluster, reading its slot map).
            die(f"redis: {one_line(exc)}", _url_of(ctx) or _url_of(ctx, opened=False))
        except CliError as exc:
            die(str(exc), _url_of(ctx))
        except DurableError as exc:
            die(one_line(exc), _url_of(ctx))
        except TimeoutError as exc:
            die(one_line(exc) if str(exc) else "timed out", _url_of(ctx))
        except KeyboardInterrupt:
            die("interrupted", code=130)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        ctx.meta[_ARGV] = list(args)  # the subcommand's line: a key's error reads its WORKFLOW_ID
        return super().resolve_command(ctx, args)

    def _wrong_kind(self, ctx: click.Context, argv: list[str], exc: redis.exceptions.RedisError) -> str:
        """The error line of a command (``argv``) that met a key of the wrong kind: which key
        (Redis's ``WRONGTYPE`` names none), read now: the workflow's own, for a command about
        one (its ``WORKFLOW_ID`` argument), else the namespace's."""
        state = ctx.find_object(CliState)
        if state is None or state.talked_to is None:
            return f"redis: {one_line(exc)}"
        doing = f"durable {ctx.invoked_subcommand}"
        try:
            workflow_id = _workflow_id_of(self, ctx, argv)
            error = state.store.cannot_write(doing, workflow_id, exc) if workflow_id else None
            if error is None or not error.wrong:
                error = state.store.wrong_type_error(exc, doing)
            return one_line(error)
        except redis.exceptions.RedisError:
            return f"redis: {one_line(exc)}"  # what Redis said is all there is


def _workflow_id_of(group: click.Group, ctx: click.Context, argv: list[str]) -> str | None:
    """The ``WORKFLOW_ID`` argument of the subcommand line ``argv``, if it takes one."""
    command = group.get_command(ctx, argv[0]) if argv else None
    if command is None or not any(p.name == "workflow_id" for p in command.params):
        return None
    try:
        with command.make_context(argv[0], argv[1:], parent=ctx, resilient_parsing=True) as sub:
            value = sub.params.get("workflow_id")
    except click.ClickException:
        return None  # the line did not parse: the namespace's keys are read instead
    return value if isinstance(value, str) else None


def _stopped_embedded(url: str) -> str:
    """For a unix socket URL of a project's embedded Redis that is not running: how to start it
    (the URL given to reach it from another folder; only a command run in the project starts it)."""
    if not url.startswith("unix://"):
        return ""
    folder = Path(url.removeprefix("unix://")).parent
    if folder.name != ".durable" or not (folder / "redis.log").exists():
        return ""
    return (
        f"; it is the embedded Redis of {folder.parent}, stopped: any `durable` command run in that folder "
        "without DURABLE_REDIS_URL (a worker, `durable workers`) starts it again"
    )


def _url_of(ctx: click.Context, *, opened: bool = True) -> str | None:
    """The Redis URL of this invocation: the one it opened (``opened``), else the one configured."""
    state = ctx.find_object(CliState)
    if state is None:
        return None
    return state.talked_to if opened else state.url


def die(message: str, url: str | None = None, code: int = 1) -> NoReturn:
    """Print ``error: message`` (naming the Redis ``url``, secrets masked) and exit ``code``."""
    if url and mask_secrets(url) not in mask_secrets(message):  # said once is enough
        message = f"{message} (redis: {url})"
    if logs_json():  # a worker logging JSON lines: its last line is one too
        logging.getLogger("durable.cli").critical("error: %s", message)
    else:
        echo(f"error: {mask_secrets(message)}", err=True)
    sys.exit(code)


# --------------------------------------------------------------------------- input


class Seconds(click.FloatRange):
    """A number of seconds from ``min`` up to :data:`~durable.options.MAX_DURATION_S`, finite:
    ``nan`` passes ``FloatRange`` (no comparison holds), and a worker started with
    ``--claim-idle nan`` or ``inf`` died at ``int(seconds * 1000)`` with a traceback."""

    name = "seconds"

    def __init__(self, min: float = 0) -> None:  # noqa: A002 - FloatRange's own name
        super().__init__(min, MAX_DURATION_S)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds

    def _describe_range(self) -> str:  # "0<=x<=1e+15", not 1000000000000000.0
        return f"{self.min:g}<=x<={self.max:g}"


def parse_args(values: Sequence[str]) -> list[Any]:
    """Each value as JSON, or as a plain string when it is not valid JSON; a value that starts
    like a JSON object, array or string (``{``, ``[``, ``"``) but is not valid JSON is an error,
    not a string: it was meant as JSON (a trailing comma, single quotes)."""
    out = []
    for n, value in enumerate(values, 1):
        try:
            parsed = json_loads(value, standard=True)  # NaN, Infinity: not JSON, so strings
        except NestedTooDeeply:
            raise CliError(f"argument {n} is JSON nested too deeply to read") from None
        except ValueError as exc:
            if _NUMBER.fullmatch(value.strip()):  # past int's digit limit: not a string either
                raise CliError(
                    f"argument {n} is a number of {len(value.strip())} characters, more than can be "
                    f"read; pass it as a JSON string ('\"...\"') if it is one"
                    if "float's range" not in str(exc)
                    else f"argument {n}: {exc}; pass it as a JSON string ('\"...\"') if it is one"
                ) from None
            if value.lstrip()[:1] in ("{", "[", '"'):
                raise CliError(
                    f"argument {n} is not valid JSON: {exc} in {value!r}; fix it, or pass a string "
                    f"starting with {value.lstrip()[0]!r} as a JSON string ('\"...\"')"
                ) from None
            out.append(value)
            continue
        if isinstance(parsed, float) and math.isinf(parsed) and "Infinity" not in value:
            raise CliError(f"argument {n} ({value.strip()[:40]}) is out of a float's range")
        out.append(parsed)
    return out


_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def find_apps(modules: Sequence[str]) -> None:
    """Raise :class:`CliError` if an ``--app`` module cannot be found at all (nothing imported:
    a worker checks before it starts an embedded Redis it would not use)."""
    name = missing_app(modules)
    if name is not None:
        problem = _import_problem(
            name, ImportError(f"No module named {name!r} in {os.getcwd()} or on the Python path")
        )
        raise CliError(f"cannot import app module {name!r}: {problem}")


def load_apps(modules: Sequence[str]) -> list[ModuleType]:
    """Import the ``--app`` modules; a module that cannot be imported is one :class:`CliError`.

    Whatever the module raises while it is imported (a RuntimeError, a missing setting...) is
    the app's problem, not durable's: one line naming it and where in the app's code it rose.
    """
    loaded: list[ModuleType] = []
    for name in modules:
        try:
            loaded += load_app([name])
        except Exception as exc:
            raise CliError(f"cannot import app module {name!r}: {_import_problem(name, exc)}") from None
    return loaded


def _import_problem(name: str, exc: Exception) -> str:
    """What went wrong importing ``--app name``, and where: the rest of its error line."""
    hint = ""
    if name.endswith(".py") or "/" in name:
        dotted = name.removesuffix(".py").replace("/", ".").strip(".")
        hint = f"; --app takes a module name: drop the .py (--app {dotted})"
    if isinstance(exc, SyntaxError):
        where = f"{_shown_path(exc.filename)}, line {exc.lineno}" if exc.filename else f"line {exc.lineno}"
        return f"{exc.msg} ({where}){hint}"
    if isinstance(exc, ImportError):  # "No module named 'x'" says it all, but not where it looked
        what = str(exc)
        if isinstance(exc, ModuleNotFoundError) and exc.name == name.split(".")[0]:
            what += f" in {os.getcwd()} or on the Python path"
    else:
        what = f"{type(exc).__name__}: {one_line(exc)}" if str(exc).strip() else type(exc).__name__
    frame = _app_frame(exc)
    return what + (f" ({frame})" if frame else "") + hint


def _app_frame(exc: BaseException) -> str | None:
    """``file, line N`` of the innermost frame of ``exc`` in the app's own code, or None.

    The app's code is what is not Python's import machinery (frozen), the standard library,
    an installed package, durable or the CLI: the line to fix is there, not in a library the
    app called.
    """
    library = _library_dirs()
    where = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        if filename.startswith("<") or os.path.abspath(filename).startswith(library):
            continue
        where = f"{_shown_path(filename)}, line {lineno}"
    return where


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    dirs += site.getsitepackages() + [site.getusersitepackages()]
    dirs += [os.path.dirname(durable.__file__), os.path.dirname(os.path.dirname(__file__))]  # + workers/
    return tuple(os.path.join(os.path.abspath(d), "") for d in dirs if d)


def _shown_path(filename: str) -> str:
    """``filename`` relative to the current folder when it is under it (as the user typed it)."""
    path = Path(filename).absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- group


@click.group(cls=DurableGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis",
    "redis_option",
    metavar="URL",
    default=None,
    help="Redis URL (default: $DURABLE_REDIS_URL, else the embedded server in .durable/). "
    "Prefer $DURABLE_REDIS_URL for a URL with a password: a command line is visible in `ps`.",
)
@click.option(
    "--namespace",
    "namespace_option",
    metavar="NAME",
    default=None,
    help="Namespace: the prefix of every Redis key, so apps sharing one Redis keep apart "
    "(default: $DURABLE_NAMESPACE, else durable). See docs/security.md.",
)
@click.version_option(version=release(), prog_name="durable")
@click.pass_context
def cli(ctx: click.Context, redis_option: str | None, namespace_option: str | None) -> None:
    """durable: durable workflows on Redis Streams.

    Errors exit with status 1 and one `error: ...` line on stderr.
    Workflow, signal and query arguments are JSON values (or plain strings).
    """
    if namespace_option is not None:
        try:
            namespace_option = check_namespace(namespace_option)
        except DurableError as exc:
            raise click.BadParameter(str(exc), param_hint="--namespace") from None
        _export_namespace(ctx, namespace_option)
    try:  # before any command reads a payload: encrypted runs decode (docs/security.md)
        app_path()  # the hook's module is looked for where --app modules are: the current folder
        codec.install_payload_hook_from_env()
    except DurableError as exc:
        raise CliError(str(exc)) from None
    state = CliState(redis_option, namespace_option)
    ctx.obj = state
    ctx.call_on_close(state.close)


def _export_namespace(ctx: click.Context, name: str) -> None:
    """Put ``--namespace`` in the environment for this command: worker processes the supervisor
    starts inherit it, and so does app code that opens the default store. Restored on close
    (the CLI also runs in-process, under tests)."""
    saved = {var: os.environ.get(var) for var in ("DURABLE_NAMESPACE", "DURABLE_PREFIX")}
    os.environ["DURABLE_NAMESPACE"] = name
    os.environ.pop("DURABLE_PREFIX", None)

    def restore() -> None:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value

    ctx.call_on_close(restore)
