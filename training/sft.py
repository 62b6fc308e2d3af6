"""Supervised fine-tuning of one LoRA adapter per capability (and a GRPO mode).

    from tracegym.training.sft import TrainConfig, capability_data, train_adapter
    data = capability_data(env, train_seeds, policy=policy, samples=4)   # demos + passing rollouts
    peft_model, metrics = train_adapter(policy, data.conversations, TrainConfig(steps=200), "toy")

Data per capability: the oracle's demonstrations for the train seeds plus, with `samples > 0`,
rejection sampling: the policy is rolled out `samples` times per seed at temperature 1 and the
episodes the verifier passes are kept. Everything is in the policy's chat format (see rollout.py);
the loss is on the assistant tokens only.

The trainer is a small torch loop (AdamW, padded batches, masked labels): it is what
benchmarks/training_throughput.py compares against a hand-written peft loop.

GRPO (`train_grpo`) samples groups of episodes per task, scores them with the verifier's graded
reward and takes clipped policy-gradient steps on the exact sampled tokens (see its docstring).
It needs no TRL. TRL's GRPOTrainer (1.16) runs multi-turn tool-calling episodes too, through
`environment_factory`: training/trl_env.py adapts any tracegym environment to it, with the
verifier's reward (docs/training.md says which trainer to use when).

Every trainer takes `on_step`, called with a `TrainStep` after each step (or sampled rollout), so
a command or the nightly can show progress within a long training.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, replace
from typing import Any

from tracegym.generation import tokens as counters
from tracegym.generation.chat_format import ChatFormat
from tracegym.generation.chat_tokens import ChatTokens, Conversation
from tracegym.generation.model import LoadOptions, Policy, load_policy, quiet_peft, weights_hash
from tracegym.generation.shared_prefix import shared_prefix_loss
from tracegym.training import adapters
from tracegym.training.capabilities import Capability, capabilities, split_seeds
from tracegym.training.evaluate import EvalJob, EvaluationRow, evaluate_job
from tracegym.training.frozen_prefix import FrozenPrefix
from tracegym.training.rollout import conversation_calls, rollout

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class NoTrainingData(ValueError):
    """An environment gave nothing to learn from (no passing demonstration, or none with an
    assistant token within `max_length`): a property of that environment and these settings,
    so a caller training many environments can record it and go on with the others."""


@dataclass
class TrainConfig:
    """LoRA and optimisation settings (see `default_config` for per-model defaults)."""

    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    steps: int = 100
    lr: float = 2e-4
    batch_size: int = 8
    max_length: int = 1024
    seed: int = 0
    mode: str = "sft"  # or "grpo"
    samples: int = 0  # rejection-sampling rollouts per train seed (0: demonstrations only)
    train_seeds: int = 64
    # GRPO
    group_size: int = 4
    grpo_tasks: int = 2  # tasks per GRPO step
    temperature: float = 1.0
    max_new_tokens: int = 48
    warm_start_steps: int | None = None  # SFT steps before GRPO (None: `steps`)
    grpo_lr: float | None = None  # GRPO learning rate (None: `lr`)
    grpo_epochs: int = 2  # optimisation passes over each sampled batch (PPO-style reuse)
    clip: float = 0.2  # the ratio's clip range (1 - clip, 1 + clip)
    # LoRA on these layer indices only (None: all). The upper layers alone train much faster:
    # the backward pass stops at the lowest adapted layer.
    layers: list[int] | None = None
    # "bf16": SFT's forward and backward under bfloat16 autocast (the LoRA weights, gradients
    # and optimiser stay fp32); "auto": bf16 where the hardware multiplies bf16 natively (a CUDA
    # GPU that supports it, a CPU with AVX512-BF16 or AMX), else fp32. On this project's 2-core
    # AVX512-BF16 machine a SmolLM2 step took 1.7 s instead of 3.8 (docs/demo.md).
    precision: str = "fp32"
    # contrast pairs: where an environment has a rule that allows or refuses its action, half
    # the train seeds give both versions of their task, batched together (capability_data)
    contrast_pairs: bool = True
    # a capability taught on contrast pairs trains this many steps at this rate (None: `steps`,
    # `lr`): reading the field the rule looks at takes more updates than the rest (SmolLM2
    # learned a refund's status rule in 40 steps at 3e-3, not in 20 or at 1e-3: docs/demo.md)
    contrast_steps: int | None = None
    contrast_lr: float | None = None
    # with `layers`, run the frozen layers below them once per example, not once per step
    # (training.frozen; the same loss up to float rounding)
    frozen_prefix: bool = True
    # run the beginning a batch's conversations share (the system message; a contrast pair's
    # task up to the rule's field) once per step, not once per row (training.shared_prefix; the
    # same loss up to float rounding)
    shared_prefix: bool = True

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


PRECISIONS = ("fp32", "bf16", "auto")


def native_bf16(device_type: str, cpu_flags: str | None = None) -> bool:
    """Whether `device_type` multiplies bfloat16 natively (elsewhere bf16 is emulated: slower
    than fp32). `cpu_flags`: /proc/cpuinfo's text (read when None)."""
    import torch

    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_type != "cpu":
        return False
    if cpu_flags is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as handle:
                cpu_flags = handle.read()
        except OSError:
            return False
    return bool(set(cpu_flags.split()) & {"avx512_bf16", "amx_bf16"})


