"""Training and rollout throughput, in one run on the same model, data and settings.

1. Trained tokens per second: tracegym's trainer (`training.sft.train_adapter`: chat encoding,
   masked labels, padded batches, AdamW over the LoRA parameters) versus a minimal hand-written
   peft + torch loop over the same pre-built batches (goal: overhead <= 10%). Each is run
   `--repeats` times, alternating, from a fresh base and a fresh adapter; the best run counts.
2. Rollout tokens per second on the toy environment's held-out tasks, greedy, with the KV cache
   (tracegym's default) and without it (the whole sequence recomputed for every token).

The data are the oracle demonstrations of the toy environment (`training.toy.PressEnv`).

    .venv/bin/python benchmarks/training_throughput.py                      # tiny model
    .venv/bin/python benchmarks/training_throughput.py --model smollm2 --steps 8
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import tempfile
import time

import torch
from tracegym.generation.model import ensure_model, load_policy
from tracegym.training.rollout import rollout
from tracegym.training.sft import (
    capability_data,
    collate,
    default_config,
    encode_examples,
    train_adapter,
)
from tracegym.training.toy import press_env


def hand_written(base, tokenizer, conversations, config, device) -> tuple[float, int, float]:
    """The baseline: batches built up front, then forward/backward/step and nothing else."""
    from peft import LoraConfig, get_peft_model

    examples = encode_examples(tokenizer, conversations, config.max_length)
    rng = random.Random(config.seed)
    order: list[int] = []
    batches = []
    for _ in range(config.steps):
        idx = []
        while len(idx) < min(config.batch_size, len(examples)):
            if not order:
                order = list(range(len(examples)))
                rng.shuffle(order)
            idx.append(order.pop())
        batches.append(collate([examples[i] for i in idx], tokenizer.pad_token_id or 0, device))
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    torch.manual_seed(config.seed)
    model = get_peft_model(
        base,
        LoraConfig(
            r=config.rank,
            lora_alpha=config.alpha,
            lora_dropout=config.dropout,
            target_modules=list(config.targets),
            task_type="CAUSAL_LM",
        ),
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    model.train()
    _sync(device)
    started = time.perf_counter()
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    seconds = time.perf_counter() - started
    return tokens / seconds, tokens, loss.item()


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    parser.add_argument("--home", default=None, help="where models are built/cached")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=4, help="held-out tasks to roll out")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args()

    home = args.home or tempfile.mkdtemp(prefix="tracegym-bench-")
    started = time.perf_counter()
    folder = ensure_model(home, args.model)
    prepare = time.perf_counter() - started
    policy = load_policy(folder)
    device = policy.device
    pristine = copy.deepcopy(policy.model).cpu()
    env = press_env()
    data = capability_data(env, range(64))
    config = default_config(policy.name, steps=args.steps, batch_size=args.batch_size)
    print(
        f"model {policy.name} on {device}: "
        f"{sum(p.numel() for p in pristine.parameters()) / 1e6:.1f}M parameters "
        f"(ready in {prepare:.1f} s); LoRA r={config.rank} on {','.join(config.targets)}; "
        f"{config.steps} steps at batch {config.batch_size}; {len(data.conversations)} examples"
    )
    ours, theirs = [], []
    for _ in range(args.repeats):
        fresh = copy.deepcopy(pristine).to(device)
        _model, metrics = train_adapter(
            type(policy)(fresh, policy.tokenizer, policy.name), data.conversations, config, "b"
        )
        ours.append(metrics.tokens / metrics.seconds)
        fresh = copy.deepcopy(pristine).to(device)
        tps, _tokens, _loss = hand_written(
            fresh, policy.tokenizer, data.conversations, config, device
        )
        theirs.append(tps)
    best_ours, best_theirs = max(ours), max(theirs)
    overhead = (best_theirs - best_ours) / best_theirs
    print(
        f"train: tracegym {best_ours:,.0f} tokens/s, hand-written {best_theirs:,.0f} tokens/s, "
        f"overhead {overhead:+.1%} (runs: {[round(x) for x in ours]} vs "
        f"{[round(x) for x in theirs]})"
    )

    seeds = range(1_000_000, 1_000_000 + args.rollouts)
    base = type(policy)(pristine.to(device), policy.tokenizer, policy.name)
    speeds = {}
    for use_cache in (True, False):
        tokens = 0
        t0 = time.perf_counter()
        for s in seeds:
            r = rollout(
                base, env, s, use_cache=use_cache, max_new_tokens=args.max_new_tokens, trace=False
            )
            tokens += r.generated_tokens
        speeds["cached" if use_cache else "uncached"] = tokens / (time.perf_counter() - t0)
    print(
        f"rollout: {speeds['cached']:,.1f} tokens/s with the KV cache, "
        f"{speeds['uncached']:,.1f} without ({speeds['cached'] / speeds['uncached']:.1f}x)"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {
                    "model": policy.name,
                    "device": str(device),
                    "steps": config.steps,
                    "batch_size": config.batch_size,
                    "train_tokens_per_s": {"tracegym": ours, "hand_written": theirs},
                    "overhead": overhead,
                    "rollout_tokens_per_s": speeds,
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()
