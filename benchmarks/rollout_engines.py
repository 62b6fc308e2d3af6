"""Rollout engines side by side: the same shop tasks through PyTorch and CTranslate2.

The demo's agent (`examples.lm_agent.ShopAgent`, greedy, the demo's 48 new tokens a turn and 6
turns) solves the same tasks (`examples.shop.make_task`, seeds from 1000) through each engine, in
one run, batch 8 as the demo does:

- torch: today's path, `training.batching.map_batched` over the PyTorch model (the reference),
  drafts from the conversation on (`training.drafts`);
- torch-nodraft: the same without drafts (one token a lane and step);
- torch-bf16: the same in bfloat16 weights and activations;
- torch-int8: the same with `torch.ao.quantization.quantize_dynamic` (int8 Linear layers but
  the output head);
- ct2-float32, ct2-int8: `training.ct2_engine.map_batched`, the model converted once with
  CTranslate2 (`<folder>.ct2-<quantization>`).

Per engine: seconds, generated tokens/s, tasks passed, and agreement with the torch replies
(tasks whose whole chat is token-for-token the torch one, and first replies identical), with the
load average before and after (the machine is shared: read the numbers next to it).

    .venv/bin/python benchmarks/rollout_engines.py                  # the demo's cached base model
    .venv/bin/python benchmarks/rollout_engines.py --model /path/to/models/shop-base-KEY
    .venv/bin/python benchmarks/rollout_engines.py --model tiny --tasks 8   # seconds, no weights

Without --model it takes the SmolLM2 shop-base folder the demo caches under <home>/models/
(--home, else $TRACEGYM_HOME, else ./.tracegym) and, when there is none, builds it as the demo
does (`examples.demo.prepare_model`: the GGUF converted, fine-tuned, merged; minutes, once).
Offline: HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tracegym.examples.lm_agent import ShopAgent, TaskResult
from tracegym.examples.shop import make_task
from tracegym.generation.batching import map_batched
from tracegym.generation.drafts import DRAFT_BUDGET
from tracegym.generation.model import ensure_model, load_policy

ENGINES = ("torch", "torch-nodraft", "torch-bf16", "torch-int8", "ct2-float32", "ct2-int8")


def find_model(home: Path) -> Path:
    """The demo's SmolLM2 shop-base folder under `home`, built the demo's way if missing."""
    for folder in sorted((home / "models").glob("shop-base-*"), key=lambda p: -p.stat().st_mtime):
        meta = folder / "tracegym_model.json"
        if meta.exists() and json.loads(meta.read_text()).get("name", "").startswith("smollm2"):
            return folder
    from tracegym.jobs.demo import DemoConfig, prepare_model

    print(f"no SmolLM2 shop-base model under {home}/models: building it as the demo does")
    return prepare_model(home, DemoConfig())


def run_engine(name: str, folder: Path, agent: ShopAgent, tasks: list[Any], args: Any) -> dict:
    """One engine on the tasks: its results, seconds and load averages."""
    if name.startswith("ct2"):
        from tracegym.generation import ct2_engine

        engine = ct2_engine.Ct2Engine.from_folder(
            folder, quantization=name.removeprefix("ct2-"), threads=args.threads
        )

        def solve() -> list[TaskResult]:
            return ct2_engine.map_batched(
                engine, lambda lane, t: agent.run(t, lane=lane), tasks, batch_size=args.batch_size
            )
    else:
        policy = load_policy(folder, device="cpu")
        if name == "torch-bf16":
            policy.model = policy.model.to(torch.bfloat16)
        if name == "torch-int8":
            # every Linear but the output head (tied to the embeddings: int8 there, per tensor,
            # left the shop model passing nothing)
            spec = {
                name: torch.ao.quantization.default_dynamic_qconfig
                for name, module in policy.model.named_modules()
                if isinstance(module, torch.nn.Linear) and name != "lm_head"
            }
            policy.model = torch.ao.quantization.quantize_dynamic(
                policy.model, spec, dtype=torch.qint8
            )

        budget = 0 if name == "torch-nodraft" else DRAFT_BUDGET

        def solve() -> list[TaskResult]:
            return map_batched(
                policy, lambda lane, t: agent.run(t, lane=lane), tasks,
                batch_size=args.batch_size, draft_budget=budget,
            )  # fmt: skip

    load_before = os.getloadavg()
    started = time.perf_counter()
    results = solve()
    seconds = time.perf_counter() - started
    return {"results": results, "seconds": seconds, "load": (load_before, os.getloadavg())}


def replies(result: TaskResult) -> list[str]:
    return [m["content"] for m in result.messages if m["role"] == "assistant"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model folder, or tiny (default: above)")
    parser.add_argument("--home", default=None, help="where the demo caches its models")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"of {','.join(ENGINES)}")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2, help="torch and CTranslate2 threads")
    parser.add_argument(
        "--rounds", type=int, default=1, help="engines run in turn this many times (load drifts)"
    )
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    home = Path(args.home or os.environ.get("TRACEGYM_HOME") or ".tracegym")
    if args.model == "tiny":
        folder = ensure_model(tempfile.mkdtemp(prefix="rollout-engines-"), "tiny-3")
    else:
        folder = Path(args.model) if args.model else find_model(home)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if "torch" not in engines:
        engines.insert(0, "torch")
    policy = load_policy(folder, device="cpu")
    agent = ShopAgent(policy, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    tasks = [make_task(args.first_seed + i) for i in range(args.tasks)]
    print(
        f"model {policy.name} ({folder}), {args.threads} thread(s), {os.cpu_count()} CPU(s): "
        f"{args.tasks} shop tasks, batch {args.batch_size}, greedy, max {args.max_turns} turns "
        f"of {args.max_new_tokens} tokens"
    )
    print(
        f"{'engine':<12} {'seconds':>8} {'tokens':>7} {'tok/s':>7} {'speed-up':>8} "
        f"{'passed':>7} {'same chat':>9} {'same 1st':>8}  load 1-min before/after"
    )
    report: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None  # torch's first run: the replies to agree with
    for round_ in range(1, args.rounds + 1):
        torch_run: dict[str, Any] | None = None  # this round's torch run: the speed to beat
        for name in engines:
            try:
                run = run_engine(name, folder, agent, tasks, args)
            except ImportError as exc:
                print(f"{name:<12} skipped: {exc}")
                continue
            first = first or run
            torch_run = torch_run or run
            report.append(summarise(name, round_, run, first, torch_run))
    if args.json:
        data = {"model": policy.name, "folder": str(folder), "threads": args.threads}
        Path(args.json).write_text(json.dumps(data | {"runs": report}, indent=2) + "\n")


def summarise(name: str, round_: int, run: dict, first: dict, torch_run: dict) -> dict[str, Any]:
    """One engine's row, printed: speed against this round's torch run, replies against the
    first torch run's."""
    results: list[TaskResult] = run["results"]
    ref: list[TaskResult] = first["results"]
    tokens = sum(r.generated_tokens for r in results)
    same_chat = sum(a.messages == b.messages for a, b in zip(results, ref, strict=True))
    same_first = sum(replies(a)[:1] == replies(b)[:1] for a, b in zip(results, ref, strict=True))
    passed = sum(r.passed for r in results)
    row = {
        "engine": name,
        "seconds": round(run["seconds"], 2),
        "tokens": tokens,
        "tokens_per_s": round(tokens / run["seconds"], 1),
        "speedup": round(torch_run["seconds"] / run["seconds"], 2),
        "round": round_,
        "passed": passed,
        "tasks": len(results),
        "same_chat": same_chat,
        "same_first_reply": same_first,
        "load_before": [round(x, 2) for x in run["load"][0]],
        "load_after": [round(x, 2) for x in run["load"][1]],
    }
    print(
        f"{name:<12} {row['seconds']:>8.1f} {tokens:>7} {row['tokens_per_s']:>7.1f} "
        f"{row['speedup']:>7.2f}x {passed:>3}/{len(results):<3} "
        f"{same_chat:>4}/{len(results):<4} {same_first:>3}/{len(results):<4} "
        f"{run['load'][0][0]:.2f} / {run['load'][1][0]:.2f}",
        flush=True,
    )
    return row


if __name__ == "__main__":
    main()
