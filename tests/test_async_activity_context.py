"""``async def`` activities: the context an activity interceptor sets reaches the coroutine
(contextvars, OpenTelemetry's current span), one attempt counts once in the metrics however
its start-to-close timeout is recorded, and a coroutine whose heartbeat timeout passed is
cancelled locally (in-process worker; the metrics through a real worker process, scraped)."""

from __future__ import annotations

import asyncio
import contextvars
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from apps.async_app import BlocksTheLoop, TimesOut
from procs import spawn_worker, stop
from waiting import wait_for

from durable import (
    Activity,
    ActivityFailed,
    NonRetryableError,
    RetryPolicy,
    Workflow,
    WorkflowStub,
    activity,
    activity_context,
    interceptors,
)
from durable.interceptors import ExecuteActivityInput, Interceptor, Next, StartWorkflowInput
from workers.async_activities import STALL_S

if TYPE_CHECKING:
    from durable.testing import TestEnvironment

tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("ctx_tenant", default=None)


class TenantInterceptor(Interceptor):
    """docs/interceptors.md's example; it also keeps what ``next`` returned to it."""

    def __init__(self) -> None:
        self.returned: list[Any] = []

    def start_workflow(self, input: StartWorkflowInput, next: Next) -> Any:  # noqa: A002
        input.headers["tenant"] = "acme"
        return next(input)

    def execute_activity(self, input: ExecuteActivityInput, next: Next) -> Any:  # noqa: A002
        token = tenant.set(input.headers.get("tenant"))
        try:
            value = next(input)
            self.returned.append(value)
            return value
        finally:
            tenant.reset(token)


def ctx_sync_sees() -> str:
    return f"sync sees {tenant.get()}"


async def ctx_async_sees() -> str:
    await asyncio.sleep(0.01)  # still set after a suspension: the task runs in the context copy
    return f"async sees {tenant.get()}"


class CtxTenant(Workflow):
    def handle(self) -> list[str]:
        return [activity(ctx_sync_sees), activity(ctx_async_sees)]


def test_a_contextvar_an_activity_interceptor_sets_reaches_async_activities(
    durable_env: TestEnvironment,
) -> None:
    interceptor = TenantInterceptor()
    with interceptors.installed(interceptor):
        result = durable_env.start(CtxTenant).result(timeout=30)
    assert result == ["sync sees acme", "async sees acme"]
    # The chain sees the coroutine's result (it ran inside it), not a coroutine object.
    assert interceptor.returned == ["sync sees acme", "async sees acme"]
    assert tenant.get() is None  # the worker's threads set it in their own contexts only


# ----------------------------------------------------------------- OpenTelemetry
class _Tracer:
    provider: Any = None


async def ctx_async_traced() -> str:
    with _Tracer.provider.get_tracer("test").start_as_current_span("inside-async"):
        await asyncio.sleep(0.01)
    return "traced"


async def ctx_async_broken() -> None:
    await asyncio.sleep(0)
    raise NonRetryableError("broken async activity")


class CtxTraced(Workflow):
    def handle(self) -> str:
        try:
            activity(ctx_async_broken)
        except ActivityFailed:
            pass
        return activity(ctx_async_traced)


def test_spans_in_async_activities_are_children_of_their_attempt_span(durable_env: TestEnvironment) -> None:
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    from durable.tracing import TracingInterceptor

    exporter = InMemorySpanExporter()
    _Tracer.provider = provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with interceptors.installed(TracingInterceptor(provider)):
        assert durable_env.start(CtxTraced).result(timeout=30) == "traced"
    spans = {span.name: span for span in exporter.get_finished_spans()}
    attempt, inner = spans["RunActivity:ctx_async_traced"], spans["inside-async"]
    assert inner.parent is not None and inner.parent.span_id == attempt.context.span_id
    assert inner.context.trace_id == attempt.context.trace_id
    # The attempt's span lasts as long as the coroutine, and shows its error.
    assert attempt.end_time >= inner.end_time
    broken = spans["RunActivity:ctx_async_broken"]
    assert broken.status.status_code is StatusCode.ERROR


# ----------------------------------------------------------------- heartbeat timeout
class _Quiet:
    started = threading.Event()
    cancelled = threading.Event()


