"""An attempt outcome that cannot be recorded for a reason a retry would meet again.

Found by a long-running test: ``RetryPolicy.delay`` overflowed at attempt 1025 of the default
policy (``2.0 ** 1024``), the failure could not be recorded, and the task ran again at every
reclaim, forever, with the run reading ``running``. The delay is capped without the power now;
and any such fault parks the task and blocks the run, visibly, instead of looping.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apps.basic import Failing
from click.testing import CliRunner
from waiting import wait_for

from durable import RetryPolicy, WorkflowStub, options
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from workers.cli import cli


@pytest.mark.parametrize(
    ("policy", "attempt", "delay"),
    [
        (RetryPolicy(), 1025, 100.0),  # the default: 1 s doubling, capped at 100 s
        (RetryPolicy(), 10**9, 100.0),
        (RetryPolicy(backoff_coefficient=10), 310, 100.0),
        (RetryPolicy(initial_interval=0.02, max_interval=0.02), 5000, 0.02),
        (RetryPolicy(), 7, 64.0),
        (RetryPolicy(initial_interval=2, backoff_coefficient=1), 10**6, 2.0),
    ],
)
def test_the_retry_delay_never_overflows(policy: RetryPolicy, attempt: int, delay: float) -> None:
    assert policy.delay(attempt) == delay


def test_an_outcome_that_cannot_be_recorded_parks_the_task_and_blocks_the_run(
    redis_url: str, store: RedisStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: RetryPolicy, attempt: int) -> float:
        raise ArithmeticError("a bug in the retry arithmetic")

    original = options.RetryPolicy.delay
    with TestEnvironment(store=store, eager=False):
        monkeypatch.setattr(options.RetryPolicy, "delay", broken)
        stub = WorkflowStub.make(Failing).start(str(tmp_path / "log"), 1)  # attempt 1 fails
        wait_for(lambda: (b := stub.blocked()) is not None and b.kind != "no_live_worker", timeout=30)
        reason = stub.blocked().message  # type: ignore[union-attr]
        assert reason.startswith("activity Flaky (1): its outcome could not be recorded: ArithmeticError"), (
            reason
        )
        assert [d["kind"] for d in store.dead_letters()] == ["activity"]
        attempts_before = (tmp_path / "log").read_text().count("attempt")
        monkeypatch.setattr(options.RetryPolicy, "delay", original)  # the fix is deployed
        result = CliRunner().invoke(cli, ["repair", stub.id])
        assert result.exit_code == 0, result.output
        assert stub.result(timeout=30) == 2  # the parked attempt ran again, then attempt 2 passed
        assert attempts_before == 1 and store.dead_letters() == []  # re-queued, not left behind
