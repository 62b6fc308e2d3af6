"""Environments synthesized from real, outcome-labelled runs of agents nobody here wrote.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/synthesis_real.py [--data DIR] [--work DIR]
        [--only NAME] [--medagentbench] [--no-forced] [--validity-seeds N] [--noise P]
        [--policy smollm2|tiny|FOLDER --seeds N] [--json FILE]

The sets and their homes are benchmarks/gaps_real.py's (imported once under `--work`, analysed
at the default thresholds with its embedder). For every gap analysis keeps, synthesis does what
`tracegym synthesize` does: the family serving the gap's detector (whatever families
`synthesis.families` discovers), the tools and conventions mined from the store, the noisy
oracle's calibration of the knobs, then `synthesis.validity.check_environment` (which gates on
fidelity where the fidelity check exists) and `synthesis.fidelity.check_fidelity` directly for its
issues. Printed per gap: the family or the reason there is none, the verdicts with the failed
checks, the rules the environment enforces (`spec.extra["rules"]`, mined by analysis from the
agent's successful runs), one sampled task (its request and the oracle's first tool result) and
the noisy oracle's pass@1 after calibration into the 20-60% band.

At the default thresholds few gaps or none are kept on these sets, so a second section, clearly
labelled, forces one gap per rule-mining detector (forbidden_action, missed_action, wrong_amount,
wrong_list, wrong_tool_order): the candidate of that detector's own findings with the most failed
runs that analysis did not keep, described as analysis describes a kept one. Those gaps exercise
synthesis only; analysis does not claim them.

`--policy smollm2 --seeds N` also calibrates the demo's base SmolLM2 (greedy, the chat format
of training.rollout) on each built environment: slow on CPU, so off by default. The summary table
at the end counts, per set and section, gaps, environments built, valid, fidelity ok, and the
reasons of every gap that did not get a valid environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracegym.analysis.detector_names import (
    FORBIDDEN_ACTION,
    MISSED_ACTION,
    WRONG_AMOUNT,
    WRONG_CHOICE,
    WRONG_LIST,
    WRONG_TOOL_ORDER,
)
from tracegym.benchmarks.gaps_real import DATA, RealSet, prepare, real_sets

KEPT = "kept"
FORCED = "forced"
FORCED_TITLE = "forced gaps (not kept by analysis: for exercising synthesis only)"
FORCED_DETECTORS = (
    FORBIDDEN_ACTION, MISSED_ACTION, WRONG_AMOUNT, WRONG_CHOICE, WRONG_LIST, WRONG_TOOL_ORDER,
)  # fmt: skip
SHOW = 300  # characters of a request or tool result shown


@dataclass(frozen=True)
class Options:
    validity_seeds: int = 200
    fidelity_seeds: int = 200
    calibration_seeds: int = 40
    noise: float = 0.15  # the noisy oracle's error probability per action
    k: int = 4
    policy_seeds: int = 2  # seeds per level when calibrating a model policy


@dataclass
class SampledTask:
    seed: int
    instruction: str
    system_prompt: str
    first_call: str  # the oracle's first tool call, "name {arguments}"
    first_result: str  # what it returned


@dataclass
class PassRate:
    policy: str
    pass_at_1: float
    in_band: bool
    level: int
    knobs: dict[str, Any]
    seeds: int
    seconds: float
    history: list[float] = field(default_factory=list)  # pass@1 of each level tried


@dataclass
class GapOutcome:
    """What synthesis made of one gap: an environment and its verdicts, or the reason."""

    set_name: str
    section: str  # KEPT or FORCED
    gap: str
    gap_id: str
    detector: str
    failed_members: int
    coverage: float
    delta: float | None
    mined: list[str]  # statements of the rules analysis mined (Gap.rules)
    family: str | None = None
    env_id: str | None = None
    reason: str = ""  # why no environment was built (empty when one was)
    valid: bool | None = None
    failed_checks: list[str] = field(default_factory=list)  # "name: detail" (ValidityReport)
    fidelity_ok: bool | None = None  # None: no fidelity check in this checkout
    fidelity_issues: list[str] = field(default_factory=list)  # "where: problem", distinct
    rules: list[dict[str, Any]] = field(default_factory=list)  # spec.extra["rules"]
    task: SampledTask | None = None
    noisy_oracle: PassRate | None = None
    policy: PassRate | None = None
    policy_error: str = ""
    errors: list[str] = field(default_factory=list)  # steps that raised (calibration, sampling)
    seconds: float = 0.0

    @property
    def built(self) -> bool:
        return self.env_id is not None

    @property
    def passed(self) -> bool:
        """An environment that passes validity and fidelity (where fidelity can be checked)."""
        return bool(self.built and self.valid and self.fidelity_ok is not False)

    def reason_label(self) -> str:
        """Why the gap has no environment that passes, short enough to be counted."""
        if not self.built:
            if self.reason.startswith("no family exercises detector"):
                return f"no family serves {self.detector}"
            return self.reason.split("; ")[0][:110]
        if not self.valid:
            groups = grouped(self.failed_checks)
            crash = next((d for n, d in groups if len(n) > 1 and d.startswith("raised")), None)
            if crash:  # one crash failing several checks: name it once
                return f"crashed in validity: {crash.removeprefix('raised ')[:100]}"
            names = [n for group, _ in groups for n in group]
            first = f" (first: {self.fidelity_issues[0][:90]})" if self.fidelity_issues else ""
            return f"rejected by validity: {', '.join(names)}{first if 'fidelity' in names else ''}"
        if self.fidelity_ok is False:
            return "rejected by fidelity"
        return ""


def grouped(failures: Sequence[str]) -> list[tuple[list[str], str]]:
    """Failed checks ("name: detail") with the same detail together: a crash that fails every
    check reads once."""
    out: dict[str, list[str]] = {}
    for failure in failures:
        name, _, detail = failure.partition(": ")
        out.setdefault(detail, []).append(name)
    return [(names, detail) for detail, names in out.items()]


@dataclass
class SetResult:
    name: str
    runs: int
    failed: int
    succeeded: int
    outcomes: list[GapOutcome]
    no_forced: dict[str, str]  # detector -> why no forced gap was built from it
    seconds: float


@dataclass
class Summary:
    set_name: str
    section: str
    gaps: int
    built: int
    valid: int
    fidelity_ok: int
    fidelity_checked: int
    passed: int
    in_band: int  # the noisy oracle's calibration landed in the band
    reasons: Counter[str]
    not_forced: dict[str, str] = field(default_factory=dict)  # forced section: detector -> why


def summarize(result: SetResult, section: str) -> Summary:
    rows = [o for o in result.outcomes if o.section == section]
    return Summary(
        result.name, section, len(rows),
        built=sum(o.built for o in rows),
        valid=sum(bool(o.valid) for o in rows),
        fidelity_ok=sum(o.fidelity_ok is True for o in rows),
        fidelity_checked=sum(o.fidelity_ok is not None for o in rows),
        passed=sum(o.passed for o in rows),
        in_band=sum(bool(o.noisy_oracle and o.noisy_oracle.in_band) for o in rows),
        reasons=Counter(o.reason_label() for o in rows if not o.passed),
        not_forced=dict(result.no_forced) if section == FORCED else {},
    )  # fmt: skip


# Gaps -------------------------------------------------------------------------------------------
def forced_gaps(analysis: Any, detectors: Sequence[str] = FORCED_DETECTORS):
    """One gap per detector from its own findings (the finding-key candidate with the most failed
    runs that analysis did not keep), described as analysis describes a kept one; and per
    detector without one, why."""
    from tracegym.analysis.gap_selection import describe, gap_name, specific
    from tracegym.analysis.pipeline import default_detector_set

    kept = {g.key for g in analysis.gaps}
    by_trace = {r.trace_id: r for r in analysis.runs}
    texts = {d.name: d.description for d in default_detector_set()}
    gaps, missing = [], {}
    for name in detectors:
        mine = [s for s in analysis.scored if s.candidate.detector == name]
        if any(s.candidate.key in kept for s in mine):
            missing[name] = "analysis kept a gap of this detector (see the kept section)"
            continue
        usable = [s for s in mine if specific(s.candidate) and s.failed_lacking > 0]
        if not usable:
            runs = len({f.trace_id for s in mine for f in s.candidate.findings})
            missing[name] = (f"no finding on a failed run ({runs} runs with findings)" if runs
                             else "the detector found nothing on this set")  # fmt: skip
            continue
        best = max(usable, key=lambda s: (s.failed_lacking, s.delta or -1.0, s.candidate.key))
        gaps.append(describe(best, gap_name(best.candidate), by_trace, analysis.succeeded, texts))
    return gaps, missing


# Synthesis of one gap ---------------------------------------------------------------------------
def _fidelity():
    try:
        from tracegym.synthesis.fidelity import check_fidelity
    except ImportError:
        return None
    return check_fidelity


def _raised(exc: BaseException) -> str:
    """The exception and where it was raised (file:line), as validity reports a crash."""
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"


def _short(text: Any, limit: int = SHOW) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sample_task(env: Any) -> SampledTask:
    """The first train seed's request and the oracle's first tool call with its result."""
    from tracegym.synthesis.base import run_actions

    seed = env.spec.train_seeds[0] if env.spec is not None else 0
    episode, _verdict = run_actions(env, seed, env.oracle(seed))
    call = next((s for s in episode.steps if "name" in s["action"]), None)
    return SampledTask(
        seed, _short(episode.task.instruction), _short(episode.task.system_prompt, 160),
        "" if call is None else _short(f"{call['action']['name']} "
                                       f"{_short(call['action'].get('arguments', {}), 120)}", 160),
        "" if call is None else _short(call["observation"].get("content", "")),
    )  # fmt: skip


def _rate(name: str, result: Any, seconds: float) -> PassRate:
    return PassRate(name, round(result.pass_at_1, 3), result.in_band, result.level,
                    dict(result.knobs), result.n_seeds, round(seconds, 1),
                    [round(e.pass_at_1, 3) for e in result.history])  # fmt: skip


def synthesize_gap(gap: Any, set_name: str, section: str, catalog: Any, conventions: Any,
                   options: Options, policy: Any = None) -> GapOutcome:  # fmt: skip
    """Build, calibrate and check the environment of `gap`; nothing raised escapes."""
    from tracegym.synthesis.families import build_spec
    from tracegym.synthesis.spec import catalog_from_patterns
    from tracegym.synthesis.world import NotSynthesizable

    clock = time.perf_counter()
    out = GapOutcome(set_name, section, gap.name, gap.id, gap.detector, len(gap.members),
                     gap.coverage, gap.delta, [r.statement for r in gap.rules])  # fmt: skip
    try:
        chosen = catalog or catalog_from_patterns(list(gap.argument_patterns), list(gap.tools))
        spec = build_spec(gap, chosen, conventions)
    except NotSynthesizable as exc:
        out.reason = str(exc) or "not synthesizable (no reason given)"
    except Exception as exc:  # a gap nobody foresaw must not stop the others
        out.reason = f"building the environment failed: {_raised(exc)}"
    else:
        out.family, out.env_id = spec.family, spec.env_id
        out.rules = list(spec.extra.get("rules") or [])
        check(out, spec, options, policy)
    out.seconds = round(time.perf_counter() - clock, 1)
    return out


def check(out: GapOutcome, spec: Any, options: Options, policy: Any = None) -> None:
    """Calibrate the noisy oracle, check validity and fidelity at the calibrated knobs, sample a
    task, calibrate `policy`: each step's crash is recorded in `out` and the others still run."""
    from tracegym.synthesis.calibrate import calibrate
    from tracegym.synthesis.policies import NoisyOraclePolicy
    from tracegym.synthesis.registry import from_spec
    from tracegym.synthesis.validity import check_environment

    try:
        env = from_spec(spec)
    except Exception as exc:
        out.valid, out.failed_checks = False, [f"instantiating: {_raised(exc)}"]
        return
    clock = time.perf_counter()
    try:
        noisy = NoisyOraclePolicy(p=options.noise)
        calibration = calibrate(env, noisy, n_seeds=options.calibration_seeds, k=options.k)
        out.noisy_oracle = _rate(f"noisy-oracle:{options.noise}", calibration,
                                 time.perf_counter() - clock)  # fmt: skip
        env = from_spec(spec, **calibration.knobs)
    except Exception as exc:  # validity below still says what else is wrong
        out.errors.append(f"noisy-oracle calibration raised {_raised(exc)}")
    validity = check_environment(env, options.validity_seeds)  # catches its checks' crashes
    out.valid, out.failed_checks = validity.ok, validity.failures
    fidelity = _fidelity()
    if fidelity is not None:
        try:
            report = fidelity(env, n_seeds=options.fidelity_seeds)
            out.fidelity_ok = bool(report.ok)
            distinct = dict.fromkeys(f"{i.where}: {i.problem}" for i in report.issues)
            out.fidelity_issues = list(distinct)[:5]
            if len(distinct) > 5:
                out.fidelity_issues.append(f"... {len(distinct) - 5} more distinct issues")
        except Exception as exc:
            out.fidelity_ok, out.fidelity_issues = False, [f"raised {_raised(exc)}"]
    try:
        out.task = sample_task(env)
    except Exception as exc:
        out.errors.append(f"sampling a task raised {_raised(exc)}")
    if policy is not None:
        try:
            clock = time.perf_counter()
            result = calibrate(from_spec(spec), policy, n_seeds=options.policy_seeds, k=1)
            out.policy = _rate(policy.name, result, time.perf_counter() - clock)
        except Exception as exc:
            out.policy_error = _raised(exc)


