"""Training: tiny model, rollouts, SFT with LoRA, registry, held-out evaluation."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tracegym.generation.chat_format import CHATML, ChatFormat, template_text
from tracegym.generation.chat_tokens import ChatTokens
from tracegym.generation.model import ensure_model, load_policy, tiny_model
from tracegym.training import adapters
from tracegym.training.evaluate import decide, gain_p_value, look_sizes, rate, settled, wilson
from tracegym.training.rollout import action_of, rollout, success_rate
from tracegym.training.sft import (
    capability_data,
    default_config,
    train_adapter,
    train_capability,
)
from tracegym.training.toy import press_env

# Trains or runs real models: out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow

HELDOUT = range(1_000_000, 1_000_020)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny model trained once on the toy environment, registered under a home."""
    home = tmp_path_factory.mktemp("home")
    folder = ensure_model(home, "tiny")
    meta = train_capability(home, press_env(), folder, eval_seeds=20)
    return home, folder, meta


def test_tiny_model_builds_fast_and_round_trips(tmp_path):
    import time

    tiny_model(seed=2)  # imports transformers (not part of the build time)
    started = time.perf_counter()
    policy = tiny_model(seed=1)
    assert time.perf_counter() - started < 1.0
    assert sum(p.numel() for p in policy.model.parameters()) < 500_000
    folder = ensure_model(tmp_path, "tiny-1")
    again = load_policy(folder)
    assert again.name == "tiny-1"
    assert ensure_model(tmp_path, "tiny-1") == folder  # built once
    ids, mask = ChatTokens(again.chat_format).encode(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "done"}]
    )
    assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)


def parse_action(text: str) -> dict:
    """The action a ChatML model's reply stands for, as a rollout reads it."""
    fmt = ChatFormat(tiny_model().tokenizer, template_text(CHATML))
    return action_of(fmt.parse_reply(text), text, CHATML)


def test_parse_action_never_raises_and_flags_malformed_calls():
    assert parse_action("all done") == {"answer": "all done"}
    ok = parse_action('<tool_call>{"name": "press", "arguments": {"color": "red"}}</tool_call>')
    assert ok == {"name": "press", "arguments": {"color": "red"}}
    for text in (
        "<tool_call>{not json",
        '<tool_call>{"name": "press", "arguments": {"color": ',
        "<tool_call>[1, 2]</tool_call>",
        "<tool_call></tool_call>",
        '<tool_call>{"arguments": 3}</tool_call>',
        '<tool_call>{"name": "press", "arguments": [1]}</tool_call>',
    ):
        action = parse_action(text)
        assert "answer" not in action, text


def test_malformed_model_output_is_a_failed_step_not_a_crash():
    env = press_env()

    env.reset(seed=3)
    for text in ("<tool_call>{broken", '<tool_call>{"name": "explode", "arguments": {}}'):
        obs, _r, terminated, truncated, _info = env.step(parse_action(text))
        assert obs["content"].startswith("Error:") and not (terminated or truncated)
    _obs, _reward, terminated, _t, info = env.step(parse_action("done"))
    assert terminated and not info["passed"] and env.episode.invalid == 2


def test_rollout_is_traced_and_kv_cache_matches_recompute():
    import tracegym as tg

    policy = tiny_model()
    env = press_env()
    with tg.testing.capture() as captured:
        cached = rollout(policy, env, 1_000_003, max_new_tokens=24)
    plain = rollout(policy, env, 1_000_003, max_new_tokens=24, use_cache=False, trace=False)
    assert [m["content"] for m in cached.messages] == [m["content"] for m in plain.messages]
    names = captured.names()
    assert "invoke_agent policy" in names and any(n.startswith("chat ") for n in names)
    assert not cached.passed and cached.generated_tokens > 0


