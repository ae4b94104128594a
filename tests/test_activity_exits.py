"""An activity that calls ``sys.exit()`` fails its attempt like any error: its retry policy
applies and the workflow sees the failure. ``SystemExit`` went past the attempt unrecorded, so
the task stayed pending and was run again at every reclaim, forever (a tester's report)."""

from __future__ import annotations

from pathlib import Path

from apps.exits import ExitingActivity, ExitingAsyncActivity

from durable import WorkflowStub


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
