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

from tracegym.store.views import COST_FUNCTION, PROVIDER
from tracegym.tracer import semconv as sc

PAGE_SIZE = 50
MAX_RUN_SPANS = 5000  # the waterfall shows a run's first spans; a bigger run says it was cut
VALUE_CHARS = 20000  # characters of one argument/result sent to the page
REQUEST_CHARS = 2000  # characters of a run's request and first error read for the runs list
# An LLM span's cost in USD (the store's `tracegym_cost`, store/pricing.py); NULL otherwise.
LLM_COST = (
    f"CASE WHEN operation = '{sc.OP_CHAT}' THEN "
    f"{COST_FUNCTION}(model, {PROVIDER}, input_tokens, output_tokens) END"
)


@dataclass(frozen=True)
class Query:
    """One statement and its parameters."""

    name: str
    sql: str
    params: dict[str, Any] = field(default_factory=dict)


# Overview -------------------------------------------------------------------------------------
def overview() -> list[Query]:
    """Runs and success rate per day (per hour when the runs span at most two days, per minute
    when they span three hours at most), the
    most failing tools and the number of outcome records in one statement, so that the
    `outcomes` view (a pass over every span) is computed once; then the nightly history."""
    return [
        Query(
            "summary",
            """
            WITH o AS MATERIALIZED (SELECT trace_id, success FROM outcomes),
            per_trace AS (
                SELECT trace_id, min(start_ns) AS start_ns, count(*) AS spans,
                       count(*) FILTER (WHERE status = 'ERROR') AS errors
                FROM spans GROUP BY trace_id
            ),
            daily AS (
                SELECT CAST(make_timestamp(p.start_ns // 1000) AS DATE) AS day,
                       count(*) AS runs, count(*) FILTER (WHERE o.success) AS succeeded,
                       count(*) FILTER (WHERE NOT o.success) AS failed,
                       sum(p.spans) AS spans, sum(p.errors) AS errors
                FROM per_trace p LEFT JOIN o USING (trace_id) GROUP BY day
            ),
            tools AS (
                SELECT t.tool, count(*) AS calls,
                       count(*) FILTER (WHERE t.status = 'ERROR') AS errors,
                       count(DISTINCT t.trace_id) FILTER (WHERE o.success = false) AS failed_runs,
                       round(quantile_cont(t.duration_ms, 0.95), 2) AS p95_ms
                FROM tool_calls t LEFT JOIN o USING (trace_id)
                WHERE t.tool IS NOT NULL GROUP BY t.tool
            ),
            unit AS (
                SELECT CASE WHEN max(start_ns) - min(start_ns) > 10800000000000
                            THEN 'hour' ELSE 'minute' END AS unit
                FROM per_trace
            ),
            hourly AS (
                SELECT date_trunc((SELECT unit FROM unit), make_timestamp(p.start_ns // 1000))
                           AS hour,
                       count(*) AS runs, count(*) FILTER (WHERE o.success) AS succeeded,
                       count(*) FILTER (WHERE NOT o.success) AS failed
                FROM per_trace p LEFT JOIN o USING (trace_id) GROUP BY hour
            )
            SELECT (SELECT list(daily ORDER BY day) FROM daily) AS daily,
                   (SELECT list(tools ORDER BY errors DESC, failed_runs DESC, calls DESC)[:15]
                    FROM tools) AS tools,
                   CASE WHEN (SELECT count(*) FROM daily) <= 2
                        THEN (SELECT list(hourly ORDER BY hour) FROM hourly) END AS hourly,
                   (SELECT unit FROM unit) AS unit,
                   (SELECT count(*) FROM _outcome_spans) AS outcome_records
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
    page: int = 1  # from 1 (app.py refuses the rest: the OFFSET is a BIGINT)

    def active(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if k != "page" and v}


def _date(text: str) -> dt.date | None:
    try:
        return dt.date.fromisoformat(text.strip())
    except ValueError:
        return None


def _attr(key: str) -> str:
    return f"json_extract_string(attributes, '$.\"{key}\"')"


# Outcome records as rows: what each names (a run id or a trace id) and its verdict.
OUTCOME_RECORDS = f"""
    SELECT {_attr(sc.OUTCOME_TARGET)} AS target,
           TRY_CAST({_attr(sc.OUTCOME_SUCCESS)} AS BOOLEAN) AS success,
           TRY_CAST({_attr(sc.OUTCOME_REWARD)} AS DOUBLE) AS reward,
           {_attr(sc.OUTCOME_LABELS)} AS labels, start_ns
    FROM _outcome_spans
"""


def _latest_outcome(targets: str) -> str:
    """The latest outcome record per trace, as a struct `verdict` (success, reward).

    `targets` is a relation of (trace_id, target): what an outcome of that trace may name (its
    trace id, a run id on its spans)."""
    return f"""
        SELECT t.trace_id,
               arg_max({{'success': r.success, 'reward': r.reward, 'labels': r.labels}},
                       r.start_ns) AS verdict
        FROM {targets} t JOIN ({OUTCOME_RECORDS}) r ON r.target = t.target
        GROUP BY t.trace_id
    """


_OUTCOME_TEST = {"success": "= true", "failure": "= false", "unknown": "IS NULL"}


def runs(filters: RunFilters, finding_traces: list[str] | None) -> Query:
    """One page of runs, newest first, and the number of runs matching, in one statement.

    The `traces` view aggregates every span of every trace; this pages over a cheap key
    instead: one GROUP BY over the spans gives each trace's start and, for the filters that are
    on, what they test (the root's agent, whether a span called the tool or contains the text,
    the run ids an outcome may name), so one pass serves them all. The outcome filter then
    judges the runs the other filters kept; spans are aggregated and outcomes found for the
    page's traces only. Same rows and order as `traces` (newest first by start_time, then
    trace id), each with `total` (then the root's input, the first error's span name and
    message, the outcome's labels: extra columns the list shows); a page past the end returns
    one row with only `total` set.
    A run's outcome is its latest outcome record naming its trace id or a run id on its spans
    (the run page's rule; the `outcomes` view's too, for a run id used by one trace).

    `finding_traces` are the trace ids whose evidence matches `filters.finding` (resolved from
    gaps.json by the caller); None when that filter is off.
    """
    keys, where, params = ["min(start_ns) AS start_ns"], ["true"], {}
    if filters.agent:  # the agent of the trace's first root span, as in `traces`
        keys.append("arg_min_null(agent, start_ns) FILTER (WHERE parent_span_id IS NULL) AS agent")
        where.append("agent = $agent")
        params["agent"] = filters.agent
    if (since := _date(filters.since)) is not None:
        where.append("make_timestamp(start_ns // 1000) >= $since")
        params["since"] = dt.datetime.combine(since, dt.time())
    if (until := _date(filters.until)) is not None and until < dt.date.max:  # max: no bound
        where.append("make_timestamp(start_ns // 1000) < $until")
        params["until"] = dt.datetime.combine(until + dt.timedelta(days=1), dt.time())
    if filters.tool:
        keys.append("bool_or(tool = $tool) AS has_tool")
        where.append("has_tool")
        params["tool"] = filters.tool
    if finding_traces is not None:
        where.append("list_contains($finding_traces, trace_id)")
        params["finding_traces"] = finding_traces
    if filters.q:
        keys.append(
            "bool_or(contains(lower(name), $q) OR contains(lower(input), $q) "
            "OR contains(lower(output), $q) OR contains(lower(status_message), $q) "
            "OR contains(lower(error_type), $q) OR trace_id = $q_exact OR run_id = $q_exact) "
            "AS has_text"
        )
        where.append("has_text")
        params["q"] = filters.q.lower()
        params["q_exact"] = filters.q.strip()
    params["limit"] = PAGE_SIZE
    params["offset"] = (max(filters.page, 1) - 1) * PAGE_SIZE
    if filters.outcome in _OUTCOME_TEST:  # judged after the other filters, for their runs
        keys.append("list(DISTINCT run_id) FILTER (WHERE run_id IS NOT NULL) AS run_ids")
        targets = (
            "(SELECT trace_id, unnest(list_append(coalesce(run_ids, []), trace_id)) AS target "
            "FROM candidates)"
        )
        judging = f"""
        candidates AS MATERIALIZED (
            SELECT trace_id, start_ns, run_ids FROM keys WHERE {" AND ".join(where)}
        ),
        judged AS MATERIALIZED ({_latest_outcome(targets)}),
        matching AS MATERIALIZED (
            SELECT c.trace_id, c.start_ns FROM candidates c LEFT JOIN judged j USING (trace_id)
            WHERE j.verdict.success {_OUTCOME_TEST[filters.outcome]}
        ),"""
        page_outcomes = "SELECT * FROM judged WHERE trace_id IN (SELECT trace_id FROM page)"
    else:
        judging = f"""
        matching AS MATERIALIZED (
            SELECT trace_id, start_ns FROM keys WHERE {" AND ".join(where)}
        ),"""
        page_outcomes = _latest_outcome(
            "(SELECT trace_id, trace_id AS target FROM page UNION ALL "
            "SELECT DISTINCT trace_id, run_id FROM page_spans WHERE run_id IS NOT NULL)"
        )
    sql = f"""
        WITH keys AS MATERIALIZED (
            SELECT trace_id, {", ".join(keys)} FROM spans GROUP BY trace_id
        ),
        {judging}
        page AS MATERIALIZED (
            SELECT trace_id FROM matching
            ORDER BY start_ns // 1000 DESC, trace_id LIMIT $limit OFFSET $offset
        ),
        page_spans AS MATERIALIZED (
            SELECT trace_id, parent_span_id, start_ns, end_ns, operation, status, agent, run_id,
                   input_tokens, output_tokens, {LLM_COST} AS cost,
                   CASE WHEN parent_span_id IS NULL THEN left(input, {REQUEST_CHARS}) END
                       AS root_input,
                   CASE WHEN status = 'ERROR' THEN
                       left(coalesce(name || ': ', '') || coalesce(status_message, error_type,
                            'error'), {REQUEST_CHARS}) END AS error_text
            FROM spans WHERE trace_id IN (SELECT trace_id FROM page)
        ),
        per_trace AS (
            SELECT trace_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
                   count(*) AS spans,
                   count(*) FILTER (WHERE operation = '{sc.OP_TOOL}') AS tool_calls,
                   count(*) FILTER (WHERE operation = '{sc.OP_CHAT}') AS llm_calls,
                   count(*) FILTER (WHERE status = 'ERROR') AS errors,
                   coalesce(CAST(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0))
                       FILTER (WHERE operation = '{sc.OP_CHAT}') AS BIGINT), 0) AS tokens,
                   sum(cost) AS cost,
                   arg_min_null(agent, start_ns) FILTER (WHERE parent_span_id IS NULL) AS agent,
                   arg_min_null(run_id, start_ns) FILTER (WHERE parent_span_id IS NULL)
                       AS run_id,
                   arg_min_null(root_input, start_ns) AS request,
                   arg_min_null(error_text, start_ns) AS first_error
            FROM page_spans GROUP BY trace_id
        ),
        page_outcomes AS ({page_outcomes})
        SELECT p.trace_id, p.run_id, p.agent, make_timestamp(p.start_ns // 1000) AS start_time,
               round((p.end_ns - p.start_ns) / 1e6, 1) AS duration_ms,
               p.spans, p.tool_calls, p.llm_calls, p.errors, p.tokens,
               o.verdict.success AS success, o.verdict.reward AS reward, n.total,
               p.request, p.first_error, o.verdict.labels AS labels, p.cost
        FROM (SELECT count(*) AS total FROM matching) n
        LEFT JOIN (per_trace p LEFT JOIN page_outcomes o USING (trace_id)) ON true
        ORDER BY p.start_ns // 1000 DESC, p.trace_id
    """
    return Query("runs", sql, params)


def run_options() -> Query:
    """Values for the filter drop-downs (agents, tools), in one pass over the spans."""
    return Query(
        "options",
        "SELECT coalesce(list(DISTINCT agent ORDER BY agent) FILTER (WHERE agent IS NOT NULL), "
        "[]) AS agents, coalesce(list(DISTINCT tool ORDER BY tool) FILTER (WHERE tool IS NOT NULL),"
        " []) AS tools FROM spans",
    )


# One run --------------------------------------------------------------------------------------
def resolve_run(ident: str) -> Query:
    """A run id -> its trace id (exact matches only; a trace id is tried first, by `run`)."""
    return Query(
        "resolve",
        "SELECT trace_id FROM spans WHERE run_id = $id LIMIT 1",
        {"id": ident},
    )


STEP_COLUMNS = [
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "operation",
    "agent",
    "step_index",
    "tool",
    "call_id",
    "input",
    "output",
    "status",
    "error_type",
    "start_ns",
    "end_ns",
    "duration_ms",
    "input_tokens",
    "output_tokens",
    "memory_store",
    "memory_record",
    "memory_content_hash",
    "memory_result_hashes",
    "subtask",
    "attributes",
]  # what `tracegym.analysis.runs.build_runs` reads of a span


def run_spans(trace_ids: list[str]) -> Query:
    """The runs' spans, with what the waterfall and the detectors read (first spans only)."""
    columns = ", ".join(STEP_COLUMNS)
    return Query(
        "spans",
        f"""
        SELECT {columns}, status_message, model, run_id, CAST(events AS VARCHAR) AS events,
               {LLM_COST} AS cost
        FROM spans WHERE list_contains($ids, trace_id)
        ORDER BY trace_id, start_ns, span_id LIMIT {MAX_RUN_SPANS * len(trace_ids) + 1}
        """,
        {"ids": trace_ids},
    )


def run_outcomes(targets: list[str]) -> Query:
    """The latest outcome recorded for each target (run ids and trace ids), read from the
    outcome records directly: the `outcomes` view maps every run id of the store first, a
    pass over all spans a single run does not need. Same fields and rule (latest wins)."""
    return Query(
        "outcomes",
        f"""
        SELECT {_attr(sc.OUTCOME_TARGET)} AS target,
               TRY_CAST({_attr(sc.OUTCOME_SUCCESS)} AS BOOLEAN) AS success,
               TRY_CAST({_attr(sc.OUTCOME_REWARD)} AS DOUBLE) AS reward,
               {_attr(sc.OUTCOME_SOURCE)} AS source, {_attr(sc.OUTCOME_LABELS)} AS labels,
               start_time AS recorded_at, start_ns
        FROM _outcome_spans WHERE list_contains($targets, {_attr(sc.OUTCOME_TARGET)})
        ORDER BY start_ns
        """,
        {"targets": targets},
    )


def run_provenance(trace_ids: list[str]) -> Query:
    """For each memory read of these runs, the write that stored each record it returned: the
    latest earlier update_memory of the same store with the same content hash, in any run
    (the `memory_ops` view's rule, evaluated for these runs' reads only)."""
    return Query(
        "provenance",
        f"""
        WITH returned AS (
            SELECT span_id, memory_store AS store, start_ns,
                   unnest(memory_result_hashes) AS hash,
                   generate_subscripts(memory_result_hashes, 1) AS position
            FROM spans
            WHERE list_contains($ids, trace_id) AND operation = '{sc.OP_MEMORY_SEARCH}'
        ),
        writes AS (
            SELECT memory_store AS store, memory_content_hash AS content_hash, end_ns,
                   trace_id AS w_trace, span_id AS w_span
            FROM spans
            WHERE operation = '{sc.OP_MEMORY_UPDATE}' AND memory_content_hash IS NOT NULL
              AND memory_content_hash IN (SELECT hash FROM returned)
        )
        SELECT r.span_id,
               list(w.w_span ORDER BY r.position) AS source_write_span_ids,
               list(w.w_trace ORDER BY r.position) AS source_write_trace_ids
        FROM returned r
        ASOF LEFT JOIN writes w
            ON r.store = w.store AND r.hash = w.content_hash AND r.start_ns >= w.end_ns
        GROUP BY r.span_id
        """,
        {"ids": trace_ids},
    )


def run(trace_id: str) -> list[Query]:
    """One run's statements (the outcome's targets come from its spans: see `run_targets`)."""
    return [run_spans([trace_id]), run_provenance([trace_id])]


def run_targets(trace_id: str, spans: list[dict[str, Any]]) -> list[str]:
    """What an outcome of this run may name: its trace id or a run id on its spans."""
    return sorted({trace_id} | {s["run_id"] for s in spans if s.get("run_id")})


def all_queries(trace_id: str = "", filters: RunFilters | None = None) -> dict[str, list[Query]]:
    """Each SQL-backed page's statements (for the benchmark's floor)."""
    return {
        "overview": overview(),
        "runs": [runs(filters or RunFilters(), None), run_options()],
        "run": [resolve_run(trace_id), *run(trace_id), run_outcomes([trace_id])],
    }


# Sessions -------------------------------------------------------------------------------------
# Where a root span names its session: the conversation first (the GenAI convention's key, then
# OpenTelemetry's `session.id`), else the end user.
SESSION_KEYS = [
    (sc.CONVERSATION_ID, "conversation"),
    ("session.id", "conversation"),
    ("user.id", "user"),
    ("enduser.id", "user"),
]
MAX_SESSIONS = 200
MAX_SESSION_RUNS = 500


def _roots_with_sessions() -> str:
    """Each trace's first root span with its conversation and user ids (NULL when absent)."""
    conversation = ", ".join(_attr(k) for k, kind in SESSION_KEYS if kind == "conversation")
    user = ", ".join(_attr(k) for k, kind in SESSION_KEYS if kind == "user")
    return f"""
        SELECT trace_id, run_id, agent, start_ns, end_ns, status,
               left(input, {REQUEST_CHARS}) AS input,
               coalesce({conversation}) AS conversation, coalesce({user}) AS user_id
        FROM spans WHERE parent_span_id IS NULL
        QUALIFY row_number() OVER (PARTITION BY trace_id ORDER BY start_ns, span_id) = 1
    """


def _session_outcomes(relation: str) -> str:
    return _latest_outcome(
        f"(SELECT trace_id, trace_id AS target FROM {relation} UNION ALL "
        f"SELECT trace_id, run_id FROM {relation} WHERE run_id IS NOT NULL)"
    )


def sessions() -> Query:
    """Sessions, newest activity first: runs grouped by conversation id, and by user id."""
    return Query(
        "sessions",
        f"""
        WITH roots AS MATERIALIZED ({_roots_with_sessions()}),
        keyed AS MATERIALIZED (
            SELECT 'conversation' AS kind, conversation AS id, * FROM roots
            WHERE conversation IS NOT NULL
            UNION ALL
            SELECT 'user' AS kind, user_id AS id, * FROM roots WHERE user_id IS NOT NULL
        ),
        judged AS ({_session_outcomes("keyed")})
        SELECT k.kind, k.id, count(*) AS runs,
               count(*) FILTER (WHERE j.verdict.success) AS succeeded,
               count(*) FILTER (WHERE NOT j.verdict.success) AS failed,
               make_timestamp(min(k.start_ns) // 1000) AS first_start,
               make_timestamp(max(k.start_ns) // 1000) AS last_start,
               list(DISTINCT k.agent ORDER BY k.agent) FILTER (WHERE k.agent IS NOT NULL)
                   AS agents,
               arg_min(k.input, k.start_ns) AS first_input,
               count(*) OVER () AS total
        FROM keyed k LEFT JOIN judged j USING (trace_id)
        GROUP BY k.kind, k.id
        ORDER BY max(k.start_ns) DESC, k.kind, k.id
        LIMIT {MAX_SESSIONS}
        """,
    )


def session(kind: str, ident: str) -> Query:
    """One session's runs in time order (its first `MAX_SESSION_RUNS`), with their outcomes."""
    column = "conversation" if kind == "conversation" else "user_id"
    return Query(
        "session",
        f"""
        WITH roots AS MATERIALIZED (
            SELECT * FROM ({_roots_with_sessions()}) WHERE {column} = $id
            ORDER BY start_ns LIMIT {MAX_SESSION_RUNS}
        ),
        errors AS (
            SELECT trace_id, arg_min(left(coalesce(name || ': ', '') ||
                       coalesce(status_message, error_type, 'error'), {REQUEST_CHARS}),
                       start_ns) AS first_error, count(*) AS errors
            FROM spans WHERE status = 'ERROR' AND trace_id IN (SELECT trace_id FROM roots)
            GROUP BY trace_id
        ),
        judged AS ({_session_outcomes("roots")})
        SELECT r.trace_id, r.run_id, r.agent, make_timestamp(r.start_ns // 1000) AS start_time,
               round((r.end_ns - r.start_ns) / 1e6, 1) AS duration_ms, r.input,
               r.conversation, r.user_id, coalesce(e.errors, 0) AS errors, e.first_error,
               j.verdict.success AS success, j.verdict.reward AS reward
        FROM roots r LEFT JOIN errors e USING (trace_id) LEFT JOIN judged j USING (trace_id)
        ORDER BY r.start_ns, r.trace_id
        """,
        {"id": ident},
    )


MAX_CHART_RUNS = 200


def recent_runs() -> Query:
    """The latest runs one by one (start, spans, errors, outcome) for the overview's chart when
    all runs fall in one or two time buckets (a bar per bucket would say nothing)."""
    return Query(
        "recent_runs",
        f"""
        WITH per_trace AS MATERIALIZED (
            SELECT trace_id, min(start_ns) AS start_ns, count(*) AS spans,
                   count(*) FILTER (WHERE status = 'ERROR') AS errors,
                   arg_min_null(run_id, start_ns) FILTER (WHERE parent_span_id IS NULL)
                       AS run_id
            FROM spans GROUP BY trace_id ORDER BY start_ns DESC LIMIT {MAX_CHART_RUNS}
        ),
        judged AS ({_session_outcomes("per_trace")})
        SELECT p.trace_id, p.run_id, make_timestamp(p.start_ns // 1000) AS start_time, p.spans,
               p.errors, j.verdict.success AS success
        FROM per_trace p LEFT JOIN judged j USING (trace_id)
        ORDER BY p.start_ns, p.trace_id
        """,
    )
