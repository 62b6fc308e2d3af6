"""The DuckDB views users write SQL against. Column lists are documented in the README.

`spans` is the lake (Parquet, hive-partitioned by day) plus the live spool not yet compacted,
read through the same row expression; outcome records live in a table of their own, and every
other view is defined over these two.

Exactly once around a compaction (of this process or another): the spool files are listed when
the views are (re)created, and the lake half leaves out every part named after a listed file
(`part-<stem>-<i>.parquet`, DuckDB prunes them by file name). A file whose parts a compaction
has renamed in, or a killed one left behind, is read from the spool alone until it is gone; once
it is gone the views fail with an IO error and the reader recreates them (see `Store.sql`,
`dashboards.db.Database.query`), and its parts are read instead.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb
from tracegym.store.home import Home
from tracegym.store.lake import complete_spool_files, lake_dir
from tracegym.store.parts import lake_parts, may_be_corrupt, screen
from tracegym.store.pricing import Prices, PricesError
from tracegym.store.schema import (
    bad_lines_select,
    empty_source,
    lake_read_select,
    read_json_source,
    row_select,
)
from tracegym.tracer import semconv as sc

T = TypeVar("T")

# A lake part's file name -> the stem of the spool file it came from (see store/lake.py).
PART_STEM = r"/part-(.+)-[0-9]+\.parquet$"

VIEWS = [
    "spans", "traces", "tool_calls", "llm_calls", "memory_ops", "outcomes", "nightly", "gap_runs",
]  # fmt: skip


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _lake_part(
    directory: Path, listed: list[str], bad: frozenset[Path] = frozenset()
) -> str | None:
    """The lake's parts under `directory`, less those of the spool files `listed` (stems) and
    the `bad` ones that could not be moved aside (then named one by one, not globbed)."""
    found = sorted(directory.rglob("*.parquet")) if directory.is_dir() else []
    kept = [p for p in found if p not in bad]
    if not kept:
        return None
    glob = _literal(str(directory / "**" / "*.parquet"))
    if len(kept) < len(found):
        glob = "[" + ", ".join(_literal(str(p)) for p in kept) + "]"
    if not listed:
        return lake_read_select(f"read_parquet({glob}, hive_partitioning=true)")
    stems = ", ".join(_literal(stem) for stem in listed)
    return lake_read_select(
        f"(SELECT * EXCLUDE (filename) FROM read_parquet({glob}, hive_partitioning=true, "
        f"filename=true) WHERE regexp_extract(filename, {_literal(PART_STEM)}, 1) "
        f"NOT IN ({stems}))"
    )


def _table_sql(
    home: Path, table: str, live: str | None, listed: list[str], bad: frozenset[Path] = frozenset()
) -> str:
    """One lake table (`spans` or `outcomes`) plus its rows from the live spool."""
    parts = [p for p in (_lake_part(lake_dir(home) / table, listed, bad), live) if p]
    if not parts:  # an empty store still has typed, queryable views
        parts.append(f"SELECT * EXCLUDE (_table) FROM ({row_select(empty_source())})")
    return "\nUNION ALL BY NAME\n".join(f"({p})" for p in parts)


def _live_sql(pending: list[Path]) -> str | None:
    """Spool files not compacted yet (complete or still being written), read in place."""
    if not pending:
        return None
    files = "[" + ", ".join(_literal(str(p)) for p in pending) + "]"
    return row_select(read_json_source(files))


# The message of the last exception a span recorded (its `exception` events), else its status
# message: what the error said, for `tool_calls.error_message` and `traces.first_error`. Events
# that are not a JSON array (a hand-written lake part) give NULL rather than fail the query.
ERROR_MESSAGE = """coalesce(
    CASE WHEN json_valid(events) AND json_type(events) = 'ARRAY' THEN list_filter(
        json_extract_string(events, '$[*].attributes."exception.message"'),
        lambda m: m IS NOT NULL AND m <> '')[-1] END,
    nullif(status_message, ''))"""


# An LLM call's cost in USD (store/pricing.py), NULL for a model without a known price: a
# Python function on each connection, so no model name is ever pasted into SQL.
COST_FUNCTION = "tracegym_cost"
PROVIDER = f"""coalesce(json_extract_string(attributes, '$."{sc.PROVIDER}"'),
                        json_extract_string(attributes, '$."gen_ai.system"'))"""


def register_cost(con: duckdb.DuckDBPyConnection, home: Path) -> Prices:
    """(Re)define `tracegym_cost(model, provider, input_tokens, output_tokens)` on `con` with
    the home's prices. A prices file that cannot be read is reported once and left out (the
    table's prices still apply): a typo in it must not take every query down."""
    try:
        prices = Prices.load(home)
    except PricesError as exc:
        _warn_once(str(exc))
        prices = Prices()
    with contextlib.suppress(duckdb.Error):
        con.remove_function(COST_FUNCTION)
    con.create_function(
        COST_FUNCTION,
        prices.cost_batch,
        ["VARCHAR", "VARCHAR", "BIGINT", "BIGINT"],
        "DOUBLE",
        type="arrow",
        null_handling="special",
        side_effects=False,
    )
    return prices


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(f"prices file left out: {message}", stacklevel=3)


