"""Does `analyze` find planted causes on agents nobody tuned it on?

    .venv/bin/python benchmarks/planted_causes.py [--tuning 0-9] [--reporting 100-119]
        [--no-clusters] [--cache DIR] [--json FILE] [--show]

For every seed, `tests/fixtures/planted.py` traces a different generated agent (domain, tool
names, record fields and policy drawn from the seed) with 2-3 planted causes, noise failures and
successful runs; `tracegym.analysis.pipeline.analyze` runs on that store at the default
thresholds, as `tracegym analyze` calls it. Scored per planted cause:

- the kept gap whose failed member runs best match the cause's runs (Jaccard; >= 0.6 is
  "recovered"), and whether that gap's finding names the decisive step of those runs (its
  first span is the agent's decisive chat span or the tool call that carried it out);
- `any candidate`: the best Jaccard over every scored candidate, kept or not (an upper bound
  of what gap selection could keep from the current detectors and clusters);
- baseline `all failed`: one gap holding every failed run;
- baseline `best whole detector`: each detector's findings as one gap, no thresholds, the best
  of them for the cause (a bound: it is chosen knowing the cause).

Per gap: whether it matches a cause (Jaccard >= 0.6 with one), whether it mostly claims noise
failures or successful runs (over half of its member runs), whether it matches none but holds
most runs of two or more causes (a merge), and per seed whether the top gap is a real cause
and whether a gap that is no cause ranks above one that is.

Tuning seeds (default 0-9 and the extended 200-209) are the ones engineers may look at while
changing the detectors; reporting seeds (default 100-119 and the extended 400-419) are for the
numbers that count. Both are printed, separately, and within each the older seeds (< 200: the
original catalogue) apart from the extended ones (>= 200: also wrong_field, wrong_record,
hands_off, lucky_rule; `planted.is_extended`). `--without wrong_source` scores every seed a
second time with that detector left out, on the same runs: the baseline before it.

Embedding clusters run by default with a shared cache (`--cache`, default
$TMPDIR/tracegym-planted-cache) so a warm rerun does not embed again; `--no-clusters` replaces
the sentence embedder by one that only groups identical signatures (each such cluster then
holds runs whose failure signatures are the same text), which is faster and says so in the
output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RECOVERED = 0.6


@dataclass(frozen=True)
class GapView:
    """A kept gap (or a scored candidate) with every run it claims."""

    name: str
    detector: str | None
    kind: str
    key: str
    rank: int | None  # 1-based rank among kept gaps; None for a candidate not kept
    members: frozenset[str]  # trace ids of every run it claims (failed and successful)
    failed_members: frozenset[str]  # the failed ones
    decisive: dict[str, frozenset[str]] = field(default_factory=dict)  # trace -> named spans


@dataclass
class CauseScore:
    seed: int
    split: str
    cause: str
    runs: int
    best_gap: str | None
    best_rank: int | None
    jaccard: float
    recovered: bool
    step_hits: int  # runs of the cause in the best gap whose finding names the decisive step
    step_of: int  # runs of the cause in the best gap
    any_candidate: float
    any_candidate_key: str | None
    best_detector: float  # the best whole detector (all its findings as one gap, no threshold)
    all_failed: float


@dataclass
class GapScore:
    seed: int
    split: str
    rank: int
    name: str
    detector: str | None
    failed_members: int
    members: int
    cause: str | None  # the cause it recovers (Jaccard >= 0.6), if any
    jaccard: float
    spurious: bool  # over half of its member runs are noise failures or successful runs
    merges: int = 0  # causes with over half of their runs in it (2+ on a no-cause gap: merged)


@dataclass
class SeedScore:
    seed: int
    split: str
    domain: str
    runs: int
    failed: int
    causes: list[CauseScore] = field(default_factory=list)
    gaps: list[GapScore] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def top_is_cause(self) -> bool | None:
        return None if not self.gaps else self.gaps[0].cause is not None

    @property
    def symptom_above_cause(self) -> bool:
        real = [g.rank for g in self.gaps if g.cause is not None]
        return bool(real) and any(g.cause is None and g.rank < max(real) for g in self.gaps)


def jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    a, b = set(a), set(b)
    return len(a & b) / len(a | b) if a | b else 0.0


# Reading the analysis --------------------------------------------------------------------------
def gap_field(gap: Any, name: str) -> Any:
    return gap.get(name) if isinstance(gap, dict) else getattr(gap, name, None)


def _typed_members(gap: Any) -> dict[str, frozenset[str]] | None:
    """Failed member runs -> their decisive spans, from a typed gap (`Gap.members`, or a
    gaps.json record's `members`), when analysis provides them."""
    members = gap_field(gap, "members")
    if members is None:
        members = gap_field(gap, "member_runs")
    if members is None:
        return None
    out: dict[str, frozenset[str]] = {}
    for m in members:
        trace = gap_field(m, "trace_id") if not isinstance(m, str) else m
        spans = () if isinstance(m, str) else (gap_field(m, "span_ids") or ())
        if trace:
            out[str(trace)] = frozenset(list(spans)[:1])
    return out


def kept_gaps(result: Any) -> list[GapView]:
    """The kept gaps, best first, with every member run: failed members from the typed
    `Gap.members` when analysis has them (else the candidate's `lacking` failed runs), and the
    successful runs from the candidate behind the gap (`Candidate.lacking`)."""
    failed = {r.trace_id for r in result.failed}
    by_key = {s.candidate.key: s.candidate for s in result.scored if s.kept}
    views = []
    for rank, gap in enumerate(result.gaps, 1):
        key = str(gap_field(gap, "key"))
        candidate = by_key.get(key)
        lacking = frozenset(candidate.lacking) if candidate is not None else frozenset()
        typed = _typed_members(gap)
        if typed is None:
            typed = defaultdict(set)
            for f in candidate.findings if candidate is not None else ():
                if f.trace_id in failed and f.span_ids:
                    typed[f.trace_id].add(f.span_ids[0])
            typed = {t: frozenset(typed.get(t, ())) for t in lacking & failed}
        failed_members = frozenset(typed)
        views.append(GapView(
            name=str(gap_field(gap, "name")), detector=gap_field(gap, "detector"),
            kind=str(gap_field(gap, "kind")), key=key, rank=rank,
            members=failed_members | (lacking - failed), failed_members=failed_members,
            decisive=dict(typed),
        ))  # fmt: skip
    return views


def all_candidates(result: Any) -> list[GapView]:
    failed = {r.trace_id for r in result.failed}
    return [GapView(s.candidate.key, s.candidate.detector, s.candidate.kind, s.candidate.key,
                    None, frozenset(s.candidate.lacking),
                    frozenset(s.candidate.lacking) & failed) for s in result.scored]  # fmt: skip


# Embedders -------------------------------------------------------------------------------------
class ExactSignatures:
    """Stands in for the sentence embedder: identical signatures share a vector, any two
    different ones are orthogonal, so clusters only group identical failure signatures."""

    computed = 0
    dim = 8192

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i, int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % self.dim] = 1.0
        return out


