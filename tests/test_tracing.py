"""Tracing (durable.tracing) and interceptors (durable.interceptors) end to end, in-process worker."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
from waiting import wait_for

from durable import Activity, RetryPolicy, Workflow, activity, await_signal, child, interceptors
from durable import events as ev
from durable.interceptors import ExecuteActivityInput, Interceptor, Next, StartWorkflowInput
from durable.store.tasks import ActivityTask

otel = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from durable.tracing import TracingInterceptor  # noqa: E402

if TYPE_CHECKING:
    from durable.testing import TestEnvironment

pytest_plugins = ["durable.testing"]


class TrFlaky(Activity):
    retry = RetryPolicy(initial_interval=0.05, max_attempts=3)
    calls = 0

    def handle(self, x: int) -> int:
        TrFlaky.calls += 1
        if TrFlaky.calls == 1:
            raise RuntimeError("the first attempt fails")
        return x + 1


def tr_double(x: int) -> int:
    return x * 2


class TrLeaf(Workflow):
    def handle(self, x: int) -> int:
        return activity(tr_double, x)


class TrParent(Workflow):
    def handle(self, x: int) -> list[Any]:
        a = activity(TrFlaky, x)
        b = child(TrLeaf, a)
        return [a, b, await_signal("go")]


def test_one_connected_trace_and_no_spans_for_replayed_events(durable_env: TestEnvironment) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    durable_env.worker.decider.cache.size = 0  # every decision replays the run: a cache miss
    TrFlaky.calls = 0
    with interceptors.installed(TracingInterceptor(provider)):
        with provider.get_tracer("test").start_as_current_span("request") as request:
            stub = durable_env.start(TrParent, 1)
            stub.signal("go", "s")
        assert stub.result(timeout=30) == [2, 4, "s"]
    spans = exporter.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert len({s.context.trace_id for s in spans}) == 1, "one connected trace"
    (start,) = by_name["StartWorkflow:TrParent"]
    assert (
        start.parent.span_id == request.get_span_context().span_id
        and start.attributes["durable.run_id"] == stub.run_id
    )
    # No duplicates although every decision replayed the whole history.
    for name in (
        "RunWorkflow:TrParent",
        "RunWorkflow:TrLeaf",
        "StartChildWorkflow:TrLeaf",
        "HandleSignal:go",
    ):
        assert len(by_name[name]) == 1, (name, len(by_name[name]))
    attempts = sorted(by_name["RunActivity:TrFlaky"], key=lambda s: s.attributes["durable.attempt"])
    assert [s.attributes["durable.attempt"] for s in attempts] == [1, 2]
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert attempts[1].status.status_code is not StatusCode.ERROR
    sid = start.context.span_id
    for span in [*attempts, *by_name["Decision:TrParent"], *by_name["RunWorkflow:TrParent"]]:
        assert span.parent.span_id == sid, span.name
        assert span.attributes["durable.run_id"] == stub.run_id
    (handled,) = by_name["HandleSignal:go"]
    (sent,) = by_name["SignalWorkflow:go"]
    assert handled.parent.span_id == sid and handled.links[0].context.span_id == sent.context.span_id
    (started_child,) = by_name["StartChildWorkflow:TrLeaf"]
    assert started_child.parent.span_id == sid
    leaf = [*by_name["Decision:TrLeaf"], *by_name["RunActivity:tr_double"], *by_name["RunWorkflow:TrLeaf"]]
    assert leaf and all(s.parent.span_id == started_child.context.span_id for s in leaf)
    decisions = by_name["Decision:TrParent"]
    assert len(decisions) >= 3 and all(s.attributes["durable.workflow_type"] == "TrParent" for s in decisions)


class TrLateOnce(Activity):
    """Its first attempt returns after its start-to-close timeout; the retry at once."""

    retry = RetryPolicy(initial_interval=0.05, max_attempts=3)
    start_to_close_timeout = 0.3

    def handle(self) -> str:
        if self.context.attempt == 1:
            time.sleep(0.8)
        return "in time"


class TrRetriedLate(Workflow):
    def handle(self) -> str:
        return activity(TrLateOnce)


def test_an_attempt_that_returned_past_its_timeout_says_so_in_its_span(durable_env: TestEnvironment) -> None:
    """The scheduler timed it out and its result was discarded, but its span said nothing: a
    trace showed a plain attempt, then a retry nothing explained (observability pass). Marked,
    not an error: a result a moment late may still be taken (the re-check)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with interceptors.installed(TracingInterceptor(provider)):
        assert durable_env.start(TrRetriedLate).result(timeout=30) == "in time"
        first = wait_for(
            lambda: [s for s in exporter.get_finished_spans() if s.attributes.get("durable.attempt") == 1]
        )
    (late,) = first
    assert late.attributes["durable.past_start_to_close"] is True
    (event,) = [e for e in late.events if e.name == "past start_to_close"]
    assert event.attributes["durable.start_to_close_s"] == 0.3 and event.attributes["durable.took_s"] > 0.3