# A model as a policy ----------------------------------------------------------------------------
class ModelPolicy:
    """A loaded model (`generation.model.Policy`) as a callable `policy(observation, info)`,
    greedy and in the model's own chat template with the environment's tools (as
    training.rollout renders it), so `synthesis.calibrate` can walk an environment's knobs with
    it as with a scripted policy."""

    def __init__(self, model: Any, max_new_tokens: int = 96) -> None:
        self.model = model
        self.name = model.name
        self.max_new_tokens = max_new_tokens
        self.session: Any = None
        self.chat: Any = None
        self.messages: list[dict[str, Any]] = []
        self.ended = True

    def __call__(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        from tracegym.generation.chat_tokens import ChatTokens
        from tracegym.training.rollout import Session, action_of, reply_message

        content = str(observation.get("content", ""))
        if info.get("step") == 0 or self.session is None:
            self.session = Session(self.model)
            self.chat = ChatTokens(self.model.chat_format, info.get("tools") or None)
            system = str(info.get("system_prompt", "") or "")
            self.messages = [{"role": "system", "content": system}] if system else []
            self.messages.append({"role": "user", "content": content})
            self.session.feed(self.chat.prompt(self.messages))
        else:
            result = {"role": "tool", "content": content}
            self.session.feed(self.chat.after_reply(self.messages, [result], ended=self.ended))
            self.messages.append(result)
        new, full = self.session.generate(self.max_new_tokens, self.chat.stop_id)
        self.ended = bool(new) and new[-1] == self.chat.stop_id
        text = self.chat.reply_text(new)
        reply = self.model.chat_format.parse_reply(text)
        action = action_of(reply, text, self.model.chat_format.family)
        if full or "answer" in action:
            answer = text.strip() if full else action["answer"]
            self.messages.append({"role": "assistant", "content": answer})
            return {"answer": answer}
        self.messages.append(reply_message(reply, text))
        return action


def load_model_policy(name: str, work: Path) -> ModelPolicy:
    """`smollm2` (the demo's base model), `tiny[-SEED]` or a local model folder, loaded
    offline (training.model); ModelError with what to do when it is not installed."""
    from tracegym.generation.model import ensure_model, load_policy

    return ModelPolicy(load_policy(ensure_model(work / "model-home", name)))


# One set ----------------------------------------------------------------------------------------
def run_set(s: RealSet, work: Path, embedder: Any, options: Options, policy: Any = None,
            forced: bool = True) -> SetResult:  # fmt: skip
    from tracegym.analysis.pipeline import analyze
    from tracegym.synthesis.conventions import conventions_from_store
    from tracegym.synthesis.spec import catalog_from_store

    clock = time.perf_counter()
    home = prepare(s, work)
    analysis = analyze(home, embedder=embedder, write=False)
    catalog = catalog_from_store(home)
    catalog = catalog if catalog.tools else None
    conventions = conventions_from_store(home)
    outcomes = [synthesize_gap(g, s.name, KEPT, catalog, conventions, options, policy)
                for g in analysis.gaps]  # fmt: skip
    missing: dict[str, str] = {}
    if forced:
        gaps, missing = forced_gaps(analysis)
        outcomes += [synthesize_gap(g, s.name, FORCED, catalog, conventions, options, policy)
                     for g in gaps]  # fmt: skip
    return SetResult(s.name, len(analysis.runs), len(analysis.failed), len(analysis.succeeded),
                     outcomes, missing, round(time.perf_counter() - clock, 1))  # fmt: skip


# Output -----------------------------------------------------------------------------------------
def _rate_text(rate: PassRate | None) -> str:
    if rate is None:
        return "-"
    band = "in band" if rate.in_band else "not in band"
    tried = " -> ".join(f"{p:.2f}" for p in rate.history)
    return (f"pass@1 {rate.pass_at_1:.2f} ({band}; level {rate.level} {rate.knobs}; levels tried "
            f"{tried}; {rate.seeds} seeds, {rate.seconds} s)")  # fmt: skip


def render_outcome(o: GapOutcome) -> str:
    delta = "-" if o.delta is None else f"{o.delta:.2f}"
    lines = [f"### {o.gap} ({o.detector}; {o.failed_members} failed runs, coverage "
             f"{o.coverage:.2f}, delta {delta}; {o.seconds} s)"]  # fmt: skip
    for statement in o.mined:
        lines.append(f"- rule mined by analysis: {statement}")
    if not o.built:
        lines.append(f"- no environment: {o.reason}")
        return "\n".join(lines)
    verdict = (
        "ok"
        if o.valid
        else "FAILED "
        + "; ".join(
            f"{', '.join(names)}: {_short(detail, 200)}"
            for names, detail in grouped(o.failed_checks)
        )
    )
    fidelity = (
        "not checked (no synthesis.fidelity)"
        if o.fidelity_ok is None
        else "ok"
        if o.fidelity_ok
        else "FAILED " + "; ".join(_short(i, 200) for i in o.fidelity_issues)
    )
    lines += [f"- family {o.family}: {o.env_id}", f"- validity: {verdict}",
              f"- fidelity: {fidelity}"]  # fmt: skip
    if not o.rules:
        lines.append("- rules enforced: none (spec.extra['rules'] is empty)")
    for rule in o.rules:
        lines.append(f"- rule enforced: {rule.get('statement')} (support {rule.get('support')}, "
                     f"confidence {rule.get('confidence')}, from "
                     f"{len(rule.get('evidence_runs') or [])} runs)")  # fmt: skip
    if o.task is not None:
        t = o.task
        lines += [f"- task (seed {t.seed}): {t.instruction}",
                  f"  system prompt: {t.system_prompt or '(none)'}",
                  f"  oracle's first call: {t.first_call or '(none)'}",
                  f"  its result: {t.first_result or '(none)'}"]  # fmt: skip
    lines += [f"- error: {e}" for e in o.errors]
    lines.append(f"- noisy oracle: {_rate_text(o.noisy_oracle)}")
    if o.policy is not None or o.policy_error:
        name = o.policy.policy if o.policy else "policy"
        lines.append(f"- {name}: {o.policy_error or _rate_text(o.policy)}")
    return "\n".join(lines)


def render_set(r: SetResult) -> str:
    lines = [f"## {r.name}: {r.runs} runs, {r.failed} failed, {r.succeeded} successful "
             f"({r.seconds} s)"]  # fmt: skip
    kept = [o for o in r.outcomes if o.section == KEPT]
    lines.append(f"\n{len(kept)} gap(s) kept by analysis at the default thresholds")
    lines += [render_outcome(o) for o in kept]
    forced = [o for o in r.outcomes if o.section == FORCED]
    if forced or r.no_forced:
        lines.append(f"\n#### {FORCED_TITLE}")
        lines += [f"- {d}: no forced gap: {why}" for d, why in r.no_forced.items()]
        lines += [render_outcome(o) for o in forced]
    return "\n".join(lines)


def _counted(reasons: Counter[str]) -> str:
    return "; ".join(
        f"{n}x {why}" for why, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def render_summary(summaries: Sequence[Summary]) -> str:
    lines = ["## Summary", "",
             "| set | section | gaps | built | valid | fidelity ok | valid + fidelity | noisy "
             "oracle in band | reasons (gaps without a passing environment) |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in summaries:
        reasons = _counted(s.reasons)
        if s.not_forced:
            reasons += ("; " if reasons else "") + "no gap to force: " + ", ".join(s.not_forced)
        fidelity = f"{s.fidelity_ok}/{s.fidelity_checked}" if s.fidelity_checked else "-"
        lines.append(f"| {s.set_name} | {s.section} | {s.gaps} | {s.built} | {s.valid} | "
                     f"{fidelity} | {s.passed} | {s.in_band} | {reasons or '-'} |")  # fmt: skip
    lines.append("")
    for section in (KEPT, FORCED):
        rows = [s for s in summaries if s.section == section]
        total = Counter[str]()
        for s in rows:
            total.update(s.reasons)
        lines.append(f"{section}: {sum(s.gaps for s in rows)} gaps, {sum(s.built for s in rows)} "
                     f"built, {sum(s.valid for s in rows)} valid, "
                     f"{sum(s.passed for s in rows)} valid + fidelity; reasons: "
                     f"{_counted(total) or 'none'}")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "tracegym-synthesis-real"
    )
    parser.add_argument("--only", help="sets whose name contains this text")
    parser.add_argument("--medagentbench", action="store_true", help="also the MedAgentBench sets")
    parser.add_argument("--no-forced", action="store_true", help="only the gaps analysis keeps")
    parser.add_argument("--validity-seeds", type=int, default=Options.validity_seeds)
    parser.add_argument("--calibration-seeds", type=int, default=Options.calibration_seeds)
    parser.add_argument("--noise", type=float, default=Options.noise)
    parser.add_argument("--policy", help="also calibrate a model: smollm2, tiny[-SEED], FOLDER")
    parser.add_argument(
        "--seeds",
        type=int,
        default=Options.policy_seeds,
        help="seeds per knob level for --policy (greedy: one episode each)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)  # fmt: skip
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tracegym.analysis.embeddings import Embedder

    started = time.perf_counter()
    options = Options(validity_seeds=args.validity_seeds, fidelity_seeds=args.validity_seeds,
                      calibration_seeds=args.calibration_seeds, noise=args.noise,
                      policy_seeds=args.seeds)  # fmt: skip
    policy = None
    if args.policy:
        from tracegym.generation.model import ModelError

        try:
            policy = load_model_policy(args.policy, args.work)
        except ModelError as exc:
            print(f"--policy {args.policy}: not run: {exc}\n")
    found, skipped = real_sets(args.data.resolve())
    if not args.medagentbench:
        found = [s for s in found if s.evaluation != "medagentbench"]
    if args.only:
        found = [s for s in found if args.only.lower() in s.name.lower()]
    from tracegym.synthesis.families import DETECTOR_FAMILY

    print(
        "# Synthesis on real sets: the gaps analyze keeps at default thresholds, then forced gaps\n"
    )
    print(f"families: {', '.join(f'{d} -> {f}' for d, f in sorted(DETECTOR_FAMILY.items()))}")
    print(f"fidelity check: {'synthesis.fidelity' if _fidelity() else 'absent in this checkout'}; "
          f"{options.validity_seeds} validity seeds, noisy oracle p={options.noise} calibrated "
          f"on {options.calibration_seeds} seeds\n")  # fmt: skip
    embedder = Embedder(args.work / "cache")
    results, summaries = [], []
    for s in found:
        result = run_set(s, args.work, embedder, options, policy, forced=not args.no_forced)
        results.append(result)
        print(render_set(result) + "\n", flush=True)
        summaries += [summarize(result, KEPT), summarize(result, FORCED)]
    for line in skipped:
        print(f"- skipped: {line}")
    print(render_summary(summaries))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        rows = [asdict(r) for r in results]
        args.json.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
