"""Do the state and argument detectors find what real agents got wrong?

    .venv/bin/python benchmarks/detectors_real.py [--data ../shared/data] [--json FILE] [--show N]

Runs `forbidden_action`, `missed_action`, `missed_request`, `wrong_amount`, `wrong_list`,
`unknown_value` and the error-named `wrong_tool_order` findings (the state and argument detectors)
on real tau-bench-style runs of agents nobody here wrote, each detector fitted on the set's own
runs exactly as `tracegym analyze` fits it (from the successful runs; no labels), and scores their
findings on the failed runs against what the benchmark itself says went wrong -- used here only,
never by a detector:

(`unserved_request`, the older detector of an action never taken, is scored alongside, to
compare with `missed_action`; so is the opt-in `missed_write`, a write every successful run of the
same request kind makes, with two baselines of its own: every failed run that made no write,
naming the write successful runs make most often, overall or among those of its request kind.
`missed_write`'s parameters were chosen on tau2-bench only; grok-3 and all of AgentRx are its
reported sets.)

- tau2-bench (retail, telecom): `reward_info.action_checks`, the expected actions and whether
  the run matched each;
- tau-bench (grok-3 retail, AgentRx retail): `info.task.actions`, the expected actions with
  their arguments; an expected action is matched when the run made a call of that tool with
  the same arguments (JSON-equal after case and whitespace normalisation).

A finding naming tool T in a failed run is a *hit* when the run has an expected T it did not match,
or (for the findings about an action taken: forbidden_action, wrong_amount, wrong_list,
unknown_value, wrong_tool_order) when T is not among the run's expected actions at all (an action
the task did not want). Per detector: findings and runs on failed runs, hits (precision), failed
runs with a hit among the failed runs with something to hit (an expected action not matched, or a
write not expected: recall), and runs with a finding among the successful runs (where, apart from
refused attempts, every finding is a false alarm). Baselines in the same run, scored the same way:
every write call of a failed run, the first write of each failed run, every write call that failed.

Splits. The detectors' rules and thresholds (the chance bound and field presence of
forbidden_action, one record per observed state, the list relations, the linking of a write to the
reads it acts on) were chosen while looking at tau2-bench retail and, for the linking of a write to
several reads, at tau2-bench telecom; the per-file tables of tau2-bench showed the address-field
rules that made failed runs' evidence a Fisher test over at least 3 records: tau2-bench numbers are
*development* numbers. forbidden_action's use of failed runs' records and its 5-record minimum for
thresholds were chosen on planted tuning seeds (4 and 7 of 0-9); unknown_value's limits were set
before it first ran, on tau2 retail; missed_request's condition on runs that made another write was
found by looking at planted seed 100 (a reporting seed) and checked on tuning seeds 3 and 5, so its
planted never_called numbers are not untuned. No rule or threshold was changed on account of
tau-bench grok-3 retail or AgentRx tau-retail (their numbers were printed after each change, never
used to choose one): those are the *reported* numbers. AgentRx's annotated root-cause categories
are printed next to each detector's failed runs. grok-3's outcome is its
`reward_info.components.base_success` (the file's `reward` is a composite with an efficiency
penalty, which `tracegym import tau-bench` reads as the outcome today): the benchmark sets it
before fitting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"
ACTION_FINDINGS = (
    "forbidden_action", "wrong_amount", "wrong_list", "unknown_value", "wrong_tool_order",
    "wrong_choice",
)  # fmt: skip


@dataclass
class Expected:
    """What the benchmark expected of one run: action name -> matched (any call matched it)."""

    actions: dict[str, bool]

    def wrong(self, tool: str) -> bool:
        return self.actions.get(tool) is False

    def unwanted(self, tool: str) -> bool:
        return tool not in self.actions


@dataclass
class Score:
    name: str
    findings: int = 0
    runs: int = 0
    hits: int = 0
    hit_runs: int = 0
    success_runs: int = 0
    examples: list[str] = field(default_factory=list)

    def line(self, wrong_runs: int) -> str:
        precision = f"{self.hits / self.findings:.2f}" if self.findings else "-"
        recall = f"{self.hit_runs / wrong_runs:.2f}" if wrong_runs else "-"
        return (
            f"  {self.name:<34} findings {self.findings:>4} in {self.runs:>3} failed runs  "
            f"hits {self.hits:>4} (precision {precision})  runs with a hit {self.hit_runs:>3}/"
            f"{wrong_runs} (recall {recall})  successful runs flagged {self.success_runs}"
        )


# Loading ---------------------------------------------------------------------------------------
def _load(fmt: str, path: Path, cache: Path) -> list[Any]:
    from tracegym.analysis.runs import load_runs
    from tracegym.store.importers import import_path
    from tracegym.store.store import Store

    home = cache / re.sub(r"\W+", "_", f"{fmt}_{path.name}")
    if not (home / "imports").is_dir():
        import_path(fmt, path, home)
    with Store(home) as store:
        return load_runs(store)


def _source(run: Any, name: str) -> Any:
    return run.root.attributes.get(f"tracegym.source.{name}") if run.root is not None else None


def _norm(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, str):
        return " ".join(value.casefold().split())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def tau2_expected(run: Any) -> Expected | None:
    info = _source(run, "reward_info")
    info = json.loads(info) if isinstance(info, str) else info
    if not isinstance(info, dict):
        return None
    actions: dict[str, bool] = {}
    for check in info.get("action_checks") or []:
        name = (check.get("action") or {}).get("name")
        if name:
            actions[name] = actions.get(name, True) and bool(check.get("action_match"))
    return Expected(actions)


def tau_expected(
    raw: dict[tuple[str, str], list[dict[str, Any]]],
) -> Callable[[Any], Expected | None]:
    """Expected actions of a tau-bench run from its raw record, matched against its calls."""
    from tracegym.analysis.runs import parse_json

    def expected(run: Any) -> Expected | None:
        found = raw.get((str(_source(run, "task_id")), str(_source(run, "trial"))))
        if not found or len(found) != 1:
            return None  # missing or ambiguous
        calls = [(s.tool, _norm(parse_json(s.input))) for s in run.tool_calls()]
        actions: dict[str, bool] = {}
        for action in (found[0].get("info") or {}).get("task", {}).get("actions") or []:
            name = action.get("name")
            if not name:
                continue
            matched = (name, _norm(action.get("kwargs") or {})) in calls
            actions[name] = actions.get(name, True) and matched
        return Expected(actions)

    return expected


def _raw_tau(path: Path) -> dict[tuple[str, str], list[dict[str, Any]]]:
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for run in json.loads(path.read_text()):
        by_key[str(run.get("task_id")), str(run.get("trial"))].append(run)
    return by_key


# Scoring ---------------------------------------------------------------------------------------
def _counted(detector: str, finding: Any) -> bool:
    """The findings scored: all, except wrong_tool_order's mined-order ones (not this issue's)."""
    return detector != "wrong_tool_order" or bool(finding.details.get("error_names_fix"))


def _tool_of(finding: Any) -> str | None:
    details = finding.details
    return details.get("tool") or details.get("after")


def score_set(
    name: str,
    runs: Sequence[Any],
    expected: Callable[[Any], Expected | None],
    show: int,
    brief: bool = False,
    only: Callable[[Any], bool] | None = None,
) -> dict[str, Any]:
    """Fit the detectors on `runs`, score them and the baselines, print the table (`brief`:
    only detectors with findings, and the every-write baseline; `only`: score just the runs it
    keeps, the detectors still fitted on all of `runs`, as `analyze` fits them)."""
    from tracegym.analysis.detectors.amounts import WrongAmount
    from tracegym.analysis.detectors.choice import WrongChoice
    from tracegym.analysis.detectors.list_args import WrongListArgument
    from tracegym.analysis.detectors.missed_action import MissedAction
    from tracegym.analysis.detectors.missed_request import MissedRequest
    from tracegym.analysis.detectors.missed_write import MissedWrite, written
    from tracegym.analysis.detectors.precondition import ForbiddenAction
    from tracegym.analysis.detectors.state import is_write
    from tracegym.analysis.detectors.tool_order import WrongToolOrder
    from tracegym.analysis.detectors.unserved import UnservedRequest
    from tracegym.analysis.detectors.vocabulary import UnknownValue

    detectors = [d.fit(runs) for d in (ForbiddenAction(), MissedAction(), WrongAmount(),
                                       WrongListArgument(), UnknownValue(),
                                       WrongToolOrder(), MissedRequest(),
                                       UnservedRequest(), WrongChoice(),
                                       MissedWrite())]  # fmt: skip
    scored = [r for r in runs if only is None or only(r)]
    failed = [r for r in scored if r.success is False]
    labelled = [(r, expected(r)) for r in failed]
    labelled = [(r, e) for r, e in labelled if e is not None]
    wrong_runs = sum(
        1
        for r, e in labelled
        if any(not m for m in e.actions.values())
        or any(e.unwanted(s.tool or s.name) for s in r.steps if is_write(s))
    )
    print(f"\n{name}: {len(scored)} runs, {len(failed)} failed ({len(labelled)} with expected "
          f"actions; {wrong_runs} with an expected action not matched or a write not "
          "expected)")  # fmt: skip
    scores: list[Score] = []

    def hit(detector: str, tool: str, exp: Expected) -> bool:
        return exp.wrong(tool) or (detector in ACTION_FINDINGS and exp.unwanted(tool))

    for detector in detectors:
        score = Score(detector.name)
        for run, exp in labelled:
            findings = [f for f in detector.detect(run) if _counted(detector.name, f)]
            if not findings:
                continue
            score.runs += 1
            hits = [hit(detector.name, _tool_of(f) or "", exp) for f in findings]
            score.findings += len(findings)
            score.hits += sum(hits)
            score.hit_runs += any(hits)
            for f, h in zip(findings, hits, strict=True):
                if len(score.examples) < show:
                    score.examples.append(f"{'HIT ' if h else 'MISS'} {run.run_id}: {f.message}")
        for run in scored:
            flagged = any(_counted(detector.name, f) for f in detector.detect(run))
            score.success_runs += run.success is True and flagged
        if detector.name == "wrong_tool_order":
            score.name = "wrong_tool_order (error names fix)"
        scores.append(score)

    for base, pick in (
        ("baseline: every write", lambda steps: steps),
        ("baseline: first write", lambda steps: steps[:1]),
        ("baseline: every failed write", lambda steps: [s for s in steps if s.failed]),
    ):
        score = Score(base)
        for run, exp in labelled:
            chosen = pick([s for s in run.steps if is_write(s)])
            tools = list(dict.fromkeys(s.tool or s.name for s in chosen))
            if not tools:
                continue
            score.runs += 1
            hits = [hit("forbidden_action", t, exp) for t in tools]
            score.findings += len(tools)
            score.hits += sum(hits)
            score.hit_runs += any(hits)
        for run in scored:
            if run.success is True and pick([s for s in run.steps if is_write(s)]):
                score.success_runs += 1
        scores.append(score)
    # Baselines for an expected write never made: every run that made no write (without an
    # error), naming the write successful runs make most often, overall or of its request kind.
    kinds = next(d for d in detectors if isinstance(d, MissedWrite)).kinds_
    overall: Counter[str] = Counter()
    by_kind: dict[Any, Counter[str]] = defaultdict(Counter)
    for run in runs:
        if run.success is True:
            overall.update(written(run))
            by_kind[kinds.kind_of(run)].update(written(run))

    def commonest(run: Any, per_kind: bool) -> str | None:
        counts = by_kind.get(kinds.kind_of(run)) if per_kind else None
        counts = counts or overall
        return min(counts, key=lambda t: (-counts[t], t)) if counts else None

    for base, per_kind in (("baseline: no write, commonest write", False),
                           ("baseline: no write, its kind's commonest", True)):  # fmt: skip
        score = Score(base)
        for run, exp in labelled:
            tool = commonest(run, per_kind)
            if written(run) or tool is None:
                continue
            score.runs += 1
            score.findings += 1
            score.hits += exp.wrong(tool)
            score.hit_runs += exp.wrong(tool)
        score.success_runs = sum(1 for r in scored if r.success is True and not written(r))
        scores.append(score)
    for score in scores:
        if brief and not score.findings and not score.success_runs:
            continue
        if brief and score.name.startswith("baseline") and score.name != "baseline: every write":
            continue
        print(score.line(wrong_runs))
        for example in score.examples:
            print(f"      {example[:300]}")
    rules = {d.name: len(getattr(d, "rules_", None) or getattr(d, "vocabulary_", None) or [])
             for d in detectors}  # fmt: skip
    if not brief:
        print(f"  rules learnt: {rules}")
    return {"set": name, "runs": len(runs), "failed": len(failed), "wrong_runs": wrong_runs,
            "rules": rules, "scores": [asdict(s) for s in scores]}  # fmt: skip


def _task_parity(run: Any) -> int | None:
    task = str(_source(run, "task_id"))
    return int(task) % 2 if task.isdigit() else None


# How far the user's words can take wrong_choice ----------------------------------------------
ExpectedCalls = Callable[[Any], "list[tuple[str, dict[str, Any]]] | None"]


def tau2_expected_calls(run: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """The expected calls of a tau2-bench run, with their arguments."""
    info = _source(run, "reward_info")
    info = json.loads(info) if isinstance(info, str) else info
    if not isinstance(info, dict):
        return None
    actions = [c.get("action") or {} for c in info.get("action_checks") or []]
    return [(a["name"], a.get("arguments") or {}) for a in actions if a.get("name")]


def tau_expected_calls(raw: dict[tuple[str, str], list[dict[str, Any]]]) -> ExpectedCalls:
    """The expected calls of a tau-bench run (`info.task.actions`), with their arguments."""

    def expected(run: Any) -> list[tuple[str, dict[str, Any]]] | None:
        found = raw.get((str(_source(run, "task_id")), str(_source(run, "trial"))))
        if not found or len(found) != 1:
            return None
        actions = (found[0].get("info") or {}).get("task", {}).get("actions") or []
        return [(a["name"], a.get("kwargs") or {}) for a in actions if a.get("name")]

    return expected


def choice_bound(
    name: str, runs: Sequence[Any], expected: ExpectedCalls, only: Callable[[Any], bool] | None
) -> dict[str, int]:
    """For every write argument value of a failed run that differs from the expected call's
    (the closest call of the same tool), what the user's words say: whether the value was a
    choice among records the run looked up, whether the expected record was among them and a
    rival, and whether the user's words favour it over the one chosen. An upper bound for
    `wrong_choice` (which must also find the rival without knowing it); labels used only here."""
    from tracegym.analysis.detectors.choice import WrongChoice, choices, words
    from tracegym.analysis.detectors.state import is_write
    from tracegym.analysis.runs import parse_json

    def values(value: Any) -> set[str]:
        items = value if isinstance(value, list) else [value]
        return {words(str(v)) for v in items if v is not None and not isinstance(v, (dict, bool))}

    detector = WrongChoice().fit(runs)
    counts: Counter[str] = Counter()
    write_tools = {s.tool or s.name for r in runs for s in r.steps if is_write(s)}
    for run in runs:
        if run.success is not False or (only is not None and not only(run)):
            continue
        calls = expected(run)
        if calls is None:
            continue
        writes = [s for s in run.steps if is_write(s)]
        made = [(s, parse_json(s.input)) for s in writes]
        made = [(s, a) for s, a in made if isinstance(a, dict)]
        found = list(choices(run, detector.never_, detector.common))
        for tool, kwargs in calls:
            same = [(s, a) for s, a in made if (s.tool or s.name) == tool]
            if not same or not isinstance(kwargs, dict):
                counts["an expected write never made"] += not same and tool in write_tools
                continue
            if any(_norm(a) == _norm(kwargs) for _, a in same):
                continue
            step, args = max(same, key=lambda sa: sum(_norm(sa[1].get(k)) == _norm(v)
                                                      for k, v in kwargs.items()))  # fmt: skip
            for arg, want in kwargs.items():
                got = values(args.get(arg))
                wanted = values(want)
                for value in sorted(got - wanted):
                    choice = next((c for c in found if c.step is step and c.arg == arg
                                   and words(c.value) == value), None)  # fmt: skip
                    if choice is None:
                        counts["a wrong value, not a choice among records looked up"] += 1
                        continue
                    right = [c for c in choice.candidates if c.identity & (wanted - got)]
                    if not right:
                        counts["a choice; the expected record not among the candidates"] += 1
                        continue
                    if right[0] not in choice.rivals:
                        counts["a choice; the expected record no rival (the call names it, "
                               "another write acts on it, a state never chosen)"] += 1  # fmt: skip
                        continue
                    said = choice.rival_said[choice.rivals.index(right[0])]
                    if choice.named_by_user:
                        counts["a choice; the user named the chosen record"] += 1
                    elif len(said) > len(choice.matched):
                        counts["a choice; the user's words favour the expected record"] += 1
                        flagged = choice.wrong and (tool, arg) not in detector.disabled_
                        counts["  ... and wrong_choice flags the call"] += flagged
                    elif len(said) == len(choice.matched):
                        counts["a choice; the user's words tie"] += 1
                    else:
                        counts["a choice; the user's words favour the chosen record"] += 1
    print(f"\n{name}: wrong write argument values of failed runs, by what the user said "
          "(labels used to find them)")  # fmt: skip
    for key, n in counts.items():
        print(f"  {n:>4}  {key}")
    return dict(counts)


def agentrx_categories(runs: Sequence[Any], labels: Path) -> None:
    """Per detector, the AgentRx root-cause categories of the failed runs it flags."""
    from tracegym.analysis.detectors.registry import make_detector

    truth = {}
    for entry in json.loads(labels.read_text()):
        root = (entry.get("root_cause") or {}).get("failure_id")
        category = next((f.get("failure_category") for f in entry.get("failures") or []
                         if f.get("failure_id") == root), None)  # fmt: skip
        truth[str(entry.get("trajectory_id"))] = category or "?"
    print("  AgentRx root-cause category of the labelled failed runs each detector flags:")
    print(f"    all labelled failed runs: {dict(Counter(truth.values()).most_common())}")
    for name in ("forbidden_action", "missed_action", "wrong_amount", "wrong_list",
                 "unknown_value", "wrong_choice"):  # fmt: skip
        detector = make_detector(name).fit(runs)
        flagged = Counter(
            truth[str(_source(r, "task_id"))]
            for r in runs
            if r.success is False and str(_source(r, "task_id")) in truth and detector.detect(r)
        )
        print(f"    {name}: {dict(flagged.most_common()) or 'none'}")


# Planted causes (tests/fixtures/planted.py): finding-level recovery ---------------------------
PLANTED = {  # planted cause -> the detectors meant to find it
    "policy_forbidden": ("forbidden_action",),
    "wrong_amount": ("wrong_amount",),
    "wrong_order": ("wrong_tool_order",),
    "never_called": ("missed_action", "missed_request", "unserved_request", "missed_write"),
}


def planted_recovery(seeds: Sequence[int], cache: Path, label: str) -> dict[str, Any]:
    """Per planted cause, the best Jaccard between its failed runs and the failed runs of one
    finding key of its detector (>= 0.6 is recovered), and that key's runs outside the cause."""
    sys.path.insert(0, str(ROOT))
    from tracegym.analysis.detectors.missed_request import MissedRequest
    from tracegym.analysis.detectors.registry import make_detector
    from tracegym.analysis.runs import load_runs
    from tracegym.store.store import Store
    from tracegym.tests.fixtures.planted import generate

    rows: dict[tuple[str, str], list[tuple[int, float, int]]] = defaultdict(list)
    for seed in seeds:
        home = Path(tempfile.mkdtemp(prefix=f"planted-{seed}-", dir=cache))
        planted = generate(home, seed)
        with Store(home) as store:
            runs = load_runs(store)
        for cause, members in planted.causes.items():
            for name in PLANTED.get(cause, ()):
                detector = MissedRequest() if name == "missed_request" else make_detector(name)
                rows[cause, name].append((seed, *_best_key(detector, runs, members)))
    print(f"\nplanted causes, finding level, seeds {label}:")
    out = {}
    for (cause, name), found in sorted(rows.items()):
        recovered = sum(j >= 0.6 for _, j, _ in found)
        mean = sum(j for _, j, _ in found) / len(found)
        missed = [seed for seed, j, _ in found if j < 0.6]
        print(f"  {cause:<18} by {name:<18} recovered {recovered}/{len(found)}  "
              f"mean J {mean:.2f}  other failed runs in the best key "
              f"{sum(o for _, _, o in found)}  missed seeds {missed}")  # fmt: skip
        out[f"{cause}/{name}"] = {"recovered": recovered, "planted": len(found),
                                  "mean_jaccard": mean}  # fmt: skip
    return out


