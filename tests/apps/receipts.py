"""A workflow whose result holds a dataclass and an enum of this module: worker processes import
it as ``apps.receipts``; the test process and the CLI do not (tests/test_payload_view.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from durable import Workflow, activity


class Tier(enum.Enum):
    GOLD = "gold"


@dataclass
class Receipt:
    order: str
    total: float
    tier: Tier


def receipt_charge(order: str, amount: float) -> Receipt:
    return Receipt(order, amount, Tier.GOLD)


class ReceiptRun(Workflow):
    def handle(self, order: str, amount: float) -> dict:
        return {"receipt": activity(receipt_charge, order, amount), "ok": True}
