"""Updates carry interceptor headers like signals do: a client interceptor's header is recorded
with the update, the worker's validator and handler interceptors see it (on replay too), and an
activity the handler schedules gets it; with tracing, an update has its client span."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from apps.tenant import ClientTenant, TenantCart, TenantSeen, WorkerTenant
from procs import spawn_worker, stop

from durable import (
    AsyncWorkflowStub,
    UpdateRejected,
    Workflow,
    WorkflowStub,
    activity,
    await_signal,
    interceptors,
)
from durable import update as update_handler

if TYPE_CHECKING:
    from durable.testing import TestEnvironment

pytest_plugins = ["durable.testing"]


@pytest.mark.slow
def test_a_client_update_header_reaches_the_worker_interceptors_and_the_handlers_activity(
    redis_url: str,
) -> None:
    # --cache-size 0: every decision replays the run, so the handler's interceptor sees the
    # headers recorded with the update, not ones kept in memory.
    extra = ("--app", "apps.tenant_worker", "--cache-size", "0")
    proc = spawn_worker(redis_url, app="apps.tenant", extra=extra)
    try:
        stub = WorkflowStub.make(TenantCart).start()  # started without a tenant header
        with interceptors.installed(ClientTenant("acme")):
            assert stub.update("tag", "a", timeout=30) == {
                "value": "a",
                "activity_tenant": "acme",
                "handler_tenant": "acme",
            }
        with interceptors.installed(ClientTenant("globex")):
            async_stub = AsyncWorkflowStub(WorkflowStub.load(stub.id))
            outcome = asyncio.run(async_stub.update("tag", "b", timeout=30))
        assert outcome == {"value": "b", "activity_tenant": "globex", "handler_tenant": "globex"}
        with pytest.raises(UpdateRejected, match="has no tenant header"):  # no client interceptor
            stub.update("tag", "c", timeout=30)
        stub.signal("done", "ok")
        assert stub.result(timeout=30) == "ok"
    finally:
        stop(proc)
    history = stub.history()
    accepted = [e.data["headers"] for e in history if e.type == "UpdateAccepted"]
    assert accepted == [{"tenant": "acme"}, {"tenant": "globex"}]
    scheduled = [e.data["headers"] for e in history if e.type == "ActivityScheduled"]
    assert scheduled == [{"tenant": "acme"}, {"tenant": "globex"}]
    assert history[0].data["headers"] == {}


class UhFlow(Workflow):
    """An update whose handler runs an activity in an all() branch (headers go down branches)."""

    def handle(self) -> str:
        return await_signal("done")

    @update_handler
    def tag(self) -> dict:
        return {"activity_tenant": activity(TenantSeen)}


def test_update_headers_reach_all_branches_and_the_update_gets_a_linked_span(
    durable_env: TestEnvironment,
) -> None:
    otel = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from durable.tracing import TracingInterceptor

    exporter = InMemorySpanExporter()
    provider = otel.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with interceptors.installed(TracingInterceptor(provider), ClientTenant("acme"), WorkerTenant()):
        stub = durable_env.start(UhFlow)
        assert stub.update("tag", timeout=30) == {"activity_tenant": "acme", "handler_tenant": "acme"}
        stub.signal("done", "ok")
        assert stub.result(timeout=30) == "ok"
    spans: dict[str, Any] = {s.name: s for s in exporter.get_finished_spans()}
    sent, handled, ran = (
        spans["UpdateWorkflow:tag"],
        spans["HandleUpdate:tag"],
        spans["RunActivity:TenantSeen"],
    )
    start = spans["StartWorkflow:UhFlow"]
    assert handled.links[0].context.span_id == sent.context.span_id
    # The handler's activity stays in the run's trace (under its start span), not the sender's.
    assert handled.parent.span_id == start.context.span_id
    assert ran.parent.span_id == start.context.span_id
    accepted = [e for e in stub.history() if e.type == "UpdateAccepted"]
    assert accepted[0].data["headers"]["tenant"] == "acme"
    assert "traceparent" in accepted[0].data["headers"]