# Scoring ---------------------------------------------------------------------------------------
def score_seed(planted: Any, result: Any, split: str) -> SeedScore:
    failed = set(planted.failed)
    noise_or_ok = set(planted.noise) | set(planted.succeeded)
    decisive = {r.trace_id: {r.decisive_span_id, r.acted_span_id} - {None} for r in planted.runs}
    causes = planted.causes
    gaps = kept_gaps(result)
    candidates = all_candidates(result)
    seed = SeedScore(planted.seed, split, planted.domain.name, len(planted.runs), len(failed))
    for cause, truth in causes.items():
        best = max(gaps, key=lambda g: jaccard(truth, g.failed_members), default=None)
        j = jaccard(truth, best.failed_members) if best is not None else 0.0
        hits = of = 0
        if best is not None:
            for trace in truth & best.failed_members:
                of += 1
                hits += bool(decisive.get(trace, set()) & best.decisive.get(trace, frozenset()))
        oracle = max(candidates, key=lambda g: jaccard(truth, g.failed_members), default=None)
        whole = [jaccard(truth, g.failed_members) for g in candidates if g.kind == "detector"]
        seed.causes.append(CauseScore(
            seed=planted.seed, split=split, cause=cause, runs=len(truth),
            best_gap=best.name if best is not None and j > 0 else None,
            best_rank=best.rank if best is not None and j > 0 else None,
            jaccard=round(j, 3), recovered=j >= RECOVERED, step_hits=hits, step_of=of,
            any_candidate=round(jaccard(truth, oracle.failed_members), 3) if oracle else 0.0,
            any_candidate_key=oracle.key if oracle else None,
            best_detector=round(max(whole, default=0.0), 3),
            all_failed=round(jaccard(truth, failed), 3),
        ))  # fmt: skip
    for g in gaps:
        matches = {c: jaccard(t, g.failed_members) for c, t in causes.items()}
        cause, j = max(matches.items(), key=lambda kv: kv[1], default=(None, 0.0))
        seed.gaps.append(GapScore(
            seed=planted.seed, split=split, rank=g.rank or 0, name=g.name, detector=g.detector,
            failed_members=len(g.failed_members), members=len(g.members),
            cause=cause if j >= RECOVERED else None, jaccard=round(j, 3),
            spurious=len(g.members & noise_or_ok) > len(g.members) / 2,
            merges=sum(len(t & g.failed_members) > len(t) / 2 for t in causes.values()),
        ))  # fmt: skip
    return seed


