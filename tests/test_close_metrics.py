"""Every run close is counted once in ``durable_workflows_closed_total``: those a decision makes
(completed, a workflow timeout: ``timed_out``) by the deciding worker, those made outside a
decision (terminate from a client, ``id_conflict_policy='terminate_existing'``) from the closes
stream, by a worker with --metrics-port; a real worker process, scraped."""

from __future__ import annotations

import time

import pytest
from apps.observe import ObservedChatty, ObservedSteps
from procs import spawn_worker, stop
from test_observability import _free_port, _scrape, _value
from waiting import wait_for

from durable import WorkflowFailed, WorkflowStub

pytest.importorskip("prometheus_client")


def _closes(port: int) -> dict[tuple[str, str], float]:
    samples = _scrape(port)
    return {
        (dict(labels)["workflow_type"], dict(labels)["outcome"]): value
        for (name, labels), value in samples.items()
        if name == "durable_workflows_closed_total"
    }


@pytest.mark.slow
def test_closes_outside_decisions_are_counted_once_and_decision_closes_still_once(redis_url: str) -> None:
    port = _free_port()
    proc = spawn_worker(redis_url, app="apps.observe", extra=("--metrics-port", str(port)))
    try:
        # A decision close; once it is done the worker (and its closes reader) is running.
        assert WorkflowStub.make(ObservedSteps).start("ok").result(timeout=30) == "two"
        terminated = WorkflowStub.make(ObservedChatty).start()
        wait_for(lambda: terminated.status() == "suspended", timeout=20)
        terminated.terminate("by the test")  # from the client: no decision
        WorkflowStub.make(ObservedChatty, id="replaced").start()
        replacing = WorkflowStub.make(ObservedChatty, id="replaced", id_conflict_policy="terminate_existing")
        replacing.start()  # terminates the open run of the id in the start script
        replacing.terminate()
        timed_out = WorkflowStub.make(ObservedChatty, execution_timeout=0.5).start()
        with pytest.raises(WorkflowFailed, match="timed out"):
            timed_out.result(timeout=30)
        expected = {
            ("ObservedSteps", "completed"): 1,
            ("ObservedChatty", "terminated"): 3,
            ("ObservedChatty", "timed_out"): 1,
        }
        wait_for(lambda: _closes(port) == expected, timeout=20)
        time.sleep(1.5)  # another pass of the closes reader: nothing is counted twice
        assert _closes(port) == expected
        assert _value(_scrape(port), "durable_workflows_started_total", workflow_type="ObservedChatty") >= 2
    finally:
        stop(proc)
