"""`tracegym sql` / `Store.sql` ran writes inside EXPLAIN ANALYZE (a COPY wrote
its file, DROP VIEW and CREATE OR REPLACE TEMP VIEW ran), accepted `PRAGMA enable_profiling`, and
ran both of `SELECT 1; SELECT 2`. Now DuckDB's own parse decides: one statement, a SELECT, an
EXPLAIN [ANALYZE] of a SELECT or a catalog PRAGMA, on a connection whose configuration is locked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

import duckdb
from tracegym.cli import app as cli
from tracegym.dashboards.db import SqlBox
from tracegym.store.records import span_record, write_spool_file
from tracegym.store.store import ReadOnlyError, Store
from typer.testing import CliRunner

BASE_NS = 1_764_460_800_000_000_000

# (statement, the file it would write, relative to the working directory, or None)
REFUSED = [
    ("EXPLAIN ANALYZE COPY (SELECT * FROM tool_calls) TO 'x.csv'", "x.csv"),
    ("EXPLAIN COPY (SELECT * FROM tool_calls) TO 'x.csv'", "x.csv"),
    ("EXPLAIN (ANALYZE, FORMAT json) COPY (SELECT 1) TO 'y.csv'", "y.csv"),
    ("EXPLAIN ANALYZE (FORMAT json) COPY (SELECT 1) TO 'y.csv'", "y.csv"),
    ("EXPLAIN ANALYZE DROP VIEW tool_calls", None),
    ("EXPLAIN ANALYZE CREATE OR REPLACE TEMP VIEW spans AS SELECT 1 AS x", None),
    ("CREATE OR REPLACE TEMP VIEW spans AS SELECT 1 AS x", None),
    ("PRAGMA enable_profiling", None),
    ("PRAGMA enable_profiling = 'json'", None),
    ("PRAGMA profiling_output = 'p.json'", "p.json"),
    ("PRAGMA threads = 1", None),
    ("EXPLAIN PRAGMA enable_profiling", None),
    ("SELECT 1; SELECT 2", None),
    ("SELECT 1; COPY (SELECT 1) TO 'z.csv'", "z.csv"),
    ("CALL pragma_version()", None),
]
ALLOWED = [
    "SELECT count(*) FROM tool_calls",
    "EXPLAIN SELECT * FROM tool_calls",
    "EXPLAIN ANALYZE SELECT count(*) FROM spans",
    "EXPLAIN ANALYZE (FORMAT json) WITH t AS (SELECT 1) SELECT * FROM t",
    "PRAGMA show_tables",
    "PRAGMA table_info('tool_calls')",
    "SHOW TABLES",
    "DESCRIBE tool_calls",
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store with one tool call; the working directory is a fresh folder (relative paths)."""
    home = tmp_path / "home"
    record = span_record(
        trace_id="ab" * 16, span_id="01" * 8, name="execute_tool refund", start_ns=BASE_NS,
        end_ns=BASE_NS + 1_000, attributes={"gen_ai.operation.name": "execute_tool",
                                            "gen_ai.tool.name": "refund"},
    )  # fmt: skip
    write_spool_file(home, [record], "one")
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    return home


def assert_untouched(store: Store, written: str | None) -> None:
    assert written is None or not os.path.exists(written)
    assert store.sql("SELECT tool FROM tool_calls").fetchall() == [("refund",)]  # views intact
    assert store.con.execute("SELECT current_setting('enable_profiling')").fetchall()[0][0] in (
        "",
        None,
        "false",
    )


@pytest.mark.parametrize(("query", "written"), REFUSED, ids=[q for q, _ in REFUSED])
def test_store_sql_refuses_writes_hidden_in_explain_pragma_or_a_second_statement(
    home: Path, query: str, written: str | None
):
    with Store(home) as store:
        with pytest.raises(ReadOnlyError, match="refused"):
            store.sql(query)
        assert_untouched(store, written)


@pytest.mark.parametrize(("query", "written"), REFUSED, ids=[q for q, _ in REFUSED])
def test_the_sql_command_refuses_them_too(home: Path, query: str, written: str | None):
    result = CliRunner().invoke(cli, ["--home", str(home), "sql", query])
    assert result.exit_code == 2, result.output
    assert "refused" in result.output
    assert written is None or not os.path.exists(written)
    assert not list(Path.cwd().iterdir())  # nothing written at all


@pytest.mark.parametrize("query", ALLOWED)
def test_reads_explains_and_catalog_pragmas_still_work(home: Path, query: str):
    with Store(home) as store:
        assert store.sql(query).fetchall()
    result = CliRunner().invoke(cli, ["--home", str(home), "sql", query, "-f", "csv"])
    assert result.exit_code == 0, result.output


def test_the_store_connection_configuration_is_locked(home: Path):
    with Store(home) as store, pytest.raises(duckdb.InvalidInputException, match="locked"):
        store.con.execute("SET enable_profiling = 'json'")


def test_local_files_read_from_the_cli_but_not_from_the_dashboard(home: Path):
    Path("notes.csv").write_text("a\n1\n")
    result = CliRunner().invoke(
        cli, ["--home", str(home), "sql", "SELECT * FROM read_csv('notes.csv')", "-f", "csv"]
    )
    assert result.exit_code == 0 and result.output.split() == ["a", "1"], result.output
    box = SqlBox(home, timeout_s=5)
    try:
        with pytest.raises(ValueError, match=r"(?i)permission|access|disabled"):
            box.run(f"SELECT * FROM read_csv('{Path('notes.csv').resolve()}')")
        for query in ("EXPLAIN SELECT 1", "PRAGMA show_tables", "SELECT 1; SELECT 2"):
            with pytest.raises(ReadOnlyError):
                box.run(query)
    finally:
        box.close()
