"""The dashboard on a home whose lake is on object storage (docs/object_storage.md): its pages
read the committed parts through the readers' part cache (fsspec's memory filesystem) or in
place (a local path), plus the spool, each run once; every page names the remote lake; the
sandbox still reads nothing else; a lake that cannot be opened leaves the spool's runs, and
every page says the lake is not shown."""

from __future__ import annotations

import html
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("duckdb")
pytest.importorskip("fsspec", reason="the object lake needs fsspec: the s3 extra")

import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.store import object_lake
from tracegym.store.lake import lake_dir
from tracegym.store.object_lake import LakeConfig, ObjectLake
from tracegym.store.store import Store
from tracegym.tracer.operations import state
from tracegym.tracer.spool import spool_dir

PAGES = ("/", "/runs", "/sessions", "/gaps", "/environments", "/adapters")


def _trace(home: Path, run_ids: list[str]) -> None:
    """One agent run per id, with a tool call; the ids ending in 'bad' fail."""
    saved = state.tracer, state.settings
    tg.init(home=home, provider=TracerProvider(), flush_interval_s=0.05)

    @tg.tool
    def lookup(query: str) -> str:
        if query.endswith("bad"):
            raise KeyError(query)
        return "found"

    @tg.agent(name="support", run_id=lambda task: task)
    def run(task: str) -> str:
        try:
            return lookup(task)
        except KeyError:
            return "not found"

    for run_id in run_ids:
        run(run_id)
        tg.record_outcome(run_id, success=not run_id.endswith("bad"))
    tg.shutdown()
    state.tracer, state.settings = saved


def _client(home: Path) -> Any:
    from starlette.testclient import TestClient
    from tracegym.dashboards.app import create_app

    return TestClient(create_app(home), base_url="http://127.0.0.1", client=("127.0.0.1", 5000))


def _text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page)))


def _value(client: Any, select: str) -> str:
    """What the SQL box answers to `SELECT <select> AS v ...` (one row, one value)."""
    status, text = _sql(client, f"SELECT '[' || ({select}) || ']' AS v")
    assert status == 200, text[-500:]
    found = re.search(r"v \[([^\]]*)\]", text)
    assert found, text[-500:]
    return found.group(1).strip()


def _runs_listed(client: Any) -> set[str]:
    """The runs in the traces view, as the SQL box reads them."""
    return set(_value(client, "SELECT string_agg(run_id, ',') FROM traces").split(","))


def _sql(client: Any, sql: str) -> tuple[int, str]:
    page = client.get("/runs", params={"sql": sql})
    return page.status_code, _text(page.text)


@pytest.fixture
def memory_url() -> Iterator[str]:
    url = f"memory://tg-{uuid.uuid4().hex[:12]}/lake"
    yield url
    lake = ObjectLake(LakeConfig(url))
    if lake.fs.exists(lake.root):
        lake.fs.rm(lake.root, recursive=True)


def _compacted_home(home: Path, url: str) -> Path:
    """Four runs compacted into the object lake at `url` (nothing left in the spool), then two
    more in the spool only."""
    object_lake.set_lake(home, LakeConfig(url))
    _trace(home, ["run-1", "run-2", "run-3-bad", "run-4-bad"])
    with Store(home) as store:  # compacts on open, into the object lake
        assert store.last_compaction is not None and store.last_compaction.files >= 1
    assert not list(spool_dir(home).glob("*.jsonl"))
    assert not list(lake_dir(home).rglob("*.parquet"))  # nothing in the local lake
    _trace(home, ["run-5", "run-6-bad"])
    return home


