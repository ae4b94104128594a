"""Blocked runs say so (issue 13 item 12) and closed runs carry their outcome (item 13).

A blocked run keeps its status word (``pending``/``suspended``); ``blocked()``,
``snapshot()``, ``describe()``, ``durable status|describe|list`` name the reason and
its kind, and ``result()`` raises ``WorkflowBlocked`` at once instead of timing out.
"""

from __future__ import annotations

import json
import time

import pytest
from apps import failures
from apps.basic import Boom, Looper, Sequence, Waiter
from apps.failures import Changing
from click.testing import CliRunner
from scenarios import park_queued_task, replay_next_decision
from waiting import wait_for

from durable import WorkflowBlocked, WorkflowFailed, WorkflowStub
from durable.runinfo import BLOCKED_KINDS, RunDescription, classify_block, outcome_of
from durable.store.redis_store import RedisStore, RunRef
from durable.store.workers import WorkerInfo
from workers.cli import cli

UNKNOWN_WORKFLOW = "no live worker on queue 'default' serves workflow type 'BlNoSuchWorkflow'"


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.output


def _assert_raises_blocked_soon(stub: WorkflowStub, kind: str, within: float = 5.0) -> WorkflowBlocked:
    started = time.monotonic()
    with pytest.raises(WorkflowBlocked) as info:
        stub.result(timeout=60)
    assert time.monotonic() - started < within, "result() waited for the timeout instead"
    assert info.value.kind == kind and info.value.workflow_id == stub.id and info.value.run_id == stub.run_id
    assert info.value.reason in str(info.value) and f"durable repair {stub.id}" in str(info.value)
    return info.value


def test_unknown_workflow_type_blocks_visibly(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make("BlNoSuchWorkflow").start(1)
    wait_for(lambda: (b := stub.blocked()) is not None and b.kind == "unknown_type")
    error = _assert_raises_blocked_soon(stub, "unknown_type")
    assert error.reason.startswith(UNKNOWN_WORKFLOW)
    assert stub.status() == "pending"  # the status word stays one of the documented ones
    snap = stub.snapshot()
    assert (
        snap["blocked"] == error.reason and snap["blocked_kind"] == "unknown_type" and snap["outcome"] is None
    )
    info = stub.describe()
    assert isinstance(info, RunDescription)
    assert (
        info.blocked is not None and info.blocked.kind == "unknown_type" and info["blocked"] == error.reason
    )
    assert _cli("status", stub.id).strip() == f"pending (blocked: {error.reason})"
    described = json.loads(_cli("describe", stub.id, "--json"))
    assert described["blocked"] == error.reason and described["blocked_kind"] == "unknown_type"
    assert "unknown_type: no live worker on queue 'default'" in _cli("describe", stub.id)
    listed = json.loads(_cli("list", "--status", "blocked", "--json"))
    assert [r["workflow_id"] for r in listed] == [stub.id]


def test_result_raises_when_the_run_becomes_blocked_while_waiting(worker) -> None:
    failures.VERSION["value"] = 1
    try:
        stub = WorkflowStub.make(Changing).start()
        wait_for(lambda: stub.status() == "suspended")
        failures.VERSION["value"] = 2  # a deploy changed the code under a running workflow
        replay_next_decision(worker, stub)
        stub.signal("go", "!")
        error = _assert_raises_blocked_soon(stub, "nondeterminism", within=10)
        assert error.reason.startswith("NondeterminismError")
        assert stub.status() == "suspended"
        assert _cli("status", stub.id).startswith("suspended (blocked: NondeterminismError")
        assert [r["workflow_id"] for r in json.loads(_cli("list", "--status", "blocked", "--json"))] == [
            stub.id
        ]
        failures.VERSION["value"] = 1  # the fix is deployed
        _cli("repair", stub.id)
        assert stub.blocked() is None and stub.snapshot()["blocked_kind"] is None
        assert stub.result(timeout=10) == "a!"
    finally:
        failures.VERSION["value"] = 1


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("no_live_worker", "no live worker serves build v9 of queue default (last seen 2 min ago)"),
        ("runaway_decision", "decision exceeded 2 s at app.py:12"),
        ("parked_input", "SerializationError: cannot decode the signal payload"),
        ("runaway_decision", "decision exceeded 2 s; fix the code, then `durable repair`"),
    ],
)
def test_reasons_written_by_other_parts_plug_in(store: RedisStore, kind: str, reason: str) -> None:
    """A component that blocks a run for a new reason parks with a kind; every view shows it
    (a reason that says `durable repair` says it of this run: it said it of no run)."""
    stub = WorkflowStub.make(Waiter, store=store).start(60)  # no worker: the task stays queued
    _park_blocked(store, stub, reason, kind)
    _assert_raises_blocked_soon(stub, kind)
    assert stub.blocked() is not None and stub.blocked().kind == kind  # type: ignore[union-attr]
    shown = reason.replace("`durable repair`", f"`durable repair {stub.id}`")
    assert _cli("status", stub.id).strip() == f"pending (blocked: {shown})"
    assert [r["workflow_id"] for r in json.loads(_cli("list", "--status", "blocked", "--json"))] == [stub.id]
    stub.terminate("gave up")
    assert stub.blocked() is None and json.loads(_cli("list", "--status", "blocked", "--json")) == []


