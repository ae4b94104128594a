"""Orders you can find again: search attributes, a memo, ``list_runs``/``count_runs`` with a
``--where`` expression, and start policies (an id that is started once, signal-with-start).

Shows: ``SearchAttribute`` declarations, ``WorkflowStub.make(..., search_attributes=, memo=)``,
``upsert_search_attributes`` / ``upsert_memo`` in workflow code, ``durable.list_runs`` and
``durable.count_runs``, ``id_reuse_policy='reject_duplicate'``, ``signal_with_start`` and
``all_settled``. See docs/search.md and the start policies section of docs/guide.md.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/order_search.py

or with a worker (``durable worker --app examples.order_search``)::

    durable start Order '"o-1"' 120.5 '["a-1", "x-2"]' --id order-1 \\
        --search-attribute customer=acme --app examples.order_search
    durable signal order-1 pay
    durable list --where "customer = 'acme' and amount > 100" --app examples.order_search
    durable count --where "tags = 'paid'" --app examples.order_search
"""

from __future__ import annotations

from typing import Any

from durable import (
    RetryPolicy,
    SearchAttribute,
    Workflow,
    WorkflowAlreadyStarted,
    WorkflowStub,
    activity,
    all_settled,
    await_signal,
    count_runs,
    list_runs,
    upsert_memo,
    upsert_search_attributes,
)

CUSTOMER = SearchAttribute("customer", "keyword")
AMOUNT = SearchAttribute("amount", "float")
TAGS = SearchAttribute("tags", "keyword_list")


# ------------------------------------------------------------------ activities
def check_line(sku: str) -> str:
    if sku.startswith("x"):
        raise ValueError(f"{sku} is discontinued")
    return f"{sku}: ok"


# ------------------------------------------------------------------- workflow
class Order(Workflow):
    """Checks every line (collecting failures, no fail-fast), then waits for payment."""

    def handle(self, order_id: str, amount: float, lines: list[str]) -> dict[str, Any]:
        upsert_search_attributes({"amount": amount, "tags": ["new"]})
        once = RetryPolicy(max_attempts=1)  # a discontinued line does not come back: no retries
        checked = all_settled([lambda sku=sku: activity(check_line, sku, retry=once) for sku in lines])
        problems = [str(s.error) for s in checked if not s.ok]
        upsert_memo({"problems": problems})
        await_signal("pay")
        upsert_search_attributes({"tags": ["paid"]})
        return {"order": order_id, "ok": [s.value for s in checked if s.ok], "problems": problems}


# ------------------------------------------------------------------------ demo
def main(store: Any = None, *, timeout: float = 30.0) -> dict[str, Any]:
    """Three orders of two customers; find them by attributes; start one id only once."""
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    tag = uuid.uuid4().hex[:6]
    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        stubs = []
        for n, (customer, amount) in enumerate([("acme", 120.5), ("acme", 40.0), ("globex", 300.0)]):
            stub = WorkflowStub.make(
                Order,
                id=f"order-{tag}-{n}",
                store=store,
                search_attributes={"customer": customer},
                memo={"channel": "web"},
                id_reuse_policy="reject_duplicate",
            )
            # signal-with-start: the payment may arrive before anyone started the order.
            stubs.append(stub.signal_with_start("pay", start_args=(f"o-{n}", amount, ["a1", "x2", "b3"])))
        results = [s.result(timeout=timeout) for s in stubs]
        try:
            WorkflowStub.make(Order, id=stubs[0].id, store=store, id_reuse_policy="reject_duplicate").start(
                "again", 1.0, []
            )
            restarted = True
        except WorkflowAlreadyStarted:
            restarted = False
        big_acme = list_runs("customer = 'acme' and amount > 100 and tags = 'paid'", store=store)
        return {
            "results": results,
            "big_acme": [r["workflow_id"] for r in big_acme if r["workflow_id"].startswith(f"order-{tag}")],
            "paid": count_runs("tags = 'paid'", store=store),
            "restarted": restarted,
            "first": stubs[0].id,
        }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
