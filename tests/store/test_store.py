"""The embedded store: compaction exactly once (reruns, crashes, concurrent writers), the views
against hand-built traces, and the read-only SQL entry point."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.store import lake
from tracegym.store.records import span_record, stable_id, write_spool_file
from tracegym.store.store import ReadOnlyError, Store, check_read_only
from tracegym.tracer.operations import state
from tracegym.tracer.spool import spool_dir

BASE_NS = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z


def synthetic_spool(home: Path, files: int, spans_per_file: int, day_spread: bool = False) -> int:
    """Write complete spool files of simple tool spans; returns the number of spans."""
    for f in range(files):
        records = []
        for i in range(spans_per_file):
            start = BASE_NS + (f * spans_per_file + i) * 1_000_000
            if day_spread and i % 2:
                start += 86_400 * 10**9  # half the spans fall on the next day
            records.append(
                span_record(
                    trace_id=stable_id("t", f, i // 10),
                    span_id=stable_id("s", f, i, width=16),
                    name="execute_tool lookup",
                    start_ns=start,
                    end_ns=start + 500_000,
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "lookup",
                    },
                )
            )
        write_spool_file(home, records, f"synthetic-{f:04d}")
    return files * spans_per_file


def one(store: Store, query: str) -> tuple:
    rows = store.sql(query).fetchall()
    assert len(rows) == 1, rows
    return rows[0]


def span_ids(home: Path) -> list[str]:
    with Store(home, compact_on_open=False) as store:
        return [r[0] for r in store.sql("SELECT span_id FROM spans").fetchall()]


def test_compaction_moves_everything_once_and_rerun_is_a_no_op(tmp_path: Path):
    total = synthetic_spool(tmp_path, files=3, spans_per_file=40, day_spread=True)
    report = lake.compact(tmp_path)
    assert report.files == 3 and report.spans == total
    assert report.parts == 6  # two days per file
    assert not list(spool_dir(tmp_path).glob("*.jsonl"))
    days = sorted(p.name for p in lake.spans_dir(tmp_path).iterdir())
    assert days == ["day=2025-11-30", "day=2025-12-01"]
    again = lake.compact(tmp_path)
    assert again.files == 0 and again.spans == 0
    ids = span_ids(tmp_path)
    assert len(ids) == total == len(set(ids))


def test_failure_between_lake_write_and_spool_removal_duplicates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    total = synthetic_spool(tmp_path, files=2, spans_per_file=25)
    real_unlink = Path.unlink

    def crash(self: Path, *args, **kwargs):
        if self.suffix == ".jsonl":
            raise OSError("simulated crash before the spool file is removed")
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", crash)
    with pytest.raises(OSError, match="simulated crash"):
        lake.compact(tmp_path)
    monkeypatch.setattr(Path, "unlink", real_unlink)
    # The first file's parts are in the lake AND its spool file is still there.
    assert list(lake.spans_dir(tmp_path).rglob("*.parquet"))
    lake.compact(tmp_path)
    ids = span_ids(tmp_path)
    assert len(ids) == total == len(set(ids))


def test_compaction_killed_at_random_points_then_rerun_keeps_every_span_once(tmp_path: Path):
    total = synthetic_spool(tmp_path, files=12, spans_per_file=300)
    script = textwrap.dedent(
        f"""
        from tracegym.store import lake
        lake.compact({str(tmp_path)!r})
        """
    )
    for delay in (0.3, 0.6, 0.9):
        proc = subprocess.Popen([sys.executable, "-c", script])
        time.sleep(delay)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    lake.compact(tmp_path)
    ids = span_ids(tmp_path)
    assert len(ids) == total == len(set(ids))
    assert not list((lake.lake_dir(tmp_path) / lake.STAGING_DIR).glob("*/*.parquet"))


def test_concurrent_writer_processes_then_compaction(tmp_path: Path):
    script = textwrap.dedent(
        f"""
        import sys
        import tracegym as tg
        tg.init(home={str(tmp_path)!r}, flush_interval_s=0.05)
        @tg.tool
        def work(i): return i
        @tg.agent(name="w")
        def run(n):
            for i in range(n): work(i)
        for _ in range(10): run(100)
        tg.shutdown()
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(3)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    with Store(tmp_path) as store:
        assert store.last_compaction is not None and store.last_compaction.files >= 3
        rows = one(store, "SELECT count(*), count(DISTINCT span_id) FROM tool_calls")
        assert rows == (3 * 10 * 100, 3 * 10 * 100)
        assert one(store, "SELECT count(*) FROM traces") == (30,)


