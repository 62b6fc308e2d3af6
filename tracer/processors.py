"""Batching that never blocks the agent and never loses a span without counting it."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from tracegym.tracer import internal


class CountingExporter(SpanExporter):
    """Wraps an exporter to count what it delivered and what it failed to deliver."""

    def __init__(self, exporter: SpanExporter, name: str) -> None:
        self.exporter = exporter
        self.name = name

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.exporter.export(spans)
        except Exception as exc:
            internal.report_error(f"export.{self.name}", exc)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            internal.add(f"spans_exported.{self.name}", len(spans))
        else:
            internal.add(f"spans_failed.{self.name}", len(spans))
        return result

    def shutdown(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception as exc:
            internal.report_error(f"shutdown.{self.name}", exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return self.exporter.force_flush(timeout_millis)
        except Exception as exc:
            internal.report_error(f"flush.{self.name}", exc)
            return False


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor, counting the spans its bounded queue drops.

    The SDK drops the oldest span when the queue is full and only logs it; we count each drop
    under `spans_dropped.<name>` so `tracegym.stats()` shows it. The queue stays bounded, so a
    dead backend costs at most `max_queue_size` spans of memory, never an agent stall.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        name: str,
        *,
        max_queue_size: int,
        schedule_delay_millis: float,
        max_export_batch_size: int = 512,
    ) -> None:
        super().__init__(
            CountingExporter(exporter, name),
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_millis,
            max_export_batch_size=min(max_export_batch_size, max_queue_size),
        )
        self.name = name
        self._dropped_key = f"spans_dropped.{name}"
        # The SDK keeps its queue private; if a future release renames it we stop counting
        # drops rather than break the agent.
        inner = getattr(self, "_batch_processor", None)
        self._queue = getattr(inner, "_queue", None)
        self._capacity = max_queue_size

    def on_end(self, span: ReadableSpan) -> None:
        queue = self._queue
        if (queue is not None and len(queue) >= self._capacity) or self.done:
            internal.add(self._dropped_key)
        super().on_end(span)

    @property
    def done(self) -> bool:
        """True once shut down: later spans are dropped (and counted)."""
        return bool(getattr(getattr(self, "_batch_processor", None), "_shutdown", False))

    def queued(self) -> int:
        """Spans waiting in the queue right now."""
        return len(self._queue) if self._queue is not None else 0


class FanOutSpanProcessor(SpanProcessor):
    """tracegym's one processor on a provider: hands spans to its pipelines, which a second
    `tracegym.init` swaps in place instead of stacking new processors on the provider."""

    def __init__(self, processors: Sequence[SpanProcessor] = ()) -> None:
        self._processors = tuple(processors)
        self._closed = False

    def replace(self, processors: Sequence[SpanProcessor]) -> None:
        self._processors = tuple(processors)
        self._closed = False

    def close(self) -> None:
        """After `tracegym.shutdown`: spans still ending are dropped, and counted."""
        self._processors = ()
        self._closed = True

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        for processor in self._processors:
            processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self._closed:
            internal.add("spans_dropped.after_shutdown")
            return
        for processor in self._processors:
            processor.on_end(span)

    def shutdown(self) -> None:
        for processor in self._processors:
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self._processors)
