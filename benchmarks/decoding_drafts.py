"""Drafts from the conversation, off and on, on one of the demo's stages: seconds, forward passes
and whether the chats are the same.

The demo's agent (`examples.lm_agent.ShopAgent`, greedy, 48 new tokens a turn) runs the demo's
dev tasks of a seed (or its held-out tasks) in one wave, as the demo's dev stage does, first with
`map_batched(draft_budget=0)` (one token a lane and step), then with the default budget
(`training.drafts.DRAFT_BUDGET`), alternating for `--rounds`. Prints per run: seconds, forward
passes, draft tokens fed and kept, tasks passed, and the chats compared token for token with the
drafts-off run of the same round.

    .venv/bin/python benchmarks/decoding_drafts.py --model <home>/models/shop-base-KEY --seed 0
    .venv/bin/python benchmarks/decoding_drafts.py --model ... --split heldout --tasks 48
    .venv/bin/python benchmarks/decoding_drafts.py --model tiny --tasks 8    # seconds, no weights

Offline: HF_HUB_OFFLINE=1. Measured 2026-12-02 (docs/demo.md, "Fewer decoding steps").
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tracegym.examples.lm_agent import ShopAgent
from tracegym.generation.batching import map_batched
from tracegym.generation.drafts import DRAFT_BUDGET
from tracegym.generation.model import ensure_model, load_policy
from tracegym.jobs.demo import DEV_SEEDS, HELDOUT_SEEDS, _tasks


def run(policy: Any, tasks: list[Any], budget: int) -> dict[str, Any]:
    agent = ShopAgent(policy, max_new_tokens=48, split="bench", notes=None)
    stats: dict[str, int] = {}
    started = time.perf_counter()
    results = map_batched(policy, lambda lane, t: agent.run(t, lane=lane), tasks,
                          batch_size=len(tasks), stats=stats, draft_budget=budget)  # fmt: skip
    seconds = time.perf_counter() - started
    chats = [r.to_dict()["messages"] for r in results]
    return {"seconds": seconds, "stats": stats, "passed": sum(r.passed for r in results),
            "chats": chats, "load": os.getloadavg()[0]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, or tiny")
    parser.add_argument("--seed", type=int, default=0, help="the demo seed whose tasks to run")
    parser.add_argument("--split", choices=("dev", "heldout"), default="dev")
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    folder = Path(args.model)
    if args.model == "tiny":
        folder = ensure_model(tempfile.mkdtemp(prefix="decoding-drafts-"), "tiny-3")
    policy = load_policy(folder, device="cpu")
    seeds = DEV_SEEDS if args.split == "dev" else HELDOUT_SEEDS
    tasks = _tasks(seeds, args.tasks, args.seed)
    print(f"{folder.name}: {len(tasks)} {args.split} tasks of seed {args.seed}, one wave, greedy")
    print("round  budget  seconds  forwards  drafted  kept  passed  same chats  load")
    for round_ in range(1, args.rounds + 1):
        reference = None
        for budget in (0, DRAFT_BUDGET):
            r = run(policy, tasks, budget)
            reference = reference or r
            same = sum(a == b for a, b in zip(r["chats"], reference["chats"], strict=True))
            s = r["stats"]
            print(f"{round_:5d}  {budget:6d}  {r['seconds']:7.1f}  {s['forwards']:8d}  "
                  f"{s['drafted']:7d}  {s['accepted']:4d}  {r['passed']:3d}/{len(tasks):<3d} "
                  f"{same:4d}/{len(tasks):<4d}  {r['load']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
