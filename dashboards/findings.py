"""Detector findings and the attributed decisive step of one run, for the run page.

`tracegym analyze` keeps only each gap's evidence (gaps.json), not every finding of every run,
and running the detectors over a whole store is a batch job. So the run page shows the gap
evidence that names the run (exact: it is what analysis found) plus the findings of the
built-in detectors on this run alone, fitted once per server on a bounded reference sample of
recent runs with an outcome (`SAMPLE_RUNS`), in a background thread; then attribution
(analysis/attribution.py) on the run with those findings. Loading is by parameters only.

The decisive step is named as `tracegym show` and `tracegym attribute` name it
(store/steps.py): `#N name`, a tool call the model asked for naming the model call, the call
itself as what carried it out. A gap's evidence on a tool call and the attribution of its
model call are then one step on the page.
"""

from __future__ import annotations

import threading
from typing import Any

from tracegym.dashboards import queries
from tracegym.dashboards.db import Database
from tracegym.store.steps import describe

SAMPLE_RUNS = 300


def latest_outcome(trace_id: str, spans: list[dict[str, Any]], outcomes: list[dict[str, Any]]):
    """The run's latest outcome record among those naming its trace id or run id."""
    targets = set(queries.run_targets(trace_id, spans))
    mine = [o for o in outcomes if o["target"] in targets]
    return max(mine, key=lambda o: o["start_ns"] or 0) if mine else None


def fetch(db: Database, trace_ids: list[str]) -> dict[str, Any]:
    """Spans (by trace), provenance (by read span) and outcomes (by trace) of these runs."""
    spans = db.query(*_args(queries.run_spans(trace_ids))).dicts()
    provenance = {
        p["span_id"]: p for p in db.query(*_args(queries.run_provenance(trace_ids))).dicts()
    }
    by_trace: dict[str, list[dict[str, Any]]] = {t: [] for t in trace_ids}
    for span in spans:
        by_trace.setdefault(span["trace_id"], []).append(span)
        link = provenance.get(span["span_id"])
        span["source_write_span_ids"] = link["source_write_span_ids"] if link else None
        span["source_write_trace_ids"] = link["source_write_trace_ids"] if link else None
    targets = sorted({t for tid, rows in by_trace.items() for t in queries.run_targets(tid, rows)})
    outcomes = db.query(*_args(queries.run_outcomes(targets))).dicts() if targets else []
    return {
        "spans": by_trace,
        "outcomes": {t: latest_outcome(t, rows, outcomes) for t, rows in by_trace.items()},
    }


def _args(query: queries.Query) -> tuple[str, dict[str, Any]]:
    return query.sql, query.params


def build(trace_id: str, spans: list[dict[str, Any]], outcome: dict[str, Any] | None) -> Any:
    """An `analysis.runs.Run` from the rows `fetch` returned."""
    from tracegym.analysis.runs import build_runs

    root = next((s for s in spans if s["parent_span_id"] is None), spans[0] if spans else {})
    trace = {
        "trace_id": trace_id, "run_id": root.get("run_id"), "agent": root.get("agent"),
        "success": outcome["success"] if outcome else None,
        "reward": outcome["reward"] if outcome else None,
        "outcome_source": outcome["source"] if outcome else None,
        "outcome_labels": outcome["labels"] if outcome else None,
    }  # fmt: skip
    # A garbage row (no start, no span id) has no place in the step order: left out here,
    # still shown in the waterfall.
    usable = [s for s in spans if s["start_ns"] is not None and s["span_id"] is not None]
    return build_runs(usable, [trace])[0]


def load_runs(db: Database, trace_ids: list[str]) -> list[Any]:
    """`analysis.runs.Run`s for these traces, loaded by parameters only."""
    if not trace_ids:
        return []
    got = fetch(db, trace_ids)
    return [build(t, got["spans"][t], got["outcomes"][t]) for t in trace_ids if got["spans"][t]]


