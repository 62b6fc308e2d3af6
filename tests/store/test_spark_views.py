"""Spark reads the views: on `local[1]`, every view's rows equal DuckDB's on the same lake.

The lake is built here: runs of a small agent traced by the real tracer, plus hand-made records
for what those runs do not have (exception events, dotted error types, memory reads linked to
the latest of two writes, a later outcome overriding an earlier one, nightly records, spans on
two days), and a gaps.json. Needs the `spark` extra and Java; skipped without them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("sqlglot", reason="the spark extra is not installed (sqlglot)")
pytest.importorskip("pyspark", reason="the spark extra is not installed (pyspark)")


import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.cli import app
from tracegym.store import lake
from tracegym.store.dialects import DERIVED, spark_statements
from tracegym.store.home import Home
from tracegym.store.records import outcome_record, span_record, stable_id, write_spool_file
from tracegym.store.spark import VIEWS, register_views
from tracegym.store.store import Store
from tracegym.tracer import semconv as sc
from tracegym.tracer.operations import state
from typer.testing import CliRunner

# The JVM starts in 20-30 s on 2 busy cores and 2 minutes on a starved one: room above the
# suite's 300 s for the module's first test, whose set-up queries every view on both engines.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _java_problem() -> str | None:
    java = shutil.which("java")
    if java is None:
        return "no Java runtime (pyspark needs one: apt-get install openjdk-17-jre-headless)"
    done = subprocess.run([java, "-version"], capture_output=True, check=False)
    return None if done.returncode == 0 else f"`java -version` failed: {done.stderr[-200:]!r}"


DAY1 = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z
DAY2 = DAY1 + 86_400 * 10**9
MS = 1_000_000


@pytest.fixture(scope="module")
def spark():
    problem = _java_problem()
    if problem:
        pytest.skip(problem)
    from pyspark.sql import SparkSession

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)  # the cost UDF's workers import tracegym
        session = (
            SparkSession.builder.master("local[1]")
            .appName("tracegym-test")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.default.parallelism", "1")
            # A few tiny queries: planning and code generation are most of their time.
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.sql.codegen.wholeStage", "false")
            .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        yield session
        session.stop()


def _traced_runs(home: Path) -> None:
    """Two runs of an agent through the real tracer (one tool call fails), with outcomes."""
    saved = state.tracer, state.settings
    tg.init(home=home, provider=TracerProvider(), capture_messages=True, flush_interval_s=0.05)
    try:

        @tg.tool
        def get_order(order_id: str) -> dict:
            if order_id == "missing":
                raise KeyError(order_id)
            return {"id": order_id, "total": 12.5}

        @tg.llm(model="gpt-4o-mini")
        def think(messages: list) -> dict:
            return {"content": "ok", "usage": {"input_tokens": 1200, "output_tokens": 300}}

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
        tg.record_outcome("bad", success=False, reward=0.0, source="test", labels={"why": "x"})
        tg.shutdown()
    finally:
        state.tracer, state.settings = saved


def _span(trace: str, n: int, name: str, start: int, **kw: Any) -> dict:
    return span_record(
        trace_id=stable_id(trace), span_id=stable_id(trace, n, width=16), name=name,
        start_ns=start, end_ns=start + 5 * MS, **kw,
    )  # fmt: skip


def _made_records(home: Path) -> None:
    """What the traced runs lack, on two days; written as spool files, then compacted."""
    root = _span("hand", 0, "invoke_agent billing", DAY2, resource={"service.name": "billing"},
                 attributes={sc.OPERATION: "invoke_agent", sc.AGENT_NAME: "billing",
                             sc.RUN_ID: "hand-run"})  # fmt: skip
    parent = {"parent_span_id": root["span_id"]}
    tool = {sc.OPERATION: sc.OP_TOOL, sc.TOOL_NAME: "refund", sc.AGENT_NAME: "billing"}
    records = [
        root,
        _span("hand", 1, "execute_tool refund", DAY2 + MS, status="ERROR", **parent,
              attributes={**tool, sc.ERROR_TYPE: "builtins.ValueError", sc.STEP_INDEX: 1},
              events=[{"name": "exception", "attributes": {"exception.message": "first"}},
                      {"name": "exception", "attributes": {"exception.message": "last one"}},
                      {"name": "exception", "attributes": {"exception.message": ""}}]),
        _span("hand", 2, "execute_tool refund", DAY2 + 2 * MS, status="ERROR", **parent,
              status_message="timed out", attributes={**tool, sc.STEP_INDEX: 2}),
        _span("hand", 3, "execute_tool refund", DAY2 + 3 * MS, **parent,
              attributes={**tool, sc.TOOL_ARGUMENTS: '{"amount": 3}', sc.STEP_INDEX: 3}),
        _span("hand", 4, "chat unknown", DAY2 + 4 * MS, **parent,
              attributes={sc.OPERATION: sc.OP_CHAT, sc.REQUEST_MODEL: "no-such-model-xyz",
                          sc.INPUT_TOKENS: 7, sc.OUTPUT_TOKENS: 2}),
    ]  # fmt: skip
    memory = {sc.MEMORY_STORE: "kb", sc.AGENT_NAME: "billing"}
    write = {**memory, sc.OPERATION: sc.OP_MEMORY_UPDATE}
    for n, (start, digest) in enumerate([(10, "h1"), (20, "h1"), (30, "h2"), (90, "h3")]):
        records.append(
            _span(
                "hand",
                10 + n,
                "update_memory kb",
                DAY2 + start * MS,
                **parent,
                attributes={**write, sc.MEMORY_CONTENT_HASH: digest, sc.MEMORY_RECORD: f"r{n}"},
            )
        )
    records.append(
        _span(
            "hand",
            20,
            "search_memory kb",
            DAY2 + 60 * MS,
            **parent,
            attributes={
                **memory,
                sc.OPERATION: sc.OP_MEMORY_SEARCH,
                sc.MEMORY_QUERY: "q",
                sc.MEMORY_RESULT_HASHES: ["h2", "h9", "h1", "h3"],
                sc.MEMORY_RESULT_IDS: ["a", "b", "c", "d"],
            },
        )
    )
    records.append(outcome_record("hand-run", time_ns=DAY2 + 100 * MS, success=False))
    records.append(outcome_record("hand-run", time_ns=DAY2 + 200 * MS, success=True, reward=0.5))
    records.append(outcome_record("nobody", time_ns=DAY2 + 300 * MS, success=True))
    for n, (date, start, gaps) in enumerate(
        [("2025-11-30", DAY1, 1), ("2025-11-30", DAY1 + MS, 2), ("2025-12-01", DAY2, 3)]
    ):
        attributes = {sc.OPERATION: "nightly", sc.NIGHTLY_PREFIX + "date": date,
                      sc.NIGHTLY_PREFIX + "gaps": gaps, sc.NIGHTLY_PREFIX + "report": "r.md",
                      sc.NIGHTLY_PREFIX + "stages": json.dumps({"analyze": "ok"})}  # fmt: skip
        records.append(
            span_record(
                trace_id=stable_id("nightly", n),
                span_id=stable_id("n", n, width=16),
                name=sc.NIGHTLY_SPAN_NAME,
                start_ns=start,
                end_ns=start,
                attributes=attributes,
            )
        )
    write_spool_file(home, records, "hand-made")


def _gaps(home: Path) -> None:
    member = {
        "trace_id": stable_id("hand"),
        "run_id": "hand-run",
        "step": 2,
        "position": 1,
        "agent": "billing",
        "span_ids": [stable_id("hand", 2, width=16)],
        "evidence": "t",
    }
    gaps = [
        {"id": "g1", "name": "refund timeouts", "rank": 1, "detector": "d", "kind": "tool",
         "members": [member, {**member, "step": 1, "span_ids": []}]},
        {"id": "g2", "name": "older file", "rank": "2", "examples": [{"run_id": "bad"}]},
    ]  # fmt: skip
    Home.at(home).gaps.write_text(json.dumps({"gaps": gaps}), encoding="utf-8")


@pytest.fixture(scope="module")
def lake_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("spark-lake")
    _traced_runs(home)
    _made_records(home)
    _gaps(home)
    report = lake.compact(home)
    assert report.files >= 2 and not report.skipped_live
    return home


def _value(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 9)
    if isinstance(value, list | tuple):
        return tuple(_value(v) for v in value)
    return value


def _rows(rows: list) -> list[tuple]:
    return sorted((tuple(_value(v) for v in row) for row in rows), key=repr)


def _duckdb_view(home: Path, view: str) -> tuple[list[str], list[tuple]]:
    with Store(home, compact_on_open=False) as store:
        got = store.fetch(f"SELECT * FROM {view}")
    return list(got.columns), _rows(got.rows)


def _spark_view(spark: Any, view: str) -> tuple[list[str], list[tuple]]:
    frame = spark.sql(f"SELECT * FROM {view}")
    return list(frame.columns), _rows(frame.collect())


@pytest.fixture(scope="module")
def both(spark: Any, lake_home: Path) -> dict[str, tuple[tuple, tuple]]:
    """Per view, (DuckDB's columns and rows, Spark's): each engine queries each view once."""
    assert register_views(spark, lake_home) == VIEWS
    return {view: (_duckdb_view(lake_home, view), _spark_view(spark, view)) for view in VIEWS}


def _where(both: dict, view: str, **match: Any) -> list[dict[str, Any]]:
    """Spark's rows of `view` as dicts, those whose columns equal `match`."""
    columns, rows = both[view][1]
    dicts = [dict(zip(columns, row, strict=True)) for row in rows]
    return [d for d in dicts if all(d[k] == v for k, v in match.items())]