def autocast_dtype(precision: str, device_type: str) -> Any:
    """The autocast dtype for `precision` on `device_type` (None: plain fp32)."""
    import torch

    if precision == "bf16" or (precision == "auto" and native_bf16(device_type)):
        return torch.bfloat16
    return None


def default_config(model_name: str, **overrides: Any) -> TrainConfig:
    """Sensible defaults: the tiny test model learns fast with LoRA on every linear layer and a
    high learning rate; SmolLM2 gets the usual r=8 on q/k/v/o at 2e-4."""
    if model_name.startswith("tiny"):
        base = TrainConfig(
            rank=16,
            alpha=32,
            targets=list(ALL_LINEAR),
            steps=100,
            lr=1e-2,
            batch_size=8,
            grpo_lr=1e-3,  # 3e-3 and up often collapses a tiny policy to one answer
        )
    else:
        base = TrainConfig()
    return TrainConfig.from_dict({**base.to_dict(), **overrides})


@dataclass(frozen=True)
class TrainStep:
    """What a trainer reports after each step, for progress bars and logs.

    phase: "sample" (rejection-sampling rollouts; `done`/`total` count rollouts, `reward` is the
    share kept so far), "sft" or "grpo" (`done`/`total` count optimiser steps; `loss` is this
    step's, `reward` GRPO's mean sampled reward this step)."""

    phase: str
    done: int
    total: int
    loss: float | None = None
    reward: float | None = None
    name: str = ""  # the adapter (or environment) being trained


StepCallback = Callable[[TrainStep], None]


# Data ------------------------------------------------------------------------------------------
@dataclass
class CapabilityData:
    env_id: str
    conversations: list[Conversation]
    demonstrations: int
    sampled: int  # verifier-passing rollouts kept
    attempted: int  # rollouts tried
    instructions: list[str]  # the train tasks' requests (for the router)
    # indices of `conversations` to train in the same batch: a seed's allowed and refused task
    groups: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def hash(self) -> str:
        return data_hash(self.conversations)


