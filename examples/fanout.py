"""Fan-out / fan-in batch processing: split a batch into chunks, process every
chunk in parallel as its own activity with ``all()``, then combine.

Shows: ``all([...])`` of branches (each branch may make several durable calls;
results come back in input order however they finish), retries per chunk,
and how command ids stay stable (branch *i* of call *n* numbers its calls
``n.i.1``, ``n.i.2``, ...).

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/fanout.py

or ``durable worker --app examples.fanout`` and
``durable start BatchJob '[1,2,3,4,5,6,7,8,9,10]' 3 --id batch-1``.
"""

from __future__ import annotations

from typing import Any

from durable import RetryPolicy, Workflow, WorkflowStub, activity, all, query


# ------------------------------------------------------------------ activities
def process_chunk(chunk: list[int]) -> dict[str, int]:
    """The expensive part: here, squares and sums one chunk."""
    return {"count": len(chunk), "sum_of_squares": sum(x * x for x in chunk)}


def store_report(total: dict[str, int]) -> str:
    return f"report-{total['count']}-{total['sum_of_squares']}"


# ------------------------------------------------------------------- workflow
class BatchJob(Workflow):
    """Chunks of ``chunk_size`` processed in parallel; the totals stored once all are done."""

    def __init__(self) -> None:
        self.chunks_done = 0

    @query
    def progress(self) -> int:
        return self.chunks_done

    def handle(self, items: list[int], chunk_size: int = 100) -> dict[str, Any]:
        chunks = [items[i : i + chunk_size] for i in range(0, len(items), chunk_size)]

        def branch(chunk: list[int]) -> dict[str, int]:
            result = activity(process_chunk, chunk, retry=RetryPolicy(initial_interval=0.2, max_attempts=5))
            self.chunks_done += 1
            return result

        # Bind each chunk now (c=chunk): a bare closure would see only the last chunk.
        results = all([lambda c=chunk: branch(c) for chunk in chunks])
        total = {
            "count": sum(r["count"] for r in results),
            "sum_of_squares": sum(r["sum_of_squares"] for r in results),
        }
        report = activity(store_report, total)
        return {"chunks": len(chunks), "total": total, "report": report}


# ------------------------------------------------------------------------ demo
def main(
    store: Any = None, *, timeout: float = 30.0, items: int = 100, chunk_size: int = 10
) -> dict[str, Any]:
    """Process ``items`` numbers in chunks of ``chunk_size``; returns the workflow's result."""
    import uuid

    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    with WorkerThread(Worker(store, concurrency=8, grace=5.0, block_ms=200)):
        stub = WorkflowStub.make(BatchJob, id=f"batch-{uuid.uuid4().hex[:6]}", store=store)
        stub.start(list(range(1, items + 1)), chunk_size)
        return stub.result(timeout=timeout)


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
