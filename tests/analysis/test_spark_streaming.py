"""A streamed analysis's worker tasks on Spark (`analyze(..., engine="spark")`, on `local[1]`):
the same gaps, findings and runs as the worker processes give, and a task that fails is said,
reported and redone in process. Needs the `spark` extra and Java; skipped without them."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pyspark)")

from tracegym.analysis import spark_tasks, streaming
from tracegym.analysis.detectors.registry import default_detectors
from tracegym.analysis.pipeline import analyze
from tracegym.tests.fixtures import planted as pl
from tracegym.tests.fixtures.hash_embedder import HashEmbedder

from tests.analysis.test_streaming import _OnlyHere

# The JVM starts in 20-30 s on 2 busy cores (see tests/store/test_spark_views.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def session():
    java = shutil.which("java")
    if java is None or subprocess.run([java, "-version"], capture_output=True).returncode:
        pytest.skip("no working Java runtime (pyspark needs one)")
    with spark_tasks.spark_session(1) as spark:
        yield spark


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("planted")
    pl.generate(home, 0)
    return home


def _document(result) -> dict:
    doc = json.loads(json.dumps(result.gaps_document().to_dict(), default=str))
    doc.pop("generated_at")
    return doc


def test_spark_tasks_give_what_worker_processes_give(
    session, planted: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(streaming, "RUNS_PER_PARTITION", 25)
    embedder = HashEmbedder(planted / "cache")
    processes = analyze(planted, embedder=embedder, write=False, max_resident=40, workers=2)
    said: list[str] = []
    on_spark = analyze(planted, embedder=embedder, write=False, max_resident=40,
                       engine="spark", progress=said.append)  # fmt: skip
    assert any("in 1 Spark task" in line for line in said), said
    assert not any("instead" in line for line in said), said
    assert on_spark.streamed and len(on_spark.facts) == len(processes.facts) > 40
    assert _document(on_spark) == _document(processes)
    assert {k: [f.to_dict() for f in v] for k, v in on_spark.findings.items()} == {
        k: [f.to_dict() for f in v] for k, v in processes.findings.items()
    }
    assert [dataclasses.asdict(r) for r in on_spark.runs] == [
        dataclasses.asdict(r) for r in processes.runs
    ]
    processes.runs.close()
    on_spark.runs.close()


def test_a_spark_task_that_fails_is_reported_and_redone_in_process(
    session, planted: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(streaming, "RUNS_PER_PARTITION", 25)
    reported: list[str] = []
    monkeypatch.setattr(streaming.internal, "report_error",
                        lambda where, exc: reported.append(str(exc)))  # fmt: skip
    said: list[str] = []
    result = analyze(planted, embedder=HashEmbedder(planted / "cache"), write=False,
                     max_resident=40, engine="spark", progress=said.append,
                     detectors=[*default_detectors(), _OnlyHere()])  # fmt: skip
    assert [r.split(":")[0] for r in reported] == [
        "a fit task failed on Spark",
        "a detect task failed on Spark",
    ]
    assert sum("working in this process instead" in line for line in said) == 2
    assert result.streamed and len(result.facts) == len(result.runs) > 40
    result.runs.close()


def test_a_local_session_that_cannot_start_says_what_it_needs(monkeypatch: pytest.MonkeyPatch):
    from pyspark.sql import SparkSession

    def no_java(self):
        raise RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited")

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", no_java)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    starting = spark_tasks.spark_session(1)
    with pytest.raises(RuntimeError, match=r"JAVA_GATEWAY_EXITED.*tracegym\[spark\]"):
        starting.__enter__()
    assert "PYSPARK_PYTHON" not in os.environ  # set for the start only, and put back
