"""One corrupt Parquet part made the whole store unreadable. 200 overwritten
bytes in one lake part ended `tracegym traces` and `summary` in a traceback (exit 1) and kept the
dashboard's database from opening; a truncated part made `compact` and `sql` exit 2. Now the
other parts read, the bad one is named in one line on stderr and moved to lake/quarantine/
(never deleted), or left out by name where it cannot be moved."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

import duckdb
from tracegym.dashboards.db import Database
from tracegym.store import lake, parts
from tracegym.store.records import span_record, write_spool_file
from tracegym.store.store import Store

from tests.chaos.spool_data import BASE_NS, write_spool

SPANS = 3 * 200
DAMAGED = "spans/day=2025-11-30/part-20251130T000000-host-1-00000001-0.parquet"


def damage(path: Path, how: str) -> None:
    """Overwrite 200 bytes of a data page (the footer still parses), of the footer, or cut the
    file in half."""
    size = path.stat().st_size
    if how == "truncate":
        os.truncate(path, size // 2)
        return
    offset = 100 if how == "data" else size - 300
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\xff" * 200)


@pytest.fixture
def store_home(tmp_path: Path) -> tuple[Path, int]:
    """A compacted store (three spool files, nine parts); returns it and the damaged part's
    span count."""
    write_spool(tmp_path, files=3, spans_per_file=200, outcomes=True)
    lake.compact(tmp_path)
    part = lake.lake_dir(tmp_path) / DAMAGED
    rows = duckdb.sql(f"SELECT count(*) FROM read_parquet('{part}')").fetchall()[0][0]
    assert 0 < rows < SPANS
    return tmp_path, rows


def tracegym(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracegym.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def check_output(command: str, out: str, spans: int) -> None:
    """What each command printed: every run (each has spans on both days: none vanishes with
    one day's part), or the spans the other parts hold."""
    if command == "traces":
        assert out.strip().splitlines()[-1] == "60 runs"
    elif command == "summary":
        assert json.loads(out)["spans"] == spans + 3  # records: spans plus three outcomes
    else:
        assert int(out.strip().splitlines()[-1]) == spans  # sql -f csv: the count


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "command"),
    [
        ("data", ["traces", "-n", "1000"]),
        ("data", ["summary", "--json"]),
        ("footer", ["sql", "-f", "csv", "SELECT count(*) FROM spans"]),
        ("truncate", ["sql", "-f", "csv", "SELECT count(*) FROM spans"]),
        ("truncate", ["traces", "-n", "1000"]),
    ],
)
def test_the_other_parts_read_and_the_bad_one_is_named_and_moved_aside(
    store_home: tuple[Path, int], how: str, command: list[str]
):
    home, rows = store_home
    part = lake.lake_dir(home) / DAMAGED
    damage(part, how)
    damaged = part.read_bytes()
    proc = tracegym(home, *command)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = proc.stderr.strip().splitlines()
    assert len(warnings) == 1 and str(part) in warnings[0], proc.stderr
    check_output(command[0], proc.stdout, SPANS - rows)
    moved = parts.quarantine_dir(home) / DAMAGED
    assert not part.exists() and moved.read_bytes() == damaged  # kept as it was
    again = tracegym(home, *command)  # the next command reads the rest without a word
    assert again.returncode == 0 and not again.stderr.strip(), again.stderr
    check_output(command[0], again.stdout, SPANS - rows)


@pytest.mark.slow
def test_compact_with_a_truncated_part_compacts_the_rest(store_home: tuple[Path, int]):
    home, rows = store_home
    damage(lake.lake_dir(home) / DAMAGED, "truncate")
    records = [span_record(trace_id="ab" * 16, span_id="cd" * 8, name="x", start_ns=BASE_NS,
                           end_ns=BASE_NS + 1)]  # fmt: skip
    write_spool_file(home, records, "20251201T000000-host-9-00000009")
    proc = tracegym(home, "compact")
    assert proc.returncode == 0, proc.stderr
    assert "compacted 1 spool file, 1 span," in proc.stdout
    assert str(lake.lake_dir(home) / DAMAGED) in proc.stderr
    with Store(home, compact_on_open=False) as store:
        assert store.fetch("SELECT count(*) FROM spans").rows == [(SPANS - rows + 1,)]


@pytest.mark.parametrize("how", ["data", "footer", "truncate"])
def test_the_dashboard_database_opens_and_counts_the_rest(
    store_home: tuple[Path, int], how: str, caplog: pytest.LogCaptureFixture
):
    home, rows = store_home
    part = lake.lake_dir(home) / DAMAGED
    damage(part, how)
    db = Database(home)  # failed here for a bad footer
    try:
        with caplog.at_level(logging.WARNING, "tracegym.store"):
            result = db.query(
                "SELECT count(*), count(DISTINCT span_id), count(trace_id) FROM spans"
            )
    finally:
        db.close()
    assert result.rows[0] == (SPANS - rows,) * 3
    assert (parts.quarantine_dir(home) / DAMAGED).exists() and not part.exists()


def test_a_part_that_cannot_be_moved_is_left_out_by_name(
    store_home: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    home, rows = store_home
    part = lake.lake_dir(home) / DAMAGED
    damage(part, "data")

    def read_only(*args: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(parts.os, "rename", read_only)
    query = "SELECT count(*), count(trace_id) FROM spans"  # reads the damaged column
    with (
        caplog.at_level(logging.WARNING, "tracegym.store"),
        Store(home, compact_on_open=False) as store,
    ):
        assert store.fetch(query).rows == [(SPANS - rows,) * 2]
        assert store.fetch(query).rows == [(SPANS - rows,) * 2]
    assert part.exists() and not parts.quarantined(home)
    named = [r.getMessage() for r in caplog.records if str(part) in r.getMessage()]
    assert len(named) == 1 and "left out" in named[0], named


@pytest.mark.slow
@pytest.mark.parametrize("how", ["data", "footer"])
def test_the_dashboard_starts_and_its_pages_answer(store_home: tuple[Path, int], how: str):
    uvicorn = pytest.importorskip("uvicorn")
    from tracegym.dashboards.app import create_app

    home, _ = store_home
    damage(lake.lake_dir(home) / DAMAGED, how)
    server = uvicorn.Server(uvicorn.Config(create_app(home), host="127.0.0.1", port=0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60  # a hang guard only
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        for page in ("/", "/runs"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{page}", timeout=60) as answer:
                assert answer.status == 200, page
    finally:
        server.should_exit = True
        thread.join(10)
    assert (parts.quarantine_dir(home) / DAMAGED).exists()
