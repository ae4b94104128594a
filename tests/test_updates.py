"""Updates end to end: `WorkflowStub.update` on a worker in the test process and on real
`durable worker` processes, `durable update` on the CLI, exactly-once update ids, replay."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from apps.updates import CALLS_FILE, UpdCart, UpdReceipts
from click.testing import CliRunner
from waiting import wait_for

from durable import ConfigurationError, UpdateRejected, WorkflowClosed, WorkflowStub
from durable import events as ev
from durable.replay import replay_history
from durable.store.redis_store import RedisStore
from tests.procs import durable_cli, workers
from workers.cli import cli


def _started(worker: Any = None) -> WorkflowStub:
    return WorkflowStub.make(UpdCart).start()


def test_update_returns_the_handler_result_and_is_in_history(worker: Any) -> None:
    stub = _started()
    assert stub.update("add", "apple") == 1
    assert stub.update("add", "pear", timeout=10) == 2
    with pytest.raises(ConfigurationError, match="timeout must be a finite, non-negative duration"):
        stub.update("add", "fig", timeout=float("nan"))  # refused before it is sent
    assert stub.update("add", "plum", timeout=math.inf) == 3
    stub.signal("checkout")
    assert stub.result(timeout=10) == {"items": ["apple", "pear", "plum"], "notes": []}
    types = [e.type for e in stub.history()]
    assert types.count("UpdateAccepted") == 3 and types.count("UpdateCompleted") == 3


def test_handler_with_activity_and_timer_and_a_signal_meanwhile(worker: Any, tmp_path: Path) -> None:
    os.environ[CALLS_FILE] = str(tmp_path / "calls")
    try:
        stub = _started()
        assert stub.update("reserve", "tea", 0.3, timeout=15) == "reserved:tea"
        stub.signal("note", "hi")
        stub.signal("checkout")
        assert stub.result(timeout=10) == {"items": ["tea"], "notes": ["hi"]}
    finally:
        del os.environ[CALLS_FILE]
    history = stub.history()
    accepted = next(e.seq for e in history if e.type == "UpdateAccepted")
    completed = next(e.seq for e in history if e.type == "UpdateCompleted")
    kinds = [e.type for e in history if accepted < e.seq < completed]
    assert {"ActivityScheduled", "ActivityCompleted", "TimerStarted", "TimerFired"} <= set(kinds)


def test_validator_rejection_writes_nothing_the_workflow_sees(worker: Any) -> None:
    stub = _started()
    assert stub.update("add", "apple") == 1
    with pytest.raises(UpdateRejected, match="duplicate sku 'apple'") as info:
        stub.update("add", "apple")
    assert isinstance(info.value.cause, ValueError) and info.value.name == "add"
    stub.signal("checkout")
    assert stub.result(timeout=10)["items"] == ["apple"]
    history = stub.history()
    assert [e.type for e in history].count("UpdateAccepted") == 1
    assert [e.type for e in history].count("UpdateRejected") == 1


def test_handler_error_is_raised_and_the_run_goes_on(worker: Any) -> None:
    stub = _started()
    with pytest.raises(KeyError, match="nope"):
        stub.update("fail", "nope")
    assert stub.status() in ("suspended", "running")
    assert stub.update("add", "x") == 1


def test_unknown_update_name_is_refused_at_the_client_and_by_the_worker(
    worker: Any, store: RedisStore
) -> None:
    stub = _started()
    # Its first decision committed (it waits for the signal): the history below changes no more.
    wait_for(lambda: stub.status() == "suspended", timeout=10)
    seq = len(stub.history())
    with pytest.raises(UpdateRejected, match=r"no @update 'nope'; it has \['add', 'fail', 'reserve'\]"):
        stub.update("nope")
    assert (
        len(stub.history()) == seq
        and store.redis.llen(store.keys.inbox(stub._ref().partition, stub.run_id)) == 0
    )
    untyped = WorkflowStub.load(stub.id)  # as a process without the class would
    untyped._type = "NotRegisteredHere"
    with pytest.raises(UpdateRejected, match="no @update 'nope'"):
        untyped.update("nope", timeout=10)


def test_a_retried_update_id_runs_once_and_returns_the_same(worker: Any, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    os.environ[CALLS_FILE] = str(calls)
    try:
        stub = _started()
        first = stub.update("reserve", "tea", 0.05, update_id="order-1", timeout=15)
        again = stub.update("reserve", "tea", 0.05, update_id="order-1", timeout=15)
        assert first == again == "reserved:tea"
        assert calls.read_text().splitlines() == ["tea"]
        with pytest.raises(UpdateRejected):
            stub.update("add", "", update_id="bad-1")
        with pytest.raises(UpdateRejected):  # the rejection is the outcome of that id for good
            stub.update("add", "fine", update_id="bad-1")
        stub.signal("checkout")
        assert stub.result(timeout=10)["items"] == ["tea"]
        assert stub.update("reserve", "tea", update_id="order-1", timeout=5) == "reserved:tea"  # closed run
        with pytest.raises(WorkflowClosed):
            stub.update("add", "late", update_id="new-1")
    finally:
        del os.environ[CALLS_FILE]


def test_replay_of_a_history_with_updates_is_deterministic(worker: Any, store: RedisStore) -> None:
    stub = _started()
    stub.update("add", "a")
    stub.update("reserve", "b", 0.05, timeout=15)
    with pytest.raises(UpdateRejected):
        stub.update("add", "a")
    stub.signal("checkout")
    stub.result(timeout=10)
    entries = store.history(stub._ref())
    driver = replay_history(entries)  # a fresh driver: no cache, every command checked
    assert driver.status == "completed"
    assert isinstance(entries[-1].event, ev.WorkflowCompleted)


@pytest.mark.slow
def test_cli_update_on_real_worker_processes(redis_url: str, store: RedisStore, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    runner = CliRunner()
    with workers(redis_url, n=2, app="apps.updates", env={CALLS_FILE: str(calls)}):
        # Both in the registry first: an update not answered within 2 s while no worker is live
        # rightly warns (stderr) that none is, which the exact outputs below do not expect.
        wait_for(lambda: len(store.live_workers()) == 2, timeout=30)
        stub = WorkflowStub.make(UpdCart, id="cart-cli").start()
        out = runner.invoke(cli, ["update", "cart-cli", "add", '"milk"', "--json"], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        assert json.loads(out.output) == 1
        args = ["update", "cart-cli", "reserve", '"tea"', "0.1", "--update-id", "r-1", "--timeout", "20"]
        out = runner.invoke(cli, args, catch_exceptions=False)
        assert out.exit_code == 0 and out.output == "update 'reserve' (r-1) of cart-cli: \"reserved:tea\"\n"
        out = runner.invoke(cli, [*args, "--json"], catch_exceptions=False)  # retried: same answer, no call
        assert out.exit_code == 0 and json.loads(out.output) == "reserved:tea", out.output
        assert calls.read_text().splitlines() == ["tea"]
        out = runner.invoke(cli, ["update", "cart-cli", "add", '"milk"'])
        assert out.exit_code == 1 and "rejected" in out.output and "duplicate sku 'milk'" in out.output
        stub.signal("checkout")
        assert stub.result(timeout=20)["items"] == ["milk", "tea"]


def test_cli_update_shows_a_result_whose_class_it_does_not_load(redis_url: str, store: RedisStore) -> None:
    """The update ran, but `durable update` (no app code imported) exited 1 with "cannot decode
    dataclass ...": a user would send it again. Now shown as `durable result` shows such values."""
    with workers(redis_url, n=1, app="apps.updates"):
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        stub = WorkflowStub.make(UpdReceipts, id="receipts-cli").start()
        out = durable_cli(redis_url, "update", "receipts-cli", "issue", '"tea"', "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout) == {"__type__": "apps.updates.UpdReceipt", "sku": "tea", "total": 12.5}
        stub.signal("done")
        assert stub.result(timeout=20) is None