def data_hash(conversations: Sequence[Any]) -> str:
    plain = [c.to_dict() if isinstance(c, Conversation) else c for c in conversations]
    text = json.dumps(plain, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def capability_data(
    env: Any,
    seeds: Sequence[int],
    *,
    policy: Policy | None = None,
    samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
    on_step: StepCallback | None = None,
    contrast: bool = False,
) -> CapabilityData:
    """Oracle demonstrations for `seeds`, plus verifier-passing sampled rollouts of `policy`
    (`on_step` gets a "sample" TrainStep after each rollout).

    With `contrast`, where `env` has a rule that allows or refuses its action
    (`contrast_knobs`), the first half of the seeds give both versions of their task, the
    action allowed and refused, as a group to train in one batch: the two differ where the rule
    looks, so fitting both teaches the rule. Alternating seeds alone did not teach SmolLM2 a
    refund's status rule on three shops (docs/demo.md)."""
    import torch
    from tracegym.synthesis.registry import demonstration  # polars: only where data is built

    conversations: list[Conversation] = []
    instructions: list[str] = []
    groups: list[tuple[int, ...]] = []
    tools = env.tool_schemas()
    knobs = env.contrast_knobs() if contrast else None
    versions = [[env]] * len(seeds)
    if knobs is not None:
        pair = [type(env)(env.spec, **{**env.knobs, **k}) for k in knobs]
        versions = [pair] * ((len(seeds) + 1) // 2)
    for s, envs in zip(seeds, versions, strict=False):
        group = []
        for version in envs:
            demo = demonstration(version, s)
            if not demo["passed"]:
                continue
            group.append(len(conversations))
            conversations.append(
                Conversation.of(demo["messages"], tools, demo.get("system_prompt", ""))
            )
            instructions.append(demo["messages"][1]["content"] if demo["system_prompt"] else "")
        if len(group) > 1:
            groups.append(tuple(group))
    n_demos = len(conversations)
    kept = attempted = 0
    if policy is not None and samples > 0:
        generator = torch.Generator().manual_seed(seed)
        total = len(seeds) * samples
        for s in seeds:
            for _ in range(samples):
                attempted += 1
                result = rollout(policy, env, s, temperature=temperature, generator=generator)
                if result.passed:
                    kept += 1
                    conversations.append(result.conversation())
                if on_step is not None:
                    on_step(
                        TrainStep("sample", attempted, total, None, kept / attempted, env.env_id)
                    )
    instructions = [i for i in instructions if i]
    return CapabilityData(env.env_id, conversations, n_demos, kept, attempted, instructions, groups)


def encode_examples(
    tokenizer: Any, conversations: Sequence[Conversation], max_length: int
) -> list[tuple[list[int], list[int]]]:
    return _encode(tokenizer, conversations, max_length)[0]


def _encode(
    tokenizer: Any, conversations: Sequence[Conversation], max_length: int
) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """The examples, each conversation rendered by the tokenizer's own chat template with its
    tools (`chat_tokens`), and the index of the conversation each came from (a conversation
    with no assistant token within `max_length` gives none)."""
    fmt = ChatFormat(tokenizer)
    encoders: dict[str, ChatTokens] = {}
    out, kept = [], []
    for index, conv in enumerate(conversations):
        if not isinstance(conv, Conversation):
            conv = Conversation.from_dict(conv)
        key = json.dumps(conv.tools, sort_keys=True)
        if key not in encoders:
            encoders[key] = ChatTokens(fmt, conv.tools)
        ids, mask = encoders[key].encode(conv.messages)
        ids, mask = ids[:max_length], mask[:max_length]
        if any(mask):
            out.append((ids, mask))
            kept.append(index)
    return out, kept


def batch_units(kept: Sequence[int], groups: Sequence[Sequence[int]] = ()) -> list[list[int]]:
    """The example indices a batch takes whole, in order of their first example: each group of
    conversations (those of it that were kept: `kept[i]` is example i's conversation), every
    other example alone."""
    position = {conversation: i for i, conversation in enumerate(kept)}
    units: list[list[int]] = []
    grouped: set[int] = set()
    for group in groups:
        unit = [position[c] for c in group if c in position and position[c] not in grouped]
        if unit:
            units.append(unit)
            grouped.update(unit)
    units += [[i] for i in range(len(kept)) if i not in grouped]
    return sorted(units, key=lambda unit: unit[0])


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int, device: Any) -> dict:
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, mask) in enumerate(examples):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=False)])
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": attention.to(device),
        "labels": labels.to(device),
    }


