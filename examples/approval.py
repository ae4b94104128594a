"""Human approval with a signal and a deadline: an expense report waits for a
manager's ``decide`` signal; if none arrives before the deadline it is
escalated (auto-rejected here).

Shows: ``await_signal(name, timeout=...)``, ``SignalTimeout``, a ``@query``
that reads the workflow's state, and a ``@signal`` handler that records
comments without waking the main code.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/approval.py

or with a worker (``durable worker --app examples.approval``)::

    durable start ExpenseApproval '"exp-1"' 12000 86400 --id exp-1 --no-wait
    durable signal exp-1 comment '"looks fine"'
    durable signal exp-1 decide '{"approved": true, "by": "alice"}'
    durable result exp-1
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durable import (
    SignalTimeout,
    Workflow,
    WorkflowStub,
    activity,
    await_signal,
    query,
    signal,
)


# ------------------------------------------------------------------ activities
def notify_manager(expense_id: str, cents: int) -> str:
    return f"asked a manager to approve {expense_id} ({cents / 100:.2f})"


def pay_out(expense_id: str, cents: int) -> str:
    return f"paid {expense_id}"


def notify_requester(expense_id: str, outcome: str) -> str:
    return f"told the requester: {expense_id} {outcome}"


# ------------------------------------------------------------------- workflow
class ExpenseApproval(Workflow):
    """Ask for approval, wait for a ``decide`` signal up to ``deadline_seconds``, then act."""

    def __init__(self) -> None:
        self.state = "new"
        self.comments: list[str] = []

    @query
    def status(self) -> dict[str, Any]:
        return {"state": self.state, "comments": list(self.comments)}

    @signal
    def comment(self, text: str) -> None:
        self.comments.append(text)

    def handle(self, expense_id: str, cents: int, deadline_seconds: float = 86400) -> dict[str, Any]:
        activity(notify_manager, expense_id, cents)
        self.state = "waiting"
        try:
            decision = await_signal("decide", timeout=timedelta(seconds=deadline_seconds))
        except SignalTimeout:
            self.state = "escalated"
            activity(notify_requester, expense_id, "was not decided in time")
            return {"expense_id": expense_id, "outcome": "timed out", "comments": self.comments}
        if decision.get("approved"):
            self.state = "approved"
            activity(pay_out, expense_id, cents)
            outcome = f"approved by {decision.get('by', '?')}"
        else:
            self.state = "rejected"
            outcome = f"rejected by {decision.get('by', '?')}"
        activity(notify_requester, expense_id, outcome)
        return {"expense_id": expense_id, "outcome": outcome, "comments": self.comments}


# ------------------------------------------------------------------------ demo
def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """One report approved by a signal, one left to time out (1 s deadline)."""
    import time
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    suffix = uuid.uuid4().hex[:6]
    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        approved = WorkflowStub.make(ExpenseApproval, id=f"exp-ok-{suffix}", store=store)
        approved.start("exp-1", 12000, 3600)
        late = WorkflowStub.make(ExpenseApproval, id=f"exp-late-{suffix}", store=store)
        late.start("exp-2", 500, 1)
        approved.signal("comment", "receipts attached")
        # Wait until the run is waiting for the decision (a query replays its history).
        deadline = time.monotonic() + timeout
        while approved.query("status")["state"] != "waiting" and time.monotonic() < deadline:
            time.sleep(0.05)
        approved.signal("decide", {"approved": True, "by": "alice"})
        return {"approved": approved.result(timeout=timeout), "late": late.result(timeout=timeout)}


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
