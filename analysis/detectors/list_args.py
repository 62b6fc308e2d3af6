"""Wrong list arguments: a write's list that is not what was looked up or what the user named.

A list argument of a write (the items to return, the flights of a reservation, the recipients)
relates to what the run saw in one of a few ways. Per call, with the list's elements normalised
(`ungrounded.loose`: case and separators do not count; an element that is an object is its
scalar values):

- ``equal``: the elements are exactly one list of one earlier read result (all the
  reservation's flights; a list of records matches by each element's values being one record's);
- ``subset``: they all come from one list of one read result (some of the order's items);
- ``named``: they are all in the user's messages (or the run input).

`fit` finds, per write tool and list argument, the relations successful calls keep: one that
holds in at least `min_confidence` (0.9) of at least `min_support` (5) successful calls is a
rule ("subset" is implied by "equal"). `detect` flags a call that breaks its argument's rule and
whose list is not named by the user either (what the user asked for is never wrong here): key
``wrong_list:<tool>.<arg>``, decisive step the call, the read it best matches next in
`span_ids`; confidence 0.7. Nothing about any domain is hard-coded.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.analysis.detector_names import WRONG_LIST
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import MAX_DEPTH, Read, is_write, reads
from tracegym.analysis.detectors.ungrounded import Evidence, leaf_texts, loose
from tracegym.analysis.features import step_ref
from tracegym.analysis.runs import Run, Step, parse_json

RELATIONS = ("equal", "subset", "named")


def element_key(value: Any) -> frozenset[str]:
    """An element as the set of its normalised scalar values (an object's values, a scalar)."""
    if value is None or isinstance(value, bool):
        return frozenset()
    texts = leaf_texts(value) if isinstance(value, (dict, list)) else [str(value)]
    return frozenset(t for t in (loose(x) for x in texts) if t)


def list_arguments(step: Step) -> dict[str, list[frozenset[str]]]:
    """Argument path -> the elements of each non-empty list argument of a call."""
    found: dict[str, list[frozenset[str]]] = {}

    def walk(value: Any, path: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            return
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key), depth + 1)
        elif isinstance(value, list) and value:
            elements = [element_key(v) for v in value]
            if all(elements):
                found[path or "input"] = elements

    walk(parse_json(step.input), "", 0)
    return found


def result_lists(read: Read) -> Iterator[list[frozenset[str]]]:
    """Every non-empty list inside a read result, as element keys."""

    def walk(value: Any, depth: int) -> Iterator[list[frozenset[str]]]:
        if depth > MAX_DEPTH:
            return
        if isinstance(value, dict):
            for item in value.values():
                yield from walk(item, depth + 1)
        elif isinstance(value, list) and value:
            yield [element_key(v) for v in value]
            for item in value:
                yield from walk(item, depth + 1)

    yield from walk(read.parsed, 0)


def _covers(candidates: list[frozenset[str]], elements: list[frozenset[str]]) -> set[int]:
    """Indices of the candidate records the elements match one to one (an element matches a
    record whose values include all of its own; a repeated element is the same record again);
    empty when an element matches none."""
    used: dict[frozenset[str], int] = {}
    for element in elements:
        if element in used:
            continue
        taken = set(used.values())
        match = next((i for i, c in enumerate(candidates) if element <= c and i not in taken), None)
        if match is None:
            return set()
        used[element] = match
    return set(used.values())


@dataclass(frozen=True)
class Relation:
    """How one list argument relates to what its run saw."""

    equal: Read | None
    subset: Read | None
    named: bool

    def holds(self, relation: str) -> bool:
        return {"equal": self.equal is not None, "subset": self.subset is not None,
                "named": self.named}[relation]  # fmt: skip


def relation(elements: list[frozenset[str]], earlier: list[Read], told: str) -> Relation:
    """The relations `elements` have with the reads before the call and what the user said."""
    equal = subset = None
    for read in reversed(earlier):
        for candidates in result_lists(read):
            used = _covers(candidates, elements)
            if not used:
                continue
            subset = subset or read
            if len(used) == len(candidates):
                equal = equal or read
        if equal is not None:
            break
    named = all(any(f" {v} " in told for v in e) for e in elements)
    return Relation(equal, subset, named)


def _told(evidence: Evidence) -> str:
    """What the user (and the run input) said, loosely normalised, padded for word matches."""
    texts = [s.text for s in evidence.sources if s.kind in ("request", "system")]
    return " " + " ".join(loose(t) for t in texts) + " "


class WrongListArgument(Detector):
    """List arguments of writes that break the relation successful calls keep (module docstring).

    Parameters: `min_support` (5) successful calls of the argument, `min_confidence` (0.9)
    share of them keeping the relation.
    """

    name = WRONG_LIST
    description = (
        "Passes a list (items, flights, recipients) to an action that is neither the list it "
        "looked up nor the part of it the user named"
    )

    def __init__(self, min_support: int = 5, min_confidence: float = 0.9) -> None:
        self.min_support = min_support
        self.min_confidence = min_confidence
        self.rules_: dict[tuple[str, str], str] = {}
        self.support_: dict[tuple[str, str], int] = {}

    def _calls(self, run: Run) -> Iterator[tuple[Step, str, list[frozenset[str]], Relation]]:
        all_reads = reads(run)
        evidence = Evidence(run)
        for step in run.steps:
            if not is_write(step):
                continue
            lists = list_arguments(step)
            if not lists:
                continue
            evidence.advance(step.position)
            earlier = [r for r in all_reads if r.step.position < step.position]
            told = _told(evidence)
            for arg, elements in lists.items():
                yield step, arg, elements, relation(elements, earlier, told)

    def fit(self, runs: Sequence[Run]) -> WrongListArgument:
        calls: Counter[tuple[str, str]] = Counter()
        holds: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        for run in runs:
            if run.success is not True:
                continue
            for step, arg, _, found in self._calls(run):
                if step.failed:
                    continue
                key = (step.tool or step.name, arg)
                calls[key] += 1
                holds[key].update(r for r in RELATIONS if found.holds(r))
        self.rules_, self.support_ = {}, {}
        for key, n in calls.items():
            if n < self.min_support:
                continue
            for name in RELATIONS:  # the most specific relation first
                if holds[key][name] / n >= self.min_confidence:
                    self.rules_[key], self.support_[key] = name, n
                    break
        return self

    def detect(self, run: Run) -> list[Finding]:
        if not self.rules_:
            return []
        findings: dict[str, Finding] = {}
        for step, arg, elements, found in self._calls(run):
            tool = step.tool or step.name
            rule = self.rules_.get((tool, arg))
            if rule is None or found.holds(rule) or found.named:
                continue
            key = f"{self.name}:{tool}.{arg}"
            if key in findings:
                continue
            near = found.subset
            spans = [step.span_id] + ([near.step.span_id] if near is not None else [])
            what = {
                "equal": "the whole of a list it looked up",
                "subset": "taken from one list it looked up",
                "named": "what the user named",
            }[rule]
            findings[key] = Finding(
                detector=self.name, key=key, trace_id=run.trace_id, **step_ref(step),
                span_ids=tuple(spans), confidence=0.7,
                message=(
                    f"{tool}({arg}=[{len(elements)} elements]) is not {what}, nor what the user "
                    f"named; in {self.support_[tool, arg]} successful calls it always is"
                ),
                details={"tool": tool, "argument": arg, "rule": rule,
                         "subset_of_a_read": near is not None,
                         "read_position": near.step.position if near is not None else None},
            )  # fmt: skip
        return list(findings.values())
