"""OpenTelemetry tracing for durable, built as an interceptor (``pip install -e '.[otel]'`` in durable's checkout).

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
import time
from collections.abc import Mapping
from typing import Any

try:
    from opentelemetry import context as context_api
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError(
        "durable.tracing needs OpenTelemetry: pip install -e '.[otel]' in durable's checkout"
    ) from exc

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
_EMPTY = Context()

#: Runs whose parent context and attributes are kept (a worker's sticky cache is about as large).
RUN_CACHE_SIZE = 4096
_DECISION_ATTRIBUTES_KEPT = 8
_TEXT = (str, bytes)  # a tuple: ``str | bytes`` would build a union object per call


def extract(headers: Mapping[str, Any]) -> Context:
    """The trace context recorded in ``headers`` (an empty context when there is none)."""
    traceparent = headers.get("traceparent")
    if not isinstance(traceparent, _TEXT):
        return _EMPTY
    tracestate = headers.get("tracestate")
    return _extract_cached(traceparent, tracestate if isinstance(tracestate, _TEXT) else None)


@functools.lru_cache(maxsize=4096)
def _extract_cached(traceparent: str | bytes, tracestate: str | bytes | None) -> Context:
    # Every span of a run has the same parent: its traceparent is parsed once, not per span
    # (a Context is immutable, so sharing one is safe).
    carrier = {}
    for name, value in (("traceparent", traceparent), ("tracestate", tracestate)):
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if isinstance(value, str) and value:
            carrier[name] = value
    return _propagator.extract(carrier) if "traceparent" in carrier else _EMPTY


def inject(headers: dict[str, Any], context: Context | None = None) -> None:
    """Write ``context`` (default: the current one) into ``headers``."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=context)
    for name in TRACE_HEADERS:
        headers.pop(name, None)
    headers.update(carrier)


class _RunSpans:
    """What every span of one run shares, built once per run (not per decision): the
    parent context (from the recorded ``traceparent``), the run's attributes and span names.

    The attribute dicts are handed to the SDK as they are: it copies (and cleans) them into
    each span, and samplers only read them, so one dict serves every span of the run.
    """

    __slots__ = ("attributes", "decision", "decision_attributes", "parent", "traceparent")

    def __init__(self, run: RunInfo) -> None:
        self.traceparent = run.headers.get("traceparent")
        self.parent = extract(run.headers)
        self.attributes: dict[str, Any] = {
            "durable.workflow_id": run.workflow_id,
            "durable.run_id": run.run_id,
            "durable.workflow_type": run.workflow_type,
        }
        self.decision = f"Decision:{run.workflow_type}"
        # A decision's attributes by its number of inputs (almost always 0-2): built once.
        self.decision_attributes: dict[int, dict[str, Any]] = {}

    def for_decision(self, inputs: int) -> dict[str, Any]:
        attributes = self.decision_attributes.get(inputs)
        if attributes is None:
            attributes = {**self.attributes, "durable.inputs": inputs}
            if inputs < _DECISION_ATTRIBUTES_KEPT:
                self.decision_attributes[inputs] = attributes
        return attributes


