"""The TRL adapter: a tracegym environment as `GRPOTrainer(environment_factory=...)` wants it.

The class's tool methods give the tools' schemas back through transformers' `get_json_schema`
(what TRL renders into the prompt), an oracle episode driven through them earns the verifier's
reward from `verifier_reward`, and a few real GRPO steps of TRL 1.16 with the tiny model run on
one environment: the tiny model is first taught one tool call, so TRL's own parser sends it to
the environment's method, and every rollout's reward is the verifier's verdict on the episode the
environment recorded."""

from __future__ import annotations

import inspect
import json

import pytest

pytest.importorskip("transformers", reason="the training extra (transformers) is not installed")
from tracegym.synthesis.base import Environment, Task
from tracegym.synthesis.families import FAMILIES, build_spec
from tracegym.synthesis.fixtures import gap, shop_traces
from tracegym.synthesis.spec import infer_catalog
from tracegym.training.trl_env import (
    TRLEnvironment,
    tool_method,
    trl_dataset,
    trl_environment_factory,
    verifier_reward,
)
from transformers.utils import get_json_schema

pytestmark = pytest.mark.timeout(240)
CALL = '<tool_call>\n{"name": "search_products", "arguments": {"query": "kettle"}}\n</tool_call>'


@pytest.fixture(scope="module")
def env() -> Environment:
    spec = build_spec(
        gap("wrong_tool_order", ["cancel_pending_order"]), infer_catalog(shop_traces(40))
    )
    return FAMILIES[spec.family](spec)


def test_each_tool_is_a_method_whose_schema_is_the_tools(env):
    cls = trl_environment_factory(env)
    assert issubclass(cls, TRLEnvironment) and cls.__name__.endswith("TRLEnv")
    instance = cls()
    for tool in env.tool_schemas():
        want = tool["function"]
        got = get_json_schema(getattr(instance, want["name"]))["function"]
        assert got["name"] == want["name"] and got["description"] == want["description"]
        params, wanted = got["parameters"], want["parameters"]
        assert list(params["properties"]) == list(wanted["properties"])
        assert params.get("required", []) == wanted["required"]
        for arg, schema in wanted["properties"].items():
            assert params["properties"][arg]["type"] == schema["type"]
            assert params["properties"][arg].get("enum") == schema.get("enum")
            if "pattern" in schema:  # no JSON-schema slot from type hints: said in the text
                assert schema["pattern"] in params["properties"][arg]["description"]
            if schema["type"] == "array":
                assert params["properties"][arg]["items"]["type"] == schema["items"]["type"]


def test_an_oracle_episode_through_the_methods_earns_the_verifiers_reward(env):
    instance = trl_environment_factory(env)()
    task = env.make_task(3)
    text = instance.reset(seed=3, prompt=[{"role": "user", "content": ""}])
    assert text == f"{task.system_prompt}\n\n{task.instruction}"  # no system message: prefixed
    system = [{"role": "system", "content": task.system_prompt}, {"role": "user", "content": ""}]
    assert instance.reset(seed=3, prompt=system) == task.instruction
    *calls, answer = env.oracle(3)
    messages = []
    for call in calls:
        result = getattr(instance, call["name"])(**call["arguments"])
        assert isinstance(result, str) and not result.startswith("Error")
        messages += [
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "content": result},
        ]
    messages.append({"role": "assistant", "content": answer["answer"]})
    metrics = {}
    extra = {}
    rewards = verifier_reward(
        [messages], [instance], log_metric=metrics.__setitem__, log_extra=extra.__setitem__
    )
    assert rewards == [1.0] and metrics == {"tracegym/passed": 1.0}
    assert extra == {"tracegym_reasons": [""]}
    assert verifier_reward([messages], [instance]) == [1.0]  # scored once, then kept


def test_the_answer_tool_ends_the_episode_and_its_reply_is_scored(env):
    instance = trl_environment_factory(env)()
    instance.reset(seed=5)
    *calls, answer = env.oracle(5)
    for call in calls:
        getattr(instance, call["name"])(**call["arguments"])
    assert "ended" in instance.send_reply(text=answer["answer"])
    with pytest.raises(RuntimeError, match="episode is over"):
        instance.get_order_details(order_id="#W0000000")  # TRL reports it as a tool failure
    # whatever the model says after its reply, the reply was the answer
    assert verifier_reward([[{"role": "assistant", "content": "bye"}]], [instance]) == [1.0]


