"""Workflows that set search attributes and memos (tests/test_search.py)."""

from __future__ import annotations

import durable
from durable import ConfigurationError, SearchAttribute, Workflow

CUSTOMER = SearchAttribute("customer", "keyword")
AMOUNT = SearchAttribute("amount", "float")
ITEMS = SearchAttribute("items", "int")
TAGS = SearchAttribute("tags", "keyword_list")
VIP = SearchAttribute("vip", "bool")
DUE = SearchAttribute("due", "datetime")
NOTE = SearchAttribute("note", "text")


class SearchOrder(Workflow):
    """Upserts attributes and a memo; with ``wait``, waits for signal ``go`` in between."""

    name = "SearchOrder"

    def handle(self, customer: str, amount: float, wait: bool = False) -> str:
        durable.upsert_search_attributes({"customer": customer, "amount": amount, "due": durable.now()})
        durable.upsert_memo({"note": f"order for {customer}", "lines": [1, 2]})
        if wait:
            durable.await_signal("go")
        durable.upsert_search_attributes({"tags": ["paid", customer], "vip": amount > 100, "due": None})
        durable.upsert_memo({"lines": None, "done": True})
        return customer


class SearchBadUpsert(Workflow):
    """Upserts a value of the wrong type, then an undeclared name; returns both errors."""

    name = "SearchBadUpsert"

    def handle(self) -> list[str]:
        errors = []
        for values in ({"amount": "lots"}, {"nope": 1}):
            try:
                durable.upsert_search_attributes(values)
            except ConfigurationError as exc:
                errors.append(str(exc))
        return errors


class SearchLooper(Workflow):
    """Continues as new once: the attributes and memo carry over."""

    name = "SearchLooper"

    def handle(self, round_: int = 0) -> int:
        if round_ == 0:
            durable.upsert_search_attributes({"items": 7})
            durable.upsert_memo({"first": True})
            durable.continue_as_new(1)
        info = durable.workflow_info()
        return int(info["search_attributes"]["items"]) + (10 if info["memo"].get("first") else 0)
