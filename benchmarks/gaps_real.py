"""The gaps `analyze` keeps on real, outcome-labelled runs of agents nobody here wrote.

    .venv/bin/python benchmarks/gaps_real.py [--data DIR] [--work DIR] [--no-clusters]
        [--only NAME] [--json FILE]

Every set is imported into its own home under `--work` (kept between runs: a second run does
not import again) and analysed at the default thresholds, as `tracegym analyze` does. Printed
per set: runs, failed, successful; each kept gap (rank, name, detector, coverage, delta, failed
members, the tools it names, its description's first sentence); and an evaluation made only
from the source files, never given to analysis:

- tau2-bench (retail and telecom, per model and pooled per domain): each run's failed
  `action_checks` (the expected tool calls the run did not make as expected; `user:` marks
  those the simulated user was to make on their device, in telecom). Per gap: the share
  of its failed member runs that missed some expected action, the share whose missed actions
  include a tool the gap names, and the expected action most often missed by its members, with
  its share among the members against its share among all failed runs (lift > 1: the gap
  groups the runs that got that action wrong); and the issue's lift (`lift_missing`): the share
  of its failed members missing some expected action over that share among all failed runs
  (at most 1 / that share: where every failed run misses one, no gap can have lift above 1).
  Per set: the actions failed runs miss most.
- AgentRx tau-retail (100 runs): the human root-cause labels of 27 of its failed runs
  (`tau_ground_truth.json`, made on the same trajectories in `tau_dataset_failed.json`). Per
  gap: its labelled members' root-cause categories, and how often the gap's finding for a run
  is at the labelled root-cause step (`step_number - 1`, docs/importers.md) exactly or +-1.
- tau-bench grok-3 retail (115 runs): its outcome is `info.reward_info.components.base_success`;
  the tau-bench importer reads `reward` (a composite with an efficiency penalty, below 1.0 on
  every run), so this benchmark imports a copy whose `reward` is `base_success` and says so.

- MedAgentBench (four models on the same 100 clinical tasks, per model and pooled; the
  `medagentbench` importer): its only labels are the statuses (`completedCorrect`,
  `completedIncorrect`, `agent invalid action`) and the task each run served. Per gap: its
  failed members' statuses, and the task kind (MedAgentBench's 10 task templates: `index // 10`,
  which groups the 100 tasks exactly by their question on this data) most common among them,
  with its share among the members against its share among all failed runs (lift > 1: the gap
  groups runs of one kind of request), and how many runs of that kind failed (where every one
  did, a gap confined to the kind cannot be told from "this was that kind of request"). Per
  set: failed runs by status and by task kind.

Nothing here is tuned: there are no thresholds of its own, and analysis runs at its defaults on
every set. `--part tuning` / `--part reporting` analyse half of each set: the runs of tasks whose
id (tau-bench's and tau2's `task_id`, MedAgentBench's `index`) is even (tuning) or odd
(reporting); a task id that is not a number goes by the parity of its SHA-256's first byte. All
trials of a task fall in the same half. Engineers changing analysis look at the tuning half; the
reporting half says whether the change generalises.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"
TAU2 = "tau2-retail-telecom"
MEDAGENTBENCH = "medagentbench"
TAU2_FILES = {
    "retail": ("ft-gpt-4.1_retail_default_gpt-4.1_1trials.json",
               "gpt-4.1_retail_default_gpt-4.1_1trials.json",
               "toolorchestra_retail_gpt-5_1trial.json"),
    "telecom": ("gpt-4o_telecom_llm_agent_gpt-4o_user_simulator_gpt-4o.json",
                "ft-gpt-4.1_telecom_default_gpt-4.1_1trials.json",
                "ft-gpt-4.1_telecom_no-user_gpt-4.1_1trials.json",
                "gpt-4.1_telecom_default_gpt-4.1_1trials.json",
                "gpt-4.1_telecom_no-user_gpt-4.1_1trials.json"),
}  # fmt: skip


@dataclass(frozen=True)
class RealSet:
    """One outcome-labelled set: where its files are and how it is evaluated."""

    name: str
    fmt: str
    files: tuple[Path, ...]
    evaluation: str  # "tau2", "agentrx", "medagentbench" or "" (gaps only)
    note: str = ""


@dataclass
class GapRow:
    rank: int
    name: str
    detector: str | None
    coverage: float
    delta: float | None
    failed_members: int
    successful_members: int
    tools: list[str]
    says: str
    evaluation: dict[str, Any] = field(default_factory=dict)


@dataclass
class SetReport:
    name: str
    runs: int
    failed: int
    succeeded: int
    gaps: list[GapRow]
    seconds: float
    note: str = ""
    evaluation: dict[str, Any] = field(default_factory=dict)
    closest_rejected: list[str] = field(default_factory=list)  # best candidates not kept


def real_sets(data: Path) -> tuple[list[RealSet], list[str]]:
    """The sets present under `data`, and a line for each one skipped."""
    found: list[RealSet] = []
    skipped: list[str] = []
    agentrx = data / "agentrx-tau-retail" / "tau_dataset_full.json"
    if agentrx.is_file():
        found.append(RealSet("AgentRx tau-retail", "tau-bench", (agentrx,), "agentrx"))
    else:
        skipped.append(f"AgentRx tau-retail: {agentrx} is absent")
    grok = data / "tau-bench-grok3-retail" / "grok-3-retail.json"
    if grok.is_file():
        found.append(RealSet(
            "tau-bench grok-3 retail", "tau-bench", (grok,), "",
            note="outcome from info.reward_info.components.base_success (a converted copy: "
            "the tau-bench importer reads `reward`, which is below 1.0 on every run)",
        ))  # fmt: skip
    else:
        skipped.append(f"tau-bench grok-3 retail: {grok} is absent")
    for domain, names in TAU2_FILES.items():
        paths = [data / TAU2 / n for n in names if (data / TAU2 / n).is_file()]
        for path in paths:
            model = path.stem.split(f"_{domain}")[0]
            variant = "no-user" if "no-user" in path.stem else ""
            label = f"tau2 {domain} {model}{' ' + variant if variant else ''}"
            found.append(RealSet(label, "tau2-bench", (path,), "tau2"))
        if len(paths) > 1:
            found.append(RealSet(f"tau2 {domain} pooled ({len(paths)} files)", "tau2-bench",
                                 tuple(paths), "tau2"))  # fmt: skip
        if not paths:
            skipped.append(f"tau2 {domain}: no files under {data / TAU2}")
    mab = data / MEDAGENTBENCH
    models = sorted(mab.glob("outputs/*/*/medagentbench-std/overall.json"))
    for path in models:
        found.append(RealSet(f"MedAgentBench {path.parent.parent.name}", "medagentbench",
                             (path,), "medagentbench"))  # fmt: skip
    if len(models) > 1:
        found.append(RealSet(f"MedAgentBench pooled ({len(models)} models)", "medagentbench",
                             tuple(models), "medagentbench"))  # fmt: skip
    if not models:
        skipped.append(f"MedAgentBench: no */medagentbench-std/overall.json under {mab}")
    return found, skipped


# Importing ---------------------------------------------------------------------------------------
def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def _grok_copy(path: Path, folder: Path) -> Path:
    """A copy of the grok-3 file whose `reward` is the binary `base_success`."""
    runs = json.loads(path.read_text())
    for run in runs:
        components = ((run.get("info") or {}).get("reward_info") or {}).get("components") or {}
        if "base_success" in components:
            run["reward"] = float(components["base_success"])
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    target.write_text(json.dumps(runs))
    return target


def prepare(s: RealSet, work: Path) -> Path:
    """The set's home under `work`, imported once."""
    from tracegym.store.importers import import_path

    home = work / _slug(s.name)
    marker = home / ".imported"
    if marker.exists():
        return home
    home.mkdir(parents=True, exist_ok=True)
    for path in s.files:
        source = _grok_copy(path, work / "converted") if "grok-3" in s.name else path
        import_path(s.fmt, source, home)
    marker.write_text("\n".join(str(p) for p in s.files) + "\n")
    return home