def _nightly_field(name: str, kind: str = "VARCHAR") -> str:
    value = f"json_extract_string(attributes, '$.\"{sc.NIGHTLY_PREFIX}{name}\"')"
    return f"TRY_CAST({value} AS {kind}) AS {name}" if kind != "VARCHAR" else f"{value} AS {name}"


VIEW_SQL = {
    # One row per night of the batch job (`tracegym nightly`), the latest record of each date.
    "nightly": f"""
        SELECT {_nightly_field("date")}, start_time AS finished_at,
               {_nightly_field("gaps", "INTEGER")}, {_nightly_field("environments", "INTEGER")},
               {_nightly_field("adapters_trained", "INTEGER")},
               {_nightly_field("adapters_promoted", "INTEGER")},
               {_nightly_field("stages")}, {_nightly_field("report")}
        FROM _nightly_spans
        QUALIFY row_number() OVER (PARTITION BY date ORDER BY start_ns DESC) = 1
    """,
    # Latest recorded outcome per run; `target` may be a run id or a trace id.
    "outcomes": f"""
        WITH recorded AS (
            SELECT
                json_extract_string(attributes, '$."{sc.OUTCOME_TARGET}"') AS target,
                TRY_CAST(json_extract_string(attributes, '$."{sc.OUTCOME_SUCCESS}"') AS BOOLEAN)
                    AS success,
                TRY_CAST(json_extract_string(attributes, '$."{sc.OUTCOME_REWARD}"') AS DOUBLE)
                    AS reward,
                json_extract_string(attributes, '$."{sc.OUTCOME_SOURCE}"') AS source,
                json_extract_string(attributes, '$."{sc.OUTCOME_LABELS}"') AS labels,
                start_time AS recorded_at, start_ns
            FROM _outcome_spans
        ),
        runs AS (
            SELECT run_id, any_value(trace_id) AS trace_id FROM spans
            WHERE run_id IS NOT NULL GROUP BY run_id
        )
        SELECT coalesce(runs.trace_id, recorded.target) AS trace_id,
               coalesce(runs.run_id, recorded.target) AS run_id,
               success, reward, source, labels, recorded_at
        FROM recorded LEFT JOIN runs ON runs.run_id = recorded.target
        QUALIFY row_number() OVER (
            PARTITION BY coalesce(runs.trace_id, recorded.target) ORDER BY start_ns DESC) = 1
    """,
    "traces": f"""
        WITH per_trace AS (
            SELECT trace_id,
                   min(start_ns) AS start_ns, max(end_ns) AS end_ns,
                   count(*) AS spans,
                   count(*) FILTER (WHERE operation = '{sc.OP_TOOL}') AS tool_calls,
                   count(*) FILTER (WHERE operation = '{sc.OP_CHAT}') AS llm_calls,
                   count(*) FILTER (WHERE operation IN ('{sc.OP_MEMORY_SEARCH}',
                       '{sc.OP_MEMORY_UPDATE}', '{sc.OP_MEMORY_DELETE}')) AS memory_ops,
                   count(*) FILTER (WHERE status = 'ERROR') AS errors,
                   CAST(sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0))
                       FILTER (WHERE operation = '{sc.OP_CHAT}') AS BIGINT) AS tokens,
                   sum({COST_FUNCTION}(model, {PROVIDER}, input_tokens, output_tokens))
                       FILTER (WHERE operation = '{sc.OP_CHAT}') AS cost,
                   arg_min(concat_ws(': ', coalesce(tool, name),
                                     nullif(regexp_extract(error_type, '[^.]+$'), ''),
                                     {ERROR_MESSAGE}),
                           end_ns) FILTER (WHERE status = 'ERROR') AS first_error
            FROM spans GROUP BY trace_id
        ),
        roots AS (
            SELECT trace_id, span_id AS root_span_id, name AS root_name, agent, run_id, service,
                   status AS root_status
            FROM spans WHERE parent_span_id IS NULL
            QUALIFY row_number() OVER (PARTITION BY trace_id ORDER BY start_ns) = 1
        )
        SELECT p.trace_id, r.run_id, r.root_span_id, r.root_name, r.agent, r.service,
               make_timestamp(p.start_ns // 1000) AS start_time,
               (p.end_ns - p.start_ns) / 1e6 AS duration_ms,
               p.spans, p.tool_calls, p.llm_calls, p.memory_ops, p.errors,
               coalesce(p.tokens, 0) AS tokens, p.cost, r.root_status, p.first_error,
               o.success, o.reward, o.source AS outcome_source, o.labels AS outcome_labels
        FROM per_trace p
        LEFT JOIN roots r USING (trace_id)
        LEFT JOIN outcomes o USING (trace_id)
    """,
    "tool_calls": f"""
        SELECT trace_id, span_id, parent_span_id, step_index, agent, tool, call_id,
               input AS arguments, output AS result, status, error_type,
               {ERROR_MESSAGE} AS error_message, start_time, duration_ms
        FROM spans WHERE operation = '{sc.OP_TOOL}'
    """,
    "llm_calls": f"""
        SELECT trace_id, span_id, parent_span_id, step_index, agent, model,
               input_tokens, output_tokens, input AS input_messages, output AS output_messages,
               status, error_type, start_time, duration_ms,
               {COST_FUNCTION}(model, {PROVIDER}, input_tokens, output_tokens) AS cost
        FROM spans WHERE operation = '{sc.OP_CHAT}'
    """,
    # Each read lists, per record it returned, the write that stored that content: the latest
    # earlier update_memory of the same store with the same content hash (any run).
    "memory_ops": f"""
        WITH ops AS (
            SELECT trace_id, span_id, step_index, agent, operation, memory_store AS store,
                   memory_record AS record_id, memory_content_hash AS content_hash,
                   memory_result_ids AS result_record_ids,
                   memory_result_hashes AS result_hashes,
                   input AS query, output AS content, status, start_ns, end_ns, start_time
            FROM spans WHERE operation IN ('{sc.OP_MEMORY_SEARCH}', '{sc.OP_MEMORY_UPDATE}',
                                           '{sc.OP_MEMORY_DELETE}')
        ),
        writes AS (
            SELECT store, content_hash, end_ns, trace_id AS w_trace, span_id AS w_span
            FROM ops WHERE operation = '{sc.OP_MEMORY_UPDATE}' AND content_hash IS NOT NULL
        ),
        returned AS (
            SELECT span_id, store, start_ns, unnest(result_hashes) AS hash,
                   generate_subscripts(result_hashes, 1) AS position
            FROM ops WHERE operation = '{sc.OP_MEMORY_SEARCH}'
        ),
        linked AS (
            SELECT r.span_id,
                   list(w.w_span ORDER BY r.position) AS source_write_span_ids,
                   list(w.w_trace ORDER BY r.position) AS source_write_trace_ids
            FROM returned r
            ASOF LEFT JOIN writes w
                ON r.store = w.store AND r.hash = w.content_hash AND r.start_ns >= w.end_ns
            GROUP BY r.span_id
        )
        SELECT ops.* EXCLUDE (start_ns, end_ns),
               linked.source_write_span_ids, linked.source_write_trace_ids
        FROM ops LEFT JOIN linked USING (span_id)
    """,
}


