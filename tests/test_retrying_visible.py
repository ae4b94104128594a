"""An activity failing on every attempt (a module missing on the worker, a changed signature)
retries forever by default: `durable status` and the worker's log say so (a tester found it only
in `durable describe`)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from waiting import wait_for

from durable import Activity, RetryPolicy, Workflow, WorkflowStub, activity
from durable.runinfo import RunDescription
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from workers.cli import cli


class RvLazyImport(Activity):
    retry = RetryPolicy(initial_interval=0.05, max_interval=0.05)

    def handle(self, x: int) -> int:
        import rv_not_installed  # type: ignore[import-not-found]  # noqa: F401, PLC0415 - the bug

        return x


class RvUsesLazy(Workflow):
    def handle(self) -> int:
        return activity(RvLazyImport, 1)


def test_status_and_the_log_say_an_activity_keeps_failing(
    redis_url: str, store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="durable.worker")
    with TestEnvironment(store=store, eager=False):
        stub = WorkflowStub.make(RvUsesLazy).start()
        wait_for(lambda: len(stub.describe().retrying()) == 1, timeout=30)
        out = CliRunner().invoke(cli, ["status", stub.id]).output.strip()
        assert out.startswith("running (activity RvLazyImport (1) retrying: attempt "), out
        assert out.endswith("last error ModuleNotFoundError: No module named 'rv_not_installed')"), out
        # result()'s timeout says it too (it said "waiting for activity RvLazyImport (1)" only).
        with pytest.raises(
            TimeoutError, match=r"RvLazyImport \(1\) retrying: attempt \d+.*, last error ModuleNotFoundError"
        ):
            stub.result(timeout=0.5)
        stub.terminate("test over")
    lines = [r.getMessage() for r in caplog.records if "RvLazyImport" in r.getMessage()]
    # ... and where in the activity's code (the run's failure line names the workflow's only).
    assert lines and lines[0] == (
        f"activity RvLazyImport (1) of run {stub.run_id} failed, attempt 1 at "
        "tests/test_retrying_visible.py:22 in handle: "
        "ModuleNotFoundError: No module named 'rv_not_installed'; retrying in 0.05 s"
    ), lines[:2]


class RvSlowRetry(Activity):
    retry = RetryPolicy(initial_interval=30, max_interval=30)

    def handle(self) -> int:
        raise ConnectionError("payments API down")


class RvWaitsForRetry(Workflow):
    def handle(self) -> int:
        return activity(RvSlowRetry)


def test_status_says_when_the_next_attempt_is_due(redis_url: str, store: RedisStore) -> None:
    """An activity waiting out its backoff: `durable status` said which attempt comes, not when."""
    with TestEnvironment(store=store, eager=False):
        stub = WorkflowStub.make(RvWaitsForRetry).start()
        wait_for(lambda: len(stub.describe().retrying()) == 1, timeout=30)
        out = CliRunner().invoke(cli, ["status", stub.id]).output.strip()
        # describe's pending step says which of the two it is (it said "retry time, or queued").
        state = stub.describe().pending[0]["state"]
        stub.terminate("test over")
    assert state.startswith("attempt 2: not begun: waiting for its retry time (20"), state
    assert state.endswith(" UTC), then queued on 'default'"), state
    head, _, rest = out.partition("retrying: attempt 2, next attempt in ")
    assert head == "running (activity RvSlowRetry (1) ", out
    wait, _, error = rest.partition(" s, last error ")
    assert 25 <= float(wait) <= 30, out
    assert error == "ConnectionError: payments API down)", out


def _retrying_run(attempt: dict, step: dict) -> RunDescription:
    return RunDescription(
        workflow_id="w",
        run_id="r",
        type="T",
        status="running",
        blocked=None,
        outcome=None,
        created=0,
        closed=None,
        seq=3,
        build_id=None,
        pending=[{"kind": "activity", "id": "1", "name": "Charge", "attempt": 3, "worker": None, **step}],
        attempts=[
            {"act": "1", "attempt": 2, "outcome": "retry", "ts": 1_000_000, **attempt},
        ],
    )


@pytest.mark.parametrize(
    ("attempt", "step", "now_ms", "said"),
    [
        ({}, {}, 1_000_000, ", next attempt in 5.0 s,"),
        ({}, {}, 1_004_000, ", next attempt in 1.0 s,"),
        ({}, {}, 1_005_500, ", next attempt due now,"),
        ({}, {}, 1_050_000, ", next attempt due 45 s ago,"),
        ({"record": {"error": "E: x", "retry_in_s": 600}}, {}, 1_000_000, ", next attempt in 10 min (at "),
        # A backoff set for ages (RetryPolicy allows 30 million years): no date, and no crash.
        ({"record": {"error": "E: x", "retry_in_s": 9e14}}, {}, 1_000_000, "(at after 9999-12-31 UTC)"),
        ({}, {"worker": "vm:1"}, 1_000_000, "attempt 3, last error"),  # begun: no wait to tell
        ({"attempt": 1}, {}, 1_000_000, "attempt 3, last error"),  # not the failure before attempt 3
    ],
)
def test_the_next_attempt_is_counted_from_the_failures_record(
    attempt: dict, step: dict, now_ms: int, said: str
) -> None:
    attempt = {"record": {"error": "E: x", "retry_in_s": 5.0}, **attempt}
    (line,) = _retrying_run(attempt, step).retrying(now_ms)
    assert said in line and line.endswith("last error E: x"), line