def test_every_view_has_duckdbs_rows(both: dict):
    for view, ((duck_columns, duck_rows), (spark_columns, spark_rows)) in both.items():
        assert spark_columns == duck_columns, view
        assert spark_rows == duck_rows, view
        assert duck_rows, f"{view}: the lake was meant to give it rows"


def test_the_dialects_hard_cases_are_in_the_rows(both: dict):
    """The comparison above is only as good as the data: these are the rows a naive
    transpilation gets wrong (NULL JSON paths, the last non-empty message, the ASOF link)."""
    errors = sorted(
        (r["step_index"], r["error_message"]) for r in _where(both, "tool_calls", agent="billing")
    )
    assert errors == [(1, "last one"), (2, "timed out"), (3, None)]
    (hand,) = _where(both, "traces", run_id="hand-run")
    assert hand["first_error"] == "refund: ValueError: last one"
    assert hand["start_time"] == dt.datetime(2025, 12, 1)  # UTC wall time, whatever the zone
    assert (hand["success"], hand["reward"]) == (True, 0.5)  # the later outcome
    (read,) = _where(both, "memory_ops", operation="search_memory", store="kb")
    assert read["result_hashes"] == ("h2", "h9", "h1", "h3")  # h3 was written after the read
    ids = [stable_id("hand", n, width=16) for n in (12, 11)]
    assert read["source_write_span_ids"] == (ids[0], None, ids[1], None)
    nights = sorted((r["date"], r["gaps"]) for r in _where(both, "nightly"))
    assert nights == [("2025-11-30", 2), ("2025-12-01", 3)]
    costs = {r["model"]: r["cost"] for r in _where(both, "llm_calls")}
    assert costs["gpt-4o-mini"] > 0 and costs["no-such-model-xyz"] is None
    steps = sorted((r["gap_id"], r["step"]) for r in _where(both, "gap_runs"))
    assert steps == [("g1", 1), ("g1", 2), ("g2", None)]


