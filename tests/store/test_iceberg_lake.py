"""Iceberg tables fed by many writers: exact counts under concurrent appends, reruns append
nothing twice, DuckDB and Polars read the tables. Skipped without the `iceberg` extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("pyiceberg", reason="the iceberg extra is not installed (pyiceberg)")

from tracegym.store import iceberg, lake
from tracegym.store.iceberg import IcebergTarget, appended, publish
from tracegym.store.records import outcome_record, span_record, stable_id, write_spool_file

BASE_NS = 1_764_460_800_000_000_000
DAY_NS = 86_400 * 10**9


def spool(home: Path, writer: str, batch: int, spans: int) -> None:
    """One spool file of `spans` tool spans (on two days) and one outcome record."""
    records = [
        span_record(
            trace_id=stable_id(writer, batch, i // 5),
            span_id=stable_id(writer, batch, i, width=16),
            name="execute_tool lookup", start_ns=BASE_NS + (i % 2) * DAY_NS + i,
            end_ns=BASE_NS + (i % 2) * DAY_NS + i + 1000,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"},
        )
        for i in range(spans)
    ]  # fmt: skip
    records.append(outcome_record(f"{writer}-{batch}", time_ns=BASE_NS, success=True))
    write_spool_file(home, records, f"{writer}-{batch:03d}")


def test_publish_appends_each_part_once_and_engines_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    home, target = tmp_path / "home", IcebergTarget.sqlite(tmp_path / "catalog")
    spool(home, "w", 0, 40)
    lake.compact(home)
    first = publish(home, target)
    assert first.rows == {"spans": 40, "outcomes": 1}
    assert publish(home, target).rows == {}  # a rerun finds every part appended
    spool(home, "w", 1, 10)
    lake.compact(home)
    assert publish(home, target).rows == {"spans": 10, "outcomes": 1}
    table = target.load().load_table("tracegym.spans")
    assert len(appended(table)) == 4  # two parts (days) per spool file
    con = table.scan().to_duckdb("spans")
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchall() == [
        (50, 50)
    ]
    assert con.execute("SELECT count(DISTINCT day) FROM spans").fetchall() == [(2,)]
    pl = pytest.importorskip("polars")
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # its own reader, no plugin
    assert pl.scan_iceberg(table).select(pl.len()).collect().item() == 50


def test_a_writer_that_loses_the_commit_looks_again_and_appends_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Deterministic race: another writer commits the same parts between this writer's look at
    the snapshots and its commit. pyiceberg alone would retry the append on the new snapshot."""
    home, target = tmp_path / "home", IcebergTarget.sqlite(tmp_path / "catalog")
    spool(home, "w", 0, 30)
    lake.compact(home)
    real, raced = iceberg.appended, []

    def look_then_lose(table):
        seen = real(table)
        if not raced:
            raced.append(True)
            with monkeypatch.context() as inner:
                inner.setattr(iceberg, "appended", real)
                assert publish(home, target).rows == {"spans": 30, "outcomes": 1}
        return seen

    monkeypatch.setattr(iceberg, "appended", look_then_lose)
    report = publish(home, target)
    assert raced and report.conflicts == 1 and report.rows == {}
    table = target.load().load_table("tracegym.spans")
    assert table.scan().to_arrow().num_rows == 30


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_iceberg_lake import spool
    from tracegym.store import iceberg, lake
    from tracegym.store.iceberg import IcebergTarget, publish

    home, writer, batches = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    target = IcebergTarget.sqlite({catalog!r})
    conflicts = 0
    for batch in range(batches):
        spool(home, writer, batch, 25)
        lake.compact(home)
        conflicts += publish(home, target).conflicts
    print(conflicts)
    """
)


@pytest.mark.slow
def test_two_processes_append_concurrently_with_exact_counts(tmp_path: Path):
    """Two writers (own homes: two hosts) and a third publishing the first's home again, all
    at once: every span lands once, whoever wins each commit."""
    catalog = tmp_path / "catalog"
    IcebergTarget.sqlite(catalog)
    script = WRITER.format(tests=str(Path(__file__).parent), catalog=str(catalog))
    batches = 6
    runs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path / name), name, str(batches)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]  # fmt: skip
    again = 0
    while any(run.poll() is None for run in runs):
        if (tmp_path / "a" / "lake").is_dir():  # the same parts, raced by a third writer
            again += sum(publish(tmp_path / "a", IcebergTarget.sqlite(catalog)).rows.values())
    for run in runs:
        _out, err = run.communicate()
        assert run.returncode == 0, err[-2000:]
    table = IcebergTarget.sqlite(catalog).load().load_table("tracegym.spans")
    con = table.scan().to_duckdb("spans")
    counts = con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchall()
    assert counts == [(2 * batches * 25, 2 * batches * 25)]
    outcomes = IcebergTarget.sqlite(catalog).load().load_table("tracegym.outcomes")
    assert outcomes.scan().to_arrow().num_rows == 2 * batches


def test_a_table_made_by_an_older_tracegym_gains_the_new_column(tmp_path: Path):
    """Schema evolution: a promoted column the table lacks is added by name; rows appended
    before read NULL in it, rows appended after carry it."""
    from pyiceberg.schema import Schema

    target = IcebergTarget.sqlite(tmp_path / "catalog")
    catalog = target.load()
    catalog.create_namespace("tracegym")
    older = Schema(*[f for f in iceberg.iceberg_schema().fields if f.name != "tool"])
    catalog.create_table("tracegym.spans", schema=older)
    home = tmp_path / "home"
    spool(home, "w", 0, 10)
    lake.compact(home)
    assert publish(home, target).rows["spans"] == 10
    table = catalog.load_table("tracegym.spans")
    assert "tool" in table.schema().column_names
    tools = table.scan(selected_fields=("tool",)).to_arrow()["tool"].to_pylist()
    assert tools == ["lookup"] * 10


def test_compact_iceberg_publishes_once_from_the_cli(tmp_path: Path):
    from tracegym.cli import app
    from typer.testing import CliRunner

    home, catalog = tmp_path / "home", tmp_path / "catalog"
    spool(home, "cli", 0, 10)
    runner = CliRunner()
    first = runner.invoke(app, ["--home", str(home), "compact", "--iceberg", str(catalog)])
    assert first.exit_code == 0, first.output
    assert "published 11 rows from 3 parts" in first.output
    again = runner.invoke(app, ["--home", str(home), "compact", "--iceberg", str(catalog)])
    assert again.exit_code == 0, again.output
    assert "published 0 rows from 0 parts" in again.output
    spans = IcebergTarget.sqlite(catalog).load().load_table("tracegym.spans").scan().to_arrow()
    assert spans.num_rows == 10
