"""Loading runs in batches (`runs.iter_runs`): the same runs, steps and gaps whatever the batch
size, with batches small enough that runs straddle them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from tracegym.analysis import streaming
from tracegym.analysis.detectors.base import Detector
from tracegym.analysis.detectors.registry import default_detectors
from tracegym.analysis.pipeline import analyze
from tracegym.analysis.run_facts import RunFacts, request_of
from tracegym.analysis.runs import _STEP_COLUMNS, build_runs, iter_runs, load_runs
from tracegym.analysis.streaming import count_runs, sample_filter
from tracegym.store.records import outcome_record, span_record, stable_id, write_spool_file
from tracegym.store.store import Store
from tracegym.tests.fixtures import planted as pl
from tracegym.tests.fixtures.hash_embedder import HashEmbedder

ONE_BATCH = 10**9


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("planted")
    pl.generate(home, 0)
    return home


def _runs(home: Path, batch_rows: int, where: str = "") -> list[dict]:
    with Store(home) as store:
        return [dataclasses.asdict(r) for r in load_runs(store, where, batch_rows)]


def _document(result) -> dict:
    doc = json.loads(json.dumps(result.gaps_document().to_dict(), default=str))
    doc.pop("generated_at")
    return doc


def _fetched_at_once(home: Path) -> list[dict]:
    """Runs the way loading worked before batches: every row in one `fetchall`, then grouped."""
    with Store(home) as store:
        traces = store.sql("SELECT trace_id, run_id, agent, success, reward, outcome_source, "
                           "outcome_labels FROM traces ORDER BY start_time, trace_id")  # fmt: skip
        trace_rows = [dict(zip(traces.columns, r, strict=True)) for r in traces.fetchall()]
        steps = store.sql(f"SELECT {', '.join('s.' + c for c in _STEP_COLUMNS)}, "
                          "m.source_write_span_ids FROM spans s LEFT JOIN memory_ops m "
                          "ON m.span_id = s.span_id AND m.trace_id = s.trace_id")  # fmt: skip
        rows = [dict(zip(steps.columns, r, strict=True)) for r in steps.fetchall()]
        return [dataclasses.asdict(r) for r in build_runs(rows, trace_rows)]


def test_runs_are_the_same_in_any_batch_size(planted: Path):
    whole = _runs(planted, ONE_BATCH)
    assert whole == _fetched_at_once(planted)
    assert len(whole) > 60 and sum(len(r["steps"]) for r in whole) > 7 * len(whole)
    for batch_rows in (1, 7, 50):  # a row a batch; runs straddling batches; a few runs a batch
        assert _runs(planted, batch_rows) == whole
    filtered = _runs(planted, 5, where="success = false")
    assert filtered == [r for r in whole if r["success"] is False] and filtered


def test_runs_without_spans_and_order_kept(tmp_path: Path):
    """A run whose outcome arrived but none of its spans is an empty run in its place."""
    records = []
    for i in range(5):
        trace = stable_id("t", i)
        start = 1_764_460_800_000_000_000 + i * 10**9
        if i != 2:
            root = stable_id("t", i, "root", width=16)
            records.append(
                span_record(
                    trace_id=trace,
                    span_id=root,
                    name="invoke_agent a",
                    start_ns=start,
                    end_ns=start + 10,
                    attributes={"gen_ai.operation.name": "invoke_agent"},
                )
            )
            for j in range(3):
                records.append(span_record(
                    trace_id=trace, span_id=stable_id("t", i, j, width=16), parent_span_id=root,
                    name="execute_tool x", start_ns=start + 3 - j, end_ns=start + 5,
                    attributes={"gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": f"x{j}"}))  # fmt: skip
        records.append(outcome_record(trace, time_ns=start + 20, success=i % 2 == 0))
    write_spool_file(tmp_path, records, "t")
    with Store(tmp_path) as store:
        whole = [dataclasses.asdict(r) for r in load_runs(store, batch_rows=ONE_BATCH)]
        streamed = [dataclasses.asdict(r) for r in iter_runs(store, batch_rows=2)]
    assert streamed == whole
    assert [len(r["steps"]) for r in whole].count(0) == (len(whole) - 4)
    ordered = next(r for r in whole if r["steps"])
    assert [s["tool"] for s in ordered["steps"][1:]] == ["x2", "x1", "x0"]  # by start time


def test_analysis_gaps_are_the_same_streamed_and_not(planted: Path):
    whole = analyze(planted, embedder=HashEmbedder(planted / "cache"), write=False,
                    batch_rows=ONE_BATCH)  # fmt: skip
    streamed = analyze(planted, embedder=HashEmbedder(planted / "cache"), write=False,
                       batch_rows=7)  # fmt: skip
    assert whole.gaps, "the planted set has gaps to compare"
    assert _document(streamed) == _document(whole)
    assert {k: [f.to_dict() for f in v] for k, v in streamed.findings.items()} == {
        k: [f.to_dict() for f in v] for k, v in whole.findings.items()
    }


class _FitOn(Detector):
    """A detector fitted only on the runs of `keep` (what a streamed analysis fits on)."""

    def __init__(self, inner: Detector, keep: set[str]) -> None:
        self.inner, self.keep = inner, keep
        self.name, self.description = inner.name, inner.description

    def fit(self, runs):
        self.inner.fit([r for r in runs if r.trace_id in self.keep])
        return self

    def detect(self, run):
        return self.inner.detect(run)


def test_past_max_resident_runs_stream_through_detectors_fitted_on_a_sample(
    planted: Path, monkeypatch: pytest.MonkeyPatch
):
    """Streamed: fitted on a seeded sample, every run detected, runs kept on disk. The same
    gaps and findings as analysing in memory with the detectors fitted on that sample, in one
    partition or several, in one process or two."""
    with Store(planted) as store:
        total = count_runs(store)
        sample = {r.trace_id for r in load_runs(store, sample_filter("", 40))}
        again = {r.trace_id for r in load_runs(store, sample_filter("", 40))}
        failed = {r.trace_id for r in load_runs(store, sample_filter("success = false", 10))}
        kept = [r for r in load_runs(store) if r.trace_id in failed]
        hashed = {
            t
            for (t,) in store.sql(
                "SELECT trace_id FROM traces ORDER BY hash(trace_id), trace_id LIMIT 40"
            ).fetchall()
        }
        writers = {t for (t,) in store.sql("SELECT DISTINCT unnest(source_write_trace_ids) "
                                           "FROM memory_ops").fetchall() if t}  # fmt: skip
    # seeded: the same each time; with every run whose memory another run read (poisoned_memory)
    assert again == sample == hashed | writers and writers - hashed and len(sample) < total
    assert all(r.success is False for r in kept) and len(kept) >= 10
    embedder = HashEmbedder(planted / "cache")
    reference = analyze(planted, embedder=embedder, write=False,
                        detectors=[_FitOn(d, sample) for d in default_detectors()])  # fmt: skip
    assert not reference.streamed and reference.fitted_on == total
    want = [dataclasses.asdict(r) for r in reference.runs]
    for workers, per_partition in ((1, 10**6), (1, 25), (2, 25)):
        monkeypatch.setattr(streaming, "RUNS_PER_PARTITION", per_partition)
        said: list[str] = []
        streamed = analyze(planted, embedder=embedder, write=False, max_resident=40,
                           batch_rows=7, workers=workers, progress=said.append)  # fmt: skip
        assert any(f"in {workers} processes" in line for line in said) == (workers > 1)
        assert streamed.streamed and streamed.fitted_on == len(sample)
        assert len(streamed.runs) == len(streamed.facts) == total
        assert streamed.gaps, "the sample is enough to keep gaps"
        document = _document(streamed)
        assert document["runs"].pop("fitted_on") == len(sample)  # said in gaps.json
        assert document == _document(reference)
        assert {k: [f.to_dict() for f in v] for k, v in streamed.findings.items()} == {
            k: [f.to_dict() for f in v] for k, v in reference.findings.items()
        }
        assert [dataclasses.asdict(r) for r in streamed.runs] == want  # read back from disk
        streamed.runs.close()


def test_facts_answer_what_gap_selection_asks_of_runs(planted: Path):
    with Store(planted) as store:
        runs = load_runs(store)
    for run in runs:
        facts = RunFacts.of(run)
        assert (facts.trace_id, facts.run_id, facts.success, facts.failed) == (
            run.trace_id, run.run_id, run.success, run.failed)  # fmt: skip
        assert facts.tool_sequence() == run.tool_sequence()
        assert facts.request_kind() == run.request_kind()
        assert request_of(facts) == request_of(run) and facts.signature == ""
    assert {RunFacts.of(r).request_kind() for r in runs} - {None}, "runs that write"


def _refuse() -> Detector:
    raise RuntimeError("cannot be rebuilt in a worker")


class _OnlyHere(Detector):
    """Pickles, but does not unpickle: a worker process fails to start its detection."""

    name = "only_here"

    def __reduce__(self):
        return (_refuse, ())

    def detect(self, run):
        return []


def test_a_worker_that_fails_is_reported_and_its_work_done_in_process(
    planted: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(streaming, "RUNS_PER_PARTITION", 25)
    reported: list[str] = []
    monkeypatch.setattr(streaming.internal, "report_error",
                        lambda where, exc: reported.append(f"{where}: {exc}"))  # fmt: skip
    said: list[str] = []
    detectors = [*default_detectors(), _OnlyHere()]
    result = analyze(planted, embedder=HashEmbedder(planted / "cache"), write=False,
                     max_resident=40, workers=2, detectors=detectors,
                     progress=said.append)  # fmt: skip
    assert [line.split(" (exit")[0] for line in reported] == [  # fitting, then detecting
        "analysis.stream_worker: a fit worker failed",
        "analysis.stream_worker: a detect worker failed",
    ]
    assert sum("working in this process instead" in line for line in said) == 2
    assert result.streamed and len(result.facts) == len(result.runs) > 40
    with Store(planted) as store:
        assert [f.trace_id for f in result.facts] == [r.trace_id for r in load_runs(store)]
    result.runs.close()


@pytest.mark.parametrize("shared", [True, False])
def test_workers_read_the_lake_the_store_was_opened_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool
):
    """A lake URL given only to `Store` (not in the environment or lake.json) reaches the
    workers; where they cannot see it (fsspec's memory filesystem is the process's own), the
    run count tells, and the work is done in process: never an analysis of no runs."""
    pl.generate(tmp_path, 0)
    url = (tmp_path / "objects").as_uri() if shared else f"memory://tg-{tmp_path.name}/lake"
    monkeypatch.setattr(streaming, "RUNS_PER_PARTITION", 25)
    reported: list[str] = []
    monkeypatch.setattr(streaming.internal, "report_error",
                        lambda where, exc: reported.append(str(exc)))  # fmt: skip
    embedder = HashEmbedder(tmp_path / "cache")
    with Store(tmp_path, lake_url=url) as store:  # compacts the spool into that lake
        assert not list((tmp_path / "lake").rglob("*.parquet"))
        one = analyze(store=store, embedder=embedder, write=False, max_resident=40, workers=1)
        two = analyze(store=store, embedder=embedder, write=False, max_resident=40, workers=2)
    assert len(two.facts) == len(one.facts) > 40
    assert _document(two) == _document(one)
    if shared:
        assert reported == []
    else:  # the fit worker saw no sample, the detect workers no runs: both said, both redone
        assert [r.split(" read 0 runs")[0] for r in reported] == [
            "the fit workers",
            "the detect workers",
        ]


def test_a_filtered_analysis_streams_its_runs_only(planted: Path, monkeypatch: pytest.MonkeyPatch):
    where = "success = false OR hash(trace_id) % 3 = 0"
    monkeypatch.setattr(streaming, "RUNS_PER_PARTITION", 15)
    with Store(planted) as store:
        runs = [r.trace_id for r in load_runs(store, where)]
        sample = {r.trace_id for r in load_runs(store, sample_filter(where, 20))}
    assert sample <= set(runs) and len(runs) > len(sample) >= 20
    embedder = HashEmbedder(planted / "cache")
    reference = analyze(planted, embedder=embedder, write=False, where=where,
                        detectors=[_FitOn(d, sample) for d in default_detectors()])  # fmt: skip
    streamed = analyze(planted, embedder=embedder, write=False, where=where, max_resident=20,
                       workers=2)  # fmt: skip
    assert [f.trace_id for f in streamed.facts] == runs
    document = _document(streamed)
    assert document["runs"].pop("fitted_on") == len(sample)
    assert document == _document(reference)
    streamed.runs.close()


def test_an_unknown_engine_is_refused_before_any_work(planted: Path):
    with pytest.raises(ValueError, match="unknown engine 'ray': one of processes, spark"):
        analyze(planted, embedder=HashEmbedder(planted / "cache"), write=False, engine="ray")
