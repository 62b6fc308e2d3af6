"""Wrong sources: a write argument whose value came from somewhere other than where successful
runs of the same kind of request take it from.

An argument of a write is usually *copied* from something the run saw: the user's words, a
field of an earlier tool result, the element of a list that the user named, or simple
arithmetic over a record's fields. Which one is a habit of the successful runs of one kind of
request (`analysis.request_kinds`): a broken item's refund takes `items[?].price` of the item
the user named, not the order's `total`; the payment id is that of the method the user named,
not the first one listed. Per write call and argument, every *origin* the value has is
listed:

- ``user``: the value is in the user's words before the call (`choice.user_text`);
- ``<read tool>.<path>``: a field of an earlier read result that holds the value
  (``get_order.total``); inside a list, the element is named by how it can have been chosen:
  ``[named]`` (one of its short texts the user said, and not every element has it),
  ``[call]`` (it holds another argument of the same call: the item whose id is passed),
  ``[first]``, ``[last]``, ``[only]``, and ``[*]`` (any element: said of every such value);
- ``<read tool>: <formula>``: arithmetic over one read result's fields that gives the
  amount (`arithmetic.relations_holding`: a sum, difference, share, sum over a list), for
  amounts (numbers; not ids, not whole numbers below `min_number`).

`fit` learns, per kind of request (`request_kinds`) and *call shape* (the tool and its
argument names: a refund of one item and a refund of a whole order are different calls of one
tool), and per argument, the origins of the successful calls. The *rule* is the origin held
most often, in at least `min_confidence` (0.8) of at least `min_support` (5) calls; among the
origins held within `slack` (5%) of the calls as often, the most specific (an element chosen by
the user's words or the call over one chosen by its place, over a field, over ``[*]``). A kind
with too few calls of a shape falls back to the rule over the calls of that shape in every
kind (never to calls of another shape). `detect`
flags a call whose value has origins but not the rule's: it came from another field, another
record or list element, or an arithmetic successful runs do not do. Where the run never called
the read the rule's origin is in, the call had no such source to take from: that is a missing
step (`wrong_tool_order`, `missed_action`), not a wrong source, and is not flagged. A value
with no origin at all is `wrong_amount`'s or `ungrounded_argument`'s to report, not this
detector's.

Key ``wrong_source:<tool>.<argument>``; decisive step: the write call; the chat span that wrote
it and the read the value came from follow in `span_ids`. Confidence 0.7. The message says
both: "took `amount` from `get_order.total`; successful runs take it from
`get_order.items[named].price`".
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.analysis.arithmetic import amount_of, decimals_of, parse_number, relations_holding
from tracegym.analysis.detector_names import WRONG_SOURCE
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.choice import user_text, words
from tracegym.analysis.detectors.state import MAX_DEPTH, Read, is_write, reads
from tracegym.analysis.features import is_message, step_ref
from tracegym.analysis.request_kinds import RequestKinds
from tracegym.analysis.runs import Run, Step, parse_json

MIN_TEXT = 3  # characters of a text value that can be traced to a source
MAX_NAMED_TEXT = 40  # longer texts of a list element are prose, not what a user names
SELECTORS = ("named", "call", "only", "first", "last")  # how a list element can be chosen
CHOSEN = ("named", "call")  # by what the user said or the call names, not by its place


@dataclass(frozen=True)
class Origin:
    """One place a value can have come from; `specificity`: 4 the field of an element chosen by
    what the user said or the call names, 3 of one chosen by its place in the list, 2 a field,
    the user's words or arithmetic, 1 a field of any element of a list."""

    text: str
    specificity: int
    read: Read | None = None


@dataclass(frozen=True)
class Call:
    """One scalar argument of a write call, with the origins its value has."""

    step: Step
    tool: str
    arg: str
    value: Any
    origins: dict[str, Origin]
    shape: str = ""  # the call's argument names: calls of one shape do one kind of thing
    earlier: tuple[Read, ...] = ()  # the reads before the call


@dataclass(frozen=True)
class SourceRule:
    """Where successful calls of `tool` take `arg` from, for one kind of request."""

    kind: str
    tool: str
    arg: str
    origin: str
    support: int
    calls: int
    read_tool: str | None = None  # the read the origin is in (None: the user's words)

    @property
    def confidence(self) -> float:
        return self.support / self.calls if self.calls else 0.0


