"""What gap selection needs of a run once the detectors are done with it.

Scoring, clustering and describing gaps look at every run, but only at a little of each: its
outcome, its request text, its tool sequence and its failure signature. `RunFacts` keeps that
(about a kilobyte a run), so a streamed analysis can let the run itself go after detection and
hold 100k runs' facts where it could not hold 100k runs. `RunFacts` answers the same questions
as `Run` for these stages (`request_kind()`, `tool_sequence()`, `failed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracegym.analysis.detectors.base import Finding
from tracegym.analysis.detectors.unserved import request_text
from tracegym.analysis.runs import Run, first_write
from tracegym.analysis.signatures import failure_signature


@dataclass(frozen=True, slots=True)
class RunFacts:
    """A run's outcome, request, tool sequence and failure signature (empty without findings)."""

    trace_id: str
    run_id: str | None
    agent: str | None
    success: bool | None
    request: str  # `unserved.request_text`
    tools: tuple[str, ...]  # `Run.tool_sequence`
    signature: str  # `signatures.failure_signature` of the run's findings

    @classmethod
    def of(cls, run: Run, findings: Sequence[Finding] = ()) -> RunFacts:
        return cls(
            trace_id=run.trace_id,
            run_id=run.run_id,
            agent=run.agent,
            success=run.success,
            request=request_text(run),
            tools=tuple(run.tool_sequence()),
            signature=failure_signature(run, findings),
        )

    @property
    def failed(self) -> bool:
        return self.success is False

    def tool_sequence(self) -> list[str]:
        return list(self.tools)

    def request_kind(self) -> str | None:
        """`Run.request_kind`: the first write tool the run calls."""
        return first_write(self.tools)


def request_of(run: Run | RunFacts) -> str:
    """The run's request text, from its facts when that is what is held."""
    return run.request if isinstance(run, RunFacts) else request_text(run)