def test_a_wrong_or_cut_rollout_gets_the_verifiers_lower_reward(env):
    cls = trl_environment_factory(env)
    wrong, cut = cls(), cls()
    for instance in (wrong, cut):
        instance.reset(seed=4)
    task = env.make_task(4)
    skipped = [a for a in task.oracle if a.get("name") != "get_order_details"]
    for call in skipped[:-1]:  # act without the lookup the gap is about
        getattr(wrong, call["name"])(**call["arguments"])
    ended_on_call = [{"role": "assistant", "tool_calls": [{"type": "function"}]}]
    rewards = verifier_reward(
        [[{"role": "assistant", "content": skipped[-1]["answer"]}], ended_on_call], [wrong, cut]
    )
    assert all(r < 1.0 for r in rewards)
    assert any("did not come before" in r for r in wrong._verdict.reasons)
    assert any("ran out of steps" in r for r in cut._verdict.reasons)
    episode = cut._env.episode  # the cut rollout never answered
    assert episode.answer is None and episode.truncated


def test_reset_without_a_seed_draws_a_train_task(env):
    instance = trl_environment_factory(env)()
    start, stop = env.spec.train_seeds
    seeds = set()
    for _ in range(5):
        instance.reset(prompt=[{"role": "user", "content": ""}])
        seeds.add(instance._env.task.seed)
    assert all(start <= s < stop for s in seeds) and len(seeds) > 1


def test_each_instance_runs_its_own_copy(env):
    cls = trl_environment_factory(env)
    a, b = cls(), cls()
    a.reset(seed=1)
    b.reset(seed=2)
    a.get_order_details(order_id=env.oracle(1)[0]["arguments"]["order_id"])
    assert len(a._env.episode.steps) == 1 and len(b._env.episode.steps) == 0
    assert env.episode is None  # the template itself is never stepped
    made = []
    from_callable = trl_environment_factory(
        lambda: made.append(1) or FAMILIES[env.family](env.spec)
    )
    from_callable().reset(seed=1)
    assert len(made) == 2  # the probe that read the tools, then the instance


class Clash(Environment):
    def generate(self, seed: int) -> Task:
        return Task(seed, "hi", {}, {}, [{"answer": "ok"}], 3)

    def call_tool(self, state, name, arguments):
        return "ok"

    def tool_schemas(self):
        return [{"type": "function", "function": {"name": "reset", "parameters": {}}}]


def test_tools_that_cannot_be_methods_are_refused():
    with pytest.raises(ValueError, match="clashes"):
        trl_environment_factory(Clash())
    bad = {"function": {"name": "lookup", "parameters": {"properties": {"order-id": {}}}}}
    with pytest.raises(ValueError, match="order-id"):
        tool_method(bad)
    with pytest.raises(ValueError, match="method name"):
        tool_method({"function": {"name": "class", "parameters": {}}})


def test_the_dataset_carries_the_system_prompt_and_the_seed(env):
    pytest.importorskip("datasets", reason="datasets (a TRL dependency) is not installed")
    data = trl_dataset(env, n=3)
    assert data["seed"] == [0, 1, 2]
    row = data[1]
    assert row["prompt"] == [
        {"role": "system", "content": env.make_task(1).system_prompt},
        {"role": "user", "content": ""},
    ]
    held = trl_dataset(env, n=2, split="heldout")
    assert held["seed"] == list(range(env.spec.heldout_seeds[0], env.spec.heldout_seeds[0] + 2))