def _traceable(value: Any, min_number: float) -> bool:
    """A value worth tracing: a text of a few characters, a number that is not a small count."""
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return abs(value) >= min_number or not float(value).is_integer()
    text = words(str(value))
    return len(text) >= MIN_TEXT


def _same(a: Any, b: Any) -> bool:
    """Equal as numbers (at cents) when both are numbers, else as loosely normalised texts."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return False
    x, y = parse_number(a), parse_number(b)
    if x is not None and y is not None and not (isinstance(a, str) and isinstance(b, str)):
        return abs(x - y) < 0.005
    return words(str(a)) == words(str(b))


def _scalars(value: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(path, scalar) of a call's arguments; list items share ``path[]``."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _scalars(item, f"{path}.{key}" if path else str(key), depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item, f"{path}[]", depth + 1)
    elif value is not None:
        yield path or "input", value


@dataclass(frozen=True)
class _Leaf:
    path: str  # with the innermost list's elements as "{}" ("items{}.price"), outer ones "[]"
    value: Any
    owner: list[Any] | None  # the innermost list holding the leaf
    index: int


def _leaves(value: Any, path: str = "", depth: int = 0, owner: Any = None,
            index: int = -1) -> Iterator[_Leaf]:  # fmt: skip
    if depth > MAX_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key), depth + 1, owner,
                               index)  # fmt: skip
    elif isinstance(value, list):
        outer = path.replace("{}", "[]")
        for i, item in enumerate(value):
            yield from _leaves(item, f"{outer}{{}}", depth + 1, value, i)
    elif value is not None and not isinstance(value, bool):
        yield _Leaf(path or "value", value, owner, index)


def _element_texts(element: Any) -> set[str]:
    """The short texts of a list element (its scalar values), loosely normalised."""
    leaves = _leaves(element) if isinstance(element, (dict, list)) else [_Leaf("", element,
                                                                             None, -1)]  # fmt: skip
    out = set()
    for leaf in leaves:
        if isinstance(leaf.value, (str, int, float)):
            text = words(str(leaf.value))
            if MIN_TEXT <= len(text) <= MAX_NAMED_TEXT:
                out.add(text)
    return out


class _ReadIndex:
    """A read's leaves by loose text and by amount (in cents), and its list elements' texts:
    finding the leaves equal to a value (`_same`) is a look-up, not a pass over every leaf
    for every argument of every write."""

    def __init__(self, read: Read) -> None:
        self.leaves = list(_leaves(read.parsed))
        self.numbers = [parse_number(leaf.value) for leaf in self.leaves]
        self.by_text: dict[str, list[int]] = defaultdict(list)
        self.by_cents: dict[int, list[int]] = defaultdict(list)
        for i, (leaf, number) in enumerate(zip(self.leaves, self.numbers, strict=True)):
            self.by_text[words(str(leaf.value))].append(i)
            if number is not None and math.isfinite(number):
                self.by_cents[round(number * 100)].append(i)
        self._texts: dict[int, set[str]] = {}

    def same(self, value: Any) -> list[_Leaf]:
        """The leaves `_same` as `value`, in the read's order."""
        if isinstance(value, bool) or value is None:
            return []
        number = parse_number(value)
        found = set()
        if number is not None and math.isfinite(number):
            cents = round(number * 100)
            for i in (*self.by_cents.get(cents - 1, ()), *self.by_cents.get(cents, ()),
                      *self.by_cents.get(cents + 1, ())):  # fmt: skip
                if _same(self.leaves[i].value, value):
                    found.add(i)
        for i in self.by_text.get(words(str(value)), ()):
            both_numbers = number is not None and self.numbers[i] is not None
            if not both_numbers or (isinstance(value, str) and isinstance(self.leaves[i].value,
                                                                          str)):  # fmt: skip
                found.add(i)  # (numbers, not both texts, compare as numbers: above)
        return [self.leaves[i] for i in sorted(found)]

    def element_texts(self, element: Any) -> set[str]:
        """`_element_texts`, once per element."""
        key = id(element)
        if key not in self._texts:
            self._texts[key] = _element_texts(element)
        return self._texts[key]


