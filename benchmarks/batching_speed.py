"""Batched generation speed: the wave's compaction and shared prefix against the plain wave.

The same shop tasks (`examples.shop.make_task`) are solved by the example agent
(`examples.lm_agent.ShopAgent`, greedy) through `training.batching.map_batched`, once per variant
and batch size, in one run:

- old: every lane's row in every forward pass, each lane prefilling the whole system message
  (`compact=False, share_prefix=False`, the wave before these optimisations);
- compact: rows of lanes that are not decoding leave the batch, padding columns are cut;
- prefix: the system message every lane shares is prefilled once;
- new: both (the default).

Each variant's chats must equal the old one's token for token; the script says so, with seconds,
the speed-up over old, and the token rows the model computed.

    .venv/bin/python benchmarks/batching_speed.py                       # tiny model
    .venv/bin/python benchmarks/batching_speed.py \\
        --model /tmp/lead_smol3/models/shop-base-d0f6dbf09e44 --tasks 16 --batch-sizes 8,16
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from tracegym.examples.lm_agent import ShopAgent
from tracegym.examples.shop import make_task
from tracegym.generation.batching import map_batched
from tracegym.generation.model import Policy, load_policy, tiny_model

VARIANTS = {
    "old": {"compact": False, "share_prefix": False},
    "compact": {"compact": True, "share_prefix": False},
    "prefix": {"compact": False, "share_prefix": True},
    "new": {"compact": True, "share_prefix": True},
}


def solve(
    agent: ShopAgent, tasks: list[Any], batch_size: int, options: dict[str, bool]
) -> tuple[float, list[list[dict[str, str]]], dict[str, int]]:
    """(seconds, each task's chat, the waves' work counters) for one variant."""
    stats: dict[str, int] = {}
    started = time.perf_counter()
    results = map_batched(
        agent.policy,
        lambda lane, task: agent.run(task, lane=lane),
        tasks,
        batch_size=batch_size,
        stats=stats,
        **options,
    )
    return time.perf_counter() - started, [r.messages for r in results], stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny or a model folder")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--batch-sizes", default="8,16", help="comma-separated")
    parser.add_argument("--variants", default="old,new", help=f"of {','.join(VARIANTS)}")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    policy: Policy = tiny_model(seed=3) if args.model == "tiny" else load_policy(args.model)
    agent = ShopAgent(policy, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    tasks = [make_task(args.first_seed + i) for i in range(args.tasks)]
    system = len(agent.encoder.message("system", agent.system)[0])
    print(
        f"model {policy.name} on {policy.device}, {torch.get_num_threads()} thread(s): "
        f"{args.tasks} shop tasks, max {args.max_turns} turns of {args.max_new_tokens} tokens, "
        f"system message {system} tokens"
    )
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "old" not in variants:
        variants.insert(0, "old")
    report: list[dict[str, Any]] = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        base_seconds, base_chats = 0.0, None
        for name in variants:
            seconds, chats, stats = solve(agent, tasks, batch_size, VARIANTS[name])
            if name == "old":
                base_seconds, base_chats = seconds, chats
            same = chats == base_chats
            print(
                f"batch {batch_size:>2} {name:<8} {seconds:7.2f} s  "
                f"{base_seconds / seconds:4.2f}x  forwards {stats.get('forwards', 0):>5}  "
                f"token rows {stats.get('tokens', 0):>7}  shared {stats.get('shared', 0):>6}  "
                f"{'same chats' if same else 'CHATS DIFFER'}"
            )
            report.append(
                {"batch_size": batch_size, "variant": name, "seconds": seconds, "same": same}
                | stats
            )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"model": policy.name, "tasks": args.tasks, "runs": report}, handle, indent=2)


if __name__ == "__main__":
    main()
