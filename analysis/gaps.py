"""Capability gaps: candidates from detector findings and signature clusters, kept when they
separate failures from successes (TRACE's coverage, contrastive delta and bootstrap stability).

- coverage = share of failed runs lacking the capability (having a finding of the candidate);
- delta = that share minus the same share among successful runs;
- stability = in how many of `resamples` bootstrap resamples (failed and successful runs each
  resampled with replacement) both thresholds still hold.
A candidate is kept when coverage >= min_coverage, delta >= min_delta and stability >=
min_stability. With no successful runs there is no contrast: candidates are ranked by coverage
alone and the result says so.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tracegym.analysis.detectors.base import Finding
from tracegym.analysis.gap import Gap, GapMember, GapRequest, Symptom
from tracegym.analysis.runs import Run
from tracegym.analysis.signatures import mask


@dataclass(frozen=True)
class Thresholds:
    min_coverage: float = 0.10
    min_delta: float = 0.20
    resamples: int = 10
    min_stability: int = 8
    seed: int = 0


@dataclass
class Candidate:
    """A capability some runs may lack: `lacking` holds their trace ids."""

    key: str
    kind: str  # "finding" (a detector's precise key), "detector" (its whole kind) or "cluster"
    detector: str | None
    lacking: set[str] = field(default_factory=set)
    findings: list[Finding] = field(default_factory=list)
    signatures: list[str] = field(default_factory=list)  # cluster members' signatures


@dataclass
class Scored:
    candidate: Candidate
    coverage: float
    delta: float | None
    failed_lacking: int
    succeeded_lacking: int
    stability: int
    kept: bool
    why: str


def rates(lacking: set[str], failed: Sequence[str], succeeded: Sequence[str]):
    """(coverage, delta or None) of a candidate over the given runs."""
    coverage = sum(t in lacking for t in failed) / len(failed) if failed else 0.0
    if not succeeded:
        return coverage, None
    return coverage, coverage - sum(t in lacking for t in succeeded) / len(succeeded)


def stability(
    lacking: set[str], failed: Sequence[str], succeeded: Sequence[str], t: Thresholds
) -> int:
    """Bootstrap resamples (of `t.resamples`) in which the candidate passes both thresholds."""
    rng = np.random.default_rng(t.seed)
    fail_hits = np.array([x in lacking for x in failed], dtype=float)
    succ_hits = np.array([x in lacking for x in succeeded], dtype=float)
    passes = 0
    for _ in range(t.resamples):
        coverage = rng.choice(fail_hits, size=len(fail_hits)).mean() if len(fail_hits) else 0.0
        ok = coverage >= t.min_coverage
        if len(succ_hits):
            ok = ok and coverage - rng.choice(succ_hits, size=len(succ_hits)).mean() >= t.min_delta
        passes += bool(ok)
    return passes


def score(candidate: Candidate, failed: Sequence[str], succeeded: Sequence[str],
          t: Thresholds) -> Scored:  # fmt: skip
    coverage, delta = rates(candidate.lacking, failed, succeeded)
    stable = stability(candidate.lacking, failed, succeeded, t)
    reasons = []
    if coverage < t.min_coverage:
        reasons.append(f"coverage {coverage:.2f} < {t.min_coverage}")
    if delta is not None and delta < t.min_delta:
        reasons.append(f"delta {delta:.2f} < {t.min_delta}")
    if stable < t.min_stability:
        reasons.append(f"stable in {stable}/{t.resamples} < {t.min_stability}")
    return Scored(
        candidate, coverage, delta,
        failed_lacking=sum(x in candidate.lacking for x in failed),
        succeeded_lacking=sum(x in candidate.lacking for x in succeeded),
        stability=stable, kept=not reasons, why="; ".join(reasons) or "kept",
    )  # fmt: skip


def candidates_from_findings(findings: Iterable[Finding]) -> list[Candidate]:
    """One candidate per detector kind and one per precise finding key."""
    by_key: dict[tuple[str, str], Candidate] = {}
    for f in findings:
        for kind, key in (("detector", f"detector:{f.detector}"), ("finding", f.key)):
            c = by_key.setdefault((kind, key), Candidate(key, kind, f.detector))
            c.lacking.add(f.trace_id)
            c.findings.append(f)
    return list(by_key.values())


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def select(scored: Sequence[Scored], failed: Sequence[str], t: Thresholds) -> list[Scored]:
    """The kept candidates, best first, without near-duplicates.

    Ranked by coverage x delta (coverage alone without successes); at equal rank a precise
    finding key comes before its detector's whole kind, and that before a cluster. A detector's
    kind is kept only if it covers enough failures its kept precise keys miss; any candidate
    that mostly repeats (Jaccard >= 0.8) a kept gap's failed runs is dropped.
    """
    failed_set = set(failed)

    def rank(s: Scored) -> tuple:
        impact = s.coverage * (s.delta if s.delta is not None else 1.0)
        specificity = {"finding": 0, "detector": 1, "cluster": 2}[s.candidate.kind]
        return (-round(impact, 6), specificity, s.candidate.key)

    kept: list[Scored] = []
    for s in sorted((s for s in scored if s.kept), key=rank):
        fails = s.candidate.lacking & failed_set
        if s.candidate.kind == "detector":
            covered = set().union(*(k.candidate.lacking & failed_set for k in kept
                                    if k.candidate.detector == s.candidate.detector))  # fmt: skip
            if covered and len(fails - covered) / max(1, len(failed_set)) < t.min_coverage:
                continue
        if any(_jaccard(fails, k.candidate.lacking & failed_set) >= 0.8 for k in kept):
            continue
        kept.append(s)
    return kept


# Describing a gap ---------------------------------------------------------------------------
def snake(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:80] or "gap"


def gap_name(c: Candidate) -> str:
    if c.kind == "cluster":
        top = Counter(f.detector for f in c.findings).most_common(1)
        return snake(f"{top[0][0] if top else 'failure'}_cluster_{c.key.split(':')[-1]}")
    if c.kind == "detector":
        return snake(c.detector or c.key)
    detail = c.key.split(":", 1)[1] if ":" in c.key else c.key
    return snake(f"{c.detector}_{detail.replace('>', '_before_')}")


def _tools(c: Candidate, runs: Mapping[str, Run]) -> list[str]:
    counts: Counter[str] = Counter()
    for f in c.findings:
        named = f.details.get("tool")  # a tool the finding is about, even one never called
        if isinstance(named, str):
            counts[named] += 2
        steps = runs[f.trace_id].by_span() if f.trace_id in runs else {}
        for span in f.span_ids:
            step = steps.get(span)
            if step is not None and step.tool:
                counts[step.tool] += 1
    return [tool for tool, _ in counts.most_common(5)]


def _shape(value: Any) -> str:
    """An argument value's pattern: short values masked (`<id>`, `<n>`), long text as <text>."""
    text = value if isinstance(value, str) else str(value)
    return mask(text) if len(text) <= 24 else "<text>"


