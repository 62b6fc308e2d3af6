"""A public helper for testing code instrumented with tracegym (and for tracegym's own tests).

    with tracegym.testing.capture() as captured:
        my_agent("task")
    assert captured.names() == ["execute_tool get_order", "invoke_agent support"]

Spans go to memory through the same processors as in production: tracegym's own processor
(the run/step bookkeeping and content policy other instrumentations' spans get,
`tracer/third_party.py`), then redaction. Inside the block, `tracegym.instrument`'s instrumentors
(OpenInference's OpenAI, Anthropic, LangChain ...) start their spans on the capture's provider
too, so their spans are captured with tracegym's. The global OpenTelemetry provider, and the
one `tracegym.init` installed on, are not touched. `records()` gives the spans as the store
would hold them (other conventions mapped onto the GenAI keys, as the spool writes them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracegym.tracer import semconv as sc
from tracegym.tracer import setup
from tracegym.tracer.attribute_mapping import operation_of
from tracegym.tracer.config import Settings
from tracegym.tracer.operations import state
from tracegym.tracer.processors import FanOutSpanProcessor
from tracegym.tracer.redact import RedactingSpanProcessor
from tracegym.tracer.spool import span_record


@dataclass
class Captured:
    """The spans ended inside a `capture()` block, with helpers to look at them."""

    exporter: InMemorySpanExporter

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def names(self) -> list[str]:
        return [s.name for s in self.spans]

    def one(self, name: str) -> ReadableSpan:
        """The single span called `name` (AssertionError when there are none or several)."""
        found = [s for s in self.spans if s.name == name]
        assert len(found) == 1, f"expected one span {name!r}, got {len(found)}: {self.names()}"
        return found[0]

    def by_operation(self, operation: str) -> list[ReadableSpan]:
        """Spans of `operation` (`chat`, `execute_tool` ...), other instrumentations' by the
        mapping the store applies (an OpenInference LLM span is a `chat`)."""
        return [s for s in self.spans if operation_of(dict(s.attributes or {})) == operation]

    def records(self) -> list[dict[str, Any]]:
        """The spans as spool records: what the store would hold of them."""
        return [span_record(s) for s in self.spans]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        pid = parent.context.span_id
        return [s for s in self.spans if s.parent is not None and s.parent.span_id == pid]

    def tree(self) -> list[tuple[str, list[Any]]]:
        """Root spans and their descendants as nested (name, children) pairs, in start order."""
        spans = sorted(self.spans, key=lambda s: s.start_time or 0)
        ids = {s.context.span_id for s in spans}

        def build(span: ReadableSpan) -> tuple[str, list[Any]]:
            return (
                span.name,
                [build(c) for c in spans if c.parent and c.parent.span_id == span.context.span_id],
            )

        return [build(s) for s in spans if s.parent is None or s.parent.span_id not in ids]


@contextmanager
def capture(redact: bool = True, **settings: Any) -> Iterator[Captured]:
    """Record tracegym spans in memory for the duration of the block.

    `settings` override the tracer settings (capture_content, capture_messages,
    max_value_length) inside the block.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    simple = SimpleSpanProcessor(exporter)
    # As `tracegym.init` wires it: tracegym's processor first, redaction on the way out.
    provider.add_span_processor(
        FanOutSpanProcessor([RedactingSpanProcessor([simple]) if redact else simple])
    )
    saved = state.tracer, state.settings
    state.tracer = provider.get_tracer(sc.INSTRUMENTATION_SCOPE)
    state.settings = Settings(**{**Settings.from_env().__dict__, **settings})
    try:
        with setup.capturing_on(provider):
            yield Captured(exporter)
    finally:
        state.tracer, state.settings = saved
        provider.shutdown()
