"""Two compactions at once corrupted the lake and lost spans (they shared
`lake/_staging/<first stem>` and nothing serialised them). Now one compaction at a time holds
`lake/.compact.lock`; a query entry point skips instead of queueing behind it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

import duckdb
from tracegym.cli import app as cli
from tracegym.store import lake
from tracegym.store.store import Store
from tracegym.tracer.spool import spool_dir
from typer.testing import CliRunner

from tests.chaos.spool_data import write_spool

COMPACTORS = 3
TRIALS = 3

# One long-lived compactor per process: imports once, then compacts each home it is sent on
# stdin at the same moment as the others (the test writes the line to all of them at once).
COMPACTOR = textwrap.dedent(
    """
    import json, sys
    from tracegym.store import lake
    print("ready", flush=True)
    for line in sys.stdin:
        r = lake.compact(line.strip())
        print(json.dumps({"files": r.files, "spans": r.spans, "busy": r.busy}), flush=True)
    """
)


def assert_lake_exact(home: Path, total: int) -> None:
    """Every part readable on its own, every span exactly once, nothing left to compact."""
    con = duckdb.connect()
    parts = sorted(lake.lake_dir(home).glob("*/day=*/*.parquet"))
    assert parts
    for part in parts:  # a truncated part fails here: "No magic bytes found at end of file"
        con.execute("SELECT count(*) FROM read_parquet($p)", {"p": str(part)}).fetchall()
    rows, distinct = con.execute(
        "SELECT count(*), count(DISTINCT span_id) FROM read_parquet($p)",
        {"p": [str(p) for p in parts]},
    ).fetchone()
    assert (rows, distinct) == (total, total)
    assert not list(spool_dir(home).glob("*.jsonl"))
    assert not [p for p in (lake.lake_dir(home) / lake.STAGING_DIR).rglob("*") if p.is_file()]
    with Store(home, compact_on_open=False) as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(total,)]


def test_concurrent_compactions_move_every_span_exactly_once(tmp_path: Path):
    template = tmp_path / "template"
    total = write_spool(template, files=6, spans_per_file=3000)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COMPACTOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(COMPACTORS)
    ]  # fmt: skip
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * COMPACTORS
        for trial in range(TRIALS):
            home = tmp_path / f"trial-{trial}"
            shutil.copytree(spool_dir(template), spool_dir(home))
            for proc in procs:
                proc.stdin.write(f"{home}\n")
            for proc in procs:
                proc.stdin.flush()
            reports = [json.loads(proc.stdout.readline()) for proc in procs]
            # One of them moved all six files; the others waited, then found nothing left.
            assert sum(r["files"] for r in reports) == 6, reports
            assert sum(r["spans"] for r in reports) == total, reports
            assert not any(r["busy"] for r in reports)
            assert_lake_exact(home, total)
    finally:
        for proc in procs:
            proc.stdin.close()
        for proc in procs:
            proc.wait(timeout=30)


def test_a_query_does_not_queue_behind_a_compaction_and_counts_exactly(tmp_path: Path):
    total = write_spool(tmp_path, files=3, spans_per_file=200)
    with lake.compaction_lock(tmp_path) as held:  # the nightly, mid-compaction
        assert held
        start = time.monotonic()
        with Store(tmp_path) as store:  # compacts on open: skips, reads the spool in place
            assert store.last_compaction.busy
            assert store.sql("SELECT count(*) FROM spans").fetchall() == [(total,)]
        result = CliRunner().invoke(
            cli,
            ["--home", str(tmp_path), "sql", "SELECT count(*) AS n FROM spans", "-f", "csv"],
        )
        assert result.exit_code == 0, result.output
        assert result.output.split() == ["n", str(total)]
        assert time.monotonic() - start < 5  # neither waited for the lock
        assert len(list(spool_dir(tmp_path).glob("*.jsonl"))) == 3  # nothing moved meanwhile
    report = lake.compact(tmp_path, wait=False)  # the lock is free again
    assert not report.busy and report.files == 3
    assert_lake_exact(tmp_path, total)


def test_staging_folders_are_unique_and_crash_leftovers_are_cleared(tmp_path: Path):
    total = write_spool(tmp_path, files=2, spans_per_file=50)
    first = lake._new_staging(tmp_path, "same-stem")
    second = lake._new_staging(tmp_path, "same-stem")
    assert first != second  # two runs never share (nor rmtree) each other's staging
    (first / "data_0.parquet").write_bytes(b"half a part from a killed compaction")
    lake.compact(tmp_path)
    assert not list((lake.lake_dir(tmp_path) / lake.STAGING_DIR).iterdir())
    assert_lake_exact(tmp_path, total)


def test_the_compact_command_waits_for_a_running_compaction(tmp_path: Path):
    import threading

    total = write_spool(tmp_path, files=3, spans_per_file=100)
    locked, release = threading.Event(), threading.Event()

    def nightly() -> None:
        with lake.compaction_lock(tmp_path):
            locked.set()
            release.wait(10)

    holder = threading.Thread(target=nightly)
    holder.start()
    locked.wait(5)
    threading.Timer(0.5, release.set).start()
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "compact"])
    holder.join(5)
    assert result.exit_code == 0, result.output
    assert "waiting" in result.output  # said why it did not return at once
    assert "compacted 3 spool files" in result.output  # not "compacted 0" while it was busy
    assert_lake_exact(tmp_path, total)


def test_batches_are_bounded_by_files_and_bytes(tmp_path: Path):
    sizes = [5, 5, 5, 20, 1, 1, 1, 1]
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"f{i}.jsonl"
        path.write_bytes(b"x" * size)
        paths.append(path)
    cut = lake.batches(paths, batch_files=3, batch_bytes=10)
    assert [[p.name for p in b] for b in cut] == [
        ["f0.jsonl", "f1.jsonl"], ["f2.jsonl"], ["f3.jsonl"],  # 20 bytes: a batch of its own
        ["f4.jsonl", "f5.jsonl", "f6.jsonl"], ["f7.jsonl"],  # three files at most
    ]  # fmt: skip
    assert lake.batches([], batch_files=3) == []


def test_a_spool_compacted_in_small_batches_is_the_same_lake(tmp_path: Path, monkeypatch):
    total = write_spool(tmp_path, files=4, spans_per_file=40, outcomes=True)
    size = max(p.stat().st_size for p in spool_dir(tmp_path).glob("*.jsonl"))
    monkeypatch.setattr(lake, "BATCH_BYTES", size)  # one file a pass
    passes = []
    real = lake.compact_batch

    def counted(con, home, paths):
        passes.append(len(paths))
        return real(con, home, paths)

    monkeypatch.setattr(lake, "compact_batch", counted)
    report = lake.compact(tmp_path)
    assert passes == [1, 1, 1, 1] and report.files == 4 and report.bad_lines == 0
    with Store(tmp_path, compact_on_open=False) as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall()[0][0] == total
