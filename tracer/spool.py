"""Spans as spool lines: the embedded store's write side, on the batch processor's thread.

The file format and the files themselves (writing, locking, reading) are in
`tracer.spool_files`, which needs no OpenTelemetry; its names are re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode
from tracegym.tracer import internal
from tracegym.tracer import semconv as sc
from tracegym.tracer.attribute_mapping import error_type_from_events, normalize_attributes
from tracegym.tracer.openinference import stored
from tracegym.tracer.spool_files import (  # noqa: F401  (the file side, re-exported)
    SPOOL_DIR,
    SPOOL_VERSION,
    SpoolWriter,
    is_complete,
    iter_spool,
    read_spool_file,
    spool_dir,
)

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def _hex_id(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _attributes(span: ReadableSpan, scope: str | None) -> dict[str, Any]:
    """The span's attributes; another instrumentation's (OpenInference, OpenLLMetry) get the
    GenAI keys the store's views read added, as the OTLP receiver adds them, so a span lands in
    the same columns whichever way it arrives. tracegym's own spans are written as they are."""
    attributes = dict(span.attributes or {})
    if scope == sc.INSTRUMENTATION_SCOPE:  # less the OpenInference copies, for other backends
        return stored(attributes)
    try:
        attributes = normalize_attributes(attributes, span.name)
        if span.status.status_code is StatusCode.ERROR and sc.ERROR_TYPE not in attributes:
            events = [{"name": e.name, "attributes": e.attributes or {}} for e in span.events]
            error_type_from_events(attributes, events)  # as the receiver does
    except Exception as exc:  # the span is kept as it came, and the error counted
        internal.report_error("spool.normalize", exc)
    return attributes


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A span as one spool line (before JSON encoding)."""
    ctx = span.context
    parent = span.parent
    status = span.status
    scope = span.instrumentation_scope
    scope_name = scope.name if scope is not None else None
    return {
        "v": SPOOL_VERSION,
        "trace_id": _hex_id(ctx.trace_id, 32),
        "span_id": _hex_id(ctx.span_id, 16),
        "parent_span_id": _hex_id(parent.span_id, 16) if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": status.status_code.name,
        "status_message": status.description,
        "attributes": _attributes(span, scope_name),
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ],
        "links": [
            {
                "trace_id": _hex_id(link.context.trace_id, 32),
                "span_id": _hex_id(link.context.span_id, 16),
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
        "resource": dict(span.resource.attributes) if span.resource is not None else {},
        "scope": scope_name,
    }


class SpoolSpanExporter(SpanExporter):
    """Exports spans as spool lines; runs on the batch processor's thread, not the agent's."""

    def __init__(self, home: Path, **writer_options: Any) -> None:
        self.writer = SpoolWriter(home, **writer_options)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            try:
                lines.append(_encode(span_record(span)))
            except Exception as exc:
                internal.report_error("spool.encode", exc)
                internal.span_failed("spool")
        if not lines:
            return SpanExportResult.SUCCESS
        try:
            # Lone surrogates (invalid text) become U+FFFD: every line stays valid UTF-8.
            self.writer.write(("\n".join(lines) + "\n").encode("utf-8", "replace"))
        except OSError as exc:
            internal.report_error("spool.write", exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
