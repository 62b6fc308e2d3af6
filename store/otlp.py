"""OTLP trace data -> spool records, and other conventions -> tracegym's attribute names.

Two inputs, one output:
- `records_from_protobuf(body)` / `records_from_request(request)`: an OTLP/protobuf
  `ExportTraceServiceRequest` (bytes, or the parsed message);
- `records_from_json(body)` / `records_from_json_object(obj)`: OTLP/JSON, the proto3 JSON
  mapping as OTLP/HTTP uses it (lowerCamelCase keys, trace and span ids as hex strings,
  64-bit integers as strings or numbers, enums as integers or names, typed `AnyValue`s);
both return spool records with the fields of `tracegym.store.records.span_record` (the same
lines the tracer writes), attributes already passed through `normalize_attributes`.

Validation is strict and a request is all or nothing: the first problem raises
`OTLPFormatError` (a ValueError) that names where it is, e.g.
`resourceSpans[0].scopeSpans[1].spans[3]: spanId must be 8 bytes (16 hex characters), got 7`.
Checked: trace ids (16 bytes, not all zero), span ids (8 bytes, not all zero), parent and link
ids, start/end and event times (present, and within a signed 64-bit count of nanoseconds since
1970, 0 to 2**63-1: the store's BIGINT; a larger one used to be stored as NULL), integer
attribute values (int64, as in OTLP/protobuf), kind and status codes, attribute value types.
An end before its start is kept as sent (clock skew between hosts is real; the `spans` view then
shows a negative duration). Unknown JSON keys are ignored, as the OTLP specification asks.

Value mapping: string/bool/int/double as themselves (non-finite doubles as the strings "NaN",
"Infinity", "-Infinity", since a spool line must be valid JSON), arrays as lists, key-value
lists as objects, bytes as base64 text, an empty value as null. Kind `SPAN_KIND_UNSPECIFIED`
becomes INTERNAL (as the specification allows); an all-zero parent span id means no parent.
Dropped: trace state, flags, dropped counts, scope version and schema URLs. An ERROR span
without `error.type` gets the `exception.type` of its last exception event.

Attribute mapping: `tracegym.tracer.attribute_mapping` (the tracer applies the same one to
other instrumentations' spans it records in process).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from tracegym.store.records import span_record
from tracegym.tracer import semconv as sc
from tracegym.tracer.attribute_mapping import (
    error_type_from_events,
    normalize_attributes,
    operation_of,
    token_counts,
)
from tracegym.tracer.openinference import stored
from tracegym.tracer.redact import Redactor
from tracegym.tracer.redact import redact_records as _redact_records

__all__ = [
    "OTLPFormatError",
    "count_spans_json",
    "count_spans_protobuf",
    "error_type_from_events",
    "normalize_attributes",
    "operation_of",
    "parse_json_body",
    "parse_protobuf",
    "records_from_json",
    "records_from_json_object",
    "records_from_protobuf",
    "records_from_request",
    "redact_records",
    "token_counts",
]


class OTLPFormatError(ValueError):
    """OTLP data that cannot be accepted; the message says where and what is wrong."""


class _Invalid(Exception):
    """Raised deep inside conversion; re-raised as OTLPFormatError with the location."""


# ---------------------------------------------------------------------------------------------
# Shared tables

KIND_NAMES = ("INTERNAL", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")  # by enum int
_KIND_BY_NAME = {
    **{f"SPAN_KIND_{n}": i for i, n in enumerate(KIND_NAMES) if i},
    "SPAN_KIND_UNSPECIFIED": 0,
    **{n: i for i, n in enumerate(KIND_NAMES) if i},
}
STATUS_NAMES = ("UNSET", "OK", "ERROR")
_STATUS_BY_NAME = {
    **{f"STATUS_CODE_{n}": i for i, n in enumerate(STATUS_NAMES)},
    **{n: i for i, n in enumerate(STATUS_NAMES)},
}
_NON_FINITE = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}
MAX_TIME_NS = 2**63 - 1  # the store keeps times as BIGINT nanoseconds since 1970 (year 2262)
_INT64 = (-(2**63), 2**63 - 1)


def _check_time(value: int, what: str, name: Any) -> int:
    """`value` when it fits the store's BIGINT nanoseconds; else the span is refused."""
    if value > MAX_TIME_NS:
        raise _Invalid(
            f"{what} {value} is out of range (nanoseconds since 1970 must fit a signed 64-bit "
            f"integer, at most {MAX_TIME_NS}) in span {str(name)[:80]!r}"
        )
    return value


