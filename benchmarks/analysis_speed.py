"""Analysis end to end over 1,000 runs: cold (embeddings computed, model loaded) and warm
(embeddings cached), in one run. Goals on a 2-core machine: cold <= 60 s, warm <= 10 s.

The runs come from the bundled example agent (`tracegym.examples.support_agent`), traced into a
temporary store first (not timed). Each analysis opens the store (compacting the spool on the
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        tg.init(home=home, provider=TracerProvider(), capture_messages=True)
        start = time.perf_counter()
        run_demo(n_tasks=args.runs, seed=0)
        tg.shutdown()
        print(f"traced {args.runs} runs in {time.perf_counter() - start:.1f} s (not timed below)")
        with Store(home) as store:
            spans = store.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        print(f"{spans} spans, {spans / args.runs:.1f} a run")

        shutil.rmtree(home / "cache", ignore_errors=True)
        for label in ("cold", "warm"):
            start = time.perf_counter()
            result = analyze(home)
            elapsed = time.perf_counter() - start
            goal = 60 if label == "cold" else 10
            parts = ", ".join(f"{k} {v:.2f} s" for k, v in result.timings.items())
            print(
                f"{label}: {elapsed:6.2f} s (goal <= {goal} s; {parts}; "
                f"{result.embedded} signatures embedded) -> {len(result.failed)} failed runs, "
                f"{len(result.gaps)} gaps"
            )


if __name__ == "__main__":
    main()
