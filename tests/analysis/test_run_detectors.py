"""`pipeline.run_detectors`: fit all, then detect run by run; a failing detector is reported
once and skipped from then on; a run's reads are worked out once for all detectors."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from tracegym.analysis.detectors import state
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.pipeline import run_detectors
from tracegym.analysis.runs import Run

from tests.analysis.test_detectors import shop_run


class Counting(Detector):
    """One finding per run; raises in `fit`, or in `detect` on the run named `fails_on`."""

    def __init__(self, name: str, fails_on: str | None = None, fit_fails: bool = False):
        self.name, self.fails_on, self.fit_fails = name, fails_on, fit_fails
        self.detected: list[str] = []

    def fit(self, runs: Sequence[Run]) -> Counting:
        if self.fit_fails:
            raise RuntimeError("cannot fit")
        return self

    def detect(self, run: Run) -> list[Finding]:
        self.detected.append(run.trace_id)
        if run.trace_id == self.fails_on:
            raise ValueError(f"broke on {run.trace_id}")
        state.reads(run)  # what the built-in detectors ask of every run
        return [Finding(self.name, f"{self.name}:x", run.trace_id, 1, 1, "a", (), "m")]


def _runs() -> list[Run]:
    return [shop_run(order=f"A-100{i}") for i in range(3)]


def test_a_detector_failing_on_one_run_keeps_its_earlier_findings_and_stops():
    runs = _runs()
    good, bad, unfit = (
        Counting("good"),
        Counting("bad", fails_on=runs[1].trace_id),
        Counting("unfit", fit_fails=True),
    )
    findings, errors = run_detectors([good, bad, unfit], runs)
    assert errors == {"bad": f"ValueError: broke on {runs[1].trace_id}",
                      "unfit": "RuntimeError: cannot fit"}  # fmt: skip
    assert good.detected == [r.trace_id for r in runs]
    assert bad.detected == [r.trace_id for r in runs[:2]]  # not asked again after it failed
    assert unfit.detected == []
    assert [[f.detector for f in findings[r.trace_id]] for r in runs] == [
        ["good", "bad"],
        ["good"],
        ["good"],
    ]


def test_a_runs_reads_are_worked_out_once_for_every_detector(monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    read_of = state.read_of

    def counting(step):
        calls.append(step.trace_id)
        return read_of(step)

    monkeypatch.setattr(state, "read_of", counting)
    runs = _runs()
    run_detectors([Counting("a"), Counting("b"), Counting("c")], runs)
    steps = len(runs[0].steps)
    assert [calls.count(r.trace_id) for r in runs] == [steps] * 3  # once a run, not thrice
    state.reads(runs[0])
    state.reads(runs[0])
    assert calls.count(runs[0].trace_id) == 3 * steps  # outside the detection: not remembered