def _argument_patterns(c: Candidate, runs: Mapping[str, Run]) -> list[str]:
    patterns: Counter[str] = Counter()
    for f in c.findings:
        run = runs.get(f.trace_id)
        if run is None or f.position is None or f.position >= len(run.steps):
            continue
        step = run.steps[f.position]
        args = step.arguments
        if isinstance(args, dict):
            shown = ", ".join(f"{k}={_shape(v)}" for k, v in sorted(args.items()))
            patterns[f"{step.tool}({shown})"] += 1
    return [p for p, _ in patterns.most_common(3)]


def _successful_behaviour(tools: Sequence[str], successes: Sequence[Run]) -> str:
    if not successes or not tools:
        return "no successful runs to compare with" if not successes else ""
    parts = []
    for tool in tools[:3]:
        using = [r for r in successes if tool in r.tool_sequence()]
        if not using:
            parts.append(f"successful runs never call {tool}")
            continue
        before: Counter[str] = Counter()
        for r in using:
            seq = r.tool_sequence()
            i = seq.index(tool)
            before[seq[i - 1] if i else "(nothing)"] += 1
        prev, n = before.most_common(1)[0]
        parts.append(
            f"{len(using)}/{len(successes)} successful runs call {tool}, "
            f"{n} of them right after {prev}"
        )
    return "; ".join(parts)


