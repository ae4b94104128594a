"""Workflows and activities taking and returning pydantic models (tests/test_pydantic.py)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from durable import ActivityFailed, Workflow, activity, await_signal, signal, update


class Item(BaseModel):
    sku: str
    qty: int = Field(gt=0)


class Order(BaseModel):
    id: str
    items: list[Item]


class Quote(BaseModel):
    order_id: str
    cents: int


@dataclass
class Note:
    text: str


def price(order: Order) -> Quote:
    assert isinstance(order, Order)  # a plain dict was validated into the model
    return Quote(order_id=order.id, cents=sum(100 * i.qty for i in order.items))


class PriceOrder(Workflow):
    def __init__(self) -> None:
        self.extra: list[Item] = []

    def handle(self, order: Order, note: Note | None = None) -> Quote:
        assert isinstance(order, Order)
        if order.id.startswith("wait"):
            await_signal("done")
        quote = activity(price, order.model_copy(update={"items": order.items + self.extra}))
        assert isinstance(quote, Quote)
        if note is not None:
            quote.order_id += f" ({note.text})"
        return quote

    @signal
    def add(self, item: Item) -> None:
        self.extra.append(item)

    @update
    def add_now(self, item: Item) -> int:
        """As ``add``, answering how many extra items there are."""
        self.extra.append(item)
        return len(self.extra)


class BadActivityArgs(Workflow):
    def handle(self) -> str:
        try:
            activity(price, {"id": "x", "items": [{"sku": "a", "qty": -1}]})
        except ActivityFailed as exc:
            return f"{type(exc.cause).__name__}: {exc.cause} (attempts {exc.attempts})"
        return "no error"
