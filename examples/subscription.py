"""A long-running subscription: bill a customer every period, forever, without
the history growing forever — each run bills a few periods, then
``continue_as_new`` closes it and starts a fresh run (same workflow id, new
run id, empty history) carrying the state forward.

Shows: ``wait_until(predicate, timeout=period)`` as a sleep that a ``cancel``
signal cuts short, ``continue_as_new(*args)``, a ``@signal`` handler, and ``result()`` following the
chain of runs to the last one.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/subscription.py

or ``durable worker --app examples.subscription`` and
``durable start Subscription '"cust-1"' 86400 --id sub-cust-1 --no-wait``
(a daily bill), later ``durable signal sub-cust-1 cancel``.
"""

from __future__ import annotations

from typing import Any

from durable import Workflow, WorkflowStub, activity, continue_as_new, signal, wait_until

#: Billing periods per run before continuing as new (keeps each history short).
PERIODS_PER_RUN = 3


# ------------------------------------------------------------------ activities
def bill(customer: str, period: int) -> str:
    return f"invoice-{customer}-{period}"


def send_goodbye(customer: str, periods: int) -> str:
    return f"goodbye {customer} after {periods} period{'' if periods == 1 else 's'}"


# ------------------------------------------------------------------- workflow
class Subscription(Workflow):
    """Bill every ``period_seconds``; continue as new every few periods; stop on ``cancel``
    (or after ``max_periods``, so the demo ends)."""

    def __init__(self) -> None:
        self.cancelled = False

    @signal
    def cancel(self) -> None:
        self.cancelled = True

    def handle(
        self, customer: str, period_seconds: float, period: int = 1, max_periods: int = 0, runs: int = 1
    ) -> dict[str, Any]:
        for _ in range(PERIODS_PER_RUN):
            if self.cancelled or (max_periods and period > max_periods):
                farewell = activity(send_goodbye, customer, period - 1)
                return {"customer": customer, "periods": period - 1, "runs": runs, "farewell": farewell}
            activity(bill, customer, period)
            period += 1
            # Sleep one period, but wake early on `cancel`.
            wait_until(lambda: self.cancelled, timeout=period_seconds)
        # This run has done its share: a fresh run (and history) continues the subscription.
        continue_as_new(customer, period_seconds, period, max_periods, runs + 1)


# ------------------------------------------------------------------------ demo
def main(store: Any = None, *, timeout: float = 30.0, periods: int = 7) -> dict[str, Any]:
    """Bill ``periods`` short periods (0.1 s each) across several runs; returns the last result."""
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        stub = WorkflowStub.make(Subscription, id=f"sub-{uuid.uuid4().hex[:6]}", store=store)
        stub.start("cust-1", 0.1, 1, periods)
        first_run = stub.run_id
        result = stub.result(timeout=timeout)  # follows continue-as-new to the last run
        result["first_run"], result["last_run"] = first_run, stub.run_id
        return result


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
