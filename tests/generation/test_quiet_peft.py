"""Wrapping a model in peft prints no transformers deprecation warning (model.quiet_peft)."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("peft")

from tracegym.generation.model import quiet_peft, tiny_model
from tracegym.training import adapters
from tracegym.training.sft import attach_lora, default_config


def _caught(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


def test_attaching_and_loading_an_adapter_print_no_gradient_checkpointing_warning(tmp_path):
    model = attach_lora(tiny_model(layers=2).model, default_config("tiny"), "x")
    weights = tmp_path / "adapters" / "x" / "weights"
    model.save_pretrained(str(weights.parent), selected_adapters=["x"])
    (weights.parent / "x").rename(weights)
    messages = _caught(lambda: attach_lora(tiny_model(layers=2).model, default_config("tiny"), "y"))
    messages += _caught(lambda: adapters.load_adapters(tiny_model(layers=2).model, tmp_path, ["x"]))
    assert not [m for m in messages if "is_gradient_checkpointing" in m]


def test_other_warnings_still_show():
    def warn() -> None:
        with quiet_peft():
            warnings.warn("something else", FutureWarning, stacklevel=1)

    assert _caught(warn) == ["something else"]
