"""OpenTelemetry tracing for durable, built as an interceptor (``pip install durable[otel]``).

::

    import durable.tracing
    durable.tracing.enable()  # in the client's process and in the worker's --app module

uses the global tracer provider (configure the SDK and an exporter first, see
docs/tracing.md). The trace of a run:

* ``StartWorkflow:<type>`` (client, a child of whatever span is current) -- its context
  is recorded in the run's ``WorkflowStarted`` headers (``traceparent``, ``tracestate``),
  so every later span of the run, in any worker process, after restarts and across
  continue-as-new, is its descendant;
* under it: ``RunWorkflow:<type>`` (the first decision starts the code), one
  ``Decision:<type>`` per decision, ``RunActivity:<name>`` per activity attempt,
  ``StartChildWorkflow:<type>`` (the child run's spans are under it),
  ``HandleSignal:<name>`` (linked to the sender's ``SignalWorkflow:<name>`` span) and
  ``HandleUpdate:<name>`` (linked to ``UpdateWorkflow:<name>``);
* attributes ``durable.workflow_id``, ``durable.run_id``, ``durable.workflow_type``
  and, for activities, ``durable.activity``, ``durable.activity_id``, ``durable.attempt``.
  A failed attempt, a decision that fails the run or raises, and a client call that raises
  set the span's status to ERROR.

No span is made while recorded history is replayed (a run rebuilt after a cache miss or
a restart): those spans were made when the events were first decided.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError("durable.tracing needs OpenTelemetry: pip install 'durable[otel]'") from exc

from . import interceptors
from .interceptors import (
    DecisionInput,
    ExecuteActivityInput,
    HandleInput,
    HandleSignalInput,
    HandleUpdateInput,
    Interceptor,
    Next,
    QueryWorkflowInput,
    RunInfo,
    SignalWorkflowInput,
    StartChildInput,
    StartWorkflowInput,
    UpdateWorkflowInput,
)

#: The headers the trace context travels in (W3C Trace Context).
TRACE_HEADERS = ("traceparent", "tracestate")

_propagator = TraceContextTextMapPropagator()


def _carrier(headers: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for name in TRACE_HEADERS:
        value = headers.get(name)
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if isinstance(value, str):
            out[name] = value
    return out


def extract(headers: Mapping[str, Any]) -> Context:
    """The trace context recorded in ``headers`` (an empty context when there is none)."""
    carrier = _carrier(headers)
    return _extract_cached(carrier.get("traceparent", ""), carrier.get("tracestate", ""))


@functools.lru_cache(maxsize=4096)
def _extract_cached(traceparent: str, tracestate: str) -> Context:
    # A run's spans all have the same parent: parse its traceparent once, not per span
    # (a Context is immutable, so sharing one is safe).
    carrier = (
        {"traceparent": traceparent, "tracestate": tracestate} if tracestate else {"traceparent": traceparent}
    )
    return _propagator.extract(carrier if traceparent else {})


def inject(headers: dict[str, Any], context: Context | None = None) -> None:
    """Write ``context`` (default: the current one) into ``headers``."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=context)
    for name in TRACE_HEADERS:
        headers.pop(name, None)
    headers.update(carrier)


def _run_attributes(run: RunInfo) -> dict[str, str]:
    return {
        "durable.workflow_id": run.workflow_id,
        "durable.run_id": run.run_id,
        "durable.workflow_type": run.workflow_type,
    }


