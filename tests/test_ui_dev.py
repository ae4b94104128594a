"""``durable dev`` serves the HTTP API and the web UI beside its worker, and prints the URL."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
from procs import ROOT, TESTS, stop
from server_procs import free_port
from waiting import wait_for

pytest.importorskip("uvicorn", reason="the server extra is not installed")


def test_dev_serves_the_ui_and_api_beside_its_worker(durable_redis_url: str, tmp_path) -> None:
    port = free_port()
    env = dict(os.environ, DURABLE_REDIS_URL=durable_redis_url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
    env.pop("DURABLE_SERVER_TOKENS", None)
    log = (tmp_path / "dev.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "dev", "--app", "apps.basic", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=30)
        assert f"web UI and API at {url}" in (tmp_path / "dev.log").read_text()
        with httpx.Client(base_url=url, headers={"X-Durable-Request": "1"}, timeout=30) as c:
            resp = c.post("/api/v1/workflows", json={"type": "Sequence", "args": [3]})
            assert resp.status_code == 201, resp.text
            wid = resp.json()["workflow_id"]
            info = wait_for(
                lambda: (d := c.get(f"/api/v1/workflows/{wid}").json())["status"] == "completed" and d
            )
            assert info["outcome"]["result"] == 3
    finally:
        assert stop(proc) == 0
        log.close()
