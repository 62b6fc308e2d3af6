"""One environment that cannot be trained (or evaluated) must not abort the night; a whole
stage that fails stops it with a one-line error naming the stage.

Reproduction: `tracegym --home H demo --scripted` then `tracegym --home H nightly --model tiny`
ended in `ValueError: no training examples for budget-...` (the budget environment's prompt
alone is longer than the tiny model's max_length) on every rerun.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tracegym.cli import app
from tracegym.synthesis import registry
from tracegym.training import evaluate, sft
from tracegym.training.toy import press_env
from typer.testing import CliRunner

DATE = "2026-01-02"
NIGHTLY = ["nightly", "--model", "tiny", "--steps", "2", "--eval-seeds", "2"]
NIGHTLY += ["--embedder", "hash", "--no-route", "--date", DATE]


def _home(path: Path, *env_ids: str) -> Path:
    for env_id in env_ids:
        registry.register(path, press_env(env_id), n_train=8, n_heldout=4, validity_seeds=10)
    return path


def _stage(home: Path, stage: str) -> dict:
    return json.loads((home / "nightly" / DATE / "stages" / f"{stage}.json").read_text())


def _nightly(home: Path):
    return CliRunner().invoke(app, ["--home", str(home), *NIGHTLY])


def _no_examples_for(monkeypatch: pytest.MonkeyPatch, env_id: str) -> None:
    """Train `env_id` with a max_length shorter than its prompt: the real `no training examples`
    path of sft.train_adapter, as with the demo's budget environment."""
    real = sft.train_capability

    def train(home, capability, folder, config, **kwargs):
        if env_id in capability.env_ids:
            config = dataclasses.replace(config, max_length=4)
        return real(home, capability, folder, config, **kwargs)

    monkeypatch.setattr(sft, "train_capability", train)


def test_an_environment_without_training_examples_is_recorded_and_the_night_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path, "toy-empty", "toy-press")
    _no_examples_for(monkeypatch, "toy-empty")
    result = _nightly(home)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "failed toy-empty" in result.output
    train = _stage(home, "train")
    assert train["status"] == "partial"
    assert train["trained"] == ["toy-press"]
    [failure] = train["failed"]
    assert failure["env_id"] == "toy-empty" and failure["error"] == "NoTrainingData"
    assert "no training examples for toy-empty" in failure["reason"]
    assert "max_length=4" in failure["reason"]
    assert [row["adapter_id"] for row in _stage(home, "evaluate")["rows"]] == ["toy-press"]
    report = (home / "nightly" / DATE / "report.md").read_text()
    assert "**train**: partial" in report and "failed toy-empty: NoTrainingData" in report
    history = json.loads((home / "nightly" / "history.jsonl").read_text().splitlines()[-1])
    assert history["stages"]["train"] == "partial" and history["stages"]["report"] == "done"


def test_an_adapter_that_cannot_be_evaluated_is_recorded_and_the_others_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path, "toy-a", "toy-b")
    real = evaluate.evaluate_job
    real_together = evaluate.evaluate_capabilities
    crash = RuntimeError("CUDA error: device-side assert triggered\n(more detail)")

    def broken(model, tokenizer, job, *args, **kwargs):
        if job.adapter_id == "toy-a":
            raise crash
        return real(model, tokenizer, job, *args, **kwargs)

    def broken_together(model, tokenizer, jobs, **kwargs):
        if any(job.adapter_id == "toy-a" for job in jobs):
            raise crash  # the shared waves fail as a whole: the nightly redoes them one by one
        return real_together(model, tokenizer, jobs, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate_job", broken)
    monkeypatch.setattr(evaluate, "evaluate_capabilities", broken_together)
    result = _nightly(home)
    assert result.exit_code == 0, result.output
    assert "together failed" in result.output
    stage = _stage(home, "evaluate")
    assert stage["status"] == "partial"
    assert [row["adapter_id"] for row in stage["rows"]] == ["toy-b"]
    [failure] = stage["failed"]
    assert failure["adapter_id"] == "toy-a"
    assert failure["reason"] == "RuntimeError: CUDA error: device-side assert triggered"


def test_a_whole_stage_that_fails_is_one_line_naming_it_and_keeps_earlier_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracegym.synthesis import pipeline

    (tmp_path / "gaps.json").write_text(json.dumps({"version": 1, "gaps": []}))

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pipeline, "synthesize", full)
    result = _nightly(tmp_path)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # a message, not the OSError's traceback
    assert "the synthesize stage failed: OSError:" in result.output
    assert "rerun to resume" in result.output
    stages = tmp_path / "nightly" / DATE / "stages"
    assert sorted(p.stem for p in stages.iterdir()) == ["analyze", "compact"]
