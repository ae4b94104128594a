"""Crash tests: real worker processes killed with SIGKILL; another worker finishes the runs."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from apps.basic import SlowSteps
from procs import spawn_worker, stop, workers
from scenarios import sigkill_mid_activity
from waiting import wait_for

from durable import WorkflowStub

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def test_sigkill_mid_activity_another_worker_finishes(redis_url: str, tmp_path: Path) -> None:
    sigkill_mid_activity(redis_url, tmp_path)


def test_sigterm_finishes_in_flight_activity_and_exits(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "slow.log"
    proc = spawn_worker(redis_url)
    try:
        stub = WorkflowStub.make(SlowSteps).start(str(log), 1, 1.0)
        wait_for(lambda: log.exists() and "start s0" in log.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        stop(proc)
    # The activity finished before exit; its completion is in the inbox or history.
    with workers(redis_url, 1):
        assert stub.result(timeout=30) == ["s0", "end"]
    assert log.read_text().count("start s0") == 1
