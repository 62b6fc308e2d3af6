"""Failure attribution on AgentRx tau-retail: the root-cause step and agent of each failed run.

    .venv/bin/python benchmarks/attribution_agentrx.py [--data PATH] [--no-detectors] [--show]

Imports `../shared/data/agentrx-tau-retail/tau_dataset_failed.json` with the human labels of
`tau_ground_truth.json` into a temporary home, attributes every failed run with
`tracegym.analysis.attribution` (with the default detectors' findings, fitted on the runs of
`tau_dataset_full.json` too so that they see successful runs, when
`tracegym.analysis.detectors.registry` exists; and without), and prints agent- and step-level
accuracy of the root cause beside baselines.

Gold: the failure `root_cause.failure_id` names; its `step_number` is 1-based, so the gold step is
`step_number - 1` (the importer's `step_index`, see docs/importers.md), and its `failed_agent`
(`Assistant` or `User`). An agent hit compares names case-insensitively (our single-agent runs
name the speaker by role: `assistant`, `user`); a step hit needs the same step index. The scorer
reads the gold from the imported outcome labels; the attribution code never does.

The rules were chosen by looking at even task ids only ("dev"); odd task ids are "held-out".
The system profile (boilerplate lines) is learnt from every run imported, without labels.
No published non-LLM numbers exist for this set; the baselines are here to compare against.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data" / "agentrx-tau-retail"


def load(data: Path, home: Path, with_full: bool) -> tuple[list[Any], list[Any]]:
    """(labelled failed runs, every run imported) from a fresh home."""
    from tracegym.analysis.runs import load_runs
    from tracegym.store.importers import import_path
    from tracegym.store.store import Store

    import_path(
        "tau-bench",
        data / "tau_dataset_failed.json",
        home,
        labels=data / "tau_ground_truth.json",
    )
    if with_full and (data / "tau_dataset_full.json").is_file():
        import_path("tau-bench", data / "tau_dataset_full.json", home)
    with Store(home) as store:
        runs = load_runs(store)
    labelled = [r for r in runs if r.failed and gold(r)[1] is not None]
    return labelled, runs


def gold(run: Any) -> tuple[str | None, int | None]:
    """(failed_agent, step_index) of the root-cause failure in the run's labels."""
    labels = run.labels or {}
    root = (labels.get("root_cause") or {}).get("failure_id")
    for failure in labels.get("failures") or []:
        if failure.get("failure_id") == root:
            return failure.get("failed_agent"), failure.get("step_index")
    return None, None


def agent_hit(predicted: str | None, expected: str | None) -> bool:
    return bool(predicted) and bool(expected) and str(expected).lower() in str(predicted).lower()


def task_id(run: Any) -> int:
    value = run.root.attributes.get("tracegym.source.task_id")
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


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


def detector_findings(runs: Sequence[Any]) -> tuple[dict[str, list[Any]] | None, str]:
    """Findings of the default detectors, fitted and run as `tracegym analyze` does."""
    from tracegym.analysis.pipeline import default_detector_set, run_detectors

    findings, errors = run_detectors(default_detector_set(), runs)
    note = f"{sum(len(f) for f in findings.values())} findings from the default detectors"
    failed = "; ".join(f"{name}: {error}" for name, error in errors.items())
    return findings, note + (f"; failed: {failed}" if failed else "")


