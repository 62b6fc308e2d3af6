"""The lake parts' cheap check (store/parts.py) remembers good footers across processes in
`lake/.parts-checked.json`, keyed by size and mtime: a later process skips them, and a part
changed since is checked again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.store import lake, parts
from tracegym.store.store import Store

from tests.chaos.spool_data import write_spool

DAMAGED = "spans/day=2025-11-30/part-20251130T000000-host-1-00000001-0.parquet"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    write_spool(tmp_path, files=3, spans_per_file=100)
    lake.compact(tmp_path)
    monkeypatch.setattr(parts, "_verdicts", {})  # this process has checked nothing yet
    return tmp_path


def count(home: Path) -> int:
    with Store(home, compact_on_open=False) as store:
        return store.fetch("SELECT count(*) FROM spans").rows[0][0]


def test_a_later_process_skips_footers_found_good(home: Path, monkeypatch: pytest.MonkeyPatch):
    assert count(home) == 300
    assert (lake.lake_dir(home) / parts.CHECKED_FILE).is_file()
    monkeypatch.setattr(parts, "_verdicts", {})  # as a fresh process
    read: list[list[Path]] = []
    real = parts._footer_problems

    def footers(con: object, paths: list[Path]) -> dict[Path, str]:
        read.append(paths)
        return real(con, paths)

    monkeypatch.setattr(parts, "_footer_problems", footers)
    assert count(home) == 300
    assert read == []  # no footer read again


def test_a_part_changed_since_its_footer_was_found_good_is_checked_again(
    home: Path, monkeypatch: pytest.MonkeyPatch
):
    assert count(home) == 300
    part = lake.lake_dir(home) / DAMAGED
    stat = part.stat()
    with open(part, "r+b") as handle:  # the footer overwritten in place, same size
        handle.seek(stat.st_size - 300)
        handle.write(b"\xff" * 200)
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    monkeypatch.setattr(parts, "_verdicts", {})  # as a fresh process
    assert count(home) == 250
    assert (parts.quarantine_dir(home) / DAMAGED).is_file()