class FindingsModel:
    """The built-in detectors, fitted on a sample of recent runs (in the background)."""

    def __init__(self, db: Database, sample_runs: int = SAMPLE_RUNS) -> None:
        self.db = db
        self.sample_runs = sample_runs
        self.detectors: list[Any] | None = None
        self.profiles: dict[Any, Any] = {}  # per-system attribution profiles, from the sample
        self.error: str | None = None
        self.fitted_on = 0
        self._ready = threading.Event()
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._fit, name="tracegym-dashboard-fit", daemon=True).start()

    def _fit(self) -> None:
        try:
            from tracegym.analysis.detectors.registry import default_detectors

            ids = self.db.query(
                "SELECT trace_id FROM outcomes WHERE success IS NOT NULL "
                "ORDER BY recorded_at DESC LIMIT $n",
                {"n": self.sample_runs},
            )
            sample = load_runs(self.db, [r[0] for r in ids.rows])
            detectors = []
            for detector in default_detectors():
                try:
                    detectors.append(detector.fit(sample))
                except Exception:  # a detector that cannot fit on the sample is left out
                    continue
            self.detectors = detectors
            from tracegym.analysis.attribution import learn_profiles

            self.profiles = learn_profiles(sample)
            self.fitted_on = len(sample)
        except Exception as exc:  # no analysis extra, a broken lake: the page says so
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._ready.set()

    def wait(self, timeout: float) -> bool:
        self.start()
        return self._ready.wait(timeout)

    def analyse(self, run: Any, timeout: float = 0.5) -> dict[str, Any]:
        """{"findings", "attribution", "note"} for one `Run`; never raises."""
        out: dict[str, Any] = {"findings": [], "attribution": None, "note": None}
        findings: list[Any] = []
        if not self.wait(timeout):
            out["note"] = "the detectors are still being fitted; reload for their findings"
        elif self.error or self.detectors is None:
            out["note"] = f"detectors unavailable: {self.error}"
        else:
            for detector in self.detectors:
                try:
                    findings.extend(detector.detect(run))
                except Exception:
                    continue
            out["note"] = f"detectors fitted on the {self.fitted_on} most recent judged runs"
        out["findings"] = [f.to_dict() for f in findings]
        if run.success is False:
            try:
                from tracegym.analysis.attribution import attribute, system_key

                # the system's profile as `tracegym attribute` learns it, so both agree
                attribution = attribute(run, findings, profile=self.profiles.get(system_key(run)))
                out["attribution"] = {
                    **attribution.to_dict(),
                    "rule": attribution.rule,
                    "position": attribution.position,
                }
                step = next((s for s in run.steps if s.position == attribution.position), None)
                named = describe(run.steps, step.span_id) if step else None
                out["attribution"]["span_id"] = named.span_id if named else None
                out["attribution"]["decisive"] = str(named) if named else None
            except Exception as exc:
                out["note"] = f"attribution failed: {exc}"
        return out


def name_evidence(spans: list[dict[str, Any]], evidence: list[dict[str, Any]]) -> list[dict]:
    """The gap evidence naming this run, each with its decisive step as the surfaces name it
    (`decisive`: text, `decisive_span_id`); the stored `step` is the finding's own index."""
    out = []
    for e in evidence:
        first = next(iter(e.get("span_ids") or []), None)
        named = describe(spans, first) if first is not None else None
        shown = str(named) if named else (f"#{e['step']}" if e.get("step") is not None else None)
        out.append({**e, "decisive": shown, "decisive_span_id": named.span_id if named else None})
    return out


def decisive_span(analysis: dict[str, Any], evidence: list[dict[str, Any]]) -> str | None:
    """The span the page marks decisive: attribution's, else the first gap evidence's."""
    chosen = (analysis.get("attribution") or {}).get("span_id")
    if chosen is None and evidence:
        chosen = evidence[0].get("decisive_span_id")
    return chosen