def _finite(value: float) -> Any:
    if math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _fix_parent(parent: str | None) -> str | None:
    return None if not parent or parent == "0000000000000000" else parent


# ---------------------------------------------------------------------------------------------
# Protobuf


def _pb_value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "int_value":
        return value.int_value
    if which == "bool_value":
        return value.bool_value
    if which == "double_value":
        return _finite(value.double_value)
    if which == "array_value":
        return [_pb_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if which is None:
        return None
    raise _Invalid(f"unsupported attribute value type {which}")


def _pb_attributes(key_values: Iterable[Any]) -> dict[str, Any]:
    out = {}
    for kv in key_values:
        value = kv.value
        # The common scalar cases first, without the generic dispatch.
        which = value.WhichOneof("value")
        if which == "string_value":
            out[kv.key] = value.string_value
        elif which == "int_value":
            out[kv.key] = value.int_value
        else:
            try:
                out[kv.key] = _pb_value(value)
            except _Invalid as exc:
                raise _Invalid(f"attribute {kv.key!r}: {exc}") from None
    return out


def _pb_id(raw: bytes, size: int, what: str) -> str:
    if len(raw) != size:
        if not raw:
            raise _Invalid(f"missing {what}")
        raise _Invalid(f"{what} must be {size} bytes, got {len(raw)}")
    if not raw.strip(b"\0"):
        raise _Invalid(f"{what} is all zeros (invalid)")
    return raw.hex()


def _pb_span(span: Any, resource: dict[str, Any], scope: str | None) -> dict[str, Any]:
    trace_id = _pb_id(span.trace_id, 16, "traceId")
    span_id = _pb_id(span.span_id, 8, "spanId")
    parent = span.parent_span_id
    if parent:
        if len(parent) != 8:
            raise _Invalid(f"parentSpanId must be 8 bytes (or empty), got {len(parent)}")
        parent_id = parent.hex() if parent.strip(b"\0") else None
    else:
        parent_id = None
    start = span.start_time_unix_nano
    end = span.end_time_unix_nano
    if not start:
        raise _Invalid("missing startTimeUnixNano")
    if not end:
        raise _Invalid("missing endTimeUnixNano")
    if start > MAX_TIME_NS or end > MAX_TIME_NS:  # fixed64 on the wire: never negative
        _check_time(start, "startTimeUnixNano", span.name)
        _check_time(end, "endTimeUnixNano", span.name)
    kind = span.kind
    if not 0 <= kind < 6:
        raise _Invalid(f"unknown kind {kind}")
    status = span.status
    code = status.code
    if not 0 <= code < 3:
        raise _Invalid(f"unknown status code {code}")
    attributes = _pb_attributes(span.attributes)
    events = []
    for i, e in enumerate(span.events):
        try:
            event_attributes = _pb_attributes(e.attributes)
        except _Invalid as exc:
            raise _Invalid(f"events[{i}]: {exc}") from None
        time_ns = e.time_unix_nano
        if time_ns > MAX_TIME_NS:
            _check_time(time_ns, f"events[{i}].timeUnixNano", span.name)
        events.append({"name": e.name, "time_ns": time_ns, "attributes": event_attributes})
    links = []
    for i, link in enumerate(span.links):
        try:
            links.append(
                {
                    "trace_id": _pb_id(link.trace_id, 16, "traceId"),
                    "span_id": _pb_id(link.span_id, 8, "spanId"),
                    "attributes": _pb_attributes(link.attributes),
                }
            )
        except _Invalid as exc:
            raise _Invalid(f"links[{i}]: {exc}") from None
    name = span.name
    attributes = _own_or_mapped(attributes, name, scope)
    if code == 2 and sc.ERROR_TYPE not in attributes and events:
        error_type_from_events(attributes, events)
    return span_record(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_id,
        name=name,
        kind=KIND_NAMES[kind],
        start_ns=start,
        end_ns=end,
        status=STATUS_NAMES[code],
        status_message=status.message or None,
        attributes=attributes,
        events=events,
        links=links,
        resource=resource,
        scope=scope,
    )


def _own_or_mapped(attributes: dict[str, Any], name: str, scope: str | None) -> dict[str, Any]:
    """tracegym's own spans as the spool writes them in process (their tracegym keys, less the
    OpenInference copies they carry for other backends); other instrumentations' mapped."""
    if scope == sc.INSTRUMENTATION_SCOPE:
        return stored(attributes)
    return normalize_attributes(attributes, name)


def records_from_request(request: Any) -> list[dict[str, Any]]:
    """Spool records from a parsed `ExportTraceServiceRequest`; raises OTLPFormatError."""
    records: list[dict[str, Any]] = []
    append = records.append
    for r, resource_spans in enumerate(request.resource_spans):
        try:
            resource = _pb_attributes(resource_spans.resource.attributes)
        except _Invalid as exc:
            raise OTLPFormatError(f"resourceSpans[{r}].resource: {exc}") from None
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            scope = scope_spans.scope.name or None
            for i, span in enumerate(scope_spans.spans):
                try:
                    # Each record gets its own resource dict: records may be mutated downstream.
                    append(_pb_span(span, dict(resource), scope))
                except (_Invalid, RecursionError) as exc:
                    what = exc if isinstance(exc, _Invalid) else "values nested too deeply"
                    raise OTLPFormatError(
                        f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]: {what}"
                    ) from None
    return records


