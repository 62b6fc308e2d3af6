"""The embedding runtime: the numpy MiniLM (analysis/minilm.py, no torch) against
sentence-transformers on torch (what analysis used before), in the same run.

Two measurements, rounds interleaved so a noisy neighbour hits both alike:

- `analyze` cold on a small home: a fresh interpreter per run (imports, model load, every
  signature embedded: the home's embedding cache is deleted first), wall clock around the
  process. The home (the example agent's runs plus synthetic runs with varied failures, made
  and compacted once, not timed) is the same for both.
- embedding alone, in this process: the same texts through each model once loaded; the
  largest difference between their vectors is printed too.

Prints each runtime's median and the ratio numpy / sentence-transformers (below 1: faster).

    .venv/bin/python benchmarks/embedding_runtime.py [--demo-runs 80] [--synthetic-runs 150]
        [--rounds 3] [--texts 512]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.analysis.minilm import MiniLM, model_folder
from tracegym.examples.support_agent import run_demo
from tracegym.store.home import Home

RUNTIMES = ("sentence-transformers", "numpy")

# One cold analysis in a fresh interpreter; prints what it did as JSON.
CHILD = """
import json, sys, time
start = time.perf_counter()
from tracegym.analysis.embeddings import Embedder
from tracegym.analysis.pipeline import analyze
from tracegym.store.home import Home


class SentenceTransformersEmbedder(Embedder):
    def _load_model(self):  # the embedder before: sentence-transformers on torch
        from sentence_transformers import SentenceTransformer
        from tracegym.analysis.minilm import model_folder

        model = SentenceTransformer(str(model_folder()), device="cpu")

        class Model:
            def encode(self, texts, batch_size):
                return model.encode(texts, batch_size=batch_size, normalize_embeddings=True)

        return Model()


home, runtime = sys.argv[1], sys.argv[2]
kind = SentenceTransformersEmbedder if runtime == "sentence-transformers" else Embedder
result = analyze(home, embedder=kind(Home.at(home).cache))
print(json.dumps({"embedded": result.embedded, "gaps": len(result.gaps),
                  "timings": result.timings,
                  "in_process": time.perf_counter() - start,
                  "torch": "torch" in sys.modules}))
"""


def make_home(home: Path, demo_runs: int, synthetic_runs: int) -> None:
    """The example agent's runs and synthetic ones with varied failure signatures."""
    spec = importlib.util.spec_from_file_location(
        "analysis_speed", Path(__file__).with_name("analysis_speed.py")
    )
    assert spec and spec.loader
    analysis_speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(analysis_speed)
    tg.init(home=home, provider=TracerProvider(), capture_messages=True)
    run_demo(n_tasks=demo_runs, seed=0)
    tg.shutdown()
    analysis_speed.synthetic_runs(home, synthetic_runs)


def cold_analyze(home: Path, runtime: str) -> tuple[float, dict]:
    shutil.rmtree(Home.at(home).cache, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(home), runtime],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{runtime}: analyze failed\n{done.stderr}")
    return elapsed, json.loads(done.stdout.strip().splitlines()[-1])


def texts_of(n: int) -> list[str]:
    tools = ["get_order", "refund_order", "find_user", "search_memory", "cancel", "exchange"]
    errors = ["KeyError", "TimeoutError", "ValueError: bad id", "429 Too Many Requests"]
    return [
        f"execute_tool {tools[i % 6]} error {errors[i % 4]} at step {i % 17} "
        + "after reading the refund policy note " * (i % 5)
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-runs", type=int, default=80)
    parser.add_argument("--synthetic-runs", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=512)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        make_home(home, args.demo_runs, args.synthetic_runs)
        cold_analyze(home, "numpy")  # compacts the spool once: not part of any timing
        seconds: dict[str, list[float]] = {r: [] for r in RUNTIMES}
        info: dict[str, dict] = {}
        for _ in range(args.rounds):
            for runtime in RUNTIMES:
                elapsed, info[runtime] = cold_analyze(home, runtime)
                seconds[runtime].append(elapsed)
    print(f"analyze, cold, fresh interpreter ({args.demo_runs} example + "
          f"{args.synthetic_runs} synthetic runs; median of {args.rounds}):")  # fmt: skip
    for runtime in RUNTIMES:
        got = info[runtime]
        print(f"  {runtime:22s} {statistics.median(seconds[runtime]):6.2f} s "
              f"(best {min(seconds[runtime]):.2f}; {got['embedded']} signatures embedded, "
              f"{got['gaps']} gaps, torch imported: {got['torch']})")  # fmt: skip
    ratio = statistics.median(seconds["numpy"]) / statistics.median(
        seconds["sentence-transformers"]
    )
    print(f"  ratio numpy / sentence-transformers: {ratio:.2f}")

    from sentence_transformers import SentenceTransformer

    texts = texts_of(args.texts)
    start = time.perf_counter()
    reference = SentenceTransformer(str(model_folder()), device="cpu")
    load = {"sentence-transformers": time.perf_counter() - start}
    start = time.perf_counter()
    ours = MiniLM.load()
    load["numpy"] = time.perf_counter() - start
    encode = {
        "sentence-transformers": lambda: reference.encode(
            texts, batch_size=64, normalize_embeddings=True
        ),
        "numpy": lambda: ours.encode(texts, batch_size=64),
    }
    embed: dict[str, list[float]] = {r: [] for r in RUNTIMES}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(args.rounds):
        for runtime in RUNTIMES:
            start = time.perf_counter()
            vectors[runtime] = encode[runtime]()
            embed[runtime].append(time.perf_counter() - start)
    print(f"embedding {len(texts)} texts, model loaded (median of {args.rounds}):")
    for runtime in RUNTIMES:
        print(f"  {runtime:22s} {statistics.median(embed[runtime]):6.2f} s "
              f"(load {load[runtime]:.2f} s)")  # fmt: skip
    ratio = statistics.median(embed["numpy"]) / statistics.median(embed["sentence-transformers"])
    print(f"  ratio numpy / sentence-transformers: {ratio:.2f}")
    diff = np.abs(vectors["numpy"] - vectors["sentence-transformers"]).max()
    cosine = (vectors["numpy"] * vectors["sentence-transformers"]).sum(axis=1).min()
    print(f"  largest |difference| {diff:.2e}, lowest cosine {cosine:.7f}")


if __name__ == "__main__":
    main()