def gap_runs_sql(home: Path) -> str:
    """`gap_runs`: one row per member run of each gap in `<home>/gaps.json` (docs/gaps.md),
    read when queried (a new analysis shows at once). No file, or one that is not JSON, is an
    empty view of the same columns; gaps.json written before `members` existed lists its
    `examples`. The path is a quoted literal: `read_text` takes no parameters in a view."""
    path = _literal(str(Home.at(home).gaps))
    return f"""
        WITH doc AS (SELECT TRY_CAST(content AS JSON) AS doc FROM read_text({path})),
        gaps AS (
            SELECT unnest(from_json(coalesce(doc->'gaps', '[]'), '["JSON"]')) AS gap FROM doc
        ),
        members AS (
            SELECT gap, unnest(from_json(coalesce(gap->'members', gap->'examples', '[]'),
                                         '["JSON"]')) AS member
            FROM gaps
        )
        SELECT gap->>'id' AS gap_id, gap->>'name' AS gap_name,
               TRY_CAST(gap->>'rank' AS INTEGER) AS rank, gap->>'detector' AS detector,
               gap->>'kind' AS kind,
               member->>'trace_id' AS trace_id, member->>'run_id' AS run_id,
               TRY_CAST(member->>'step' AS BIGINT) AS step,
               TRY_CAST(member->>'position' AS BIGINT) AS position,
               member->>'agent' AS agent,
               from_json(coalesce(member->'span_ids', '[]'), '["VARCHAR"]') AS span_ids,
               member->>'evidence' AS evidence
        FROM members
    """


