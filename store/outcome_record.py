"""Recording a run's outcome from outside the agent: `tracegym outcome` and the dashboard's
form go through this one function, so both write the same outcome span the same way.

The outcome travels like the agent's own `tg.record_outcome`: through the tracer's pipeline
into the home's spool (so redaction and the spool format are the tracer's), flushed at once,
and checked to have reached the spool. Recording (re)starts tracing in the calling process
with the home as its spool: one recording at a time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_lock = threading.Lock()


class OutcomeNotRecorded(RuntimeError):
    """Tracing is off, or the outcome span did not reach the spool."""


class TracingOff(OutcomeNotRecorded):
    """OTEL_SDK_DISABLED or TRACEGYM_SPOOL=0: the process records nothing."""


@dataclass(frozen=True)
class Outcome:
    """What a person (or a verifier) says about one run. `source` is who judged it."""

    run_id: str
    success: bool | None = None
    reward: float | None = None
    source: str = "user"
    labels: Mapping[str, Any] | None = None

    def checked(self) -> Outcome:
        """This outcome with its run id stripped; ValueError for one that says nothing."""
        run_id = self.run_id.strip()
        if not run_id:
            raise ValueError("RUN_ID is empty")
        if self.success is None and self.reward is None:
            raise ValueError("say how the run ended: --success or --failure, and/or --reward R")
        if self.reward is not None and not math.isfinite(self.reward):
            raise ValueError(f"--reward must be a finite number, got {self.reward}")
        return Outcome(run_id, self.success, self.reward, self.source, self.labels)

    def summary(self) -> str:
        verdict = {True: "success", False: "failure", None: "-"}[self.success]
        shown = "-" if self.reward is None else f"{self.reward:g}"
        return f"{self.run_id}: {verdict}, reward {shown}, source {self.source}"


def record(home: Path, outcome: Outcome, service: str = "tracegym-cli") -> Outcome:
    """Record `outcome` into the spool under `home`; returns it as recorded. Raises ValueError
    for an outcome that says nothing, OutcomeNotRecorded when it did not reach the store."""
    from tracegym import tracer as tg

    outcome = outcome.checked()
    with _lock:
        if tg.init(service=service, home=home) is None:
            raise TracingOff(
                "tracing is off (OTEL_SDK_DISABLED or TRACEGYM_SPOOL=0): nowhere to record to"
            )
        before = tg.stats().counters.get("spans_exported.spool", 0)
        tg.record_outcome(
            outcome.run_id,
            success=outcome.success,
            reward=outcome.reward,
            source=outcome.source,
            labels=dict(outcome.labels) if outcome.labels else None,
        )
        flushed = tg.flush()
        after = tg.stats().counters.get("spans_exported.spool", 0)
    if not flushed or after <= before:
        raise OutcomeNotRecorded(f"the outcome did not reach the store under {home}")
    return outcome
