"""Worker sessions: activities pinned to one worker; a dead host fails the next one clearly."""

from __future__ import annotations

import signal

import pytest
from apps.sessions import Pinned
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
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
