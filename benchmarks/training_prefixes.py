"""SFT three ways, alternating in one run: the whole model every step (the baseline), the
frozen lower layers run once per example (training.frozen), and that with each batch's common
beginning run once (training.shared_prefix). Seconds, ratios against the baseline, losses.

The data: a quick demo home's rule-bearing capability (`--home`: its requested_action
environment's contrast pairs and the agent's passing dev runs, as the nightly trains them), or,
without `--home`, the toy environment's demonstrations. LoRA on the upper 40% of the layers, as
the demo trains SmolLM2.

    .venv/bin/python benchmarks/training_prefixes.py --model <shop-base folder> \
        --home <quick demo home> --steps 40
    .venv/bin/python benchmarks/training_prefixes.py   # a 10-layer tiny model, toy data
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tracegym.generation.model import load_policy, tiny_model
from tracegym.training.sft import (
    TrainConfig,
    capability_data,
    default_config,
    rehearsal_for,
    train_adapter,
)
from tracegym.training.toy import press_env


def data_of(home: Path | None) -> tuple[list[Any], list[tuple[int, ...]]]:
    """Conversations and contrast groups to train on."""
    if home is None:
        return capability_data(press_env(), range(16)).conversations, []
    from contrast_pairs import replay_of, rule_environment
    from tracegym.synthesis import registry
    from tracegym.training.capabilities import split_seeds

    env = registry.load(home, rule_environment(home))
    data = capability_data(env, split_seeds(12, [env])[0], contrast=True)
    replay = rehearsal_for(env, replay_of(home))
    return data.conversations + [list(c) for c in replay], data.groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model folder (default: the tiny model)")
    parser.add_argument("--home", type=Path, help="a quick demo home (default: toy data)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    def fresh() -> Any:
        return load_policy(args.model) if args.model else tiny_model(layers=10)

    policy = fresh()
    n = policy.model.config.num_hidden_layers
    layers = list(range(n - n * 2 // 5, n))
    conversations, groups = data_of(args.home)
    base = default_config(policy.name).to_dict()
    settings = {**base, "steps": args.steps, "batch_size": 2, "layers": layers, "lr": 3e-3,
                "precision": "auto"}  # fmt: skip
    ways = {"whole model (baseline)": {"frozen_prefix": False, "shared_prefix": False},
            "frozen prefix": {"frozen_prefix": True, "shared_prefix": False},
            "frozen + shared prefix": {"frozen_prefix": True, "shared_prefix": True}}  # fmt: skip
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    losses: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeats):
        for way, switches in ways.items():
            policy = fresh()
            config = TrainConfig.from_dict({**settings, **switches})
            started = time.perf_counter()
            _, metrics = train_adapter(policy, conversations, config, "bench", groups=groups)
            seconds[way].append(time.perf_counter() - started)
            losses[way] = (metrics.loss_first, metrics.loss_last)
    print(f"model {policy.name}: {n} layers, LoRA on {len(layers)}; {len(conversations)} "
          f"conversations ({len(groups)} contrast pairs), {args.steps} steps of 2")  # fmt: skip
    baseline = min(seconds["whole model (baseline)"])
    for way, runs in seconds.items():
        listed = ", ".join(f"{s:.1f}" for s in runs)
        first, last = losses[way]
        print(f"  {way:24s} best {min(runs):6.1f} s  ratio {min(runs) / baseline:.2f}  "
              f"(runs: {listed})  loss {first:.4f} -> {last:.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