def _selectors(leaf: _Leaf, told: str, others: set[str],
               index: _ReadIndex | None = None) -> list[str]:  # fmt: skip
    """How the element holding `leaf` can have been chosen (see the module docstring)."""
    elements = leaf.owner or []
    texts = index.element_texts if index is not None else _element_texts
    mine = texts(elements[leaf.index])
    shared = set.intersection(*(texts(e) for e in elements)) if elements else set()
    found = []
    if any(f" {t} " in told for t in mine - shared):
        found.append("named")
    if mine & others:
        found.append("call")
    if len(elements) == 1:
        found.append("only")
    else:
        if leaf.index == 0:
            found.append("first")
        if leaf.index == len(elements) - 1:
            found.append("last")
    return found


def origins_of(value: Any, earlier: Sequence[Read], told: str, others: set[str],
               min_number: float = 10,
               indexes: dict[int, _ReadIndex] | None = None) -> dict[str, Origin]:  # fmt: skip
    """Every origin of `value` (see the module docstring): `earlier` the reads before the call,
    `told` what the user said (`choice.user_text`), `others` the call's other argument values
    (`words` texts); `indexes` keeps each read's `_ReadIndex` between calls (by `id`)."""
    found: dict[str, Origin] = {}
    if not _traceable(value, min_number):
        return found
    said = words(str(value))
    if said and f" {said} " in told:
        found["user"] = Origin("user", 2)
    amount = amount_of(value)
    indexes = {} if indexes is None else indexes
    for read in earlier:
        index = indexes.get(id(read))
        if index is None:
            index = indexes[id(read)] = _ReadIndex(read)
        for leaf in index.same(value):
            if leaf.owner is None:
                text = f"{read.tool}.{leaf.path}"
                found[text] = Origin(text, 2, read)
                continue
            text = f"{read.tool}.{leaf.path.replace('{}', '[*]')}"
            found.setdefault(text, Origin(text, 1, read))
            for selector in _selectors(leaf, told, others, index):
                text = f"{read.tool}.{leaf.path.replace('{}', f'[{selector}]')}"
                found.setdefault(text, Origin(text, 4 if selector in CHOSEN else 3, read))
        if amount is not None and (not float(amount).is_integer() or abs(amount) >= min_number):
            decimals = max(decimals_of(value), 2)
            for relation in relations_holding(amount, read.parsed, decimals=decimals):
                if relation.form == "field":
                    continue  # a field is an origin above
                text = f"{read.tool}: {relation.text()}"
                found.setdefault(text, Origin(text, 2, read))
    return found


def write_calls(run: Run, min_number: float = 10) -> Iterator[Call]:
    """Every scalar argument of the run's writes, with its origins (list elements of one
    argument: the origins all of them share)."""
    all_reads: list[Read] | None = None
    indexes: dict[int, _ReadIndex] = {}  # (the reads live as long as this generator)
    for step in run.steps:
        if not is_write(step):
            continue
        args = list(_scalars(parse_json(step.input)))
        if not args:
            continue
        if all_reads is None:
            all_reads = reads(run)
        earlier = [r for r in all_reads if r.step.position < step.position]
        told = user_text(run, step.position)
        tool = step.tool or step.name
        by_arg: dict[str, list[Any]] = defaultdict(list)
        for path, value in args:
            by_arg[path].append(value)
        shape = f"{tool}({','.join(sorted(by_arg))})"
        for path, values in by_arg.items():
            # the call's other ids (an amount is what is traced, not what picks the element)
            others = {words(str(v)) for p, vs in by_arg.items() if p != path for v in vs
                      if amount_of(v) is None}  # fmt: skip
            shared: dict[str, Origin] | None = None
            for value in values:
                found = origins_of(value, earlier, told, others - {""}, min_number, indexes)
                shared = found if shared is None else {k: o for k, o in shared.items()
                                                       if k in found}  # fmt: skip
            if shared:
                value = values[0] if len(values) == 1 else values
                yield Call(step, tool, path, value, shared, shape, tuple(earlier))


def _chat_before(run: Run, step: Step) -> Step | None:
    """The agent's message that wrote a call: the latest message step before it."""
    found = None
    for s in run.steps:
        if s.position >= step.position:
            break
        if is_message(s) and s.role in (None, "assistant"):
            found = s
    return found


def _both_asked(rule: SourceRule, call: Call) -> bool:
    """The user's words and the list element the user described are one source: what the
    user asked for (an id said, or the record picked by what the user said of it)."""
    named = any("[named]" in o for o in call.origins)
    return (rule.origin == "user" and named) or ("[named]" in rule.origin and "user" in
                                                 call.origins)  # fmt: skip


