"""Workflows and activities taking and returning pydantic models (tests/test_pydantic.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, SecretStr, computed_field

from durable import ActivityFailed, Workflow, activity, await_signal, signal, update

from .typed_models import Parcel


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


class Account(BaseModel):
    """camelCase aliases, as an HTTP API's models have them."""

    user_id: int = Field(alias="userId")


class Kind(enum.Enum):
    CARD = "card"


class Payment(BaseModel):
    """A strict model: its datetime, UUID, Decimal and enum fields take only their own types."""

    model_config = ConfigDict(strict=True)
    when: datetime
    uid: UUID
    amount: Decimal
    kind: Kind


class Doubled(BaseModel):
    """A computed field beside ``extra="forbid"``."""

    model_config = ConfigDict(extra="forbid")
    n: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.n


class Login(BaseModel):
    user: str
    password: SecretStr


class Session(BaseModel):
    login: Login


class Hidden(BaseModel):
    token: str = Field(exclude=True)


def echo_model(value: Account | Payment | Doubled) -> Account | Payment | Doubled:
    return value


class EchoModel(Workflow):
    def handle(self, value: Account | Payment | Doubled) -> Account | Payment | Doubled:
        return activity(echo_model, value)


def weigh(parcel: Parcel) -> int:
    return sum(d.grams for d in parcel.dims)


class ShipParcel(Workflow):
    """Takes and returns a model of another module (``apps.typed_models``), allowed because
    these annotations name it."""

    def handle(self, parcel: Parcel) -> Parcel:
        grams = activity(weigh, parcel)
        return parcel.model_copy(update={"ref": f"{parcel.ref}:{grams}g"})
