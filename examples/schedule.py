"""A schedule: a heartbeat report every 2 seconds, plus one run triggered by hand.

Shows: ``Schedule`` (interval or cron with a time zone, overlap policy),
``ScheduleHandle.create`` / ``describe`` / ``trigger`` / ``pause`` / ``delete``; the
worker's scheduler starts a run for each scheduled time, with the workflow id
``<schedule id>-<UTC ISO time>``.

Run it (embedded Redis, or the one in ``DURABLE_REDIS_URL``)::

    python examples/schedule.py

or with a worker (``durable worker --app examples.schedule``)::

    durable schedule create heartbeat --workflow Heartbeat --args '"eu"' --every 30s
    durable schedule create nightly --workflow Heartbeat --cron '0 2 * * *' --timezone Europe/Berlin
    durable schedule describe heartbeat
    durable schedule trigger nightly
    durable schedule backfill nightly --from 2024-05-01 --to 2024-05-07 --overlap allow_all
    durable schedule delete heartbeat
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from durable import Schedule, ScheduleHandle, Workflow, WorkflowStub, now


class Heartbeat(Workflow):
    """One scheduled run: reports when it ran for which region."""

    def handle(self, region: str = "eu") -> dict[str, Any]:
        return {"region": region, "ran_at": now().isoformat()}


def main(store: Any = None, *, seconds: float = 5.0) -> dict[str, Any]:
    """Create a 2-second schedule, let it fire for ``seconds``, trigger once, describe, delete."""
    from durable.client import default_store
    from workers.worker import Worker, WorkerThread, load_app

    load_app([__name__])
    store = store or default_store()
    schedule_id = f"heartbeat-{uuid.uuid4().hex[:6]}"
    with WorkerThread(Worker(store, concurrency=4, grace=5.0, block_ms=200)):
        handle = ScheduleHandle.create(
            schedule_id, Schedule(workflow=Heartbeat, args=("eu",), every="2s", overlap="skip"), store=store
        )
        time.sleep(seconds)
        # allow_all: start one even while a scheduled run is open (the schedule's own policy,
        # skip, would start nothing then, and trigger() would return None).
        triggered = handle.trigger(overlap="allow_all")
        assert triggered is not None
        result = WorkflowStub.load(triggered, store=store).result(timeout=30)
        handle.pause("example done")
        info = handle.describe()
        handle.delete()
    started = [a for a in info.recent_actions if a["action"] == "started"]
    return {
        "schedule": schedule_id,
        "started": len(started),
        "triggered": triggered,
        "result": result,
        "recent": [(a["action"], a.get("scheduled_at")) for a in info.recent_actions[:5]],
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
