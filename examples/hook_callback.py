"""An external callback resumed through a hook: the workflow asks a payment
provider to charge a card and hands it a callback URL holding a hook token;
when the provider calls back, the web handler calls
``WorkflowStub.resume_hook(token, payload)`` and the workflow continues.

Shows: ``create_hook(name, metadata)`` (the token is unguessable, single use
and derived, never stored: replay gives the same one), ``await_hook(hook, timeout=...)``,
``WorkflowStub.resume_hook`` from code that knows only the token, and a
``@query`` to read the token from outside.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/hook_callback.py

In a web app the callback handler is just::

    def payment_webhook(request):
        WorkflowStub.resume_hook(request.args["token"], request.json)
"""

from __future__ import annotations

from typing import Any

from durable import (
    SignalTimeout,
    Workflow,
    WorkflowStub,
    activity,
    await_hook,
    create_hook,
    query,
)

CALLBACK_URL = "https://shop.example.com/payments/callback?token={token}"


# ------------------------------------------------------------------ activities
def request_payment(order_id: str, cents: int, callback_url: str) -> str:
    """Ask the provider to charge; it will call ``callback_url`` when done."""
    return f"payment request for {order_id} ({cents} cents) registered with callback {callback_url}"


def fulfil(order_id: str, provider_ref: str) -> str:
    return f"fulfilled {order_id} (paid: {provider_ref})"


# ------------------------------------------------------------------- workflow
class PaymentCallback(Workflow):
    """request payment -> wait for the provider's callback (with a deadline) -> fulfil."""

    def __init__(self) -> None:
        self.token: str | None = None

    @query
    def callback_token(self) -> str | None:
        return self.token

    def handle(self, order_id: str, cents: int, timeout_seconds: float = 3600) -> dict[str, Any]:
        hook = create_hook("payment", {"order_id": order_id})
        self.token = hook.token
        activity(request_payment, order_id, cents, CALLBACK_URL.format(token=hook.token))
        try:
            payment = await_hook(hook, timeout=timeout_seconds)
        except SignalTimeout:
            return {"order_id": order_id, "status": "expired"}
        if payment.get("status") != "paid":
            return {"order_id": order_id, "status": payment.get("status", "unknown")}
        return {
            "order_id": order_id,
            "status": "paid",
            "fulfilment": activity(fulfil, order_id, payment["ref"]),
        }


# ------------------------------------------------------------------------ demo
def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Start a payment, play the provider calling back, return the result."""
    import time
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        stub = WorkflowStub.make(PaymentCallback, id=f"pay-{uuid.uuid4().hex[:6]}", store=store)
        stub.start("order-7", 4200)
        # The provider got the token in its callback URL; here we read it with a query.
        deadline = time.monotonic() + timeout
        token = None
        while token is None and time.monotonic() < deadline:
            token = stub.query("callback_token")
            time.sleep(0.05)
        if token is None:
            raise TimeoutError("the workflow did not create its hook in time")
        # ... later, the provider's webhook arrives:
        WorkflowStub.resume_hook(token, {"status": "paid", "ref": "psp-991"}, store=store)
        return stub.result(timeout=timeout)


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