def register_views(con: duckdb.DuckDBPyConnection, home: Path) -> list[Path]:
    """(Re)create the views over `home` on `con`; returns the spool files they read. Lake
    parts that fail a cheap check are moved aside or left out (see store/parts.py)."""
    home = Path(home)
    ready, writing = complete_spool_files(home)
    pending = ready + writing
    live, listed = _live_sql(pending), [p.stem for p in pending]
    bad = frozenset(screen(home, listed).in_place)
    register_cost(con, home)
    for view, table in (("spans", "spans"), ("_outcome_spans", "outcomes"),
                        ("_nightly_spans", "nightly")):  # fmt: skip
        live_rows = (
            f"SELECT * EXCLUDE (_table) FROM ({live}) WHERE _table = '{table}'" if live else None
        )
        body = _table_sql(home, table, live_rows, listed, bad)
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS {body}")
    for name in ["outcomes", "traces", "tool_calls", "llm_calls", "memory_ops", "nightly"]:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {VIEW_SQL[name]}")
    con.execute(f"CREATE OR REPLACE TEMP VIEW gap_runs AS {gap_runs_sql(home)}")
    files = "[" + ", ".join(_literal(str(p)) for p in pending) + "]" if pending else None
    con.execute(f"CREATE OR REPLACE TEMP VIEW spool_bad_lines AS {bad_lines_select(files)}")
    return pending


class LiveViews:
    """The views on one connection, recreated when the files move under them.

    `run(fn)` retries `fn` over fresh views while it fails with an IO error and the spool's
    file list or the lake's parts have changed since the views were made (another process
    compacted files they read, or moved a part aside). A read error that could come from a
    damaged part has every part read whole once (store/parts.py): when some are bad, they are
    moved aside or left out and `fn` runs again. Any other error is raised as it is.
    """

    TRIES = 10  # each retry needs a file to have vanished or a bad part found

    def __init__(self, con: duckdb.DuckDBPyConnection, home: Path) -> None:
        self.con, self.home = con, Path(home)
        self.listed: list[Path] = []
        self.parts: list[Path] = []
        self.refresh()

    def refresh(self) -> None:
        """Recreate the views; again if a file they list vanishes while they are created."""
        for _ in range(self.TRIES - 1):
            with contextlib.suppress(duckdb.IOException):
                self._register()
                return
        self._register()

    def _register(self) -> None:
        self.listed = register_views(self.con, self.home)
        self.parts = lake_parts(self.home)  # after: registering may move bad parts aside

    def run(self, fn: Callable[[], T]) -> T:
        for _ in range(self.TRIES - 1):
            try:
                return fn()
            except duckdb.Error as exc:
                if not self.recover(exc):
                    raise
        return fn()

    def recover(self, exc: duckdb.Error) -> bool:
        """After `exc`, refresh the views (moving damaged parts aside where that is why);
        whether they may now answer what failed."""
        if isinstance(exc, duckdb.IOException):
            before = (self.listed, self.parts)
            self.refresh()
            if (self.listed, self.parts) != before:
                return True
        if not may_be_corrupt(exc, self.home):
            return False
        if not screen(self.home, [p.stem for p in self.listed], deep=True).found:
            return False
        self.refresh()
        return True
