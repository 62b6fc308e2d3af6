"""Issue 15, item 5: a gap that gets no environment is listed, with where it stopped and why, in
the synthesis report, the nightly's synthesize stage, report.md and history, and on the
dashboard's environments page (its name escaped: gap names come from traces).

Reproduction: in the demo store's nightly, "synthesize: done - environments=[]", the reasons
only visible when rerunning `synthesize` by hand.

One home serves: gaps.json holds a gap a family builds from the shop's recorded calls, a gap of
a detector no family serves (its name an HTML payload), and a record naming no detector.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tracegym.synthesis import pipeline
from tracegym.synthesis.fixtures import gap, shop_traces
from tracegym.synthesis.pipeline import StopStage, last_synthesis, synthesize
from tracegym.synthesis.spec import infer_catalog
from tracegym.synthesis.validity import Check, ValidityReport

from tests.fixtures.asgi import asgi_get

pytestmark = pytest.mark.timeout(60)

DATE = "2026-02-03"
XSS = '<img src=x onerror="window.__xss = 1">'
BUILDS = gap("wrong_tool_order", ["get_order_details", "cancel_pending_order"])
NO_FAMILY = {**gap("my_custom_detector", ["cancel_pending_order"]), "name": XSS}
NO_DETECTOR = {**gap("wrong_tool_order", ["send_reply"]), "id": "gap-cluster", "detector": None,
               "key": "cluster:7", "kind": "cluster"}  # fmt: skip
FAST = {"n_train": 5, "n_heldout": 5, "validity_seeds": 20}


@pytest.fixture(autouse=True, scope="module")
def recorded_shop():
    """The shop's recorded calls and results stand in for each home's trace store: a world is
    built only from tools whose results (so whose writes' effects) the traces show."""
    catalog = infer_catalog(shop_traces(40))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "_store_catalog", lambda home: catalog)
        yield


