"""The lake's columns: how a spool line becomes a row, in one SQL expression.

Compaction writes rows with this expression into Parquet; the live (not yet compacted) spool is
read through the very same expression, so the two halves of every view always agree.
"""

from __future__ import annotations

from tracegym.tracer import semconv as sc

# The shape of a spool line (see docs/spool.md), for DuckDB's read_json.
SPOOL_COLUMNS = {
    "trace_id": "VARCHAR",
    "span_id": "VARCHAR",
    "parent_span_id": "VARCHAR",
    "name": "VARCHAR",
    "kind": "VARCHAR",
    "start_ns": "BIGINT",
    "end_ns": "BIGINT",
    "status": "VARCHAR",
    "status_message": "VARCHAR",
    "attributes": "JSON",
    "events": "JSON",
    "links": "JSON",
    "resource": "JSON",
    "scope": "VARCHAR",
}

# Promoted columns: (column, type, attribute keys tried in order). Importers and the receiver
# map other conventions (OpenInference, OpenLLMetry) onto these keys before spooling.
PROMOTED: list[tuple[str, str, tuple[str, ...]]] = [
    ("operation", "VARCHAR", (sc.OPERATION,)),
    ("agent", "VARCHAR", (sc.AGENT_NAME,)),
    ("run_id", "VARCHAR", (sc.RUN_ID,)),
    ("step_index", "INTEGER", (sc.STEP_INDEX,)),
    ("tool", "VARCHAR", (sc.TOOL_NAME,)),
    ("call_id", "VARCHAR", (sc.TOOL_CALL_ID,)),
    ("model", "VARCHAR", (sc.RESPONSE_MODEL, sc.REQUEST_MODEL)),
    ("input", "VARCHAR", (sc.TOOL_ARGUMENTS, sc.INPUT_MESSAGES, sc.INPUT, sc.MEMORY_QUERY)),
    ("output", "VARCHAR", (sc.TOOL_RESULT, sc.OUTPUT_MESSAGES, sc.OUTPUT, sc.MEMORY_CONTENT)),
    ("input_tokens", "BIGINT", (sc.INPUT_TOKENS,)),
    ("output_tokens", "BIGINT", (sc.OUTPUT_TOKENS,)),
    ("memory_store", "VARCHAR", (sc.MEMORY_STORE,)),
    ("memory_record", "VARCHAR", (sc.MEMORY_RECORD,)),
    ("memory_content_hash", "VARCHAR", (sc.MEMORY_CONTENT_HASH,)),
    ("memory_result_ids", "VARCHAR[]", (sc.MEMORY_RESULT_IDS,)),
    ("memory_result_hashes", "VARCHAR[]", (sc.MEMORY_RESULT_HASHES,)),
    ("subtask", "VARCHAR", (sc.SUBTASK_NAME,)),
    ("error_type", "VARCHAR", (sc.ERROR_TYPE,)),
]

# Every attribute key a promoted column reads, in one list: DuckDB parses each JSON once.
_KEYS = list(dict.fromkeys(k for _, _, keys in PROMOTED for k in keys))
_PATHS = "[" + ", ".join("'$.\"" + k + "\"'" for k in _KEYS) + "]"


def _column(column: str, kind: str, keys: tuple[str, ...]) -> str:
    picks = [f"_v[{_KEYS.index(k) + 1}]" for k in keys]
    value = picks[0] if len(picks) == 1 else f"coalesce({', '.join(picks)})"
    if kind == "VARCHAR":
        return f"{value} AS {column}"
    if kind.endswith("[]"):
        return f"TRY_CAST(CAST({value} AS JSON) AS {kind}) AS {column}"
    return f"TRY_CAST({value} AS {kind}) AS {column}"


# The `_table` compaction routes a line that is no span to: counted from the COPY's own
# statistics, then deleted, so the spool is read once (see `compaction_source`).
BAD_TABLE = "_bad"


