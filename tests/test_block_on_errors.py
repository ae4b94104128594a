"""``Workflow.block_on_errors``: a bug of a bad deploy blocks the run instead of failing it.

Temporal fails the workflow *task* on such an error and retries it, so the fixed deploy
carries the run on; durable's default (any uncaught error fails the run) stays, and a class
opts in by naming the errors. The blocked run says why (``status``/``describe``, the file and
line), nothing of the failed decision is committed, and ``durable repair --blocked`` re-queues
every such run once the fix is deployed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps import deploys
from apps.deploys import BdHandler, BdInit, BdResigned, BdShip, BdShipFails, BdStrict, bd_resigned_v2
from click.testing import CliRunner
from clikit import cli_ok as _cli
from procs import ROOT, TESTS, spawn_worker, stop
from scenarios import replay_next_decision
from waiting import wait_for

from durable import (
    ActivityFailed,
    ConfigurationError,
    DurableError,
    NondeterminismError,
    Workflow,
    WorkflowBlocked,
    WorkflowFailed,
    WorkflowStub,
)
from durable.store.redis_store import RedisStore
from workers.cli import cli


@pytest.fixture(autouse=True)
def _no_bug() -> Iterator[None]:
    deploys.BUGGY["on"] = False
    yield
    deploys.BUGGY["on"] = False


def _blocked(stub: WorkflowStub) -> str:
    # (A worker restarting reads as `no_live_worker` meanwhile: wait for the recorded reason.)
    wait_for(lambda: (b := stub.blocked()) is not None and b.kind != "no_live_worker", timeout=30)
    blocked = stub.blocked()
    assert blocked is not None and blocked.kind == "workflow_error", blocked
    return blocked.message


def test_a_bug_in_handle_blocks_the_run_and_a_repair_after_the_fix_finishes_it(
    worker, store: RedisStore
) -> None:
    stub = WorkflowStub.make(BdShip).start(5)
    wait_for(lambda: stub.status() == "suspended")
    events_before = len(stub.history())
    deploys.BUGGY["on"] = True  # the bad deploy
    stub.signal("go")
    reason = _blocked(stub)
    assert reason.startswith(
        "WorkflowTaskFailed: NameError: name 'recipt' is not defined raised in handle() of BdShip"
    )
    assert "apps/deploys.py:" in reason and "in handle" in reason and "BdShip.block_on_errors" in reason
    assert stub.status() == "suspended"  # blocked, not failed
    with pytest.raises(WorkflowBlocked) as info:
        stub.result(timeout=30)
    assert info.value.kind == "workflow_error" and f"durable repair {stub.id}" in str(info.value)
    # The failed decision committed nothing: the signal is still waiting in the inbox.
    assert len(stub.history()) == events_before
    assert _cli("status", stub.id).startswith("suspended (blocked: WorkflowTaskFailed: NameError")
    listed = json.loads(_cli("list", "--status", "blocked", "--json"))
    assert [r["workflow_id"] for r in listed] == [stub.id]

    assert [d["kind"] for d in store.dead_letters() if d["workflow_id"] == stub.id] == ["workflow"]
    deploys.BUGGY["on"] = False  # the fix is deployed
    out = _cli("repair", "--blocked", "--kind", "workflow_error")
    assert [d for d in store.dead_letters() if d["workflow_id"] == stub.id] == []  # dealt with
    assert f"re-queued {stub.id} (run {stub.run_id})" in out and "re-queued 1 blocked run(s)" in out
    assert stub.result(timeout=30) == 20
    assert stub.blocked() is None


def test_a_bug_in_init_blocks_the_run_naming_the_line_and_a_query_says_it(worker) -> None:
    """``__init__`` raising was blocked as kind ``other`` ("unexpected error deciding: ...", no
    file:line, nothing to do), and a query of the run was a traceback (the API's: a 500)."""
    deploys.BUGGY["on"] = True
    stub = WorkflowStub.make(BdInit).start()
    reason = _blocked(stub)
    assert "RuntimeError: boom in init raised in BdInit.__init__ (" in reason, reason
    assert "apps/deploys.py:" in reason and f"deploy a fix, then `durable repair {stub.id}`" in reason
    with pytest.raises(DurableError, match=r"RuntimeError: boom in init raised in BdInit.__init__"):
        stub.query("n_now")
    deploys.BUGGY["on"] = False
    _cli("repair", stub.id)
    wait_for(lambda: stub.status() == "suspended")
    stub.signal("go")
    assert stub.result(timeout=30) == 1


def test_without_block_on_errors_the_same_bug_fails_the_run(worker, caplog: pytest.LogCaptureFixture) -> None:
    """... and says where it was raised: in the worker's log, describe and the API's outcome."""
    caplog.set_level("INFO", logger="durable.worker")
    stub = WorkflowStub.make(BdShipFails).start(5)
    wait_for(lambda: stub.status() == "suspended")
    deploys.BUGGY["on"] = True
    stub.signal("go")
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=30)
    assert info.value.status == "failed" and isinstance(info.value.cause, NameError)
    described = stub.describe().to_dict()
    assert (
        described["outcome"]["error"]["type"] == "NameError" and "apps/deploys.py:" in described["raised_at"]
    )
    where = next(line for line in _cli("describe", stub.id).splitlines() if "raised at" in line)
    assert "apps/deploys.py:" in where and "in handle" in where, where
    logged = [
        r for r in caplog.records if r.getMessage().startswith(f"run {stub.run_id} (BdShipFails) failed")
    ]
    assert logged and logged[0].levelname == "WARNING", caplog.text
    assert "NameError: name 'recipt' is not defined (" in logged[0].getMessage()
    # The operator's next step: a failed run does not come back; block_on_errors for next time.
    repair = CliRunner().invoke(cli, ["repair", stub.id])
    assert repair.exit_code == 1 and "is failed; nothing to repair" in repair.output
    assert "start a new one" in repair.output and "block_on_errors" in repair.output, repair.output


