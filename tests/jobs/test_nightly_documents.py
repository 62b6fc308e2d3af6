"""The nightly's documents: each stage's result, the report, the state and the history line
read back through their types, from tonight's code and from a home written before they had any."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tracegym.jobs import night_documents, nightly
from tracegym.jobs.night_documents import (
    STAGES,
    AnalyzeResult,
    CompactResult,
    EvaluateResult,
    NightlyDocumentError,
    NightlyReport,
    NightlyState,
    NightRecord,
    ReportResult,
    StageFailure,
    SynthesizeResult,
    TrainResult,
    read_history,
    stage_result,
)
from tracegym.store.home import DocumentError, Home, read_json

OLD_HOME = Path(__file__).parents[1] / "fixtures" / "home_before_typed_documents"
OLD_NIGHT = "2026-12-05"


def _without_versions(data: Any) -> Any:
    """`data` as it was written before the documents carried a version."""
    if isinstance(data, dict):
        return {k: _without_versions(v) for k, v in data.items() if k != "version"}
    if isinstance(data, list):
        return [_without_versions(v) for v in data]
    return data


# The home written before typed documents ---------------------------------------------------------
def test_old_home_state_reads_as_version_0():
    state = NightlyState.read(OLD_HOME)
    assert state.version == 0
    assert (state.date, state.lake, state.gaps_hash) == (
        OLD_NIGHT,
        "8cf9b02071efb526",
        "77cbd6c1277399bb",
    )
    assert state.finished_at == "2026-12-05T16:37:59Z"


def test_old_home_history_reads_each_night():
    (night,) = read_history(OLD_HOME)
    assert night.version == 0 and night.date == OLD_NIGHT
    assert night.stages == {stage: "done" for stage in STAGES}
    assert night.gaps_without_environment == 0
    assert night.report is not None and night.report.endswith(f"{OLD_NIGHT}/report.json")


@pytest.mark.parametrize("stage", STAGES)
def test_old_home_stage_results_read_and_write_back_the_same_keys(stage: str):
    path = Home.at(OLD_HOME).night(OLD_NIGHT) / "stages" / f"{stage}.json"
    written = read_json(path)
    result = stage_result(stage, written)
    assert result.version == 0 and result.status == "done"
    again = result.to_dict()
    assert again["version"] == 1
    assert _without_versions(again) == written
    assert [k for k in again if k != "version"] == list(written)  # and in the same order


def test_old_home_stage_results_are_typed():
    stages = Home.at(OLD_HOME).night(OLD_NIGHT) / "stages"
    train = stage_result("train", read_json(stages / "train.json"))
    assert isinstance(train, TrainResult)
    assert train.trained == ["refund_order-1dc1158a1f", "requested_action-231244f4b1"]
    assert train.failed == [] and train.model and train.seconds == 279.579
    evaluate = stage_result("evaluate", read_json(stages / "evaluate.json"))
    assert isinstance(evaluate, EvaluateResult)
    assert [row.adapter_id for row in evaluate.rows] == train.trained
    assert all(row.promoted for row in evaluate.rows)
    assert evaluate.routing is not None and evaluate.routing.accuracy == 1.0
    analyze = stage_result("analyze", read_json(stages / "analyze.json"))
    assert isinstance(analyze, AnalyzeResult) and analyze.runs == {
        "total": 48,
        "failed": 26,
        "succeeded": 22,
        "unknown": 0,
    }


def test_old_home_report_reads_and_writes_back_the_same_document():
    written = read_json(Home.at(OLD_HOME).night(OLD_NIGHT) / "report.json")
    report = NightlyReport.from_dict(written)
    assert report.version == 0 and report.date == OLD_NIGHT
    assert list(report.stages) == list(STAGES[:-1])
    assert isinstance(report.stages["synthesize"], SynthesizeResult)
    assert report.stages["synthesize"].environments == [
        "requested_action-3577fa0b11",
        "exact_arguments-cc36fd8376",
        "requested_action-231244f4b1",
        "budget-f94c5c1c97",
    ]
    assert [a.adapter_id for a in report.adapters] == [
        "refund_order-1dc1158a1f",
        "requested_action-231244f4b1",
    ]
    assert all(a.promoted for a in report.adapters)
    assert [row.adapter_id for row in report.evaluation] == [a.adapter_id for a in report.adapters]
    assert report.routing is not None and report.routing.n == 48
    assert _without_versions(report.to_dict()) == written


# Round trips of each shape a stage writes --------------------------------------------------------
SHAPES = [
    ("compact", {"status": "skipped", "reason": "no trace store under this home"}),
    ("compact", {"status": "done", "files": 1, "spans": 9, "parts": 1, "lake": None}),
    ("analyze", {"status": "skipped", "reason": "no runs in the lake", "lake": None}),
    ("analyze", {"status": "skipped", "reason": "no new runs since the last night", "lake": "ab"}),
    ("synthesize", {"status": "skipped", "reason": "no gaps.json", "gaps_hash": None}),
    ("synthesize", {"status": "skipped", "reason": "gaps unchanged", "gaps_hash": "ab"}),
    (
        "synthesize",
        {
            "status": "skipped",
            "reason": "gaps unchanged",
            "gaps_hash": "ab",
            "environments": ["env-1"],
            "without_environment": [{"gap_id": "gap-2", "stage": "no_family", "reason": "x"}],
        },
    ),
    ("train", {"status": "skipped", "reason": "no environments", "trained": [], "kept": []}),
    (
        "train",
        {
            "status": "partial",
            "trained": ["a-1"],
            "kept": ["a-2"],
            "failed": [
                {"env_id": "e-3", "item": "e-3", "error": "NoTrainingData", "reason": "r"},
            ],
            "model": "/m",
            "seconds": 1.5,
        },
    ),
    ("evaluate", {"status": "skipped", "reason": "no adapter trained tonight", "rows": []}),
    (
        "evaluate",
        {
            "status": "partial",
            "rows": [],
            "routing": None,
            "failed": [{"adapter_id": "a-1", "item": "a-1", "error": "E", "reason": "E: x"}],
        },
    ),
    ("report", {"status": "done", "report": "/h/nightly/d/report.json", "seconds": 0.001}),
]


@pytest.mark.parametrize(("stage", "written"), SHAPES)
def test_each_shape_a_stage_writes_round_trips_with_its_keys(stage: str, written: dict):
    result = stage_result(stage, written)
    again = result.to_dict()
    assert again == {"version": 1, **written}
    assert stage_result(stage, again) == stage_result(stage, {"version": 1, **written})


def test_a_failure_keeps_its_id_first():
    failure = StageFailure(item="a-1", error="E", reason="E: x", adapter_id="a-1")
    assert list(failure.to_dict()) == ["adapter_id", "item", "error", "reason"]
    assert StageFailure.from_dict(failure.to_dict()) == failure


def test_state_and_history_line_round_trip():
    state = NightlyState(date="2026-01-02", finished_at="t", lake="l", gaps_hash="g")
    assert NightlyState.from_dict(state.to_dict()) == state
    assert state.to_dict() == {
        "version": 1,
        "date": "2026-01-02",
        "finished_at": "t",
        "lake": "l",
        "gaps_hash": "g",
    }
    record = NightRecord(date="2026-01-02", stages={"train": "partial"}, report="r")
    assert NightRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


# Damaged documents --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stage", "data", "words"),
    [
        ("train", {"trained": []}, "no 'status'"),
        ("train", ["done"], "not a JSON object"),
        ("compact", {"status": "done", "files": "many"}, "'files' is not a number"),
        ("report", {"status": "done", "version": 9}, "version 9"),
        ("nap", {"status": "done"}, "no nightly stage 'nap'"),
    ],
)
def test_a_damaged_stage_result_is_a_document_error_saying_what(stage, data, words):
    with pytest.raises(NightlyDocumentError, match=words) as caught:
        stage_result(stage, data)
    assert isinstance(caught.value, DocumentError)


def test_a_report_without_its_date_names_it():
    with pytest.raises(NightlyDocumentError, match="'date'"):
        NightlyReport.from_dict({"stages": {}})


def test_a_damaged_history_line_names_the_file_and_line(tmp_path: Path):
    history = Home.at(tmp_path).nightly_history
    history.parent.mkdir()
    history.write_text('{"date": "2026-01-01", "stages": {}}\n{"date": "2026-01-0\n')
    with pytest.raises(NightlyDocumentError, match=r"history.jsonl line 2"):
        read_history(tmp_path)
    assert [n.date for n in read_history(tmp_path, skip_damaged=True)] == ["2026-01-01"]


def test_a_damaged_state_is_a_first_night(tmp_path: Path):
    shutil.copytree(OLD_HOME / "nightly", tmp_path / "nightly")
    Home.at(tmp_path).nightly_state.write_text("{not json")
    assert NightlyState.read(tmp_path) == NightlyState(version=NightlyState.VERSION)
    assert NightlyState.read(tmp_path / "nowhere").date is None


def test_a_resumed_night_reads_a_marker_written_before_versions(tmp_path: Path):
    """A night interrupted before this version resumes: its completed stages read back."""
    from tracegym.jobs.nightly import NightlyConfig, NightRunner

    night = Home.at(tmp_path).night("2026-01-02") / "stages"
    night.mkdir(parents=True)
    (night / "compact.json").write_text(json.dumps({"status": "skipped", "reason": "old"}))
    runner = NightRunner(tmp_path, NightlyConfig(date="2026-01-02"), "analyze", None, None)
    with pytest.raises(Exception, match="injected fault at analyze"):
        runner.run()
    assert isinstance(runner.results["compact"], CompactResult)
    assert runner.results["compact"].reason == "old"
    assert ReportResult().to_dict() == {"version": 1, "status": "done", "report": None}


def test_the_runner_re_exports_the_documents() -> None:
    """Callers of jobs.nightly's names (a user's script, the dashboard) get the same types."""
    names = ["STAGES", "NightlyReport", "NightRecord", "NightlyState", "StageResult"]
    names += ["StageFailure", "NightlyDocumentError", "read_history", "stage_result"]
    for name in names:
        assert getattr(nightly, name) is getattr(night_documents, name)
        assert name in nightly.__all__


def test_the_documents_load_without_heavy_stacks() -> None:
    """The dashboard reads the nights through these types: importing them must not load torch,
    duckdb or polars."""
    code = (
        "import sys, tracegym.jobs.night_documents\n"
        "print(sorted(m for m in ('torch', 'duckdb', 'polars', 'transformers', 'peft')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
