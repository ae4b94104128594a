"""Tracing on for a benchmark (``harness.py --tracing``): OpenTelemetry's SDK at its default
sampling (every trace), spans through a batch processor to an exporter that drops them, so the
cost measured is durable's interceptor plus the SDK's, not a collector's.

Run as a script, it measures the cost per span without Redis or workers, less sensitive to
a loaded machine than the harness: one W2 workflow's worth of interceptor calls (a RunWorkflow
span, 11 decisions, 10 activity attempts: 22 spans) through ``durable.interceptors`` as the
worker makes them, in turns with tracing off and on, reporting the minimum per turn::

    python benchmarks/bench_tracing.py [--turns 30]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: this tree's durable

import durable.tracing  # noqa: E402
from durable import interceptors  # noqa: E402
from durable.interceptors import (  # noqa: E402
    DecisionInput,
    HandleInput,
    RunInfo,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowOutboundInterceptor,
)

ENV = "DURABLE_BENCH_TRACING"
SPANS = 22  # per workflow below: RunWorkflow, 11 decisions, 10 activity attempts


def provider() -> Any:
    """An SDK provider at default sampling whose batch processor drops the spans."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    made = TracerProvider()
    made.add_span_processor(BatchSpanProcessor(Discard()))
    return made


def enable() -> None:
    """Register durable's tracing with an SDK provider whose spans go nowhere."""
    durable.tracing.enable(provider())


def disable() -> None:
    durable.tracing.disable()


class _Open:
    """A decision that leaves the run open."""

    status = "running"


def workflow(k: int, headers: dict[str, Any]) -> None:
    """The interceptor calls of one 10-step workflow, as the decider and activity threads make them."""
    run_id = f"run-{k % 500}"
    for decision in range(11):
        run = RunInfo(f"wf-{k}", run_id, "TenSteps", headers)  # rebuilt per decision, as the driver does

        def body(_input: Any, run: RunInfo = run, first: bool = decision == 0) -> Any:
            if first:
                start = HandleInput(run, (10,), False)
                interceptors.run(WorkflowInboundInterceptor, "handle", start, lambda _i: None)
            if interceptors.active(WorkflowOutboundInterceptor, "start_activity"):  # as commands.py
                call = StartActivityInput(run, None, "noop", (1,), None, dict(headers), False)
                interceptors.run(WorkflowOutboundInterceptor, "start_activity", call, lambda _i: None)
            return _Open

        interceptors.run(WorkflowInboundInterceptor, "decide", DecisionInput(run, [None]), body)
    for attempt in range(10):
        task = SimpleNamespace(
            name="noop",
            activity_id=str(attempt),
            attempt=1,
            workflow_id=f"wf-{k}",
            run_id=run_id,
            headers=headers,
        )
        interceptors.execute(task, lambda x: x, (1,))


def sdk_floor(headers: dict[str, Any], spans: int = 20_000) -> float:
    """What a span costs with no durable code around it: the part durable cannot remove."""
    tracer = provider().get_tracer("bench")
    parent = durable.tracing.extract(headers)
    attributes = {"durable.workflow_id": "wf", "durable.run_id": "run", "durable.workflow_type": "TenSteps"}
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(spans):
            tracer.start_span("Decision:TenSteps", context=parent, attributes=attributes).end()
        best = min(best, (time.perf_counter() - t0) / spans * 1e6)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--workflows", type=int, default=100, help="per turn")
    args = parser.parse_args(argv)
    tracer = durable.tracing.TracingInterceptor(provider())
    headers: dict[str, Any] = {}
    with provider().get_tracer("bench").start_as_current_span("StartWorkflow"):
        durable.tracing.inject(headers)
    per_span: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.turns):
        for on in (False, True):
            with interceptors.installed(*([tracer] if on else [])):
                t0 = time.perf_counter()
                for k in range(args.workflows):
                    workflow(k, headers)
                per_span[on].append((time.perf_counter() - t0) / args.workflows / SPANS * 1e6)
    cost = min(per_span[True]) - min(per_span[False])
    print(f"tracing: {cost:.1f} us per span over no tracing (min of {args.turns} turns, interleaved)")
    print(f"the SDK alone: {sdk_floor(headers):.1f} us per span (start_span + end, 3 attributes, no durable)")
    with interceptors.installed(tracer):
        profile = cProfile.Profile()
        profile.enable()
        workflow(0, headers)
        profile.disable()
        calls = sum(s[1] for s in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]
        gc.collect()
        gc.disable()
        try:
            for k in range(args.workflows):
                workflow(k, headers)
            garbage = gc.collect()
        finally:
            gc.enable()
    print(
        f"Python calls per span: {calls / SPANS:.0f}; cyclic garbage per workflow: {garbage / args.workflows:.0f}"
    )


if __name__ == "__main__":
    main()