def run_seed(seed: int, split: str, embedder: Any, workdir: Path,
             without: Sequence[str] = (), sample: float = 0.0) -> list[SeedScore]:  # fmt: skip
    """The seed scored at the default detectors, and (`without`) again with those detectors
    left out, on the same generated runs (the baseline of a new detector, in the same run),
    and (`sample`) again streamed, the detectors fitted on that share of the runs (what an
    analysis past `max_resident` runs does)."""
    from tracegym.analysis.detectors.registry import default_detectors
    from tracegym.analysis.pipeline import analyze
    from tracegym.tests.fixtures.planted import generate

    home = workdir / f"seed-{seed}"
    clock = time.perf_counter()
    planted = generate(home, seed)
    result = analyze(home, embedder=embedder, write=False)
    score = score_seed(planted, result, split)
    score.seconds = round(time.perf_counter() - clock, 2)
    scores = [score]
    if without:
        detectors = [d for d in default_detectors() if d.name not in without]
        before = analyze(home, embedder=embedder, write=False, detectors=detectors)
        scores.append(score_seed(planted, before, f"{split} without {','.join(without)}"))
    if sample:
        fitted_on = max(1, int(len(result.facts) * sample))
        streamed = analyze(home, embedder=embedder, write=False, max_resident=fitted_on,
                           workers=1)  # fmt: skip
        scores.append(score_seed(planted, streamed, f"{split} fitted on {sample:.0%}"))
    return scores


# Reporting -------------------------------------------------------------------------------------
def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "-"


