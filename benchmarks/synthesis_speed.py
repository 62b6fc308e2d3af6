"""Environment speed: tasks generated per second and the time of one step, per family.

For every family, on two tool sets: the synthetic shop (`tracegym.synthesis.fixtures`, always
available) and the AgentRx tau-retail tools as recorded (imported into a temporary store when
`../shared/data/agentrx-tau-retail` exists; its records are the largest). Prints, per
environment: 1,000 tasks generated (seconds; each includes replaying the oracle to derive the
expected state), tasks/s, and the mean time of a step (oracle actions through `env.step`, the
first observation excluded). Goals: 1,000 tasks < 1 s, a step < 1 ms.

    .venv/bin/python benchmarks/synthesis_speed.py [--tasks 1000] [--episodes 200] [--no-retail]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tracegym.synthesis.families import FAMILIES, build_spec
from tracegym.synthesis.fixtures import gap, shop_traces
from tracegym.synthesis.spec import Catalog, infer_catalog

RETAIL = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "agentrx-tau-retail"


def retail_catalog() -> Catalog | None:
    if not RETAIL.is_dir():
        return None
    from tracegym.store.importers import import_path
    from tracegym.synthesis.spec import catalog_from_store

    home = Path(tempfile.mkdtemp(prefix="tracegym-bench-"))
    import_path("tau-bench", RETAIL / "tau_dataset_full.json", home)
    return catalog_from_store(home)


def measure(catalog: Catalog, action: str, tasks: int, episodes: int) -> list[tuple]:
    rows = []
    for family in FAMILIES.values():
        spec = build_spec(gap(family.detectors[0], [action]), catalog)
        env = family(spec)
        env.make_task(0)  # warm the compiled generators
        started = time.perf_counter()
        for seed in range(tasks):
            env.make_task(seed)
        generate = time.perf_counter() - started
        oracles = [env.make_task(seed).oracle for seed in range(episodes)]
        steps = 0
        step_time = 0.0
        for seed, oracle in enumerate(oracles):
            env.reset(seed=seed)
            started = time.perf_counter()
            for action_ in oracle:
                env.step(action_)
            step_time += time.perf_counter() - started
            steps += len(oracle)
        rows.append((spec.family, generate, tasks / generate, step_time / steps * 1e6, steps))
    return rows


def report(title: str, rows: list[tuple], tasks: int) -> bool:
    print(f"\n{title}")
    print(f"{'family':22s} {f'{tasks} tasks':>11s} {'tasks/s':>9s} {'step':>9s} {'steps':>6s}")
    ok = True
    for family, generate, rate, step_us, steps in rows:
        scaled = generate * 1000 / tasks
        flag = "" if scaled < 1.0 and step_us < 1000 else "  <- over the goal"
        ok &= not flag
        print(f"{family:22s} {generate:10.3f}s {rate:9.0f} {step_us:7.0f}us {steps:6d}{flag}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--no-retail", action="store_true")
    args = parser.parse_args()
    shop = infer_catalog(shop_traces(40))
    ok = report("synthetic shop tools (return_delivered_order_items)",
                measure(shop, "return_delivered_order_items", args.tasks, args.episodes),
                args.tasks)  # fmt: skip
    catalog = None if args.no_retail else retail_catalog()
    if catalog is not None:
        ok &= report("AgentRx tau-retail tools as recorded (exchange_delivered_order_items)",
                     measure(catalog, "exchange_delivered_order_items", args.tasks,
                             args.episodes), args.tasks)  # fmt: skip
    elif not args.no_retail:
        print(f"\n(skipped the retail tools: {RETAIL} is absent)")
    print(f"\ngoals (1,000 tasks < 1 s, a step < 1 ms): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
