"""Environment speed: tasks generated per second and the time of one step, per family.

For every family, on the tool sets that can express it. The chain families (all but
`requested_action`) are built from a fixture gap naming the write tool, on two tool sets: the
synthetic shop (`tracegym.synthesis.fixtures`, always available) and the AgentRx tau-retail
tools as recorded (imported into a temporary store when `../shared/data/agentrx-tau-retail`
exists; its records are the largest). `requested_action` trains a request the agent never
serves, so its gap has to carry what `tracegym analyze` keeps of the users' requests (their
words, the run's first call: `Gap.requests`) and its spec the agent's conventions: it is built
the way `tracegym analyze` + `tracegym synthesize` build it, by analysing a store, here a
generated one: `--runs` scripted runs of the demo shop (`tracegym.examples.shop`) whose agent
leaves most address changes undone (the unserved_request:update_address gap), and the retail
store too (whose runs hold no such gap: it says why). Prints, per environment: 1,000 tasks
generated (seconds; each includes replaying the oracle to derive the expected state), tasks/s,
and the mean time of a step (oracle actions through `env.step`, the first observation
excluded). Goals: 1,000 tasks < 1 s, a step < 1 ms, every family measured.

    .venv/bin/python benchmarks/synthesis_speed.py [--tasks 1000] [--episodes 200] [--runs 60]
                                                   [--no-retail]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracegym.analysis.detector_names import (
    FORBIDDEN_ACTION,
    MISSED_ACTION,
    WRONG_AMOUNT,
    WRONG_LIST,
)
from tracegym.analysis.pipeline import analyze
from tracegym.synthesis.conventions import conventions_from_store
from tracegym.synthesis.families import FAMILIES, RequestedActionEnv, build_spec
from tracegym.synthesis.fixtures import gap, shop_traces
from tracegym.synthesis.registry import from_spec
from tracegym.synthesis.spec import Catalog, EnvironmentSpec, catalog_from_store, infer_catalog
from tracegym.synthesis.world import NotSynthesizable

RETAIL = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "agentrx-tau-retail"
REQUESTED = RequestedActionEnv.family
REQUESTED_BY = RequestedActionEnv.detectors[0]  # unserved_request
SERVED = 0.25  # the share of address changes the demo shop's agent does make


def chain_specs(catalog: Catalog, action: str) -> list[EnvironmentSpec]:
    """One spec per chain family that builds from a fixture gap naming `action` (the families
    built from mined rules refuse a fixture gap, which has none: said, not timed)."""
    specs = []
    for family in FAMILIES.values():
        if family is RequestedActionEnv:
            continue
        try:
            specs.append(build_spec(gap(family.detectors[0], [action]), catalog))
        except NotSynthesizable as exc:
            print(f"  {family.family}: not built ({str(exc)[:80]})")
    return specs


def demo_shop_runs(n: int) -> list[dict]:
    """`n` openai-chat runs of the demo shop: the oracle, except that the agent answers most
    address changes without calling update_address (so they fail); the verifier's outcome."""
    from tracegym.examples.shop import Shop, make_task, oracle_actions, oracle_answer, verify

    runs = []
    for seed in range(n):
        task = make_task(seed)
        lacks = task.kind == "address" and random.Random(f"served:{seed}").random() >= SERVED
        calls = oracle_actions(task)
        shop = Shop(task)
        messages: list[dict] = [{"role": "user", "content": task.request}]
        for name, arguments in calls[:1] if lacks else calls:
            call = {"type": "function", "function": {"name": name, "arguments": arguments}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": shop.call(name, arguments)})
        answer = "Sorry, I cannot help with that." if lacks else oracle_answer(task)
        messages.append({"role": "assistant", "content": answer})
        verdict = verify(task, shop, answer)
        runs.append({"id": task.task_id, "agent": "shop-agent", "messages": messages,
                     "outcome": {"success": verdict.passed, "reward": verdict.reward}})  # fmt: skip
    return runs


def rule_specs(analysis: Any, catalog: Any, conventions: Any) -> list[EnvironmentSpec]:
    """Specs of the families built from mined rules (policy_action, amount, list_selection), from
    the store's own findings: one gap per rule-mining detector, kept or not (`synthesis_real`'s
    forced gaps), since a fixture gap carries no rule."""
    from tracegym.benchmarks.synthesis_real import forced_gaps

    gaps, _ = forced_gaps(analysis, (FORBIDDEN_ACTION, MISSED_ACTION, WRONG_AMOUNT, WRONG_LIST))
    specs = []
    for g in gaps + [g for g in analysis.gaps if g.rules]:
        try:
            specs.append(build_spec(g, catalog, conventions))
        except NotSynthesizable as exc:
            print(f"  {g.detector}: not built ({str(exc)[:80]})")
    return specs


def list_specs(analysis: Any, catalog: Any, conventions: Any) -> list[EnvironmentSpec]:
    """list_selection specs from every list rule wrong_list mines on the store (a rule without a
    finding makes no gap: built from the rule alone, as its tests do)."""
    from tracegym.analysis.detectors.list_args import WrongListArgument
    from tracegym.analysis.gap import Gap

    detector = WrongListArgument().fit(analysis.runs)
    specs = []
    for (tool, arg), rule in sorted(detector.mined_.items()):
        g = Gap(id=f"gap-{tool}-{arg}", name=f"{tool}.{arg}", key=f"{WRONG_LIST}:{tool}.{arg}",
                kind="finding", detector=WRONG_LIST, tools=(tool,), rules=(rule,))  # fmt: skip
        try:
            specs.append(build_spec(g, catalog, conventions))
        except NotSynthesizable as exc:
            print(f"  list rule {tool}.{arg}: not built ({str(exc)[:80]})")
    return specs[:1]


def planted_specs(seed: int) -> list[EnvironmentSpec]:
    """The rule families' specs from a generated agent with planted causes (`tests/fixtures/
    planted.py`; seed 9 plants a wrong amount and a policy-forbidden action)."""
    from tracegym.benchmarks.planted_causes import ExactSignatures
    from tracegym.tests.fixtures import planted

    with tempfile.TemporaryDirectory(prefix="tracegym-bench-") as tmp:
        home = Path(tmp)
        planted.generate(home, seed)
        analysis = analyze(home, embedder=ExactSignatures(), write=False)
        return rule_specs(analysis, catalog_from_store(home), conventions_from_store(home))


def analysed_specs(home: Path) -> tuple[list[EnvironmentSpec], str]:
    """The requested_action specs of the gaps `analyze` finds in the store under `home`, built
    as `tracegym synthesize` builds them (tools and conventions mined from the store); when
    there are none, why."""
    started = time.perf_counter()
    analysis = analyze(home, write=False)
    took = time.perf_counter() - started
    found = [g for g in analysis.gaps if g.detector in RequestedActionEnv.detectors]
    print(f"  analyze: {len(analysis.runs)} runs ({len(analysis.failed)} failed) -> "
          f"{len(analysis.gaps)} gap(s), {len(found)} unserved_request, {took:.1f}s")  # fmt: skip
    catalog = catalog_from_store(home)
    conventions = conventions_from_store(home)
    specs = rule_specs(analysis, catalog, conventions)
    if not found:
        flagged = sum(f.detector == REQUESTED_BY for fs in analysis.findings.values() for f in fs)
        return specs, (f"analysis of its {len(analysis.runs)} runs finds no unserved_request gap "
                       f"({flagged} unserved_request findings)")  # fmt: skip
    reasons = []
    for g in found:
        try:
            specs.append(build_spec(g, catalog, conventions))
        except NotSynthesizable as exc:
            reasons.append(f"{g.key}: {exc}")
        else:
            print(f"  {g.key}: {len(g.requests)} requests, coverage {g.coverage:.2f}")
    return specs, "; ".join(reasons)


def measure(specs: list[EnvironmentSpec], tasks: int, episodes: int) -> list[tuple]:
    rows = []
    for spec in specs:
        env = from_spec(spec)  # the spec's own class (a family may build more than one)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=60,
                        help="scripted demo-shop runs analysed for requested_action "
                        "(a dozen hold too few unserved address changes for a gap)")  # fmt: skip
    parser.add_argument("--no-retail", action="store_true")
    args = parser.parse_args()
    measured: set[str] = set()

    shop = infer_catalog(shop_traces(40))
    rows = measure(chain_specs(shop, "return_delivered_order_items"), args.tasks, args.episodes)
    ok = report("synthetic shop tools (return_delivered_order_items)", rows, args.tasks)
    measured |= {r[0] for r in rows}

    print(f"\ndemo shop: {args.runs} scripted runs, most address changes left undone")
    with tempfile.TemporaryDirectory(prefix="tracegym-bench-") as tmp:
        from tracegym.store.importers import import_path

        runs = Path(tmp) / "runs.json"
        runs.write_text(json.dumps(demo_shop_runs(args.runs)))
        import_path("openai-chat", runs, Path(tmp) / "home")
        specs, why = analysed_specs(Path(tmp) / "home")
    if specs:
        rows = measure(specs, args.tasks, args.episodes)
        ok &= report("demo shop tools, gaps from `analyze` (update_address)", rows, args.tasks)
        measured |= {r[0] for r in rows}
    else:
        print(f"  {REQUESTED} not built: {why}")

    if not args.no_retail and RETAIL.is_dir():
        from tracegym.store.importers import import_path

        print("\nAgentRx tau-retail runs as recorded")
        with tempfile.TemporaryDirectory(prefix="tracegym-bench-") as tmp:
            home = Path(tmp)
            import_path("tau-bench", RETAIL / "tau_dataset_full.json", home)
            catalog = catalog_from_store(home)
            specs, why = analysed_specs(home)
            specs += list_specs(analyze(home, write=False), catalog, conventions_from_store(home))
        rows = measure(chain_specs(catalog, "exchange_delivered_order_items") + specs,
                       args.tasks, args.episodes)  # fmt: skip
        ok &= report("AgentRx tau-retail tools as recorded (exchange_delivered_order_items)",
                     rows, args.tasks)  # fmt: skip
        measured |= {r[0] for r in rows}
        if not specs:
            print(f"{REQUESTED:22s} not built: {why}")
    elif not args.no_retail:
        print(f"\n(skipped the retail tools: {RETAIL} is absent)")

    print("\nplanted agent, seed 9 (tests/fixtures/planted.py): the rule families")
    rows = measure(planted_specs(9), args.tasks, args.episodes)
    ok &= report("planted seed 9, gaps' mined rules", rows, args.tasks)
    measured |= {r[0] for r in rows}

    missing = [f for f in FAMILIES if f not in measured]
    if missing:
        print(f"\nnot measured: {', '.join(missing)}")
    ok &= not missing
    print(f"\ngoals (1,000 tasks < 1 s, a step < 1 ms, every family): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
