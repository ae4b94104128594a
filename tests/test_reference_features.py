"""End to end through the public API: hooks from the CLI, the history budget, local
activities and patch markers (the reference designs' features)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from apps.features import (
    BudgetLoop,
    BudgetProbe,
    HookFromCli,
    LocalSteps,
    PatchedLoop,
    PricingV1,
    PricingV2,
)
from click.testing import CliRunner, Result
from waiting import wait_for

import durable
from durable import ConfigurationError, HookError, Workflow, WorkflowStub, registry
from durable.replay import replay_history
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask
from workers.cli import cli
from workers.worker import Worker, WorkerThread


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# --------------------------------------------------------------------------- 1. hooks from the CLI


def test_hook_resumed_from_the_cli_once(worker: Worker) -> None:
    stub = WorkflowStub.make(HookFromCli, id="pay-1").start("order-7")
    token = wait_for(lambda: stub.query("hook_token"))
    wait_for(lambda: stub.status() == "suspended")

    # The token is a secret: neither `list` nor `describe` (JSON or table) shows it.
    for args in (("list",), ("list", "--json"), ("describe", "pay-1"), ("describe", "pay-1", "--json")):
        out = invoke(*args)
        assert out.exit_code == 0, out.output
        assert "pay-1" in out.output
        assert token not in out.output, f"`durable {' '.join(args)}` printed the hook token"
    assert token not in json.dumps(stub.describe(), default=str)

    resumed = invoke("hook", "resume", token, '{"paid": true, "amount": 1999}')
    assert resumed.exit_code == 0, resumed.output
    assert token not in resumed.output
    assert stub.result(timeout=15) == {"order": "order-7", "payment": {"paid": True, "amount": 1999}}
    hook_events = [e for e in stub.history() if e.type in ("HookCreated", "HookResumed")]
    assert [e.type for e in hook_events] == ["HookCreated", "HookResumed"]

    again = CliRunner().invoke(cli, ["hook", "resume", token, "{}"])
    assert again.exit_code == 1
    lines = [line for line in again.output.splitlines() if line.strip()]
    assert len(lines) == 1, again.output
    assert lines[0].startswith("error: ") and "hook token" in lines[0], lines[0]
    assert "Traceback" not in again.output
    with pytest.raises(HookError):
        WorkflowStub.resume_hook(token, {})

    unknown = CliRunner().invoke(cli, ["hook", "resume", "0.not-a-real-token"])
    assert unknown.exit_code == 1
    lines = [line for line in unknown.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: unknown or already used hook token"), lines


def test_hook_resume_payload_defaults_to_null_and_accepts_plain_strings(worker: Worker) -> None:
    first = WorkflowStub.make(HookFromCli).start("a")
    second = WorkflowStub.make(HookFromCli).start("b")
    token_a = wait_for(lambda: first.query("hook_token"))
    token_b = wait_for(lambda: second.query("hook_token"))
    assert invoke("hook", "resume", token_a).exit_code == 0
    assert invoke("hook", "resume", token_b, "approved").exit_code == 0
    assert first.result(timeout=15) == {"order": "a", "payment": None}
    assert second.result(timeout=15) == {"order": "b", "payment": "approved"}


# --------------------------------------------------------------------------- 2. history budget


def test_budget_loop_continues_as_new_across_runs(worker: Worker) -> None:
    stub = WorkflowStub.make(BudgetLoop, id="budget-loop").start(40)
    first_run = stub.run_id
    result = stub.result(timeout=60)
    assert result["done"] == 40
    # 30 events: each run stops at 80% (24 events, ~11 activities), so 40 steps take 4 runs.
    assert result["runs"] >= 3, result
    assert stub.run_id != first_run
    last = stub.history()
    assert last[0].type == "WorkflowStarted" and last[-1].type == "WorkflowCompleted"
    assert len(last) <= 30
    info = stub.describe()
    assert info["history"]["events"] == len(last)
    assert info["history"]["budget"] == {"events": 30, "bytes": 10 * 1024 * 1024}


def test_describe_shows_near_limit_and_warns_once(
    worker: Worker, store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="durable.workflow")
    stub = WorkflowStub.make(BudgetProbe, id="budget-probe").start()
    run_id = stub.run_id
    wait_for(lambda: any(p.get("kind") == "signal" for p in stub.describe()["pending"]))

    info = stub.describe()
    history = info["history"]
    entries = store.history(store.ref("budget-probe"))
    assert history["near_limit"] is True
    assert history["events"] == len(entries) == info["seq"]
    assert 24 <= history["events"] < 30
    assert history["bytes"] == sum(len(e.raw) for e in entries)
    assert history["budget"] == {"events": 30, "bytes": 10 * 1024 * 1024}
    for raw_key in ("history_events", "history_bytes", "history_budget", "near_history_limit"):
        assert raw_key not in info  # folded into info["history"]

    # The table form of describe works, and the JSON form carries the same numbers.
    assert invoke("describe", "budget-probe").exit_code == 0
    as_json = json.loads(invoke("describe", "budget-probe", "--json").output)
    assert as_json["history"] == history

    # should_continue_as_new() is deterministic: a fresh replay decides the same, and a
    # query (a read-only replay) sees the same step count.
    replay_history(entries)
    assert stub.query("progress") == sum(1 for e in entries if e.type == "ActivityCompleted")

    stub.signal("finish")
    assert stub.result(timeout=15) == stub.query("progress")
    warnings = [r for r in caplog.records if r.name == "durable.workflow" and run_id in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "history budget" in warnings[0].getMessage()


def test_a_short_run_is_not_near_its_budget(worker: Worker) -> None:
    stub = WorkflowStub.make(HookFromCli).start("small")
    token = wait_for(lambda: stub.query("hook_token"))
    wait_for(lambda: stub.status() == "suspended")
    history = stub.describe()["history"]
    assert history["near_limit"] is False
    assert history["budget"] == {"events": 10_000, "bytes": 10 * 1024 * 1024}
    assert history["events"] == len(stub.history()) and history["bytes"] > 0
    WorkflowStub.resume_hook(token, 1)
    assert stub.result(timeout=15)["payment"] == 1


def test_history_budget_is_checked_at_class_definition() -> None:
    with pytest.raises(ConfigurationError, match="history_budget"):

        class BadBudget(Workflow):  # noqa: F841 - defining it is the test
            history_budget = {"events": 0}

    with pytest.raises(ConfigurationError, match="unknown key"):

        class BadKey(Workflow):  # noqa: F841
            history_budget = {"evnts": 10}

    assert durable.should_continue_as_new.__doc__


# --------------------------------------------------------------------------- 3. local activities


def test_local_activity_runs_in_the_workflow_worker_with_retries(
    worker: Worker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spy on the deciding worker: which scheduled activities it leases to itself.
    leased: list[str] = []
    on_leased = worker.decider.on_leased

    def spy(task: ActivityTask) -> None:
        leased.append(task.activity_id)
        on_leased(task)

    monkeypatch.setattr(worker.decider, "on_leased", spy)
    path = str(tmp_path / "attempts.log")
    stub = WorkflowStub.make(LocalSteps).start(path)
    result = stub.result(timeout=30)
    assert result["attempt"] == 2
    assert result["here"]["tag"] == "local"
    assert result["here"]["pid"] == os.getpid()  # the workflow worker's own process
    assert Path(path).read_text().splitlines() == ["attempt 1", "attempt 2"]

    history = stub.history()
    scheduled = [e for e in history if e.type == "ActivityScheduled"]
    assert len(scheduled) == 2
    assert all(e.data["local"] is True for e in scheduled)
    assert scheduled[1].data["retry"]["max_attempts"] == 3
    completed = [e for e in history if e.type == "ActivityCompleted"]
    assert [e.data["id"] for e in completed] == [e.data["id"] for e in scheduled]
    assert not [e for e in history if e.type == "ActivityFailed"]
    # Both were leased by the worker that decided them, never queued (in queued mode
    # an ordinary activity is never leased).
    assert {e.data["id"] for e in scheduled} <= set(leased), leased

    # The failed first attempt is beside the history, not in it: a retry (a timer).
    attempts = stub.describe()["attempts"]
    retry_id = scheduled[1].data["id"]
    mine = [a for a in attempts if a.get("act") == retry_id]
    assert [a.get("outcome") for a in mine][:1] == ["retry"], mine
    assert any(a.get("outcome") == "retry" for a in mine)
    replay_history(stub._store.history(stub._ref()))


# --------------------------------------------------------------------------- 4. patch markers


@contextmanager
def deployed(cls: type[Workflow], name: str) -> Iterator[None]:
    """Register ``cls`` under durable name ``name`` for the block (a "deploy"), then restore."""
    previous = registry._workflows.get(name)
    registry._workflows[name] = cls
    try:
        yield
    finally:
        if previous is None:
            registry._workflows.pop(name, None)
        else:
            registry._workflows[name] = previous


def _worker(store: RedisStore, eager: bool) -> Worker:
    return Worker(store, concurrency=2, grace=5, claim_idle_ms=2000, block_ms=100, eager=eager)


@pytest.mark.parametrize("eager", [False, True], ids=["queued", "eager"])
def test_patch_rolling_change(store: RedisStore, eager: bool) -> None:
    assert registry.get_workflow("Pricing") is PricingV1
    # Deploy 1: version 1 of Pricing (no patch). A run starts and waits for a signal.
    with WorkerThread(_worker(store, eager)):
        old = WorkflowStub.make("Pricing", id="price-old").start(100)
        wait_for(lambda: old.status() == "suspended")
    assert old.history()[0].data["patches"] == []

    # Deploy 2: the same durable name now declares the patch; old and new runs coexist.
    with deployed(PricingV2, "Pricing"), WorkerThread(_worker(store, eager)):
        new = WorkflowStub.make("Pricing", id="price-new").start(100)
        assert new.history()[0].data["patches"] == ["new-pricing"]
        wait_for(lambda: new.status() == "suspended")
        # Version 2's code replays the old run and takes the old branch.
        assert old.query("pricing_branch") == "old"
        assert new.query("pricing_branch") == "new"
        old.signal("go")
        new.signal("go")
        assert old.result(timeout=15) == {"branch": "old", "price": 100}
        assert new.result(timeout=15) == {"branch": "new", "price": 90}
        replay_history(store.history(store.ref("price-old")), PricingV2)
        replay_history(store.history(store.ref("price-new")), PricingV2)
    assert registry.get_workflow("Pricing") is PricingV1


def test_continue_as_new_keeps_patches(worker: Worker) -> None:
    stub = WorkflowStub.make(PatchedLoop, id="patched-loop").start(3)
    first = WorkflowStub.load("patched-loop").history()
    assert first[0].data["patches"] == ["new-pricing"]
    assert stub.result(timeout=30) == [True, True, True]
    last = stub.history()
    assert last[0].type == "WorkflowStarted"
    assert last[0].data["patches"] == ["new-pricing"]
    assert last[0].data["run_id"] != first[0].data["run_id"]
