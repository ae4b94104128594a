"""Checks and scenarios shared by the end-to-end suites (one Redis and Redis Cluster alike)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from apps.basic import SlowSteps
from procs import spawn_worker, stop, workers
from waiting import wait_for

from durable import WorkflowStub
from durable.client import default_store
from durable.store.redis_store import RedisStore


def assert_history_sound(stub: WorkflowStub) -> None:
    """Seqs contiguous from 1; no command id scheduled twice or completed twice; no orphan result."""
    history = stub.history()
    assert [e.seq for e in history] == list(range(1, len(history) + 1))
    scheduled = [e.data["id"] for e in history if e.type == "ActivityScheduled"]
    completed = [e.data["id"] for e in history if e.type in ("ActivityCompleted", "ActivityFailed")]
    assert len(scheduled) == len(set(scheduled)), f"scheduled twice: {scheduled}"
    assert len(completed) == len(set(completed)), f"completed twice: {completed}"
    assert set(completed) <= set(scheduled)


def sigkill_mid_activity(redis_url: str, tmp_path: Path) -> None:
    """A worker SIGKILLed inside an activity: another worker finishes the run, the history stays
    sound, the activity ran again (at least once) and its keyed effect was applied once."""
    log = tmp_path / "slow.log"
    victim = spawn_worker(redis_url, extra=("--claim-idle", "1.5"))
    try:
        stub = WorkflowStub.make(SlowSteps).start(str(log), 3, 0.6)
        # Wait until the victim is inside the second activity, then kill it outright.
        wait_for(lambda: log.exists() and "start s1" in log.read_text(), timeout=30)
        victim_name = next(w.name for w in default_store().live_workers() if w.pid == victim.pid)
        victim.send_signal(signal.SIGKILL)
        victim.wait(5)
    finally:
        stop(victim)
    with workers(redis_url, 1, extra=("--claim-idle", "1.5")):
        assert stub.result(timeout=60) == ["s0", "s1", "s2", "end"]
    assert_history_sound(stub)
    lines = log.read_text().split("\n")
    assert lines.count("start s1 1") >= 1 and any(
        line.startswith("start s1") for line in lines[lines.index("start s1 1") + 1 :]
    )
    applied = (tmp_path / "slow.log.effects" / "applied.log").read_text().split()
    assert len(applied) == len(set(applied)) == 3, "an idempotency-keyed effect was applied twice"
    # The attempt the kill cut short is shown, naming the worker that began it, before the one
    # that completed it (the same attempt, run again).
    outcomes = [(a["act"], a["outcome"]) for a in stub.describe().attempts]
    lost = [a for a in stub.describe().attempts if a["outcome"] == "lost"]
    assert len(lost) == 1, outcomes
    assert lost[0]["reason"].startswith(f"worker {victim_name} began it ")
    assert (
        "never reported its outcome (it died, hung or was taken for dead, or a Redis outage"
        in lost[0]["reason"]
    )
    assert outcomes.index((lost[0]["act"], "lost")) < outcomes.index((lost[0]["act"], "completed"))


def park_queued_task(store: RedisStore, stub: WorkflowStub, reason: str, **options: Any) -> None:
    """Park the run's queued workflow task with ``reason`` and block the run, as a worker would
    (no worker runs: the task is still in its stream). ``options`` go to ``store.park``."""
    ref = store.ref(stub.id)
    stream = store.keys.workflow_tasks(ref.partition, "default")
    store.ensure_groups([stream])
    for _, rows in store.redis.xreadgroup("workers", "probe", {stream: ">"}, count=100) or []:
        for entry_id, fields in rows:
            if fields[b"run"].decode() == ref.run_id:
                store.park(
                    p=ref.partition,
                    stream=stream,
                    entry_id=entry_id.decode(),
                    kind="workflow",
                    reason=reason,
                    fields=fields,
                    run_id=ref.run_id,
                    block=True,
                    **options,
                )
                return
    raise AssertionError(f"no queued task of {stub.id}")


def replay_next_decision(worker: Any, stub: WorkflowStub) -> None:
    """Make ``worker``'s next decision of ``stub``'s run replay its history, as after a deploy.

    The test sees a commit's effect (the run's status) before the worker thread has put the
    run's driver back in its cache, and a cache cleared before that put would be refilled with
    the old driver: so wait for the driver to be cached, then clear.
    """
    run_id = stub.run_id
    wait_for(lambda: worker.decider.cache.seq_of(run_id) > 0)
    worker.decider.cache.clear()
