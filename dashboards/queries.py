"""Every SQL statement the dashboard runs, by page. Parameterised only: filter values, ids and
search text travel as DuckDB parameters, never inside the SQL text.

Each page's statements are plain `Query` values so that the benchmark can run exactly these
directly on DuckDB (the floor) beside the page's server response. Everything aggregates in
DuckDB and returns at most a page of rows: a 1,000,000-span store never comes into Python.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

PAGE_SIZE = 50
MAX_RUN_SPANS = 5000  # the waterfall shows a run's first spans; a bigger run says it was cut
VALUE_CHARS = 20000  # characters of one argument/result sent to the page


@dataclass(frozen=True)
class Query:
    """One statement and its parameters."""

    name: str
    sql: str
    params: dict[str, Any] = field(default_factory=dict)


# Overview -------------------------------------------------------------------------------------
def overview() -> list[Query]:
    """Runs and success rate per day, the most failing tools, the nightly history."""
    return [
        Query(
            "daily",
            """
            SELECT CAST(start_time AS DATE) AS day, count(*) AS runs,
                   count(*) FILTER (WHERE success) AS succeeded,
                   count(*) FILTER (WHERE NOT success) AS failed,
                   sum(spans) AS spans, sum(errors) AS errors
            FROM traces GROUP BY day ORDER BY day
            """,
        ),
        Query(
            "tools",
            """
            SELECT t.tool, count(*) AS calls,
                   count(*) FILTER (WHERE t.status = 'ERROR') AS errors,
                   count(DISTINCT t.trace_id) FILTER (WHERE o.success = false) AS failed_runs,
                   round(quantile_cont(t.duration_ms, 0.95), 2) AS p95_ms
            FROM tool_calls t LEFT JOIN outcomes o USING (trace_id)
            WHERE t.tool IS NOT NULL
            GROUP BY t.tool ORDER BY errors DESC, failed_runs DESC, calls DESC LIMIT 15
            """,
        ),
        Query(
            "nightly",
            "SELECT date, finished_at, gaps, environments, adapters_trained, adapters_promoted, "
            "stages FROM nightly ORDER BY date",
        ),
    ]


# Runs list ------------------------------------------------------------------------------------
@dataclass
class RunFilters:
    """The runs page's filters, as typed in the form (all optional)."""

    agent: str = ""
    outcome: str = ""  # success | failure | unknown
    since: str = ""  # YYYY-MM-DD (inclusive)
    until: str = ""  # YYYY-MM-DD (inclusive)
    tool: str = ""
    finding: str = ""  # a gap id (its evidence runs) or a detector name
    q: str = ""  # free text in span names, arguments, results, errors
    page: int = 1

    def active(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if k != "page" and v}


def _date(text: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(text.strip())
    except ValueError:
        return None


def runs(filters: RunFilters, finding_traces: list[str] | None) -> Query:
    """One page of runs, newest first, with the total count in the same pass.

    `finding_traces` are the trace ids whose evidence matches `filters.finding` (resolved from
    gaps.json by the caller); None when that filter is off.
    """
    where, params = ["true"], {}
    if filters.agent:
        where.append("agent = $agent")
        params["agent"] = filters.agent
    if filters.outcome == "success":
        where.append("success = true")
    elif filters.outcome == "failure":
        where.append("success = false")
    elif filters.outcome == "unknown":
        where.append("success IS NULL")
    if (since := _date(filters.since)) is not None:
        where.append("start_time >= $since")
        params["since"] = dt.datetime.combine(since, dt.time())
    if (until := _date(filters.until)) is not None:
        where.append("start_time < $until")
        params["until"] = dt.datetime.combine(until + dt.timedelta(days=1), dt.time())
    if filters.tool:
        where.append("trace_id IN (SELECT trace_id FROM spans WHERE tool = $tool)")
        params["tool"] = filters.tool
    if finding_traces is not None:
        where.append("list_contains($finding_traces, trace_id)")
        params["finding_traces"] = finding_traces
    if filters.q:
        where.append(
            "trace_id IN (SELECT trace_id FROM spans WHERE contains(lower(name), $q) "
            "OR contains(lower(input), $q) OR contains(lower(output), $q) "
            "OR contains(lower(status_message), $q) OR contains(lower(error_type), $q) "
            "OR trace_id = $q_exact OR run_id = $q_exact)"
        )
        params["q"] = filters.q.lower()
        params["q_exact"] = filters.q.strip()
    params["limit"] = PAGE_SIZE
    params["offset"] = (max(filters.page, 1) - 1) * PAGE_SIZE
    sql = f"""
        SELECT trace_id, run_id, agent, start_time, round(duration_ms, 1) AS duration_ms,
               spans, tool_calls, llm_calls, errors, tokens, success, reward,
               count(*) OVER () AS total
        FROM traces WHERE {" AND ".join(where)}
        ORDER BY start_time DESC, trace_id LIMIT $limit OFFSET $offset
    """
    return Query("runs", sql, params)


def run_options() -> list[Query]:
    """Values for the filter drop-downs."""
    return [
        Query("agents", "SELECT DISTINCT agent FROM spans WHERE agent IS NOT NULL ORDER BY 1"),
        Query("tools", "SELECT DISTINCT tool FROM spans WHERE tool IS NOT NULL ORDER BY 1"),
    ]


# One run --------------------------------------------------------------------------------------
def resolve_run(ident: str) -> Query:
    """A trace id or a run id -> the trace id (exact matches only)."""
    return Query(
        "resolve",
        "SELECT trace_id FROM spans WHERE trace_id = $id OR run_id = $id LIMIT 1",
        {"id": ident},
    )


def run(trace_id: str) -> list[Query]:
    """The run's spans (capped), its outcome and its memory operations with provenance."""
    p = {"t": trace_id}
    return [
        Query(
            "spans",
            f"""
            SELECT span_id, parent_span_id, name, operation, agent, tool, model, step_index,
                   start_ns, end_ns, duration_ms, status, status_message, error_type,
                   left(input, {VALUE_CHARS}) AS input, left(output, {VALUE_CHARS}) AS output,
                   length(input) AS input_chars, length(output) AS output_chars,
                   input_tokens, output_tokens, memory_store, memory_record,
                   left(CAST(attributes AS VARCHAR), {VALUE_CHARS}) AS attributes,
                   left(CAST(events AS VARCHAR), {VALUE_CHARS}) AS events, run_id
            FROM spans WHERE trace_id = $t ORDER BY start_ns, span_id LIMIT {MAX_RUN_SPANS + 1}
            """,
            p,
        ),
        Query(
            "outcome",
            "SELECT success, reward, source, labels, recorded_at FROM outcomes WHERE trace_id = $t",
            p,
        ),
        Query(
            "memory",
            "SELECT span_id, operation, store, record_id, content_hash, result_record_ids, "
            "source_write_span_ids, source_write_trace_ids FROM memory_ops WHERE trace_id = $t",
            p,
        ),
    ]


def all_queries(trace_id: str = "", filters: RunFilters | None = None) -> dict[str, list[Query]]:
    """Each SQL-backed page's statements (for the benchmark's floor)."""
    return {
        "overview": overview(),
        "runs": [runs(filters or RunFilters(), None), *run_options()],
        "run": [resolve_run(trace_id), *run(trace_id)],
    }
