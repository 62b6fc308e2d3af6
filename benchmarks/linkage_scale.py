"""Request kinds and failure clusters at 1k-100k runs: average linkage over the distinct
texts weighted by their counts (`analysis.linkage`) against scikit-learn's over every run.

    .venv/bin/python benchmarks/linkage_scale.py [--sizes 1000,5000,100000] [--templates 300]

Requests are drawn from `--templates` generated templates (a few words each from a fixed
vocabulary) filled with random ids, amounts and names, as benchmark and production requests
are; signatures are unit vectors, one per template, repeated. Per size: the request kinds'
clustering (`request_kinds._cluster`, after the TF-IDF, which is linear) in CPU seconds and
peak traced memory (tracemalloc: numpy's and Python's allocations), then the same
for the signature clustering, each beside the baseline (every run in one distance matrix,
scikit-learn's AgglomerativeClustering, as before) in the same run where it fits in memory
(`--baseline-max`, default 5000 runs), and whether both give the same partition.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

WORDS = ["order", "parcel", "refund", "cancel", "change", "address", "status", "delivery",
         "payment", "card", "item", "broken", "late", "missing", "return", "exchange", "invoice",
         "account", "password", "email", "phone", "plan", "upgrade", "seat", "flight", "baggage",
         "booking", "hotel", "night", "room"]  # fmt: skip
NAMES = ["ana", "bo", "chen", "dara", "eli"]


def requests(n: int, templates: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    shapes = [" ".join(rng.sample(WORDS, rng.randint(4, 8))) for _ in range(templates)]
    out = []
    for _ in range(n):
        shape = rng.choice(shapes)
        amount = f"{rng.randint(1, 500)}.{rng.randint(0, 99)}"
        out.append(f"Hi, I am {rng.choice(NAMES)}. {shape} #{rng.randint(10_000, 99_999)} "
                   f"for ${amount}")  # fmt: skip
    return out


def _measure(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """The value, CPU seconds (this process, all threads: the machine is shared, so wall time
    says more about the neighbours) and peak traced MB, from a second call under tracemalloc
    (which slows Python code down, so it is not timed)."""
    start = time.process_time()
    value = fn()
    seconds = time.process_time() - start
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    return value, seconds, peak


def _partition(labels: Any) -> list[int]:
    order: dict[int, int] = {}
    return [order.setdefault(int(label), len(order)) for label in labels]


def _sklearn_every_run(distances: np.ndarray, threshold: float) -> np.ndarray:
    from sklearn.cluster import AgglomerativeClustering

    model = AgglomerativeClustering(
        n_clusters=None, metric="precomputed", linkage="average", distance_threshold=threshold
    )
    return model.fit_predict(distances)


def _row(what: str, n: int, new: Callable[[], Any], old: Callable[[], Any], run_old: bool) -> str:
    labels, new_s, new_mb = _measure(new)
    line = f"{n:>8,}  {what:<16} {len(set(labels)):>4}  weighted {new_s:7.2f} CPU s"
    line += f" {new_mb:8.1f} MB"
    if not run_old:
        return line + f"  | every run: not run ({n * n * 8 / 1e9:.1f} GB matrix)"
    before, old_s, old_mb = _measure(old)
    same = _partition(before) == _partition(labels)
    return line + (f"  | every run {old_s:7.2f} CPU s {old_mb:8.1f} MB  ratio {old_s / new_s:6.1f}x"
                   f" time {old_mb / new_mb:6.1f}x memory  same partition: {same}")  # fmt: skip


def kinds_row(n: int, templates: int, baseline_max: int) -> str:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_distances
    from tracegym.analysis import request_kinds
    from tracegym.analysis.request_kinds import normalise

    docs = [normalise(t) for t in requests(n, templates)]
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2, max_df=0.95,
                                 token_pattern=request_kinds._WORD.pattern)  # fmt: skip
    matrix = vectorizer.fit_transform(docs)
    return _row("kinds", n, lambda: request_kinds._cluster(matrix, docs, 0.6),
                lambda: _sklearn_every_run(np.clip(cosine_distances(matrix), 0.0, None), 0.6),
                n <= baseline_max)  # fmt: skip


def signatures_row(n: int, templates: int, baseline_max: int) -> str:
    from sklearn.metrics.pairwise import cosine_distances
    from tracegym.analysis.clustering import cluster

    rng = np.random.default_rng(0)
    unit = rng.normal(size=(templates, 384)).astype(np.float32)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    vectors = unit[rng.integers(0, templates, size=n)]
    return _row("failure clusters", n, lambda: cluster(vectors, 0.35),
                lambda: _sklearn_every_run(np.clip(cosine_distances(vectors), 0.0, None), 0.35),
                n <= baseline_max)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,100000")
    parser.add_argument("--templates", type=int, default=300)
    parser.add_argument("--baseline-max", type=int, default=5000)
    args = parser.parse_args()
    for n in (int(s) for s in args.sizes.split(",")):
        print(kinds_row(n, args.templates, args.baseline_max), flush=True)
        print(signatures_row(n, args.templates, args.baseline_max), flush=True)


if __name__ == "__main__":
    main()
