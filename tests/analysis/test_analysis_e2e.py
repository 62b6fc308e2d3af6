"""Analysis end to end: the example agent's injected flaws come back as gaps; `tracegym
analyze --json` prints what gaps.json holds; attribution's output contract on shared data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")

import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.analysis.pipeline import analyze
from tracegym.cli import app
from tracegym.examples.support_agent import run_demo
from tracegym.store.importers import import_path
from tracegym.tracer.operations import state
from typer.testing import CliRunner

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AGENTRX = DATA / "agentrx-tau-retail" / "tau_dataset_full.json"
# Which detector finds each flaw the example agent injects.
FLAW_DETECTORS = {
    "wrong_tool_order": "wrong_tool_order",
    "ungrounded_argument": "ungrounded_argument",
    "wrong_assumption": "ungrounded_argument",
    "poisoned_memory": "poisoned_memory",
    "budget_burn": "budget_waste",
}


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("demo")
    saved = state.tracer, state.settings
    tg.init(home=home, provider=TracerProvider(), capture_messages=True)
    rows = run_demo(n_tasks=120, seed=1)
    tg.shutdown()
    state.tracer, state.settings = saved
    (home / "truth.json").write_text(json.dumps(rows))
    return home


def test_demo_flaws_come_back_as_gaps(demo_home: Path):
    result = analyze(demo_home)
    truth = json.loads((demo_home / "truth.json").read_text())
    assert len(result.runs) == 120 and len(result.failed) == sum(not r["success"] for r in truth)
    assert result.gaps, "the example agent's flaws should yield at least one gap"
    known = set(FLAW_DETECTORS.values()) | {
        "premature_finish",
        "invalid_invocation",
        "wrong_source",
    }
    failed_ids = {r.trace_id for r in result.failed}
    for gap in result.gaps:
        assert gap.coverage >= 0.10
        contrast = gap.within_kind or {"delta": gap.delta, "stability": gap.stability}
        assert contrast["delta"] >= 0.20 and contrast["stability"] >= 8  # pooled or like-with-like
        assert gap.detector in known
        # every failed run the gap explains is listed, once, at a step of that run
        assert len(gap.members) == gap.failed_runs_lacking
        assert len({m.trace_id for m in gap.members}) == len(gap.members)
        assert {m.trace_id for m in gap.members} <= failed_ids
        assert all(m.span_ids and m.position is not None for m in gap.members)
    # Nearly every failed run of a flaw has that flaw's detector among its findings (a wrong
    # assumption can hide behind a side task that happened to mention the chosen item).
    by_run = {r.run_id: r for r in result.runs}
    flawed = [row for row in truth if not row["success"] and row["flaw"]]
    found = [
        FLAW_DETECTORS[row["flaw"]]
        in {f.detector for f in result.findings.get(by_run[row["run_id"]].trace_id, [])}
        for row in flawed
    ]
    assert len(flawed) >= 30 and sum(found) / len(found) >= 0.9
    # Warm: embeddings come from the cache; the stages are reported as they start.
    stages: list[str] = []
    again = analyze(demo_home, progress=stages.append)
    assert [s.split()[0] for s in stages] == ["loading", "running", "embedding", "scoring"]
    assert f"on {len(again.runs)} runs" in stages[1]
    assert again.embedded == 0 and [g.id for g in again.gaps] == [g.id for g in result.gaps]


def test_analyze_json_is_the_gaps_file(demo_home: Path):
    done = CliRunner().invoke(app, ["--home", str(demo_home), "analyze", "--json"])
    assert done.exit_code == 0, done.output
    printed = json.loads(done.stdout)
    written = json.loads((demo_home / "gaps.json").read_text())
    printed.pop("generated_at"), written.pop("generated_at")
    assert printed == written and printed["version"] == 1
    table = CliRunner().invoke(app, ["--home", str(demo_home), "analyze"])
    assert table.exit_code == 0 and printed["gaps"][0]["name"] in table.stdout
    bad = CliRunner().invoke(
        app, ["--home", str(demo_home), "analyze", "--where", "1; DROP VIEW x"]
    )
    assert bad.exit_code == 2


def test_analyze_streams_past_max_resident_and_says_what_it_fitted_on(demo_home: Path):
    args = ["--home", str(demo_home), "analyze", "--json", "--output", str(demo_home / "s.json")]
    whole = CliRunner().invoke(app, args)
    streamed = CliRunner().invoke(app, [*args, "--max-resident", "30", "--workers", "1"])
    assert whole.exit_code == 0 and streamed.exit_code == 0, streamed.output
    runs, sampled = json.loads(whole.stdout)["runs"], json.loads(streamed.stdout)["runs"]
    fitted_on = sampled.pop("fitted_on")  # 30, and the runs whose memory others read
    assert "fitted_on" not in runs and 30 <= fitted_on < runs["total"]
    assert sampled == runs  # every run read, outcomes counted alike
    bad = CliRunner().invoke(app, [*args, "--max-resident", "0"])
    assert bad.exit_code == 2
    unknown = CliRunner().invoke(app, [*args, "--engine", "ray"])
    assert unknown.exit_code == 2 and "processes" in unknown.output and "spark" in unknown.output


def test_attribute_contract_on_agentrx(tmp_path: Path):
    if not AGENTRX.is_file():
        pytest.skip(f"shared data absent: {AGENTRX}")
    import_path("tau-bench", AGENTRX, tmp_path)
    done = CliRunner().invoke(app, ["--home", str(tmp_path), "attribute"])
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 27  # the failed runs of the full file
    for line in lines:
        assert set(line) == {"run", "trace_id", "agent", "step", "reason", "confidence"}
        assert isinstance(line["step"], int) and 0 <= line["confidence"] <= 1
    result = analyze(tmp_path)
    assert result.contrast == "failed vs successful runs" and not result.detector_errors
