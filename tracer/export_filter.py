"""Messages stay in the local store unless the application asks to export them.

tracegym captures LLM messages by default for its own store (the spool), as peers do, with
redaction and truncation applied; the GenAI convention keeps sending them to a backend opt-in
(`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`). `MessageFilteringExporter` wraps every
other pipeline's exporter (OTLP, the application's own) and leaves out what message capture
adds: `gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.system_instructions`, the
input/output values of LLM spans (OpenInference's `input.value`/`output.value`, OpenLLMetry's
`traceloop.entity.input/output`), OpenInference's flattened `llm.input_messages.*` /
`llm.output_messages.*`, OpenLLMetry's `gen_ai.prompt.*` / `gen_ai.completion.*`, and message
events: the same keys the content policy drops with `capture_messages=False`
(`foreign.filter_span`). It runs on the pipeline's export thread, never on the agent's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import attrgetter

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from tracegym.tracer import internal
from tracegym.tracer import semconv as sc
from tracegym.tracer.attribute_mapping import operation_of
from tracegym.tracer.third_party import (
    OWN_SCOPE,
    attribute_maps,
    attributes_of,
    filter_span,
    is_foreign,
)

_SCOPE = attrgetter("_instrumentation_scope")  # the SDK's field: the property is a call


def carries_no_messages(spans: Sequence[ReadableSpan]) -> bool:
    """True when `without_messages` would hand back every span of the batch as it is: all are
    tracegym's own and none is an LLM span. Walked in C: it runs per span on the export thread."""
    try:
        each = list(map(_SCOPE, spans))
        if len(set(map(id, each))) == 1:  # one tracer's spans: one scope
            scopes: Iterable[InstrumentationScope | None] = each[:1]
        else:
            scopes = dict(zip(map(id, each), each, strict=True)).values()  # each distinct once
    except AttributeError:
        scopes = [span.instrumentation_scope for span in spans]
    if not all(scope is not None and scope.name == OWN_SCOPE for scope in scopes):
        return False
    return sc.OP_CHAT not in map(dict.get, attribute_maps(spans), repeat(sc.OPERATION))


def without_messages(span: ReadableSpan) -> ReadableSpan:
    """`span` less its messages; `span` itself when it carries none."""
    attributes = attributes_of(span)
    if not is_foreign(span):  # tracegym's own: only its LLM spans carry messages
        if attributes.get(sc.OPERATION) != sc.OP_CHAT:
            return span
        operation: str | None = sc.OP_CHAT
    else:
        operation = operation_of(attributes)
    return filter_span(span, operation, attributes, content=True, messages=False, limit=None)


class MessageFilteringExporter(SpanExporter):
    """Exports each span without its messages (see the module docstring)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            unchanged = carries_no_messages(spans)  # the common case: no LLM span in the batch
        except Exception as exc:  # fall through to the span-by-span path
            internal.report_error("export_filter.batch", exc)
            unchanged = False
        if unchanged:
            return self.exporter.export(spans)
        kept = []
        for span in spans:
            try:
                kept.append(without_messages(span))
            except Exception as exc:  # never send a span whose messages we could not remove
                internal.report_error("export_filter", exc)
                internal.span_failed("message_filter")
        return self.exporter.export(kept) if kept else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)
