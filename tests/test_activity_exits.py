"""An activity that calls ``sys.exit()`` fails its attempt like any error: its retry policy
applies and the workflow sees the failure. ``SystemExit`` went past the attempt unrecorded, so
the task stayed pending and was run again at every reclaim, forever (a tester's report)."""

from __future__ import annotations

from pathlib import Path

import pytest
from apps.exits import ExitingActivity, ExitingAsyncActivity, ExitUncaught

from durable import WorkflowFailed, WorkflowStub


def test_sys_exit_in_an_activity_is_a_failed_attempt(worker, tmp_path: Path) -> None:
    log = tmp_path / "exits.log"
    stub = WorkflowStub.make(ExitingActivity).start(str(log))
    outcome = stub.result(timeout=20)
    assert outcome == {"cause": "builtins.SystemExit", "message": "3"}
    assert log.read_text().splitlines() == ["ran", "ran"]  # max_attempts=2, and no more
    outcomes = sorted(a["outcome"] for a in stub.describe()["attempts"])
    assert outcomes == ["failed", "retry"]


def test_sys_exit_in_an_async_activity_is_a_failed_attempt(worker, tmp_path: Path) -> None:
    """The same from the worker's event loop (asyncio lets SystemExit out of a task: it must not
    end the loop, or every async activity of the worker after it would hang)."""
    log = tmp_path / "exits.log"
    for _ in range(2):  # the loop still runs attempts after the first run's
        stub = WorkflowStub.make(ExitingAsyncActivity).start(str(log))
        assert stub.result(timeout=20) == {"cause": "builtins.SystemExit", "message": "4"}
    assert log.read_text().splitlines() == ["ran"] * 4


def test_a_run_failed_by_an_activity_says_the_workflows_line(worker, tmp_path: Path) -> None:
    """Where it was raised is the workflow's `activity(...)` call, not durable's frame inside it
    (it said durable/replay/core.py in _suspend)."""
    stub = WorkflowStub.make(ExitUncaught).start(str(tmp_path / "exits.log"))
    with pytest.raises(WorkflowFailed):
        stub.result(timeout=20)
    raised_at = stub.describe().to_dict()["raised_at"]
    assert "apps/exits.py:" in raised_at and raised_at.endswith(" in handle"), raised_at