def _member(f: Finding, run: Run) -> GapMember:
    return GapMember(trace_id=f.trace_id, run_id=run.run_id, step=f.step_index,
                     position=f.position, agent=f.agent, span_ids=tuple(f.span_ids),
                     evidence=f.message)  # fmt: skip


def members(c: Candidate, runs: Mapping[str, Run]) -> list[GapMember]:
    """Every failed run of the candidate at its decisive step: the earliest of the candidate's
    findings in the run (trace id order)."""
    first: dict[str, Finding] = {}
    for f in c.findings:
        run = runs.get(f.trace_id)
        if run is None or not run.failed or f.trace_id not in c.lacking:
            continue
        known = first.get(f.trace_id)
        at = f.position if f.position is not None else 1 << 30
        if known is None or at < (known.position if known.position is not None else 1 << 30):
            first[f.trace_id] = f
    return [_member(first[t], runs[t]) for t in sorted(first)]


def dominant_detector(c: Candidate) -> str:
    """The candidate's detector; a cluster's is the most frequent among its findings."""
    if c.detector:
        return c.detector
    counts = Counter(f.detector for f in c.findings)
    return max(counts, key=lambda d: (counts[d], d)) if counts else "cluster"


def describe(s: Scored, name: str, runs: Mapping[str, Run], successes: Sequence[Run],
             detector_text: Mapping[str, str], rank: int = 0,
             symptoms: Sequence[Symptom] = ()) -> Gap:  # fmt: skip
    """The gap: stats, every member run, and a paragraph a person can check."""
    c = s.candidate
    tools = _tools(c, runs)
    patterns = _argument_patterns(c, runs)
    instead = _successful_behaviour(tools, successes)
    first = sorted(c.findings, key=lambda f: (f.trace_id, f.position or 0))
    listed = members(c, runs)
    # the users' words, where findings kept them (unserved_request): synthesis reuses them
    requests: list[GapRequest] = []
    for f in first:
        text = f.details.get("request")
        if isinstance(text, str) and text and all(r.text != text for r in requests):
            call = f.details.get("first_call")
            requests.append(GapRequest(text, call if isinstance(call, Mapping) else None))
        if len(requests) == 12:
            break
    dominant = dominant_detector(c)
    what = detector_text.get(dominant, "") or "a recurring failure pattern"
    if c.kind == "cluster":
        what = f"failures whose signatures read alike, mostly: {what}"
    contrast = (
        f"and in {s.succeeded_lacking} successful runs (delta {s.delta:.2f})"
        if s.delta is not None
        else "(there are no successful runs to contrast with)"
    )
    folded = (
        "Folded in, as what follows it in the same runs: "
        + ", ".join(f"{x.name} ({x.shared}/{x.failed_runs} runs)" for x in symptoms)
        + ". "
        if symptoms
        else ""
    )
    text = (
        f"{what[0].upper()}{what[1:]}. Seen in {s.failed_lacking} failed runs "
        f"(coverage {s.coverage:.2f}) {contrast}, stable in {s.stability} of the bootstrap "
        f"resamples. "
        + (f"Tools involved: {', '.join(tools)}. " if tools else "")
        + (f"Typical calls: {'; '.join(patterns)}. " if patterns else "")
        + (f"Evidence, e.g.: {listed[0].evidence.rstrip('.')}. " if listed else "")
        + (f"What successful runs do instead: {instead}. " if instead else "")
        + folded
    ).strip()
    return Gap(
        id=gap_id(c.key),
        name=name,
        key=c.key,
        kind=c.kind,
        detector=dominant,
        description=text,
        rank=rank,
        coverage=round(s.coverage, 4),
        delta=None if s.delta is None else round(s.delta, 4),
        stability=s.stability,
        failed_runs_lacking=s.failed_lacking,
        successful_runs_lacking=s.succeeded_lacking,
        tools=tuple(tools),
        argument_patterns=tuple(patterns),
        members=tuple(listed),
        requests=tuple(requests),
        successful_behaviour=instead,
        signatures=tuple(c.signatures[:3]),
        symptoms=tuple(symptoms),
    )


def gap_id(key: str) -> str:
    """Stable across analyses: a hash of the candidate's key."""
    return "gap-" + hashlib.sha256(key.encode()).hexdigest()[:10]
