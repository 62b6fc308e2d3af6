"""`analyze`: runs -> detector findings -> signatures, embeddings, clusters -> scored candidate
capabilities -> the kept gaps, written to `<home>/gaps.json` (schema: docs/gaps.md).

Up to `max_resident` runs are loaded and analysed in memory. Past that the runs stream: the
detectors are fitted on a seeded sample of `max_resident` runs (what they learn are rates and
rules, which a sample of that size pins down), then every run streams from the lake through
them, one at a time, leaving its findings, its facts (`run_facts.RunFacts`: what scoring,
clustering and describing gaps need) and a compressed copy on disk (`run_archive.RunArchive`,
read back only for the steps the kept gaps' findings name). Memory then stays flat in the
number of runs, bar those few facts and findings per run (docs/scale.md)."""

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
from tracegym.analysis.run_archive import RunArchive
from tracegym.analysis.run_facts import RunFacts
from tracegym.analysis.runs import BATCH_ROWS, Run, iter_runs, load_runs
from tracegym.store.home import Home
from tracegym.tracer import internal


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
                           unknown=len(self.facts) - self._count(False) - self._count(True)),
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
    and memory provenance may reach into runs without an outcome), then detect run by run
    (`Detection`); a failing detector is reported (and skipped from then on), never fatal."""
    detection = Detection.fitted(detectors, runs)
    findings = {run.trace_id: detection.detect(run) for run in runs}
    return findings, detection.errors


class Detection:
    """Fitted detectors applied to one run after another: every detector on one run in turn
    (what several of them work out from a run, its reads, is worked out once:
    `state.remembering_reads`). A detector that raises is reported in `errors` and skipped
    from then on: a user's detector must not sink the analysis."""

    def __init__(self, detectors: Sequence[Detector]) -> None:
        self.detectors = list(detectors)
        self.names = [d.name or type(d).__name__ for d in self.detectors]
        self.errors: dict[str, str] = {}
        self.working: list[int] = []

    @classmethod
    def fitted(cls, detectors: Sequence[Detector], runs: Sequence[Run]) -> Detection:
        detection = cls(detectors)
        for i, detector in enumerate(detection.detectors):
            try:
                detector.fit(runs)
                detection.working.append(i)
            except Exception as exc:  # a user's detector must not sink the analysis
                _failed(detection.errors, detection.names[i], exc)
        return detection

    def detect(self, run: Run) -> list[Finding]:
        from tracegym.analysis.detectors.state import remembering_reads

        found: list[Finding] = []
        with remembering_reads():
            for i in list(self.working):
                try:
                    found.extend(self.detectors[i].detect(run))
                except Exception as exc:  # a user's detector must not sink the analysis
                    self.working.remove(i)
                    _failed(self.errors, self.names[i], exc)
        return found


def _failed(errors: dict[str, str], name: str, exc: Exception) -> None:
    errors[name] = f"{type(exc).__name__}: {exc}"
    internal.report_error(f"detector.{name}", exc)


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


MAX_RESIDENT = 20_000  # runs analysed in memory; past this they stream (module docstring)


def count_runs(store: Any, where: str = "") -> int:
    """The runs `iter_runs(store, where)` yields."""
    within = f"WHERE {where}" if where else ""
    return int(store.sql(f"SELECT count(*) FROM traces {within}").fetchall()[0][0])


def sample_filter(where: str, size: int) -> str:
    """A condition over the `traces` view keeping a seeded sample of `size` of the runs
    `where` keeps: those of the smallest hash of their trace id (uniform, the same every
    time, and no trace content in the SQL)."""
    within = f"WHERE {where}" if where else ""
    sample = (f"trace_id IN (SELECT trace_id FROM traces {within} "
              f"ORDER BY hash(trace_id), trace_id LIMIT {int(size)})")  # fmt: skip
    return f"({where}) AND {sample}" if where else sample


@dataclass
class _Detected:
    runs: Sequence[Run]
    facts: list[RunFacts]
    findings: dict[str, list[Finding]]
    errors: dict[str, str]
    fitted_on: int


def _in_memory(
    store: Any, where: str, detectors: Sequence[Detector], batch_rows: int,
    timings: dict[str, float], say: Callable[[str], None],
) -> _Detected:  # fmt: skip
    clock = time.perf_counter()
    runs = load_runs(store, where, batch_rows)
    timings["load"] = time.perf_counter() - clock
    say(f"running the detectors on {len(runs)} run{'' if len(runs) == 1 else 's'}")
    clock = time.perf_counter()
    findings, errors = run_detectors(detectors, runs)
    facts = [RunFacts.of(r, findings.get(r.trace_id, [])) for r in runs]
    timings["detect"] = time.perf_counter() - clock
    return _Detected(runs, facts, findings, errors, len(runs))


def _streamed(
    store: Any, where: str, detectors: Sequence[Detector], batch_rows: int, total: int,
    sample: int, timings: dict[str, float], say: Callable[[str], None],
) -> _Detected:  # fmt: skip
    say(f"{total} runs: fitting the detectors on a sample of {sample}")
    clock = time.perf_counter()
    fitting = load_runs(store, sample_filter(where, sample), batch_rows)
    timings["load"] = time.perf_counter() - clock
    clock = time.perf_counter()
    detection = Detection.fitted(detectors, fitting)
    fitted_on = len(fitting)
    del fitting
    timings["fit"] = time.perf_counter() - clock
    say(f"streaming {total} runs through the detectors")
    clock = time.perf_counter()
    archive = RunArchive()
    findings: dict[str, list[Finding]] = {}
    facts = []
    for run in iter_runs(store, where, batch_rows):
        found = findings[run.trace_id] = detection.detect(run)
        facts.append(RunFacts.of(run, found))
        archive.append(run)
    timings["detect"] = time.perf_counter() - clock
    return _Detected(archive, facts, findings, detection.errors, fitted_on)


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
) -> Analysis:
    """Analyse the runs under `home` (or an open `store`) and write `<home>/gaps.json`.
    `extra_candidates`, given the runs, adds candidates (an optional LLM judge's:
    `analysis.judge.judge_hook`) scored and selected like the detectors' and clusters'.
    `progress`, if given, is told each stage as it starts (the CLI shows it: a cold analysis
    spends most of its time loading and running the embedding model). `batch_rows`: span rows
    fetched from the store at a time while loading (`runs.iter_runs`); results do not depend
    on it. `max_resident`: past this many runs the analysis streams (module docstring)."""
    from tracegym.store.store import Store  # duckdb: only when analysing a home

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
            detected = _streamed(store, where, chosen, batch_rows, total, max(1, max_resident),
                                 timings, say)  # fmt: skip
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