def test_an_empty_home_has_every_view_with_duckdbs_columns(spark: Any, tmp_path: Path):
    register_views(spark, tmp_path)
    for view in VIEWS:
        duck_columns, _ = _duckdb_view(tmp_path, view)
        assert spark.table(view).columns == duck_columns, view
    counts = " + ".join(f"(SELECT count(*) FROM {view})" for view in VIEWS)
    assert spark.sql(f"SELECT {counts}").first()[0] == 0


def test_views_dialect_spark_prints_a_script_spark_runs(spark: Any, lake_home: Path):
    done = CliRunner().invoke(app, ["--home", str(lake_home), "views", "--dialect", "spark"])
    assert done.exit_code == 0, done.output
    lines = [line for line in done.output.splitlines() if not line.startswith("--")]
    script = "\n".join(lines)
    statements = [s for s in script.split(";\n") if s.strip()]
    assert [s.strip() for s in statements] == [s.strip() for s in spark_statements(lake_home)]
    for name in DERIVED:
        spark.catalog.dropTempView(name)
    from tracegym.store.spark import register_cost

    register_cost(spark, lake_home)
    for statement in statements:
        spark.sql(statement)
    assert spark.sql("SELECT count(*) FROM traces").first()[0] == 3  # good, bad, hand-run


def test_an_object_lake_reads_as_in_duckdb_and_never_an_uncommitted_part(
    spark: Any, tmp_path: Path
):
    """A home compacted into an object lake (`compact --to`; a file:// URL here): Spark reads
    the parts its commits name, a part a killed compactor uploaded without a commit never."""
    pytest.importorskip("fsspec", reason="the s3 extra is not installed (fsspec)")
    from tracegym.store import object_lake

    home, root = tmp_path / "home", tmp_path / "objects"
    object_lake.set_lake(home, object_lake.LakeConfig(root.as_uri()))
    _traced_runs(home)
    _made_records(home)
    _gaps(home)
    assert object_lake.compact(home, object_lake.open_lake(home)).commits >= 1
    committed = sorted(root.glob("spans/day=*/part-*.parquet"))[0]
    committed.with_name("part-uncommitted-0.parquet").write_bytes(committed.read_bytes())
    register_views(spark, home)
    for view in VIEWS:
        assert _spark_view(spark, view) == _duckdb_view(home, view), view
