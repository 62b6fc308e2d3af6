"""The training commands: train, evaluate, adapters list/show, nightly (tiny model)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import typer
from tracegym.synthesis import registry
from tracegym.training.toy import press_env
from typer.testing import CliRunner


def _app() -> typer.Typer:
    """The real `tracegym` command, which registers these commands with the others."""
    from tracegym.cli import app

    return app


def test_training_commands(tmp_path):
    registry.register(tmp_path, press_env(), n_train=16, n_heldout=8, validity_seeds=20)
    app, runner = _app(), CliRunner()
    base = ["--home", str(tmp_path)]
    small = ["--model", "tiny", "--eval-seeds", "3"]
    result = runner.invoke(app, [*base, "train", "toy-press", *small, "--steps", "5"])
    assert result.exit_code == 0, result.output
    assert "toy-press" in result.output and "held-out" in result.output
    # per-step progress: each phase's end is reported (the bar itself is drawn on terminals only)
    assert "sft: 5/5 steps, loss " in result.output
    assert "evaluate: 3/3 tasks" in result.output
    result = runner.invoke(app, [*base, "adapters", "list", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["adapter_id"] == "toy-press"
    result = runner.invoke(app, [*base, "adapters", "list"])
    assert result.exit_code == 0 and "toy-press" in result.output
    result = runner.invoke(app, [*base, "adapters", "show", "toy-press", "--json"])
    meta = json.loads(result.stdout)
    assert meta["hyperparameters"]["steps"] == 5 and meta["base_model"]["name"] == "tiny-0"
    result = runner.invoke(app, [*base, "adapters", "show", "nope"])
    assert result.exit_code == 2 and "no adapter 'nope'" in result.output
    result = runner.invoke(app, [*base, "train", "nope", "--model", "tiny"])
    assert result.exit_code == 2 and "nope" in result.output
    evaluate = ["evaluate", "--eval-seeds", "3", "--embedder", "hash", "--json"]
    result = runner.invoke(app, [*base, *evaluate])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["rows"][0]["base"]["n"] == 3 and data["routing"]["n"] == 3
    result = runner.invoke(
        app,
        [*base, "nightly", *small, "--steps", "3", "--embedder", "hash", "--date", "2026-01-02"],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "nightly" / "2026-01-02" / "report.md").exists()
    for stage in ("compact", "analyze", "synthesize", "train", "evaluate", "report"):
        assert f"{stage}: " in result.output  # each stage's end is reported as the bar advances


def _corrupt_tiny_folder(tmp_path):
    """A tiny model folder whose weights cannot load: only the config and tokenizer are sound."""
    from tracegym.generation.model import save_policy, tiny_model

    folder = tmp_path / "corrupt-model"
    save_policy(tiny_model(seed=0), folder)
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"not weights")
    return folder


def test_train_chat_template_without_tools_exits_before_weights(tmp_path):
    from tests.fixtures.chatml_ids import PLAIN_CHATML

    registry.register(tmp_path, press_env(), n_train=16, n_heldout=8, validity_seeds=20)
    folder = _corrupt_tiny_folder(tmp_path)
    template = tmp_path / "no_tools.jinja"
    template.write_text(PLAIN_CHATML)  # a ChatML template that ignores tools
    args = ["--home", str(tmp_path), "train", "toy-press", "--model", str(folder)]
    result = CliRunner().invoke(_app(), [*args, "--chat-template", str(template)])
    assert result.exit_code == 2, result.output
    assert "cannot express tools" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_train_model_whose_own_template_has_no_tools_exits_before_weights(tmp_path):
    from transformers import AutoTokenizer

    from tests.fixtures.chatml_ids import PLAIN_CHATML

    registry.register(tmp_path, press_env(), n_train=16, n_heldout=8, validity_seeds=20)
    folder = _corrupt_tiny_folder(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = PLAIN_CHATML  # a user's ChatML model, as SmolLM2 ships
    tokenizer.save_pretrained(folder)
    (folder / "tracegym_model.json").unlink()
    args = ["--home", str(tmp_path), "train", "toy-press", "--model", str(folder)]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 2, result.output
    assert "--chat-template" in result.output and "cannot express tools" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_train_load_flags_fail_in_one_line(tmp_path):
    import torch

    registry.register(tmp_path, press_env(), n_train=16, n_heldout=8, validity_seeds=20)
    base = ["--home", str(tmp_path), "train", "toy-press", "--model", "tiny"]
    runner = CliRunner()
    result = runner.invoke(_app(), [*base, "--dtype", "float8"])
    assert result.exit_code == 2 and "--dtype must be one of" in result.output
    assert len(result.output.strip().splitlines()) == 1
    if not torch.cuda.is_available():
        result = runner.invoke(_app(), [*base, "--quantize", "4bit"])
        assert result.exit_code == 2, result.output
        assert "--quantize needs a CUDA GPU and bitsandbytes" in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_nightly_checks_template_and_load_flags_first(tmp_path):
    from tests.fixtures.chatml_ids import PLAIN_CHATML

    registry.register(tmp_path, press_env(), n_train=16, n_heldout=8, validity_seeds=20)
    template = tmp_path / "no_tools.jinja"
    template.write_text(PLAIN_CHATML)
    folder = _corrupt_tiny_folder(tmp_path)
    base = ["--home", str(tmp_path), "nightly", "--model", str(folder)]
    runner = CliRunner()
    result = runner.invoke(_app(), [*base, "--chat-template", str(template)])
    assert result.exit_code == 2 and "cannot express tools" in result.output
    assert len(result.output.strip().splitlines()) == 1
    result = runner.invoke(_app(), [*base, "--dtype", "float8"])
    assert result.exit_code == 2 and "--dtype must be one of" in result.output
    assert not list((tmp_path / "nightly").glob("2*"))  # no night started
