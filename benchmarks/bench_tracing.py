"""Tracing on for a benchmark (``harness.py --tracing``): OpenTelemetry's SDK at its default
sampling (every trace), spans through a batch processor to an exporter that drops them, so the
cost measured is durable's interceptor plus the SDK's, not a collector's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import durable.tracing

ENV = "DURABLE_BENCH_TRACING"


def enable() -> None:
    """Register durable's tracing with an SDK provider whose spans go nowhere."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    durable.tracing.enable(provider)


def disable() -> None:
    durable.tracing.disable()