def _request_class() -> Any:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    return ExportTraceServiceRequest


def parse_protobuf(body: bytes) -> Any:
    """The `ExportTraceServiceRequest` in `body`; raises OTLPFormatError when it is not one."""
    from google.protobuf.message import DecodeError

    try:
        return _request_class().FromString(body)
    except DecodeError as exc:
        raise OTLPFormatError(f"invalid protobuf ExportTraceServiceRequest: {exc}") from None
    except Exception as exc:  # upb raises plain errors for some corruptions (recursion depth...)
        raise OTLPFormatError(f"invalid protobuf ExportTraceServiceRequest: {exc}") from None


def records_from_protobuf(body: bytes) -> list[dict[str, Any]]:
    """Spool records from an OTLP/protobuf request body; raises OTLPFormatError."""
    return records_from_request(parse_protobuf(body))


def count_spans_protobuf(request: Any) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


# ---------------------------------------------------------------------------------------------
# JSON

_HEX = re.compile(r"[0-9a-fA-F]*")
_SNAKE_HINTS = {
    "traceId": "trace_id",
    "spanId": "span_id",
    "startTimeUnixNano": "start_time_unix_nano",
    "endTimeUnixNano": "end_time_unix_nano",
}


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _j_list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if type(value) is not list:
        raise _Invalid(f"{key} must be an array, got {_type_name(value)}")
    return value


def _j_object(value: Any, what: str) -> Mapping[str, Any]:
    if type(value) is not dict:
        raise _Invalid(f"{what} must be an object, got {_type_name(value)}")
    return value


