"""Runs as OTLP/JSON: one `ExportTraceServiceRequest` per run, one JSON line each.

That is what the OpenTelemetry Collector's file exporter writes (and its `otlpjsonfile`
receiver reads), and what `tracegym import otlp-json` reads back into the same spans: ids,
names, parents, kinds, times, status, attributes, events, links, resource and scope name.
The encoding is OTLP/JSON as the specification gives it: lowerCamelCase keys, trace and span
ids as hex (not the protobuf mapping's base64), 64-bit integers (times, `intValue`) as decimal
strings, enums as integers, attribute values as typed `AnyValue`s (objects as `kvlistValue`,
lists as `arrayValue`, null as an empty value). An integer beyond int64, which OTLP cannot carry,
is written as its decimal text (`stringValue`).

Each run's recorded outcomes (`tracegym.outcome` spans, kept in traces of their own) go in the
same line as the run, so a round trip keeps the verdicts too; `outcomes=False` leaves them out.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from tracegym.store.exporters import SelectedRun
from tracegym.tracer import semconv as sc

KIND_CODES = {"INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
STATUS_CODES = {"UNSET": 0, "OK": 1, "ERROR": 2}
_INT64 = (-(2**63), 2**63 - 1)

_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status",
    "status_message", "attributes", "events", "links", "resource", "scope",
)  # fmt: skip


def _columns(alias: str) -> str:
    return ", ".join(f"{alias}.{c}" for c in _COLUMNS)


def any_value(value: Any) -> dict[str, Any]:
    """A JSON value from the store as an OTLP/JSON `AnyValue`."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        if _INT64[0] <= value <= _INT64[1]:
            return {"intValue": str(value)}
        return {"stringValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value} if math.isfinite(value) else {"stringValue": str(value)}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": key_values(value)}}
    return {"stringValue": str(value)}


def key_values(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": str(k), "value": any_value(v)} for k, v in (attributes or {}).items()]


def _loads(text: Any, empty: Any) -> Any:
    if text is None:
        return empty
    return json.loads(text) if isinstance(text, str) else text


def otlp_span(row: Mapping[str, Any]) -> dict[str, Any]:
    """One store row (the `spans` view's columns) as an OTLP/JSON span."""
    span: dict[str, Any] = {"traceId": row["trace_id"], "spanId": row["span_id"]}
    if row["parent_span_id"]:
        span["parentSpanId"] = row["parent_span_id"]
    span["name"] = row["name"] or ""
    span["kind"] = KIND_CODES.get(str(row["kind"] or "INTERNAL").upper(), 1)
    span["startTimeUnixNano"] = str(row["start_ns"])
    span["endTimeUnixNano"] = str(row["end_ns"])
    span["attributes"] = key_values(_loads(row["attributes"], {}))
    events = _loads(row["events"], [])
    if events:
        span["events"] = [
            {
                "timeUnixNano": str(int(e.get("time_ns") or 0)),
                "name": e.get("name") or "",
                "attributes": key_values(e.get("attributes")),
            }
            for e in events
        ]
    links = _loads(row["links"], [])
    if links:
        span["links"] = [
            {
                "traceId": link["trace_id"],
                "spanId": link["span_id"],
                "attributes": key_values(link.get("attributes")),
            }
            for link in links
        ]
    status: dict[str, Any] = {}
    code = STATUS_CODES.get(str(row["status"] or "UNSET").upper(), 0)
    if code:
        status["code"] = code
    if row["status_message"]:
        status["message"] = row["status_message"]
    span["status"] = status
    return span


def request(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows as one `ExportTraceServiceRequest`: grouped by resource, then scope, in order."""
    resources: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        resource = (
            row["resource"]
            if isinstance(row["resource"], str)
            else json.dumps(row["resource"] or {}, sort_keys=True)
        )
        resources.setdefault(resource or "{}", {}).setdefault(row["scope"] or "", []).append(
            otlp_span(row)
        )
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": key_values(_loads(resource, {}))},
                "scopeSpans": [
                    {"scope": {"name": scope} if scope else {}, "spans": spans}
                    for scope, spans in scopes.items()
                ],
            }
            for resource, scopes in resources.items()
        ]
    }


def run_rows(store: Any, runs: Sequence[SelectedRun], *, outcomes: bool = True) -> Iterator[Any]:
    """(run position, rows) per run, in the order of `runs`, read in one streaming query."""
    traces = [r.trace_id for r in runs]
    run_ids = [r.run_id for r in runs]
    outcome_part = ""
    if outcomes:
        outcome_part = f"""
        UNION ALL
        SELECT {_columns("o")}, c.pos
        FROM _outcome_spans o JOIN chosen c
          ON json_extract_string(o.attributes, '$."{sc.OUTCOME_TARGET}"')
             IN (c.trace_id, c.run_id)
        """
    query = f"""
        WITH chosen AS (
            SELECT unnest($traces) AS trace_id, unnest($runs) AS run_id,
                   generate_subscripts($traces, 1) AS pos
        )
        SELECT * FROM (
            SELECT {_columns("s")}, c.pos FROM spans s JOIN chosen c USING (trace_id)
            {outcome_part}
        ) ORDER BY pos, start_ns, span_id
    """
    rows = store.rows(query, {"traces": traces, "runs": run_ids})
    yield from itertools.groupby(rows, key=lambda r: r["pos"])


@dataclass
class ExportReport:
    runs: int = 0
    spans: int = 0
    outcomes: int = 0


def write_otlp_json(
    store: Any, runs: Sequence[SelectedRun], out: IO[str], *, outcomes: bool = True
) -> ExportReport:
    """Write `runs` to `out` as OTLP/JSON lines (one request per run)."""
    report = ExportReport()
    if not runs:
        return report
    for _, group in run_rows(store, runs, outcomes=outcomes):
        rows = list(group)
        report.runs += 1
        report.outcomes += sum(1 for r in rows if r["name"] == sc.OUTCOME_SPAN_NAME)
        report.spans += sum(1 for r in rows if r["name"] != sc.OUTCOME_SPAN_NAME)
        out.write(json.dumps(request(rows), ensure_ascii=False, separators=(",", ":")) + "\n")
    return report