class CtxGoesQuiet(Activity):
    """Heartbeats once, then awaits without heartbeating past its heartbeat timeout."""

    heartbeat_timeout = 0.5
    retry = RetryPolicy(max_attempts=1)

    async def handle(self) -> str:
        activity_context().heartbeat("once")
        _Quiet.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            _Quiet.cancelled.set()
            raise
        return "late"


class CtxQuiet(Workflow):
    def handle(self) -> str:
        try:
            return activity(CtxGoesQuiet)
        except ActivityFailed as exc:
            return f"{type(exc.cause).__name__} {getattr(exc.cause, 'kind', '')}"


def test_an_async_attempt_past_its_heartbeat_timeout_is_cancelled_locally(
    durable_env: TestEnvironment,
) -> None:
    _Quiet.started.clear()
    _Quiet.cancelled.clear()
    stub = durable_env.start(CtxQuiet)
    assert stub.result(timeout=30) == "ActivityTimeout heartbeat"
    assert _Quiet.started.is_set()
    assert _Quiet.cancelled.wait(10), "the coroutine kept running after its attempt timed out"
    # The scheduler recorded the timeout; the cancelled coroutine's attempt adds no record.
    attempts = wait_for(lambda: stub.describe()["attempts"])
    assert [a["outcome"] for a in attempts] == ["failed"]


# ----------------------------------------------------------------- metrics
@pytest.mark.slow
def test_an_async_start_to_close_timeout_counts_once_per_attempt(redis_url: str) -> None:
    """SlowAsync: start_to_close 0.5 s, 2 attempts. The worker's asyncio.timeout and the
    scheduler's expiry pass at the same deadline; only the outcome the store accepted counts."""
    pytest.importorskip("prometheus_client")
    from test_observability import _free_port, _scrape

    port = _free_port()
    proc = spawn_worker(redis_url, app="apps.async_app", extra=("--metrics-port", str(port)))
    try:
        stub = WorkflowStub.make(TimesOut).start("/dev/null")
        assert stub.result(timeout=60) == {
            "cause": "ActivityTimeout",
            "kind": "start_to_close",
            "attempts": 2,
        }

        def counts() -> dict[str, float]:
            out: dict[str, float] = {}
            for (name, labels), value in _scrape(port).items():
                if dict(labels).get("activity_type") != "SlowAsync":
                    continue
                if name == "durable_activity_attempts_total":
                    out[dict(labels)["outcome"]] = value
                elif name in ("durable_activity_retries_total", "durable_activity_timeouts_total"):
                    out[name] = out.get(name, 0.0) + value
            return out

        def outcomes(c: dict[str, float]) -> float:
            return sum(v for k, v in c.items() if not k.startswith("durable_"))

        wait_for(lambda: outcomes(counts()) >= 2, timeout=20)
        # Whichever of the two recorded a timeout, the other's (late, discarded) record never counts.
        time.sleep(1.5)  # the flush interval and a scheduler pass: a double count would show now
        # Two attempts, each timed out once, one retried (before the fix: 4 outcomes, 2 retries).
        assert counts() == {
            "timed_out": 2,
            "durable_activity_retries_total": 1,
            "durable_activity_timeouts_total": 2,
        }
        accepted = [a for a in stub.describe()["attempts"] if a["outcome"] != "discarded"]
        assert sorted((a["attempt"], a["outcome"]) for a in accepted) == [(1, "retry"), (2, "failed")]
    finally:
        stop(proc)


@pytest.mark.fault
def test_an_async_activity_blocking_the_loop_is_logged_with_its_line(redis_url: str) -> None:
    """Every async activity of the worker waits while one blocks the loop: the worker says so."""
    proc = spawn_worker(redis_url, app="apps.async_app")
    try:
        assert WorkflowStub.make(BlocksTheLoop).start(3.5).result(timeout=60) == "done"
        # The watchdog looks every STALL_S / 4: a stop right after the result (stops no longer
        # wait out a blocking read) came before its look that says the loop runs again.
        time.sleep(STALL_S / 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            err = proc.communicate(timeout=30)[1].decode()
        except subprocess.TimeoutExpired:
            proc.kill()
            err = proc.communicate()[1].decode()
    assert "the event loop of async activities has not run for" in err, err
    assert "apps/async_app.py" in err and "in blocks_the_loop" in err, err
    assert "the event loop of async activities runs again" in err, err
