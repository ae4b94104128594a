"""Crash tests: real worker processes killed with SIGKILL; another worker finishes the runs."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from apps.basic import SlowSteps
from procs import spawn_worker, stop, workers
from waiting import wait_for

from durable import WorkflowStub

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def assert_sound(stub: WorkflowStub) -> None:
    history = stub.history()
    assert [e.seq for e in history] == list(range(1, len(history) + 1))
    scheduled = [e.data["id"] for e in history if e.type == "ActivityScheduled"]
    completed = [e.data["id"] for e in history if e.type == "ActivityCompleted"]
    assert len(scheduled) == len(set(scheduled)), f"scheduled twice: {scheduled}"
    assert len(completed) == len(set(completed)), f"completed twice: {completed}"


def test_sigkill_mid_activity_another_worker_finishes(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "slow.log"
    victim = spawn_worker(redis_url, extra=("--claim-idle", "1.5"))
    try:
        stub = WorkflowStub.make(SlowSteps).start(str(log), 3, 0.6)
        # Wait until the victim is inside the second activity, then kill it outright.
        wait_for(lambda: log.exists() and "start s1" in log.read_text())
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
    finally:
        stop(victim)
    with workers(redis_url, 1, extra=("--claim-idle", "1.5")):
        assert stub.result(timeout=60) == ["s0", "s1", "s2", "end"]
    assert_sound(stub)
    lines = log.read_text().split("\n")
    assert lines.count("start s1 1") >= 1 and any(
        line.startswith("start s1") for line in lines[lines.index("start s1 1") + 1 :]
    )
    applied = (tmp_path / "slow.log.effects" / "applied.log").read_text().split()
    assert len(applied) == len(set(applied)) == 3, "an idempotency-keyed effect was applied twice"


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