def _park_blocked(store: RedisStore, stub: WorkflowStub, reason: str, kind: str = "runaway_decision") -> None:
    park_queued_task(store, stub, reason, block_kind=kind)


def test_an_old_blocked_run_is_listed_behind_many_newer_runs(store: RedisStore) -> None:
    """``list --status blocked`` reads the blocked index, not the newest runs only: with
    a scan of 10 candidates, the one blocked run behind 40 newer ones is found at once;
    a repair takes it out of the index."""
    # A worker serves the queue (in the registry only: the tasks stay queued), so the newer
    # runs are not blocked for want of one.
    store.register_worker(WorkerInfo(name="w1", queues=("default",)))
    old = WorkflowStub.make(Waiter, store=store).start(60)
    _park_blocked(store, old, "decision exceeded 2 s at app.py:12")
    for _ in range(40):
        WorkflowStub.make(Waiter, store=store).start(60)
    page = store.list_runs_page(status="blocked", scan=10)
    assert [r["workflow_id"] for r in page.runs] == [old.id]
    assert [r["workflow_id"] for r in json.loads(_cli("list", "--status", "blocked", "--json"))] == [old.id]
    store.repair(old.id)
    assert store.list_runs_page(status="blocked").runs == []


def test_runs_no_live_worker_serves_are_listed_behind_many_newer_runs(store: RedisStore) -> None:
    """``list --status blocked`` pages as the API's ``status=blocked`` does: a run no live
    worker serves (not in the blocked index: worked out on read) behind 40 newer served runs
    is listed with ``--limit 2`` (a window of the 4 x limit newest runs missed it), and
    following ``more: --before`` one row at a time lists every such run once."""
    store.register_worker(WorkerInfo(name="w1", queues=("default",)))
    unserved = []
    for _ in range(3):
        unserved.append(WorkflowStub.make(Waiter, queue="nowhere", store=store).start(60).id)
        for _ in range(20):
            WorkflowStub.make(Waiter, store=store).start(60)
    rows = json.loads(
        CliRunner().invoke(cli, ["list", "--status", "blocked", "--limit", "2", "--json"]).stdout
    )
    assert [r["workflow_id"] for r in rows] == unserved[::-1][:2]
    assert all(r["blocked_kind"] == "no_live_worker" and "'nowhere'" in r["blocked"] for r in rows), rows
    seen, args = [], ["list", "--status", "blocked", "--limit", "1"]
    for _ in range(5):
        out = _cli(*args)
        seen += [wid for wid in unserved if wid in out]
        more = [line for line in out.splitlines() if line.startswith("more: --before ")]
        if not more:
            break
        args = ["list", "--status", "blocked", "--limit", "1", "--before", more[0].split()[-1]]
    assert seen == unserved[::-1]
    assert "cannot be combined with --where" in _cli("list", "--status", "blocked", "--where", "type = 'x'")


def test_reasons_recorded_without_a_kind_are_classified() -> None:
    assert classify_block("NondeterminismError: step 3 ...") == "nondeterminism"
    assert classify_block("UnknownTypeError: activity 'x' ...") == "unknown_type"
    assert classify_block("HistoryCorrupt: run r seq 4: ...") == "history_corrupt"
    assert classify_block("SerializationError: cannot decode") == "parked_input"
    assert (
        classify_block("the decision did not finish in 3 deliveries (it crashed ...)") == "runaway_decision"
    )
    assert classify_block("something new") == "other"
    assert set(BLOCKED_KINDS) >= {"nondeterminism", "unknown_type", "no_live_worker", "runaway_decision"}