# ----------------------------------------------------------------- tenant header
class Tenant(Interceptor):
    """The docs' example: the client sets a tenant header; activities see it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, Any]] = []

    def start_workflow(self, input: StartWorkflowInput, next: Next) -> Any:  # noqa: A002
        input.headers["tenant"] = "acme"
        return next(input)

    def execute_activity(self, input: ExecuteActivityInput, next: Next) -> Any:  # noqa: A002
        self.seen.append((input.name, input.attempt, input.headers.get("tenant")))
        return next(input)


def test_a_client_header_reaches_every_activity_attempt_and_child(durable_env: TestEnvironment) -> None:
    tenant = Tenant()
    TrFlaky.calls = 0
    with interceptors.installed(tenant):
        stub = durable_env.start(TrParent, 1)
        stub.signal("go", "s")
        assert stub.result(timeout=30) == [2, 4, "s"]
    assert sorted(tenant.seen) == [("TrFlaky", 1, "acme"), ("TrFlaky", 2, "acme"), ("tr_double", 1, "acme")]
    started = stub.history()[0]
    assert started.data["headers"] == {"tenant": "acme"}


def test_old_histories_and_task_bodies_without_headers_still_decode() -> None:
    started = ev.WorkflowStarted(workflow_type="T", workflow_id="w", run_id="r", args=b"\x90")
    data = started.to_data()
    del data["headers"]  # as an earlier version wrote it
    from durable import codec

    raw = codec.pack({"type": "WorkflowStarted", "ts": 1, "data": data})
    assert ev.decode(raw).event.headers == {}
    for cls, fields in (
        (ev.SignalReceived, {"name": "go", "payload": b"\x90"}),
        (ev.ActivityScheduled, {"id": "1", "name": "a", "args": b"\x90"}),
        (ev.ChildStarted, {"id": "2", "workflow_type": "C", "workflow_id": "c", "args": b"\x90"}),
    ):
        raw = codec.pack({"type": cls.TYPE, "ts": 1, "data": fields})
        assert ev.decode(raw).event.headers == {}
    task = ActivityTask("r", "w", 0, "1", "a", b"\x90", 1, "s")
    assert b"hdr" not in task.encode()  # no headers: the body is byte for byte as before
    with_headers = ActivityTask("r", "w", 0, "1", "a", b"\x90", 1, "s", headers={"tenant": "x"})
    decoded = ActivityTask.decode(with_headers.encode())
    assert decoded.headers == {"tenant": "x"} and decoded.next_attempt().headers == {"tenant": "x"}
    assert ActivityTask.decode(task.encode()).headers is None


def test_register_refuses_what_is_not_an_interceptor() -> None:
    with pytest.raises(
        TypeError, match="object is not an interceptor: subclass durable.interceptors.Interceptor"
    ):
        interceptors.register(object())
    assert interceptors.registered() == ()


def test_the_per_run_parent_cache_keeps_one_trace_across_restarts_and_evictions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interceptor builds a run's parent context once; a fresh interceptor (a restarted
    worker), a rebuilt RunInfo (a replayed run) and a cleared cache all give the same parent."""
    from durable import tracing
    from durable.interceptors import DecisionInput, RunInfo

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    headers: dict[str, Any] = {}
    with provider.get_tracer("test").start_as_current_span("start") as start:
        tracing.inject(headers)
    monkeypatch.setattr(tracing, "RUN_CACHE_SIZE", 2)

    class Open:
        status = "running"

    first = TracingInterceptor(provider)
    for interceptor, run_id in ((first, "r1"), (first, "r1"), (first, "r2"), (first, "r3"), (first, "r1")):
        # a new RunInfo and headers dict each time, as a replayed driver makes them (bytes too)
        recorded = {k: v.encode() if run_id == "r2" else v for k, v in headers.items()}
        run = RunInfo("w", run_id, "T", recorded)
        interceptor.decide(DecisionInput(run, [1]), lambda _i: Open())
    restarted = TracingInterceptor(provider)
    restarted.decide(DecisionInput(RunInfo("w", "r1", "T", dict(headers)), []), lambda _i: Open())
    orphan = RunInfo("w", "r9", "T", {})  # no recorded context: a root span of its own trace
    restarted.decide(DecisionInput(orphan, []), lambda _i: Open())
    *traced, root = [s for s in exporter.get_finished_spans() if s.name == "Decision:T"]
    sid, tid = start.get_span_context().span_id, start.get_span_context().trace_id
    assert len(traced) == 6 and all(s.parent.span_id == sid and s.context.trace_id == tid for s in traced)
    assert [s.attributes["durable.run_id"] for s in traced] == ["r1", "r1", "r2", "r3", "r1", "r1"]
    assert traced[0].attributes["durable.inputs"] == 1 and traced[-1].attributes["durable.inputs"] == 0
    assert root.parent is None and root.context.trace_id != tid
    assert len(first._runs) <= 2


def test_hooks_nobody_overrides_are_skipped_and_the_rest_still_run() -> None:
    from durable.interceptors import WorkflowOutboundInterceptor

    class Tenant(Interceptor):
        def start_child(self, input: Any, next: Next) -> Any:  # noqa: A002
            return ("tenant", next(input))

    tracer = TracingInterceptor(TracerProvider())
    with interceptors.installed(tracer):
        # Tracing overrides no outbound call but start_child: the others build no input at all.
        assert interceptors.active(WorkflowOutboundInterceptor)
        assert not interceptors.active(WorkflowOutboundInterceptor, "start_activity")
        assert not interceptors.active(WorkflowOutboundInterceptor, "start_timer")
        assert interceptors.active(WorkflowOutboundInterceptor, "start_child")
        with interceptors.installed(Tenant()):
            assert not interceptors.active(WorkflowOutboundInterceptor, "start_activity")
            result = interceptors.run(WorkflowOutboundInterceptor, "start_timer", 1, lambda i: i + 1)
            assert result == 2
    assert not interceptors.active(WorkflowOutboundInterceptor, "start_child")
    with interceptors.installed(Tenant()):
        assert interceptors.run(WorkflowOutboundInterceptor, "start_child", 1, lambda i: i + 1) == (
            "tenant",
            2,
        )