def test_pages_read_the_committed_parts_and_the_spool_and_name_the_lake(
    tmp_path: Path, memory_url: str
):
    home = _compacted_home(tmp_path, memory_url)
    with _client(home) as client:
        for path in (*PAGES, "/run/run-1", "/runs/run-3-bad"):
            page = client.get(path)
            assert page.status_code == 200, (path, page.text[:300])
            assert f"Lake on object storage: {memory_url}" in _text(page.text), path
        assert _runs_listed(client) == {f"run-{i}" for i in (1, 2)} | {
            "run-3-bad", "run-4-bad", "run-5", "run-6-bad"
        }  # fmt: skip
        # each run once: the committed ones from the cache, the new ones from the spool
        counts = "SELECT count(*) || ' ' || count(DISTINCT run_id) FROM traces"
        assert _value(client, counts) == "6 6"
        assert _value(client, "SELECT count(*) FROM traces WHERE NOT success") == "3"
        # the run page of a compacted run shows its tool call
        assert "lookup" in _text(client.get("/run/run-4-bad").text)
    copies = list((home / "cache" / "lake").rglob("*.parquet"))
    assert copies, "the committed parts were read from local copies"


def test_sandbox_reads_the_cache_but_nothing_else(tmp_path: Path, memory_url: str):
    home = _compacted_home(tmp_path, memory_url)
    outside = tmp_path.parent / f"outside-{uuid.uuid4().hex[:8]}.csv"
    outside.write_text("secret\n42\n")
    part = ObjectLake(LakeConfig(memory_url)).snapshot().parts("spans")[0]
    try:
        with _client(home) as client:
            cached = str(home / "cache" / "lake" / part.path)
            rows = _value(client, f"SELECT count(*) FROM read_parquet('{cached}')")
            assert rows == str(part.rows)
            for sql in (
                f"SELECT * FROM read_csv('{outside}')",
                f"SELECT * FROM read_parquet('{memory_url}/{part.path}')",
                "SELECT * FROM read_csv('/etc/passwd')",
            ):
                status, text = _sql(client, sql)
                assert status == 400 and "secret" not in text and "root:" not in text, sql
    finally:
        outside.unlink()


def test_a_lake_on_a_local_path_is_read_in_place(tmp_path: Path):
    root = tmp_path / "bucket" / "lake"
    home = _compacted_home(tmp_path / "home", str(root))
    with _client(home) as client:
        assert len(_runs_listed(client)) == 6
        assert f"Lake on object storage: {root}" in _text(client.get("/").text)
    assert not (home / "cache" / "lake").exists()  # read in place, not copied


def test_a_new_commit_is_seen_after_a_refresh(tmp_path: Path, memory_url: str):
    from tracegym.dashboards.db import Database

    home = _compacted_home(tmp_path, memory_url)
    db = Database(home)
    try:
        count = "SELECT count(*) FROM traces"
        assert db.query(count).rows == [(6,)]
        _trace(home, ["run-7"])
        with Store(home):  # another process compacts the spool into a second commit
            pass
        assert len(ObjectLake(LakeConfig(memory_url)).snapshot().commits) == 2
        assert not list(spool_dir(home).glob("*.jsonl"))
        db.refresh()
        assert db.query(count).rows == [(7,)]
        assert db.lake.url == memory_url and db.lake.error is None
    finally:
        db.close()


def test_a_lake_that_cannot_be_opened_leaves_the_spool_and_says_so(tmp_path: Path):
    _trace(tmp_path, ["run-1", "run-2-bad"])  # in the spool only
    url = "nosuchprotocol://bucket/lake"
    (tmp_path / "lake.json").write_text(json.dumps({"version": 1, "url": url}))
    with _client(tmp_path) as client:
        for path in PAGES:
            page = client.get(path)
            assert page.status_code == 200, path
            text = _text(page.text)
            assert f"The lake at {url} is not shown" in text, path
            assert "spool's runs only" in text, path
        assert _runs_listed(client) == {"run-1", "run-2-bad"}


def test_a_local_home_shows_no_lake_note(tmp_path: Path):
    _trace(tmp_path, ["run-1"])
    with _client(tmp_path) as client:
        text = _text(client.get("/").text)
    assert "Lake on object storage" not in text and "is not shown" not in text
