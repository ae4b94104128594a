"""A run that does not close says what it waits on: ``durable status`` and a ``result()`` that
times out name its timer, signal, hook or child (or what blocks it), with the deadline.

Real Redis (the shared test server) and a real worker in a thread of the test process.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from apps.basic import SlowSteps, Waiter
from click.testing import CliRunner
from waiting import wait_for

from durable import AsyncWorkflowStub, Workflow, WorkflowStub, all, timer
from durable.store.redis_store import RedisStore
from durable.waiting import in_words, waits_in_words
from workers.cli import cli
from workers.worker import Worker


def test_each_kind_of_wait_in_words() -> None:
    now = 1_000_000  # 1970-01-01 00:16:40 UTC
    pending = [
        {"kind": "timer", "id": "3", "deadline": now + 3_600_000},
        {"kind": "signal", "id": "4", "name": "approve", "deadline": now + 90_000},
        {"kind": "signal", "id": "5", "name": "go"},
        {"kind": "hook", "id": "h-1", "name": "callback"},
        {"kind": "wait_until", "id": "6", "deadline": now - 5_000},
        {"kind": "child", "id": "7", "workflow_id": "kid-1"},
        {"kind": "child", "id": "8", "workflow_id": "kid-2", "state": "child kid-2: running"},
        {"kind": "activity", "id": "9", "name": "charge", "queue": "default"},
        {"kind": "frontier", "id": ""},
        {"kind": "timer", "id": "10", "deadline": 10**15},  # set for ages: past any date
    ]
    assert waits_in_words(pending, now) == [
        "timer 3: fires 1970-01-01 01:16:40 UTC, in 60 min",
        "signal 'approve': times out 1970-01-01 00:18:10 UTC, in 90 s",
        "signal 'go'",
        "hook 'callback'",
        # Past its time by more than two heartbeats: a live worker's scheduler would have fired it.
        "a wait_until condition (6): times out 1970-01-01 00:16:35 UTC, 5.0 s ago (overdue: no live "
        "worker's scheduler has fired it; `durable workers` shows their heartbeats)",
        "child kid-1",
        "child kid-2: running",
        "timer 10: fires after 9999-12-31 UTC",
    ]


def test_a_deadline_past_while_a_workflow_task_waits_is_not_blamed_on_the_schedulers() -> None:
    """After a kill -9 mid-decision the timer had fired (its input waited with the task the
    dead worker held), yet status said "no live worker's scheduler has fired it"."""
    now = 1_000_000
    pending = [{"kind": "timer", "id": "1", "deadline": now - 16_000}]
    (said,) = waits_in_words(pending, now, task_pending=True)
    assert said.endswith("16 s ago (passed: it moves once its workflow task is decided)"), said
    assert "overdue" in waits_in_words(pending, now)[0]  # with no task pending: no scheduler fired it


def test_in_words_adds_activities_and_signals_nothing_awaited() -> None:
    pending = [{"kind": "activity", "id": "2", "name": "charge"}, {"kind": "signal", "id": "3", "name": "go"}]
    buffered = {"og": 2, "approve": 1}
    assert in_words(pending, 0, buffered) == (
        "waiting for signal 'go'; received, not awaited yet: signal 'approve' x1, signal 'og' x2"
    )
    assert in_words(pending, 0, None, activities=True) == "waiting for activity charge (2); signal 'go'"
    assert in_words(pending[:1], 0, {}) == ""


def _suspended(stub: WorkflowStub, seq: int) -> None:
    """Wait until the run's decisions have reached history length ``seq`` and it sleeps."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        info = stub.describe()
        if info.status == "suspended" and (info.seq or 0) >= seq:
            return
        time.sleep(0.05)
    raise AssertionError(f"run did not suspend: {stub.describe().to_dict()}")