def write_gaps(home: Path, gaps: list[dict[str, Any]]) -> Path:
    path = home / "gaps.json"
    path.write_text(json.dumps({"version": 1, "gaps": gaps, "rejected": []}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    home = tmp_path_factory.mktemp("reasons")
    write_gaps(home, [BUILDS, NO_FAMILY, NO_DETECTOR])
    return home, synthesize(home, **FAST)


def test_the_report_lists_each_gap_without_an_environment_with_its_stage_and_reason(synthesized):
    home, report = synthesized
    assert [e.gap_id for e in report.environments] == [BUILDS["id"]]
    without = {w.gap_id: w for w in report.without_environment}
    assert set(without) == {NO_FAMILY["id"], "gap-cluster"}
    custom = without[NO_FAMILY["id"]]
    assert custom.stage is StopStage.NO_FAMILY and custom.gap_name == XSS
    assert custom.detector == "my_custom_detector"
    assert "no family exercises detector 'my_custom_detector'" in custom.reason
    assert without["gap-cluster"].stage is StopStage.UNUSABLE
    assert "names no detector" in without["gap-cluster"].reason
    # the lists earlier readers know still say the same
    assert {n.gap_id: n.reason for n in report.not_synthesizable} == {
        w.gap_id: w.reason for w in report.without_environment
    }
    # kept with the registry, so the nightly and the dashboard need no rerun
    kept = last_synthesis(home)
    assert kept is not None and kept.gaps_hash == pipeline.gaps_hash(home / "gaps.json")
    assert kept.without_environment == tuple(report.without_environment)
    assert kept.environments == (report.environments[0].env_id,)
    assert json.loads(json.dumps(report.to_dict()))["without_environment"][0]["stage"] in {
        "no_family", "unusable"}  # fmt: skip


def test_failed_checks_say_which_and_fidelity_alone_is_its_own_stage(tmp_path, monkeypatch):
    write_gaps(tmp_path, [BUILDS])

    def failing(*names: str):
        def check(env: Any, n_seeds: int = 200, **_: Any) -> ValidityReport:
            checks = [Check("solvable", True, "oracle 20/20")]
            checks += [Check(name, False, f"{name} broke on seed 3") for name in names]
            return ValidityReport(env.env_id, ok=False, checks=checks)

        return check

    monkeypatch.setattr(pipeline, "check_environment", failing("fidelity"))
    (fidelity,) = synthesize(tmp_path, **FAST).without_environment
    assert fidelity.stage is StopStage.FIDELITY and fidelity.failed_checks == ("fidelity",)
    assert fidelity.reason == "fidelity: fidelity broke on seed 3" and fidelity.env_id
    monkeypatch.setattr(pipeline, "check_environment", failing("determinism", "fidelity"))
    report = synthesize(tmp_path, **FAST)
    (both,) = report.without_environment
    assert both.stage is StopStage.VALIDITY and both.failed_checks == ("determinism", "fidelity")
    assert report.rejected[0].failures == [
        "determinism: determinism broke on seed 3",
        "fidelity: fidelity broke on seed 3",
    ]
    assert report.environments == [] and not (tmp_path / "envs" / both.env_id).exists()


def test_a_failed_calibration_is_its_stage(tmp_path):
    write_gaps(tmp_path, [BUILDS])

    def broken_policy(observation: Any, info: Any) -> Any:
        raise RuntimeError("the policy fell over")

    report = synthesize(tmp_path, policy=broken_policy, calibration_seeds=4, k=1, **FAST)
    (record,) = report.without_environment
    assert record.stage is StopStage.CALIBRATION and "the policy fell over" in record.reason


# The nightly -----------------------------------------------------------------------------------
def _night(home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    """The nightly job with training and evaluation stubbed out (no model): the synthesize
    stage and the report are the real ones."""
    from tracegym.jobs import nightly as job

    def train_skipped(self: Any) -> job.TrainResult:
        return job.TrainResult(status="skipped", reason="stubbed in this test")

    def evaluate_skipped(self: Any) -> job.EvaluateResult:
        return job.EvaluateResult(status="skipped", reason="stubbed in this test")

    monkeypatch.setattr(job.NightRunner, "stage_train", train_skipped)
    monkeypatch.setattr(job.NightRunner, "stage_evaluate", evaluate_skipped)
    lines: list[str] = []
    result = job.nightly(
        home, job.NightlyConfig(date=DATE), progress=lambda s, m: lines.append(f"{s}: {m}")
    )
    return result, lines


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, list[str]]:
    home = tmp_path_factory.mktemp("night")
    write_gaps(home, [BUILDS, NO_FAMILY, NO_DETECTOR])
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(pipeline, "synthesize", _fast(pipeline.synthesize))
        result, lines = _night(home, monkeypatch)
    return home, result, lines


def _fast(real: Any) -> Any:
    return lambda home, *args, **kwargs: real(home, *args, **{**kwargs, **FAST})


def test_the_nightly_stage_lists_them_and_says_so_in_a_line(night):
    home, result, lines = night
    stage = result.stages["synthesize"]
    assert stage.status == "done" and len(stage.environments) == 1
    listed = {w["gap_id"]: w for w in stage.without_environment}
    assert set(listed) == {NO_FAMILY["id"], "gap-cluster"}
    assert listed[NO_FAMILY["id"]]["stage"] == "no_family"
    assert "no family exercises detector" in listed[NO_FAMILY["id"]]["reason"]
    assert "synthesize: done - 1 environment, 2 gaps without one (see report)" in lines
    history = json.loads((home / "nightly" / "history.jsonl").read_text().splitlines()[-1])
    assert history["gaps_without_environment"] == 2


def test_report_md_lists_them_with_their_reasons_and_escapes_names(night):
    home, _result, _lines = night
    report = (home / "nightly" / DATE / "report.md").read_text()
    assert "- **synthesize**: done - 1 environment, 2 gaps without one (see report)" in report
    section = report.split("## Gaps without an environment")[1].split("## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(rows) == 2
    (custom,) = [r for r in rows if NO_FAMILY["id"] in r]
    assert "detector my\\_custom\\_detector" in custom and "no family" in custom
    assert "&lt;img src=x onerror=" in custom and XSS not in report
    (cluster,) = [r for r in rows if "gap-cluster" in r]
    assert "not a usable gap" in cluster and "names no detector" in cluster
    data = json.loads((home / "nightly" / DATE / "report.json").read_text())
    assert len(data["stages"]["synthesize"]["without_environment"]) == 2


def test_a_skipped_synthesis_still_says_why(night):
    from tracegym.jobs.nightly import NightlyConfig, NightRunner

    home, _result, _lines = night
    previous = json.loads((home / "nightly" / "state.json").read_text())
    stage = NightRunner(home, NightlyConfig(date="2026-02-04"), None, None, None).stage_synthesize()
    assert previous["gaps_hash"] == stage.gaps_hash and stage.status == "skipped"
    assert {w["gap_id"] for w in stage.without_environment} == {NO_FAMILY["id"], "gap-cluster"}
    from tracegym.jobs.nightly import stage_line

    assert stage_line("synthesize", stage) == (
        "skipped (gaps unchanged) - 1 environment, 2 gaps without one (see report)"
    )


def test_every_gap_built_says_so(tmp_path, monkeypatch):
    from tracegym.jobs.nightly import NightlyReport, render_report, stage_line

    write_gaps(tmp_path, [BUILDS])
    monkeypatch.setattr(pipeline, "synthesize", _fast(pipeline.synthesize))
    result, _lines = _night(tmp_path, monkeypatch)
    stage = result.stages["synthesize"]
    assert stage.without_environment == []
    assert stage_line("synthesize", stage) == "done - 1 environment, every gap got one"
    markdown = render_report(DATE, result.stages, [], NightlyReport(date=DATE))
    assert "Every gap got an environment." in markdown


# The dashboard ---------------------------------------------------------------------------------
def _get(home: Path, path: str) -> tuple[int, str]:
    """One GET through the dashboard's ASGI app (no server, no lifespan: this page reads files)."""
    pytest.importorskip("starlette")
    pytest.importorskip("duckdb")
    from tracegym.dashboards.app import create_app

    return asgi_get(create_app(home), path)


def test_the_environments_page_lists_them_escaped(synthesized):
    home, report = synthesized
    status, body = _get(home, "/environments")
    assert status == 200
    section = body.split("Gaps without an environment")[1]
    rows = section.split('<tr class="without">')[1:]
    assert len(rows) == 2
    (custom,) = [r for r in rows if NO_FAMILY["id"] in r]
    assert "my_custom_detector" in custom and "no family" in custom
    assert "no family exercises detector &#39;my_custom_detector&#39;" in custom
    assert XSS not in body and "&lt;img src=x onerror=&#34;window.__xss = 1&#34;&gt;" in custom
    (cluster,) = [r for r in rows if "gap-cluster" in r]
    assert "not a usable gap" in cluster and "names no detector" in cluster
    assert report.environments[0].env_id in body.split("Gaps without an environment")[0]


def test_the_environments_page_when_every_gap_got_one_and_before_any_synthesis(tmp_path):
    _, before = _get(tmp_path, "/environments")
    assert "no synthesis yet" in before.split("Gaps without an environment")[1]
    write_gaps(tmp_path, [BUILDS])
    synthesize(tmp_path, **FAST)
    _, body = _get(tmp_path, "/environments")
    section = body.split("Gaps without an environment")[1]
    assert "every gap got an environment" in section and '<tr class="without">' not in section
    write_gaps(tmp_path, [BUILDS, NO_FAMILY])  # analysed again, not synthesized since
    _, stale = _get(tmp_path, "/environments")
    assert "gaps.json changed since this synthesis" in stale
