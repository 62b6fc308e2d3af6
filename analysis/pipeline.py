"""`analyze`: runs -> detector findings -> signatures, embeddings, clusters -> scored candidate
capabilities -> the kept gaps, written to `<home>/gaps.json` (schema: docs/gaps.md).

Up to `max_resident` runs are loaded and analysed in memory; past that they stream through
detectors fitted on a sample (`analysis.streaming`, docs/scale.md). Either way scoring,
clustering and describing gaps work on each run's facts (`run_facts.RunFacts`)."""

from __future__ import annotations

import hashlib
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tracegym.analysis.clustering import assign, cluster
from tracegym.analysis.detection import run_detectors
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.registry import default_detectors
from tracegym.analysis.embeddings import Embedder
from tracegym.analysis.gap import Gap, GapsDocument, GapThresholds, RejectedCandidate, RunCounts
from tracegym.analysis.gap_selection import (
    Candidate,
    Scored,
    Thresholds,
    candidates_from_findings,
    describe,
    gap_name,
    like_with_like,
    score,
    select,
)
from tracegym.analysis.run_archive import RunArchive
from tracegym.analysis.run_facts import RunFacts
from tracegym.analysis.runs import BATCH_ROWS, Run, load_runs
from tracegym.analysis.streaming import (
    MAX_RESIDENT,
    Detected,
    check_engine,
    count_runs,
    detect_streamed,
)
from tracegym.store.home import Home


@dataclass
class Analysis:
    """Everything one analysis found; `gaps_document()` is what gaps.json holds. `runs` is a
    list, or a `RunArchive` read from disk when the analysis streamed (`streamed`); `facts`
    has every run's outcome, request and tools in memory either way."""

    runs: Sequence[Run]
    findings: dict[str, list[Finding]]
    scored: list[Scored]
    gaps: list[Gap]
    thresholds: Thresholds
    detector_errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    embedded: int = 0  # signatures the model embedded (0 when all came from the cache)
    facts: list[RunFacts] = field(default_factory=list)
    fitted_on: int = 0  # runs the detectors were fitted on (fewer than `runs` when streamed)

    @property
    def streamed(self) -> bool:
        return isinstance(self.runs, RunArchive)

    @property
    def failed(self) -> list[Run]:
        """The failed runs themselves (read back from disk when streamed, and all held: for
        small analyses; `facts` say which runs failed at any size)."""
        return [r for r in self.runs if r.success is False]

    @property
    def succeeded(self) -> list[Run]:
        return [r for r in self.runs if r.success is True]

    def _count(self, success: bool) -> int:
        return sum(1 for f in self.facts if f.success is success)

    @property
    def contrast(self) -> str:
        if not self._count(False):
            return "no failed runs: nothing to explain"
        if not self._count(True):
            return "no successful runs: gaps are ranked by coverage alone, without contrast"
        return "failed vs successful runs"

    def gaps_document(self) -> GapsDocument:
        rejected = sorted((s for s in self.scored if not s.kept),
                          key=lambda s: -s.coverage)[:20]  # fmt: skip
        return GapsDocument(
            generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            runs=RunCounts(total=len(self.facts), failed=self._count(False),
                           succeeded=self._count(True),
                           unknown=len(self.facts) - self._count(False) - self._count(True),
                           fitted_on=self.fitted_on if self.streamed else None),
            contrast=self.contrast,
            thresholds=GapThresholds(**vars(self.thresholds)),
            gaps=tuple(self.gaps),
            rejected=tuple(RejectedCandidate(key=s.candidate.key, kind=s.candidate.kind,
                                             coverage=round(s.coverage, 4),
                                             delta=None if s.delta is None else round(s.delta, 4),
                                             stability=s.stability, why=s.why)
                           for s in rejected),
            detector_errors=self.detector_errors,
        )  # fmt: skip


def default_detector_set() -> list[Detector]:
    return default_detectors()


def cluster_candidates(
    facts: Sequence[RunFacts],
    findings: dict[str, list[Finding]],
    embedder: Embedder,
    distance_threshold: float,
) -> list[Candidate]:
    """Clusters of failed runs' signatures; successful runs join the nearest cluster if close."""
    signed = [(r, r.signature) for r in facts if r.signature]
    failed = [(r, s) for r, s in signed if r.success is False]
    others = [(r, s) for r, s in signed if r.success is not False]
    if not failed:
        return []
    vectors = embedder.encode([s for _, s in failed])
    labels = cluster(vectors, distance_threshold)
    groups: dict[int, list[int]] = defaultdict(list)
    for i, label in enumerate(labels):
        groups[int(label)].append(i)
    centroids = np.stack([vectors[idx].mean(axis=0) for _, idx in sorted(groups.items())])
    joined = assign(embedder.encode([s for _, s in others]), centroids, distance_threshold)
    result = []
    for label, members in sorted(groups.items()):
        centroid = centroids[label]
        medoid = max(members, key=lambda i: float(vectors[i] @ centroid))
        key = "cluster:" + hashlib.sha256(failed[medoid][1].encode()).hexdigest()[:8]
        c = Candidate(key, "cluster", None)
        for i in members:
            run = failed[i][0]
            c.lacking.add(run.trace_id)
            c.findings.extend(findings.get(run.trace_id, []))
        c.signatures = [failed[medoid][1]] + [failed[i][1] for i in members if i != medoid]
        for (run, _), label_of in zip(others, joined, strict=True):
            if label_of == label:
                c.lacking.add(run.trace_id)
        result.append(c)
    return result


