"""Wrong amounts: a number passed to a write that nothing the run saw gives, even by arithmetic.

The amounts a write takes (a payment, a refund, a quantity of data, a split of a total) should
follow from numbers the run saw before the call: the run input, user and system messages, tool
results. `WrongAmount` checks every *amount* in a write call's arguments -- a JSON number, or a
string written as a decimal or money ("12.50", "$1,000") -- and flags one that is not
`arithmetic.derived` from those numbers: equal to one, a sum, difference, product or ratio of
two, a small count times one or a split of one in 2..10 parts, a sum of three; compared at the
amount's own precision (at least cents), so "1,000.00" and 1000 are the same.

Not checked: digit strings without a decimal point (ids, zip codes: `ungrounded_argument`'s
job), whole numbers below `min_number` (10: counts an agent says in words), and the amounts of an
argument's *vocabulary* (`fit`: values successful runs pass to the same argument without a
derivation in at least `vocabulary_runs` runs: the agent's own constants).

Key ``wrong_amount:<tool>.<arg>``; decisive step: the write call; the latest result or message
holding the numbers nearest the amount follows in `span_ids`. Confidence 0.7.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.analysis.arithmetic import decimals_of, derived, numbers_in, parse_number
from tracegym.analysis.detector_names import WRONG_AMOUNT
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import flatten, is_write
from tracegym.analysis.detectors.ungrounded import Evidence
from tracegym.analysis.features import step_ref
from tracegym.analysis.runs import Run, Step, parse_json


@dataclass(frozen=True)
class Amount:
    """One amount in a write call's arguments."""

    arg: str  # argument path ("amount", "payments[].amount")
    raw: Any  # as the agent passed it
    value: float
    decimals: int


def amounts(step: Step, min_number: float = 10) -> list[Amount]:
    """The amounts of a call's arguments (see the module docstring)."""
    found = []
    for path, raw in flatten(parse_json(step.input)):
        if isinstance(raw, bool):
            continue
        if isinstance(raw, str) and not any(c in raw for c in ".$€£¥"):
            continue  # a digit string: an id, not an amount
        value = parse_number(raw)
        if value is None:
            continue
        if value.is_integer() and abs(value) < min_number:
            continue
        found.append(Amount(path, raw, value, max(decimals_of(raw), 2)))
    return found


def seen_numbers(evidence: Evidence) -> list[float]:
    """The numbers of every source the run could see so far, oldest first."""
    return numbers_in(leaf for source in evidence.sources for leaf in source.leaves)


def _nearest(evidence: Evidence, value: float) -> Step | None:
    """The latest source holding the number nearest `value` (where a reader would look)."""
    best: tuple[float, int] | None = None
    chosen = None
    for source in evidence.sources:
        for number in numbers_in(source.leaves):
            score = (abs(number - value), -source.position)
            if best is None or score < best:
                best, chosen = score, source.step
    return chosen


class WrongAmount(Detector):
    """Amounts in writes that the run's numbers do not give (see the module docstring).

    Parameters: `min_number` (10) whole numbers below it are not checked, `vocabulary_runs` (3)
    successful runs that make an underived value part of an argument's vocabulary.
    """

    name = WRONG_AMOUNT
    description = (
        "Passes an amount (a payment, refund, split or quantity) to an action that no number "
        "the run saw gives, even by simple arithmetic"
    )

    def __init__(self, min_number: float = 10, vocabulary_runs: int = 3) -> None:
        self.min_number = min_number
        self.vocabulary_runs = vocabulary_runs
        self.vocabulary_: set[tuple[str, str, float]] = set()

    def _underived(self, run: Run) -> list[tuple[Step, Amount, str | None]]:
        """(write, amount, how it is derived or None) for every amount of the run's writes."""
        evidence = Evidence(run)
        out = []
        for step in run.steps:
            if not is_write(step):
                continue
            found = amounts(step, self.min_number)
            if not found:
                continue
            evidence.advance(step.position)
            known = seen_numbers(evidence)
            for amount in found:
                out.append((step, amount, derived(amount.value, known, decimals=amount.decimals)))
        return out

    def fit(self, runs: Sequence[Run]) -> WrongAmount:
        counts: Counter[tuple[str, str, float]] = Counter()
        for run in runs:
            if run.success is not True:
                continue
            counts.update(
                {(s.tool or s.name, a.arg, a.value) for s, a, how in self._underived(run)
                 if how is None}
            )  # fmt: skip
        self.vocabulary_ = {k for k, n in counts.items() if n >= self.vocabulary_runs}
        return self

    def detect(self, run: Run) -> list[Finding]:
        findings: dict[str, Finding] = {}
        evidence = Evidence(run)
        for step, amount, how in self._underived(run):
            tool = step.tool or step.name
            if how is not None or (tool, amount.arg, amount.value) in self.vocabulary_:
                continue
            key = f"{self.name}:{tool}.{amount.arg}"
            if key in findings:
                continue
            evidence.advance(step.position)
            near = _nearest(evidence, amount.value)
            spans = [step.span_id] + ([near.span_id] if near is not None else [])
            findings[key] = Finding(
                detector=self.name, key=key, trace_id=run.trace_id, **step_ref(step),
                span_ids=tuple(spans),
                message=(
                    f"{tool}({amount.arg}={amount.raw!r}) passes an amount that no number the "
                    "run saw before (tool results, messages, the run input) gives, as such or "
                    "by a sum, difference, product, split or count"
                ),
                confidence=0.7,
                details={"tool": tool, "argument": amount.arg, "value": amount.value,
                         "nearest_position": near.position if near is not None else None},
            )  # fmt: skip
        return list(findings.values())