# Evaluation sources (never given to analysis) ---------------------------------------------------
def tau2_missed(files: Sequence[Path]) -> dict[str, list[str]]:
    """Simulation id -> the expected actions (tool names, in order) it did not match; those
    the (simulated) user was to perform on their side are prefixed `user:`."""
    out: dict[str, list[str]] = {}
    for path in files:
        for sim in json.loads(path.read_text()).get("simulations", []):
            checks = (sim.get("reward_info") or {}).get("action_checks") or []
            out[str(sim.get("id"))] = [
                ("user:" if c["action"].get("requestor") == "user" else "") + c["action"]["name"]
                for c in checks
                if not c.get("action_match")
            ]
    return out


def agentrx_labels(folder: Path) -> dict[str, tuple[str, int | None]]:
    """Task id -> (root-cause category, 0-based traj index of its step)."""
    out: dict[str, tuple[str, int | None]] = {}
    truth = folder / "tau_ground_truth.json"
    if not truth.is_file():
        return out
    for item in json.loads(truth.read_text()):
        root = (item.get("root_cause") or {}).get("failure_id")
        for failure in item.get("failures") or []:
            if failure.get("failure_id") == root:
                step = failure.get("step_number")
                out[str(item["trajectory_id"])] = (
                    str(failure.get("failure_category")),
                    step - 1 if isinstance(step, int) else None,
                )
    return out