def test_errors_of_durable_calls_still_fail_the_run(worker) -> None:
    """``(Exception,)`` is Temporal's rule: an activity's failure is the run's outcome, not a bug."""
    stub = WorkflowStub.make(BdStrict).start(3)
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=30)
    assert isinstance(info.value.cause, ActivityFailed) and "refused 3" in str(info.value.cause)


def test_a_bug_in_a_signal_handler_blocks_the_run(worker) -> None:
    stub = WorkflowStub.make(BdHandler).start()
    wait_for(lambda: stub.status() == "suspended")
    stub.signal("add", "a")
    wait_for(lambda: any(e.type == "SignalReceived" for e in stub.history()))
    deploys.BUGGY["on"] = True
    stub.signal("add", "b")
    reason = _blocked(stub)
    assert "KeyError: 'b' raised in signal handler 'add' of BdHandler" in reason
    deploys.BUGGY["on"] = False
    _cli("repair", stub.id)
    stub.signal("done")
    assert stub.result(timeout=30) == ["a", "b"]  # the signal the bug met was kept, not lost


@pytest.mark.parametrize("value", [NameError, (NameError, "AttributeError"), [NameError], (int,)])
def test_a_bad_block_on_errors_fails_at_class_definition(value: object) -> None:
    with pytest.raises(
        ConfigurationError, match=r"BdBad.block_on_errors must be a tuple of exception classes"
    ):
        type("BdBad", (Workflow,), {"block_on_errors": value, "handle": lambda self: None})