def summary(seeds: Sequence[SeedScore]) -> dict[str, Any]:
    causes = [c for s in seeds for c in s.causes]
    gaps = [g for s in seeds for g in s.gaps]
    with_gaps = [s for s in seeds if s.gaps]
    per_kind: dict[str, list[CauseScore]] = defaultdict(list)
    for c in causes:
        per_kind[c.cause].append(c)
    return {
        "seeds": len(seeds),
        "causes": len(causes),
        "recovered": sum(c.recovered for c in causes),
        "mean_jaccard": round(float(np.mean([c.jaccard for c in causes])), 3) if causes else 0,
        "any_candidate_recovered": sum(c.any_candidate >= RECOVERED for c in causes),
        "all_failed_recovered": sum(c.all_failed >= RECOVERED for c in causes),
        "best_detector_recovered": sum(c.best_detector >= RECOVERED for c in causes),
        "step_hits": sum(c.step_hits for c in causes if c.recovered),
        "step_of": sum(c.step_of for c in causes if c.recovered),
        "gaps": len(gaps),
        "gaps_matching_a_cause": sum(g.cause is not None for g in gaps),
        "spurious_gaps": sum(g.spurious for g in gaps),
        "merging_gaps": sum(g.cause is None and g.merges >= 2 for g in gaps),
        "seeds_without_gaps": len(seeds) - len(with_gaps),
        "top_is_cause": sum(bool(s.top_is_cause) for s in with_gaps),
        "seeds_with_gaps": len(with_gaps),
        "symptom_above_cause": sum(s.symptom_above_cause for s in seeds),
        "per_kind": {
            kind: {
                "causes": len(cs),
                "recovered": sum(c.recovered for c in cs),
                "mean_jaccard": round(float(np.mean([c.jaccard for c in cs])), 3),
                "any_candidate_recovered": sum(c.any_candidate >= RECOVERED for c in cs),
                "all_failed_recovered": sum(c.all_failed >= RECOVERED for c in cs),
                "best_detector_recovered": sum(c.best_detector >= RECOVERED for c in cs),
            }
            for kind, cs in sorted(per_kind.items())
        },
    }