class WrongSource(Detector):
    """Write arguments taken from another field, record or element than successful runs of the
    same kind of request take them from (module docstring).

    Parameters: `min_support` (4) successful calls of an argument in a kind, `min_confidence`
    (0.8) of them keeping the rule, `min_number` (10) whole numbers below it are not traced.
    """

    name = WRONG_SOURCE
    description = (
        "Passes an action a value taken from the wrong place: another field, another record or "
        "list element, or an arithmetic that successful runs of the same request do not do"
    )

    def __init__(self, min_support: int = 5, min_confidence: float = 0.8,
                 min_number: float = 10, slack: float = 0.05) -> None:  # fmt: skip
        self.min_support = min_support
        self.slack = slack
        self.min_confidence = min_confidence
        self.min_number = min_number
        self.kinds_ = RequestKinds()
        self.rules_: dict[tuple[str, str, str], SourceRule] = {}

    def _kind(self, run: Run) -> str:
        return self.kinds_.kind_of(run) or run.request_kind() or "*"

    def fit(self, runs: Sequence[Run]) -> WrongSource:
        self.kinds_ = RequestKinds().fit(runs)
        calls: Counter[tuple[str, str, str]] = Counter()
        held: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
        specificity: dict[str, int] = {}
        source: dict[str, str | None] = {}
        for run in runs:
            if run.success is not True:
                continue
            kind = self._kind(run)
            for call in write_calls(run, self.min_number):
                if call.step.failed:
                    continue
                for k in (f"{kind} {call.shape}", call.shape):
                    key = (k, call.tool, call.arg)
                    calls[key] += 1
                    held[key].update(call.origins.keys())
                for text, origin in call.origins.items():
                    specificity[text] = origin.specificity
                    source[text] = origin.read.tool if origin.read is not None else None
        self.rules_ = {}
        for key, n in calls.items():
            if n < self.min_support:
                continue
            most = max(held[key].values(), default=0)
            if most < self.min_confidence * n:
                continue
            # the most held origins (within `slack` calls), the most specific of them
            slack = int(self.slack * n)
            near = [(c, t) for t, c in held[key].items() if c >= most - slack]
            count, text = max(near, key=lambda ct: (specificity[ct[1]], ct[0], -len(ct[1]),
                                                    ct[1]))  # fmt: skip
            self.rules_[key] = SourceRule(*key, origin=text, support=count, calls=n,
                                          read_tool=source[text])  # fmt: skip
        return self

    def rule_for(self, run: Run, call: Call) -> SourceRule | None:
        """The rule of an argument among the calls of the same shape in the run's kind of
        request, else among the calls of that shape in any kind."""
        for level in (f"{self._kind(run)} {call.shape}", call.shape):
            rule = self.rules_.get((level, call.tool, call.arg))
            if rule is not None:
                return rule
        return None

    def detect(self, run: Run) -> list[Finding]:
        if not self.rules_:
            return []
        findings: dict[str, Finding] = {}
        for call in write_calls(run, self.min_number):
            rule = self.rule_for(run, call)
            if rule is None or rule.origin in call.origins or _both_asked(rule, call):
                continue
            if rule.read_tool is not None and not any(
                r.tool == rule.read_tool for r in call.earlier
            ):
                continue  # the source was never read: a missing step (wrong_tool_order's)
            key = f"{self.name}:{call.tool}.{call.arg}"
            if key in findings:
                continue
            took = max(call.origins.values(), key=lambda o: (o.specificity, "." in o.text,
                                                             -len(o.text), o.text))  # fmt: skip
            chat = _chat_before(run, call.step)
            spans = [call.step.span_id]
            spans += [chat.span_id] if chat is not None else []
            spans += [took.read.step.span_id] if took.read is not None else []
            findings[key] = Finding(
                detector=self.name, key=key, trace_id=run.trace_id, **step_ref(call.step),
                span_ids=tuple(dict.fromkeys(spans)), confidence=0.7,
                message=(
                    f"{call.tool}({call.arg}={call.value!r}) took `{call.arg}` from "
                    f"`{took.text}`; successful runs of this request take it from "
                    f"`{rule.origin}` ({rule.support} of {rule.calls} calls)"
                ),
                details={"tool": call.tool, "argument": call.arg, "value": call.value,
                         "took": took.text, "origins": sorted(call.origins),
                         "expected": rule.origin, "kind": rule.kind,
                         "support": rule.support, "calls": rule.calls,
                         "read_position": took.read.step.position if took.read else None},
            )  # fmt: skip
        return list(findings.values())
