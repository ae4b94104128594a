"""Issue 13 items 13 and 15 with a real ``durable worker`` process (the other tests of these
items use the in-process worker): a closed run's ``describe()``/``snapshot()`` carry its
outcome, and a custom exception raised by an activity reaches the workflow with its type
and attributes."""

from __future__ import annotations

import pytest
from apps.basic import Boom, Sequence
from apps.payments import Checkout
from procs import workers

from durable import WorkflowFailed, WorkflowStub
from durable.store.redis_store import RedisStore

pytestmark = pytest.mark.slow


def test_outcomes_and_custom_exceptions_cross_a_worker_process(redis_url: str, store: RedisStore) -> None:
    with workers(redis_url, app="apps.basic", extra=("--app", "apps.payments")):
        declined = WorkflowStub.make(Checkout, store=store).start("4000-0000")
        done = WorkflowStub.make(Sequence, store=store).start(3)
        failed = WorkflowStub.make(Boom, store=store).start()
        assert declined.result(timeout=30) == {
            "type": "PaymentDeclined",
            "is_payment_declined": True,
            "code": 402,
            "message": "card declined",
            "original_type": None,
        }
        assert done.result(timeout=30) == 3
        with pytest.raises(WorkflowFailed):
            failed.result(timeout=30)
    outcome = done.describe().outcome
    assert outcome is not None and outcome.status == "completed" and outcome.result == 3 and outcome.closed
    snap = failed.snapshot()["outcome"]
    assert snap["status"] == "failed" and "KeyError" in snap["error"]["type"] and snap["closed"]
