"""Detector findings and the attributed decisive step of one run, for the run page.

`tracegym analyze` keeps only each gap's evidence (gaps.json), not every finding of every run,
and running the detectors over a whole store is a batch job. So the run page shows the gap
evidence that names the run (exact: it is what analysis found) plus the findings of the
built-in detectors on this run alone, fitted once per server on a bounded reference sample of
recent runs with an outcome (`SAMPLE_RUNS`), in a background thread; then attribution
(analysis/attribution.py) on the run with those findings. Loading is by parameters only.
"""

from __future__ import annotations

import threading
from typing import Any

from tracegym.dashboards.db import Database

SAMPLE_RUNS = 300

_STEP_COLUMNS = [
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "operation",
    "agent",
    "step_index",
    "tool",
    "call_id",
    "input",
    "output",
    "status",
    "error_type",
    "start_ns",
    "end_ns",
    "duration_ms",
    "input_tokens",
    "output_tokens",
    "memory_store",
    "memory_record",
    "memory_content_hash",
    "memory_result_hashes",
    "subtask",
    "attributes",
]


def load_runs(db: Database, trace_ids: list[str]) -> list[Any]:
    """`analysis.runs.Run`s for these traces (parameterised, unlike `load_runs(where=...)`)."""
    from tracegym.analysis.runs import build_runs

    if not trace_ids:
        return []
    traces = db.query(
        "SELECT trace_id, run_id, agent, success, reward, outcome_source, outcome_labels "
        "FROM traces WHERE list_contains($ids, trace_id) ORDER BY start_time, trace_id",
        {"ids": trace_ids},
    )
    columns = ", ".join(f"s.{c}" for c in _STEP_COLUMNS)
    steps = db.query(
        f"SELECT {columns}, m.source_write_span_ids FROM spans s "
        "LEFT JOIN memory_ops m ON m.span_id = s.span_id AND m.trace_id = s.trace_id "
        "WHERE list_contains($ids, s.trace_id)",
        {"ids": trace_ids},
    )
    return build_runs(steps.dicts(), traces.dicts())


class FindingsModel:
    """The built-in detectors, fitted on a sample of recent runs (in the background)."""

    def __init__(self, db: Database, sample_runs: int = SAMPLE_RUNS) -> None:
        self.db = db
        self.sample_runs = sample_runs
        self.detectors: list[Any] | None = None
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
            self.fitted_on = len(sample)
        except Exception as exc:  # no analysis extra, a broken lake: the page says so
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._ready.set()

    def wait(self, timeout: float) -> bool:
        self.start()
        return self._ready.wait(timeout)

    def analyse(self, trace_id: str, timeout: float = 0.5) -> dict[str, Any]:
        """{"findings", "attribution", "note"} for one run; never raises."""
        out: dict[str, Any] = {"findings": [], "attribution": None, "note": None}
        try:
            runs = load_runs(self.db, [trace_id])
        except Exception as exc:
            out["note"] = f"cannot load the run for analysis: {exc}"
            return out
        if not runs:
            return out
        run = runs[0]
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
                from tracegym.analysis.attribution import attribute

                attribution = attribute(run, findings)
                out["attribution"] = {
                    **attribution.to_dict(),
                    "rule": attribution.rule,
                    "position": attribution.position,
                }
                step = next((s for s in run.steps if s.position == attribution.position), None)
                out["attribution"]["span_id"] = step.span_id if step else None
            except Exception as exc:
                out["note"] = f"attribution failed: {exc}"
        return out
