"""The views in Spark SQL, generated from the DuckDB definitions in store/views.py.

sqlglot (a SQL transpiler) turns each DuckDB view into Spark SQL: JSON paths become `$['k']`
(`$."k"` silently reads NULL in Spark), `//` becomes `DIV`, `QUALIFY` a filtered subquery,
`arg_min` `min_by`. What it gets wrong is fixed here, and only here:

- `ERROR_MESSAGE` (a DuckDB list filtered by a lambda, indexed from the end) is replaced by its
  Spark equivalent (`from_json` to an array, `filter`, `try_element_at(..., -1)`);
- `make_timestamp(micros)` becomes a `TIMESTAMP_NTZ` (DuckDB's TIMESTAMP has no time zone; the
  lake's `start_time` is read as `TIMESTAMP_NTZ` too), whatever the session's time zone;
- `memory_ops` (an ASOF join, `unnest` with `generate_subscripts`, `list(... ORDER BY)`,
  `* EXCLUDE`) and `gap_runs` (DuckDB's JSON structure types) are written by hand below.

Spark reads the lake only: spool files not compacted yet are not in these views (run
`tracegym compact` first). tests/store/test_spark_views.py checks every view's rows against
DuckDB's on the same lake.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
from tracegym.store.home import GAPS_FILE, LAKE_DIR
from tracegym.store.views import ERROR_MESSAGE, VIEW_SQL, gap_runs_sql
from tracegym.tracer import semconv as sc

if TYPE_CHECKING:
    from sqlglot import exp

# The base views: (view, lake folder), and the derived ones in dependency order.
BASE_VIEWS = (("spans", "spans"), ("_outcome_spans", "outcomes"), ("_nightly_spans", "nightly"))
DERIVED = ("outcomes", "traces", "tool_calls", "llm_calls", "memory_ops", "nightly", "gap_runs")
HAND_WRITTEN = ("memory_ops", "gap_runs")

# DuckDB type -> Spark type, for the lake's columns (see `lake_columns`).
_SPARK_TYPES = {
    "VARCHAR": "STRING",
    "BIGINT": "BIGINT",
    "INTEGER": "INT",
    "DOUBLE": "DOUBLE",
    "BOOLEAN": "BOOLEAN",
    "TIMESTAMP": "TIMESTAMP_NTZ",
    "DATE": "DATE",
    "VARCHAR[]": "ARRAY<STRING>",
}

SPARK_ERROR_MESSAGE = """coalesce(
    CASE WHEN json_array_length(events) IS NOT NULL THEN try_element_at(filter(
        transform(from_json(events, 'array<struct<attributes: map<string, string>>>'),
                  e -> try_element_at(e.attributes, 'exception.message')),
        m -> m IS NOT NULL AND m <> ''), -1) END,
    nullif(status_message, ''))"""

_MEMORY_OPS = f"""
WITH ops AS (
    SELECT trace_id, span_id, step_index, agent, operation, memory_store AS store,
           memory_record AS record_id, memory_content_hash AS content_hash,
           memory_result_ids AS result_record_ids, memory_result_hashes AS result_hashes,
           input AS query, output AS content, status, start_ns, end_ns, start_time
    FROM spans WHERE operation IN ('{sc.OP_MEMORY_SEARCH}', '{sc.OP_MEMORY_UPDATE}',
                                   '{sc.OP_MEMORY_DELETE}')
),
writes AS (
    SELECT store, content_hash, end_ns, trace_id AS w_trace, span_id AS w_span
    FROM ops WHERE operation = '{sc.OP_MEMORY_UPDATE}' AND content_hash IS NOT NULL
),
returned AS (
    SELECT span_id, store, start_ns, r.hash, r.pos + 1 AS position
    FROM ops LATERAL VIEW posexplode(result_hashes) r AS pos, hash
    WHERE operation = '{sc.OP_MEMORY_SEARCH}'
),
matched AS (  -- per returned record, the latest write of its content ended before the read
    SELECT r.span_id, r.position, w.w_span, w.w_trace,
           row_number() OVER (PARTITION BY r.span_id, r.position ORDER BY w.end_ns DESC) AS n
    FROM returned r LEFT JOIN writes w
        ON r.store = w.store AND r.hash = w.content_hash AND r.start_ns >= w.end_ns
),
linked AS (
    SELECT span_id,
           transform(array_sort(collect_list(struct(position, w_span))), x -> x.w_span)
               AS source_write_span_ids,
           transform(array_sort(collect_list(struct(position, w_trace))), x -> x.w_trace)
               AS source_write_trace_ids
    FROM matched WHERE n = 1 GROUP BY span_id
)
SELECT ops.trace_id, span_id, ops.step_index, ops.agent, ops.operation, ops.store,
       ops.record_id, ops.content_hash, ops.result_record_ids, ops.result_hashes, ops.query,
       ops.content, ops.status, ops.start_time,
       linked.source_write_span_ids, linked.source_write_trace_ids
