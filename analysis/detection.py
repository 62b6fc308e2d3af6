"""Running detectors: fit them all on a population, then detect run by run (`Detection`)."""

from __future__ import annotations

from collections.abc import Sequence

from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import remembering_reads
from tracegym.analysis.runs import Run
from tracegym.tracer import internal


def run_detectors(
    detectors: Sequence[Detector], runs: Sequence[Run]
) -> tuple[dict[str, list[Finding]], dict[str, str]]:
    """Fit every detector on all runs (each learns its statistics from the successful ones,
    and memory provenance may reach into runs without an outcome), then detect run by run."""
    detection = Detection.fitted(detectors, runs)
    findings = {run.trace_id: detection.detect(run) for run in runs}
    return findings, detection.errors


class Detection:
    """Fitted detectors applied to one run after another: every detector on one run in turn
    (what several of them work out from a run, its reads, is worked out once:
    `state.remembering_reads`). A detector that raises is reported in `errors` (and counted by
    `tracer.internal`) and skipped from then on: a user's detector must not sink the analysis."""

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
