"""Real worker processes for crash tests: started with the `durable` CLI, always stopped."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

TESTS = Path(__file__).parent
ROOT = TESTS.parent


def spawn_worker(
    redis_url: str,
    *,
    app: str = "apps.basic",
    extra: tuple[str, ...] = (),
    env: dict | None = None,
    hangup: object = None,
) -> subprocess.Popen:
    """Start `durable worker` as a separate process (its own session, so a kill reaches only it).
    ``hangup``: its SIGHUP disposition at start (``signal.SIG_DFL``, ``signal.SIG_IGN``; ``None``:
    inherited from the tests, which ``nohup`` sets to ignored)."""
    environ = dict(os.environ, DURABLE_REDIS_URL=redis_url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
    environ.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--app", app, "--concurrency", "4", *extra],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=None if hangup is None else (lambda: signal.signal(signal.SIGHUP, hangup)),  # type: ignore[arg-type]
    )


def stop(proc: subprocess.Popen, timeout: float = 15) -> int:
    """SIGTERM, wait, SIGKILL if needed; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.stderr is not None:
        proc.stderr.close()
    return proc.returncode


@contextmanager
def workers(redis_url: str, n: int = 1, **kwargs) -> Iterator[list[subprocess.Popen]]:
    procs = [spawn_worker(redis_url, **kwargs) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            stop(proc)


def durable_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``durable ARGS`` as a real process (it ends by itself; a hang fails the test)."""
    env = dict(os.environ, DURABLE_REDIS_URL=url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}", COLUMNS="400")
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def spawn_logged_worker(
    url: str, log: Path, *extra: str, app: str = "apps.basic", env: dict | None = None
) -> subprocess.Popen[bytes]:
    """``durable worker`` with its log in ``log`` (a file: a pipe left unread would block it)."""
    environ = dict(os.environ, DURABLE_REDIS_URL=url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
    environ.update(env or {})
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "--app", app, *extra],
            cwd=ROOT,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextmanager
def supervised_app(
    url: str, app_dir: Path, app: str, *extra: str
) -> Iterator[tuple[subprocess.Popen[bytes], Any, Path]]:
    """``durable worker --app APP --processes 2 EXTRA`` run in ``app_dir`` (the app's own folder,
    as a user runs it); yields the supervisor, the app module imported here (to start its
    workflows) and the supervisor's log. Stops the supervisor, and kills any child it left."""
    log = app_dir / "worker.log"
    path = os.pathsep.join(map(str, (app_dir, TESTS, ROOT)))
    environ = dict(os.environ, DURABLE_REDIS_URL=url, PYTHONPATH=path)
    argv = [sys.executable, "-m", "workers.cli", "worker", "--app", app, "--processes", "2", *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=app_dir, env=environ, stdout=out, stderr=out, start_new_session=True
        )
    sys.path.insert(0, str(app_dir))
    try:
        yield proc, importlib.import_module(app), log
    finally:
        sys.path.remove(str(app_dir))
        sys.modules.pop(app, None)
        left = children(proc.pid)
        stop(proc)
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def children(pid: int) -> set[int]:
    """The pids of ``pid``'s child processes (none once it is gone)."""
    try:
        return {int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except (OSError, ValueError):
        return set()