def test_status_and_a_timed_out_result_say_what_the_run_waits_on(worker: Worker) -> None:
    stub = WorkflowStub.make(Waiter, id="w-words").start(3600)
    _suspended(stub, 2)
    with pytest.raises(TimeoutError) as timed_out:
        stub.result(timeout=0.3)
    message = str(timed_out.value)
    assert message.startswith(
        "workflow 'w-words' did not close within 0.3 s: it is suspended, waiting for timer "
    )
    assert ": fires " in message and ", in 60 min" in message
    assert "`durable describe w-words` says more" in message

    out = CliRunner().invoke(cli, ["status", "w-words"], catch_exceptions=False).output
    assert out.startswith("suspended (waiting for timer ") and ", in 60 min)" in out
    out = CliRunner().invoke(cli, ["describe", "w-words"], catch_exceptions=False).output
    assert "(in 60 min)" in out  # the pending timer's deadline, and how far off it is

    # A zero timer is no wait: this run waits on its signal alone.
    WorkflowStub.make(Waiter, id="w-words-2").start(0)
    stub2 = WorkflowStub.load("w-words-2")
    _suspended(stub2, 2)
    out = CliRunner().invoke(cli, ["status", "w-words-2"], catch_exceptions=False).output
    assert out == "suspended (waiting for signal 'go')\n"
    stub2.signal("og", "misspelt")  # buffered: nothing awaits it
    _suspended(stub2, 3)
    out = CliRunner().invoke(cli, ["status", "w-words-2"], catch_exceptions=False).output
    assert out == "suspended (waiting for signal 'go'; received, not awaited yet: signal 'og' x1)\n"

    async def wait_async() -> str:
        with pytest.raises(TimeoutError) as timed_out:
            await AsyncWorkflowStub(stub2).result(timeout=0.2)
        return str(timed_out.value)

    message = asyncio.run(wait_async())
    assert message.startswith(
        "workflow 'w-words-2' did not close within 0.2 s: it is suspended, waiting for signal 'go'; received, not awaited yet: signal 'og' x1"
    )
    stub2.signal("go", "now")
    assert stub2.result(timeout=10) == "now"


class WwEightTimers(Workflow):
    """Eight timers at once: more steps than ``durable status`` names."""

    def handle(self) -> None:
        all([lambda i=i: timer(3600 + i) for i in range(8)])


def test_status_says_which_activity_runs_and_caps_a_wide_fan_out(worker: Worker, tmp_path) -> None:
    slow = WorkflowStub.make(SlowSteps, id="w-slow").start(str(tmp_path / "slow.log"), 1, 5.0)
    wait_for(lambda: any(s.get("worker") for s in slow.describe().pending), timeout=20)
    out = CliRunner().invoke(cli, ["status", "w-slow"], catch_exceptions=False).output
    assert out.startswith("running (activity Slow (1) attempt 1: running on "), out
    assert " since " in out and " UTC" in out, out
    slow.terminate("test over")

    wide = WorkflowStub.make(WwEightTimers, id="w-wide").start()
    _suspended(wide, 9)
    out = CliRunner().invoke(cli, ["status", "w-wide"], catch_exceptions=False).output
    assert out.count("timer ") == 5 and out.endswith("; 3 more)\n"), out


def test_a_timed_out_result_says_no_worker_serves_the_run(store: RedisStore) -> None:
    stub = WorkflowStub.make(Waiter, id="w-nobody", store=store).start(1)
    with pytest.raises(TimeoutError) as timed_out:
        stub.result(timeout=0.2)
    message = str(timed_out.value)
    assert message.startswith("workflow 'w-nobody' did not close within 0.2 s: it is pending, blocked: ")
    assert "no live worker" in message
    # A worker started elsewhere may use another Redis: the message says which one this is.
    assert message.endswith(f"[this client uses Redis {store.url}]")
    cli_run = CliRunner().invoke(cli, ["result", "w-nobody", "--timeout", "0.2"])
    assert cli_run.exit_code == 1
    assert cli_run.output.count(str(store.url)) == 1, cli_run.output  # named once, not twice
    # A longer wait says why after 2 s (stderr), and goes on waiting until its timeout.
    cli_run = CliRunner().invoke(cli, ["result", "w-nobody", "--timeout", "3"])
    lines = cli_run.output.splitlines()
    assert cli_run.exit_code == 1 and len(lines) == 2, cli_run.output
    assert lines[0].startswith(
        "note: still waiting: workflow 'w-nobody' did not close within 2 s: it is pending, "
    )
    assert lines[1].startswith("error: workflow 'w-nobody' did not close within 3 s: it is pending, ")
