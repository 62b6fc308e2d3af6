"""A batch's common beginning runs once (training.shared_prefix)."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")

from tracegym.generation.model import tiny_model
from tracegym.generation.shared_prefix import common_length, shared_prefix_loss
from tracegym.training.sft import (
    _encode,
    attach_lora,
    capability_data,
    collate,
    default_config,
    sft_loss,
    train_adapter,
)
from tracegym.training.toy import press_env

pytestmark = pytest.mark.slow


def test_common_length_counts_equal_tokens_and_labels_and_leaves_each_row_one():
    assert common_length([([1, 2, 3, 4], [0, 0, 1, 1]), ([1, 2, 3, 5], [0, 0, 1, 1])]) == 3
    assert common_length([([1, 2, 3, 4], [0, 0, 1, 1]), ([1, 2, 3, 4], [0, 1, 1, 1])]) == 1
    assert common_length([([1, 2, 3], [0, 0, 1]), ([1, 2, 3, 4, 5], [0, 0, 1, 1, 1])]) == 2
    assert common_length([([7, 2], [0, 1]), ([8, 2], [0, 1])]) == 0


def _toy_batch(rows: int):
    import torch

    torch.manual_seed(0)
    policy = tiny_model(layers=4)
    conversations = capability_data(press_env(), range(rows)).conversations
    examples = _encode(policy.tokenizer, conversations, 1024)[0][:rows]
    model = attach_lora(policy.model, default_config("tiny", batch_size=rows), "x")
    for p in model.parameters():  # away from LoRA's zero start, so every gradient is nonzero
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    return model, examples, collate(examples, policy.tokenizer.pad_token_id or 0, "cpu")


def _loss_and_grads(model, loss_fn):
    model.zero_grad()
    loss = loss_fn()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return float(loss.detach()), grads


def test_the_loss_and_gradients_are_the_whole_batchs():
    import torch

    model, examples, inputs = _toy_batch(3)
    shortest = min(len(ids) for ids, _ in examples)
    assert common_length(examples) > max(32, shortest / 2)  # the system message, the task's start
    whole, whole_grads = _loss_and_grads(model, lambda: sft_loss(model, inputs))
    shared, shared_grads = _loss_and_grads(
        model, lambda: shared_prefix_loss(model, inputs, examples)
    )
    assert shared == pytest.approx(whole, rel=1e-5)
    assert whole_grads.keys() == shared_grads.keys() and whole_grads
    for name, grad in whole_grads.items():
        assert grad.abs().max() > 0, name
        assert torch.allclose(grad, shared_grads[name], atol=1e-5), name


def test_none_where_there_is_nothing_worth_sharing():
    model, examples, inputs = _toy_batch(2)
    one = collate(examples[:1], 0, "cpu")
    assert shared_prefix_loss(model, one, examples[:1]) is None
    assert shared_prefix_loss(model, inputs, examples, min_shared=10_000) is None
    common = common_length(examples)
    shortest = min(len(ids) for ids, _ in examples)
    assert shared_prefix_loss(model, inputs, examples, min_share=common / shortest) is None
    just_enough = (common - 2) / shortest
    assert shared_prefix_loss(model, inputs, examples, min_share=just_enough) is not None


def _train(shared_prefix: bool) -> tuple[list[float], dict[str, object], int]:
    """Losses, LoRA weights and the token positions the top layer ran, for 6 steps of 2 on 4
    toy conversations with the frozen lower layers run once per example."""
    import torch

    torch.manual_seed(0)
    policy = tiny_model(layers=4)
    positions = [0]

    def count(_module, args, kwargs) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        positions[0] += hidden.shape[0] * hidden.shape[1]

    policy.model.model.layers[3].register_forward_pre_hook(count, with_kwargs=True)
    data = capability_data(press_env(), range(4))
    config = default_config("tiny", steps=6, batch_size=2, layers=[2, 3],
                            shared_prefix=shared_prefix)  # fmt: skip
    losses: list[float] = []
    model, _ = train_adapter(policy, data.conversations, config, "x",
                             progress=lambda _, loss: losses.append(loss))  # fmt: skip
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    return losses, lora, positions[0]


def test_training_with_the_shared_prefix_learns_the_same_and_runs_fewer_positions():
    import torch

    whole, whole_lora, whole_positions = _train(shared_prefix=False)
    shared, shared_lora, shared_positions = _train(shared_prefix=True)
    assert shared == pytest.approx(whole, rel=1e-4)
    for name, weight in whole_lora.items():
        # Adam divides by the gradient's running size, so float reordering in an element whose
        # gradient is near zero shows as a fraction of a step: 1e-4 is 1% of one (lr 1e-2)
        assert torch.allclose(weight, shared_lora[name], atol=1e-4), name
    assert shared_positions < 0.75 * whole_positions