def test_capability_data_masks_assistant_tokens_only():
    env = press_env()
    data = capability_data(env, range(4))
    assert data.demonstrations == 4 and len(data.conversations) == 4
    conversation = data.conversations[0]
    assert conversation.messages[0]["role"] == "system"
    assert [t["function"]["name"] for t in conversation.tools] == ["press"]
    assert data.hash == capability_data(env, range(4)).hash
    policy = tiny_model()
    ids, mask = ChatTokens(policy.chat_format, conversation.tools).encode(conversation.messages)
    prompt = policy.tokenizer.decode(ids)
    assert '"name": "press"' in prompt and "<tools>" in prompt  # the template's tool list
    trained = policy.tokenizer.decode([t for t, m in zip(ids, mask, strict=False) if m])
    assert "press" in trained and "done" in trained and "Ticket" not in trained
    assert "<tools>" not in trained and "<tool_response>" not in trained


def test_training_raises_heldout_success(trained):
    """The real assertion: a tiny random model learns the toy task; held-out success goes up."""
    _home, _folder, meta = trained
    row = meta["metrics"]["eval"]
    assert row["base"]["rate"] <= 0.1
    assert row["adapter"]["rate"] >= 0.6, row
    assert row["adapter"]["ci95"][0] > row["base"]["ci95"][1]
    assert meta["promoted"] and "significant" in meta["promotion"]
    train = meta["metrics"]["train"]
    assert train["loss_last"] < train["loss_first"] / 5


def test_registry_round_trip(trained):
    home, folder, meta = trained
    listed = adapters.all_metadata(home)
    assert [a.adapter_id for a in listed] == ["toy-press"]
    shown = adapters.metadata(home, "toy-press")
    assert shown.capability.env_ids == ("toy-press",) and shown.data_hash and shown.created_at
    assert shown.base_model.hash and shown.hyperparameters["rank"] == 16
    assert shown.metrics.eval is not None and shown.promoted == shown.metrics.eval.promoted
    assert shown.to_dict() == meta  # train_capability returns the JSON form of what it wrote
    assert len(adapters.read_router_texts(home, "toy-press").texts) > 10
    assert adapters.show(home, "toy-press")["router_texts"] > 10
    # reload the adapter on a fresh base: the same greedy held-out result
    policy = load_policy(folder)
    model = adapters.load_adapters(policy.model, home, ["toy-press"])
    model.set_adapter("toy-press")
    from tracegym.generation.model import Policy

    passed, _n, _ = success_rate(Policy(model, policy.tokenizer, "x"), press_env(), HELDOUT)
    assert passed == meta["metrics"]["eval"]["adapter"]["passed"]
    # rejection sampling with the trained policy: passing rollouts join the demonstrations
    data = capability_data(
        press_env(), range(4), policy=Policy(model, policy.tokenizer, "x"), samples=2
    )
    assert data.attempted == 8 and 0 < data.sampled <= 8
    assert len(data.conversations) == data.demonstrations + data.sampled == 4 + data.sampled
    with pytest.raises(adapters.AdapterError):
        adapters.metadata(home, "nope")
    assert not any(p.name.startswith(".") for p in (home / "adapters").iterdir())
    json.loads((home / "adapters" / "toy-press" / "meta.json").read_text())


def test_statistics():
    low, high = wilson(0, 20)
    assert low == 0 and 0.15 < high < 0.17
    low, high = wilson(10, 20)
    assert 0.29 < low < 0.3 and 0.7 < high < 0.71
    assert gain_p_value(0, 20, 13, 20) < 0.001
    assert gain_p_value(5, 20, 6, 20) > 0.3
    promoted, reason = decide(rate(5, 20), rate(6, 20))
    assert not promoted and "not significant" in reason
    assert decide(rate(0, 20), rate(15, 20))[0]


