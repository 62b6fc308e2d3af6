"""Failure attribution across systems: every labelled set, tuned and untuned splits, baselines.

    .venv/bin/python benchmarks/diagnosis_generalization.py [--data DIR] [--no-detectors] [--show]

For each labelled set under `../shared/data` (skipped with a note when absent):

- Who&When Algorithm-Generated (CaptainAgent teams, 126 failed runs): split by file number,
  even = tuning (the rules were chosen looking at these), odd = untuned;
- AgenTracer TracerTraj-code (MetaGPT teams, 127 failed runs): split by a hash of the run's
  `question_ID` (sha256, even = tuning); the handover and prompt-template rules were chosen
  looking at the tuning half only, the other half was scored once they were fixed;
- AgentRx tau-retail (one tool-calling agent, 29 labelled failures): task id even = tuning;
- planted causes (tests/fixtures/planted.py, generated single agents): seeds 0-9 = tuning,
  seeds 100-119 = untuned; gold step = the planted cause's decisive span (noise failures,
  which have none, are not scored); detectors are fitted per seed's store.

it prints tracegym's attribution next to baselines computed in the same run (first non-human
speaker at its first step, most common agent at its first step, first error, last step, random
expected), as agent accuracy and step accuracy, exact and within +-1 step. `tracegym` is the
full rule set with each system's profile (boilerplate, orchestrator) learnt from that set's own
runs (label-free); `tracegym, Who&When-tuned` is the rule set without system profiles, i.e. the
rules as tuned on Who&When before the second system was seen, which makes its AgenTracer
columns the cross-system number (rules tuned on one system, reported on another).

The AgenTracer data is research data without a licence: it is read from the shared folder, never
copied. Its ids and file names contain the word "attacked" (the authors' fault injection); the
attribution never reads ids, and this benchmark checks it: every run is attributed again with
that word scrubbed from all text, and any difference is reported.

Scoring follows Who&When: an agent hit when the gold agent is a substring of the predicted name
(case-insensitive), a step hit when the predicted step equals the gold step index (0-based into
the source's history / traj; see docs/importers.md).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"
AGENTRACER_FILE = "agentracer-tracertraj-code/tracertraj-code-test.json"

Predict = Callable[[Any], tuple[str | None, int | None]]


@dataclass
class LabelledSet:
    name: str
    runs: list[Any]  # every run imported (profiles and detectors see them all)
    labelled: list[Any]  # failed runs with gold labels
    gold: Callable[[Any], tuple[str | None, int | None]]
    splits: dict[str, list[Any]]  # split name -> runs; the tuning split's name says so
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# Loading -----------------------------------------------------------------------------------------


def _import(fmt: str, path: Path, home: Path, **kwargs: Any) -> list[Any]:
    from tracegym.analysis.runs import load_runs
    from tracegym.store.importers import FORMATS, import_path
    from tracegym.store.store import Store

    # until store/importers/__init__.py registers it
    FORMATS.setdefault("agentracer", ("tracegym.store.importers.agentracer", (".json",)))
    import_path(fmt, path, home, **kwargs)
    with Store(home) as store:
        return load_runs(store)


def _source(run: Any, name: str) -> Any:
    return run.root.attributes.get(f"tracegym.source.{name}") if run.root is not None else None


def whowhen_gold(run: Any) -> tuple[str | None, int | None]:
    labels = run.labels or {}
    return labels.get("mistake_agent"), labels.get("mistake_step_index")


def agentrx_gold(run: Any) -> tuple[str | None, int | None]:
    labels = run.labels or {}
    root = (labels.get("root_cause") or {}).get("failure_id")
    for failure in labels.get("failures") or []:
        if failure.get("failure_id") == root:
            return failure.get("failed_agent"), failure.get("step_index")
    return None, None


def tuning_half(question_id: str) -> bool:
    """AgenTracer's tuning half: sha256 of the question id is even."""
    return int(hashlib.sha256(question_id.encode()).hexdigest(), 16) % 2 == 0