def _tiny_tool_policy(env, data, tools):
    """The tiny model with a tokenizer trained on the rendered prompts, taught to answer each
    prompt either with CALL (so TRL's tool path runs; two times in three) or with the task's
    oracle answer (which scores higher), under TRL's Qwen3 chat template: a group of rollouts then
    holds different rewards, so GRPO's advantages and loss are not all zero."""
    import torch
    from tracegym.generation.model import tiny_model, tiny_tokenizer
    from trl.chat_template_utils import qwen3_chat_template

    probe = trl_environment_factory(env)()

    def rendered(tokenizer):
        out = []
        for row in data:
            user = probe.reset(seed=row["seed"], prompt=row["prompt"])
            messages = [*row["prompt"][:-1], {"role": "user", "content": user}]
            out.append(
                tokenizer.apply_chat_template(
                    messages, tools=tools, tokenize=False, add_generation_prompt=True
                )
            )
        return out

    answers = [env.oracle(row["seed"])[-1]["answer"] for row in data]
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = qwen3_chat_template
    texts = rendered(tokenizer)
    tokenizer = tiny_tokenizer(extra_texts=[*texts, CALL, *answers], vocab_size=4000)
    tokenizer.chat_template = qwen3_chat_template
    policy = tiny_model(0, tokenizer=tokenizer)
    model = policy.model
    pairs = []
    for text, answer in zip(texts, answers, strict=True):
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        for target in (CALL, CALL, answer):
            pairs.append(
                (prompt, tokenizer(target + "<|im_end|>", add_special_tokens=False)["input_ids"])
            )
    width = max(len(p) + len(t) for p, t in pairs)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([p + t + [pad] * (width - len(p) - len(t)) for p, t in pairs])
    labels = torch.tensor(
        [[-100] * len(p) + t + [-100] * (width - len(p) - len(t)) for p, t in pairs]
    )
    mask = torch.tensor(
        [[1] * (len(p) + len(t)) + [0] * (width - len(p) - len(t)) for p, t in pairs]
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(40):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, tokenizer


@pytest.mark.slow
def test_a_few_grpo_steps_of_trl_on_a_tracegym_environment(env, tmp_path, monkeypatch, request):
    pytest.importorskip("trl", reason="TRL is not installed (pip install trl==1.16.0)")
    import torch
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    torch.set_num_threads(1)  # a tiny model on shared cores: far faster than 2 threads
    torch.manual_seed(0)
    factory = trl_environment_factory(env)
    data = trl_dataset(env, n=1)  # one task: each step samples a group of 4 rollouts of it
    probe = factory()
    tools = [  # in the order TRL lists them (inspect.getmembers: by name)
        getattr(probe, name)
        for name, _ in inspect.getmembers(factory, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]
    assert sorted(t.__name__ for t in tools) == sorted(
        t["function"]["name"] for t in env.tool_schemas()
    )
    model, tokenizer = _tiny_tool_policy(env, data, tools)

    seen = []  # per rollout, checked while the environment still holds its episode

    def reward(completions, environments, seed, **kwargs):
        rewards = verifier_reward(completions, environments, **kwargs)
        for completion, instance, task_seed, value in zip(
            completions, environments, seed, rewards, strict=True
        ):
            episode = instance._env.episode
            tool_messages = [m for m in completion if m["role"] == "tool"]
            steps = episode.steps[: len(tool_messages)]
            seen.append(
                {
                    "reward": value,
                    "verified": instance._env.verify(episode).reward,
                    "seed_ok": episode.task.seed == task_seed,
                    "tools": [(m["name"], m["content"]) for m in tool_messages],
                    "steps": [(s["action"]["name"], s["observation"]["content"]) for s in steps],
                }
            )
        return rewards

    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=160,
        max_tool_calling_iterations=2,
        learning_rate=1e-3,
        temperature=0.7,
        activation_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        environment_factory=factory,
    )
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 8
    for rollout in seen:
        assert rollout["seed_ok"]  # reset got the row's seed: the group shares the task
        assert rollout["reward"] == rollout["verified"]  # the verifier's reward, unchanged
        assert rollout["tools"] == rollout["steps"]  # TRL's tool messages are the env's results
    called = [r for r in seen if r["tools"]]
    assert called, "no rollout's tool call reached the environment"
    assert all(name == "search_products" for r in called for name, _ in r["tools"])
    assert all(json.loads(content) for r in called for _, content in r["tools"])
    logged = [h["rewards/reward/mean"] for h in trainer.state.log_history if "reward" in h]
    means = [sum(r["reward"] for r in seen[i : i + 4]) / 4 for i in (0, 4)]
    assert logged == pytest.approx(means, abs=1e-4)
    assert any(h.get("tools/call_frequency", 0) > 0 for h in trainer.state.log_history)
    # the mixed policy gives a group different rewards: GRPO took a step on real advantages
    assert any(h.get("grad_norm", 0) > 0 for h in trainer.state.log_history)