def baselines() -> dict[str, Callable[[Any], tuple[str | None, int | None]]]:
    from tracegym.analysis.attribution import build_turns

    def agent_turns(run: Any) -> list[Any]:
        return [t for t in build_turns(run) if t.role == "assistant"]

    def first_assistant(run: Any) -> tuple[str | None, int | None]:
        t = agent_turns(run)
        return ("assistant", t[0].step) if t else ("assistant", None)

    def last_assistant(run: Any) -> tuple[str | None, int | None]:
        t = agent_turns(run)
        return ("assistant", t[-1].step) if t else ("assistant", None)

    def middle(run: Any) -> tuple[str | None, int | None]:
        t = agent_turns(run)
        return ("assistant", t[len(t) // 2].step) if t else ("assistant", None)

    def first_tool_error(run: Any) -> tuple[str | None, int | None]:
        turns = build_turns(run)
        for turn in turns:
            if turn.tool_result and turn.failed:
                caller = next(t for t in reversed(turns[: turn.index]) if t.role == "assistant")
                return ("assistant", caller.step)
        return last_assistant(run)

    return {
        "assistant, its first turn": first_assistant,
        "assistant, its middle turn": middle,
        "assistant, its last turn": last_assistant,
        "assistant, caller of the first tool error": first_tool_error,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--no-detectors", action="store_true")
    parser.add_argument("--show", action="store_true", help="print every prediction")
    args = parser.parse_args(argv)
    if not (args.data / "tau_dataset_failed.json").is_file():
        print(f"no data at {args.data}", file=sys.stderr)
        return 2
    from tracegym.analysis.attribution import attribute, learn_profiles, system_key

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as home:
        failed, everything = load(args.data.resolve(), Path(home), not args.no_detectors)
    splits = {
        "dev (even ids)": [r for r in failed if task_id(r) % 2 == 0],
        "held-out (odd)": [r for r in failed if task_id(r) % 2 == 1],
        "all": failed,
    }
    findings, note = (None, "detectors off") if args.no_detectors else detector_findings(everything)
    loaded = time.perf_counter()
    profiles = learn_profiles(everything)  # boilerplate and orchestrator, from every run

    def profile(run: Any) -> Any:
        return profiles.get(system_key(run))

    rules = {r.trace_id: attribute(r, profile=profile(r)) for r in failed}
    systems: dict[str, Callable[[Any], tuple[str | None, int | None]]] = {
        "tracegym rules": lambda r: (rules[r.trace_id].agent, rules[r.trace_id].step)
    }
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

    users = sum(1 for r in failed if str(gold(r)[0]).lower() == "user")
    print(f"AgentRx tau-retail: {len(failed)} labelled failed runs from {args.data} "
          f"(root cause by the user in {users})")  # fmt: skip
    print(f"({note}; import+load {loaded - started:.1f} s, attribution "
          f"{attributed - loaded:.2f} s)\n")  # fmt: skip
    names = list(splits)
    header = f"{'system':46}" + "".join(f"{n + f' n={len(splits[n])}':>22}" for n in names)
    print(header)
    print(f"{'':46}" + "".join(f"{'agent %  step %':>22}" for _ in names))
    print("-" * len(header))

    def row(label: str, predict: Callable[[Any], tuple[str | None, int | None]]) -> None:
        values = [score(splits[n], predict) for n in names]
        print(f"{label:46}" + "".join(f"{a:>13.2f}{s:>9.2f}" for a, s in values))

    for label, predict in systems.items():
        row(label, predict)
    for label, predict in baselines().items():
        row(f"baseline: {label}", predict)

    print("\nrules that decided (all runs):")
    by_rule: dict[str, list[Any]] = {}
    for run in failed:
        by_rule.setdefault(rules[run.trace_id].rule, []).append(run)
    for rule, members in sorted(by_rule.items(), key=lambda kv: -len(kv[1])):
        agent, step = score(members, systems["tracegym rules"])
        print(f"  {rule:20} n={len(members):3}  agent {agent:5.1f}%  step {step:5.1f}%")
    if args.show:
        print()
        for run in sorted(failed, key=task_id):
            a = rules[run.trace_id]
            gold_agent, gold_step = gold(run)
            mark = ("A" if agent_hit(a.agent, gold_agent) else "-") + (
                "S" if a.step == gold_step else "-"
            )
            print(f"{a.run:>8} {mark} gold {gold_agent}@{gold_step}  "
                  f"pred {a.agent}@{a.step} [{a.rule}] {a.reason[:100]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
