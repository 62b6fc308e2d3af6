"""The nightly job: stages, incremental reruns, the lock, resume after a kill in every stage."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tracegym.jobs.nightly import (
    STAGES,
    NightlyBusy,
    NightlyConfig,
    NightlyFault,
    lock,
    nightly,
)
from tracegym.synthesis import registry
from tracegym.training import adapters
from tracegym.training.router import HashEmbedder as FakeEmbedder
from tracegym.training.toy import press_env

# Trains or runs real models: out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

DATE = "2026-01-02"
VOLATILE = {"seconds", "finished_at", "created_at", "tokens_per_second", "since"}


def config(date=DATE):
    return NightlyConfig(
        model="tiny",
        train={"steps": 10, "train_seeds": 8, "batch_size": 4},
        eval_seeds=4,
        max_new_tokens=24,
        date=date,
    )


def make_home(path):
    registry.register(path, press_env(), n_train=16, n_heldout=8, validity_seeds=20)
    return path


def comparable(home, data):
    if isinstance(data, dict):
        return {k: comparable(home, v) for k, v in data.items() if k not in VOLATILE}
    if isinstance(data, list):
        return [comparable(home, v) for v in data]
    if isinstance(data, str):
        return data.replace(str(home), "<home>")
    return data


def artifacts(home):
    report = json.loads((home / "nightly" / DATE / "report.json").read_text())
    meta = adapters.show(home, "toy-press")
    meta.pop("path")
    return comparable(home, {"report": report, "adapter": meta})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    home = make_home(tmp_path_factory.mktemp("ref"))
    seen = []
    result = nightly(home, config(), embedder=FakeEmbedder(), progress=lambda s, m: seen.append(s))
    return home, result, seen


def test_nightly_runs_every_stage_and_writes_the_report(reference):
    home, result, seen = reference
    assert [s for s in STAGES if s in seen] == list(STAGES)
    stages = result.stages
    assert stages["compact"].status == "skipped"  # no trace store in this home
    assert stages["train"].trained == ["toy-press"]
    row = stages["evaluate"].rows[0]
    assert row.base.n == 4 and row.router is not None
    assert stages["evaluate"].routing.accuracy == 1.0
    night = home / "nightly" / DATE
    assert (night / "report.md").read_text().startswith(f"# tracegym nightly {DATE}")
    assert "Wilson" in (night / "report.md").read_text()
    history = (home / "nightly" / "history.jsonl").read_text().splitlines()
    assert len(history) == 1 and json.loads(history[0])["date"] == DATE
    assert not (home / "nightly" / ".lock").exists()
    assert not list(night.rglob("*.tmp"))
    from tracegym.store.store import Store

    with Store(home) as store:  # the night is recorded in the store, not as a run
        rows = store.sql("SELECT date, adapters_trained, stages FROM nightly").fetchall()
        assert store.sql("SELECT count(*) FROM traces").fetchall() == [(0,)]
    assert rows[0][:2] == (DATE, 1) and json.loads(rows[0][2])["train"] == "done"


def test_next_night_is_incremental(reference):
    home, _result, _seen = reference
    before = adapters.show(home, "toy-press")["created_at"]
    result = nightly(home, config("2026-01-03"), embedder=FakeEmbedder())
    stages = result.stages
    assert stages["train"].trained == [] and stages["train"].kept == ["toy-press"]
    assert stages["evaluate"].status == "skipped"
    assert adapters.show(home, "toy-press")["created_at"] == before
    assert len((home / "nightly" / "history.jsonl").read_text().splitlines()) == 2


def test_a_second_concurrent_run_is_refused(tmp_path):
    with lock(tmp_path), pytest.raises(NightlyBusy, match="holds"):
        nightly(tmp_path, config())
    assert not (tmp_path / "nightly" / DATE).exists()


def test_a_stale_lock_is_taken_over(tmp_path):
    (tmp_path / "nightly").mkdir()
    pid = os.fork()
    if pid == 0:  # a child that exits at once: its pid is then dead
        os._exit(0)
    os.waitpid(pid, 0)
    (tmp_path / "nightly" / ".lock").write_text(json.dumps({"pid": pid, "since": "x"}))
    result = nightly(tmp_path, NightlyConfig(model="tiny", date=DATE))
    assert result.stages["train"].status == "skipped"  # no environments here


@pytest.mark.parametrize("point", [*STAGES, "train:after-adapter"])
def test_killed_in_any_stage_then_resumed_gives_the_same_artifacts(point, reference, tmp_path):
    ref_home, _result, _seen = reference
    home = make_home(tmp_path)
    with pytest.raises(NightlyFault):
        nightly(home, config(), fault=point, embedder=FakeEmbedder())
    assert not (home / "nightly" / ".lock").exists()
    assert not (home / "nightly" / DATE / "report.json").exists() or point == "report"
    nightly(home, config(), embedder=FakeEmbedder())
    assert artifacts(home) == comparable(home, artifacts(ref_home)) or _diff(
        artifacts(home), artifacts(ref_home)
    )
    history = (home / "nightly" / "history.jsonl").read_text().splitlines()
    assert len(history) == 1


def _diff(a, b):
    raise AssertionError(json.dumps({"resumed": a, "reference": b}, indent=1)[:4000])


def test_the_command_prints_the_night_as_json(tmp_path):
    """`tracegym nightly --json`: the night, its folder and each stage's result as written."""
    from tracegym.cli import app
    from typer.testing import CliRunner

    args = ["--home", str(tmp_path), "nightly", "--model", "tiny", "--json", "--date", DATE]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["date"] == DATE and printed["dir"] == str(tmp_path / "nightly" / DATE)
    for stage in STAGES:
        marker = tmp_path / "nightly" / DATE / "stages" / f"{stage}.json"
        assert printed["stages"][stage] == json.loads(marker.read_text()), stage
    assert printed["stages"]["train"] == {
        "version": 1,
        "status": "skipped",
        "reason": "no environments",
        "trained": [],
        "kept": [],
        "seconds": printed["stages"]["train"]["seconds"],
    }