def load_whowhen(data: Path, home: Path) -> LabelledSet | None:
    folder = data / "whowhen-algorithm-generated"
    if not folder.is_dir():
        return None
    runs = _import("whowhen", folder, home)
    labelled = [r for r in runs if r.failed and whowhen_gold(r)[1] is not None]

    def number(run: Any) -> int:
        stem = str(_source(run, "file") or "")
        return int(stem) if stem.isdigit() else -1

    return LabelledSet(
        "Who&When Algorithm-Generated (CaptainAgent)",
        runs,
        labelled,
        whowhen_gold,
        {
            "even files (tuning)": [r for r in labelled if number(r) % 2 == 0],
            "odd files (untuned)": [r for r in labelled if number(r) % 2 == 1],
            "all": labelled,
        },
    )


def load_agentracer(data: Path, home: Path) -> LabelledSet | None:
    path = data / AGENTRACER_FILE
    if not path.is_file():
        return None
    runs = _import("agentracer", path, home)
    labelled = [r for r in runs if r.failed and whowhen_gold(r)[1] is not None]

    def tuning(run: Any) -> bool:
        return tuning_half(str(_source(run, "question_id") or ""))

    return LabelledSet(
        "AgenTracer TracerTraj-code (MetaGPT)",
        runs,
        labelled,
        whowhen_gold,
        {
            "hash-even half (tuning)": [r for r in labelled if tuning(r)],
            "hash-odd half (untuned)": [r for r in labelled if not tuning(r)],
            "all": labelled,
        },
    )


def load_agentrx(data: Path, home: Path) -> LabelledSet | None:
    folder = data / "agentrx-tau-retail"
    if not (folder / "tau_dataset_failed.json").is_file():
        return None
    runs = _import(
        "tau-bench",
        folder / "tau_dataset_failed.json",
        home,
        labels=folder / "tau_ground_truth.json",
    )
    labelled = [r for r in runs if r.failed and agentrx_gold(r)[1] is not None]

    def task(run: Any) -> int:
        try:
            return int(_source(run, "task_id"))
        except (TypeError, ValueError):
            return -1

    return LabelledSet(
        "AgentRx tau-retail (one tool-calling agent)",
        runs,
        labelled,
        agentrx_gold,
        {
            "even task ids (tuning)": [r for r in labelled if task(r) % 2 == 0],
            "odd task ids (untuned)": [r for r in labelled if task(r) % 2 == 1],
            "all": labelled,
        },
    )


PLANTED_TUNING = tuple(range(10))
PLANTED_REPORTING = tuple(range(100, 120))


def load_planted(data: Path, home: Path) -> LabelledSet | None:
    """Generated single agents with planted causes (tests/fixtures/planted.py): each failed
    run of a planted cause has a known decisive span; noise failures have none and are not
    scored. One store per seed; detectors are fitted per seed (`extra["groups"]`)."""
    from tracegym.analysis.runs import load_runs
    from tracegym.store.store import Store
    from tracegym.tests.fixtures.planted import generate

    del data  # generated, not read
    runs: list[Any] = []
    groups: list[list[Any]] = []
    gold: dict[str, tuple[str | None, int | None]] = {}
    tuning: set[str] = set()
    for seed in (*PLANTED_TUNING, *PLANTED_REPORTING):
        planted = generate(home / f"planted-{seed}", seed)
        with Store(home / f"planted-{seed}") as store:
            loaded = load_runs(store)
        by_trace = {r.trace_id: r for r in loaded}
        for truth in planted.runs:
            run = by_trace.get(truth.trace_id)
            if run is None or truth.decisive_span_id is None:
                continue
            step = run.by_span().get(truth.decisive_span_id)
            gold[run.trace_id] = (step.agent if step else None, step.step_index if step else None)
            if seed in PLANTED_TUNING:
                tuning.add(run.trace_id)
        runs += loaded
        groups.append(loaded)
    labelled = [r for r in runs if r.trace_id in gold]
    return LabelledSet(
        "Planted causes (generated single agents)",
        runs,
        labelled,
        lambda run: gold.get(run.trace_id, (None, None)),
        {
            f"seeds {PLANTED_TUNING[0]}-{PLANTED_TUNING[-1]} (tuning)": [
                r for r in labelled if r.trace_id in tuning
            ],
            f"seeds {PLANTED_REPORTING[0]}-{PLANTED_REPORTING[-1]} (untuned)": [
                r for r in labelled if r.trace_id not in tuning
            ],
        },
        note="one agent per run, so agent accuracy is trivial; step = the planted decisive span",
        extra={"groups": groups},
    )


