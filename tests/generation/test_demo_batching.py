"""Lanes of different LoRA adapters (and of the base model) in one wave: each lane gets the
replies it gets alone with its adapter set, so the demo's evaluation and held-out runs can batch
the base and the adapted agent together."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import torch
from tracegym.generation.batching import map_batched
from tracegym.generation.model import Policy, tiny_model
from tracegym.training.rollout import Session
from tracegym.training.sft import attach_lora, default_config

from tests.fixtures.chatml_ids import ChatML


@pytest.fixture(scope="module")
def peft_policy():
    policy = tiny_model(seed=3)
    config = default_config(policy.name, rank=4, alpha=8)
    model = attach_lora(policy.model, config, "alpha")
    model = attach_lora(model, config, "beta")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # B starts at zero: make the adapters change something
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.eval()
    return Policy(model, policy.tokenizer, policy.name)


def _alone(policy, ids, adapter, n, end):
    model = policy.model
    if adapter is None:
        with model.disable_adapter():
            session = Session(policy)
            session.feed(ids)
            return session.generate(n, end)[0]
    model.base_model.enable_adapter_layers()
    model.set_adapter(adapter)
    session = Session(policy)
    session.feed(ids)
    return session.generate(n, end)[0]


def test_a_mixed_wave_gives_each_lane_its_adapters_replies(peft_policy):
    encoder = ChatML(peft_policy.tokenizer)
    system = encoder.message("system", "You press buttons for the user. " * 3)[0]
    prompts = [
        system + encoder.message("user", text)[0] + encoder.header("assistant")
        for text in ("hi", "press the red button", "press it twice please")
    ]
    items = [(ids, adapter) for adapter in (None, "alpha", "beta") for ids in prompts]

    def two_turns(lane, item):
        ids, _ = item
        first, _ = lane.generate(ids, 10, encoder.end_id)
        follow = ids + first + encoder.message("tool", "ok")[0] + encoder.header("assistant")
        second, _ = lane.generate(follow, 10, encoder.end_id)
        return first, second, follow

    stats: dict[str, int] = {}
    mixed = map_batched(peft_policy, two_turns, items, batch_size=5, stats=stats,
                        adapter_of=lambda item: item[1])  # fmt: skip
    assert stats["shared"] > 0  # the system prompt was prefilled once per adapter, then shared
    for (ids, adapter), (first, second, follow) in zip(items, mixed, strict=True):
        assert first == _alone(peft_policy, ids, adapter, 10, encoder.end_id)
        assert second == _alone(peft_policy, follow, adapter, 10, encoder.end_id)
    # the adapters do change the replies (else this test would prove nothing)
    firsts = {adapter: [m[0] for (_, a), m in zip(items, mixed, strict=True) if a == adapter]
              for adapter in (None, "alpha", "beta")}  # fmt: skip
    assert firsts[None] != firsts["alpha"] and firsts["alpha"] != firsts["beta"]


def test_per_lane_adapters_need_a_peft_model():
    policy = tiny_model(seed=3)
    with pytest.raises(ValueError, match="PeftModel"):
        map_batched(policy, lambda lane, x: x, [1], adapter_of=lambda x: "alpha")
    # all lanes on the base model: nothing to mix, a plain model is fine
    assert map_batched(policy, lambda lane, x: x, [1, 2], adapter_of=lambda x: None) == [1, 2]


def test_evaluation_arms_share_waves_and_keep_each_episode(peft_policy):
    from tracegym.training.evaluate import EvalJob, evaluate_capabilities, run_arms
    from tracegym.training.rollout import rollout
    from tracegym.training.toy import press_env

    model = peft_policy.model
    plan = [(press_env("toy-a"), "alpha", [1_000_000, 1_000_001]),
            (press_env("toy-b"), "beta", [1_000_002, 1_000_003, 1_000_004])]  # fmt: skip
    jobs = [EvalJob.of(*job) for job in plan]
    arms = run_arms(peft_policy, jobs, batch_size=6, trace=False, max_new_tokens=12)

    def alone(env, seed, adapter):
        if adapter is None:
            with model.disable_adapter():
                return rollout(peft_policy, env, seed, trace=False, max_new_tokens=12)
        model.base_model.enable_adapter_layers()
        model.set_adapter(adapter)
        return rollout(peft_policy, env, seed, trace=False, max_new_tokens=12)

    for (env, adapter, seeds), (base, adapted) in zip(plan, arms, strict=True):
        assert [r.seed for r in base] == [r.seed for r in adapted] == seeds
        assert [r.messages for r in base] == [alone(env, s, None).messages for s in seeds]
        assert [r.messages for r in adapted] == [alone(env, s, adapter).messages for s in seeds]
    rows = evaluate_capabilities(model, peft_policy.tokenizer, jobs, batch_size=6, trace=False,
                                 max_new_tokens=12)  # fmt: skip
    assert [(r["adapter_id"], r["base"]["n"]) for r in rows] == [("alpha", 2), ("beta", 3)]
    assert all(r["promoted"] is False and r["router"] is None for r in rows)