def _best_key(detector: Any, runs: Sequence[Any], members: frozenset[str]) -> tuple[float, int]:
    """(best Jaccard of one finding key's failed runs with `members`, its runs outside them)."""
    detector = detector.fit(runs)
    by_key: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        if run.success is False:
            for finding in detector.detect(run):
                by_key[finding.key].add(run.trace_id)
    best, outside = 0.0, 0
    for ids in by_key.values():
        jaccard = len(ids & members) / len(ids | members)
        if jaccard > best:
            best, outside = jaccard, len(ids - members)
    return best, outside


def _seeds(text: str) -> list[int]:
    start, _, end = text.partition("-")
    return list(range(int(start), int(end or start) + 1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    cache = Path(tempfile.gettempdir()) / "tracegym-detectors-real"
    parser.add_argument("--cache", type=Path, default=cache)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--show", type=int, default=3, help="example findings per detector")
    parser.add_argument("--planted", default="", help="also score planted seeds, e.g. 100-119")
    parser.add_argument("--planted-tuning", default="",
                        help="planted seeds looked at while developing, e.g. 0-9")  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT.parent))
    args.cache.mkdir(parents=True, exist_ok=True)
    results = []
    bounds: dict[str, dict[str, int]] = {}
    tau2 = args.data / "tau2-retail-telecom"
    if tau2.is_dir():
        runs = _load("tau2-bench", tau2, args.cache)
        for domain, split in (("retail", "development"), ("telecom", "development")):
            chosen = [r for r in runs if _source(r, "domain") == domain]
            results.append(score_set(f"tau2-bench {domain} [{split}]", chosen, tau2_expected,
                                     args.show))  # fmt: skip
            if domain == "retail":
                bounds["tau2-retail"] = choice_bound(f"tau2-bench {domain} [{split}]", chosen,
                                                     tau2_expected_calls, None)  # fmt: skip
        print("\nper results file (one model and setting each; fitted on that file's runs):")
        for file in sorted(tau2.glob("*.json")):
            chosen = _load("tau2-bench", file, args.cache)
            domain = _source(chosen[0], "domain") if chosen else "?"
            split = "development"
            results.append(score_set(f"tau2-bench {file.stem} ({domain}) [{split}]", chosen,
                                     tau2_expected, 0, brief=True))  # fmt: skip
    else:
        print(f"skipped tau2-bench: {tau2} is absent")
    grok = args.data / "tau-bench-grok3-retail" / "grok-3-retail.json"
    if grok.is_file():
        runs = _load("tau-bench", grok, args.cache)
        raw = _raw_tau(grok)
        for run in runs:  # the outcome is base_success; the importer reads the composite reward
            found = raw.get((str(_source(run, "task_id")), str(_source(run, "trial"))), [])
            if len(found) == 1:
                components = found[0]["info"]["reward_info"].get("components") or {}
                if "base_success" in components:
                    run.success = bool(components["base_success"])
        results.append(score_set("tau-bench grok-3 retail [reported]", runs,
                                 tau_expected(_raw_tau(grok)), args.show))  # fmt: skip
        bounds["grok-3"] = choice_bound("tau-bench grok-3 retail [reported]", runs,
                                        tau_expected_calls(raw), None)  # fmt: skip
    else:
        print(f"skipped grok-3: {grok} is absent")
    agentrx = args.data / "agentrx-tau-retail" / "tau_dataset_full.json"
    if agentrx.is_file():
        runs = _load("tau-bench", agentrx, args.cache)
        results.append(score_set("AgentRx tau-retail [reported]", runs,
                                 tau_expected(_raw_tau(agentrx)), args.show))  # fmt: skip
        agentrx_categories(runs, agentrx.parent / "tau_ground_truth.json")
        for parity, split in ((0, "development"), (1, "reported")):
            results.append(score_set(
                f"AgentRx tau-retail, {('even', 'odd')[parity]} task ids [{split}]", runs,
                tau_expected(_raw_tau(agentrx)), args.show,
                only=lambda r, p=parity: _task_parity(r) == p,
            ))  # fmt: skip
            bounds[f"agentrx-{split}"] = choice_bound(
                f"AgentRx tau-retail, {('even', 'odd')[parity]} task ids [{split}]", runs,
                tau_expected_calls(_raw_tau(agentrx)), lambda r, p=parity: _task_parity(r) == p,
            )  # fmt: skip
    else:
        print(f"skipped AgentRx: {agentrx} is absent")
    planted = {}
    if args.planted_tuning:
        planted["tuning"] = planted_recovery(
            _seeds(args.planted_tuning), args.cache, f"{args.planted_tuning} [development]"
        )
    if args.planted:
        planted["reporting"] = planted_recovery(
            _seeds(args.planted), args.cache, f"{args.planted} [reported]"
        )
    if args.json:
        args.json.write_text(json.dumps({"sets": results, "planted": planted,
                                         "choice_bounds": bounds}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