# Scoring -----------------------------------------------------------------------------------------


def agent_hit(predicted: str | None, expected: str | None) -> bool:
    return bool(predicted) and bool(expected) and str(expected).lower() in str(predicted).lower()


def score(
    runs: Sequence[Any], predict: Predict, gold: Callable[[Any], Any]
) -> tuple[float, float, float]:
    """(agent %, step %, step within +-1 %)."""
    if not runs:
        return (float("nan"),) * 3
    agents = steps = near = 0
    for run in runs:
        agent, step = predict(run)
        gold_agent, gold_step = gold(run)
        agents += agent_hit(agent, gold_agent)
        steps += step is not None and step == gold_step
        near += step is not None and gold_step is not None and abs(step - gold_step) <= 1
    n = len(runs)
    return 100 * agents / n, 100 * steps / n, 100 * near / n


def random_expectation(runs: Sequence[Any], gold: Callable[[Any], Any]) -> tuple[float, ...]:
    """Expected accuracy of a uniformly random speaker and a uniformly random step."""
    from tracegym.analysis.attribution import build_turns

    if not runs:
        return (float("nan"),) * 3
    agents = steps = near = 0.0
    for run in runs:
        turns = build_turns(run)
        names = {t.agent for t in turns if t.agent}
        gold_agent, gold_step = gold(run)
        agents += sum(agent_hit(n, gold_agent) for n in names) / max(1, len(names))
        indexes = [t.step for t in turns]
        if gold_step is not None and indexes:
            steps += indexes.count(gold_step) / len(indexes)
            near += sum(abs(i - gold_step) <= 1 for i in indexes) / len(indexes)
    n = len(runs)
    return 100 * agents / n, 100 * steps / n, 100 * near / n


def baselines() -> dict[str, Predict]:
    from tracegym.analysis.attribution import _author, _context

    contexts: dict[str, Any] = {}

    def context(run: Any) -> Any:  # each run's turns are built once for all the baselines
        if run.trace_id not in contexts:
            contexts[run.trace_id] = _context(run)
        return contexts[run.trace_id]

    def speakers(run: Any) -> list[Any]:
        ctx = context(run)
        return [t for t in ctx.turns if not t.execution and not ctx.requester(t)
                and t.role != "system"]  # fmt: skip

    def first_speaker(run: Any) -> tuple[str | None, int | None]:
        turns = speakers(run)
        return (turns[0].agent, turns[0].step) if turns else (None, None)

    def most_common(run: Any) -> tuple[str | None, int | None]:
        turns = speakers(run)
        if not turns:
            return (None, None)
        name = Counter(t.agent for t in turns).most_common(1)[0][0]
        return (name, next(t.step for t in turns if t.agent == name))

    def last_step(run: Any) -> tuple[str | None, int | None]:
        turns = speakers(run)
        return (turns[-1].agent, turns[-1].step) if turns else (None, None)

    def first_error(run: Any) -> tuple[str | None, int | None]:
        ctx = context(run)
        for turn in ctx.turns:
            if turn.execution and turn.failed:
                author = _author(ctx.turns, turn) or turn
                return (author.agent, author.step)
        return last_step(run)

    return {
        "first non-human speaker, its first step": first_speaker,
        "most common agent, its first step": most_common,
        "first error (its author; else last step)": first_error,
        "last step": last_step,
    }


# The run ------------------------------------------------------------------------------------------


