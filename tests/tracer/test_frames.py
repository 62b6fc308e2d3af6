"""Data frames over the store: pandas from `Store.sql(...).df()` (or an error naming the extra),
and the lake's JSON columns stored as Parquet strings that Polars, pyarrow and DuckDB read as
text, with lakes written before (JSON logical type) still read the same (as text) through the
views, whose JSON functions work on them as before."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.store import lake
from tracegym.store.records import span_record, stable_id, write_spool_file
from tracegym.store.schema import JSON_COLUMNS, row_select
from tracegym.store.store import Relation, Store

BASE_NS = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z


def spool(home: Path, stem: str, n: int = 3) -> None:
    records = [
        span_record(
            trace_id=stable_id("t", stem),
            span_id=stable_id("s", stem, i, width=16),
            name="execute_tool lookup",
            start_ns=BASE_NS + i * 1_000_000,
            end_ns=BASE_NS + i * 1_000_000 + 500_000,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup",
                "app.nested": {"order": f"{stem}-{i}"},
            },
            events=[{"name": "retry", "time_ns": BASE_NS, "attributes": {"attempt": i}}],
            resource={"service.name": f"svc-{stem}"},
        )
        for i in range(n)
    ]
    write_spool_file(home, records, stem)


def parts(home: Path) -> list[Path]:
    return sorted(lake.spans_dir(home).rglob("*.parquet"))


def test_lake_json_columns_are_parquet_strings(tmp_path: Path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    spool(tmp_path, "a")
    assert lake.compact(tmp_path).spans == 3
    (part,) = parts(tmp_path)
    schema = pq.read_schema(part)
    for column in JSON_COLUMNS:
        assert schema.field(column).type == pa.string(), column
    import duckdb

    kinds = dict(
        duckdb.sql(
            "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet($p))",
            params={"p": str(part)},
        ).fetchall()
    )
    assert {kinds[c] for c in JSON_COLUMNS} == {"VARCHAR"}


def test_polars_reads_the_lake_json_as_text(tmp_path: Path):
    pl = pytest.importorskip("polars")
    spool(tmp_path, "a")
    lake.compact(tmp_path)
    frame = (
        pl.scan_parquet(str(lake.spans_dir(tmp_path) / "**" / "*.parquet"))
        .select(
            pl.col("attributes").str.json_path_match("$['gen_ai.tool.name']").alias("tool"),
            pl.col("attributes").str.json_path_match("$['app.nested'].order").alias("order"),
            pl.col("resource").str.json_path_match("$['service.name']").alias("service"),
            pl.col("events").str.json_path_match("$[0].attributes.attempt").alias("attempt"),
        )
        .collect()
        .sort("order")
    )
    assert frame["tool"].to_list() == ["lookup"] * 3
    assert frame["order"].to_list() == ["a-0", "a-1", "a-2"]
    assert frame["service"].to_list() == ["svc-a"] * 3
    assert frame["attempt"].to_list() == ["0", "1", "2"]


def _old_style_compaction(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compact as tracegym did before: the JSON columns with DuckDB's JSON logical type."""
    casts = ", ".join(f"CAST({c} AS VARCHAR) AS {c}" for c in JSON_COLUMNS)

    def old_row_select(*args: object, **kwargs: object) -> str:
        select = row_select(*args, **kwargs)
        assert casts in select
        return select.replace(casts, ", ".join(JSON_COLUMNS))

    with monkeypatch.context() as patch:
        patch.setattr(lake, "row_select", old_row_select)
        lake.compact(home)


def test_old_and_new_parts_read_the_same_through_the_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    spool(tmp_path, "old")
    _old_style_compaction(tmp_path, monkeypatch)
    (old_part,) = parts(tmp_path)
    assert pq.read_schema(old_part).field("attributes").type != pa.string()  # the old shape
    spool(tmp_path, "new")
    lake.compact(tmp_path)
    spool(tmp_path, "live")  # still in the spool: the third way a row reaches the views
    assert len(parts(tmp_path)) == 2
    with Store(tmp_path, compact_on_open=False) as store:
        rows = store.sql(
            "SELECT service, typeof(attributes), typeof(events), typeof(resource), "
            "attributes->>'$.\"app.nested\".order', "
            "json_extract(events, '$[0].attributes.attempt') "
            "FROM spans ORDER BY service, start_ns"
        ).fetchall()
    assert [r[0] for r in rows] == ["svc-live"] * 3 + ["svc-new"] * 3 + ["svc-old"] * 3
    assert {r[1:4] for r in rows} == {("VARCHAR", "VARCHAR", "VARCHAR")}  # text, one type
    assert [r[4] for r in rows] == [f"{s}-{i}" for s in ("live", "new", "old") for i in range(3)]
    assert [json.loads(r[5]) for r in rows] == [0, 1, 2] * 3


def test_store_sql_df_gives_a_pandas_frame(tmp_path: Path):
    pd = pytest.importorskip("pandas", reason="pandas comes with tracegym[analysis]")
    spool(tmp_path, "a")
    with Store(tmp_path) as store:
        frame = store.sql("SELECT span_id, tool, attributes FROM spans ORDER BY start_ns").df()
        same = store.df("SELECT span_id FROM spans ORDER BY start_ns")
    assert isinstance(frame, pd.DataFrame)
    assert len(frame) == 3 and list(frame["tool"]) == ["lookup"] * 3
    assert json.loads(frame["attributes"][1])["app.nested"] == {"order": "a-1"}  # text, as JSON
    assert list(same["span_id"]) == list(frame["span_id"])


def test_frames_without_pandas_name_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spool(tmp_path, "a")
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now fails
    with Store(tmp_path) as store:
        relation = store.sql("SELECT count(*) AS n FROM spans")
        with pytest.raises(ImportError, match=r"pip install 'tracegym\[analysis\]'"):
            store.df("SELECT 1")
        if isinstance(relation, Relation):  # DuckDB 2's relations (a Python class)
            with pytest.raises(ImportError, match=r"pandas .*tracegym\[analysis\]"):
                relation.df()
        assert relation.fetchall() == [(3,)]  # the relation itself still works


def test_sql_parquet_output_writes_json_as_strings(tmp_path: Path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from tracegym.cli import app
    from typer.testing import CliRunner

    spool(tmp_path, "a")
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        app,
        [
            "sql",
            "SELECT span_id, CAST(attributes AS JSON) AS attributes, events->'$[0]' AS events "
            "FROM spans",
            "-f",
            "parquet",
            "-o",
            str(out),
        ],
        env={"TRACEGYM_HOME": str(tmp_path)},
    )
    assert result.exit_code == 0, result.output
    schema = pq.read_schema(out)
    assert schema.field("attributes").type == pa.string()
    assert schema.field("events").type == pa.string()
    assert pq.read_table(out).num_rows == 3