FROM ops LEFT JOIN linked USING (span_id)
"""

# `_gaps_doc` is gaps.json as one row of text (`value`); see store/views.py's gap_runs_sql.
_GAP_RUNS = """
WITH gaps AS (
    SELECT explode(from_json(coalesce(get_json_object(value, '$.gaps'), '[]'), 'array<string>'))
        AS gap
    FROM _gaps_doc
),
members AS (
    SELECT gap, explode(from_json(coalesce(get_json_object(gap, '$.members'),
                                           get_json_object(gap, '$.examples'), '[]'),
                                  'array<string>')) AS member
    FROM gaps
)
SELECT get_json_object(gap, '$.id') AS gap_id, get_json_object(gap, '$.name') AS gap_name,
       try_cast(get_json_object(gap, '$.rank') AS INT) AS rank,
       get_json_object(gap, '$.detector') AS detector, get_json_object(gap, '$.kind') AS kind,
       get_json_object(member, '$.trace_id') AS trace_id,
       get_json_object(member, '$.run_id') AS run_id,
       try_cast(get_json_object(member, '$.step') AS BIGINT) AS step,
       try_cast(get_json_object(member, '$.position') AS BIGINT) AS position,
       get_json_object(member, '$.agent') AS agent,
       from_json(coalesce(get_json_object(member, '$.span_ids'), '[]'), 'array<string>')
           AS span_ids,
       get_json_object(member, '$.evidence') AS evidence
FROM members
"""


def _fix_for_spark(node: exp.Expression, error_message: exp.Expression) -> exp.Expression:
    """The hand fixes sqlglot's DuckDB -> Spark output needs (see the module docstring)."""
    import sqlglot
    from sqlglot import exp

    if node == error_message:
        return sqlglot.parse_one(SPARK_ERROR_MESSAGE, read="spark")
    if isinstance(node, exp.UnixToTime) and node.args.get("scale") == exp.Literal.number(6):
        epoch = exp.cast(exp.Literal.string("1970-01-01 00:00:00"), "TIMESTAMP_NTZ")
        return exp.Anonymous(
            this="TIMESTAMPADD", expressions=[exp.var("MICROSECOND"), node.this, epoch]
        )
    return node


def transpile(duckdb_sql: str) -> str:
    """One view's DuckDB SQL as Spark SQL."""
    import sqlglot

    error_message = sqlglot.parse_one(ERROR_MESSAGE, read="duckdb")
    tree = sqlglot.parse_one(duckdb_sql, read="duckdb")
    fixed = tree.transform(lambda node: _fix_for_spark(node, error_message))
    return fixed.sql(dialect="spark", pretty=True)


def spark_view_sql(name: str) -> str:
    """The Spark SQL of derived view `name` (over the base views `spans`, `_outcome_spans`,
    `_nightly_spans` and `_gaps_doc`)."""
    if name == "memory_ops":
        return _MEMORY_OPS.strip()
    if name == "gap_runs":
        return _GAP_RUNS.strip()
    return transpile(VIEW_SQL[name])


def lake_duckdb_columns() -> list[tuple[str, str]]:
    """The lake's columns as (name, DuckDB type), asked of DuckDB from the very expression
    compaction writes with (store/schema.py), `day` (the partition) included."""
    from tracegym.store.schema import empty_source, row_select

    with duckdb.connect() as con:
        described = con.execute(
            f"DESCRIBE SELECT * EXCLUDE (_table) FROM ({row_select(empty_source())})"
        ).fetchall()
    return [(name, kind) for name, kind, *_ in described]


def lake_columns() -> list[tuple[str, str]]:
    """The lake's columns as (name, Spark type)."""
    return [(name, _SPARK_TYPES[kind]) for name, kind in lake_duckdb_columns()]