def detector_findings(runs: Sequence[Any]) -> tuple[dict[str, list[Any]], str]:
    from tracegym.analysis.pipeline import default_detector_set, run_detectors

    findings, errors = run_detectors(default_detector_set(), runs)
    failed = "; ".join(f"{name}: {error}" for name, error in errors.items())
    return findings, f"{sum(len(f) for f in findings.values())} findings" + (
        f"; failed: {failed}" if failed else ""
    )


def _scrubbed(runs: Sequence[Any], word: str) -> list[Any]:
    """Deep copies of `runs` with `word` (any case) removed from every text field."""
    import re

    pattern = re.compile(re.escape(word), re.IGNORECASE)
    out = copy.deepcopy(list(runs))
    for run in out:
        for step in run.steps:
            step.input = pattern.sub("", step.input) if step.input else step.input
            step.output = pattern.sub("", step.output) if step.output else step.output
            step.attributes = {
                k: pattern.sub("", v) if isinstance(v, str) else v
                for k, v in step.attributes.items()
            }
    return out


def evaluate(labelled: LabelledSet, findings: dict[str, list[Any]] | None) -> dict[str, Any]:
    from tracegym.analysis.attribution import attribute, attribute_runs, learn_profiles

    profiles = learn_profiles(labelled.runs)
    full = {a.trace_id: a for a in attribute_runs(labelled.runs, profiles=profiles)}
    bare = {r.trace_id: attribute(r) for r in labelled.labelled}
    systems: dict[str, Predict] = {
        "tracegym": lambda r: (full[r.trace_id].agent, full[r.trace_id].step),
        "tracegym, Who&When-tuned (no system profile)": lambda r: (
            bare[r.trace_id].agent,
            bare[r.trace_id].step,
        ),
    }
    if findings is not None:
        with_findings = {
            a.trace_id: a for a in attribute_runs(labelled.runs, findings, profiles=profiles)
        }
        systems["tracegym + detectors"] = lambda r: (
            with_findings[r.trace_id].agent,
            with_findings[r.trace_id].step,
        )
    return {"systems": systems, "full": full, "profiles": profiles}


