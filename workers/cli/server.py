"""``durable server``: the operator surface's HTTP API on the same Redis as everything else."""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import threading
from pathlib import Path

import click

from durable.store.redis_store import RedisStore
from workers.cli.core import CliError, CliState, load_apps, pass_state
from workers.config import mask_url
from workers.logging import FORMATS, configure

from .render import echo

__all__ = ["COMMANDS", "is_loopback", "serve_in_background"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): only this machine reaches it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8233, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option(
    "--app",
    "apps",
    multiple=True,
    metavar="MODULE",
    help="Module defining workflows (repeatable): queries replay runs here with its code.",
)
@click.option(
    "--auth-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="JSON or TOML file of bearer tokens and roles (see docs/server.md); "
    "or set $DURABLE_SERVER_TOKENS. Never on the command line.",
)
@click.option("--log-level", default="INFO", show_default=True, help="DEBUG, INFO, WARNING, ERROR.")
@click.option("--log-format", type=click.Choice(FORMATS), default="text", show_default=True)
@pass_state
def server(
    state: CliState,
    host: str,
    port: int,
    apps: tuple[str, ...],
    auth_file: Path | None,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the web UI (/) and the HTTP API (/api/v1, /healthz) for this Redis and namespace.

    Without tokens (--auth-file or $DURABLE_SERVER_TOKENS) it listens on loopback only.
    Needs the server extra: pip install -e '.[server]' in durable's checkout.
    """
    try:
        # Lazily: the server extra is optional and every other command works without it.
        import uvicorn

        from workers.server import AuthFileError, Server, create_app, load_auth
    except ImportError as exc:
        raise CliError(
            f"durable server needs the server extra ({exc.name} is missing): pip install -e '.[server]' in durable's checkout"
        ) from None
    try:
        configure(log_level, log_format)
        auth = load_auth(auth_file)
    except (ValueError, AuthFileError) as exc:
        raise CliError(str(exc)) from None
    if not auth.enabled and not is_loopback(host):
        raise CliError(
            f"refusing to listen on {host} without tokens: anyone reaching it could drive every run; "
            "configure tokens (--auth-file FILE or $DURABLE_SERVER_TOKENS, see docs/server.md) "
            "or listen on 127.0.0.1"
        )
    load_apps(apps)
    store = state.store_when_up("durable server startup", logging.getLogger("durable.server"))
    sock = _listen(host, port)  # here, for one error line (uvicorn would log a traceback-like block)
    where = f"[{host}]" if ":" in host else host
    access = (
        f"{len(auth.tokens)} token(s)" if auth.enabled else "no tokens: open to this machine only (loopback)"
    )
    echo(f"durable server on http://{where}:{port} (redis {mask_url(state.url or '')}; auth: {access})")
    if auth.hook_secret is None and any(role == "read" for role, _ in auth.tokens.values()):
        # A read token sees histories and answers queries: a hook token handed to an activity
        # (the callback pattern) is there, and the token alone resumes the hook.
        logging.getLogger("durable.server").warning(
            "read tokens are configured but no hook secret: a holder of a read token can find hook "
            "tokens handed to activities (histories, queries) and resume those hooks; set "
            "DURABLE_SERVER_HOOK_SECRET (or hook_secret in the auth file) and sign webhook bodies"
        )
    config = uvicorn.Config(
        create_app(store, auth),
        host=host,
        port=port,
        log_config=None,  # records go through durable's masking handler (configured above)
        access_log=False,  # the app's own access log masks hook tokens in paths
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    Server(config).run(sockets=[sock])


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``, or one :class:`CliError` naming why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        taken = (
            " (another process listens there: stop it, or give --port)"
            if exc.errno == errno.EADDRINUSE
            else ""
        )
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{taken}") from None
    return sock


def serve_in_background(store: RedisStore, port: int, host: str = "127.0.0.1") -> str | None:
    """Serve the API and UI without tokens on loopback from a daemon thread (``durable dev``).

    Returns:
        The server's URL, or ``None`` when the server extra is not installed.

    Raises:
        CliError: it cannot listen there (the port is taken).
    """
    try:
        # Lazily: the server extra is optional; `durable dev` runs without it.
        import uvicorn

        from workers.server import create_app
    except ImportError:
        return None
    config = uvicorn.Config(
        create_app(store),
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=2,
    )
    sock = _listen(host, port)
    # Off the main thread uvicorn installs no signal handlers: the worker keeps SIGINT/SIGTERM.
    server = uvicorn.Server(config)
    threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="durable-server", daemon=True
    ).start()
    return f"http://{host}:{port}"


COMMANDS = [server]