def render(name: str, s: dict[str, Any]) -> str:
    lines = [
        f"## {name}: {s['seeds']} seeds, {s['causes']} planted causes",
        "",
        "| cause | planted | recovered (kept gap, J>=0.6) | mean J | any candidate J>=0.6 "
        "| baseline all-failed J>=0.6 | baseline best whole detector J>=0.6 |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, k in s["per_kind"].items():
        lines.append(
            f"| {kind} | {k['causes']} | {_pct(k['recovered'], k['causes'])} | "
            f"{k['mean_jaccard']:.2f} | {_pct(k['any_candidate_recovered'], k['causes'])} | "
            f"{_pct(k['all_failed_recovered'], k['causes'])} | "
            f"{_pct(k['best_detector_recovered'], k['causes'])} |"
        )
    lines.append(
        f"| **all** | {s['causes']} | {_pct(s['recovered'], s['causes'])} | "
        f"{s['mean_jaccard']:.2f} | {_pct(s['any_candidate_recovered'], s['causes'])} | "
        f"{_pct(s['all_failed_recovered'], s['causes'])} | "
        f"{_pct(s['best_detector_recovered'], s['causes'])} |"
    )
    lines += [
        "",
        f"- gaps kept: {s['gaps']}; matching a cause: {s['gaps_matching_a_cause']}; "
        f"claiming mostly noise or successful runs: {s['spurious_gaps']}; matching none but "
        f"holding most runs of two or more causes: {s['merging_gaps']}",
        f"- seeds with no gap kept: {s['seeds_without_gaps']}; top gap is a real cause: "
        f"{_pct(s['top_is_cause'], s['seeds_with_gaps'])} of seeds with gaps; a gap that is no "
        f"cause ranked above one that is: {s['symptom_above_cause']} seeds",
        f"- decisive step named by the recovering gap's finding: "
        f"{_pct(s['step_hits'], s['step_of'])} of recovered causes' runs",
    ]
    return "\n".join(lines)


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):  # "" is no seeds
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tuning", default="0-9,200-209", help="seeds to tune on (e.g. 0-9)")
    parser.add_argument("--reporting", default="100-119,400-419", help="seeds to report on")
    parser.add_argument(
        "--without",
        default="",
        help="also score every seed with these "
        "detectors (comma-separated) left out: the baseline before them",
    )
    parser.add_argument("--sample", type=float, default=0.0,
                        help="also score every seed streamed, the detectors fitted on this "
                        "share of its runs (0.5: half)")  # fmt: skip
    parser.add_argument("--no-clusters", action="store_true",
                        help="group identical signatures only, no sentence embeddings")  # fmt: skip
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "tracegym-planted-cache"
    )
    parser.add_argument("--json", type=Path, help="write every score here")
    parser.add_argument("--show", action="store_true", help="print each seed's gaps")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.no_clusters:
        embedder: Any = ExactSignatures()
        mode = "clusters of identical signatures only (--no-clusters)"
    else:
        from tracegym.analysis.embeddings import Embedder

        embedder = Embedder(args.cache)
        mode = f"embedding clusters (all-MiniLM-L6-v2, cache {args.cache})"
    clock = time.perf_counter()
    without = tuple(n for n in args.without.split(",") if n)
    scores: dict[str, list[SeedScore]] = {"tuning": [], "reporting": []}
    with tempfile.TemporaryDirectory(prefix="planted-") as tmp:
        for split, seeds in (
            ("tuning", _seeds(args.tuning)),
            ("reporting", _seeds(args.reporting)),
        ):
            for seed in seeds:
                s, *baseline = run_seed(seed, split, embedder, Path(tmp), without, args.sample)
                scores[split].append(s)
                for b in baseline:
                    scores.setdefault(b.split, []).append(b)
                if args.show:
                    print(f"seed {seed} ({split}, {s.domain}): {s.runs} runs, {s.failed} failed, "
                          f"{s.seconds}s")  # fmt: skip
                    for c in s.causes:
                        print(f"  cause {c.cause} ({c.runs} runs): best gap {c.best_gap} "
                              f"J={c.jaccard} step {c.step_hits}/{c.step_of}; any candidate "
                              f"{c.any_candidate_key} J={c.any_candidate}; all-failed "
                              f"J={c.all_failed}")  # fmt: skip
                    for g in s.gaps:
                        print(f"  gap #{g.rank} {g.name}: {g.failed_members} failed / "
                              f"{g.members} runs, cause {g.cause} (J={g.jaccard})"
                              f"{' SPURIOUS' if g.spurious else ''}"
                              f"{f' MERGES {g.merges}' if g.merges > 1 else ''}")  # fmt: skip
    print(f"# Planted causes: analyze at default thresholds; {mode}; "
          f"{time.perf_counter() - clock:.0f} s\n")  # fmt: skip
    summaries = {}
    titles = [("tuning", f"Tuning seeds {args.tuning} (development numbers)"),
              ("reporting", f"Reporting seeds {args.reporting} (untuned)")]  # fmt: skip
    if without:
        gone = ",".join(without)
        titles = [t for split, title in titles
                  for t in ((f"{split} without {gone}", f"{title}, without {gone} (before)"),
                            (split, title))]  # fmt: skip
    if args.sample:
        titles += [(f"{split} fitted on {args.sample:.0%}",
                    f"{title}, streamed: detectors fitted on {args.sample:.0%} of each seed's runs")
                   for split, title in titles if split in ("tuning", "reporting")]  # fmt: skip
    for split, title in titles:
        if scores.get(split):
            summaries[split] = summary(scores[split])
            print(render(title, summaries[split]) + "\n")
            extended = [s for s in scores[split] if s.seed >= 200]
            if extended and len(extended) < len(scores[split]):
                older = [s for s in scores[split] if s.seed < 200]
                for part, group in (("seeds < 200", older), ("extended seeds >= 200", extended)):
                    k = summary(group)
                    print(f"  - {part}: {_pct(k['recovered'], k['causes'])} recovered")
                print()
    if args.json:
        seeds = {k: [asdict(s) for s in v] for k, v in scores.items()}
        document = {"mode": mode, "summaries": summaries, "seeds": seeds}
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