def _why_none(conversations: Sequence[Conversation], config: TrainConfig) -> str:
    """Why `encode_examples` kept nothing, in words a nightly report can show."""
    if not conversations:
        return "no demonstration passed the verifier (and no sampled rollout was kept)"
    return (
        f"none of {len(conversations)} conversations has an assistant token within "
        f"max_length={config.max_length} tokens (the prompt alone is longer)"
    )


# Training --------------------------------------------------------------------------------------
def attach_lora(model: Any, config: TrainConfig, adapter_name: str) -> Any:
    """`model` with a fresh LoRA adapter `adapter_name` (a PeftModel; added if it is one)."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.manual_seed(config.seed)
    lora = LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.targets),
        layers_to_transform=list(config.layers) if config.layers else None,
        task_type="CAUSAL_LM",
    )
    if isinstance(model, PeftModel):
        model.add_adapter(adapter_name, lora)
        model.set_adapter(adapter_name)
        return model
    with quiet_peft():
        return get_peft_model(model, lora, adapter_name=adapter_name)


@dataclass
class TrainMetrics:
    steps: int
    examples: int
    tokens: int  # tokens processed (padded batches count their real tokens)
    trained_tokens: int  # assistant tokens with a loss
    seconds: float
    tokens_per_second: float
    loss_first: float
    loss_last: float
    mode: str = "sft"
    reward_first: float | None = None
    reward_last: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainMetrics:
        """The metrics in an adapter's `metrics.train` (its other keys, the data counts and a
        GRPO run's `sft` warm start, are left out); a missing one is a ValueError naming it."""
        fields = cls.__dataclass_fields__
        missing = [k for k, f in fields.items() if k not in data and f.default is MISSING]
        if missing:
            raise ValueError(f"training metrics lack {', '.join(repr(k) for k in missing)}")
        return cls(**{k: v for k, v in data.items() if k in fields})


def sft_loss(model: Any, inputs: dict) -> Any:
    """The mean next-token loss over the labelled (assistant) tokens, with the output head run
    on the positions that predict them only: the head and its softmax over the vocabulary
    (SmolLM2: 49k x 576, a fifth of a token's FLOPs, and a [rows, columns, 49k] float tensor)
    are spent where the loss is, about a fifth of the tokens. The same loss as
    `model(**inputs).loss`, up to float rounding; that is used when the model cannot slice."""
    import torch.nn.functional as F

    labels = inputs["labels"]
    keep = labels.new_zeros(labels.shape, dtype=bool)
    keep[:, :-1] = labels[:, 1:] != -100
    # the adapted layers' input, where the frozen ones below ran beforehand (training.frozen)
    feed = "inputs_embeds" if "inputs_embeds" in inputs else "input_ids"
    out = model(
        **{feed: inputs[feed]}, attention_mask=inputs["attention_mask"], logits_to_keep=keep
    )
    logits = out.logits
    if logits.dim() != 2 or logits.shape[0] != int(keep.sum()):
        return model(
            **{feed: inputs[feed]}, attention_mask=inputs["attention_mask"], labels=labels
        ).loss
    return F.cross_entropy(logits.float(), labels[:, 1:][keep[:, :-1]])


