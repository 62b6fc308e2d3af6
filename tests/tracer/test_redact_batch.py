"""The export-thread redaction: a clean batch passes through as is, one secret anywhere in a
batch sends it through the span-by-span path, and only that span changes."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode
from tracegym.tracer.redact import REDACTED, RedactingSpanExporter, Redactor


def _spans(texts: list[str], status: str | None = None):
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i, text in enumerate(texts):
        span = tracer.start_span(f"s{i}", attributes={"gen_ai.tool.call.arguments": text})
        if status and i == 0:
            span.set_status(Status(StatusCode.ERROR, status))
        span.end()
    return list(memory.get_finished_spans())


def test_clean_batch_passes_unchanged():
    spans = _spans([f'{{"order_id": "W{i}"}}' for i in range(50)])
    assert Redactor().batch_is_clean(spans)
    out = InMemorySpanExporter()
    RedactingSpanExporter(out).export(spans)
    assert [s is t for s, t in zip(out.get_finished_spans(), spans, strict=True)] == [True] * 50


def test_one_secret_in_a_batch_is_redacted_and_nothing_else_changes():
    texts = [f'{{"order_id": "W{i}"}}' for i in range(50)]
    texts[17] = '{"api_key": "sk-abcdefghijklmnopqrstuvwxyz123456"}'
    spans = _spans(texts)
    assert not Redactor().batch_is_clean(spans)
    out = InMemorySpanExporter()
    RedactingSpanExporter(out).export(spans)
    exported = list(out.get_finished_spans())
    assert REDACTED in exported[17].attributes["gen_ai.tool.call.arguments"]
    assert "sk-abc" not in exported[17].attributes["gen_ai.tool.call.arguments"]
    assert all(exported[i] is spans[i] for i in range(50) if i != 17)


def test_secret_in_a_status_message_makes_the_batch_dirty():
    spans = _spans(["fine"], status="login failed: password=hunter22")
    assert not Redactor().batch_is_clean(spans)
    out = InMemorySpanExporter()
    RedactingSpanExporter(out).export(spans)
    assert "hunter22" not in out.get_finished_spans()[0].status.description