def _fail(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


class TracingInterceptor(Interceptor):
    """Makes the spans listed in :mod:`durable.tracing`.

    Args:
        tracer_provider: Default: OpenTelemetry's global provider.
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        self._tracer = trace.get_tracer("durable", tracer_provider=tracer_provider)
        self._runs: dict[str, _RunSpans] = {}
        self._activity_names: dict[str, str] = {}

    def _run(self, run: RunInfo) -> _RunSpans:
        """The run's shared span parts; rebuilt if its recorded ``traceparent`` differs."""
        spans = self._runs.get(run.run_id)
        if spans is None or spans.traceparent != run.headers.get("traceparent"):
            if len(self._runs) >= RUN_CACHE_SIZE:
                # Start over rather than evict one by one: safe with several decider threads,
                # and a run's entry is cheap to rebuild (its context is in extract's cache).
                self._runs.clear()
            spans = self._runs[run.run_id] = _RunSpans(run)
        return spans

    # ------------------------------------------------------------- client
    def _client_span(self, name: str, attributes: dict[str, Any], input: Any, next: Next) -> Any:  # noqa: A002
        # Current while the call runs: spans the caller's other instrumentation makes inside
        # it (a Redis client's, say) nest under it. Once per client call, not per step.
        with self._tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes) as span:
            inject(input.headers)
            result = next(input)
            if isinstance(result, str) and isinstance(input, StartWorkflowInput):
                span.set_attribute("durable.run_id", result)
            return result

    def start_workflow(self, input: StartWorkflowInput, next: Next) -> Any:  # noqa: A002
        attributes = {"durable.workflow_id": input.workflow_id, "durable.workflow_type": input.workflow_type}
        return self._client_span(f"StartWorkflow:{input.workflow_type}", attributes, input, next)

    def signal_workflow(self, input: SignalWorkflowInput, next: Next) -> Any:  # noqa: A002
        attributes = {"durable.workflow_id": input.workflow_id, "durable.signal": input.name}
        return self._client_span(f"SignalWorkflow:{input.name}", attributes, input, next)

    def update_workflow(self, input: UpdateWorkflowInput, next: Next) -> Any:  # noqa: A002
        attributes = {"durable.workflow_id": input.workflow_id, "durable.update": input.name}
        return self._client_span(f"UpdateWorkflow:{input.name}", attributes, input, next)

    def query_workflow(self, input: QueryWorkflowInput, next: Next) -> Any:  # noqa: A002
        attributes = {"durable.workflow_id": input.workflow_id, "durable.query": input.name}
        return self._client_span(f"QueryWorkflow:{input.name}", attributes, input, next)

    # ------------------------------------------------------- workflow side
    def _instant(self, name: str, run: RunInfo, extra: dict[str, Any] | None = None, **kw: Any) -> Span:
        """A span that marks a point of the run (started and ended now), under the run's context.

        Never made current: workflow code runs in greenlets, and nothing it does may depend on it.
        """
        spans = self._run(run)
        attributes = {**spans.attributes, **extra} if extra else spans.attributes
        span = self._tracer.start_span(name, context=spans.parent, attributes=attributes, **kw)
        span.end()
        return span

    def decide(self, input: DecisionInput, next: Next) -> Any:  # noqa: A002
        spans = self._run(input.run)
        attributes = spans.for_decision(len(input.inbox))
        span = self._tracer.start_span(spans.decision, context=spans.parent, attributes=attributes)
        try:
            decision = next(input)
            if getattr(decision, "status", "") == "failed":
                span.set_status(Status(StatusCode.ERROR, "the workflow failed"))
            return decision
        except Exception as exc:
            _fail(span, exc)
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
        parent = extract(input.headers)
        name = self._activity_names.get(input.name)
        if name is None:  # a process runs few activity types: their span names are kept
            name = self._activity_names[input.name] = f"RunActivity:{input.name}"
        span = self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "durable.workflow_id": input.workflow_id,
                "durable.run_id": input.run_id,
                "durable.activity": input.name,
                "durable.activity_id": input.activity_id,
                "durable.attempt": input.attempt,
            },
        )
        # Current for the attempt (the activity's own spans nest under it); a plain
        # attach/detach does what start_as_current_span's context managers do, cheaper.
        token = context_api.attach(trace.set_span_in_context(span))
        began = time.monotonic()
        try:
            result = next(input)
        except BaseException as exc:
            if isinstance(exc, Exception):  # as use_span: not GeneratorExit and the like
                _fail(span, exc)
            span.end()
            raise
        finally:
            context_api.detach(token)
        limit = input.start_to_close_timeout
        took = time.monotonic() - began
        if limit is not None and took > limit:
            # Unmarked, a retry after it looked unexplained. Not an error: whether the scheduler
            # timed the attempt out first (its result then discarded) is not known here, and a
            # result a moment late may still have been taken.
            span.set_attribute("durable.past_start_to_close", True)
            span.add_event(
                "past start_to_close",
                {
                    "durable.took_s": round(took, 3),
                    "durable.start_to_close_s": limit,
                    "message": "the attempt ran past its start_to_close timeout: if the scheduler timed it "
                    "out first, this result is discarded and the next attempt follows",
                },
            )
        span.end()
        return result


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
