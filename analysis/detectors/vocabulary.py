"""Unknown values: a closed-vocabulary argument given a value successful runs never pass.

Some write arguments take one of a few values (a country code, a reason, a cabin class, a trip
type): the system accepts only those, or treats others differently. `fit` finds, per write tool
and argument, a *closed vocabulary*: at least `min_support` (5) successful calls pass a text
value, at most `max_values` (5) distinct ones (compared loosely: case and separators do not
count, so "one-way" is "one_way"), each passed in at least `min_runs` (2) successful runs, and
no more distinct values than a third of the calls (values that recur, not names or addresses).
`detect` flags a write call passing a value outside its argument's vocabulary ("US" where
successful runs always pass "USA"): key ``unknown_value:<tool>.<arg>``, decisive step the call,
confidence 0.6 (the vocabulary may be open after all). Nothing about any domain is hard-coded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence

from tracegym.analysis.arithmetic import parse_number
from tracegym.analysis.detector_names import UNKNOWN_VALUE
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import MAX_ENUM_TEXT, flatten, is_write
from tracegym.analysis.detectors.ungrounded import loose
from tracegym.analysis.features import step_ref
from tracegym.analysis.runs import Run, Step, parse_json


def text_arguments(step: Step) -> Iterator[tuple[str, str, str]]:
    """(argument path, value as passed, loose form) of a call's short text arguments."""
    for path, value in flatten(parse_json(step.input)):
        short = isinstance(value, str) and value.strip() and len(value) <= MAX_ENUM_TEXT
        if short and parse_number(value) is None:
            yield path, value, loose(value)


class UnknownValue(Detector):
    """Values outside an argument's closed vocabulary (see the module docstring).

    Parameters: `min_support` (5) successful calls, `max_values` (5) distinct values,
    `min_runs` (2) successful runs per value.
    """

    name = UNKNOWN_VALUE
    description = (
        "Passes an action a value outside the few its argument takes in successful runs (a "
        "code, a reason, a class): the system's vocabulary, not the user's words"
    )

    def __init__(self, min_support: int = 5, max_values: int = 5, min_runs: int = 2) -> None:
        self.min_support = min_support
        self.max_values = max_values
        self.min_runs = min_runs
        self.vocabulary_: dict[tuple[str, str], dict[str, str]] = {}  # loose -> as passed

    def fit(self, runs: Sequence[Run]) -> UnknownValue:
        calls: dict[tuple[str, str], int] = defaultdict(int)
        runs_of: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        shown: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
        for run in runs:
            if run.success is not True:
                continue
            for step in run.steps:
                if not is_write(step) or step.failed:
                    continue
                for path, raw, value in text_arguments(step):
                    key = (step.tool or step.name, path)
                    calls[key] += 1
                    runs_of[key][value].add(run.trace_id)
                    shown[key].setdefault(value, raw)
        self.vocabulary_ = {}
        for key, n in calls.items():
            values = runs_of[key]
            if (
                n >= self.min_support
                and len(values) <= self.max_values
                and len(values) <= n / 3
                and all(len(r) >= self.min_runs for r in values.values())
            ):
                self.vocabulary_[key] = dict(sorted(shown[key].items()))
        return self

    def detect(self, run: Run) -> list[Finding]:
        if not self.vocabulary_:
            return []
        findings: dict[str, Finding] = {}
        for step in run.steps:
            if not is_write(step):
                continue
            tool = step.tool or step.name
            for path, raw, value in text_arguments(step):
                known = self.vocabulary_.get((tool, path))
                key = f"{self.name}:{tool}.{path}"
                if known is None or value in known or key in findings:
                    continue
                findings[key] = Finding(
                    detector=self.name, key=key, trace_id=run.trace_id, **step_ref(step),
                    span_ids=(step.span_id,), confidence=0.6,
                    message=(f"{tool}({path}={raw!r}) passes a value successful runs never "
                             f"pass; they pass {' or '.join(repr(v) for v in known.values())}"),
                    details={"tool": tool, "argument": path, "value": raw,
                             "vocabulary": list(known.values())},
                )  # fmt: skip
        return list(findings.values())