def train_adapter(
    policy: Policy,
    conversations: Sequence[Conversation],
    config: TrainConfig,
    adapter_name: str,
    *,
    progress: Callable[[int, float], None] | None = None,
    steps: int | None = None,
    on_step: StepCallback | None = None,
    groups: Sequence[Sequence[int]] = (),
) -> tuple[Any, TrainMetrics]:
    """Train a LoRA adapter on `conversations` (SFT, loss on assistant tokens). Returns the
    PeftModel (wrapping `policy.model`, adapter active) and the metrics.

    `steps` overrides `config.steps` (GRPO's warm start); `on_step` gets an "sft" TrainStep
    after each step; `progress(step_index, loss)` is the older, narrower form of it.
    `groups`: indices of conversations that always share a batch (a batch takes whole groups,
    so it may hold up to a group's size - 1 more than `config.batch_size`)."""
    import torch

    examples, kept = _encode(policy.tokenizer, conversations, config.max_length)
    units = batch_units(kept, groups)
    if not examples:
        raise NoTrainingData(
            f"no training examples for {adapter_name}: {_why_none(conversations, config)}"
        )
    model = attach_lora(policy.model, config, adapter_name)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    rng = random.Random(config.seed)
    order: list[list[int]] = []
    device = policy.device
    device_type = torch.device(device).type
    dtype = autocast_dtype(config.precision, device_type)

    def autocast() -> Any:
        return torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None)

    prefix = FrozenPrefix.of(model, config.layers, autocast) if config.frozen_prefix else None
    pad = policy.tokenizer.pad_token_id or 0
    losses: list[float] = []
    tokens = trained = 0
    total = config.steps if steps is None else steps
    model.train()
    started = time.perf_counter()
    for step in range(total):
        batch_idx: list[int] = []
        while len(batch_idx) < min(config.batch_size, len(examples)):
            if not order:
                order = list(units)
                rng.shuffle(order)
            batch_idx.extend(order.pop())
        batch = [examples[i] for i in batch_idx]
        inputs = collate(batch, pad, device)
        if prefix is not None:
            inputs["inputs_embeds"] = prefix.batch(batch_idx, examples)
        with autocast(), prefix.upper() if prefix is not None else contextlib.nullcontext():
            loss = shared_prefix_loss(model, inputs, batch) if config.shared_prefix else None
            if loss is None:
                loss = sft_loss(model, inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        tokens += sum(len(ids) for ids, _ in batch)
        trained += sum(sum(mask) for _, mask in batch)
        counters.add(trained=sum(len(ids) for ids, _ in batch),
                     loss=sum(sum(mask) for _, mask in batch))  # fmt: skip
        if progress is not None:
            progress(step, losses[-1])
        if on_step is not None:
            on_step(TrainStep("sft", step + 1, total, losses[-1], None, adapter_name))
    seconds = time.perf_counter() - started
    model.eval()
    k = max(1, min(10, len(losses) // 5))
    if not losses:
        losses = [0.0]
    return model, TrainMetrics(
        steps=total,
        examples=len(examples),
        tokens=tokens,
        trained_tokens=trained,
        seconds=round(seconds, 3),
        tokens_per_second=round(tokens / seconds, 1) if seconds else 0.0,
        loss_first=round(sum(losses[:k]) / k, 4),
        loss_last=round(sum(losses[-k:]) / k, 4),
    )


@dataclass
class SampledEpisode:
    """One sampled episode as the exact token ids the policy saw and produced."""

    ids: list[int]
    mask: list[int]  # 1 on the tokens the policy sampled
    reward: float
    passed: bool


def sample_episode(
    policy: Policy,
    env: Any,
    seed: int,
    *,
    temperature: float = 1.0,
    generator: Any = None,
    max_new_tokens: int = 48,
) -> SampledEpisode:
    """One untraced episode, kept as token ids. The policy gradient must be taken on the tokens
    that were sampled: decoding them and encoding the text again (`rollout`'s messages) gives
    other ids for most of a tiny model's samples (byte-level pieces, non-canonical merges), so
    GRPO would raise the likelihood of sequences the policy never produced."""
    result = rollout(
        policy, env, seed, temperature=temperature, generator=generator,
        max_new_tokens=max_new_tokens, trace=False,
    )  # fmt: skip
    return SampledEpisode(result.token_ids, result.sampled_mask, result.reward, result.passed)


def _token_logps(model: Any, inputs: dict, temperature: float) -> Any:
    """Log-probability of each next token (B x T-1) under `model`, logits / `temperature` (the
    distribution the tokens were sampled from)."""
    import torch

    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    logits = logits[:, :-1].float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    labels = inputs["labels"][:, 1:].clamp(min=0).unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, labels).squeeze(-1)


def grpo_loss(
    model: Any,
    batch: Sequence[tuple[list[int], list[int]]],
    advantages: Sequence[float],
    pad_id: int,
    device: Any,
    *,
    old_logps: Any = None,
    clip: float = 0.2,
    temperature: float = 1.0,
) -> tuple[Any, Any]:
    """The GRPO policy loss over a batch of episodes, and the mask of trained tokens.

    Token-level: every sampled token weighs the same (the sum over the batch's tokens over their
    number, as DAPO and TRL's default). Dividing each episode by its own length instead, as the
    first version did, breaks the cancellation of the tokens that good and bad episodes share
    (the call's `<tool_call>{"name": ...` prefix) and pays short episodes more per token: on the
    toy task the policy collapsed to answering `done` without pressing anything.

    With `old_logps` (the sampling policy's log-probabilities, B x T-1) it is PPO's clipped
    surrogate, -min(ratio x A, clip(ratio) x A), which lets one sampled batch be used for several
    optimisation passes without the ratio running away; without, the plain policy gradient
    -A x log p (the same gradient at ratio 1)."""
    import torch

    inputs = collate(batch, pad_id, device)
    logp = _token_logps(model, inputs, temperature)
    mask = inputs["labels"][:, 1:] != -100
    adv = torch.tensor(list(advantages), device=logp.device, dtype=logp.dtype).unsqueeze(-1)
    if old_logps is None:
        per_token = -adv * logp
    else:
        ratio = torch.exp(logp - old_logps)
        per_token = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return (per_token * mask).sum() / mask.sum().clamp(min=1), mask


def train_grpo(
    policy: Policy,
    env: Any,
    seeds: Sequence[int],
    config: TrainConfig,
    adapter_name: str,
    *,
    model: Any = None,
    on_step: StepCallback | None = None,
) -> tuple[Any, TrainMetrics]:
    """GRPO: each step samples `group_size` episodes on each of `grpo_tasks` train seeds (at
    `temperature`, adapter on), scores them with the verifier's graded reward, and takes
    `grpo_epochs` clipped policy-gradient passes (`grpo_loss`) with each episode's group-relative
    advantage (reward minus the group mean, over the group's std) on its sampled tokens. Groups
    whose rewards are all equal carry no signal and are skipped. No KL term (the clip bounds each
    update). Continues training `model`'s adapter when given (e.g. after SFT), else a fresh one."""
    import torch

    model = model if model is not None else attach_lora(policy.model, config, adapter_name)
    work = Policy(model, policy.tokenizer, policy.name, policy.folder)
    params = [p for p in model.parameters() if p.requires_grad]
    lr = config.grpo_lr if config.grpo_lr is not None else config.lr
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed)
    rng = random.Random(config.seed)
    pad = policy.tokenizer.pad_token_id or 0
    per_step: list[float] = []  # mean sampled reward of each step
    rewards: list[float] = []
    losses: list[float] = []
    tokens = trained = 0
    started = time.perf_counter()
    for step in range(config.steps):
        model.eval()
        batch, advantages = [], []
        step_rewards: list[float] = []
        for seed in rng.sample(list(seeds), min(config.grpo_tasks, len(seeds))):
            with torch.no_grad():
                group = [
                    sample_episode(
                        work,
                        env,
                        seed,
                        temperature=config.temperature,
                        generator=generator,
                        max_new_tokens=config.max_new_tokens,
                    )
                    for _ in range(config.group_size)
                ]
            scores = torch.tensor([e.reward for e in group])
            step_rewards.extend(scores.tolist())
            std = float(scores.std()) if len(group) > 1 else 0.0
            if std < 1e-6:
                continue  # every episode scored the same: no signal in this group
            for episode, score in zip(group, scores, strict=True):
                ids = episode.ids[: config.max_length]
                mask = episode.mask[: config.max_length]
                if any(mask):
                    batch.append((ids, mask))
                    advantages.append(float(score - scores.mean()) / std)
        rewards.extend(step_rewards)
        per_step.append(sum(step_rewards) / len(step_rewards))
        loss_value = None
        if batch:
            old = None
            if config.grpo_epochs > 1:
                with torch.no_grad():
                    old = _token_logps(
                        model, collate(batch, pad, policy.device), config.temperature
                    )
            model.train()
            for _ in range(max(1, config.grpo_epochs)):
                loss, mask = grpo_loss(
                    model, batch, advantages, pad, policy.device,
                    old_logps=old, clip=config.clip, temperature=config.temperature,
                )  # fmt: skip
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                tokens += sum(len(ids) for ids, _ in batch)
                trained += int(mask.sum())
                counters.add(trained=sum(len(ids) for ids, _ in batch), loss=int(mask.sum()))
            loss_value = float(loss.detach())
            losses.append(loss_value)
        if on_step is not None:
            on_step(
                TrainStep("grpo", step + 1, config.steps, loss_value, per_step[-1], adapter_name)
            )
    model.eval()
    seconds = time.perf_counter() - started
    k = max(1, len(per_step) // 4)
    return model, TrainMetrics(
        steps=config.steps,
        examples=len(rewards),
        tokens=tokens,
        trained_tokens=trained,
        seconds=round(seconds, 3),
        tokens_per_second=round(tokens / seconds, 1) if seconds else 0.0,
        loss_first=round(losses[0], 4) if losses else 0.0,
        loss_last=round(losses[-1], 4) if losses else 0.0,
        mode="grpo",
        reward_first=round(sum(per_step[:k]) / k, 4) if per_step else None,
        reward_last=round(sum(per_step[-k:]) / k, 4) if per_step else None,
    )


__all__ = [
    "ALL_LINEAR",
    "PRECISIONS",
    "CapabilityData",
    "NoTrainingData",
    "SampledEpisode",
    "StepCallback",
    "TrainConfig",
    "TrainMetrics",
    "TrainStep",
    "attach_lora",
    "autocast_dtype",
    "batch_units",
    "capability_data",
    "collate",
    "data_hash",
    "default_config",
    "encode_examples",
    "grpo_loss",
    "native_bf16",
    "sample_episode",
    "sft_loss",
    "train_adapter",
    "train_capability",
    "train_grpo",
]


# One capability end to end ---------------------------------------------------------------------
def calls_tool(conversation: Conversation | Sequence[Mapping[str, Any]], name: str) -> bool:
    """Whether an assistant turn of `conversation` (or of a list of messages) calls `name`."""
    messages = conversation.messages if isinstance(conversation, Conversation) else conversation
    return name in conversation_calls(messages)


def rehearsal_for(env: Any, replay: Sequence[Conversation]) -> list[Conversation]:
    """The agent's passing conversations to rehearse while learning `env`: all but those that
    call the environment's action. Rehearsal keeps what the adapter must not change; the action
    is what it is there to change, and the agent's own accepted calls of it (however it got
    there: the demo's seed 2 looked an order up by the new address before updating it) would
    teach a second way next to the environment's demonstrations (its adapter then dropped the
    address after such a detour: 2/8 on its environment)."""
    replay = [c if isinstance(c, Conversation) else Conversation.from_dict(c) for c in replay]
    spec = getattr(env, "spec", None)
    action = (getattr(spec, "roles", None) or {}).get("action")
    if not action:
        return list(replay)
    return [c for c in replay if not calls_tool(c, action)]


def train_capability(
    home: Any,
    env: Any,
    model_folder: Any,
    config: TrainConfig | None = None,
    *,
    eval_seeds: int = 20,
    evaluate: bool = True,
    on_step: StepCallback | None = None,
    replay: Sequence[Conversation] = (),
    load: LoadOptions | None = None,
) -> dict[str, Any]:
    """Data -> LoRA adapter -> registry -> held-out evaluation -> promotion, for one environment
    or a `Capability` (environments teaching the same action: one adapter on their mixed
    demonstrations, `config.train_seeds` shared out over them; see training.capabilities).

    `replay`: conversations of the agent's own verifier-passing runs, mixed into the data so
    the adapter keeps the agent's conventions (its prompt, its first steps) while it learns the
    environment's capability (rehearsal against forgetting).

    Loads a fresh base from `model_folder` (see model.ensure_model), so runs are independent;
    `load` says how (dtype, device map, quantisation; the defaults load as always).
    `on_step` gets every TrainStep: "sample" (rejection sampling), "sft", "grpo", then
    "evaluate" (done 0 of the held-out seeds when it starts, all of them when it ends).
    Returns the adapter's metadata in its JSON form (`AdapterMetadata.to_dict()`: with
    `metrics.eval`, `promoted`, `promotion`)."""
    capability = env if isinstance(env, Capability) else capabilities([env])[0]
    envs = capability.envs
    load = load or LoadOptions()
    policy = load_policy(
        model_folder,
        dtype=load.dtype,
        device_map=load.device_map,
        quantize=load.quantize,
        chat_template=load.chat_template,
    )
    config = config or default_config(policy.name)
    if config.mode == "grpo" and len(envs) > 1:
        raise ValueError("GRPO trains on one environment; train a capability's one by one")
    shares = split_seeds(config.train_seeds, envs)
    conversations: list[Conversation] = []
    instructions: list[str] = []
    groups: list[tuple[int, ...]] = []
    demonstrations = sampled = attempted = 0
    for member, seeds in zip(envs, shares, strict=True):
        data = capability_data(
            member,
            seeds,
            policy=policy if config.samples else None,
            samples=config.samples,
            seed=config.seed,
            on_step=on_step,
            contrast=config.contrast_pairs,
        )
        groups += [tuple(len(conversations) + i for i in g) for g in data.groups]
        conversations += data.conversations
        instructions += data.instructions
        demonstrations += data.demonstrations
        sampled += data.sampled
        attempted += data.attempted
    if replay:
        conversations.extend(rehearsal_for(envs[0], replay))
    adapter_id = capability.adapter_id
    if groups:
        config = replace(
            config,
            steps=config.contrast_steps or config.steps,
            lr=config.contrast_lr or config.lr,
        )
    if config.mode == "grpo":
        warm = config.warm_start_steps if config.warm_start_steps is not None else config.steps
        model, sft_metrics = train_adapter(
            policy, conversations, config, adapter_id, steps=warm, on_step=on_step, groups=groups
        )
        model, metrics = train_grpo(
            policy, envs[0], shares[0], config, adapter_id, model=model, on_step=on_step
        )
        metrics_dict = {**metrics.to_dict(), "sft": sft_metrics.to_dict()}
    else:
        model, metrics = train_adapter(
            policy, conversations, config, adapter_id, on_step=on_step, groups=groups
        )
        metrics_dict = metrics.to_dict()
    metrics_dict.update(demonstrations=demonstrations, sampled=sampled, attempted=attempted,
                        contrast_pairs=len(groups))  # fmt: skip
    router: list[str] = []
    for member in envs:
        gap = (member.spec.gap if member.spec is not None else {}) or {}
        router += [t for t in (str(gap.get("name") or ""), str(gap.get("description") or "")) if t]
    router += instructions[:64]
    adapters.save_adapter(
        home,
        model,
        adapter_id,
        capability=capability.ref(),
        base_model=adapters.BaseModelRef(
            name=policy.name, hash=weights_hash(model_folder), folder=str(model_folder)
        ),
        data_hash=data_hash(conversations),
        hyperparameters=config.to_dict(),
        train_metrics=metrics_dict,
        router_texts=router,
    )
    if not evaluate:
        return adapters.show(home, adapter_id)
    job = EvalJob.spread(envs, adapter_id, eval_seeds)
    if on_step is not None:
        on_step(TrainStep("evaluate", 0, len(job.cases), name=adapter_id))
    row = EvaluationRow.from_dict(evaluate_job(model, policy.tokenizer, job, name=policy.name))
    if on_step is not None:
        on_step(TrainStep("evaluate", len(job.cases), len(job.cases), name=adapter_id))
    meta = adapters.update_metadata(
        home, adapter_id, eval=row, promoted=row.promoted, promotion=row.reason
    )
    return meta.to_dict()
