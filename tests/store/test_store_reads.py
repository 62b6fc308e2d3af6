"""Reading the store.

4. Opening the store compacts; on a full or read-only disk that failed, and every read with it.
   Now a read that cannot compact reads the lake plus the spool as they are, with a note.
5. `tracegym sql` planned its query inside the retry around compactions but fetched it outside:
   a compaction between the two ended in `IOException: No files found`. The hooks below put a
   compaction exactly there, every time.
7. `tracegym sql "SELECT * FROM sqlite_scan(...)"` tried to download a DuckDB extension into
   ~/.duckdb; the store's connection loads none now, and says so.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

import duckdb
from tracegym.cli import app
from tracegym.store import lake
from tracegym.store import store as store_module
from tracegym.store.store import Relation, Store
from tracegym.tracer.spool_files import spool_dir
from typer.testing import CliRunner

from tests.chaos.spool_data import write_spool

runner = CliRunner()
COUNT = "SELECT count(*) FROM spans"


def csv_count(output: str) -> int:
    return int(output.strip().splitlines()[-1])


@pytest.fixture
def compaction_between_planning_and_fetching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A store whose opening compacts nothing, and whose first fetch is preceded by a compaction
    of every spool file (as another process's would be); yields the span count and the list of
    compactions the hook ran."""
    total = write_spool(tmp_path, files=3, spans_per_file=200)
    with Store(tmp_path, compact_on_open=False) as probe:
        if not isinstance(probe.sql("SELECT 1"), Relation):
            pytest.skip("this DuckDB's relations cannot be hooked (no Python subclass)")
    monkeypatch.setattr(store_module, "compact", lambda *args, **kwargs: lake.CompactionReport())
    fired: list[lake.CompactionReport] = []
    plain_fetchall = duckdb.DuckDBPyRelation.fetchall

    def fetchall(self: duckdb.DuckDBPyRelation) -> list:
        if not fired:
            fired.append(lake.compact(tmp_path))
        return plain_fetchall(self)

    monkeypatch.setattr(Relation, "fetchall", fetchall)
    return total, fired


def test_sql_fetches_inside_the_retry_around_a_compaction(
    tmp_path: Path, compaction_between_planning_and_fetching: tuple[int, list]
):
    total, fired = compaction_between_planning_and_fetching
    result = runner.invoke(app, ["sql", "-f", "csv", COUNT, "--home", str(tmp_path)])
    assert fired and fired[0].files == 3  # the compaction did happen in between
    assert result.exit_code == 0, result.output  # was: error: IO Error: No files found ...
    assert csv_count(result.output) == total


def test_traces_and_store_fetch_retry_around_a_compaction(
    tmp_path: Path, compaction_between_planning_and_fetching: tuple[int, list]
):
    total, fired = compaction_between_planning_and_fetching
    result = runner.invoke(app, ["traces", "-n", "1000", "--home", str(tmp_path)])
    assert fired and result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == f"{total // 10} runs"
    with Store(tmp_path, compact_on_open=False) as store:
        assert store.fetch(COUNT).rows == [(total,)]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_reads_do_not_need_compaction_to_write(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    code: int,
):
    total = write_spool(tmp_path, files=3, spans_per_file=100)

    def refused(*args: object) -> None:
        raise OSError(code, f"{errno.errorcode[code]} (simulated)")

    monkeypatch.setattr(lake, "_new_staging", refused)  # the compaction's first write
    with caplog.at_level(logging.WARNING, "tracegym.store"):
        result = runner.invoke(app, ["sql", "-f", "csv", COUNT, "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output  # was: cannot open the store ... (exit 2)
    assert csv_count(result.output) == total
    notes = [r.getMessage() for r in caplog.records if "could not compact" in r.getMessage()]
    assert len(notes) == 1 and errno.errorcode[code] in notes[0], notes
    assert len(list(spool_dir(tmp_path).glob("*.jsonl"))) == 3  # nothing moved, nothing lost
    with caplog.at_level(logging.WARNING, "tracegym.store"):
        explicit = runner.invoke(app, ["compact", "--home", str(tmp_path)])
    assert explicit.exit_code == 1  # asked to compact: a one-line error, no traceback
    assert "could not compact" in explicit.output and "Traceback" not in explicit.output


def test_sql_loads_no_extension_and_writes_nothing_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    user_home = tmp_path / "user"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    store_home = tmp_path / "store"
    write_spool(store_home, files=1, spans_per_file=10)
    query = "SELECT * FROM sqlite_scan('x.db', 't')"
    result = runner.invoke(app, ["sql", query, "--home", str(store_home)])
    assert result.exit_code == 2
    assert "sqlite_scan" in result.output and "loads no DuckDB extensions" in result.output
    assert list(user_home.iterdir()) == []  # was: ~/.duckdb/extensions/v.../linux_amd64
