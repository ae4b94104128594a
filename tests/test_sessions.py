"""Worker sessions: activities pinned to one worker; a dead host fails the next one clearly."""

from __future__ import annotations

import signal
import time

import pytest
from apps.sessions import NapsInSession, Pinned
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.keys import private_queue
from durable.store.workers import HEARTBEAT_S, WorkerInfo, no_worker_on_queue_reason
from workers.worker import Worker, WorkerThread


def test_session_activities_run_on_one_worker(store) -> None:
    first, second = (Worker(store, concurrency=2, grace=5, block_ms=100) for _ in range(2))
    with WorkerThread(first), WorkerThread(second):
        stub = WorkflowStub.make(Pinned).start(6)
        wait_for(lambda: stub.query("progress") == "waiting")
        stub.signal("continue")
        result = stub.result(timeout=15)
    assert result["lost"] is False
    assert len(result["ran_on"]) == 7 and len(set(result["ran_on"])) == 1
    assert result["ran_on"][0] in (first.consumer, second.consumer)


def test_a_session_activity_running_on_its_live_host_is_not_called_blocked(store) -> None:
    """It read "blocked: no live worker serves queue '@vm-...'", and named a command that
    refuses a queue starting with '@'."""
    host = Worker(store, concurrency=2, grace=5, block_ms=100)
    with WorkerThread(host):
        stub = WorkflowStub.make(NapsInSession).start(2 * HEARTBEAT_S + 1)
        wait_for(lambda: any(p.get("worker") for p in stub.describe().pending), timeout=10)
        for _ in range(3):
            assert stub.blocked() is None, stub.blocked()
            time.sleep(HEARTBEAT_S)
        assert stub.result(timeout=15) == host.consumer
    # The reason when its host is gone names the session, not a queue to start a worker on.
    gone = {"status": "running", "queue": "default", "snapshot": {"pending": [
        {"kind": "activity", "id": "2", "name": "nap", "queue": private_queue("vm:1:1.1")}]}}  # fmt: skip
    said = no_worker_on_queue_reason(
        gone, store.live_workers() or [WorkerInfo(name="w", queues=("default",))]
    )
    assert said is not None and "runs in a worker session whose worker (vm-1-1.1) is gone" in said, said


@pytest.mark.slow
@pytest.mark.fault
def test_next_session_activity_fails_when_the_host_dies(redis_url: str) -> None:
    host = spawn_worker(redis_url, app="apps.sessions", extra=("--claim-idle", "1"))
    try:
        stub = WorkflowStub.make(Pinned).start(2)
        wait_for(lambda: stub.query("progress") == "waiting")
        host.send_signal(signal.SIGKILL)
        host.wait(5)
    finally:
        stop(host)
    other = spawn_worker(redis_url, app="apps.sessions", extra=("--claim-idle", "1"))
    try:
        stub.signal("continue")
        result = stub.result(timeout=30)
    finally:
        stop(other)
    assert result["lost"] is True and "stopped" in result["error"]
    assert len(result["ran_on"]) == 2