def row_select(source: str, *, with_source: bool = False, route_bad: bool = False) -> str:
    """SELECT turning spool lines from `source` (a table expression) into lake rows.

    `with_source` adds `_src`, the spool file's stem (the source needs `filename=True`);
    `route_bad` sends rows whose `_valid` is false to BAD_TABLE (`compaction_source`).
    """
    promoted = ",\n    ".join(_column(*p) for p in PROMOTED)
    src = ",\n    regexp_extract(filename, '([^/]+)\\.jsonl$', 1) AS _src" if with_source else ""
    bad = f"WHEN NOT _valid THEN '{BAD_TABLE}' " if route_bad else ""
    return f"""
SELECT
    trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns,
    (end_ns - start_ns) / 1e6 AS duration_ms,
    make_timestamp(start_ns // 1000) AS start_time,
    status, status_message,
    json_extract_string(resource, '$."service.name"') AS service,
    {promoted},
    {_as_text()}, scope,
    CAST(make_timestamp(start_ns // 1000) AS DATE) AS day,
    CASE {bad}WHEN name = '{sc.OUTCOME_SPAN_NAME}' THEN 'outcomes'
        WHEN name = '{sc.NIGHTLY_SPAN_NAME}' THEN 'nightly' ELSE 'spans' END AS _table{src}
FROM (SELECT *, json_extract_string(attributes, {_PATHS}) AS _v FROM {source})
"""


# The fields a line must have, with the right JSON types, to be a span (docs/spool.md). They
# are read as raw JSON and checked: read_json itself converts leniently ("1", 1.0 and true all
# read as the integer 1), and a line it cannot parse at all (garbage, a line cut short) comes
# back with `ignore_errors` as a row of NULLs.
_CHECKED = {"v": "JSON", "trace_id": "JSON", "span_id": "JSON", "name": "JSON",
            "start_ns": "JSON", "end_ns": "JSON"}  # fmt: skip
_VALID = """coalesce(
    CAST(v AS VARCHAR) = '1'
    AND regexp_full_match(CAST(trace_id AS VARCHAR), '"[0-9a-f]{32}"')
    AND regexp_full_match(CAST(span_id AS VARCHAR), '"[0-9a-f]{16}"')
    AND starts_with(CAST(name AS VARCHAR), '"')
    AND regexp_full_match(CAST(start_ns AS VARCHAR), '[0-9]{1,19}')
    AND TRY_CAST(CAST(start_ns AS VARCHAR) AS BIGINT) IS NOT NULL
    AND regexp_full_match(CAST(end_ns AS VARCHAR), '[0-9]{1,19}')
    AND TRY_CAST(CAST(end_ns AS VARCHAR) AS BIGINT) IS NOT NULL, false)"""
# A timestamp as a BIGINT in [0, 2**63), else NULL: a valid line's value as it is, and a line
# that is no span (which compaction reads too, see `compaction_source`) never has one that
# overflows `end_ns - start_ns`.
_NON_NEGATIVE = "TRY_CAST(TRY_CAST(CAST({} AS VARCHAR) AS UBIGINT) AS BIGINT)"
# The checked fields as the spool's columns (for a valid line: the ids are plain hex strings).
_FIELDS = [
    "substr(CAST(trace_id AS VARCHAR), 2, 32) AS trace_id",
    "substr(CAST(span_id AS VARCHAR), 2, 16) AS span_id",
    "json_extract_string(name, '$') AS name",
    f"{_NON_NEGATIVE.format('start_ns')} AS start_ns",
    f"{_NON_NEGATIVE.format('end_ns')} AS end_ns",
]


# The largest line read_json takes (DuckDB's `maximum_object_size`: it reads buffers of twice
# that, so lines up to about twice it parse; a longer one is an error, not a skipped line).
MAX_LINE_BYTES = 64 << 20
# Compaction tries this first: a buffer is a unit of DuckDB's parallel read, so with buffers of
# 128 MB a spool file of 50 MB is read by one thread (and written by one, at 1.5x the time); a
# batch holding a longer line is read again with MAX_LINE_BYTES (`lake.stage_batch`).
FAST_LINE_BYTES = 16 << 20