def test_partial_last_line_of_a_dead_writer_is_dropped(tmp_path: Path):
    synthetic_spool(tmp_path, files=1, spans_per_file=5)
    path = next(spool_dir(tmp_path).glob("*.jsonl"))
    with open(path, "ab") as handle:
        handle.write(b'{"v":1,"trace_id":"ab')  # a crash mid-write
    report = lake.compact(tmp_path)
    assert report.truncated_lines == 1 and report.spans == 5


@pytest.fixture
def traced_home(tmp_path: Path):
    """Two runs of a small agent traced into `tmp_path`, one failing, with outcomes."""
    provider = TracerProvider()
    saved = state.tracer, state.settings
    tg.init(home=tmp_path, provider=provider, capture_messages=True, flush_interval_s=0.05)

    @tg.tool
    def get_order(order_id: str) -> dict:
        if order_id == "missing":
            raise KeyError(order_id)
        return {"id": order_id, "total": 12.5}

    @tg.llm(model="test-model")
    def think(messages: list) -> dict:
        return {"content": "ok", "usage": {"input_tokens": 10, "output_tokens": 5}}

    @tg.memory_write("notes")
    def remember(key: str, value: str) -> None:
        pass

    @tg.memory_read("notes")
    def recall(key: str) -> str:
        return "refund approved"

    @tg.agent(name="support", run_id=lambda task: task)
    def run(task: str) -> str:
        think([{"role": "user", "content": task}])
        with contextlib.suppress(KeyError):
            get_order("missing" if task == "bad" else "W1")
        remember("policy", "refund approved")
        return recall("policy")

    run("good")
    run("bad")
    tg.record_outcome("good", success=True, reward=1.0, source="test")
    tg.record_outcome("bad", success=False, reward=0.0, source="test", labels={"why": "missing"})
    tg.shutdown()
    yield tmp_path
    state.tracer, state.settings = saved


def test_views_match_the_traced_runs(traced_home: Path):
    with Store(traced_home) as store:
        traces = store.sql(
            "SELECT run_id, agent, spans, tool_calls, llm_calls, memory_ops, errors, tokens, "
            "success, reward, outcome_labels FROM traces ORDER BY run_id"
        ).fetchall()
        assert traces == [
            ("bad", "support", 5, 1, 1, 2, 1, 15, False, 0.0, '{"why":"missing"}'),
            ("good", "support", 5, 1, 1, 2, 0, 15, True, 1.0, None),
        ]
        tools = store.sql(
            "SELECT t.tool, t.arguments, t.status, t.error_type, t.step_index, tr.run_id "
            "FROM tool_calls t JOIN traces tr USING (trace_id) ORDER BY tr.run_id"
        ).fetchall()
        assert tools == [
            ("get_order", '{"order_id":"missing"}', "ERROR", "KeyError", 1, "bad"),
            ("get_order", '{"order_id":"W1"}', "UNSET", None, 1, "good"),
        ]
        llm = store.sql("SELECT model, input_tokens, output_tokens FROM llm_calls").fetchall()
        assert llm == [("test-model", 10, 5)] * 2
        # Each read links to the write (of its own run) that stored what it returned.
        links = store.sql(
            "SELECT r.trace_id, w.trace_id, w.span_id = r.source_write_span_ids[1] "
            "FROM memory_ops r JOIN memory_ops w ON w.span_id = r.source_write_span_ids[1] "
            "WHERE r.operation = 'search_memory'"
        ).fetchall()
        assert len(links) == 2 and all(r == w and same for r, w, same in links)
        outcomes = store.sql("SELECT run_id, success, source FROM outcomes ORDER BY 1").fetchall()
        assert outcomes == [("bad", False, "test"), ("good", True, "test")]
        # Outcome spans are not runs of their own.
        assert one(store, "SELECT count(*) FROM spans WHERE name = 'tracegym.outcome'") == (0,)
        assert store.pl("SELECT * FROM traces").height == 2