def test_a_run_that_is_not_blocked_still_times_out(worker) -> None:
    stub = WorkflowStub.make(Waiter).start(60)
    with pytest.raises(TimeoutError):
        stub.result(timeout=0.5)
    assert stub.blocked() is None and stub.describe().blocked is None


# ----------------------------------------------------------------- outcomes (item 13)


def test_completed_run_carries_its_result_and_close_time(worker) -> None:
    stub = WorkflowStub.make(Sequence).start(4)
    assert stub.result(timeout=20) == 6
    snap = stub.snapshot()
    assert snap["outcome"]["status"] == "completed" and snap["outcome"]["result"] == 6
    assert snap["outcome"]["error"] is None and snap["outcome"]["closed"] == snap["closed"] > 0
    info = stub.describe()
    assert info.outcome is not None and info.outcome.result == 6 and info.closed == snap["closed"]
    assert info["outcome"]["result"] == 6
    assert '"result": 6' in _cli("describe", stub.id, "--json")
    assert "result" in _cli("describe", stub.id)


def test_failed_run_carries_error_type_and_message(worker) -> None:
    stub = WorkflowStub.make(Boom).start()
    with pytest.raises(WorkflowFailed):
        stub.result(timeout=20)
    outcome = stub.describe().outcome
    assert outcome is not None and outcome.status == "failed"
    assert outcome.error_type == "KeyError" and "boom" in (outcome.error_message or "")
    assert stub.snapshot()["outcome"]["error"] == {"type": "KeyError", "message": outcome.error_message}
    assert "KeyError" in _cli("describe", stub.id)


def test_terminated_and_continued_runs_carry_their_outcome(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Waiter).start(60)
    wait_for(lambda: stub.status() == "suspended")
    stub.terminate("no longer needed")
    outcome = stub.describe().outcome
    assert outcome is not None and outcome.status == "terminated"
    assert (outcome.error_type, outcome.error_message) == ("WorkflowTerminated", "no longer needed")

    looper = WorkflowStub.make(Looper).start(1, 0)
    first_run = looper.run_id
    assert looper.result(timeout=20) == 1
    ref = store.ref(looper.id)
    tail = store.last_entry(RunRef(ref.partition, str(first_run), looper.id))
    assert tail is not None
    continued = outcome_of(tail, None)
    assert (continued.status, continued.continued_as) == ("continued", ref.run_id)
    assert continued.to_dict()["continued_as"] == ref.run_id


def test_a_decision_that_raises_outside_workflow_code_parks_the_run_not_the_worker(
    worker, store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something raised by the decision machinery itself (not by workflow code, which fails the
    run) blocks that run visibly, and the worker goes on serving the others."""
    from durable.replay import Driver

    real = Driver.decide

    def decide(self: Driver, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.workflow_type == "Waiter":
            raise RuntimeError("machinery broke")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Driver, "decide", decide)
    broken = WorkflowStub.make(Waiter).start(0.01)
    reason = wait_for(broken.blocked)
    assert reason.kind == "other"
    assert reason.message == "unexpected error deciding: RuntimeError: machinery broke"
    assert WorkflowStub.make(Sequence).start(2).result(timeout=10) is not None  # the worker lives on
    monkeypatch.setattr(Driver, "decide", real)
    store.repair(broken.id)
    wait_for(lambda: broken.status() == "suspended" and broken.blocked() is None)
    broken.signal("go", "fixed")
    assert broken.result(timeout=10) == "fixed"


def test_list_json_says_where_the_next_page_begins(store: RedisStore) -> None:
    """``durable list --json`` printed no paging cursor: a script could not follow ``--before``."""
    for _ in range(3):
        WorkflowStub.make(Waiter, store=store).start(60)
    result = CliRunner().invoke(cli, ["list", "--json", "--limit", "2"])
    rows = json.loads(result.stdout)
    assert len(rows) == 2
    assert f"more: --before {rows[-1]['created']}:{rows[-1]['run_id']}" in result.stderr
