"""Observability with real worker processes: Prometheus metrics after runs complete, fail and
retry (one process and --processes 2), run ids on JSON log lines, and a workflow logger that
logs once per live decision and never on replay (no cache, and across a worker restart)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.request

import pytest
from apps.observe import ObservedChatty, ObservedSteps
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowFailed, WorkflowStub

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _finish(proc: subprocess.Popen) -> str:
    """Stop a worker and return its stderr."""
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    stop(proc)
    return err


def _run_steps() -> None:
    for mode in ("ok", "ok", "retry"):
        assert WorkflowStub.make(ObservedSteps).start(mode).result(timeout=30) == "two"
    with pytest.raises(WorkflowFailed):
        WorkflowStub.make(ObservedSteps).start("fail").result(timeout=30)


def _check_counts(samples: dict) -> None:
    wt = {"workflow_type": "ObservedSteps"}
    assert _value(samples, "durable_workflows_started_total", **wt) == 4
    assert _value(samples, "durable_workflows_closed_total", outcome="completed", **wt) == 3
    assert _value(samples, "durable_workflows_closed_total", outcome="failed", **wt) == 1
    assert _value(samples, "durable_decisions_total", outcome="committed", **wt) >= 4 * 3
    assert _value(samples, "durable_decision_seconds_count", **wt) >= 12
    echo = {"activity_type": "ObservedEcho", "queue": "default"}
    assert _value(samples, "durable_activity_attempts_total", outcome="completed", **echo) == 7
    once = {"activity_type": "ObservedFailsOnce", "queue": "default"}
    assert _value(samples, "durable_activity_attempts_total", outcome="retry", **once) == 1
    assert _value(samples, "durable_activity_attempts_total", outcome="completed", **once) == 1
    assert _value(samples, "durable_activity_retries_total", activity_type="ObservedFailsOnce") == 1
    broken = {"activity_type": "ObservedBroken", "queue": "default"}
    assert _value(samples, "durable_activity_attempts_total", outcome="failed", **broken) == 1
    assert _value(samples, "durable_activity_schedule_to_start_seconds_count", **echo) == 7
    # An hour-long activity's p95 reads an hour, not the last bucket below it (it was 10 s).
    assert (
        "durable_activity_execution_seconds_bucket",
        tuple(sorted({**echo, "outcome": "completed", "le": "3600.0"}.items())),
    ) in samples
    assert _value(samples, "durable_timers_fired_total") >= 1  # the retry's backoff
    hits = _value(samples, "durable_sticky_cache_requests_total", result="hit")
    misses = _value(samples, "durable_sticky_cache_requests_total", result="miss")
    # A new run's first decision is no lookup (it cannot be cached): the 3 decisions after each.
    assert hits + misses >= 4 * 2
    assert _value(samples, "durable_replays_total", **wt) == misses
    assert _value(samples, "durable_redis_round_trips_total") > 0
    assert _value(samples, "durable_task_queue_backlog", queue="default", kind="activity") == 0
    assert ("durable_dead_letters", ()) in samples
    # Series an alert watches with increase() exist at 0 before their first event.
    assert _value(samples, "durable_runs_blocked_total", reason="nondeterminism") == 0
    assert ("durable_runs_blocked_total", (("reason", "needs_upgrade"),)) in samples
    assert ("durable_redis_errors_total", (("kind", "connection"),)) in samples
    assert ("durable_tasks_parked_total", (("kind", "workflow"),)) in samples
    assert not any("run_id" in dict(labels) or "workflow_id" in dict(labels) for _, labels in samples)


def _counts_match(samples: dict) -> bool:
    try:
        _check_counts(samples)
    except AssertionError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_metrics_count_completed_failed_and_retried_runs(redis_url: str, processes: int) -> None:
    port = _free_port()
    extra = ("--metrics-port", str(port), "--processes", str(processes))
    proc = spawn_worker(redis_url, app="apps.observe", extra=extra)
    try:
        _run_steps()
        # One scrape shows every process's counts (multiprocess mode under the supervisor); a
        # count is recorded just after its commit, so the client may see a result a moment before.
        wait_for(lambda: _counts_match(_scrape(port)), timeout=20)
        _check_counts(_scrape(port))
    finally:
        _finish(proc)


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_workflow_logger_logs_once_per_live_decision_and_log_lines_carry_ids(redis_url: str) -> None:
    extra = ("--log-format", "json", "--cache-size", "0")  # every decision replays the history
    first = spawn_worker(redis_url, app="apps.observe", extra=extra)
    try:
        stub = WorkflowStub.make(ObservedChatty).start()
        wait_for(lambda: stub.status() == "suspended", timeout=20)
    finally:
        logs = _finish(first)
    # A new worker process replays the run from its history (nothing cached anywhere).
    second = spawn_worker(redis_url, app="apps.observe", extra=extra)
    try:
        stub.signal("go", "now")
        assert stub.result(timeout=30) == "now"
    finally:
        logs += _finish(second)
    lines = _json_lines(logs)
    said = [line["message"] for line in lines if line["logger"] == "durable.workflow.code"]
    assert said == ["chatty begins", "chatty after activity", "chatty got now", "chatty ends"]
    for line in lines:
        if line["logger"] == "durable.workflow.code":
            assert line["workflow_id"] == stub.id
            assert line["run_id"] == stub.run_id
            assert line["workflow_type"] == "ObservedChatty"
    echoes = [line for line in lines if line["logger"] == "apps.observe"]
    assert [e["message"] for e in echoes] == ["echo a", "echo b"]
    for echo in echoes:
        assert echo["run_id"] == stub.run_id and echo["workflow_id"] == stub.id
        assert echo["activity_type"] == "ObservedEcho" and echo["attempt"] == 1 and echo["activity_id"]


def test_server_metrics_show_task_queue_backlog(store) -> None:  # noqa: ANN001 - the store fixture
    from workers.server.app import create_app  # noqa: PLC0415 - the server extra, as in test_server

    WorkflowStub.make(ObservedSteps).start("ok")  # no worker: its first workflow task waits in the queue
    (route,) = [r for r in create_app(store).routes if getattr(r, "path", "") == "/metrics"]
    reply = route.endpoint(None)  # type: ignore[attr-defined]
    assert reply.media_type.startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert _value(samples, "durable_task_queue_backlog", queue="default", kind="workflow") == 1
    assert _value(samples, "durable_task_queue_oldest_age_seconds", queue="default", kind="workflow") >= 0
    assert _value(samples, "durable_dead_letters") == 0


def test_a_metrics_port_in_use_is_refused_with_its_number(redis_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn_worker(redis_url, app="apps.observe", extra=("--metrics-port", str(port)))
        try:
            assert proc.wait(60) == 1
            assert proc.stderr is not None
            err = proc.stderr.read().decode()
        finally:
            stop(proc)
    assert f"error: --metrics-port {port}: [Errno 98] Address already in use" in err
