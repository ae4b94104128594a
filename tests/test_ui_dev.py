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

from durable import WorkflowStub

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


def test_queue_backlog_counts_waiting_tasks_and_their_age(durable_store) -> None:
    assert durable_store.queue_backlog(["ui-backlog"]) == {
        "ui-backlog": {"workflow_tasks": 0, "activity_tasks": 0, "oldest_ms": None, "lag_ms": None}
    }
    for _ in range(3):  # no worker serves the queue: the tasks wait in its streams
        WorkflowStub.make("Sequence", queue="ui-backlog", store=durable_store).start(1)
    row = durable_store.queue_backlog(["ui-backlog"], ["some-build"])["ui-backlog"]
    assert row["workflow_tasks"] == 3 and row["activity_tasks"] == 0
    assert row["oldest_ms"] is not None and 0 <= row["lag_ms"] < 60_000
