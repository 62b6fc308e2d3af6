"""load_policy's load options: dtype, device_map, quantize (tiny model, CPU)."""

from __future__ import annotations

import pytest
from tracegym.generation.model import (
    LoadOptions,
    ModelError,
    load_policy,
    save_policy,
    tiny_model,
)

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    target = tmp_path_factory.mktemp("tiny") / "model"
    save_policy(tiny_model(seed=0), target)
    return target


def test_defaults_load_as_today(folder) -> None:
    assert LoadOptions().from_pretrained_kwargs() == {}
    policy = load_policy(folder, "cpu")
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}


def test_bfloat16_params(folder) -> None:
    policy = load_policy(folder, "cpu", dtype="bfloat16")
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    assert policy.tokenizer.chat_template  # the tokenizer is set up as with the defaults


def test_device_map_places_weights(folder) -> None:
    pytest.importorskip("accelerate")
    policy = load_policy(folder, dtype="float32", device_map="cpu")
    assert {p.device.type for p in policy.model.parameters()} == {"cpu"}


def test_unknown_dtype_is_one_line(folder) -> None:
    with pytest.raises(ModelError) as info:
        load_policy(folder, "cpu", dtype="float8")
    assert "\n" not in str(info.value) and "--dtype must be one of" in str(info.value)


def test_unknown_quantize_is_one_line() -> None:
    with pytest.raises(ModelError, match="--quantize must be one of"):
        LoadOptions(quantize="2bit")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_quantize_on_cpu_is_one_line(tmp_path) -> None:
    # the options are checked before any file is read: a missing folder still gets this message
    with pytest.raises(ModelError) as info:
        load_policy(tmp_path / "missing", quantize="4bit")
    assert str(info.value) == "--quantize needs a CUDA GPU and bitsandbytes"


def test_train_capability_loads_the_base_with_the_options_it_is_given(monkeypatch) -> None:
    from tracegym.training import sft

    seen: dict[str, object] = {}

    class Loaded(Exception):
        pass

    def fake_load_policy(folder, device=None, **options):
        seen.update(options)
        raise Loaded

    monkeypatch.setattr(sft, "load_policy", fake_load_policy)
    monkeypatch.setattr(sft, "capabilities", lambda envs: [type("C", (), {"envs": envs})()])
    with pytest.raises(Loaded):
        sft.train_capability("home", object(), "folder", load=LoadOptions(dtype="bfloat16"))
    assert seen == {
        "dtype": "bfloat16",
        "device_map": None,
        "quantize": None,
        "chat_template": None,
    }
    with pytest.raises(Loaded):
        sft.train_capability("home", object(), "folder")
    assert seen == {"dtype": None, "device_map": None, "quantize": None, "chat_template": None}
