"""`tracegym views`: the DuckDB script recreates the views `sql` queries, and the Spark dialect
keeps none of the DuckDB constructs Spark reads wrongly or not at all. Quick: no Spark runs
here (tests/store/test_spark_views.py compares the rows on Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("sqlglot", reason="the spark extra is not installed (sqlglot)")

import sqlglot
from tracegym.cli import app
from tracegym.store import lake
from tracegym.store.dialects import DERIVED, spark_statements, spark_view_sql
from tracegym.store.records import span_record, stable_id, write_spool_file
from tracegym.store.store import Store
from typer.testing import CliRunner

runner = CliRunner()
BASE_NS = 1_764_460_800_000_000_000


def _home_spool(home: Path) -> None:
    failing = span_record(
        trace_id=stable_id("t"), span_id=stable_id("s", width=16), name="execute_tool lookup",
        start_ns=BASE_NS, end_ns=BASE_NS + 10**6, status="ERROR",
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                    "error.type": "builtins.KeyError"},
        events=[{"name": "exception", "attributes": {"exception.message": "no such key"}}],
    )  # fmt: skip
    write_spool_file(home, [failing], "one")


def _home(tmp_path: Path) -> Path:
    _home_spool(tmp_path)
    lake.compact(tmp_path)
    return tmp_path


def test_the_duckdb_script_recreates_the_views_sql_queries(tmp_path: Path):
    home = _home(tmp_path)
    done = runner.invoke(app, ["--home", str(home), "views"])
    assert done.exit_code == 0, done.output
    with Store(home) as store:
        before = store.sql("SELECT first_error FROM traces").fetchall()
        assert before == [("lookup: KeyError: no such key",)]
        for statement in done.output.split(";\n"):
            if statement.strip():
                store.con.execute(statement.replace("TEMP VIEW traces", "TEMP VIEW traces2"))
        assert store.sql("SELECT first_error FROM traces2").fetchall() == before


@pytest.mark.parametrize("view", DERIVED)
def test_the_spark_dialect_parses_as_spark_and_reads_json_with_bracket_paths(view: str):
    sql = spark_view_sql(view)
    sqlglot.parse_one(sql, read="spark")  # well-formed Spark SQL
    lowered = sql.lower()
    for duckdb_only in ('$."', "json_extract_string", "list_filter", "asof join", "make_timestamp",
                        "exclude (", "unnest(", "read_text", "qualify "):  # fmt: skip
        assert duckdb_only not in lowered, (view, duckdb_only)


def test_spark_statements_read_only_what_is_there(tmp_path: Path):
    statements = spark_statements(_home(tmp_path))
    joined = "\n".join(statements)
    assert f"path '{tmp_path}/lake/spans'" in joined  # compacted: read as Parquet
    assert "_nightly_spans AS SELECT" in joined and "_gaps_doc AS SELECT" in joined  # empty
    url = spark_statements("s3a://bucket/prefix")  # a URL is taken to be there
    assert "OPTIONS (path 's3a://bucket/prefix/lake/nightly'" in "\n".join(url)


def test_an_object_lake_is_read_through_its_committed_parts_only(tmp_path: Path):
    pytest.importorskip("fsspec", reason="the s3 extra is not installed (fsspec)")
    from tracegym.store import object_lake

    home, root = tmp_path / "home", tmp_path / "objects"
    object_lake.set_lake(home, object_lake.LakeConfig(root.as_uri()))
    _home_spool(home)
    object_lake.compact(home, object_lake.open_lake(home))
    (committed,) = root.glob("spans/day=*/part-*.parquet")
    stray = committed.with_name("part-uncommitted-0.parquet")  # a killed compactor's upload
    stray.write_bytes(committed.read_bytes())
    spans = spark_statements(home)[0]
    relative = committed.relative_to(root / "spans")
    assert f"path '{root.as_uri()}/spans/{{{relative}}}', basePath '{root.as_uri()}/spans'" in spans
    assert "uncommitted" not in spans