def _quote(text: str) -> str:
    """A Spark SQL string literal (backslash is an escape character in Spark's)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _join(base: str, *names: str) -> str:
    return "/".join([base.rstrip("/"), *names])


def _is_url(path: str) -> bool:
    return "://" in path


def _exists(path: str) -> bool:
    """Local paths are checked; a URL (s3://, gs://, ...) is taken to be there."""
    return _is_url(path) or os.path.exists(path)


def spark_url(url: str) -> str:
    """A URL as Spark's Hadoop filesystems name it: `s3://` is `s3a://` there."""
    return "s3a://" + url[len("s3://") :] if url.startswith("s3://") else url


def _glob_literal(name: str) -> str:
    """`name` matching only itself in a Hadoop glob (its special characters escaped)."""
    return "".join("\\" + c if c in "{}[]*?,\\" else c for c in name)


def _object_lake(home: Path) -> dict[str, tuple[str, list[str]]] | None:
    """For a home whose lake is on object storage (docs/object_storage.md): per lake folder,
    (its URL, the URLs of the parts committed in it now), as Spark names them. A part is in the
    lake once a commit names it, so Spark is given those files, never a glob. None for a local
    lake."""
    from tracegym.store.object_lake import open_lake

    lake = open_lake(home)
    if lake is None:
        return None
    snapshot = lake.snapshot()

    def url(relative: str) -> str:
        return spark_url(lake.fs.unstrip_protocol(lake.path(relative)))

    return {
        folder: (url(folder), [url(p.path) for p in snapshot.parts(folder)])
        for _, folder in BASE_VIEWS
    }


def spark_statements(home: str | os.PathLike, exists: Callable[[str], bool] = _exists) -> list[str]:
    """Spark SQL statements creating every view as a temporary view over the lake of `home`
    (a local path or a URL Spark reads, laid out as `<home>/lake`). A lake folder or gaps.json
    that is not there is an empty view of the same columns, as in DuckDB. A home whose lake is
    on object storage (`tracegym compact --to`) is read through the parts committed when the
    statements are made (file lists, not globs: an uncommitted part is never read)."""
    home = str(home)
    columns = lake_columns()
    schema = ", ".join(f"`{name}` {kind}" for name, kind in columns)
    empty = ", ".join(f"CAST(NULL AS {kind}) AS `{name}`" for name, kind in columns)
    object_lake = None if _is_url(home) else _object_lake(Path(home))
    statements = []
    for view, folder in BASE_VIEWS:
        if object_lake is not None:
            base, files = object_lake[folder]
            listed = base + "/{" + ",".join(_glob_literal(f[len(base) + 1 :]) for f in files) + "}"
            source = f"path {_quote(listed)}, basePath {_quote(base)}" if files else ""
        else:
            path = _join(_join(home, LAKE_DIR), folder)
            source = f"path {_quote(path)}" if exists(path) else ""
        if source:
            statements.append(
                f"CREATE OR REPLACE TEMPORARY VIEW {view} ({schema}) USING parquet "
                f"OPTIONS ({source}, pathGlobFilter '*.parquet')"
            )
        else:
            statements.append(f"CREATE OR REPLACE TEMPORARY VIEW {view} AS SELECT {empty} LIMIT 0")
    gaps = _join(home, GAPS_FILE)
    if exists(gaps):
        statements.append(
            "CREATE OR REPLACE TEMPORARY VIEW _gaps_doc USING text "
            f"OPTIONS (path {_quote(gaps)}, wholetext 'true')"
        )
    else:
        statements.append(
            "CREATE OR REPLACE TEMPORARY VIEW _gaps_doc AS SELECT CAST(NULL AS STRING) AS value "
            "LIMIT 0"
        )
    for name in DERIVED:
        statements.append(f"CREATE OR REPLACE TEMPORARY VIEW {name} AS\n{spark_view_sql(name)}")
    return statements


SPARK_HEADER = """-- tracegym's views in Spark SQL over the lake of {home}
-- (spool files not compacted yet are not read: run `tracegym compact` first).
-- traces and llm_calls call tracegym_cost, a Python UDF:
-- tracegym.store.spark.register_cost(spark, home) defines it, register_views(spark, home)
-- runs all of this.
"""

DUCKDB_HEADER = """-- tracegym's views in DuckDB SQL, as `tracegym sql` creates them over {home}.
-- spans, _outcome_spans and _nightly_spans are the lake's Parquet plus the spool files not
-- compacted yet (store/views.py); tracegym_cost is a Python function on the connection.
"""


def views_script(home: str | os.PathLike, dialect: str) -> str:
    """Every view's definition in `dialect` ("duckdb" or "spark"), as one SQL script."""
    if dialect == "spark":
        header, statements = SPARK_HEADER, spark_statements(home)
    elif dialect == "duckdb":
        header = DUCKDB_HEADER
        statements = [
            f"CREATE OR REPLACE TEMP VIEW {name} AS\n"
            + (gap_runs_sql(Path(home)) if name == "gap_runs" else VIEW_SQL[name]).strip()
            for name in DERIVED
        ]
    else:
        raise ValueError(f"unknown dialect {dialect!r}: duckdb or spark")
    return header.format(home=home) + "\n" + "".join(s + ";\n\n" for s in statements)
