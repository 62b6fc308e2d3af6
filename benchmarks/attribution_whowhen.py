"""Failure attribution on Who&When (Algorithm-Generated half): agent- and step-level accuracy.

    .venv/bin/python benchmarks/attribution_whowhen.py [--data PATH] [--no-detectors]

Imports `../shared/data/whowhen-algorithm-generated` into a temporary home, attributes every
failed run with `tracegym.analysis.attribution` (with the default detectors' findings when
`tracegym.analysis.detectors.registry` exists, and without), and prints agent-level and
step-level accuracy beside the published GPT-4o numbers for this half and a few baselines.

Scoring follows the benchmark: an agent hit when the gold `mistake_agent` is a substring of the
predicted name; a step hit when the predicted step equals the gold `mistake_step` (0-based into
`history`, the same as our step index). The gold labels are read here, by the scorer, from the
imported outcome labels; the attribution code never reads them.

The rules were chosen by looking at the even-numbered files only ("dev"); the odd-numbered files
("held-out") were scored once the rules were fixed. Both halves and the whole are printed. The
system profile (boilerplate lines, orchestrator) is learnt from all the runs, without labels, as
`tracegym attribute` does. benchmarks/diagnosis_generalization.py puts this set next to the
others (AgenTracer, AgentRx) with exact and +-1 step accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "whowhen-algorithm-generated"

# Published accuracies on this half (GPT-4o, ground truth given): agent %, step %.
PUBLISHED = {
    "random": (29.10, 19.06),
    "all-at-once (GPT-4o)": (54.33, 12.50),
    "step-by-step (GPT-4o)": (35.20, 25.51),
    "binary search (GPT-4o)": (44.13, 23.98),
}


def load(data: Path, home: Path) -> tuple[list[Any], dict[str, str]]:
    """The imported runs, and question id -> file stem (to split and to name runs)."""
    from tracegym.analysis.runs import load_runs
    from tracegym.store.importers import import_path
    from tracegym.store.store import Store

    import_path("whowhen", data, home)
    with Store(home) as store:
        runs = load_runs(store)
    stems = {}
    for file in sorted(data.glob("*.json")):
        doc = json.loads(file.read_text())
        stems[str(doc.get("question_ID"))] = file.stem
    return runs, stems


def detector_findings(runs: Sequence[Any]) -> tuple[dict[str, list[Any]] | None, str]:
    """Findings of the default detectors, fitted and run as `tracegym analyze` does."""
    from tracegym.analysis.pipeline import default_detector_set, run_detectors

    findings, errors = run_detectors(default_detector_set(), runs)
    note = f"{sum(len(f) for f in findings.values())} findings from the default detectors"
    failed = "; ".join(f"{name}: {error}" for name, error in errors.items())
    return findings, note + (f"; failed: {failed}" if failed else "")


def gold(run: Any) -> tuple[str | None, int | None]:
    labels = run.labels or {}
    return labels.get("mistake_agent"), labels.get("mistake_step_index")


def agent_hit(predicted: str | None, expected: str | None) -> bool:
    return bool(predicted) and bool(expected) and str(expected) in str(predicted)


def score(
    runs: Sequence[Any], predict: Callable[[Any], tuple[str | None, int | None]]
) -> tuple[float, float]:
    agents = steps = 0
    for run in runs:
        agent, step = predict(run)
        gold_agent, gold_step = gold(run)
        agents += agent_hit(agent, gold_agent)
        steps += step is not None and step == gold_step
    return 100 * agents / len(runs), 100 * steps / len(runs)


def random_expectation(runs: Sequence[Any]) -> tuple[float, float]:
    """Expected accuracy of picking an agent and a step uniformly at random."""
    agents = steps = 0.0
    for run in runs:
        turns = [s for s in run.steps if s.step_index is not None]
        names = {s.agent for s in turns}
        gold_agent, gold_step = gold(run)
        agents += (gold_agent in names) / max(1, len(names))
        steps += (gold_step is not None and gold_step < len(turns)) / max(1, len(turns))
    return 100 * agents / len(runs), 100 * steps / len(runs)


def baselines(runs: Sequence[Any]) -> dict[str, Callable[[Any], tuple[str | None, int | None]]]:
    from tracegym.analysis.attribution import build_turns

    def turns(run: Any) -> list[Any]:
        return build_turns(run)

    def opening(run: Any) -> tuple[str | None, int | None]:
        t = turns(run)
        return (t[0].agent, t[0].step) if t else (None, None)

    def first_after_opening(run: Any) -> tuple[str | None, int | None]:
        t = [x for x in turns(run)[1:] if not x.execution]
        return (t[0].agent, t[0].step) if t else opening(run)

    def step_one(run: Any) -> tuple[str | None, int | None]:
        t = turns(run)
        return (t[1].agent, t[1].step) if len(t) > 1 else opening(run)

    def most_frequent(run: Any) -> tuple[str | None, int | None]:
        t = [x for x in turns(run) if not x.execution]
        if not t:
            return (None, None)
        name = Counter(x.agent for x in t).most_common(1)[0][0]
        return (name, next(x.step for x in t if x.agent == name))

    return {
        "opening agent, step 0": opening,
        "step 1 (its speaker)": step_one,
        "first non-executor step after 0": first_after_opening,
        "most frequent agent (its first step)": most_frequent,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--no-detectors", action="store_true")
    parser.add_argument("--show", action="store_true", help="print every prediction")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"no data at {args.data}", file=sys.stderr)
        return 2
    from tracegym.analysis.attribution import attribute, learn_profiles, system_key

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as home:
        runs, stems = load(args.data.resolve(), Path(home))
    failed = [r for r in runs if r.failed and gold(r)[0] is not None]

    def stem(run: Any) -> str:
        return stems.get(str(run.root.attributes.get("tracegym.source.question_id")), "")

    splits = {
        "dev (even files)": [r for r in failed if stem(r).isdigit() and int(stem(r)) % 2 == 0],
        "held-out (odd)": [r for r in failed if stem(r).isdigit() and int(stem(r)) % 2 == 1],
        "all": failed,
    }
    findings, note = (None, "detectors off") if args.no_detectors else detector_findings(runs)
    loaded = time.perf_counter()

    profiles = learn_profiles(runs)  # boilerplate and orchestrator, from every run

    def profile(run: Any) -> Any:
        return profiles.get(system_key(run))

    rules = {r.trace_id: attribute(r, profile=profile(r)) for r in failed}
    systems: dict[str, Callable[[Any], tuple[str | None, int | None]]] = {
        "tracegym rules": lambda r: (rules[r.trace_id].agent, rules[r.trace_id].step)
    }
    with_findings = None
    if findings is not None:
        with_findings = {
            r.trace_id: attribute(r, findings.get(r.trace_id, ()), profile=profile(r))
            for r in failed
        }
        systems["tracegym rules + detectors"] = lambda r: (
            with_findings[r.trace_id].agent,
            with_findings[r.trace_id].step,
        )
    attributed = time.perf_counter()

    print(f"Who&When Algorithm-Generated: {len(failed)} failed runs from {args.data}")
    print(f"({note}; import+load {loaded - started:.1f} s, attribution "
          f"{attributed - loaded:.2f} s)\n")  # fmt: skip
    names = list(splits)
    header = f"{'system':44}" + "".join(f"{n:>22}" for n in names)
    print(header)
    print(f"{'':44}" + "".join(f"{'agent %  step %':>22}" for _ in names))
    print("-" * len(header))

    def row(label: str, values: list[tuple[float, float]]) -> None:
        print(f"{label:44}" + "".join(f"{a:>13.2f}{s:>9.2f}" for a, s in values))

    for label, predict in systems.items():
        row(label, [score(splits[n], predict) for n in names])
    for label, predict in baselines(failed).items():
        row(f"baseline: {label}", [score(splits[n], predict) for n in names])
    row("baseline: random (expected)", [random_expectation(splits[n]) for n in names])
    print()
    for label, (agent, step) in PUBLISHED.items():
        print(f"{'published: ' + label:44}{agent:>13.2f}{step:>9.2f}   (all 126)")

    print("\nrules that decided (all runs): hits agent / step of n")
    by_rule: dict[str, list[Any]] = {}
    for run in failed:
        by_rule.setdefault(rules[run.trace_id].rule, []).append(run)
    for rule, members in sorted(by_rule.items(), key=lambda kv: -len(kv[1])):
        agent, step = score(members, systems["tracegym rules"])
        print(f"  {rule:20} n={len(members):3}  agent {agent:5.1f}%  step {step:5.1f}%")
    if args.show:
        print()
        for run in sorted(failed, key=lambda r: int(stem(r) or 0)):
            a = rules[run.trace_id]
            gold_agent, gold_step = gold(run)
            mark = ("A" if agent_hit(a.agent, gold_agent) else "-") + (
                "S" if a.step == gold_step else "-"
            )
            print(f"{stem(run):>4} {mark} gold {gold_agent}@{gold_step}  "
                  f"pred {a.agent}@{a.step} [{a.rule}] {a.reason[:110]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
