"""A rule learnt or not: a quick demo home's refund capability trained as before (alternating
seeds, 20 steps at 1e-3) and now (contrast pairs in one batch, 40 steps at 3e-3), each evaluated
on the environment's first `--tasks` held-out seeds, split into those where the rule allows the
refund and those where it refuses it, with the base agent (no adapter) in the same run.

The data are what the nightly trains on: the environment's demonstrations for its train seeds
and the agent's own passing dev runs (`<home>/demo/stages/replay.jsonl`), with the home's
adapter settings (`<home>/adapters/<env>/meta.json`).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/contrast_pairs.py --home <quick demo home>
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import tracegym as tg
from tracegym.generation.batching import map_batched
from tracegym.generation.model import Policy, load_policy
from tracegym.synthesis import registry
from tracegym.training.capabilities import split_seeds
from tracegym.training.rollout import rollout
from tracegym.training.sft import TrainConfig, capability_data, rehearsal_for, train_adapter

ARMS = (("before", False, 20, 1e-3), ("now", True, 40, 3e-3))


def rule_environment(home: Path) -> str:
    """The home's first environment with a rule to contrast (the refund's)."""
    for entry in registry.read_index(home).environments:
        if registry.load(home, entry.env_id).contrast_knobs() is not None:
            return entry.env_id
    raise SystemExit(f"no environment under {home} has a rule that refuses its action")


def replay_of(home: Path) -> list[Any]:
    """The agent's passing dev conversations the demo mixed into adapter training."""
    lines = (home / "demo" / "stages" / "replay.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--tasks", type=int, default=24)
    args = parser.parse_args()
    tg.init(service="contrast-pairs", home=tempfile.mkdtemp())
    home = args.home
    env_id = rule_environment(home)
    meta = json.loads((home / "adapters" / env_id / "meta.json").read_text())
    settings = meta["hyperparameters"]
    env = registry.load(home, env_id)
    replay = replay_of(home)
    seeds = split_seeds(int(settings["train_seeds"]), [env])[0]
    first = env.spec.heldout_seeds[0]
    cases = list(range(first, first + args.tasks))
    refused = {s: bool(env.generate(s).goal.forbidden_attempts) for s in cases}
    folder = next((home / "models").glob("shop-base-*"))

    def evaluate(policy: Any, adapter: str | None) -> str:
        def one(lane: Any, seed: int) -> bool:
            episode = rollout(policy, copy.deepcopy(env), seed, adapter=adapter, lm=lane,
                              max_new_tokens=48, trace=False)  # fmt: skip
            return episode.passed

        results = map_batched(policy, one, cases, batch_size=24, adapter_of=lambda _: adapter)
        passed = dict(zip(cases, results, strict=True))
        allowed = [s for s in cases if not refused[s]]
        refusing = [s for s in cases if refused[s]]
        return (f"allowed {sum(passed[s] for s in allowed)}/{len(allowed)}, refused "
                f"{sum(passed[s] for s in refusing)}/{len(refusing)}, all "
                f"{sum(passed.values())}/{len(cases)}")  # fmt: skip

    print(f"{home} {env_id}: {args.tasks} held-out seeds")
    print(f"  base agent (baseline)     {evaluate(load_policy(folder), None)}", flush=True)
    for name, contrast, steps, lr in ARMS:
        policy = load_policy(folder)
        data = capability_data(env, seeds, contrast=contrast)
        conversations = data.conversations + [list(c) for c in rehearsal_for(env, replay)]
        config = TrainConfig.from_dict({**settings, "steps": steps, "lr": lr})
        started = time.perf_counter()
        model, metrics = train_adapter(policy, conversations, config, "rule", groups=data.groups)
        seconds = time.perf_counter() - started
        adapted = Policy(model, policy.tokenizer, policy.name)
        print(f"  {name:6s} {len(data.groups)} pairs, {steps} steps at {lr:g} ({seconds:.0f} s, "
              f"loss {metrics.loss_first:.3f} -> {metrics.loss_last:.3f}): "
              f"{evaluate(adapted, 'rule')}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
