"""`analyze`: runs -> detector findings -> signatures, embeddings, clusters -> scored candidate
capabilities -> the kept gaps, written to `<home>/gaps.json` (schema: docs/gaps.md)."""

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
from tracegym.analysis.runs import BATCH_ROWS, Run, load_runs
from tracegym.analysis.signatures import failure_signature
from tracegym.store.home import Home
from tracegym.tracer import internal


@dataclass
class Analysis:
    """Everything one analysis found; `gaps_document()` is what gaps.json holds."""

    runs: list[Run]
    findings: dict[str, list[Finding]]
    scored: list[Scored]
    gaps: list[Gap]
    thresholds: Thresholds
    detector_errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    embedded: int = 0  # signatures the model embedded (0 when all came from the cache)

    @property
    def failed(self) -> list[Run]:
        return [r for r in self.runs if r.success is False]

    @property
    def succeeded(self) -> list[Run]:
        return [r for r in self.runs if r.success is True]

    @property
    def contrast(self) -> str:
        if not self.failed:
            return "no failed runs: nothing to explain"
        if not self.succeeded:
            return "no successful runs: gaps are ranked by coverage alone, without contrast"
        return "failed vs successful runs"

    def gaps_document(self) -> GapsDocument:
        rejected = sorted((s for s in self.scored if not s.kept),
                          key=lambda s: -s.coverage)[:20]  # fmt: skip
        return GapsDocument(
            generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            runs=RunCounts(total=len(self.runs), failed=len(self.failed),
                           succeeded=len(self.succeeded),
                           unknown=len(self.runs) - len(self.failed) - len(self.succeeded)),
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


def run_detectors(
    detectors: Sequence[Detector], runs: Sequence[Run]
) -> tuple[dict[str, list[Finding]], dict[str, str]]:
    """Fit every detector on all runs (each learns its statistics from the successful ones,
    and memory provenance may reach into runs without an outcome), then detect run by run,
    every detector on one run in turn (what several of them work out from a run, its reads,
    is worked out once: `state.remembering_reads`); a failing detector is reported (and
    skipped from then on), never fatal."""
    from tracegym.analysis.detectors.state import remembering_reads

    findings: dict[str, list[Finding]] = defaultdict(list)
    errors: dict[str, str] = {}
    names = [detector.name or type(detector).__name__ for detector in detectors]
    working: list[int] = []
    for i, detector in enumerate(detectors):
        try:
            detector.fit(runs)
            working.append(i)
        except Exception as exc:  # a user's detector must not sink the analysis
            _failed(errors, names[i], exc)
    failed: set[int] = set()
    for run in runs:
        found = findings[run.trace_id]
        with remembering_reads():
            for i in working:
                if i in failed:
                    continue
                try:
                    found.extend(detectors[i].detect(run))
                except Exception as exc:  # a user's detector must not sink the analysis
                    failed.add(i)
                    _failed(errors, names[i], exc)
    return dict(findings), errors


def _failed(errors: dict[str, str], name: str, exc: Exception) -> None:
    errors[name] = f"{type(exc).__name__}: {exc}"
    internal.report_error(f"detector.{name}", exc)


def cluster_candidates(
    runs: Sequence[Run],
    findings: dict[str, list[Finding]],
    embedder: Embedder,
    distance_threshold: float,
) -> list[Candidate]:
    """Clusters of failed runs' signatures; successful runs join the nearest cluster if close."""
    signed = [(r, failure_signature(r, findings.get(r.trace_id, []))) for r in runs]
    signed = [(r, s) for r, s in signed if s]
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
) -> Analysis:
    """Analyse the runs under `home` (or an open `store`) and write `<home>/gaps.json`.
    `extra_candidates`, given the loaded runs, adds candidates (an optional LLM judge's:
    `analysis.judge.judge_hook`) scored and selected like the detectors' and clusters'.
    `progress`, if given, is told each stage as it starts (the CLI shows it: a cold analysis
    spends most of its time loading and running the embedding model). `batch_rows`: span rows
    fetched from the store at a time while loading (`runs.iter_runs`); results do not depend
    on it."""
    from tracegym.store.store import Store  # duckdb: only when analysing a home

    say = progress or (lambda _stage: None)
    t = thresholds or Thresholds()
    say("loading runs")
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    own = store is None
    store = store or Store(home)
    try:
        runs = load_runs(store, where, batch_rows)
    finally:
        if own:
            store.close()
    timings["load"] = time.perf_counter() - clock

    say(f"running the detectors on {len(runs)} run{'' if len(runs) == 1 else 's'}")
    clock = time.perf_counter()
    findings, errors = run_detectors(
        detectors if detectors is not None else default_detector_set(), runs
    )
    timings["detect"] = time.perf_counter() - clock

    clock = time.perf_counter()
    embedder = embedder or Embedder(Home.at(store.home).cache)
    before = embedder.computed
    candidates = candidates_from_findings(f for fs in findings.values() for f in fs)
    say("embedding and clustering failure signatures (the first time loads the model)")
    candidates += cluster_candidates(runs, findings, embedder, cluster_distance)
    timings["cluster"] = time.perf_counter() - clock
    if extra_candidates is not None:
        say("asking the judge")
        clock = time.perf_counter()
        candidates += list(extra_candidates(runs))
        timings["extra"] = time.perf_counter() - clock

    say(f"scoring {len(candidates)} candidates")
    clock = time.perf_counter()
    failed = [r.trace_id for r in runs if r.success is False]
    succeeded = [r.trace_id for r in runs if r.success is True]
    scored = [score(c, failed, succeeded, t) for c in candidates]
    like_with_like(scored, runs, t)
    kept = select(scored, failed, t)
    by_trace = {r.trace_id: r for r in runs}
    successes = [r for r in runs if r.success is True]
    detector_text = {d.name: d.description for d in (detectors or default_detector_set())}
    names: set[str] = set()
    gaps = []
    for rank, s in enumerate(kept, 1):
        name = gap_name(s.candidate)
        while name in names:
            name += "_2"
        names.add(name)
        gaps.append(describe(s, name, by_trace, successes, detector_text, rank, s.symptoms))
    timings["score"] = time.perf_counter() - clock
    result = Analysis(runs, findings, scored, gaps, t, errors, timings,
                      embedded=embedder.computed - before)  # fmt: skip
    if write:
        result.gaps_document().write(store.home)
    return result
