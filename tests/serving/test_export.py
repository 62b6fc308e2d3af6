"""`tracegym adapters export`: plain peft folders naming the base model by name, a manifest,
and the vLLM / SGLang command lines."""

from __future__ import annotations

import json

import pytest
from tracegym.store.home import Home, read_json, write_json
from typer.testing import CliRunner

from tests.serving.fakes import BASE, adapter_home


def with_weights(root):
    """adapter_home plus a stand-in weights folder per adapter (what save_adapter writes)."""
    adapter_home(root)
    for folder in Home.at(root).adapters.iterdir():
        weights = folder / "weights"
        weights.mkdir()
        write_json(
            weights / "adapter_config.json",
            {"peft_type": "LORA", "r": 4, "base_model_name_or_path": "/home/me/.tracegym/models/x"},
        )
        (weights / "adapter_model.safetensors").write_bytes(b"weights of " + folder.name.encode())
    return root


def run(*args):
    from tracegym.cli import app

    return CliRunner().invoke(app, list(args))


def test_export_writes_promoted_adapters_with_the_base_models_name(tmp_path):
    home, out = with_weights(tmp_path / "home"), tmp_path / "out"
    result = run("--home", str(home), "adapters", "export", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["press", "refund", "tracegym_adapters.json"]
    config = read_json(out / "press" / "adapter_config.json")
    assert config["base_model_name_or_path"] == BASE and config["r"] == 4
    assert (out / "refund" / "adapter_model.safetensors").read_bytes() == b"weights of refund"
    manifest = json.loads((out / "tracegym_adapters.json").read_text())
    assert manifest["base_model"] == BASE
    assert [a["id"] for a in manifest["adapters"]] == ["press", "refund"]
    root = out.resolve()
    assert f"vllm serve {BASE} --enable-lora --lora-modules press={root / 'press'}" in result.output
    assert f"--model-path {BASE} --lora-paths press={root / 'press'}" in result.output
    # the home's own copy is untouched
    own = read_json(Home.at(home).adapters / "press" / "weights" / "adapter_config.json")
    assert own["base_model_name_or_path"].startswith("/home/me")


def test_export_again_replaces_and_base_model_overrides(tmp_path):
    home, out = with_weights(tmp_path / "home"), tmp_path / "out"
    assert run("--home", str(home), "adapters", "export", str(out)).exit_code == 0
    result = run("--home", str(home), "adapters", "export", str(out), "--base-model", "org/other")
    assert result.exit_code == 0, result.output
    assert read_json(out / "press" / "adapter_config.json")["base_model_name_or_path"] == (
        "org/other"
    )
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging left behind


@pytest.mark.parametrize("case", ["none promoted", "no weights", "two bases", "file target"])
def test_export_user_errors(tmp_path, case):
    home, out = with_weights(tmp_path / "home"), tmp_path / "out"
    adapters = Home.at(home).adapters
    if case == "none promoted":
        for name in ("press", "refund"):
            meta = adapters / name / "meta.json"
            write_json(meta, {**read_json(meta), "promoted": False})
    elif case == "no weights":
        (adapters / "refund" / "weights" / "adapter_config.json").unlink()
    elif case == "two bases":
        meta = adapters / "refund" / "meta.json"
        write_json(meta, {**read_json(meta), "base_model": {"name": "org/else"}})
    else:
        out.write_text("a file")
    result = run("--home", str(home), "adapters", "export", str(out))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    if case != "file target":
        assert not out.exists()  # nothing half-written


@pytest.mark.slow
def test_an_exported_real_adapter_loads_with_peft(tmp_path):
    """save_adapter's real peft folder, exported, loads onto the base model with the same
    weights (peft reads the config; the base is the model it is given, not the config's name)."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from tracegym.generation.model import tiny_model
    from tracegym.training import adapters

    policy = tiny_model(0)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(policy.model, config, adapter_name="press")
    adapters.save_adapter(
        tmp_path / "home", model, "press",
        capability={"env_id": "press"}, base_model={"name": "tiny", "folder": "/x"},
        data_hash="", hyperparameters={}, train_metrics={},
    )  # fmt: skip
    adapters.update_metadata(tmp_path / "home", "press", promoted=True)
    manifest = adapters.export_adapters(tmp_path / "home", tmp_path / "out")
    assert manifest.base_model == "tiny"
    exported = tmp_path / "out" / "press"
    assert read_json(exported / "adapter_config.json")["base_model_name_or_path"] == "tiny"
    loaded = peft.PeftModel.from_pretrained(tiny_model(0).model, str(exported), adapter_name="p")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, loaded(ids).logits, atol=1e-5)