def test_peeking_twice_splits_alpha():
    assert look_sizes(12, 2) == [6, 12] and look_sizes(1, 2) == [0, 1] and look_sizes(5, 1) == [5]
    # 0/12 -> 3/12 is p = 0.032: enough with one look, not with alpha split over two
    assert decide(rate(0, 12), rate(3, 12))[0]
    promoted, reason = decide(rate(0, 12), rate(3, 12), looks=2)
    assert not promoted and "0.05 over 2 looks" in reason
    assert settled(rate(0, 6), rate(6, 6), 12, 0.05, 2) == "significant"
    assert settled(rate(3, 6), rate(3, 6), 12, 0.05, 2) is None  # 6 good seeds could still do it
    assert settled(rate(6, 6), rate(0, 6), 12, 0.05, 2) == "hopeless"


def test_sequential_evaluation_stops_each_adapter_once_clear(monkeypatch):
    from dataclasses import dataclass

    from tracegym.training import evaluate

    @dataclass
    class Result:
        seed: int
        passed: bool

    outcome = {  # adapter -> (base passes?, adapted passes?) by seed
        "clear": lambda s, adapted: adapted,
        "worse": lambda s, adapted: not adapted,
        "unclear": lambda s, adapted: s % 2 == 0,
    }
    calls = []

    def fake_run_arms(policy, jobs, batch_size=8, **kw):
        calls.append([(job.adapter_id, [s for _, s in job.cases]) for job in jobs])
        return [
            tuple([Result(s, outcome[job.adapter_id](s, arm)) for _, s in job.cases]
                  for arm in (False, True))
            for job in jobs
        ]  # fmt: skip

    monkeypatch.setattr(evaluate, "run_arms", fake_run_arms)
    env = press_env()
    jobs = [evaluate.EvalJob.of(env, name, range(100, 112)) for name in outcome]
    rows = evaluate.evaluate_capabilities(None, None, jobs, looks=2)
    assert calls[1] == [("unclear", list(range(106, 112)))]  # the others stopped after 6 seeds
    by = {r["adapter_id"]: r for r in rows}
    assert by["clear"]["promoted"] and by["clear"]["adapter"] == rate(6, 6)
    assert by["clear"]["sequential"] == {
        "looks": 2,
        "planned": 12,
        "run": 6,
        "stopped": "significant",
    }
    assert not by["worse"]["promoted"] and by["worse"]["sequential"]["stopped"] == "hopeless"
    assert "could not make it significant" in by["worse"]["reason"]
    assert by["unclear"]["base"]["n"] == 12 and by["unclear"]["sequential"]["stopped"] is None
    assert by["unclear"]["seeds"] == [100, 111]


def test_precision_is_checked_and_bf16_only_where_native():
    import torch
    from tracegym.training.sft import TrainConfig, autocast_dtype, native_bf16

    with pytest.raises(ValueError, match="precision must be one of"):
        TrainConfig(precision="fp16")
    assert native_bf16("cpu", "flags : fpu avx2 avx512f avx512_bf16") is True
    assert native_bf16("cpu", "flags : fpu avx2 avx512f") is False
    assert native_bf16("mps", "avx512_bf16") is False
    assert autocast_dtype("fp32", "cpu") is None and autocast_dtype("bf16", "cpu") is torch.bfloat16
    assert autocast_dtype("auto", "cpu") == (torch.bfloat16 if native_bf16("cpu") else None)


def test_sft_under_bf16_autocast_learns_and_keeps_fp32_weights():
    import torch

    policy = tiny_model()
    data = capability_data(press_env(), range(8))
    config = default_config("tiny", steps=10, precision="bf16")
    model, metrics = train_adapter(policy, data.conversations, config, "x")
    assert metrics.loss_last < metrics.loss_first
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert lora and all(p.dtype == torch.float32 for p in lora)


def test_sft_on_in_memory_model_lowers_loss():
    policy = tiny_model()
    data = capability_data(press_env(), range(8))
    _model, metrics = train_adapter(
        policy, data.conversations, default_config("tiny", steps=10), "x"
    )
    assert metrics.loss_last < metrics.loss_first and metrics.tokens_per_second > 0