class TracingInterceptor(Interceptor):
    """Makes the spans listed in :mod:`durable.tracing`.

    Args:
        tracer_provider: Default: OpenTelemetry's global provider.
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        self._tracer = trace.get_tracer("durable", tracer_provider=tracer_provider)

    # ------------------------------------------------------------- client
    def _client_span(
        self, name: str, attributes: dict[str, Any], headers: dict[str, Any], call: Callable[[], Any]
    ) -> Any:
        with self._tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes) as span:
            inject(headers)
            result = call()
            if isinstance(result, str) and name.startswith("StartWorkflow"):
                span.set_attribute("durable.run_id", result)
            return result

    def start_workflow(self, input: StartWorkflowInput, next: Next) -> Any:  # noqa: A002
        attributes = {"durable.workflow_id": input.workflow_id, "durable.workflow_type": input.workflow_type}
        return self._client_span(
            f"StartWorkflow:{input.workflow_type}", attributes, input.headers, lambda: next(input)
        )

    def signal_workflow(self, input: SignalWorkflowInput, next: Next) -> Any:  # noqa: A002
        attributes = {"durable.workflow_id": input.workflow_id, "durable.signal": input.name}
        return self._client_span(
            f"SignalWorkflow:{input.name}", attributes, input.headers, lambda: next(input)
        )

    def update_workflow(self, input: UpdateWorkflowInput, next: Next) -> Any:  # noqa: A002
        attributes = {"durable.workflow_id": input.workflow_id, "durable.update": input.name}
        return self._client_span(
            f"UpdateWorkflow:{input.name}", attributes, input.headers, lambda: next(input)
        )

    def query_workflow(self, input: QueryWorkflowInput, next: Next) -> Any:  # noqa: A002
        attributes = {"durable.workflow_id": input.workflow_id, "durable.query": input.name}
        return self._client_span(
            f"QueryWorkflow:{input.name}", attributes, input.headers, lambda: next(input)
        )

    # ------------------------------------------------------- workflow side
    def _instant(self, name: str, run: RunInfo, extra: dict[str, Any] | None = None, **kw: Any) -> Span:
        """A span that marks a point of the run (started and ended now), under the run's context.

        Never made current: workflow code runs in greenlets, and nothing it does may depend on it.
        """
        span = self._tracer.start_span(
            name, context=extract(run.headers), attributes={**_run_attributes(run), **(extra or {})}, **kw
        )
        span.end()
        return span

    def decide(self, input: DecisionInput, next: Next) -> Any:  # noqa: A002
        run = input.run
        span = self._tracer.start_span(
            f"Decision:{run.workflow_type}",
            context=extract(run.headers),
            attributes={**_run_attributes(run), "durable.inputs": len(input.inbox)},
        )
        try:
            decision = next(input)
            if getattr(decision, "status", "") == "failed":
                span.set_status(Status(StatusCode.ERROR, "the workflow failed"))
            return decision
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            span.end()

    def handle(self, input: HandleInput, next: Next) -> Any:  # noqa: A002
        if not input.replaying:
            self._instant(f"RunWorkflow:{input.run.workflow_type}", input.run)
        return next(input)

    def handle_signal(self, input: HandleSignalInput, next: Next) -> Any:  # noqa: A002
        if not input.replaying:
            sender = trace.get_current_span(extract(input.headers)).get_span_context()
            links = [Link(sender)] if sender.is_valid else None
            self._instant(
                f"HandleSignal:{input.name}", input.run, {"durable.signal": input.name}, links=links
            )
        return next(input)

    def handle_update(self, input: HandleUpdateInput, next: Next) -> Any:  # noqa: A002
        sender = trace.get_current_span(extract(input.headers)).get_span_context()
        for name in TRACE_HEADERS:  # the handler's calls stay in the run's trace; the sender is linked
            input.headers.pop(name, None)
        if not input.replaying:
            extra = {"durable.update": input.name, "durable.update_id": input.update_id}
            links = [Link(sender)] if sender.is_valid else None
            self._instant(f"HandleUpdate:{input.name}", input.run, extra, links=links)
        return next(input)

    def start_child(self, input: StartChildInput, next: Next) -> Any:  # noqa: A002
        if not input.replaying:  # replay: the recorded ChildStarted headers are used anyway
            span = self._instant(f"StartChildWorkflow:{input.workflow_type}", input.run)
            inject(input.headers, trace.set_span_in_context(span))
        return next(input)

    # ------------------------------------------------------- activity side
    def execute_activity(self, input: ExecuteActivityInput, next: Next) -> Any:  # noqa: A002
        attributes: dict[str, str | int] = {
            "durable.workflow_id": input.workflow_id,
            "durable.run_id": input.run_id,
            "durable.activity": input.name,
            "durable.activity_id": input.activity_id,
            "durable.attempt": input.attempt,
        }
        with self._tracer.start_as_current_span(
            f"RunActivity:{input.name}",
            context=extract(input.headers),
            kind=SpanKind.SERVER,
            attributes=attributes,
        ):
            return next(input)


_enabled: TracingInterceptor | None = None


def enable(tracer_provider: Any = None) -> TracingInterceptor:
    """Register the tracing interceptor in this process (once; a second call returns the first)."""
    global _enabled
    if _enabled is None:
        _enabled = TracingInterceptor(tracer_provider)
        interceptors.register(_enabled)
    return _enabled


def disable() -> None:
    """Unregister the tracing interceptor :func:`enable` registered."""
    global _enabled
    if _enabled is not None:
        interceptors.unregister(_enabled)
        _enabled = None