def _in_memory(
    store: Any, where: str, detectors: Sequence[Detector], batch_rows: int,
    timings: dict[str, float], say: Callable[[str], None],
) -> Detected:  # fmt: skip
    clock = time.perf_counter()
    runs = load_runs(store, where, batch_rows)
    timings["load"] = time.perf_counter() - clock
    say(f"running the detectors on {len(runs)} run{'' if len(runs) == 1 else 's'}")
    clock = time.perf_counter()
    findings, errors = run_detectors(detectors, runs)
    facts = [RunFacts.of(r, findings.get(r.trace_id, [])) for r in runs]
    timings["detect"] = time.perf_counter() - clock
    return Detected(runs, facts, findings, errors, len(runs))


def analyze(
    home: str | os.PathLike[str] | None = None,
    *,
    store: Any = None,
    detectors: Sequence[Detector] | None = None,
    thresholds: Thresholds | None = None,
    cluster_distance: float = 0.35,
    embedder: Embedder | None = None,
    where: str = "",
    write: bool = True,
    extra_candidates: Callable[[Sequence[Run]], Sequence[Candidate]] | None = None,
    progress: Callable[[str], None] | None = None,
    batch_rows: int = BATCH_ROWS,
    max_resident: int = MAX_RESIDENT,
    workers: int | None = None,
    engine: str = "processes",
) -> Analysis:
    """Analyse the runs under `home` (or an open `store`) and write `<home>/gaps.json`.
    `extra_candidates`, given the runs, adds candidates (an optional LLM judge's:
    `analysis.judge.judge_hook`) scored and selected like the detectors' and clusters'.
    `progress`, if given, is told each stage as it starts (the CLI shows it: a cold analysis
    spends most of its time loading and running the embedding model). `batch_rows`: span rows
    fetched from the store at a time while loading (`runs.iter_runs`); results do not depend
    on it. `max_resident`: past this many runs the analysis streams (`analysis.streaming`),
    in `workers` processes (default: one per CPU; the same results as one), or with `engine`
    "spark" in Spark tasks (the active SparkSession's, else a local one of `workers` cores:
    `analysis.spark_tasks`)."""
    from tracegym.store.store import Store  # duckdb: only when analysing a home

    check_engine(engine)
    say = progress or (lambda _stage: None)
    t = thresholds or Thresholds()
    chosen = detectors if detectors is not None else default_detector_set()
    say("loading runs")
    timings: dict[str, float] = {}
    own = store is None
    store = store or Store(home)
    try:
        total = count_runs(store, where)
        if total <= max_resident:
            detected = _in_memory(store, where, chosen, batch_rows, timings, say)
        else:
            detected = detect_streamed(store, where, chosen, batch_rows=batch_rows, total=total,
                                       sample=max(1, max_resident), timings=timings, say=say,
                                       workers=workers or os.cpu_count() or 1,
                                       engine=engine)  # fmt: skip
    finally:
        if own:
            store.close()
    runs, facts, findings = detected.runs, detected.facts, detected.findings

    clock = time.perf_counter()
    embedder = embedder or Embedder(Home.at(store.home).cache)
    before = embedder.computed
    candidates = candidates_from_findings(f for fs in findings.values() for f in fs)
    say("embedding and clustering failure signatures (the first time loads the model)")
    candidates += cluster_candidates(facts, findings, embedder, cluster_distance)
    timings["cluster"] = time.perf_counter() - clock
    if extra_candidates is not None:
        say("asking the judge")
        clock = time.perf_counter()
        candidates += list(extra_candidates(runs))
        timings["extra"] = time.perf_counter() - clock

    say(f"scoring {len(candidates)} candidates")
    clock = time.perf_counter()
    failed = [r.trace_id for r in facts if r.success is False]
    succeeded = [r.trace_id for r in facts if r.success is True]
    scored = [score(c, failed, succeeded, t) for c in candidates]
    like_with_like(scored, facts, t)
    kept = select(scored, failed, t)
    by_trace = runs.by_trace if isinstance(runs, RunArchive) else {r.trace_id: r for r in runs}
    by_facts = {r.trace_id: r for r in facts}
    successes = [r for r in facts if r.success is True]
    detector_text = {d.name: d.description for d in chosen}
    names: set[str] = set()
    gaps = []
    for rank, s in enumerate(kept, 1):
        name = gap_name(s.candidate)
        while name in names:
            name += "_2"
        names.add(name)
        gaps.append(describe(s, name, by_trace, successes, detector_text, rank, s.symptoms,
                             facts=by_facts))  # fmt: skip
    timings["score"] = time.perf_counter() - clock
    result = Analysis(runs, findings, scored, gaps, t, detected.errors, timings,
                      embedded=embedder.computed - before, facts=facts,
                      fitted_on=detected.fitted_on)  # fmt: skip
    if write:
        result.gaps_document().write(store.home)
    return result