def test_grpo_runs_and_its_update_favours_higher_reward():
    import torch
    from tracegym.generation.model import Policy
    from tracegym.training.sft import encode_examples, grpo_loss, train_grpo

    env = press_env()
    policy = tiny_model()
    data = capability_data(env, range(32))
    model, _ = train_adapter(policy, data.conversations, default_config("tiny", steps=25), "toy")
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    config = default_config(
        "tiny", mode="grpo", steps=2, grpo_tasks=2, group_size=4, lr=1e-3, max_new_tokens=40
    )
    model, metrics = train_grpo(policy, env, list(range(32)), config, "toy", model=model)
    assert metrics.mode == "grpo" and metrics.examples == 16
    assert metrics.reward_first is not None and 0 <= metrics.reward_last <= 1
    changed = [
        n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, lora[n])
    ]
    assert changed or metrics.tokens == 0  # no group had variance: nothing to learn from
    # the update direction: one step raises the likelihood of above-average episodes
    work = Policy(model, policy.tokenizer, policy.name)
    generator = torch.Generator().manual_seed(3)
    group = [
        rollout(work, env, 5, temperature=1.0, generator=generator, trace=False) for _ in range(8)
    ]
    rewards = torch.tensor([r.reward for r in group])
    if float(rewards.std()) > 1e-6:
        advantages = ((rewards - rewards.mean()) / rewards.std()).tolist()
    else:  # every sample scored the same: any advantages test the direction of the update
        advantages = [1.0 if i % 2 else -1.0 for i in range(len(group))]
    batch = [encode_examples(policy.tokenizer, [r.conversation()], 1024)[0] for r in group]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1e-2)
    before, _ = grpo_loss(model, batch, advantages, 0, "cpu")
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after, _ = grpo_loss(model, batch, advantages, 0, "cpu")
    assert float(after) < float(before)


