"""The demo workflow: an order that reserves stock, waits for a fraud check and
an approval, charges the card, ships in parallel with a label, and sends a
receipt from a child workflow.

It uses only the public API (``from durable import ...``). Run it with
``durable demo`` (embedded Redis, one in-process worker), or serve it with
``durable worker --app examples.order`` and drive it with ``durable start``::

    durable start OrderWorkflow '"order-1"' '["book", "pen"]' 1999 --id order-1 --no-wait
    durable signal order-1 approve '"alice"'
    durable result order-1
"""

from __future__ import annotations

from typing import Any

from durable import (
    Activity,
    RetryPolicy,
    Workflow,
    WorkflowStub,
    activity,
    activity_context,
    all,
    await_signal,
    child,
    query,
    timer,
)

#: Seconds of the durable "fraud check" timer.
FRAUD_CHECK_SECONDS = 0.5
#: Seconds the workflow waits for the ``approve`` signal.
APPROVAL_TIMEOUT = 30


# ------------------------------------------------------------------ activities
def reserve_stock(order_id: str, items: list[str]) -> dict[str, Any]:
    """Reserve every item; returns a reservation."""
    return {"reservation": f"res-{order_id}", "items": sorted(items)}


class ChargeCard(Activity):
    """Charge the card once per order: the idempotency key is stable across retries."""

    retry = RetryPolicy(initial_interval=0.2, backoff_coefficient=2.0, max_attempts=5)
    start_to_close_timeout = 10

    def handle(self, order_id: str, cents: int) -> dict[str, Any]:
        key = self.context.idempotency_key
        return {"charge": f"ch-{order_id}", "cents": cents, "idempotency_key": key}


def ship(order_id: str, reservation: str) -> str:
    """Hand the parcel to the carrier; returns a tracking number."""
    return f"track-{order_id}-{reservation.rsplit('-', 1)[-1]}"


def print_label(order_id: str) -> str:
    """Print the shipping label (runs in parallel with ``ship``)."""
    return f"label-{order_id}"


def send_email(to: str, text: str) -> str:
    """Send an e-mail; returns a message id."""
    ctx = activity_context()
    return f"msg-{ctx.workflow_id}-{len(text)}-{to}"


# ------------------------------------------------------------------- workflows
class SendReceipt(Workflow):
    """Child workflow: e-mail the receipt."""

    def handle(self, order_id: str, approver: str, cents: int) -> str:
        text = f"order {order_id}: {cents / 100:.2f} charged, approved by {approver}"
        return activity(send_email, f"{order_id}@example.com", text)


class OrderWorkflow(Workflow):
    """reserve -> fraud-check timer -> await approval -> charge -> (ship || label) -> receipt."""

    def __init__(self) -> None:
        self.stage = "new"

    @query
    def progress(self) -> str:
        return self.stage

    def handle(self, order_id: str, items: list[str], cents: int) -> dict[str, Any]:
        self.stage = "reserving"
        reservation = activity(reserve_stock, order_id, items)
        self.stage = "fraud-check"
        timer(FRAUD_CHECK_SECONDS)
        self.stage = "awaiting-approval"
        approver = await_signal("approve", timeout=APPROVAL_TIMEOUT)
        self.stage = "charging"
        charge = activity(ChargeCard, order_id, cents)
        self.stage = "shipping"
        tracking, label = all(
            [
                lambda: activity(ship, order_id, reservation["reservation"]),
                lambda: activity(print_label, order_id),
            ]
        )
        self.stage = "receipt"
        receipt = child(SendReceipt, order_id, approver, cents)
        self.stage = "done"
        return {
            "order_id": order_id,
            "items": reservation["items"],
            "approved_by": approver,
            "charge": charge["charge"],
            "cents": charge["cents"],
            "tracking": tracking,
            "label": label,
            "receipt": receipt,
        }


# ------------------------------------------------------------------------ demo
def demo(store: Any = None, *, order_id: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Run one order end to end with an in-process worker; returns a summary.

    The summary holds ``workflow_id``, ``run_id``, ``result`` and ``history``
    (a list of :class:`durable.HistoryEvent`). Prints nothing: ``durable demo``
    prints the result and the history table.

    Args:
        store: A ``RedisStore`` (default: ``DURABLE_REDIS_URL`` or the embedded server).
        order_id: The workflow id (default: a new unique one).
        timeout: Seconds to wait for the result.
    """
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])  # registers this module's plain functions as activities
    store = store or default_store()
    order_id = order_id or f"order-{uuid.uuid4().hex[:8]}"
    # app=(): this in-process worker may run every type registered in this process.
    worker = Worker(store, queues=["default"], concurrency=4, grace=5.0)
    with WorkerThread(worker):
        stub = WorkflowStub.make(OrderWorkflow, id=order_id, store=store)
        stub.start(order_id, ["book", "pen"], 1999)
        stub.signal("approve", "alice")
        result = stub.result(timeout=timeout)
        history = stub.history()
    return {"workflow_id": stub.id, "run_id": stub.run_id, "result": result, "history": history}


if __name__ == "__main__":  # pragma: no cover - manual run
    summary = demo()
    print(summary["result"])
