"""Analysis end to end over 1,000 runs: cold (embeddings computed, model loaded) and warm
(embeddings cached), in one run. Goals on a 2-core machine: cold <= 60 s, warm <= 10 s.

Two populations, each written to a temporary store first (not timed): the bundled example
agent's runs (`tracegym.examples.support_agent`, about 17 spans a run, failures of five kinds),
and synthetic runs of 30 spans whose failures vary widely (many distinct signatures to embed,
the slow case for the cold pass). Each analysis opens the store (compacting the spool on the
cold pass), runs the detectors, embeds and clusters failure signatures, scores candidates and
writes gaps.json.

    .venv/bin/python benchmarks/analysis_speed.py [--runs 1000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.analysis.pipeline import analyze
from tracegym.examples.support_agent import run_demo
from tracegym.store.store import Store

TOOLS = ["find_user", "get_order", "get_policy", "refund", "cancel", "exchange", "search", "notify"]


def synthetic_runs(home: Path, runs: int, spans: int = 30, seed: int = 0) -> None:
    """Runs of `spans` spans (user turns, model turns, tool calls) with varied failures: each
    failed run breaks in one of many (tool, error, order) ways, so failure signatures differ
    and the cold pass has hundreds of distinct texts to embed."""
    import json
    import random

    from tracegym.store.records import outcome_record, span_record, stable_id, write_spool_file

    rng = random.Random(seed)
    base = 1_764_460_800_000_000_000
    records = []
    for r in range(runs):
        trace = stable_id("bench", r)
        root = stable_id("bench", r, "root", width=16)
        start = base + r * 10**9
        failed = rng.random() < 0.4
        order_id = f"W{rng.randrange(10**6):06d}"
        records.append(span_record(
            trace_id=trace, span_id=root, name="invoke_agent bench", start_ns=start,
            end_ns=start + spans * 10**6, attributes={"gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "bench", "tracegym.input": f"help with order {order_id}"},
        ))  # fmt: skip
        broken = rng.randrange(1, spans - 1) if failed else -1
        for i in range(1, spans):
            t = start + i * 10**6
            attrs = {"tracegym.step.index": i, "gen_ai.agent.name": "bench"}
            status = "UNSET"
            if i % 3 == 1:
                name = "chat m"
                attrs |= {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 200,
                          "gen_ai.usage.output_tokens": 30}  # fmt: skip
            else:
                tool = TOOLS[(i + (r % 3)) % len(TOOLS)] if i != broken else rng.choice(TOOLS)
                arg = order_id if i != broken else f"W{rng.randrange(10**6):06d}"
                name = f"execute_tool {tool}"
                attrs |= {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                          "gen_ai.tool.call.arguments": json.dumps({"order_id": arg}),
                          "gen_ai.tool.call.result": json.dumps({"order_id": order_id,
                                                                 "status": "ok"})}  # fmt: skip
                if i == broken:
                    status = "ERROR"
                    attrs["error.type"] = f"{tool.title()}Error{rng.randrange(40)}"
            records.append(span_record(
                trace_id=trace, span_id=stable_id("bench", r, i, width=16), parent_span_id=root,
                name=name, start_ns=t, end_ns=t + 500_000, status=status, attributes=attrs,
            ))  # fmt: skip
        records.append(outcome_record(trace, time_ns=start + spans * 10**6, success=not failed))
    write_spool_file(home, records, "synthetic")


def measure(label: str, home: Path, runs: int) -> None:
    with Store(home) as store:
        spans = store.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    print(f"{label}: {runs} runs, {spans} spans ({spans / runs:.1f} a run)")
    shutil.rmtree(home / "cache", ignore_errors=True)
    for phase in ("cold", "warm"):
        start = time.perf_counter()
        result = analyze(home)
        elapsed = time.perf_counter() - start
        goal = 60 if phase == "cold" else 10
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in result.timings.items())
        print(
            f"  {phase}: {elapsed:6.2f} s (goal <= {goal} s; {parts}; "
            f"{result.embedded} signatures embedded) -> {len(result.failed)} failed runs, "
            f"{len(result.gaps)} gaps"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        demo = home / "demo"
        tg.init(home=demo, provider=TracerProvider(), capture_messages=True)
        start = time.perf_counter()
        run_demo(n_tasks=args.runs, seed=0)
        tg.shutdown()
        print(f"traced {args.runs} demo runs in {time.perf_counter() - start:.1f} s (not timed)")
        measure("example agent", demo, args.runs)
        synthetic = home / "synthetic"
        synthetic_runs(synthetic, args.runs)
        measure("synthetic, varied failures", synthetic, args.runs)


if __name__ == "__main__":
    main()