def _j_int(value: Any, what: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    kind = type(value)
    if kind is int:
        number = value
    elif kind is str:
        try:
            number = int(value, 10)
        except ValueError:
            raise _Invalid(f"{what} must be an integer, got {value[:40]!r}") from None
    elif kind is float and value.is_integer():
        number = int(value)
    else:
        raise _Invalid(f"{what} must be an integer, got {_type_name(value)}")
    if minimum is not None and number < minimum:
        raise _Invalid(f"{what} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise _Invalid(f"{what} must be <= {maximum}, got {number}")
    return number


def _j_value(value: Any) -> Any:
    if type(value) is not dict:
        raise _Invalid(f"value must be an AnyValue object, got {_type_name(value)}")
    if "stringValue" in value:
        text = value["stringValue"]
        if type(text) is not str:
            raise _Invalid(f"stringValue must be a string, got {_type_name(text)}")
        return text
    if "intValue" in value:  # int64 in OTLP: a larger one would not fit the store either
        return _j_int(value["intValue"], "intValue", minimum=_INT64[0], maximum=_INT64[1])
    if "boolValue" in value:
        flag = value["boolValue"]
        if type(flag) is not bool:
            raise _Invalid(f"boolValue must be true or false, got {_type_name(flag)}")
        return flag
    if "doubleValue" in value:
        number = value["doubleValue"]
        kind = type(number)
        if kind is float:
            return _finite(number)
        if kind is int:
            return float(number)
        if kind is str:
            if number in _NON_FINITE:
                return _NON_FINITE[number]
            try:
                return _finite(float(number))
            except ValueError:
                pass
        raise _Invalid(f"doubleValue must be a number, got {str(number)[:40]!r}")
    if "arrayValue" in value:
        array = _j_object(value["arrayValue"] or {}, "arrayValue")
        return [_j_value(v) for v in _j_list(array, "values")]
    if "kvlistValue" in value:
        kvlist = _j_object(value["kvlistValue"] or {}, "kvlistValue")
        return _j_attributes(_j_list(kvlist, "values"))
    if "bytesValue" in value:
        text = value["bytesValue"]
        if type(text) is not str:
            raise _Invalid(f"bytesValue must be base64 text, got {_type_name(text)}")
        try:
            raw = base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            raise _Invalid("bytesValue is not valid base64") from None
        return base64.b64encode(raw).decode("ascii")
    return None  # an empty AnyValue (unknown keys are ignored)


def _j_attributes(key_values: list[Any]) -> dict[str, Any]:
    out = {}
    for kv in key_values:
        if type(kv) is not dict:
            raise _Invalid(f"attributes must hold objects, got {_type_name(kv)}")
        key = kv.get("key")
        if type(key) is not str:
            raise _Invalid("attribute without a string key")
        value = kv.get("value")
        if value is None:
            out[key] = None
            continue
        # Fast path for the most common case.
        if type(value) is dict and len(value) == 1 and type(value.get("stringValue")) is str:
            out[key] = value["stringValue"]
            continue
        try:
            out[key] = _j_value(value)
        except _Invalid as exc:
            raise _Invalid(f"attribute {key!r}: {exc}") from None
    return out


def _j_id(obj: Mapping[str, Any], key: str, size: int, *, required: bool = True) -> str | None:
    text = obj.get(key)
    if text is None or text == "":
        if not required:
            return None
        hint = _SNAKE_HINTS.get(key)
        if hint and hint in obj:
            raise _Invalid(f"missing {key} (found {hint!r}: OTLP/JSON keys are lowerCamelCase)")
        raise _Invalid(f"missing {key}")
    if type(text) is not str:
        raise _Invalid(f"{key} must be a hex string, got {_type_name(text)}")
    if len(text) != 2 * size or not _HEX.fullmatch(text):
        if _HEX.fullmatch(text) and len(text) % 2 == 0:
            raise _Invalid(
                f"{key} must be {size} bytes ({2 * size} hex characters), got {len(text) // 2}"
            )
        raise _Invalid(
            f"{key} must be {2 * size} hex characters (OTLP/JSON ids are hex, not base64), "
            f"got {text[:40]!r}"
        )
    text = text.lower()
    if not text.strip("0"):
        if required:
            raise _Invalid(f"{key} is all zeros (invalid)")
        return None
    return text


def _j_enum(value: Any, names: Mapping[str, int], size: int, what: str) -> int:
    if value is None:
        return 0
    if type(value) is str:
        if value in names:
            return names[value]
        if value.isdigit():
            value = int(value)
        else:
            raise _Invalid(f"unknown {what} {value[:40]!r}")
    if type(value) is not int or not 0 <= value < size:
        raise _Invalid(f"unknown {what} {value!r}")
    return value


def _j_time(obj: Mapping[str, Any], key: str) -> int:
    """A span's start or end: present, non-negative, and within the store's BIGINT."""
    value = obj.get(key)
    if value is None or value == 0 or value == "0":
        hint = _SNAKE_HINTS.get(key)
        if hint and hint in obj:
            raise _Invalid(f"missing {key} (found {hint!r}: OTLP/JSON keys are lowerCamelCase)")
        raise _Invalid(f"missing {key}")
    number = _j_int(value, key, minimum=0)
    return _check_time(number, key, obj.get("name", "")) if number > MAX_TIME_NS else number


def _j_span(span: Any, resource: dict[str, Any], scope: str | None) -> dict[str, Any]:
    span = _j_object(span, "span")
    trace_id = _j_id(span, "traceId", 16)
    span_id = _j_id(span, "spanId", 8)
    parent_id = _j_id(span, "parentSpanId", 8, required=False)
    start = _j_time(span, "startTimeUnixNano")
    end = _j_time(span, "endTimeUnixNano")
    name = span.get("name", "")
    if type(name) is not str:
        raise _Invalid(f"name must be a string, got {_type_name(name)}")
    kind = _j_enum(span.get("kind"), _KIND_BY_NAME, 6, "kind")
    status = _j_object(span.get("status") or {}, "status")
    code = _j_enum(status.get("code"), _STATUS_BY_NAME, 3, "status code")
    message = status.get("message") or None
    if message is not None and type(message) is not str:
        raise _Invalid(f"status.message must be a string, got {_type_name(message)}")
    attributes = _j_attributes(_j_list(span, "attributes"))
    events = []
    for i, event in enumerate(_j_list(span, "events")):
        try:
            event = _j_object(event, "event")
            event_name = event.get("name", "")
            if type(event_name) is not str:
                raise _Invalid(f"name must be a string, got {_type_name(event_name)}")
            events.append(
                {
                    "name": event_name,
                    "time_ns": _j_int(
                        event.get("timeUnixNano", 0),
                        "timeUnixNano",
                        minimum=0,
                        maximum=MAX_TIME_NS,
                    ),
                    "attributes": _j_attributes(_j_list(event, "attributes")),
                }
            )
        except _Invalid as exc:
            raise _Invalid(f"events[{i}]: {exc}") from None
    links = []
    for i, link in enumerate(_j_list(span, "links")):
        try:
            link = _j_object(link, "link")
            links.append(
                {
                    "trace_id": _j_id(link, "traceId", 16),
                    "span_id": _j_id(link, "spanId", 8),
                    "attributes": _j_attributes(_j_list(link, "attributes")),
                }
            )
        except _Invalid as exc:
            raise _Invalid(f"links[{i}]: {exc}") from None
    attributes = _own_or_mapped(attributes, name, scope)
    if code == 2 and sc.ERROR_TYPE not in attributes and events:
        error_type_from_events(attributes, events)
    return span_record(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_id,
        name=name,
        kind=KIND_NAMES[kind],
        start_ns=start,
        end_ns=end,
        status=STATUS_NAMES[code],
        status_message=message,
        attributes=attributes,
        events=events,
        links=links,
        resource=resource,
        scope=scope,
    )


def records_from_json_object(request: Any) -> list[dict[str, Any]]:
    """Spool records from a parsed OTLP/JSON `ExportTraceServiceRequest` object."""
    if type(request) is not dict:
        raise OTLPFormatError(
            f"an ExportTraceServiceRequest must be a JSON object, got {_type_name(request)}"
        )
    records: list[dict[str, Any]] = []
    append = records.append
    try:
        resource_spans_list = _j_list(request, "resourceSpans")
    except _Invalid as exc:
        raise OTLPFormatError(str(exc)) from None
    for r, resource_spans in enumerate(resource_spans_list):
        where = f"resourceSpans[{r}]"
        try:
            resource_spans = _j_object(resource_spans, "resourceSpans entry")
            resource_obj = _j_object(resource_spans.get("resource") or {}, "resource")
            resource = _j_attributes(_j_list(resource_obj, "attributes"))
            scope_spans_list = _j_list(resource_spans, "scopeSpans")
            if not scope_spans_list and "instrumentationLibrarySpans" in resource_spans:
                # Deprecated name, still written by old SDKs and collectors.
                scope_spans_list = _j_list(resource_spans, "instrumentationLibrarySpans")
        except _Invalid as exc:
            raise OTLPFormatError(f"{where}: {exc}") from None
        for s, scope_spans in enumerate(scope_spans_list):
            where = f"resourceSpans[{r}].scopeSpans[{s}]"
            try:
                scope_spans = _j_object(scope_spans, "scopeSpans entry")
                scope_obj = scope_spans.get("scope") or scope_spans.get("instrumentationLibrary")
                scope_obj = _j_object(scope_obj or {}, "scope")
                scope = scope_obj.get("name") or None
                if scope is not None and type(scope) is not str:
                    raise _Invalid(f"scope.name must be a string, got {_type_name(scope)}")
                spans = _j_list(scope_spans, "spans")
            except _Invalid as exc:
                raise OTLPFormatError(f"{where}: {exc}") from None
            for i, span in enumerate(spans):
                try:
                    append(_j_span(span, dict(resource), scope))
                except _Invalid as exc:
                    raise OTLPFormatError(f"{where}.spans[{i}]: {exc}") from None
                except RecursionError:
                    raise OTLPFormatError(f"{where}.spans[{i}]: values nested too deeply") from None
    return records


def parse_json_body(body: bytes | str) -> Any:
    """The JSON document in `body`; raises OTLPFormatError when it is not JSON."""
    try:
        return json.loads(body)
    except UnicodeDecodeError as exc:
        raise OTLPFormatError(f"body is not UTF-8 JSON ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise OTLPFormatError(
            f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise OTLPFormatError("invalid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise OTLPFormatError(f"invalid JSON: {exc}") from None


def records_from_json(body: bytes | str) -> list[dict[str, Any]]:
    """Spool records from an OTLP/JSON request body; raises OTLPFormatError."""
    return records_from_json_object(parse_json_body(body))


# ---------------------------------------------------------------------------------------------
# Redaction of received spans


def redact_records(records: list[dict[str, Any]], redactor: Redactor) -> int:
    """Replace secrets in received records in place, through the tracer's one redaction path
    (`tracegym.tracer.redact.redact_records`: names, attributes at any depth, event names and
    attributes, link attributes, status messages, resources). Returns how many records had a
    secret removed. Raises OTLPFormatError for values too deep to check (never store what
    could not be checked)."""
    try:
        return _redact_records(records, redactor)
    except RecursionError:
        raise OTLPFormatError("values nested too deeply to check for secrets") from None


def count_spans_json(request: Any) -> int:
    """How many spans a parsed OTLP/JSON request holds, as far as its shape allows."""
    total = 0
    try:
        for resource_spans in request.get("resourceSpans") or ():
            for scope_spans in resource_spans.get("scopeSpans") or ():
                total += len(scope_spans.get("spans") or ())
    except (AttributeError, TypeError):
        pass
    return total
