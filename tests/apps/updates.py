"""A workflow with @update handlers, for tests/test_updates.py (in-process and `durable worker`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from durable import Workflow, activity, await_signal, register_activity, signal, timer, update

#: Each call of upd_reserve appends a line here when set (counts calls across processes).
CALLS_FILE = "DURABLE_TEST_UPDATE_CALLS"


@register_activity(name="upd_reserve")
def upd_reserve(sku: str) -> str:
    path = os.environ.get(CALLS_FILE)
    if path:
        with Path(path).open("a") as f:
            f.write(sku + "\n")
    return f"reserved:{sku}"


class UpdCart(Workflow):
    """A cart: items come by update (one reserved by an activity, then a timer), 'checkout' ends it."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.notes: list[str] = []

    def handle(self) -> dict:
        await_signal("checkout")
        return {"items": self.items, "notes": self.notes}

    @update
    def add(self, sku: str) -> int:
        self.items.append(sku)
        return len(self.items)

    @add.validator
    def _check_add(self, sku: str) -> None:
        if not sku or sku in self.items:
            raise ValueError(f"bad or duplicate sku {sku!r}")

    @update
    def reserve(self, sku: str, wait: float = 0.2) -> str:
        receipt = activity(upd_reserve, sku)
        timer(wait)
        self.items.append(sku)
        return receipt

    @update
    def fail(self, why: str) -> None:
        raise KeyError(why)

    @signal
    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass
class UpdReceipt:
    sku: str
    total: float


class UpdReceipts(Workflow):
    """An update whose result is a dataclass: a process without this module shows it by name."""

    def handle(self) -> None:
        await_signal("done")

    @update
    def issue(self, sku: str) -> UpdReceipt:
        return UpdReceipt(sku, 12.5)
