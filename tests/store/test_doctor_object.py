"""`tracegym doctor` on a home whose lake is on object storage (fsspec's memory filesystem and a
local path): it says what it checked (commits, committed parts' footers, this host's copies),
finds a missing or damaged part, an unreadable or missing commit, a damaged local copy (which
--repair deletes, and the next read fetches again), and a lake it cannot open; exit code 1 for
each of those, 0 on a healthy lake."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("fsspec", reason="the object lake needs fsspec: the s3 extra")

from tracegym.cli import app as cli
from tracegym.store import object_lake
from tracegym.store.object_lake import COMMITS_DIR, LakeConfig, ObjectLake
from tracegym.store.store import Store
from typer.testing import CliRunner

from tests.chaos.spool_data import write_spool

SPANS = "SELECT count(*) FROM spans"


@pytest.fixture(params=["memory", "local"])
def lake_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "bucket" / "lake")
        return
    url = f"memory://tg-{uuid.uuid4().hex[:12]}/lake"
    yield url
    lake = ObjectLake(LakeConfig(url))
    if lake.fs.exists(lake.root):
        lake.fs.rm(lake.root, recursive=True)


def _home(tmp_path: Path, url: str) -> tuple[Path, ObjectLake, int]:
    """A home whose spool (two files, outcomes too) is compacted into the lake at `url`, read
    once (so a memory lake's parts have local copies); returns it, the lake and its spans."""
    home = tmp_path / "home"
    total = write_spool(home, files=2, spans_per_file=40, outcomes=True)
    object_lake.set_lake(home, LakeConfig(url))
    with Store(home) as store:
        assert store.fetch(SPANS).rows == [(total,)]
    return home, ObjectLake(LakeConfig(url)), total


def _doctor(home: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--home", str(home), "doctor", *args])
    return result.exit_code, result.output


def test_a_healthy_lake_says_what_it_checked(tmp_path: Path, lake_url: str):
    home, lake, total = _home(tmp_path, lake_url)
    parts = lake.snapshot().parts()
    rows = sum(p.rows for p in parts)
    assert rows == total + 2  # the spans and the two outcome spans
    code, out = _doctor(home)
    assert code == 0, out
    assert f"object lake: {lake_url}" in out
    assert "commits: 1 read, 0 unreadable; checkpoints: 0, 0 damaged" in out
    assert (
        f"committed parts: {len(parts)} ({rows} rows), footers read: 0 missing, "
        "0 unreadable or short" in out
    )
    copies = 0 if lake.local else len(parts)  # a local path is read in place
    assert f"local copies (cache/lake): {copies} read whole, 0 damaged" in out
    assert "local lake parts: 0 read whole" in out
    assert out.rstrip().endswith("status: ok")


def test_a_missing_part_and_a_short_part_fail(tmp_path: Path, lake_url: str):
    home, lake, _ = _home(tmp_path, lake_url)
    gone, cut = lake.snapshot().parts()[:2]
    lake.fs.rm(lake.path(gone.path))
    data = lake.fs.cat_file(lake.path(cut.path))
    lake.fs.pipe_file(lake.path(cut.path), data[: len(data) // 2])
    code, out = _doctor(home)
    assert code == 1, out
    assert "footers read: 1 missing, 1 unreadable or short" in out
    assert f"  missing: {gone.path}" in out
    assert f"  bad: {cut.path}: " in out
    assert "status: the object lake has problems (listed above)" in out


def test_an_unreadable_commit_and_a_hole_in_the_numbers_fail(tmp_path: Path, lake_url: str):
    home, lake, _ = _home(tmp_path, lake_url)
    lake.fs.pipe_file(lake.path(f"{COMMITS_DIR}/{3:020d}.json"), b'{"seq": 3, "parts": [')
    code, out = _doctor(home)
    assert code == 1, out
    assert "commits: 1 read, 2 missing, 1 unreadable" in out
    assert f"  unreadable: {COMMITS_DIR}/{3:020d}.json: " in out
    assert "  missing commit numbers: 1, 2 (commits are never removed)" in out


def test_a_damaged_checkpoint_is_a_note_not_a_failure(tmp_path: Path, lake_url: str):
    home, lake, _ = _home(tmp_path, lake_url)
    lake.fs.pipe_file(lake.path(f"{COMMITS_DIR}/{0:020d}.checkpoint.json"), b"not json")
    code, out = _doctor(home)
    assert code == 0, out
    assert "checkpoints: 1, 1 damaged" in out
    assert "  damaged checkpoint: " in out and "readers pass over it" in out


def test_a_damaged_local_copy_is_removed_by_repair_and_fetched_again(tmp_path: Path):
    url = f"memory://tg-{uuid.uuid4().hex[:12]}/lake"
    home, lake, total = _home(tmp_path, url)
    part = lake.snapshot().parts("spans")[0]
    copy = home / "cache" / "lake" / part.path
    copy.write_bytes(copy.read_bytes()[:-20])  # cut short: its footer is gone
    code, out = _doctor(home)
    assert code == 1 and "1 damaged" in out and "--repair removes it" in out, out
    assert copy.exists()  # nothing written without --repair
    code, out = _doctor(home, "--repair")
    assert code == 0, out
    assert f"damaged copy: {copy}: " in out and "; removed" in out
    assert not copy.exists()
    with Store(home, compact_on_open=False) as store:  # fetched again from the lake
        assert store.fetch(SPANS).rows == [(total,)]
    assert copy.exists()
    code, out = _doctor(home)
    assert code == 0 and "status: ok" in out, out
    lake.fs.rm(lake.root, recursive=True)


def test_a_lake_that_cannot_be_opened_fails_and_says_so(tmp_path: Path):
    write_spool(tmp_path, files=1, spans_per_file=5)
    url = "nosuchprotocol://bucket/lake"
    (tmp_path / "lake.json").write_text(json.dumps({"version": 1, "url": url}))
    code, out = _doctor(tmp_path)
    assert code == 1, out
    assert f"object lake: {url}\n  not checked: " in out
    assert "status: the object lake has problems" in out


def test_a_local_home_prints_no_object_lake(tmp_path: Path):
    write_spool(tmp_path, files=1, spans_per_file=5)
    code, out = _doctor(tmp_path)
    assert code == 0 and "object lake" not in out and "lake parts: 0 read whole" in out, out
