"""Order saga with compensation: reserve stock, charge the card, ship; if a step
fails for good, undo the steps already done, newest first.

Shows: activities as saga steps, ``NonRetryableError`` to fail a step at once,
compensations run from ``except`` in the workflow (they are durable calls too,
so a crash half-way through compensating resumes where it was), idempotency
keys for the charge.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/saga.py

or serve it with ``durable worker --app examples.saga`` and start runs with
``durable start OrderSaga '"o-1"' 2500 --id o-1``.
"""

from __future__ import annotations

from typing import Any

from durable import (
    ActivityFailed,
    NonRetryableError,
    RetryPolicy,
    Workflow,
    WorkflowFailed,
    WorkflowStub,
    activity,
    activity_context,
    query,
)


# ------------------------------------------------------------------ activities
def reserve_items(order_id: str) -> str:
    return f"res-{order_id}"


def release_items(reservation: str) -> str:
    return f"released {reservation}"


def charge_card(order_id: str, cents: int) -> str:
    # The payment provider deduplicates on the key: a retried attempt never charges twice.
    key = activity_context().idempotency_key
    return f"ch-{order_id}-{cents} (idempotency key {key})"


def refund_card(charge: str) -> str:
    return f"refunded {charge}"


def ship_order(order_id: str, address: str) -> str:
    if address == "nowhere":
        raise NonRetryableError(f"carrier cannot deliver to {address!r}")
    return f"track-{order_id}"


FAST_RETRY = RetryPolicy(initial_interval=0.1, max_attempts=3)


# ------------------------------------------------------------------- workflow
class OrderSaga(Workflow):
    """reserve -> charge -> ship; on a failure, compensate what was done (newest first)."""

    def __init__(self) -> None:
        self.done: list[str] = []

    @query
    def steps(self) -> list[str]:
        return list(self.done)

    def handle(self, order_id: str, cents: int, address: str = "1 Main St") -> dict[str, Any]:
        compensations: list[tuple[Any, Any]] = []
        try:
            reservation = activity(reserve_items, order_id, retry=FAST_RETRY)
            compensations.append((release_items, reservation))
            self.done.append("reserved")

            charge = activity(charge_card, order_id, cents, retry=FAST_RETRY)
            compensations.append((refund_card, charge))
            self.done.append("charged")

            tracking = activity(ship_order, order_id, address, retry=FAST_RETRY)
            self.done.append("shipped")
            return {"order_id": order_id, "status": "shipped", "tracking": tracking}
        except ActivityFailed as failure:
            undone = []
            for undo, arg in reversed(compensations):
                undone.append(activity(undo, arg, retry=FAST_RETRY))
            self.done.append("compensated")
            return {
                "order_id": order_id,
                "status": "compensated",
                "error": str(failure.cause),
                "undone": undone,
            }


# ------------------------------------------------------------------------ demo
def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Run a good order and one whose shipping fails; returns both results."""
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])  # registers this module's functions as activities
    store = store or default_store()
    suffix = uuid.uuid4().hex[:6]
    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        good = WorkflowStub.make(OrderSaga, id=f"saga-ok-{suffix}", store=store).start("o-1", 2500)
        bad = WorkflowStub.make(OrderSaga, id=f"saga-bad-{suffix}", store=store).start("o-2", 990, "nowhere")
        try:
            results = {"ok": good.result(timeout=timeout), "failed": bad.result(timeout=timeout)}
        except WorkflowFailed as exc:  # pragma: no cover - only if the saga itself broke
            raise SystemExit(f"saga failed: {exc}") from exc
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
