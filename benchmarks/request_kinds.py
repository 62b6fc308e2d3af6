"""How well `RequestKinds` recovers the kinds of request runs serve, next to the first-write kind.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/request_kinds.py [--distances 0.4,0.5,0.6]
        [--tuning 0-9] [--reporting 100-119] [--work DIR]

Labels are read only here, never by analysis: the planted generator's `task_kind` outcome
label (status, cancel, refund, update; tuning seeds and reporting seeds apart), and
MedAgentBench's task template (`index // 10`, benchmarks/gaps_real.py; reporting only, from the
homes gaps_real.py imported under `--work`). Per set and system: homogeneity (each learnt kind
holds one labelled kind: 1.0), completeness (each labelled kind is one learnt kind: 1.0), the
adjusted Rand index, the number of kinds, and the seconds `fit` took. Baselines in the same run:
`Run.request_kind` (the first write tool; None is a kind of its own) and one kind for all.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sklearn.metrics import adjusted_rand_score, completeness_score, homogeneity_score


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def scores(labels: Sequence[str], kinds: Sequence[str]) -> tuple[float, float, float, int]:
    return (homogeneity_score(labels, kinds), completeness_score(labels, kinds),
            adjusted_rand_score(labels, kinds), len(set(kinds)))  # fmt: skip


def systems(distances: Sequence[float]) -> dict[str, Callable[[list[Any]], list[str]]]:
    from tracegym.analysis.request_kinds import RequestKinds

    def learnt(d: float) -> Callable[[list[Any]], list[str]]:
        def fit(runs: list[Any]) -> list[str]:
            model = RequestKinds(distance=d).fit(runs)
            return [str(model.kind_of(r)) for r in runs]

        return fit

    out: dict[str, Callable[[list[Any]], list[str]]] = {
        f"request kinds d={d}": learnt(d) for d in distances
    }
    out["baseline: first write tool"] = lambda runs: [str(r.request_kind()) for r in runs]
    out["baseline: one kind"] = lambda runs: ["all"] * len(runs)
    return out


def table(name: str, sets: Sequence[tuple[list[Any], list[str]]], fns: dict[str, Any]) -> str:
    lines = [f"## {name} ({len(sets)} sets, {sum(len(r) for r, _ in sets)} runs; mean per set)",
             "", "| system | homogeneity | completeness | ARI | kinds | fit s |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for system, fn in fns.items():
        rows, seconds = [], 0.0
        for runs, labels in sets:
            clock = time.perf_counter()
            kinds = fn(runs)
            seconds = max(seconds, time.perf_counter() - clock)
            rows.append(scores(labels, kinds))
        mean = [sum(r[i] for r in rows) / len(rows) for i in range(4)]
        lines.append(f"| {system} | {mean[0]:.2f} | {mean[1]:.2f} | {mean[2]:.2f} | "
                     f"{mean[3]:.1f} | {seconds:.3f} |")  # fmt: skip
    return "\n".join(lines)


def planted_sets(seeds: Sequence[int], work: Path) -> list[tuple[list[Any], list[str]]]:
    from tracegym.analysis.runs import load_runs
    from tracegym.store.store import Store
    from tracegym.tests.fixtures.planted import generate

    out = []
    for seed in seeds:
        home = work / f"planted-{seed}"
        generate(home, seed)
        store = Store(home)
        try:
            runs = load_runs(store)
        finally:
            store.close()
        out.append((runs, [str(r.labels.get("task_kind")) for r in runs]))
    return out


def medagentbench_sets(work: Path) -> list[tuple[list[Any], list[str]]]:
    from tracegym.analysis.runs import load_runs
    from tracegym.benchmarks.gaps_real import _source, task_kind
    from tracegym.store.store import Store

    out = []
    for home in sorted(work.glob("medagentbench-*")):
        if "pooled" in home.name:
            continue
        store = Store(home)
        try:
            runs = load_runs(store)
        finally:
            store.close()
        out.append((runs, [str(task_kind(_source(r, "index"))) for r in runs]))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--distances", default="0.4,0.5,0.6,0.7,0.8")
    parser.add_argument("--tuning", default="0-9")
    parser.add_argument("--reporting", default="100-119")
    parser.add_argument("--work", type=Path,
                        default=Path(tempfile.gettempdir()) / "tracegym-gaps-real")  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    fns = systems([float(d) for d in args.distances.split(",")])
    scratch = Path(tempfile.mkdtemp(prefix="tracegym-request-kinds-"))
    print(table("planted, tuning seeds " + args.tuning,
                planted_sets(_seeds(args.tuning), scratch), fns) + "\n")  # fmt: skip
    print(table("planted, reporting seeds " + args.reporting,
                planted_sets(_seeds(args.reporting), scratch), fns) + "\n")  # fmt: skip
    mab = medagentbench_sets(args.work)
    if mab:
        print(table("MedAgentBench per model (reporting; task template index // 10)", mab, fns))
    else:
        print(f"MedAgentBench: no imported homes under {args.work} (run gaps_real.py first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
