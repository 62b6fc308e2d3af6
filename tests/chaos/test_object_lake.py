"""The local lake's chaos cases on a lake in S3 (a moto server on 127.0.0.1): two compactions
at once, a compactor killed mid-commit, readers during commits. Object storage has no rename:
each batch is committed by creating `_commits/<seq>.json` with a conditional put, and these
tests hold it to exact counts: every span once, nothing lost, no part read that no commit names.

Each race is made deterministic: the compactors stop at the point under test until the test
says go (or kill themselves there), so the same interleaving happens on any machine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.store import object_lake
from tracegym.store.object_lake import LakeConfig, ObjectLake
from tracegym.store.store import Store
from tracegym.tracer.spool import spool_dir

from tests.chaos import object_store
from tests.chaos.spool_data import write_spool

s3_bucket = object_store.s3_bucket  # the fixture: a fresh bucket on a moto server

COUNTS = (
    "SELECT (SELECT count(*) FROM spans), (SELECT count(DISTINCT span_id) FROM spans), "
    "(SELECT count(*) FROM _outcome_spans)"
)

# A compactor that stops right before its first commit put, its parts uploaded and the commits
# read (so two of them aim at the same number), until told "go"; prints its report as JSON.
PAUSED = textwrap.dedent(
    """
    import json, sys
    from tracegym.store import object_lake
    home = sys.argv[1]
    real_create, paused = object_lake.ObjectLake.create_commit, []
    def create_commit(self, commit):
        if not paused:
            paused.append(commit.seq)
            print("uploaded", flush=True)
            if sys.stdin.readline().strip() != "go":
                sys.exit(3)
        return real_create(self, commit)
    object_lake.ObjectLake.create_commit = create_commit
    r = object_lake.compact(home, object_lake.open_lake(home))
    print(json.dumps({"files": r.files, "spans": r.spans, "commits": r.commits,
                      "conflicts": r.conflicts, "aimed_at": paused}), flush=True)
    """
)

# A compactor that SIGKILLs itself at `point`: `commit` (parts uploaded, the commit not yet
# put) or `unlink` (committed, no spool file removed yet).
KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from tracegym.store import object_lake
    home, point = sys.argv[1], sys.argv[2]
    real_commit, real_unlink = object_lake.commit_parts, Path.unlink
    def commit_parts(*args, **kwargs):
        if point == "commit":
            os.kill(os.getpid(), signal.SIGKILL)
        return real_commit(*args, **kwargs)
    def unlink(self, *args, **kwargs):
        if point == "unlink" and self.suffix == ".jsonl":
            os.kill(os.getpid(), signal.SIGKILL)
        return real_unlink(self, *args, **kwargs)
    object_lake.commit_parts, Path.unlink = commit_parts, unlink
    object_lake.compact(home, object_lake.open_lake(home))
    """
)


