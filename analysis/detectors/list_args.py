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
rule ("subset" is implied by "equal"); "equal" counts only calls whose list was taken from a
looked-up list of two or more elements (of a one-element list, its one element is all of it and a
part alike), at least `min_support` of them. `detect` flags a call that breaks its argument's
rule and whose list is not named by the user either (what the user asked for is never wrong
here): key ``wrong_list:<tool>.<arg>``, decisive step the call, the read it best matches next in
`span_ids`; confidence 0.7. Each finding carries the rule it breaks as
``details["mined_rule"]`` (a `MinedRule` of kind ``list``: the read tool and the list's path in
its result that successful calls related to most often, e.g. ``items[*].item_id``, and up to
ten of those runs), so that synthesis enforces what was mined and nothing else, with the run's
request and first call (`request`, `first_call`: the users' words, for synthesis). Nothing
about any domain is hard-coded.
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
from tracegym.analysis.detectors.unserved import first_call, request_text
from tracegym.analysis.features import step_ref
from tracegym.analysis.gap import MinedRule
from tracegym.analysis.runs import Run, Step, parse_json

RELATIONS = ("equal", "subset", "named")
EVIDENCE_RUNS = 10  # successful trace ids kept with a mined rule


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


@dataclass(frozen=True)
class ReadList:
    """One non-empty list inside a read result: its path (``items[*]``), the raw elements and
    their keys."""

    path: str
    raw: list[Any]
    candidates: list[frozenset[str]]


def read_lists(read: Read) -> Iterator[ReadList]:
    """Every non-empty list inside a read result, outermost first, with its path."""

    def walk(value: Any, path: str, depth: int) -> Iterator[ReadList]:
        if depth > MAX_DEPTH:
            return
        if isinstance(value, dict):
            for key, item in value.items():
                yield from walk(item, f"{path}.{key}" if path else str(key), depth + 1)
        elif isinstance(value, list) and value:
            here = f"{path}[*]"
            yield ReadList(here, value, [element_key(v) for v in value])
            for item in value:
                yield from walk(item, here, depth + 1)

    yield from walk(read.parsed, "", 0)


def _field_path(found: ReadList, matched: dict[frozenset[str], int]) -> str:
    """The list's path, narrowed to the one field of its records that holds every scalar
    element (``items[*]`` -> ``items[*].item_id``) when there is exactly one."""
    fields: set[str] | None = None
    for element, index in matched.items():
        record = found.raw[index]
        if len(element) != 1 or not isinstance(record, dict):
            return found.path
        [value] = element
        here = {
            str(k) for k, v in record.items()
            if not isinstance(v, (dict, list, bool)) and v is not None and loose(str(v)) == value
        }  # fmt: skip
        fields = here if fields is None else fields & here
    if fields is not None and len(fields) == 1:
        return f"{found.path}.{next(iter(fields))}"
    return found.path


def _matches(
    candidates: list[frozenset[str]], elements: list[frozenset[str]]
) -> dict[frozenset[str], int]:
    """Each distinct element -> the index of the candidate record it matches, one to one (an
    element matches a record whose values include all of its own; a repeated element is the
    same record again); empty when an element matches none."""
    used: dict[frozenset[str], int] = {}
    for element in elements:
        if element in used:
            continue
        taken = set(used.values())
        match = next((i for i, c in enumerate(candidates) if element <= c and i not in taken), None)
        if match is None:
            return {}
        used[element] = match
    return used


@dataclass(frozen=True)
class Relation:
    """How one list argument relates to what its run saw."""

    equal: Read | None
    subset: Read | None
    named: bool
    equal_path: str | None = None  # where in the read's result the list is (`_field_path`)
    subset_path: str | None = None
    # the list it is taken from has two or more elements: only then can "equal" and "subset"
    # be told apart (the one element of a one-element list is both all of it and a part)
    telling: bool = False

    def where(self, relation: str) -> tuple[str | None, str | None]:
        """The read tool and list path a relation held with (None for ``named``)."""
        read, path = {"equal": (self.equal, self.equal_path),
                      "subset": (self.subset, self.subset_path)}.get(
                          relation, (None, None))  # fmt: skip
        return (read.step.tool or read.step.name, path) if read is not None else (None, None)

    def holds(self, relation: str) -> bool:
        return {"equal": self.equal is not None, "subset": self.subset is not None,
                "named": self.named}[relation]  # fmt: skip


def relation(elements: list[frozenset[str]], earlier: list[Read], told: str,
             lists: dict[int, list[ReadList]] | None = None) -> Relation:  # fmt: skip
    """The relations `elements` have with the reads before the call and what the user said;
    `lists` keeps each read's `read_lists` (by `id`) for the next call of the same run."""
    equal = subset = None
    equal_path = subset_path = None
    telling = False
    lists = {} if lists is None else lists
    for read in reversed(earlier):
        if id(read) not in lists:
            lists[id(read)] = list(read_lists(read))
        for found in lists[id(read)]:
            matched = _matches(found.candidates, elements)
            if not matched:
                continue
            if subset is None:
                subset, subset_path = read, _field_path(found, matched)
                telling = len(found.candidates) >= 2
            if len(set(matched.values())) == len(found.candidates) and equal is None:
                equal, equal_path = read, _field_path(found, matched)
        if equal is not None:
            break
    named = all(any(f" {v} " in told for v in e) for e in elements)
    return Relation(equal, subset, named, equal_path, subset_path, telling)


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
        self.mined_: dict[tuple[str, str], MinedRule] = {}

    def _calls(self, run: Run) -> Iterator[tuple[Step, str, list[frozenset[str]], Relation]]:
        all_reads = reads(run)
        lists_of: dict[int, list[ReadList]] = {}  # (the reads live as long as this generator)
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
                yield step, arg, elements, relation(elements, earlier, told, lists_of)

    def fit(self, runs: Sequence[Run]) -> WrongListArgument:
        calls: Counter[tuple[str, str]] = Counter()
        holds: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        where: dict[tuple[str, str, str], Counter[tuple[str | None, str | None]]] = defaultdict(
            Counter
        )
        traces: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        telling: Counter[tuple[str, str]] = Counter()  # calls that can tell equal from subset
        telling_equal: Counter[tuple[str, str]] = Counter()
        for run in runs:
            if run.success is not True:
                continue
            for step, arg, _, found in self._calls(run):
                if step.failed:
                    continue
                key = (step.tool or step.name, arg)
                calls[key] += 1
                if found.telling:
                    telling[key] += 1
                    telling_equal[key] += found.holds("equal")
                for name in RELATIONS:
                    if found.holds(name):
                        holds[key][name] += 1
                        where[(*key, name)][found.where(name)] += 1
                        traces[(*key, name)].add(run.trace_id)
        self.rules_, self.support_, self.mined_ = {}, {}, {}
        for key, n in calls.items():
            if n < self.min_support:
                continue
            for name in RELATIONS:  # the most specific relation first
                if name == "equal" and not (
                    telling[key] >= self.min_support
                    and telling_equal[key] / telling[key] >= self.min_confidence
                ):
                    continue  # "all of the list" shown only on lists of one is not shown
                if holds[key][name] / n >= self.min_confidence:
                    self.rules_[key], self.support_[key] = name, n
                    at = (*key, name)
                    self.mined_[key] = self._rule(key, name, n, holds[key][name], where[at],
                                                  traces[at])  # fmt: skip
                    break
        return self

    def _rule(
        self,
        key: tuple[str, str],
        relation: str,
        calls: int,
        held: int,
        where: Counter[tuple[str | None, str | None]],
        traces: set[str],
    ) -> MinedRule:
        """The mined rule of one argument: the read tool and path it held with most often."""
        tool, arg = key
        (read_tool, path), _ = min(where.items(), key=lambda kv: (-kv[1], str(kv[0])))
        source = f"{read_tool}'s {path}" if path else f"what {read_tool} returned"
        statement = {
            "equal": f"{tool}'s {arg} is exactly the list {source} (every element)",
            "subset": f"{tool}'s {arg} holds only elements of the one list {source}",
            "named": f"{tool}'s {arg} holds only what the user named",
        }[relation]
        return MinedRule(
            detector=self.name, kind="list", tool=tool, argument=arg, relation=relation,
            read_tool=read_tool, path=path,
            statement=f"{statement}, in {held} of {calls} successful calls",
            support=calls, confidence=round(held / calls, 4),
            evidence_runs=tuple(sorted(traces)[:EVIDENCE_RUNS]),
        )  # fmt: skip

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
                         "read_position": near.step.position if near is not None else None,
                         **({"mined_rule": self.mined_[tool, arg].to_dict(),
                             "request": request_text(run)[:500], "first_call": first_call(run)}
                            if (tool, arg) in self.mined_ else {})},
            )  # fmt: skip
        return list(findings.values())