def test_repair_arguments_are_checked(store: RedisStore) -> None:
    runner = CliRunner()
    for args, message in [
        ([], "give the ID of the run to repair, or --blocked"),
        (["--blocked", "x"], "--blocked repairs every blocked run"),
        (["x", "--kind", "nondeterminism"], "--type and --kind go with --blocked"),
    ]:
        result = runner.invoke(cli, ["repair", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    assert _cli("repair", "--blocked").strip() == "re-queued 0 blocked run(s)"


BUGGY_APP = """
from durable import Workflow, activity, await_signal


def bd_add(x: int) -> int:
    return x + 1


class BdDeployed(Workflow):
    block_on_errors = (NameError,)

    def handle(self, x: int) -> int:
        y = activity(bd_add, x)
        await_signal("go")
        return {last}
"""


@pytest.mark.fault
def test_a_bad_deploy_of_real_workers_costs_no_run(redis_url: str, tmp_path: Path) -> None:
    """The deploy loop with `durable worker` processes: edit the module, restart, repair."""
    app = tmp_path / "bd_deployed.py"
    app.write_text(textwrap.dedent(BUGGY_APP.format(last="activity(bd_add, y)")))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS), str(ROOT)])}
    proc = spawn_worker(redis_url, app="bd_deployed", env=env)
    try:
        stubs = [WorkflowStub.make("BdDeployed").start(i) for i in range(3)]
        wait_for(lambda: all(s.status() == "suspended" for s in stubs), timeout=30)
        stop(proc)
        app.write_text(textwrap.dedent(BUGGY_APP.format(last="activity(bd_add, yy)")))  # a typo deployed
        proc = spawn_worker(redis_url, app="bd_deployed", env=env)
        for s in stubs:
            s.signal("go")
        for s in stubs:
            assert "NameError: name 'yy' is not defined" in _blocked(s)
        status = subprocess.run(
            [sys.executable, "-m", "workers.cli", "status", stubs[0].id],
            env=dict(os.environ, DURABLE_REDIS_URL=redis_url, **env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "bd_deployed.py:15 in handle" in status.stdout, status.stdout + status.stderr
        stop(proc)
        app.write_text(textwrap.dedent(BUGGY_APP.format(last="activity(bd_add, y)")))  # the fix
        proc = spawn_worker(redis_url, app="bd_deployed", env=env)
        assert "re-queued 3 blocked run(s)" in _cli("repair", "--blocked", "--type", "BdDeployed")
        assert [s.result(timeout=60) for s in stubs] == [2, 3, 4]
    finally:
        stop(proc)


def test_code_failing_on_replay_where_history_goes_on_names_what_it_raised(worker, monkeypatch) -> None:
    """A changed handle() signature: the blocked reason names the TypeError, not only the
    WorkflowFailed it implies (a tester found the TypeError nowhere)."""
    stub = WorkflowStub.make(BdResigned).start(5)
    wait_for(lambda: stub.status() == "suspended")
    monkeypatch.setattr(BdResigned, "handle", bd_resigned_v2)  # the deploy
    replay_next_decision(worker, stub)
    stub.signal("go")
    wait_for(lambda: (b := stub.blocked()) is not None and b.kind == "nondeterminism", timeout=20)
    reason = stub.blocked().message  # type: ignore[union-attr]
    assert "the code raised TypeError: BdResigned.handle (" in reason  # where it is defined, then
    assert (
        f"deploys.py:{bd_resigned_v2.__code__.co_firstlineno}) takes (x: int, m: int): missing a required argument: 'm'; the run was started "
        in reason
    )
    assert "while replaying seq 1, but the history goes on" in reason, reason
    assert "durable/replay" not in reason  # no frame of durable's own


def test_a_query_with_code_that_does_not_replay_says_the_run_is_not_affected(worker, monkeypatch) -> None:
    """The query replays in this process: its code diverging says nothing of the run itself."""
    stub = WorkflowStub.make(BdResigned).start(5)
    wait_for(lambda: stub.status() == "suspended")
    monkeypatch.setattr(BdResigned, "handle", bd_resigned_v2)  # this process's code only
    with pytest.raises(NondeterminismError) as info:
        stub.query("anything")
    assert "the run itself is not affected" in str(info.value) and "blocked" not in str(info.value)
    # What the code raised is the news, as the worker and `durable replay` say it (it said the
    # history's next command was not issued).
    assert "the code raised TypeError" in str(info.value) and "'m'" in str(info.value), str(info.value)
    monkeypatch.undo()
    stub.signal("go")
    assert stub.result(timeout=30) == 5 and stub.blocked() is None


def test_repairing_a_run_that_is_not_blocked_says_so(worker) -> None:
    stub = WorkflowStub.make(BdShip).start(1)
    wait_for(lambda: stub.status() == "suspended")
    result = CliRunner().invoke(cli, ["repair", stub.id])
    assert (
        result.exit_code == 0
        and "note: it was not blocked; the extra workflow task is harmless" in result.output
    )
    stub.signal("go")
    assert stub.result(timeout=30) == 4


def test_repairing_a_run_blocked_only_as_found_on_read_says_nothing_was_recorded(store) -> None:
    """No worker runs: the run is blocked (no_live_worker) as status says, with nothing recorded."""
    stub = WorkflowStub.make(BdShip, store=store).start(1)
    assert stub.blocked() is not None and stub.blocked().kind == "no_live_worker"
    result = CliRunner().invoke(cli, ["--redis", store.url, "repair", stub.id])
    assert result.exit_code == 0, result.output
    assert (
        "note: nothing recorded blocks it (no_live_worker: no live worker serves queue 'default'"
        in result.output
    )
    assert result.output.rstrip().endswith("the extra workflow task is harmless")
