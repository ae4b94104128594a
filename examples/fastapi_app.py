"""A FastAPI app that starts a workflow and awaits its result, without a thread per request.

The HTTP handlers are ``async def`` and use :class:`durable.AsyncWorkflowStub`: ``await
stub.result()`` parks the request's coroutine in the event loop's one shared Redis read.
The workflow takes and returns pydantic models (the request body validates into ``OrderIn``,
the response is the ``Receipt``); its activity is an ``async def``, run on the worker's
event loop thread. The workflow itself stays ordinary synchronous code.

Needs ``pip install fastapi httpx`` (and the ``pydantic`` extra). Run the demo (in-process
worker, the app called through httpx's ASGI transport)::

    python examples/fastapi_app.py

or serve it, with the worker as a separate process::

    durable worker --app examples.fastapi_app
    uvicorn examples.fastapi_app:app
    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"id": "o-1", "items": [{"sku": "book", "qty": 2}]}'
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from pydantic import BaseModel, Field

from durable import (
    AsyncWorkflowStub,
    RetryPolicy,
    Workflow,
    WorkflowAlreadyStarted,
    WorkflowFailed,
    WorkflowNotFound,
    activity,
)


class Line(BaseModel):
    sku: str = Field(min_length=1)
    qty: int = Field(gt=0, le=100)


class OrderIn(BaseModel):
    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")
    items: list[Line] = Field(min_length=1)


class Receipt(BaseModel):
    order_id: str
    cents: int
    charge_id: str


# ------------------------------------------------------------------ activities
async def charge_web_order(order: OrderIn) -> Receipt:
    """An async activity: it would await an HTTP payment API here (e.g. with httpx)."""
    await asyncio.sleep(0.05)
    cents = sum(250 * line.qty for line in order.items)
    return Receipt(order_id=order.id, cents=cents, charge_id=f"ch-{order.id}")


# ------------------------------------------------------------------- workflow
class WebOrder(Workflow):
    """Synchronous workflow code (greenlets), whatever the client and activities are."""

    def handle(self, order: OrderIn) -> Receipt:
        return activity(charge_web_order, order, retry=RetryPolicy(max_attempts=3))


# ------------------------------------------------------------------------ app
def create_app(store: Any = None, *, timeout: float = 30.0) -> Any:
    """The FastAPI app (``store``: the durable store; default: the configured one)."""
    # Imported here: fastapi is an optional dependency of the example, not of the worker
    # process that imports this module for the workflow and its activity.
    from fastapi import FastAPI, HTTPException

    api = FastAPI(title="durable orders")

    @api.post("/orders")
    async def place_order(order: OrderIn) -> Receipt:
        # The order id is the workflow id, and placing an order is idempotent: a retried POST
        # joins the run already going (use_existing) and one after it closed gets that run's
        # outcome (reject_duplicate), so an order is never charged twice.
        wid = f"web-order-{order.id}"
        stub = AsyncWorkflowStub.make(
            WebOrder,
            id=wid,
            store=store,
            id_reuse_policy="reject_duplicate",
            id_conflict_policy="use_existing",
        )
        try:
            await stub.start(order)
        except WorkflowAlreadyStarted:  # placed before, and closed: answer with that run
            stub = await AsyncWorkflowStub.load(wid, store=store)
        try:
            return await stub.result(timeout=timeout)
        except WorkflowFailed as exc:
            raise HTTPException(status_code=502, detail=str(exc)) from exc
        except TimeoutError as exc:  # still running: GET /orders/{id} gives the receipt once done
            raise HTTPException(status_code=504, detail=f"order {order.id} is still running") from exc

    @api.get("/orders/{order_id}")
    async def order_status(order_id: str) -> dict[str, Any]:
        try:
            stub = await AsyncWorkflowStub.load(f"web-order-{order_id}", store=store)
        except WorkflowNotFound as exc:
            raise HTTPException(status_code=404, detail=f"no order {order_id}") from exc
        status = await stub.status()
        if status != "completed":
            return {"status": status}
        return {"status": status, "receipt": await stub.result(timeout=timeout)}

    return api


app = create_app() if importlib.util.find_spec("fastapi") else None


def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Place one order and one invalid order through the app, with an in-process worker."""
    import uuid

    import httpx

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    order_id = uuid.uuid4().hex[:8]

    async def calls() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=create_app(store, timeout=timeout))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            body = {"id": order_id, "items": [{"sku": "book", "qty": 2}]}
            placed = await client.post("/orders", json=body)
            again = await client.post("/orders", json=body)  # a retried request: the same receipt
            status = await client.get(f"/orders/{order_id}")
            unknown = await client.get("/orders/nope")
            invalid = await client.post("/orders", json={"id": "x", "items": [{"sku": "pen", "qty": 0}]})
        return {
            "placed": placed.json(),
            "again": again.json(),
            "status": status.json(),
            "unknown": unknown.status_code,
            "invalid": invalid.status_code,
        }

    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        return asyncio.run(calls())


if __name__ == "__main__":
    print(main())
