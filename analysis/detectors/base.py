"""The detector interface: small, composable components in the style of scikit-learn.

A detector may learn from a population of runs (`fit`: e.g. precedence rules mined from the
successful ones) and then reports, per run, `Finding`s that each name the decisive step, the
agent, the spans that prove it and a `key`: the candidate capability it points at. Add your own
by subclassing `Detector` and passing it to `tracegym.analysis.analyze(detectors=[...])`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracegym.analysis.runs import Run


@dataclass(frozen=True)
class Finding:
    """One piece of evidence that a run lacked a capability."""

    detector: str  # the detector's name, e.g. "wrong_tool_order"
    key: str  # the candidate capability, e.g. "wrong_tool_order:get_order>refund_order"
    trace_id: str
    position: int | None  # the decisive step's `Step.position` in the run
    step_index: int | None  # the same step in the source's own indexing (`Step.step_index`)
    agent: str | None  # the agent responsible for that step
    span_ids: tuple[str, ...]  # the spans that prove it (decisive step first)
    message: str  # one sentence a person can check against the spans
    confidence: float = 1.0  # 0..1: how sure the detector is that this step is decisive
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "detector": self.detector,
            "key": self.key,
            "trace_id": self.trace_id,
            "position": self.position,
            "step_index": self.step_index,
            "agent": self.agent,
            "span_ids": list(self.span_ids),
            "message": self.message,
            "confidence": self.confidence,
            "details": dict(self.details),
        }


class Detector(ABC):
    """Finds one kind of failure evidence in a run."""

    name: str = ""
    description: str = ""  # what lacking this capability means, for gap descriptions

    def fit(self, runs: Sequence[Run]) -> Detector:
        """Learn what the detector needs from the population (default: nothing)."""
        return self

    @abstractmethod
    def detect(self, run: Run) -> list[Finding]:
        """The findings in `run` (any run: analysis contrasts failures with successes)."""