def spool_lines_source(
    paths_param: str = "?", *, filename: bool = False, max_line_bytes: int = MAX_LINE_BYTES
) -> str:
    """Every non-blank line of spool files (a path or list bound as a parameter) as a row with
    the spool's columns and `_valid`: whether the line is a span at all (see `_CHECKED`)."""
    columns = ", ".join(
        f"'{name}': '{kind}'" for name, kind in {**SPOOL_COLUMNS, **_CHECKED}.items()
    )
    raw = (
        f"read_json({paths_param}, format='newline_delimited', columns={{{columns}}}, "
        f"ignore_errors=true, maximum_object_size={int(max_line_bytes)}, "
        f"filename={str(filename).lower()})"
    )
    others = [name for name in SPOOL_COLUMNS if name not in _CHECKED]
    return (
        f"(SELECT {', '.join(_FIELDS + others)}{', filename' if filename else ''}, "
        f"{_VALID} AS _valid FROM {raw})"
    )


def read_json_source(paths_param: str = "?", *, filename: bool = False) -> str:
    """The spans of spool files (a path or list bound as a parameter): their valid lines only.

    Garbage, a line cut short (a crash, a batch still being written, a full disk) and a line
    lacking a required field of the right type are no rows (not rows of NULLs)."""
    return (
        f"(SELECT * EXCLUDE (_valid) FROM {spool_lines_source(paths_param, filename=filename)} "
        "WHERE _valid)"
    )


def compaction_source(paths_param: str = "?", max_line_bytes: int = MAX_LINE_BYTES) -> str:
    """Every non-blank line of spool files as a row with `filename` and `_valid`, for a
    compaction that reads the spool once: with `route_bad`, `row_select` sends the lines that
    are no span to BAD_TABLE, where compaction counts and deletes them (no second read of the
    spool to count its lines). Such a row's values stay in the range of a span's (see
    `_FIELDS`), so no expression of `row_select` fails on them."""
    return spool_lines_source(paths_param, filename=True, max_line_bytes=max_line_bytes)


def bad_lines_select(paths: str | None) -> str:
    """Per spool file, its non-blank lines that are no span: `file`, `lines` (`paths`: a SQL
    list of file names, None for none). A live file's last line counts while being written."""
    if paths is None:
        return "SELECT NULL::VARCHAR AS file, NULL::BIGINT AS lines LIMIT 0"
    return (
        f"SELECT filename AS file, count(*) AS lines FROM "
        f"{spool_lines_source(paths, filename=True)} WHERE NOT _valid GROUP BY filename"
    )


def empty_source() -> str:
    """A typed table expression with the spool's columns and no rows (an empty store)."""
    columns = ", ".join(f"NULL::{kind} AS {name}" for name, kind in SPOOL_COLUMNS.items())
    return f"(SELECT {columns} LIMIT 0)"


# Columns holding JSON documents. They are text (VARCHAR) in the lake and in the views alike:
# Parquet strings (UTF8), which Polars, pyarrow, Spark and DuckDB's own read_parquet all read as
# text (DuckDB's JSON type is written with the JSON logical type, which Polars reads as Binary).
# DuckDB's JSON functions and operators (`json_extract_string`, `->>`) take text as they take
# JSON, and reading text costs no validation pass. Parts written before hold the JSON logical
# type: `lake_read_select` reads them as text too.
JSON_COLUMNS = ("attributes", "events", "links", "resource")


def _as_text() -> str:
    return ", ".join(f"CAST({c} AS VARCHAR) AS {c}" for c in JSON_COLUMNS)


def lake_read_select(source: str) -> str:
    """Rows of lake parts (`source`, a table expression) with the JSON columns as text,
    whichever way a part stored them (text now, the JSON logical type before)."""
    return f"SELECT * REPLACE ({_as_text()}) FROM {source}"
