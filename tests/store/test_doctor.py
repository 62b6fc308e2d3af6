"""`tracegym doctor` reports the store's health (corrupt parts, spool files cut
mid-line, dead compactions' staging, the quarantine) without writing, and `--repair` moves the
corrupt parts aside (never deleting them) and clears the dead staging."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.cli import app
from tracegym.store import lake
from tracegym.tracer.spool_files import spool_dir
from typer.testing import CliRunner

from tests.chaos.spool_data import write_spool

runner = CliRunner()
DAMAGED = "spans/day=2025-11-30/part-20251130T000000-host-1-00000001-0.parquet"


def snapshot(home: Path) -> dict[str, tuple[int, int]]:
    """Every path under `home` with its size and mtime: what a read-only command must keep."""
    return {
        str(p.relative_to(home)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(home.rglob("*"))
    }


@pytest.fixture
def sick_home(tmp_path: Path) -> Path:
    """A compacted store with one part's data page overwritten (its footer still parses), a dead
    compaction's staging folder and a spool file whose last line was cut by a crash."""
    write_spool(tmp_path, files=3, spans_per_file=100)
    lake.compact(tmp_path)
    with open(lake.lake_dir(tmp_path) / DAMAGED, "r+b") as handle:
        handle.seek(100)
        handle.write(b"\xff" * 200)
    (lake.lake_dir(tmp_path) / lake.STAGING_DIR / "x-1-ab").mkdir(parents=True)
    (lake.lake_dir(tmp_path) / lake.STAGING_DIR / "x-1-ab" / "data_0.parquet").write_bytes(b"x")
    spool_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    (spool_dir(tmp_path) / "20251201T000000-host-7-00000007.jsonl").write_bytes(b'{"v": 1, "na')
    return tmp_path


def test_doctor_reports_and_writes_nothing(sick_home: Path):
    before = snapshot(sick_home)
    result = runner.invoke(app, ["doctor", "--home", str(sick_home)])
    assert result.exit_code == 1, result.output
    out = result.output
    assert "lake parts: 6 read whole, 1 corrupt" in out
    assert f"corrupt: lake/{DAMAGED}" in out and "still in the lake" in out
    assert "1 with a cut last line" in out and "20251201T000000-host-7-00000007.jsonl" in out
    assert "staging: 1 folder left by dead compactions" in out
    assert "quarantine: 0 files" in out
    assert snapshot(sick_home) == before


def test_doctor_repair_moves_the_bad_part_aside_and_clears_dead_staging(sick_home: Path):
    damaged = (lake.lake_dir(sick_home) / DAMAGED).read_bytes()
    result = runner.invoke(app, ["doctor", "--repair", "--home", str(sick_home)])
    assert result.exit_code == 0, result.output
    moved = lake.lake_dir(sick_home) / "quarantine" / DAMAGED
    assert f"moved to lake/quarantine/{DAMAGED}" in result.output
    assert moved.read_bytes() == damaged
    assert not (lake.lake_dir(sick_home) / lake.STAGING_DIR).exists()
    again = runner.invoke(app, ["doctor", "--home", str(sick_home)])
    assert again.exit_code == 0, again.output
    assert "lake parts: 5 read whole, 0 corrupt" in again.output
    assert f"quarantine: 1 file\n  lake/quarantine/{DAMAGED}" in again.output
    assert "status: ok" in again.output


def test_doctor_on_a_healthy_store(tmp_path: Path):
    write_spool(tmp_path, files=1, spans_per_file=10)
    result = runner.invoke(app, ["doctor", "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "lake parts: 0 read whole, 0 corrupt" in result.output
    assert "spool: 1 file (0 being written), 0 with a cut last line" in result.output
    assert not lake.lake_dir(tmp_path).exists()  # nothing written, no lake made
    assert os.listdir(tmp_path) == ["spool"]
