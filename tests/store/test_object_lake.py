"""The lake on object storage (store/object_lake.py), on fsspec's memory and local
filesystems and on a moto S3 server: commits made once, readers reading only committed parts,
exactly once around a compaction. The concurrency and crash cases are in
tests/chaos/test_object_lake.py."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("fsspec", reason="the object lake needs fsspec: the s3 extra")

import pyarrow.parquet as pq
from tracegym.cli import app as cli
from tracegym.store import lake, object_lake
from tracegym.store.object_lake import (
    Commit,
    CommittedPart,
    LakeConfig,
    ObjectCompactionReport,
    ObjectLake,
    Snapshot,
)
from tracegym.store.store import Store
from tracegym.tracer.spool import spool_dir
from typer.testing import CliRunner

from tests.chaos import object_store
from tests.chaos.spool_data import write_spool

s3_bucket = object_store.s3_bucket  # the fixture: a fresh bucket on a moto server

COUNTS = (
    "SELECT (SELECT count(*) FROM spans), (SELECT count(DISTINCT span_id) FROM spans), "
    "(SELECT count(*) FROM _outcome_spans)"
)


@pytest.fixture
def memory_url() -> str:
    return f"memory://tg-{uuid.uuid4().hex[:12]}/lake"


def counts(home: Path, url: str | None = None) -> tuple:
    with Store(home, compact_on_open=False, lake_url=url) as store:
        return store.fetch(COUNTS).rows[0]


def unreferenced(lake_: ObjectLake) -> list[str]:
    """Parquet objects in the lake that no commit names."""
    named = {lake_.path(p.path) for p in lake_.snapshot().parts()}
    found = [p for t in object_lake.TABLES if lake_.fs.exists(lake_.path(t))
             for p in lake_.fs.find(lake_.path(t))]  # fmt: skip
    return [p for p in found if "/" + p.lstrip("/") not in named and p not in named]


def test_compaction_commits_each_spool_file_once_and_readers_count_exactly(
    tmp_path: Path, memory_url: str
):
    total = write_spool(tmp_path, files=3, spans_per_file=200, outcomes=True)
    object_lake.set_lake(tmp_path, LakeConfig(memory_url))
    assert counts(tmp_path) == (total, total, 3)  # the spool, read in place
    with Store(tmp_path) as store:  # compacts on open, into the object lake
        report = store.last_compaction
        assert isinstance(report, ObjectCompactionReport)
        assert (report.files, report.commits, report.spans) == (3, 1, total + 3)
        assert store.fetch(COUNTS).rows[0] == (total, total, 3)
        assert store.fetch("SELECT count(*) FROM tool_calls").rows == [(total,)]
    assert not list(spool_dir(tmp_path).glob("*.jsonl"))
    assert not list(lake.lake_dir(tmp_path).rglob("*.parquet"))  # nothing in the local lake
    snapshot = ObjectLake(LakeConfig(memory_url)).snapshot()
    assert [c.seq for c in snapshot.commits] == [0]
    assert sorted(snapshot.stems()) == sorted(f"20251130T000000-host-{f}-{f:08x}" for f in range(3))
    assert sum(p.rows for p in snapshot.parts()) == total + 3
    written = ObjectLake(LakeConfig(memory_url))
    for part in snapshot.parts():  # each part's rows (the COPY's statistics) are its own
        with written.fs.open(written.path(part.path), "rb") as handle:
            assert pq.ParquetFile(handle).metadata.num_rows == part.rows
    # another host, no spool of its own, reads the same lake through the URL alone
    other = tmp_path / "other-host"
    other.mkdir()
    assert counts(other, memory_url) == (total, total, 3)


def test_a_file_committed_before_a_crash_is_removed_not_uploaded_again(
    tmp_path: Path, memory_url: str
):
    total = write_spool(tmp_path, files=3, spans_per_file=100)
    saved = tmp_path / "saved"
    shutil.copytree(spool_dir(tmp_path), saved)
    config = LakeConfig(memory_url)
    object_lake.compact(tmp_path, ObjectLake(config))
    shutil.copytree(saved, spool_dir(tmp_path), dirs_exist_ok=True)  # killed before its unlinks
    assert counts(tmp_path, memory_url) == (total, total, 0)  # spool or parts, never both
    report = object_lake.compact(tmp_path, ObjectLake(config))
    assert (report.files, report.already_committed, report.commits, report.parts) == (3, 3, 0, 0)
    assert not list(spool_dir(tmp_path).glob("*.jsonl"))
    assert len(ObjectLake(config).snapshot().commits) == 1
    assert counts(tmp_path, memory_url) == (total, total, 0)


def test_a_lost_race_for_a_sequence_number_retries_without_the_files_taken(memory_url: str):
    winner, loser = ObjectLake(LakeConfig(memory_url)), ObjectLake(LakeConfig(memory_url))
    for name in ("a", "b"):
        loser.fs.pipe_file(loser.path(f"spans/day=2025-11-30/part-{name}-t-0.parquet"), b"x")
    parts = [CommittedPart(f"spans/day=2025-11-30/part-{n}-t-0.parquet", "spans", n, 1)
             for n in ("a", "b")]  # fmt: skip
    assert winner.create_commit(Commit(0, "w", (), ("a",)))
    stale = iter([Snapshot(())])  # the loser listed the commits before the winner's put
    real = loser.snapshot
    loser.snapshot = lambda: next(stale, None) or real()  # type: ignore[method-assign]
    report = ObjectCompactionReport()
    commit = object_lake.commit_parts(loser, parts, ["a", "b"], "t", report)
    assert report.conflicts == 1
    assert commit is not None and (commit.seq, commit.sources) == (1, ("b",))
    assert [p.stem for p in commit.parts] == ["b"]
    assert not loser.fs.exists(loser.path("spans/day=2025-11-30/part-a-t-0.parquet"))  # removed
    assert sorted(real().stems()) == ["a", "b"]  # each stem in one commit


def test_a_commit_is_created_once_on_a_local_disk_and_in_memory(tmp_path: Path, memory_url: str):
    for url in (str(tmp_path / "lake"), memory_url):
        first, second = ObjectLake(LakeConfig(url)), ObjectLake(LakeConfig(url))
        assert first.create_commit(Commit(0, "one", (), ("x",)))
        assert not second.create_commit(Commit(0, "two", (), ("y",)))
        assert [c.token for c in second.snapshot().commits] == ["one"]
    leftovers = [p.name for p in (tmp_path / "lake" / object_lake.COMMITS_DIR).iterdir()]
    assert leftovers == ["00000000000000000000.json"]  # no temporary file left beside it


def test_uncommitted_parts_are_never_read_and_removed_after_the_grace(
    tmp_path: Path, memory_url: str
):
    total = write_spool(tmp_path, files=2, spans_per_file=100)
    lake_ = ObjectLake(LakeConfig(memory_url))
    object_lake.compact(tmp_path, lake_)
    committed = lake_.snapshot().parts()[0]
    orphan = lake_.path("spans/day=2025-11-30/part-gone-dead-0.parquet")
    lake_.fs.copy(lake_.path(committed.path), orphan)  # a compactor killed before its commit
    assert counts(tmp_path, memory_url) == (total, total, 0)
    assert lake_.vacuum(grace_s=3600) == 0  # young: maybe a compactor still on its way
    assert lake_.fs.exists(orphan)
    assert lake_.vacuum(grace_s=0) == 1
    assert not lake_.fs.exists(orphan) and not unreferenced(lake_)
    assert counts(tmp_path, memory_url) == (total, total, 0)


def test_a_damaged_commit_is_an_error_not_skipped(memory_url: str):
    lake_ = ObjectLake(LakeConfig(memory_url))
    lake_.fs.pipe_file(lake_.path(f"{object_lake.COMMITS_DIR}/{0:020d}.json"), b"{not json")
    with pytest.raises(ValueError, match="damaged lake commit"):
        lake_.snapshot()  # skipping it would let its spool files be committed again


def test_the_lake_url_comes_from_the_argument_the_environment_or_lake_json(
    tmp_path: Path, memory_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv(object_lake.LAKE_URL_ENV, raising=False)
    assert object_lake.configured(tmp_path) is None  # the local lake, as before
    object_lake.set_lake(tmp_path, LakeConfig(memory_url, {"skip_instance_cache": True}))
    assert object_lake.configured(tmp_path) == LakeConfig(memory_url, {"skip_instance_cache": True})
    monkeypatch.setenv(object_lake.LAKE_URL_ENV, "memory://elsewhere/lake")
    assert object_lake.configured(tmp_path).url == "memory://elsewhere/lake"
    assert object_lake.configured(tmp_path, "memory://given/lake").url == "memory://given/lake"
    saved = json.loads((tmp_path / "lake.json").read_text())
    assert saved["url"] == memory_url


def test_a_home_with_a_local_lake_is_not_pointed_elsewhere(tmp_path: Path, memory_url: str):
    write_spool(tmp_path, files=1, spans_per_file=10)
    lake.compact(tmp_path)
    with pytest.raises(ValueError, match="already has a local lake"):
        object_lake.set_lake(tmp_path, LakeConfig(memory_url))
    assert not (tmp_path / "lake.json").exists()


def test_the_compact_command_takes_a_url_and_sql_reads_it(tmp_path: Path, memory_url: str):
    total = write_spool(tmp_path, files=2, spans_per_file=50)
    runner = CliRunner()
    result = runner.invoke(cli, ["--home", str(tmp_path), "compact", "--to", memory_url])
    assert result.exit_code == 0, result.output
    assert "compacted 2 spool files" in result.output and memory_url in result.output
    result = runner.invoke(
        cli, ["--home", str(tmp_path), "sql", "SELECT count(*) AS n FROM spans", "-f", "csv"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["n", str(total)]  # lake.json remembered the URL
    local = tmp_path / "local"
    write_spool(local, files=1, spans_per_file=5)
    lake.compact(local)
    result = runner.invoke(cli, ["--home", str(local), "compact", "--to", memory_url])
    assert result.exit_code == 2 and "already has a local lake" in result.output


def test_a_lake_on_a_local_path_commits_by_hard_link(tmp_path: Path):
    home, url = tmp_path / "home", str(tmp_path / "shared" / "lake")
    total = write_spool(home, files=3, spans_per_file=100, outcomes=True)
    report = object_lake.compact(home, ObjectLake(LakeConfig(url)))
    assert (report.files, report.commits) == (3, 1)
    assert (tmp_path / "shared/lake/_commits/00000000000000000000.json").is_file()
    assert counts(home, url) == (total, total, 3)


def test_on_a_moto_s3_server_the_views_read_the_committed_parts(tmp_path: Path, s3_bucket: str):
    url = f"{s3_bucket}/lake"
    total = write_spool(tmp_path, files=3, spans_per_file=300, outcomes=True)
    object_lake.set_lake(tmp_path, LakeConfig(url))
    with Store(tmp_path) as store:
        assert store.last_compaction.commits == 1
        assert store.fetch(COUNTS).rows[0] == (total, total, 3)
        traces = store.fetch("SELECT count(*), sum(tool_calls) FROM traces").rows[0]
        assert traces == (3 * 30, total)  # a run per 10 spans (spool_data), every call once
    other = tmp_path / "reader"
    other.mkdir()
    assert counts(other, url) == (total, total, 3)


def test_every_view_and_the_analysis_loading_match_the_local_lake(tmp_path: Path, memory_url: str):
    """The same spool compacted into the local lake and into an object lake: every view has the
    same rows, and `analyze` loads the same runs (it reads through `Store` like the views)."""
    from tracegym.analysis.runs import load_runs
    from tracegym.store.views import VIEWS

    local, remote = tmp_path / "local", tmp_path / "remote"
    write_spool(local, files=3, spans_per_file=120, outcomes=True)
    shutil.copytree(spool_dir(local), spool_dir(remote))
    object_lake.set_lake(remote, LakeConfig(memory_url))
    with Store(local) as a, Store(remote) as b:
        assert b.last_compaction.commits == 1 and not list(spool_dir(remote).glob("*.jsonl"))
        for view in VIEWS:
            query = f"SELECT * FROM {view} ORDER BY ALL"
            assert a.fetch(query).rows == b.fetch(query).rows, view
        runs_a, runs_b = load_runs(a), load_runs(b)
    assert len(runs_a) == 3 * 12 and [r.trace_id for r in runs_a] == [r.trace_id for r in runs_b]
    assert [(r.success, len(r.steps)) for r in runs_a] == [
        (r.success, len(r.steps)) for r in runs_b
    ]


def test_a_checkpoint_stands_in_for_the_commits_it_holds(
    tmp_path: Path, memory_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(object_lake, "CHECKPOINT_EVERY", 2)
    total = write_spool(tmp_path, files=5, spans_per_file=20)
    report = object_lake.compact(tmp_path, ObjectLake(LakeConfig(memory_url)), batch_files=1)
    assert report.commits == 5
    fresh = ObjectLake(LakeConfig(memory_url))
    names = sorted(p.rsplit("/", 1)[-1] for p in fresh.fs.ls(fresh.path("_commits"), detail=False))
    assert [n for n in names if "checkpoint" in n] == [
        f"{1:020d}.checkpoint.json",
        f"{3:020d}.checkpoint.json",
    ]
    read: list[str] = []  # the memory filesystem reads every object through cat_file
    real_cat_file = fresh.fs.cat_file
    monkeypatch.setattr(
        fresh.fs, "cat_file", lambda path, **kw: read.append(path) or real_cat_file(path, **kw)
    )
    commits = fresh.snapshot().commits
    assert [c.seq for c in commits] == [0, 1, 2, 3, 4]
    assert [p.rsplit("/", 1)[-1] for p in read] == [f"{3:020d}.checkpoint.json", f"{4:020d}.json"]
    assert counts(tmp_path, memory_url) == (total, total, 0)
    # a damaged checkpoint is passed over: the commits it copies are read one by one
    fresh.fs.pipe_file(fresh.path(f"_commits/{3:020d}.checkpoint.json"), b"{cut")
    assert [c.seq for c in ObjectLake(LakeConfig(memory_url)).snapshot().commits] == [0, 1, 2, 3, 4]