def point_at(home: Path, url: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    object_lake.set_lake(home, LakeConfig(url))


def counts(home: Path) -> tuple:
    with Store(home, compact_on_open=False) as store:
        return store.fetch(COUNTS).rows[0]


def objects(url: str) -> tuple[int, list[str]]:
    """(parts the commits name, Parquet objects no commit names) in the lake at `url`."""
    lake = ObjectLake(LakeConfig(url))
    named = {lake.path(p.path) for p in lake.snapshot().parts()}
    lake.fs.invalidate_cache()
    found = [p for p in lake.fs.find(lake.root) if p.endswith(".parquet")]
    return len(named), sorted(set(found) - named)


def assert_exact(url: str, total: int, outcomes: int, *homes: Path) -> None:
    """Every span once in the committed parts, no spool left, no orphan, readers agree."""
    lake = ObjectLake(LakeConfig(url))
    parts = lake.snapshot().parts()
    stems = [s for c in lake.snapshot().commits for s in c.sources]
    assert len(stems) == len(set(stems))  # no spool file committed twice
    assert sum(p.rows for p in parts) == total + outcomes
    for home in homes:
        assert not list(spool_dir(home).glob("*.jsonl"))
        assert counts(home) == (total, total, outcomes)


@pytest.mark.slow
def test_three_compactors_on_one_home_commit_every_span_once(tmp_path: Path, s3_bucket: str):
    url = f"{s3_bucket}/lake"
    home = tmp_path / "home"
    total = write_spool(home, files=6, spans_per_file=1000)
    point_at(home, url)
    script = (
        "import json, sys\nfrom tracegym.store import object_lake\n"
        "r = object_lake.compact(sys.argv[1], object_lake.open_lake(sys.argv[1]))\n"
        "print(json.dumps({'files': r.files, 'spans': r.spans, 'busy': r.busy}))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(home)], stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]  # fmt: skip
    reports = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    # the home's lock: one moved all six files, the others waited and found nothing left
    assert sum(r["files"] for r in reports) == 6 and sum(r["spans"] for r in reports) == total
    assert not any(r["busy"] for r in reports)
    assert_exact(url, total, 0, home)
    assert objects(url)[1] == []


def test_two_hosts_racing_for_one_commit_number_commit_each_file_once(
    tmp_path: Path, s3_bucket: str
):
    """Host A has spool files 0-3, host B files 2-5 (2 and 3 delivered to both): both upload,
    then both put commit 0. One wins; the other finds the number taken, reads the commit, drops
    (and deletes) its parts of files 2 and 3, and commits files 4 and 5 as commit 1."""
    url = f"{s3_bucket}/lake"
    template = tmp_path / "template"
    write_spool(template, files=6, spans_per_file=800)
    files = sorted(spool_dir(template).glob("*.jsonl"))
    homes = {"a": tmp_path / "a", "b": tmp_path / "b"}
    for name, chosen in (("a", files[:4]), ("b", files[2:])):
        spool_dir(homes[name]).mkdir(parents=True)
        for path in chosen:
            shutil.copy(path, spool_dir(homes[name]) / path.name)
        point_at(homes[name], url)
    procs = {
        name: subprocess.Popen([sys.executable, "-c", PAUSED, str(home)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        for name, home in homes.items()
    }  # fmt: skip
    try:
        for proc in procs.values():
            assert proc.stdout.readline().strip() == "uploaded"  # both uploaded, none committed
        named, orphans = objects(url)
        assert (named, len(orphans)) == (0, 2 * 4 * 2)  # 2 hosts, 4 files, 2 days each
        for name in ("a", "b"):  # a puts commit 0 first, then b tries the same number
            procs[name].stdin.write("go\n")
            procs[name].stdin.flush()
            if name == "a":
                first = json.loads(procs[name].stdout.readline())
        second = json.loads(procs["b"].stdout.readline())
        assert [p.wait(timeout=60) for p in procs.values()] == [0, 0]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    assert first["aimed_at"] == second["aimed_at"] == [0]
    assert (first["commits"], first["conflicts"], first["spans"]) == (1, 0, 4 * 800)
    assert (second["commits"], second["conflicts"], second["spans"]) == (1, 1, 2 * 800)
    lake = ObjectLake(LakeConfig(url))
    assert [sorted(c.sources) for c in lake.snapshot().commits] == [
        [p.stem for p in files[:4]],
        [p.stem for p in files[4:]],
    ]
    assert_exact(url, 6 * 800, 0, *homes.values())
    assert objects(url)[1] == []  # the loser deleted its parts of files 2 and 3


@pytest.mark.parametrize("point", ["commit", "unlink"])
def test_a_compactor_killed_mid_commit_loses_and_duplicates_nothing(
    tmp_path: Path, s3_bucket: str, point: str
):
    url = f"{s3_bucket}/lake"
    home, remote = tmp_path / "home", tmp_path / "remote-reader"
    total = write_spool(home, files=3, spans_per_file=1500, outcomes=True)
    point_at(home, url)
    point_at(remote, url)  # another host: no spool, reads the lake alone
    proc = subprocess.run([sys.executable, "-c", KILLED, str(home), point], timeout=120)
    assert proc.returncode == -9
    assert len(list(spool_dir(home).glob("*.jsonl"))) == 3  # no spool file removed
    named, orphans = objects(url)
    if point == "commit":  # uploaded, never committed: invisible
        assert (named, len(orphans)) == (0, 9)
        assert counts(remote) == (0, 0, 0)
    else:  # committed, spool kept: the spool is read, its committed parts left out
        assert (named, orphans) == (9, [])
        assert counts(remote) == (total, total, 3)
    assert counts(home) == (total, total, 3)
    report = object_lake.compact(home, ObjectLake(LakeConfig(url)), orphan_grace_s=0)
    if point == "commit":
        assert (report.commits, report.already_committed, report.orphans_removed) == (1, 0, 9)
    else:
        assert (report.commits, report.already_committed, report.spans) == (0, 3, 0)
    assert_exact(url, total, 3, home, remote)
    assert objects(url) == (9, [])


# A compactor of one file a batch that stops at each point a reader can meet until told go:
# before a batch, uploaded (not committed), committed (spool file not yet removed), after it.
STEPPED = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tracegym.store import object_lake
    def pause(point):
        print(point, flush=True)
        if sys.stdin.readline().strip() != "go":
            sys.exit(3)
    real_batch, real_commit, real_unlink = (object_lake.compact_batch, object_lake.commit_parts,
                                            Path.unlink)
    def batch(*args, **kwargs):
        pause("before")
        real_batch(*args, **kwargs)
        pause("after")
    def commit_parts(*args, **kwargs):
        pause("uploaded")
        return real_commit(*args, **kwargs)
    def unlink(self, *args, **kwargs):
        if self.suffix == ".jsonl":
            pause("committed")
        return real_unlink(self, *args, **kwargs)
    object_lake.compact_batch, object_lake.commit_parts, Path.unlink = batch, commit_parts, unlink
    object_lake.compact(sys.argv[1], object_lake.open_lake(sys.argv[1]), batch_files=1)
    print("done", flush=True)
    """
)


@pytest.mark.slow
def test_readers_during_commits_always_count_exactly(tmp_path: Path, s3_bucket: str):
    """A reader on the compacting host (its views made once, before the compaction) counts every
    span once at every point; a reader on another host, refreshing its views at each point,
    counts exactly the files committed by then (with its part cache on, and with it off)."""
    url = f"{s3_bucket}/lake"
    home = tmp_path / "home"
    files, per_file = 3, 500
    total = write_spool(home, files=files, spans_per_file=per_file, outcomes=True)
    point_at(home, url)
    remotes = []
    for name, cache in (("cached", True), ("direct", False)):
        (tmp_path / name).mkdir()
        object_lake.set_lake(tmp_path / name, LakeConfig(url, cache=cache))
        remotes.append(Store(tmp_path / name, compact_on_open=False))
    local = Store(home, compact_on_open=False)  # lists the spool files now
    answers: list[tuple[str, tuple, list[tuple]]] = []
    child = subprocess.Popen([sys.executable, "-c", STEPPED, str(home)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for line in child.stdout:
            point = line.strip()
            if point == "done":
                break
            for remote in remotes:
                remote.compact()  # nothing to compact there: makes its views again
            there = [remote.fetch(COUNTS).rows[0] for remote in remotes]
            answers.append((point, local.fetch(COUNTS).rows[0], there))
            child.stdin.write("go\n")
            child.stdin.flush()
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            child.kill()
        for store in (local, *remotes):
            store.close()
    assert [p for p, _, _ in answers] == ["before", "uploaded", "committed", "after"] * files
    assert {here for _, here, _ in answers} == {(total, total, files)}
    committed = [0, 0, 1, 1]  # files committed by each point of a batch, beyond earlier ones
    expected = [
        [((i + committed[j]) * per_file, (i + committed[j]) * per_file, i + committed[j])] * 2
        for i in range(files)
        for j in range(4)
    ]
    assert [there for _, _, there in answers] == expected
    assert_exact(url, total, files, home, tmp_path / "cached", tmp_path / "direct")
