"""Failure signatures: a short text per run, from its findings and the steps around the
decisive error, written so that runs failing the same way read alike (ids and numbers are
masked) and embed close together."""

from __future__ import annotations

import re
from collections.abc import Sequence

from tracegym.analysis.detectors.base import Finding
from tracegym.analysis.runs import Run, Step

_NUMBER = re.compile(r"\b\d+(?:[.,]\d+)*\b")
_ID = re.compile(r"\b(?=[A-Za-z0-9_#-]*\d)[A-Za-z0-9_#-]{4,}\b")  # tokens mixing digits in
_SPACE = re.compile(r"\s+")


def mask(text: str) -> str:
    """Replace run-specific values (ids, numbers) by placeholders."""
    return _SPACE.sub(" ", _NUMBER.sub("<n>", _ID.sub("<id>", text))).strip()


def _step_words(step: Step) -> str:
    what = step.tool or step.operation or step.name
    if step.failed:
        return f"{what} failed ({step.error_type or 'error'})"
    return what


def failure_signature(run: Run, findings: Sequence[Finding], context: int = 2) -> str:
    """One line per finding (kind and message, masked), then the steps around the first one."""
    if not findings:
        return ""
    ordered = sorted(findings, key=lambda f: (f.position if f.position is not None else 1 << 30,
                                              f.detector))  # fmt: skip
    lines = [f"{f.detector}: {mask(f.message)}" for f in ordered[:4]]
    decisive = ordered[0].position
    if decisive is not None:
        steps = [s for s in run.steps if s.operation not in (None, "invoke_agent", "subtask")]
        around = [s for s in steps if abs(s.position - decisive) <= context * 2]
        if around:
            lines.append("around: " + " > ".join(_step_words(s) for s in around[: 2 * context + 1]))
    return "\n".join(lines)