def test_live_spool_is_visible_before_compaction(tmp_path: Path):
    synthetic_spool(tmp_path, files=1, spans_per_file=7)
    with Store(tmp_path, compact_on_open=False) as store:
        assert one(store, "SELECT count(*) FROM tool_calls") == (7,)
    assert list(spool_dir(tmp_path).glob("*.jsonl"))  # untouched


def test_a_part_rewritten_under_its_name_is_read_anew(tmp_path: Path):
    """The store caches Parquet footers (`parquet_metadata_cache`): a spool file compacted
    again under the same stem (a re-import) rewrites its part in place, at once, with other
    rows; an open store must read the new part, not the old footer."""

    def spool(tool: str, count: int) -> None:
        records = [
            span_record(
                trace_id=stable_id("t", tool), span_id=stable_id("s", tool, i, width=16),
                name=f"execute_tool {tool}", start_ns=BASE_NS + i, end_ns=BASE_NS + i + 1,
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool},
            )
            for i in range(count)
        ]  # fmt: skip
        write_spool_file(tmp_path, records, "reimported")

    spool("lookup", 3)
    with Store(tmp_path) as store:
        assert one(store, "SELECT current_setting('parquet_metadata_cache')") == (True,)
        (part,) = lake.spans_dir(tmp_path).rglob("*.parquet")
        query = "SELECT tool, count(*) FROM tool_calls GROUP BY tool"
        assert store.sql(query).fetchall() == [("lookup", 3)]
        assert one(store, "SELECT count(*) FROM traces") == (1,)
        spool("search", 5)
        assert store.compact().spans == 5
        assert list(lake.spans_dir(tmp_path).rglob("*.parquet")) == [part]  # the same name
        assert store.sql(query).fetchall() == [("search", 5)]
        assert one(store, "SELECT count(*), sum(spans) FROM traces") == (1, 5)
        assert one(store, "SELECT count(*) FROM spans WHERE tool = 'search'") == (5,)


def test_empty_store_has_queryable_views(tmp_path: Path):
    with Store(tmp_path) as store:
        for view in ("spans", "traces", "tool_calls", "llm_calls", "memory_ops", "outcomes"):
            assert one(store, f"SELECT count(*) FROM {view}") == (0,)


@pytest.mark.parametrize(
    "query",
    [
        "DROP VIEW spans",
        "CREATE TABLE x AS SELECT 1",
        "INSERT INTO spans VALUES (1)",
        "COPY (SELECT 1) TO '/tmp/x.csv'",
        "SELECT 1; DELETE FROM spans",
        "ATTACH 'other.db'",
        "SET threads = 1",
        "INSTALL httpfs",
    ],
)
def test_writes_are_refused(tmp_path: Path, query: str):
    with pytest.raises(ReadOnlyError, match="read-only"):
        check_read_only(query)
    with Store(tmp_path) as store, pytest.raises(ReadOnlyError):
        store.sql(query)


def test_reads_are_allowed_and_bad_sql_is_a_clear_error(tmp_path: Path):
    check_read_only("SELECT * FROM spans")
    check_read_only("EXPLAIN SELECT 1")
    with pytest.raises(ReadOnlyError, match="one statement"):
        check_read_only("SELECT * FROM spans; EXPLAIN SELECT 1")
    with pytest.raises(ValueError, match="cannot parse SQL"):
        check_read_only("SELEC nonsense")