def print_table(labelled: LabelledSet, systems: dict[str, Predict]) -> None:
    names = list(labelled.splits)
    width = 50
    head = f"{'':{width}}" + "".join(f"{n + f' n={len(labelled.splits[n])}':>31}" for n in names)
    print(head)
    print(f"{'':{width}}" + "".join(f"{'agent  step  step+-1':>31}" for _ in names))
    print("-" * len(head))

    def row(label: str, values: list[tuple[float, ...]]) -> None:
        print(f"{label:{width}}" + "".join(f"{a:>17.1f}{s:>6.1f}{n:>8.1f}" for a, s, n in values))

    for label, predict in systems.items():
        row(label, [score(labelled.splits[n], predict, labelled.gold) for n in names])
    for label, predict in baselines().items():
        row(f"baseline: {label}", [score(labelled.splits[n], predict, labelled.gold)
                                   for n in names])  # fmt: skip
    row("baseline: random (expected)",
        [random_expectation(labelled.splits[n], labelled.gold) for n in names])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--no-detectors", action="store_true")
    parser.add_argument("--show", action="store_true", help="print every tuning-split prediction")
    args = parser.parse_args(argv)
    data = args.data.resolve()
    started = time.perf_counter()
    loaders = (load_whowhen, load_agentracer, load_agentrx, load_planted)
    sets: list[LabelledSet] = []
    for loader in loaders:
        with tempfile.TemporaryDirectory() as home:
            loaded = loader(data, Path(home))
        if loaded is None:
            print(f"skipped {loader.__name__[5:]}: its data is not under {data}\n")
            continue
        sets.append(loaded)
    if not sets:
        print(f"no labelled data under {data}", file=sys.stderr)
        return 2
    loaded_at = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    for labelled in sets:
        findings, note = (None, "detectors off")
        if not args.no_detectors:
            groups = labelled.extra.get("groups") or [labelled.runs]
            findings, notes = {}, []
            for group in groups:  # detectors learn from one system's runs at a time
                found, note = detector_findings(group)
                findings.update(found)
                notes.append(note)
            note = (
                notes[0]
                if len(notes) == 1
                else (f"{sum(len(f) for f in findings.values())} findings in {len(notes)} stores")
            )
        result = evaluate(labelled, findings)
        results[labelled.name] = result
        profile = next(iter(result["profiles"].values()))
        print(f"== {labelled.name}: {len(labelled.labelled)} labelled failed runs ({note}; "
              f"profile: {len(profile.boilerplate)} boilerplate lines, orchestrator "
              f"{profile.orchestrator!r})")  # fmt: skip
        print_table(labelled, result["systems"])
        rules = Counter(a.rule for a in result["full"].values())
        print("rules that decided (tracegym, all runs): "
              + ", ".join(f"{k} {v}" for k, v in rules.most_common()))  # fmt: skip
        print()
        if args.show:
            tuning = next(n for n in labelled.splits if "(tuning)" in n)
            for run in labelled.splits[tuning]:
                a = result["full"][run.trace_id]
                gold_agent, gold_step = labelled.gold(run)
                mark = ("A" if agent_hit(a.agent, gold_agent) else "-") + (
                    "S" if a.step == gold_step else "-"
                )
                print(f"  {a.run[:22]:22} {mark} gold {gold_agent}@{gold_step}  "
                      f"pred {a.agent}@{a.step} [{a.rule}] {a.reason[:90]}")  # fmt: skip
            print()
    attributed_at = time.perf_counter()

    print("== Across systems (exact accuracy, agent % / step %)")
    by_name = {s.name: s for s in sets}
    ww = by_name.get("Who&When Algorithm-Generated (CaptainAgent)")
    at = by_name.get("AgenTracer TracerTraj-code (MetaGPT)")

    def cell(labelled: LabelledSet, system: str, split: str) -> str:
        predict = results[labelled.name]["systems"][system]
        agent, step, near = score(labelled.splits[split], predict, labelled.gold)
        return f"{agent:5.1f} / {step:5.1f}  (+-1: {near:5.1f})"

    if at is not None:
        print(
            "  rules tuned on Who&When only, on AgenTracer (all 127, unseen system):  "
            + cell(at, "tracegym, Who&When-tuned (no system profile)", "all")
        )
        print(
            "  rules tuned on Who&When even + AgenTracer tuning half, on AgenTracer's "
            "untuned half:  " + cell(at, "tracegym", "hash-odd half (untuned)")
        )
    if ww is not None:
        print(
            "  the same rules on Who&When's untuned odd files:  "
            + cell(ww, "tracegym", "odd files (untuned)")
        )
    if at is not None:
        agent, step, _ = score(at.splits["hash-odd half (untuned)"],
                               results[at.name]["systems"]["tracegym"], at.gold)  # fmt: skip
        print(f"  goal on a held-out system, agent >= 70 and step >= 30: agent {agent:.1f} "
              f"{'met' if agent >= 70 else 'MISSED'}, step {step:.1f} "
              f"{'met' if step >= 30 else 'MISSED'}")  # fmt: skip
    if ww is not None:
        _, step, _ = score(ww.splits["odd files (untuned)"],
                           results[ww.name]["systems"]["tracegym"], ww.gold)  # fmt: skip
        print(f"  goal on Who&When's untuned files, step >= 46: step {step:.1f} "
              f"{'met' if step >= 46 else 'MISSED'}")  # fmt: skip
    if at is not None:
        from tracegym.analysis.attribution import attribute_runs

        scrubbed = {a.trace_id: a for a in attribute_runs(_scrubbed(at.runs, "attacked"))}
        full = results[at.name]["full"]
        changed = sum(
            1
            for t, a in full.items()
            if (a.agent, a.step, a.rule) != (scrubbed[t].agent, scrubbed[t].step, scrubbed[t].rule)
        )
        print(f"  label-leak check: {changed} of {len(full)} AgenTracer attributions change when "
              "the word 'attacked' is scrubbed from every text")  # fmt: skip
    print(
        f"\n(load {loaded_at - started:.1f} s, attribution and baselines "
        f"{attributed_at - loaded_at:.1f} s, total {time.perf_counter() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
