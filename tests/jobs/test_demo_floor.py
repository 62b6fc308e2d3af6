"""The demo benchmark's accounting on the tiny model: the token counters agree with what the
rollouts and the trainer report themselves, and the FLOP count with the model's own parameters."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch
from tracegym.examples.lm_agent import ShopAgent
from tracegym.examples.shop import KINDS, make_task
from tracegym.generation import tokens
from tracegym.generation.model import ensure_model, load_policy
from tracegym.generation.tokens import TokenCounts
from tracegym.training.compute_floor import ModelShape, matmul_gflops, stage_flops
from tracegym.training.rollout import Session
from tracegym.training.sft import default_config, train_adapter


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return ensure_model(tmp_path_factory.mktemp("home"), "tiny-5")


def test_batched_rollouts_count_what_the_episodes_generated(folder):
    policy = load_policy(folder, device="cpu")
    tasks = [make_task(s, KINDS) for s in range(5)]
    before = tokens.snapshot()
    stats: dict[str, int] = {}
    from tracegym.generation.batching import map_batched

    agent = ShopAgent(policy, max_new_tokens=12, max_turns=2)
    results = map_batched(policy, lambda lane, t: agent.run(t, lane=lane), tasks, batch_size=3,
                          stats=stats)  # fmt: skip
    spent = tokens.snapshot() - before
    assert spent.generated == sum(r.generated_tokens for r in results) > 0
    # every position a batched forward computed is either a real token fed or padding
    assert spent.fed + spent.padded == stats["tokens"]
    # the shared prefix is fed once for the whole wave, not once a row
    assert spent.fed >= spent.generated
    assert spent.trained == spent.loss == 0


def test_a_single_session_counts_its_tokens(folder):
    policy = load_policy(folder, device="cpu")
    session = Session(policy)
    session.feed(list(range(3, 20)))
    before = tokens.snapshot()
    new, _ = session.generate(5, stop_id=-1)
    spent = tokens.snapshot() - before
    assert spent.generated == len(new) == 5
    assert spent.fed == 17 + 4  # the prompt, then each new token but the last


def test_training_counts_its_tokens_and_loss_tokens(folder):
    policy = load_policy(folder, device="cpu")
    chats = [
        [{"role": "user", "content": f"order O{n}?"}, {"role": "assistant", "content": "shipped"}]
        for n in range(3)
    ]
    config = default_config(policy.name, steps=2, batch_size=2, max_length=128)
    before = tokens.snapshot()
    _, metrics = train_adapter(policy, chats, config, "counted")
    spent = tokens.snapshot() - before
    assert spent.trained == metrics.tokens > 0
    assert spent.loss == metrics.trained_tokens > 0
    assert spent.fed == spent.generated == 0


def test_the_shape_counts_the_models_own_parameters(folder):
    policy = load_policy(folder, device="cpu")
    shape = ModelShape.from_folder(folder)
    model = policy.model
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert shape.layer_params == layer
    assert shape.body_params == sum(p.numel() for p in model.model.layers.parameters())
    assert shape.head_params == model.lm_head.weight.numel()


def test_flops_follow_the_stated_rule():
    shape = ModelShape(layers=10, hidden=4, intermediate=8, vocab=50, layer_params=100,
                       head_params=200)  # fmt: skip
    work = stage_flops(shape, TokenCounts(fed=7, padded=3, generated=2))
    assert work["generation"] == 2 * 1000 * 7 + 2 * 200 * 2  # padding costs nothing here
    trained = stage_flops(shape, TokenCounts(trained=5, loss=1), lora_layers=4)
    # forward through everything, backward through the head and the top 4 layers
    assert trained["training"] == 5 * (2 * 1200 + 2 * (200 + 4 * 100))
    assert trained["six_n"] == 5 * 6 * 1200
    # LoRA on every layer: still no weight gradients of the frozen weights (4N, not 6N)
    assert stage_flops(shape, TokenCounts(trained=5))["training"] == 5 * 4 * 1200


def test_the_matmul_probe_measures_and_restores_the_thread_count():
    before = torch.get_num_threads()
    assert matmul_gflops(32, 64, rows=16, seconds=0.02, threads=1) > 0
    assert torch.get_num_threads() == before


def test_the_sliced_loss_is_the_full_loss(folder):
    from tracegym.training.sft import collate, encode_examples, sft_loss

    policy = load_policy(folder, device="cpu")
    chats = [
        [{"role": "user", "content": f"order O{n}? " * (n + 1)},
         {"role": "assistant", "content": "shipped " * (3 - n)}]
        for n in range(3)
    ]  # fmt: skip
    inputs = collate(encode_examples(policy.tokenizer, chats, 128), 0, "cpu")
    model = policy.model
    full = model(**inputs).loss
    full.backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    sliced = sft_loss(model, inputs)
    sliced.backward()
    assert torch.allclose(sliced, full, atol=1e-5)
    for p, g in zip(model.parameters(), full_grads, strict=True):
        assert torch.allclose(p.grad, g, atol=1e-5)
