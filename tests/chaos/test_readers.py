"""Readers around a compaction. A compaction killed between renaming its parts
and unlinking its spool files made a reader that does not compact count both (349,998 rows for
300,000 spans), and a dashboard whose spool files another process compacted away answered 500
(`No files found that match the pattern`) until its next refresh. Now the views leave out the
parts of every spool file they read, and a reader whose files vanished lists them again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.dashboards.db import Database
from tracegym.store import lake
from tracegym.store.store import Store
from tracegym.tracer.spool import spool_dir

from tests.chaos.spool_data import write_spool

COUNTS = "SELECT (SELECT count(*) FROM spans), (SELECT count(DISTINCT span_id) FROM spans), " \
         "(SELECT count(*) FROM _outcome_spans)"  # fmt: skip

# Compaction in a child that SIGKILLs itself at one point: `unlink` (every part renamed into the
# lake, no spool file removed yet) or `replace` (four of nine parts renamed: the three outcome
# parts and one of spans, the others still in staging).
KILLED_COMPACTION = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from tracegym.store import lake
    home, point = sys.argv[1], sys.argv[2]
    real_unlink, real_replace, renamed = Path.unlink, os.replace, []
    def unlink(self, *args, **kwargs):
        if point == "unlink" and self.suffix == ".jsonl":
            os.kill(os.getpid(), signal.SIGKILL)
        return real_unlink(self, *args, **kwargs)
    def replace(src, dst):
        if point == "replace" and len(renamed) == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        renamed.append(dst)
        return real_replace(src, dst)
    Path.unlink, os.replace = unlink, replace
    lake.compact(home)
    """
)


def counts(home: Path) -> tuple[tuple, tuple]:
    """What a Store that does not compact and a dashboard Database each count."""
    with Store(home, compact_on_open=False) as store:
        from_store = store.sql(COUNTS).fetchall()[0]
    db = Database(home)
    try:
        return from_store, db.query(COUNTS).rows[0]
    finally:
        db.close()


@pytest.mark.parametrize("point", ["unlink", "replace"])
def test_readers_after_a_killed_compaction_count_every_span_once(tmp_path: Path, point: str):
    total = write_spool(tmp_path, files=3, spans_per_file=2000, outcomes=True)
    proc = subprocess.run([sys.executable, "-c", KILLED_COMPACTION, str(tmp_path), point])
    assert proc.returncode == -9
    parts = list(lake.lake_dir(tmp_path).glob("*/day=*/*.parquet"))
    assert parts and len(list(spool_dir(tmp_path).glob("*.jsonl"))) == 3  # both halves there
    assert counts(tmp_path) == ((total, total, 3),) * 2  # was 2000 more: spool + its parts
    with Store(tmp_path) as store:  # the next compaction finishes the job
        assert store.sql(COUNTS).fetchall()[0] == (total, total, 3)
    assert not list(spool_dir(tmp_path).glob("*.jsonl"))
    assert counts(tmp_path) == ((total, total, 3),) * 2


def test_readers_whose_spool_files_were_compacted_away_still_answer(tmp_path: Path):
    total = write_spool(tmp_path, files=3, spans_per_file=500, outcomes=True)
    db = Database(tmp_path)  # lists the three spool files
    store = Store(tmp_path, compact_on_open=False)
    try:
        assert db.query(COUNTS).rows[0] == (total, total, 3)
        script = f"from tracegym.store import lake; lake.compact({str(tmp_path)!r})"
        subprocess.run([sys.executable, "-c", script], check=True)  # another process compacts
        assert not list(spool_dir(tmp_path).glob("*.jsonl"))
        assert db.query(COUNTS).rows[0] == (total, total, 3)  # was IO Error: No files found
        assert store.sql(COUNTS).fetchall()[0] == (total, total, 3)
        assert sum(1 for _ in store.records()) == total + 3
    finally:
        db.close()
        store.close()


# Compaction in a child, one file a batch, that stops at three points of each batch until the
# test says go: before it, between renaming the file's parts into the lake and unlinking the
# file (both halves there), and after it (the file gone from under the reader's views).
PAUSED_COMPACTION = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tracegym.store import lake
    def pause(point):
        print(point, flush=True)
        if sys.stdin.readline().strip() != "go":
            sys.exit(3)
    real_batch, real_unlink = lake.compact_batch, Path.unlink
    def batch(*args, **kwargs):
        pause("before")
        result = real_batch(*args, **kwargs)
        pause("after")
        return result
    def unlink(self, *args, **kwargs):
        if self.suffix == ".jsonl":
            pause("renamed")
        return real_unlink(self, *args, **kwargs)
    lake.compact_batch, Path.unlink = batch, unlink
    lake.compact(sys.argv[1], batch_files=1)
    print("done", flush=True)
    """
)


def test_a_dashboard_reading_during_compactions_always_counts_exactly(tmp_path: Path):
    """This test counted the answers a reader thread got while a compaction
    ran (at least 3), which a loaded machine did not give. Now the compaction stops at each
    point a reader can meet and the dashboard reads there: the same 24 reads on any machine."""
    total = write_spool(tmp_path, files=8, spans_per_file=2500, outcomes=True)
    db = Database(tmp_path)
    answers: list[tuple[str, tuple]] = []
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSED_COMPACTION, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        for line in child.stdout:  # ends when the child does (a hang guard below)
            point = line.strip()
            if point == "done":
                break
            answers.append((point, db.query(COUNTS).rows[0]))
            child.stdin.write("go\n")
            child.stdin.flush()
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            child.kill()
        db.close()
    assert [point for point, _ in answers] == ["before", "renamed", "after"] * 8
    assert {counts for _, counts in answers} == {(total, total, 8)}
    assert not list(spool_dir(tmp_path).glob("*.jsonl"))