def _source(run: Any, name: str) -> Any:
    return run.root.attributes.get(f"tracegym.source.{name}") if run.root is not None else None


# Scoring -----------------------------------------------------------------------------------------
def _first_sentence(text: str, limit: int = 160) -> str:
    head = text.split(". ")[0].strip()
    return head if len(head) <= limit else head[: limit - 1] + "…"


def _member_steps(result: Any) -> dict[str, dict[str, set[int]]]:
    """Gap key -> failed member trace id -> the steps (source indices) its findings name."""
    from tracegym.benchmarks.planted_causes import gap_field

    out: dict[str, dict[str, set[int]]] = {}
    for s in result.scored:
        if not s.kept:
            continue
        steps: dict[str, set[int]] = {}
        for f in s.candidate.findings:
            if f.step_index is not None:
                steps.setdefault(f.trace_id, set()).add(int(f.step_index))
        out[s.candidate.key] = steps
    for gap in result.gaps:  # typed members, when analysis gives them, name the decisive step
        members = gap_field(gap, "members") or ()
        key = str(gap_field(gap, "key"))
        for m in members:
            step = gap_field(m, "step")
            if step is not None:
                out.setdefault(key, {})[str(gap_field(m, "trace_id"))] = {int(step)}
    return out


def ranked(counts: Counter[str]) -> list[tuple[str, int]]:
    """Most common first, ties by name (Counter.most_common keeps insertion order, which
    follows set iteration and so changes between processes)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def evaluate_tau2(result: Any, s: RealSet, rows: list[GapRow], gaps: list[Any]) -> dict[str, Any]:
    missed_by_sim = tau2_missed(s.files)
    missed = {r.trace_id: missed_by_sim.get(str(_source(r, "simulation_id")), [])
              for r in result.failed}  # fmt: skip
    all_counts = Counter(a for names in missed.values() for a in set(names))
    n_failed = len(missed)
    # the lift: the share of a gap's failed members missing some expected action over
    # that share among all failed runs (1.0 where every failed run misses one: no lift possible)
    base_missing = sum(bool(v) for v in missed.values()) / n_failed if n_failed else 0.0
    for row, gap in zip(rows, gaps, strict=True):
        members = [t for t in gap.failed_members if t in missed]
        if not members:
            continue
        counts = Counter(a for t in members for a in set(missed[t]))
        # ties: the action most specific to the gap (rarest among all failed runs), then name
        top, n_top = min(counts.items(), key=lambda kv: (-kv[1], all_counts[kv[0]], kv[0]),
                         default=(None, 0))  # fmt: skip
        base = all_counts[top] / n_failed if top and n_failed else 0.0
        share = n_top / len(members)
        row.evaluation = {
            "members_missing_an_action": round(sum(bool(missed[t]) for t in members)
                                               / len(members), 2),
            "members_missing_a_named_tool": round(
                sum(bool({a.removeprefix("user:") for a in missed[t]} & set(row.tools))
                    for t in members) / len(members), 2),
            "top_missed_action": top,
            "top_share": round(share, 2),
            "top_share_all_failed": round(base, 2),
            "lift": round(share / base, 2) if base else None,
            "lift_missing": round(sum(bool(missed[t]) for t in members) / len(members)
                                  / base_missing, 2) if base_missing else None,
        }  # fmt: skip
    return {
        "failed_missing_an_action": sum(bool(v) for v in missed.values()),
        "most_missed_actions": ranked(all_counts)[:6],
        # successful runs miss expected actions too (reads, `calculate`): context for the above
        "succeeded_missing_an_action": sum(
            bool(missed_by_sim.get(str(_source(r, "simulation_id")))) for r in result.succeeded
        ),
    }


def evaluate_agentrx(result: Any, s: RealSet, rows: list[GapRow], gaps: list[Any],
                     steps: dict[str, dict[str, set[int]]]) -> dict[str, Any]:  # fmt: skip
    labels = agentrx_labels(s.files[0].parent)
    by_trace = {r.trace_id: labels.get(str(_source(r, "task_id"))) for r in result.failed}
    labelled = {t: v for t, v in by_trace.items() if v is not None}
    for row, gap in zip(rows, gaps, strict=True):
        members = [t for t in gap.failed_members if t in labelled]
        named = steps.get(gap.key, {})
        exact = near = scored = 0
        for t in members:
            gold = labelled[t][1]
            if gold is None or not named.get(t):
                continue
            scored += 1
            exact += gold in named[t]
            near += any(abs(gold - x) <= 1 for x in named[t])
        row.evaluation = {
            "labelled_members": len(members),
            "root_cause_categories": ranked(Counter(labelled[t][0] for t in members))[:3],
            "step_exact": f"{exact}/{scored}",
            "step_within_1": f"{near}/{scored}",
        }
    return {
        "labelled_failed": len(labelled),
        "root_cause_categories": ranked(Counter(v[0] for v in labelled.values())),
    }


def task_kind(index: Any) -> str | None:
    """MedAgentBench's task template of a raw result: `task{index // 10 + 1}` (its 100 tasks
    are 10 templates of 10 patients, numbered in order; checked on the shared data by the
    questions in tests/store/test_medagentbench.py)."""
    if isinstance(index, bool) or not isinstance(index, int):
        return None
    return f"task{index // 10 + 1}"


def evaluate_medagentbench(result: Any, rows: list[GapRow], gaps: list[Any]) -> dict[str, Any]:
    """Gaps against the only labels the set has: the runs' statuses and task kinds."""
    status = {r.trace_id: str(_source(r, "status")) for r in result.failed}
    kind = {r.trace_id: task_kind(_source(r, "index")) or "?" for r in result.failed}
    all_kinds = Counter(kind.values())
    succeeded = Counter(task_kind(_source(r, "index")) or "?" for r in result.succeeded)
    n_failed = len(kind)
    for row, gap in zip(rows, gaps, strict=True):
        members = [t for t in gap.failed_members if t in kind]
        if not members:
            continue
        kinds = Counter(kind[t] for t in members)
        top, n_top = min(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
        share, base = n_top / len(members), all_kinds[top] / n_failed
        row.evaluation = {
            "statuses": ranked(Counter(status[t] for t in members)),
            "top_task_kind": top,
            "top_share": round(share, 2),
            "top_share_all_failed": round(base, 2),
            "lift": round(share / base, 2) if base else None,
            "task_kinds": len(kinds),
            # how the top kind's runs ended: a kind every run of which fails leaves a gap
            # confined to it unable to tell its cause from "this was that kind of request"
            "top_kind_failed": f"{all_kinds[top]}/{all_kinds[top] + succeeded[top]}",
        }
    return {
        "failed_statuses": ranked(Counter(status.values())),
        "failed_task_kinds": ranked(all_kinds),
        "succeeded_task_kinds": ranked(succeeded),
    }


PARTS = ("all", "tuning", "reporting")


def part_of(task: Any) -> str:
    """The half a task falls in: "tuning" for an even task id, "reporting" for an odd one."""
    text = str(task)
    if text.strip().lstrip("-").isdigit():
        odd = int(text) % 2
    else:
        odd = hashlib.sha256(text.encode()).digest()[0] % 2
    return "reporting" if odd else "tuning"


def part_filter(home: Path, part: str) -> str:
    """The `--where` condition selecting the set's runs of `part` ("" for all)."""
    if part == "all":
        return ""
    from tracegym.analysis.runs import load_runs
    from tracegym.store.store import Store

    with Store(home) as store:
        runs = load_runs(store)
    ids = []
    for run in runs:
        task = _source(run, "task_id")
        task = _source(run, "index") if task is None else task
        if part_of(task) == part:
            ids.append("'" + run.trace_id.replace("'", "''") + "'")
    listed = ", ".join(ids) or "''"
    return f"trace_id IN ({listed})"


def analyse(s: RealSet, home: Path, embedder: Any, part: str = "all") -> SetReport:
    from tracegym.analysis.pipeline import analyze
    from tracegym.benchmarks.planted_causes import gap_field, kept_gaps

    clock = time.perf_counter()
    result = analyze(home, embedder=embedder, write=False, where=part_filter(home, part))
    gaps = kept_gaps(result)
    rows = []
    for view, gap in zip(gaps, result.gaps, strict=True):
        delta = gap_field(gap, "delta")
        rows.append(GapRow(
            rank=view.rank or 0, name=view.name, detector=view.detector,
            coverage=float(gap_field(gap, "coverage") or 0.0),
            delta=None if delta is None else float(delta),
            failed_members=len(view.failed_members),
            successful_members=len(view.members - view.failed_members),
            tools=list(gap_field(gap, "tools") or []),
            says=_first_sentence(str(gap_field(gap, "description") or "")),
        ))  # fmt: skip
    name = s.name if part == "all" else f"{s.name} [{part}]"
    report = SetReport(name, len(result.runs), len(result.failed), len(result.succeeded),
                       rows, 0.0, s.note)  # fmt: skip
    rejected = sorted(
        (c for c in result.scored if not c.kept),
        key=lambda c: -(c.coverage * (c.delta if c.delta is not None else 1.0)),
    )
    report.closest_rejected = [
        f"{c.candidate.key} (cov {c.coverage:.2f}, delta "
        f"{'-' if c.delta is None else f'{c.delta:.2f}'}: {c.why})" for c in rejected[:3]
    ]  # fmt: skip
    if s.evaluation == "tau2":
        report.evaluation = evaluate_tau2(result, s, rows, gaps)
    elif s.evaluation == "agentrx":
        report.evaluation = evaluate_agentrx(result, s, rows, gaps, _member_steps(result))
    elif s.evaluation == "medagentbench":
        report.evaluation = evaluate_medagentbench(result, rows, gaps)
    report.seconds = round(time.perf_counter() - clock, 1)
    return report


# Output ------------------------------------------------------------------------------------------
def render(r: SetReport) -> str:
    lines = [f"## {r.name}: {r.runs} runs, {r.failed} failed, {r.succeeded} successful "
             f"({r.seconds} s)"]  # fmt: skip
    if r.note:
        lines.append(f"_{r.note}_")
    if r.evaluation.get("most_missed_actions") is not None:
        actions = ", ".join(f"{a} {n}" for a, n in r.evaluation["most_missed_actions"])
        lines.append(f"failed runs missing an expected action: "
                     f"{r.evaluation['failed_missing_an_action']}/{r.failed} (successful "
                     f"runs: {r.evaluation['succeeded_missing_an_action']}/{r.succeeded}); "
                     f"most missed: {actions or '-'}")  # fmt: skip
    if r.evaluation.get("root_cause_categories") is not None:
        cats = ", ".join(f"{c} {n}" for c, n in r.evaluation["root_cause_categories"])
        lines.append(f"AgentRx root causes of {r.evaluation['labelled_failed']} labelled failed "
                     f"runs: {cats}")  # fmt: skip
    if r.evaluation.get("failed_statuses") is not None:
        statuses = ", ".join(f"{c} {n}" for c, n in r.evaluation["failed_statuses"])
        kinds = ", ".join(f"{c} {n}" for c, n in r.evaluation["failed_task_kinds"])
        lines.append(f"failed runs by status: {statuses}; by task kind: {kinds}")
    if not r.gaps:
        lines.append("\nno gap kept; closest rejected candidates: "
                     + ("; ".join(r.closest_rejected) or "none"))  # fmt: skip
        return "\n".join(lines)
    lines += ["", "| # | gap | detector | cov | delta | failed / ok members | names | evaluation |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for g in r.gaps:
        ev = g.evaluation
        if "top_missed_action" in ev:
            text = (f"missing an action {ev['members_missing_an_action']:.0%} (lift "
                    f"{ev.get('lift_missing')}), a named tool "
                    f"{ev['members_missing_a_named_tool']:.0%}; top {ev['top_missed_action']} "
                    f"{ev['top_share']:.0%} (all failed {ev['top_share_all_failed']:.0%}, "
                    f"lift {ev['lift']})")  # fmt: skip
        elif "top_task_kind" in ev:
            statuses = ", ".join(f"{c} {n}" for c, n in ev["statuses"])
            text = (f"statuses: {statuses}; top kind {ev['top_task_kind']} {ev['top_share']:.0%} "
                    f"(all failed {ev['top_share_all_failed']:.0%}, lift {ev['lift']}; "
                    f"{ev['top_kind_failed']} of its runs failed), "
                    f"{ev['task_kinds']} kinds")  # fmt: skip
        elif "root_cause_categories" in ev:
            cats = ", ".join(f"{c} {n}" for c, n in ev["root_cause_categories"])
            text = (f"{ev['labelled_members']} labelled: {cats or '-'}; step exact "
                    f"{ev['step_exact']}, +-1 {ev['step_within_1']}")  # fmt: skip
        else:
            text = "-"
        delta = "-" if g.delta is None else f"{g.delta:.2f}"
        lines.append(f"| {g.rank} | {g.name} | {g.detector} | {g.coverage:.2f} | {delta} | "
                     f"{g.failed_members} / {g.successful_members} | "
                     f"{', '.join(g.tools[:3]) or '-'} | {text} |")  # fmt: skip
    lines.append("")
    lines += [f"- #{g.rank} says: {g.says}" for g in r.gaps]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--work", type=Path,
                        default=Path(tempfile.gettempdir()) / "tracegym-gaps-real")  # fmt: skip
    parser.add_argument("--no-clusters", action="store_true",
                        help="group identical signatures only, no sentence embeddings")  # fmt: skip
    parser.add_argument("--only", help="sets whose name contains this text")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--part", choices=PARTS, default="all",
                        help="even task ids: tuning; odd: reporting")  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.no_clusters:
        from tracegym.benchmarks.planted_causes import ExactSignatures

        embedder: Any = ExactSignatures()
        mode = "clusters of identical signatures only (--no-clusters)"
    else:
        from tracegym.analysis.embeddings import Embedder

        embedder = Embedder(args.work / "cache")
        mode = "embedding clusters (all-MiniLM-L6-v2)"
    found, skipped = real_sets(args.data.resolve())
    if args.only:
        found = [s for s in found if args.only.lower() in s.name.lower()]
    part = "" if args.part == "all" else f"; {args.part} part (task id parity)"
    print(f"# Gaps on real sets: analyze at default thresholds; {mode}{part}\n")
    reports = []
    for s in found:
        report = analyse(s, prepare(s, args.work), embedder, args.part)
        reports.append(report)
        print(render(report) + "\n")
    for line in skipped:
        print(f"- skipped: {line}")
    if args.json:
        rows = [vars(r) | {"gaps": [vars(g) for g in r.gaps]} for r in reports]
        args.json.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
