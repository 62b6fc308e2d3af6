"""The frozen lower layers run once per example (training.frozen)."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")

from tracegym.generation.model import tiny_model
from tracegym.training.frozen_prefix import FrozenPrefix
from tracegym.training.sft import capability_data, default_config, train_adapter
from tracegym.training.toy import press_env

pytestmark = pytest.mark.slow


def _train(frozen_prefix: bool) -> tuple[list[float], dict[str, object], int, int]:
    """Losses, LoRA weights, how often layer 0 ran and the layers the model has after training,
    for 6 steps on 4 toy conversations."""
    import torch

    torch.manual_seed(0)
    policy = tiny_model(layers=4)
    runs = [0]
    policy.model.model.layers[0].register_forward_hook(lambda *_: runs.__setitem__(0, runs[0] + 1))
    data = capability_data(press_env(), range(4))
    config = default_config("tiny", steps=6, batch_size=2, layers=[2, 3],
                            frozen_prefix=frozen_prefix, shared_prefix=False)  # fmt: skip
    losses: list[float] = []
    model, _ = train_adapter(policy, data.conversations, config, "x",
                             progress=lambda _, loss: losses.append(loss))  # fmt: skip
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    return losses, lora, runs[0], len(model.get_base_model().model.layers)


def test_the_prefix_gives_the_whole_forward_pass_loss_and_runs_once_per_example():
    import torch

    whole, whole_lora, whole_runs, _ = _train(frozen_prefix=False)
    split, split_lora, split_runs, layers = _train(frozen_prefix=True)
    assert whole_runs == 6  # one batched pass a step
    assert split_runs == 4  # one pass per example, then never again
    assert split == pytest.approx(whole, rel=1e-4)
    assert whole_lora.keys() == split_lora.keys() and whole_lora
    for name, weight in whole_lora.items():
        # Adam divides by the gradient's running size, so float reordering in an element whose
        # gradient is near zero shows as a fraction of a step: 1e-4 is 1% of one (lr 1e-2)
        assert torch.allclose(weight, split_lora[name], atol=1e-4), name
    assert layers == 4  # the model is whole again after training


def test_no_prefix_where_every_layer_trains_or_the_layout_is_unknown():
    import torch

    policy = tiny_model(layers=4)
    assert FrozenPrefix.of(policy.model, None, torch.autocast) is None
    assert FrozenPrefix.of(policy.model, [0, 3], torch.autocast) is None
    assert FrozenPrefix.of(policy.model, [9], torch.autocast) is None  # past the last layer
    assert FrozenPrefix.of(torch.nn.Linear(2, 2), [1], torch.autocast) is None
    prefix = FrozenPrefix.of(policy.model, [2, 3], torch.autocast)
    assert prefix is not None and prefix.start == 2
