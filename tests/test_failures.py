"""The failure model end to end: timeouts, heartbeats, non-retryable errors, fail-fast,
child errors, blocked runs and repair."""

from __future__ import annotations

import inspect
import logging
import traceback
from pathlib import Path

import pytest
from apps import failures
from apps.failures import (
    Changing,
    ChildWaits,
    FailFast,
    FailsInItsActivity,
    Heartbeats,
    HeartbeatsEveryItem,
    NonRetryable,
    ParentLeavingKid,
    ParentOfFailing,
    ParentOfTakenId,
    ParentOfWaiting,
    Timeouts,
)
from click.testing import CliRunner
from scenarios import replay_next_decision
from waiting import wait_for

from durable import WorkflowFailed, WorkflowStub
from durable.runinfo import last_frame
from workers.cli import cli


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_start_to_close_timeout_retries_then_fails(worker, tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    stub = WorkflowStub.make(Timeouts).start(str(log))
    assert stub.result(timeout=15) == {"cause": "ActivityTimeout", "kind": "start_to_close", "attempts": 2}
    # The attempts' threads were not trusted to stop: their late results are discarded.
    wait_for(lambda: lines(log).count("woke attempt 2") == 1, timeout=5)
    attempts = wait_for(lambda: len(stub.describe()["attempts"]) == 4 and stub.describe()["attempts"])
    by_attempt = {n: sorted(a["outcome"] for a in attempts if a["attempt"] == n) for n in (1, 2)}
    assert by_attempt == {1: ["discarded", "retry"], 2: ["discarded", "failed"]}
    timeout_records = [a for a in attempts if a["outcome"] in ("retry", "failed")]
    assert all("timed out (start_to_close)" in a["record"]["error"] for a in timeout_records)


def test_an_expiry_two_schedulers_see_is_recorded_once(worker, tmp_path: Path, monkeypatch) -> None:
    """Every worker's scheduler reads the expired deadlines: with two workers both failed each
    timed-out attempt, and the second record showed as one more (discarded) timeout."""
    other = worker._make_scheduler(claim_idle_ms=30_000)  # a second worker's, on the same Redis
    store = worker.store
    expired_attempts, activity_state = store.expired_attempts, store.activity_state
    expiring: list[int] = []
    raced: list[str] = []

    def expired(p: int, now_ms: int, limit: int = 100) -> list[tuple[str, str, int]]:
        found = expired_attempts(p, now_ms, limit)
        if found:
            expiring.append(now_ms)
        return found

    def state(p: int, rid: str, aid: str):  # noqa: ANN202 - the store's own return type
        found = activity_state(p, rid, aid)
        if expiring and not raced:  # the other scheduler read the same expiry, and acts on it first
            raced.append(aid)
            other._expire_attempts(p, expiring[-1])
        return found

    monkeypatch.setattr(store, "expired_attempts", expired)
    monkeypatch.setattr(store, "activity_state", state)
    stub = WorkflowStub.make(Timeouts).start(str(tmp_path / "t.log"))
    assert stub.result(timeout=15) == {"cause": "ActivityTimeout", "kind": "start_to_close", "attempts": 2}
    assert raced
    attempts = wait_for(lambda: len(stub.describe()["attempts"]) >= 4 and stub.describe()["attempts"])
    timeouts = [a for a in attempts if "timed out" in (a["record"].get("error") or "")]
    assert sorted((a["attempt"], a["outcome"]) for a in timeouts) == [(1, "retry"), (2, "failed")]


def test_heartbeat_timeout_and_details_reach_next_attempt(worker, tmp_path: Path) -> None:
    log = tmp_path / "hb.log"
    stub = WorkflowStub.make(Heartbeats).start(str(log))
    assert stub.result(timeout=15) == {"attempt": 2, "resumed_from": 2}
    assert lines(log)[:2] == ["attempt 1 from 0", "attempt 2 from 2"]


def test_heartbeats_held_back_by_the_throttle_push_the_deadline_and_reach_the_retry(worker) -> None:
    """Heartbeats held back by the throttle are written later: the latest pushes the deadline
    (no timeout in the quiet 2.7 s after one, 3.3 s after the last written at once) and is what
    the retry after a failure resumes from (written before the failure is recorded)."""
    stub = WorkflowStub.make(HeartbeatsEveryItem).start(500)
    assert stub.result(timeout=20) == 499
    (failed,) = [a for a in stub.describe()["attempts"] if a["outcome"] == "retry"]
    assert "fails once its loop is done" in failed["record"]["error"], failed["record"]


def test_a_timed_out_attempt_records_how_long_it_ran(worker, tmp_path: Path) -> None:
    """The record of an attempt the scheduler expired said 0 ms: it took the expiry for the start."""
    stub = WorkflowStub.make(Heartbeats).start(str(tmp_path / "hb.log"))
    assert stub.result(timeout=15) == {"attempt": 2, "resumed_from": 2}
    (expired,) = [a for a in stub.describe()["attempts"] if a["outcome"] == "retry"]
    assert "timed out (heartbeat)" in expired["record"]["error"]
    # Three heartbeats 20 ms apart, then none for heartbeat_timeout (0.4 s) before it expired.
    assert 400 <= expired["record"]["duration_ms"] < 5000, expired["record"]


@pytest.mark.parametrize(("kind", "cause"), [("listed", "PermissionError"), ("raised", "NonRetryableError")])
def test_non_retryable_errors_stop_retries(worker, tmp_path: Path, kind: str, cause: str) -> None:
    log = tmp_path / "nr.log"
    stub = WorkflowStub.make(NonRetryable).start(str(log), kind)
    assert stub.result(timeout=10) == {"cause": cause, "attempts": 1}
    assert lines(log) == ["declines 1"]


@pytest.mark.parametrize(("kind", "attempts"), [("listed", 1), ("other", 3)])
def test_a_retry_policy_in_temporals_names_means_what_it_meant_there(
    worker, tmp_path: Path, kind: str, attempts: int
) -> None:
    """``maximum_attempts`` and ``non_retryable_error_types`` were a TypeError: a ported policy."""
    log = tmp_path / "nr.log"
    stub = WorkflowStub.make(NonRetryable).start(str(log), f"ported:{kind}")
    cause = "PermissionError" if kind == "listed" else "ValueError"
    assert stub.result(timeout=10) == {"cause": cause, "attempts": attempts}
    assert lines(log) == [f"declines {n}" for n in range(1, attempts + 1)]


def test_fail_fast_all_cancels_in_flight_sibling(
    worker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durable.worker")
    log = tmp_path / "ff.log"
    stub = WorkflowStub.make(FailFast).start(str(log))
    assert stub.result(timeout=15) == "caught RuntimeError"
    history = stub.history()
    cancelled = [e for e in history if e.type == "ActivityCancelled"]
    assert len(cancelled) == 1 and cancelled[0].data["outcome_unknown"] is True
    assert "branch" in cancelled[0].data["reason"]
    wait_for(lambda: "long saw cancel" in lines(log), timeout=5)
    # Its heartbeat saw the cancel: said at INFO, not as a failure "retrying in 1 s" (none ran).
    said = wait_for(
        lambda: [r for r in caplog.records if "its workflow cancelled it" in r.getMessage()], timeout=5
    )
    assert said[0].levelno == logging.INFO and "no retry (its workflow cancelled it)" in said[0].getMessage()
    assert not [r for r in caplog.records if "was cancelled; retrying" in r.getMessage()]


def test_child_failure_and_termination_are_distinct(worker) -> None:
    assert WorkflowStub.make(ParentOfFailing).start().result(timeout=15) == {
        "status": "failed",
        "cause": "ValueError",
    }
    parent = WorkflowStub.make(ParentOfWaiting).start()
    kid = WorkflowStub.load(wait_for(lambda: _exists("ParentOfWaiting-kid")))
    wait_for(lambda: kid.status() == "suspended")
    kid.terminate("operator")
    assert parent.result(timeout=15) == {"status": "terminated"}


def test_a_cancelled_parent_waits_for_its_childs_cancellation_to_complete(worker) -> None:
    """As Temporal's default (WAIT_CANCELLATION_COMPLETED): child() raised CancelledError at once,
    the parent closed, and its close policy (terminate, the default) killed the child mid-cleanup:
    a saga's compensation in the child never ran."""
    parent = WorkflowStub.make(ParentLeavingKid).start("leaving-kid", 3.0)
    kid = WorkflowStub.load(wait_for(lambda: _exists("leaving-kid")))
    wait_for(lambda: kid.status() == "suspended")
    parent.cancel("operator")
    wait_for(lambda: kid.status() == "cancelling", timeout=10)  # asked; its 3 s clean-up runs
    assert parent.status() == "cancelling"
    (waits,) = [s for s in parent.describe().pending if s["kind"] == "child"]
    assert waits["state"] == (
        "child leaving-kid: cancelling (asked to cancel: this run's cancel waits for it to close)"
    )
    assert parent.result(timeout=15) == "parent cancelled"
    assert kid.status() == "cancelled"  # it closed before its parent: its clean-up ran whole
    assert [e.type for e in kid.history()][-2:] == ["TimerFired", "WorkflowCancelled"]
    assert "CancelRequested" in [e.type for e in kid.history()]


def test_a_child_a_cancelled_parent_stops_waiting_for_gets_the_parents_close_policy(worker) -> None:
    """A parent terminated while it waits for its child's cancellation: the policy applies."""
    parent = WorkflowStub.make(ParentLeavingKid).start("stubborn-kid", 60.0)
    kid = WorkflowStub.load(wait_for(lambda: _exists("stubborn-kid")))
    wait_for(lambda: kid.status() == "suspended")
    parent.cancel("operator")
    wait_for(lambda: "CancelRequested" in [e.type for e in kid.history()])
    parent.terminate("no more waiting")
    wait_for(lambda: kid.status() == "terminated", timeout=15)


def _exists(workflow_id: str) -> str | None:
    from durable import WorkflowNotFound

    try:
        WorkflowStub.load(workflow_id)
        return workflow_id
    except WorkflowNotFound:
        return None


def test_a_child_whose_id_is_taken_says_what_child_can_do(worker) -> None:
    """The message offered id_conflict_policy options, which child() does not take."""
    kid = WorkflowStub.make(ChildWaits, id="taken-kid").start()
    said = WorkflowStub.make(ParentOfTakenId).start("taken-kid").result(timeout=15)
    assert "already has an open run" in said and "give the child another workflow_id" in said, said
    assert "id_conflict_policy" not in said
    kid.terminate()


def test_parent_termination_terminates_child_by_policy(worker) -> None:
    parent = WorkflowStub.make(ParentOfWaiting, id="pp").start()
    kid = WorkflowStub.load(wait_for(lambda: _exists("ParentOfWaiting-kid")))
    wait_for(lambda: kid.status() == "suspended" and parent.status() in ("running", "suspended"))
    parent.terminate("done with it")
    wait_for(lambda: kid.status() == "terminated")


def test_nondeterminism_blocks_the_run_and_repair_requeues_it(worker) -> None:
    failures.VERSION["value"] = 1
    try:
        stub = WorkflowStub.make(Changing).start()
        wait_for(lambda: stub.status() == "suspended")
        failures.VERSION["value"] = 2  # a deploy changed the code under a running workflow
        replay_next_decision(worker, stub)
        stub.signal("go", "!")
        blocked = wait_for(lambda: stub.snapshot()["blocked"])
        assert "NondeterminismError" in blocked and "step_a" in blocked and "step_b" in blocked
        assert stub.status() not in ("failed", "completed")
        failures.VERSION["value"] = 1  # the fix is deployed
        from durable.client import default_store

        default_store().repair(stub.id)
        assert stub.result(timeout=10) == "a!"
    finally:
        failures.VERSION["value"] = 1


def test_failed_run_result_carries_cause(worker) -> None:
    from apps.basic import Boom

    stub = WorkflowStub.make(Boom).start()
    with pytest.raises(WorkflowFailed, match="boom"):
        stub.result(timeout=10)


def test_a_worker_does_not_hoard_slow_activity_tasks(store, tmp_path) -> None:
    """One read over many activity streams can bring several tasks (COUNT is per stream);
    a worker keeps what its threads will start soon and puts the rest back for others."""
    from apps.basic import SlowSteps

    from workers.worker import Worker, WorkerThread

    first, second = (Worker(store, concurrency=1, grace=5, block_ms=100) for _ in range(2))
    by_partition: dict[int, str] = {}
    i = 0
    while len(by_partition) < store.keys.partitions:
        by_partition.setdefault(store.keys.partition(f"hoard-{i}"), f"hoard-{i}")
        i += 1
    with WorkerThread(first), WorkerThread(second):
        # Both threads busy first, so the next tasks pile up in several partitions' streams.
        blockers = [WorkflowStub.make(SlowSteps).start(str(tmp_path / f"b{n}"), 1, 0.6) for n in range(2)]
        wait_for(lambda: first.busy == 1 and second.busy == 1)
        stubs = [
            WorkflowStub.make(SlowSteps, id=wid).start(str(tmp_path / wid), 1, 0.2)
            for wid in by_partition.values()
        ]
        for stub in [*blockers, *stubs]:
            stub.result(timeout=30)
    ran = (first.activities_run, second.activities_run)
    assert sum(ran) == 2 + len(stubs)
    # Hoarding would leave one worker with its blocker only and the other with everything else.
    assert min(ran) >= 3, ran


def test_where_an_activity_raised_is_printed_with_the_failure_and_shown_by_describe(worker) -> None:
    # Only `describe`'s "raised at" of the workflow's activity() call said where, and the
    # activity's own traceback was a private attribute: printed, the failure showed no frame of it.
    stub = WorkflowStub.make(FailsInItsActivity, id="raised-where").start()
    with pytest.raises(WorkflowFailed) as failed:
        stub.result(timeout=20)
    printed = "".join(traceback.format_exception(failed.value))
    line = inspect.getsourcelines(failures.breaks_here)[1] + 1
    assert f'failures.py", line {line}, in breaks_here' in printed, printed
    assert "durable: raised in another process, where its traceback was:" in printed
    described = " ".join(CliRunner().invoke(cli, ["describe", "raised-where"]).output.split())
    assert f"ValueError: broke at 7 (at failures.py:{line} in breaks_here)" in described, described


def test_the_raise_site_said_is_the_users_line_not_a_librarys() -> None:
    # json.loads raising in an activity was said "at decoder.py:353 in raw_decode".
    tb = (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/shop.py", line 62, in charge\n'
        '  File "/work/venv/lib/python3.11/site-packages/durable/activity.py", line 9, in run\n'
        '  File "/srv/app/shop.py", line 70, in parse\n'
        '  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads\n'
        '  File "/usr/lib/python3.11/json/decoder.py", line 353, in raw_decode\n'
        "json.decoder.JSONDecodeError: Expecting value\n"
    )
    assert last_frame(tb) == "/srv/app/shop.py:70 in parse"
    assert last_frame(tb.replace("/srv/app/shop.py", "/usr/lib/python3.11/x.py")).endswith("raw_decode")
