"""The synthesis stage's documents are typed: the registry's index (`envs/index.json`), each
environment's validity report, and the synthesis report (`envs/synthesis.json`). They round-trip
to the same JSON, read homes written before they were typed, and name what is wrong in a damaged
one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tracegym.store.home import DocumentError, Home
from tracegym.synthesis import registry
from tracegym.synthesis.pipeline import (
    GapWithoutEnvironment,
    RejectedEnvironment,
    StopStage,
    SynthesisRecordError,
    SynthesisReport,
    SynthesizedEnvironment,
    UnsynthesizedGap,
    last_synthesis,
    read_report,
    write_report,
)
from tracegym.synthesis.registry import (
    CalibrationSummary,
    EnvironmentEntry,
    EnvironmentIndex,
    RegistryDocumentError,
    RegistryError,
    TaskCounts,
    ValiditySummary,
)

OLD_HOME = Path(__file__).parents[1] / "fixtures" / "home_before_typed_documents"


def raw(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def an_entry(**changes: Any) -> EnvironmentEntry:
    fields: dict[str, Any] = {
        "env_id": "budget-1",
        "family": "budget",
        "entry_point": "tracegym.synthesis.families.budget:BudgetEnv",
        "gap_id": "gap-1",
        "gap_name": "budget waste",
        "description": "Finish within the budget.",
        "knobs": {"slack": 1},
        "train_seeds": [0, 10_000],
        "heldout_seeds": [1_000_000, 1_001_000],
        "tasks": TaskCounts(train=500, heldout=200),
        "validity": ValiditySummary(ok=True, checked_at="2026-12-05T16:32:21Z"),
        "calibration": CalibrationSummary(0.4, 0.7, 4, True, "noisy-oracle:0.1"),
        "registered_at": "2026-12-05T16:32:21Z",
    }
    return EnvironmentEntry(**{**fields, **changes})


# The registry's index -----------------------------------------------------------------------
def test_an_index_round_trips_to_the_same_json():
    index = EnvironmentIndex(environments=[an_entry(), an_entry(env_id="b", calibration=None)])
    data = json.loads(json.dumps(index.to_dict()))
    assert data["version"] == EnvironmentIndex.VERSION == 1
    assert data["environments"][0]["calibration"] == {
        "pass_at_1": 0.4, "pass_at_k": 0.7, "k": 4, "in_band": True, "policy": "noisy-oracle:0.1"
    }  # fmt: skip
    assert EnvironmentIndex.from_dict(data) == index


def test_the_old_homes_index_and_validity_reports_read_through_the_types():
    index = registry.read_index(OLD_HOME)
    assert index.to_dict() == raw(OLD_HOME / "envs" / "index.json")
    assert [e.env_id for e in index.environments] == [
        "budget-f94c5c1c97",
        "exact_arguments-cc36fd8376",
        "requested_action-231244f4b1",
        "requested_action-3577fa0b11",
    ]
    first = index.environments[0]
    assert first.tasks == TaskCounts(train=500, heldout=200) and first.validity.ok
    assert first.calibration is None and first.train_seeds == [0, 10_000]
    assert registry.entry(OLD_HOME, "budget-f94c5c1c97") == first
    for item in index.environments:
        report = registry.read_validity(OLD_HOME, item.env_id)
        assert report is not None and report.ok and report.env_id == item.env_id
        assert report.to_dict() == raw(OLD_HOME / "envs" / item.env_id / "validity.json")
        assert [c.name for c in report.checks][:2] == ["oracle", "null"]


def test_one_environments_detail_reads_its_folder_through_the_types():
    shown = registry.detail(OLD_HOME, "requested_action-3577fa0b11")
    assert shown.entry.gap_name == "unserved_request_refund_order"
    assert shown.spec.roles["action"] == "refund_order" and shown.calibration is None
    assert shown.validity is not None and shown.validity.failures == []
    assert shown.path == Home.at(OLD_HOME).environment("requested_action-3577fa0b11")
    as_json = registry.show(OLD_HOME, "requested_action-3577fa0b11")
    assert as_json == shown.to_dict() and as_json["entry"]["env_id"] == shown.entry.env_id


def test_an_index_written_without_a_version_or_later_fields_still_reads():
    old = an_entry().to_dict()
    for name in ("calibration", "registered_at", "description"):
        del old[name]
    index = EnvironmentIndex.from_dict({"environments": [old]})
    assert index.version == EnvironmentIndex.VERSION
    (item,) = index.environments
    assert item.calibration is None and item.registered_at is None and item.description == ""


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda e: e.pop("env_id"), "without an 'env_id'"),
        (lambda e: e.update(train_seeds="all"), "'budget-1': 'train_seeds' must be"),
        (lambda e: e.update(tasks={"train": "many"}), "'budget-1' tasks: 'train' must be"),
        (lambda e: e.update(validity={"ok": "yes"}), "'budget-1' validity: 'ok' must be"),
        (lambda e: e.update(family=None), "'budget-1': 'family' must be a string"),
    ],
)
def test_a_damaged_entry_raises_a_named_error(damage: Any, message: str, tmp_path: Path):
    data = an_entry().to_dict()
    damage(data)
    with pytest.raises(RegistryDocumentError, match=message):
        EnvironmentEntry.from_dict(data)
    path = Home.at(tmp_path).environment_index
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "environments": [data]}), encoding="utf-8")
    with pytest.raises(RegistryError, match=f"{path}: .*{message}") as caught:
        registry.list_envs(tmp_path)
    assert isinstance(caught.value, DocumentError)  # the home's documents' error, too


def test_an_index_that_is_not_one_names_its_file(tmp_path: Path):
    path = Home.at(tmp_path).environment_index
    path.parent.mkdir(parents=True)
    path.write_text("{broken", encoding="utf-8")
    with pytest.raises(RegistryDocumentError, match=f"{path} is not valid JSON"):
        registry.read_index(tmp_path)
    path.write_text('{"version": 1}', encoding="utf-8")
    with pytest.raises(RegistryDocumentError, match=f"{path} is not a tracegym environment index"):
        registry.read_index(tmp_path)
    path.write_text('{"version": 99, "environments": []}', encoding="utf-8")
    with pytest.raises(RegistryDocumentError, match="version 99 is not supported"):
        registry.read_index(tmp_path)
    assert registry.read_index(tmp_path / "nothing") == EnvironmentIndex()


def test_a_damaged_validity_report_names_its_file(tmp_path: Path):
    home = tmp_path / "home"
    shutil.copytree(OLD_HOME / "envs", home / "envs")
    path = Home.at(home).environment("budget-f94c5c1c97") / "validity.json"
    path.write_text('{"ok": true, "checks": [{"ok": true}]}', encoding="utf-8")
    with pytest.raises(RegistryError, match=rf"cannot read {path}: .*checks\[0\] has no 'name'"):
        registry.read_validity(home, "budget-f94c5c1c97")
    path.unlink()
    assert registry.read_validity(home, "budget-f94c5c1c97") is None


# The synthesis report -------------------------------------------------------------------------
def a_report() -> SynthesisReport:
    report = SynthesisReport(
        home="/h",
        gaps_path="/h/gaps.json",
        environments=[
            SynthesizedEnvironment(
                gap_id="gap-1",
                name="budget waste",
                detector="budget_waste",
                env_id="budget-1",
                family="budget",
                path="/h/envs/budget-1",
                action="refund_order",
                knobs={"slack": 1},
                validity={"oracle": "oracle passed 20/20 seeds"},
                calibration=CalibrationSummary(0.4, 0.7, 4, True, "noisy-oracle:0.1"),
            )
        ],
        catalog_source="store (3 traces)",
        conventions={"agent": "shop"},
        gaps_hash="abc",
    )
    report.stopped(
        GapWithoutEnvironment("gap-2", "no family", "custom", StopStage.NO_FAMILY, "no family")
    )
    report.stopped(
        GapWithoutEnvironment(
            "gap-3", "invalid", "invalid_invocation", StopStage.VALIDITY, "null: too easy",
            failed_checks=("null",), env_id="exact-3", family="exact_arguments",
        ),
        failures=["null: too easy"],
    )  # fmt: skip
    return report


def test_a_report_round_trips_and_its_rows_are_typed(tmp_path: Path):
    report = a_report()
    assert report.not_synthesizable == [
        UnsynthesizedGap("gap-2", "no family", "custom", "no family")
    ]
    assert report.rejected == [
        RejectedEnvironment(
            "gap-3",
            "invalid",
            "invalid_invocation",
            "exact-3",
            "exact_arguments",
            ["null: too easy"],
        )
    ]
    path = write_report(tmp_path, report)
    assert path == Home.at(tmp_path).synthesis_report
    data = raw(path)
    assert list(data)[:3] == ["version", "generated_at", "home"] and data["version"] == 1
    assert data["generated_at"] == report.generated_at is not None
    assert "version" not in report.body() and report.body()["environments"] == data["environments"]
    assert read_report(tmp_path) == report
    assert SynthesisReport.from_dict(data).to_dict() == data


def test_the_old_homes_report_reads_through_the_types():
    data = raw(OLD_HOME / "envs" / "synthesis.json")
    report = read_report(OLD_HOME)
    assert report is not None and report.to_dict() == data
    assert [e.env_id for e in report.environments] == [
        "requested_action-3577fa0b11",
        "exact_arguments-cc36fd8376",
        "requested_action-231244f4b1",
        "budget-f94c5c1c97",
    ]
    first = report.environments[0]
    assert first.action == "refund_order" and first.calibration is None
    assert first.validity["oracle"] == "oracle passed 200/200 seeds"
    last = last_synthesis(OLD_HOME)
    assert last is not None and last.gaps_hash == "77cbd6c1277399bb"
    assert last.environments == tuple(e.env_id for e in report.environments)


def test_a_report_written_before_the_typed_rows_still_reads():
    """An early report: no version, no time, no typed gaps without an environment."""
    report = SynthesisReport.from_dict(
        {
            "home": "/h",
            "gaps_path": "/h/gaps.json",
            "environments": [],
            "rejected": [{"gap_id": "g", "name": None, "detector": "d", "failures": ["x"]}],
            "not_synthesizable": [{"gap_id": "n", "reason": "no family"}],
        }
    )
    assert report.version == SynthesisReport.VERSION and report.generated_at is None
    assert report.rejected[0].env_id is None and report.rejected[0].failures == ["x"]
    assert report.not_synthesizable[0].name is None and report.without_environment == []


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d["rejected"].append({"name": "x"}), "rejected: a row without a 'gap_id'"),
        (lambda d: d["environments"][0].pop("env_id"), "gap 'gap-1': 'env_id' must be a string"),
        (lambda d: d["environments"][0].update(calibration=[1]), "'calibration' must be an obj"),
        (lambda d: d.update(not_synthesizable="none"), "'not_synthesizable' must be a list"),
        (lambda d: d["without_environment"][0].update(stage="lost"), "unknown stage 'lost'"),
        (lambda d: d.update(version=7), "version 7 is not supported"),
    ],
)
def test_a_damaged_report_raises_a_named_error(damage: Any, message: str, tmp_path: Path):
    data = a_report().to_dict()
    damage(data)
    with pytest.raises(SynthesisRecordError, match=message):
        SynthesisReport.from_dict(data)
    path = Home.at(tmp_path).synthesis_report
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SynthesisRecordError, match=f"cannot read {path}: .*{message}"):
        read_report(tmp_path)
