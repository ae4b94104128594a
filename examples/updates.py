"""A shopping cart driven by updates: each ``add`` is validated, reserves stock with an
activity and answers the caller with the cart's size; ``checkout`` (a signal) ends it.

Shows: ``@update`` with a validator (``@add.validator``), ``WorkflowStub.update`` returning
the handler's result, a rejected update (``UpdateRejected``: nothing the workflow sees is
written), an ``update_id`` that makes a retried call exactly-once, and updates interleaving
with a ``@signal``. See docs/updates.md.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/updates.py

or with a worker (``durable worker --app examples.updates``)::

    durable start Cart --id cart-1
    durable update cart-1 add '"milk"'
    durable update cart-1 add '"milk"'              # error: ... rejected: ValueError: ...
    durable update cart-1 add '"tea"' --update-id tea-1 --json
    durable signal cart-1 checkout
    durable result cart-1
"""

from __future__ import annotations

from typing import Any

from durable import UpdateRejected, Workflow, WorkflowStub, activity, await_signal, signal, update

#: Stock reservations made by the activity in this process (a retried update does not repeat one).
RESERVED: list[str] = []


# ------------------------------------------------------------------ activities
def reserve_cart_item(sku: str) -> str:
    RESERVED.append(sku)
    return f"reservation-{sku}"


# ------------------------------------------------------------------- workflow
class Cart(Workflow):
    """Items come by the ``add`` update; a ``checkout`` signal ends the run with the cart."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.notes: list[str] = []

    def handle(self) -> dict[str, Any]:
        await_signal("checkout")
        return {"items": self.items, "notes": self.notes}

    @update
    def add(self, sku: str) -> int:
        self.items[sku] = activity(reserve_cart_item, sku)
        return len(self.items)

    @add.validator
    def _check_add(self, sku: str) -> None:
        if not sku or sku in self.items:
            raise ValueError(f"{sku!r} is empty or already in the cart")

    @signal
    def note(self, text: str) -> None:
        self.notes.append(text)


# ------------------------------------------------------------------------ demo
def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Two adds, one rejected, one retried with the same update id, then checkout."""
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    RESERVED.clear()
    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        cart = WorkflowStub.make(Cart, id=f"cart-{uuid.uuid4().hex[:6]}", store=store).start()
        sizes = [cart.update("add", "milk", timeout=timeout)]
        cart.signal("note", "leave at the door")
        try:
            cart.update("add", "milk", timeout=timeout)
            rejected = ""
        except UpdateRejected as exc:
            rejected = str(exc.cause)
        for _ in range(2):  # a client retrying after a lost reply: the handler runs once
            sizes.append(cart.update("add", "tea", update_id="add-tea", timeout=timeout))
        cart.signal("checkout")
        return {
            "sizes": sizes,
            "rejected": rejected,
            "reserved": list(RESERVED),
            "cart": cart.result(timeout=timeout),
        }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