@pytest.fixture
def one_thread():
    """Tiny models run fastest (and reproducibly) on one thread, above all on a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_grpo_raises_sampled_reward_and_heldout_success(one_thread):
    """GRPO moves reward: after a weak SFT warm start (2 steps) the policy names the right colour
    in few of its samples; 10 GRPO steps later, in more. Seeded, so the numbers are fixed:
    sampled reward 0.822 -> 0.878 (7/64 -> 25/64 passed), greedy held-out 0/40 -> 14/40."""
    import torch
    from tracegym.generation.model import Policy
    from tracegym.training.sft import TrainStep, sample_episode, train_grpo
    from tracegym.training.toy import pick_env

    env = pick_env(colors=2)
    policy = tiny_model()
    data = capability_data(env, range(32))
    model, _ = train_adapter(policy, data.conversations, default_config("tiny", steps=2), "pick")
    work = Policy(model, policy.tokenizer, policy.name)
    heldout = range(1_000_000, 1_000_064)

    def measure() -> tuple[float, int, int]:
        generator = torch.Generator().manual_seed(123)
        with torch.no_grad():
            sampled = [
                sample_episode(work, env, s, temperature=1.0, generator=generator, max_new_tokens=8)
                for s in heldout
            ]
            greedy = [
                sample_episode(work, env, s, temperature=0.0, max_new_tokens=8)
                for s in heldout[:40]
            ]
        reward = sum(e.reward for e in sampled) / len(sampled)
        return reward, sum(e.passed for e in sampled), sum(e.passed for e in greedy)

    reward0, passed0, greedy0 = measure()
    config = default_config(
        "tiny", mode="grpo", steps=10, grpo_tasks=8, group_size=4, grpo_lr=3e-3, max_new_tokens=8
    )
    steps: list[TrainStep] = []
    model, metrics = train_grpo(
        policy, env, range(256), config, "pick", model=model, on_step=steps.append
    )
    reward1, passed1, greedy1 = measure()
    print(f"GRPO: sampled reward {reward0:.3f} -> {reward1:.3f}, passed {passed0} -> {passed1}/64,"
          f" greedy {greedy0} -> {greedy1}/40")  # fmt: skip
    assert reward1 >= reward0 + 0.05, (reward0, reward1)
    assert passed1 >= passed0 + 15 and greedy1 >= greedy0 + 10, (passed0, passed1, greedy0, greedy1)
    assert [(s.phase, s.done, s.total) for s in steps] == [("grpo", i, 10) for i in range(1, 11)]
    assert all(s.reward is not None and 0.6 <= s.reward <= 1 for s in steps)
    assert metrics.examples == 10 * 8 * 4 and metrics.reward_last > metrics.reward_first


def test_sample_episode_keeps_the_sampled_tokens(one_thread):
    """GRPO trains on the ids that were sampled; decoding and encoding them again does not give
    them back for a random model, which is why sample_episode exists next to rollout."""
    import torch
    from tracegym.training.sft import sample_episode

    policy = tiny_model()
    encoder = ChatTokens(policy.chat_format)
    generator = torch.Generator().manual_seed(0)
    differ = 0
    for seed in range(6):
        episode = sample_episode(
            policy, press_env(), seed, temperature=1.0, generator=generator, max_new_tokens=12
        )
        assert len(episode.ids) == len(episode.mask) and 0 < sum(episode.mask) <= 4 * 12
        first = [t for t, m in zip(episode.ids, episode.mask, strict=True) if m][:12]
        text = policy.tokenizer.decode(first, skip_special_tokens=False)
        differ += encoder.ids(text) != first
    assert differ > 0


def test_train_capability_reports_each_phase(tmp_path, one_thread):
    from tracegym.training.sft import TrainStep
    from tracegym.training.toy import pick_env

    folder = ensure_model(tmp_path, "tiny")
    steps: list[TrainStep] = []
    config = default_config(
        "tiny", mode="grpo", steps=2, warm_start_steps=3, samples=1, train_seeds=4,
        grpo_tasks=2, group_size=2, max_new_tokens=6,
    )  # fmt: skip
    meta = train_capability(
        tmp_path, pick_env(), folder, config, eval_seeds=3, on_step=steps.append
    )
    seen = [(s.phase, s.done, s.total) for s in steps]
    assert seen == [
        *[("sample", i, 4) for i in range(1, 5)],
        *[("sft", i, 3) for i in range(1, 4)],
        *[("grpo", i, 2) for i in range(1, 3)],
        ("evaluate", 0, 3),
        ("evaluate", 3, 3),
    ]
    assert all(s.loss is not None for s in steps if s.phase == "sft")
    assert meta["metrics"]["train"]["sft"]["steps"] == 3 and meta["metrics"]["train"]["steps"] == 2


def test_rollouts_are_queryable_in_the_store_after_compaction(tmp_path, tracer_setup):
    pytest.importorskip("duckdb")
    import tracegym as tg
    from tracegym.jobs.nightly import NightlyConfig, NightRunner
    from tracegym.store.store import Store

    tracer_setup(service="policy-rollouts", home=tmp_path)
    policy = tiny_model()
    env = press_env()
    results = [rollout(policy, env, s, max_new_tokens=8) for s in (1_000_000, 1_000_001)]
    tg.flush()
    tg.shutdown()
    compacted = NightRunner(tmp_path, NightlyConfig(), None, None, None).stage_compact()
    assert compacted.status == "done" and compacted.spans > 0
    with Store(tmp_path, compact_on_open=False) as store:
        rows = store.sql("SELECT run_id, agent, success FROM traces ORDER BY run_id").fetchall()
        calls = store.sql("SELECT count(*) FROM llm_calls").fetchall()[0][0]
    assert sorted(r[0] for r in rows) == sorted(r.run_id for r in results)
    assert all(r[1] == "policy" and r[2] is False for r in rows)
    assert calls >= 2
