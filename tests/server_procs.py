"""A real ``durable server`` process for the API tests: started on a free loopback port, stopped by pid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from procs import ROOT, TESTS, stop


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProc:
    """``python -m workers.cli server`` on 127.0.0.1; its stderr goes to ``log`` (read by tests)."""

    def __init__(
        self,
        redis_url: str,
        log: Path,
        *,
        env: dict[str, str] | None = None,
        app: str = "apps.basic",
        host: str = "127.0.0.1",
    ):
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.log = log
        environ = dict(os.environ, DURABLE_REDIS_URL=redis_url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
        environ.pop("DURABLE_SERVER_TOKENS", None)
        environ.pop("DURABLE_SERVER_HOOK_SECRET", None)
        environ.update(env or {})
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.cli",
                "server",
                "--host",
                host,
                "--port",
                str(self.port),
                "--app",
                app,
            ],
            cwd=ROOT,
            env=environ,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"durable server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"durable server not ready within {timeout} s: {self.log.read_text()}")

    def stop(self) -> int:
        code = stop(self.proc)
        self._log_file.close()
        return code

    def client(self, token: str | None = None, **headers: str) -> httpx.Client:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)
