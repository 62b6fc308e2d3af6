"""`otlp-json`: OTLP/JSON trace files, as the OpenTelemetry Collector's file exporter writes them.

The file exporter (format `json`) writes JSON lines, one `ExportTraceServiceRequest`-shaped
object (`{"resourceSpans": [...]}`) per line; a file holding a single (possibly pretty-printed)
object, or a JSON array of such objects, is accepted too, and gzip-compressed files are
unpacked (by a streaming reader that refuses more than the import limit of unpacked bytes).
JSON lines are read and converted one at a time. Lines of other signals the same exporter may
share the file with (`resourceLogs`, `resourceMetrics`, `resourceProfiles`) are skipped; a file
with no trace data at all is an error.

Phoenix's span export is read too: `GET /v1/projects/{project}/spans/otlpv1` answers
`{"data": [<span>, ...], "next_cursor": ...}`, OTLP spans without the resourceSpans wrapper,
with the proto field names in snake_case (`trace_id`, `start_time_unix_nano`,
`attributes: [{"key", "value": {"string_value": ...}}]`, unset fields as null). A file of such
pages (one per line, or a JSON array of them), or of bare span objects, is accepted; the
protobuf JSON mapping lets a reader take the original (snake_case) field names, so an OTLP
request written that way (`resource_spans`) is read as well. Phoenix keeps no resource or scope
for a span, so these are empty.

Spans keep their own trace and span ids (so re-importing yields the same spans, and the import
registry skips a file seen before); attributes go through the same OpenInference / OpenLLMetry
mapping as the OTLP receiver (`tracegym.store.otlp`). No outcomes are attached: OTLP carries none.
Errors name the file and the line (and the span's place within the line's request).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracegym.store.importers import (
    ImportFormatError,
    gunzip,
    iter_json_lines,
    load_json,
    max_bytes_from_env,
)
from tracegym.store.otlp import OTLPFormatError, records_from_json_object

_OTHER_SIGNALS = ("resourceLogs", "resourceMetrics", "resourceProfiles")
_SPAN_KEYS = ("traceId", "trace_id")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def camel_case(value: Any) -> Any:
    """OTLP JSON with the proto field names (snake_case) as lowerCamelCase, nulls dropped
    (Phoenix writes every unset field as null). Attribute keys are values, not keys, in
    OTLP JSON (`{"key": ..., "value": ...}`), so they are left as they are."""
    if isinstance(value, dict):
        return {_camel(k): camel_case(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [camel_case(v) for v in value]
    return value


def _is_span(obj: Any) -> bool:
    return isinstance(obj, dict) and any(key in obj for key in _SPAN_KEYS)


def _as_request(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A Phoenix span page, a bare span, or a snake_case request as an OTLP/JSON request;
    None when `obj` is none of these."""
    if "resource_spans" in obj and "resourceSpans" not in obj:
        return camel_case(obj)
    if _is_span(obj):
        spans = [obj]
    elif isinstance(obj.get("data"), list) and all(_is_span(s) for s in obj["data"]):
        spans = obj["data"]  # Phoenix's /v1/projects/{p}/spans/otlpv1 response
    else:
        return None
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": camel_case(spans)}]}]}


def _objects(path: Path, data: bytes) -> Iterator[tuple[str | None, Any]]:
    """(record label, parsed object) for each request in the file, JSON lines parsed as they
    are reached."""
    first = next((line for line in io.BytesIO(data) if line.strip()), None)
    if first is None:
        raise ImportFormatError(path, "empty file: no OTLP/JSON trace data")
    try:
        json.loads(first)
        jsonl = True
    except (ValueError, UnicodeDecodeError, RecursionError):
        jsonl = False  # the first line is not a document of its own: one pretty-printed object
    if jsonl and len(first.strip()) < len(data.strip()):
        yield from ((f"line {number}", obj) for number, obj in iter_json_lines(path, data))
        return
    document = load_json(path, data)
    if isinstance(document, list):
        yield from ((f"item {index}", obj) for index, obj in enumerate(document))
        return
    yield None, document


def iter_records(
    path: Path, data: bytes, *, labels: Path | None = None
) -> Iterator[dict[str, Any]]:
    """Spool records for every span in one OTLP/JSON file, a request at a time;
    ImportFormatError on bad input."""
    path = Path(path)
    if labels is not None:
        raise ImportFormatError(path, "otlp-json takes no --labels (OTLP carries no outcomes)")
    data = gunzip(path, data, max_bytes_from_env())
    traces_seen = False
    for record, obj in _objects(path, data):
        if not isinstance(obj, dict):
            raise ImportFormatError(
                path, f"expected an OTLP/JSON object, got {type(obj).__name__}", record=record
            )
        if "resourceSpans" not in obj:
            if any(key in obj for key in _OTHER_SIGNALS):
                continue  # logs or metrics sharing the file: not ours
            converted = _as_request(obj)
            if converted is None:
                raise ImportFormatError(
                    path,
                    "not OTLP/JSON trace data (no resourceSpans, and not Phoenix's span "
                    'export {"data": [spans]}); expected the Collector file exporter\'s JSON '
                    "lines",
                    record=record,
                )
            obj = converted
        traces_seen = True
        try:
            records = records_from_json_object(obj)
        except OTLPFormatError as exc:
            raise ImportFormatError(path, str(exc), record=record) from None
        del obj
        yield from records
    if not traces_seen:
        raise ImportFormatError(path, "no trace data (only logs/metrics)")


def convert(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict[str, Any]]:
    """Spool records for every span in one OTLP/JSON file; ImportFormatError on bad input."""
    return list(iter_records(path, data, labels=labels))
