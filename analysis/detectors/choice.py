"""Wrong choices: a write acts on one record among several the run looked up, and the user's
words describe another one better.

A write argument often carries the id of one record *chosen* among several the agent saw: a
product variant among a product's listing, an order among the orders it opened, a payment method
among the user's. When the user said what they wanted ("the black one, 1000ml", "with PayPal",
"the order with the laptop"), the record chosen should be the one that matches it. Per write
call and argument value, the *candidates* are

- the records of one collection inside one read result (a list of two or more objects, or an
  object whose values are two or more objects: records keyed by id) whose identity (its key, an
  id-like field: a text with 4+ digits or a field named ``id`` or ``*_id``; failing any, a
  field whose value is the argument's in exactly one of them) is the value in exactly one of
  them, or
- the results of two or more reads by the same tool of different records (``get_order(A)``,
  ``get_order(B)``), one of which was read by the value.

Each candidate is scored against the user's own messages before the call (the messages with
role user; the run input only when there are none): the record's short text values (colour,
size, material, brand, names, statuses: 2-40 characters, fewer than 5 digits) that not every
candidate shares and that occur in the user's words, loosely normalised (`ungrounded.loose`).
Candidates that the same call also names (the item being replaced) are not rivals, and their
values do not count (the user describing what they have is not what they want). A rival whose
score is strictly higher than the chosen record's, with a value the chosen one lacks, makes the
call a finding: key ``wrong_choice:<tool>.<arg>``, decisive step the write, the read holding the
candidates next in `span_ids`, confidence 0.6. A choice the user named by id is never flagged.

`fit` learns three things from the runs, without labels:

- *states never chosen*: a boolean field (``available: false``) that candidates of a tool
  argument had in at least `min_support` successful calls and the chosen record never had; such
  candidates are not rivals (the agent could not pick them);
- *common words*: values users say in more than `max_common` (a quarter) of all runs, and in at
  least `COMMON_RUNS`, are no evidence ("yes" is an option value too);
- *arguments where the rule holds*: per write tool and argument, the successful calls with
  candidates and how many the rule would flag; an argument whose successful calls are flagged
  more often than `max_success_share` (0.05) is left alone (there the users' words do not
  decide the choice), and one with fewer than `min_support` (3) is not checked.

Nothing about any domain is hard-coded.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tracegym.analysis.detector_names import WRONG_CHOICE
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import MAX_DEPTH, Read, is_write, reads
from tracegym.analysis.detectors.ungrounded import loose
from tracegym.analysis.features import is_tool, step_ref
from tracegym.analysis.runs import Run, Step, flatten, parse_json

MIN_VALUE, MAX_VALUE = 3, 40  # characters of a record's text value that can be scored
MAX_DIGITS = 4  # a text with more digits is an id, a phone or a zip, not a described property
COMMON_RUNS = 10  # a word is common ("yes") when users say it in this many runs, and more than
# `max_common` of them


@dataclass(frozen=True)
class Candidate:
    """One record a choice could have fallen on."""

    identity: frozenset[str]  # loose ids that name the record (its key, id-like fields)
    values: frozenset[tuple[str, str]]  # (path, loose short text): its described properties
    flags: frozenset[str]  # "path=true|false" of its boolean fields
    schema: frozenset[str]  # the paths of its fields: records of one kind share them
    read: Read
    label: str  # a short description for messages
    scalars: frozenset[tuple[str, str]] = frozenset()  # (path, `words` text) of its own fields


def _digits(text: str) -> int:
    return sum(c.isdigit() for c in text)


def _id_name(path: str) -> bool:
    """A field named like an identifier: ``id``, ``*_id`` (``slot_id``, ``orderId``)."""
    name = path.casefold()
    return name == "id" or name.endswith("_id") or path.endswith("Id")


def _candidate(record: dict[str, Any], read: Read, key: str | None) -> Candidate:
    identity: set[str] = {words(key)} if key else set()
    values: set[tuple[str, str]] = set()
    flags: set[str] = set()
    scalars: set[tuple[str, str]] = set()
    leaves = list(flatten(record))  # walked once for values, label and schema
    for path, leaf in leaves:
        own = "." not in path and "[]" not in path  # the record's own field, not a nested one
        if isinstance(leaf, bool):
            flags.add(f"{path}={'true' if leaf else 'false'}")
        elif isinstance(leaf, int) and own:
            scalars.add((path, str(leaf)))
            if _id_name(path):
                identity.add(str(leaf))
        elif isinstance(leaf, str):
            text = words(leaf)
            if not text:
                continue
            if own:
                scalars.add((path, text))
            if own and (_digits(text) >= MAX_DIGITS or _id_name(path)):
                identity.add(text)
            if MIN_VALUE <= len(text) <= MAX_VALUE and _digits(text) <= MAX_DIGITS:
                values.add((path, text))
    shown = [str(v) for _, v in leaves if isinstance(v, str) and len(v) <= MAX_VALUE]
    schema = frozenset(path for path, _ in leaves)
    return Candidate(frozenset(identity), frozenset(values), frozenset(flags), schema, read,
                     ", ".join(shown[:6]), frozenset(scalars))  # fmt: skip


def _collections(value: Any, depth: int = 0) -> Iterator[list[tuple[str | None, dict[str, Any]]]]:
    """Collections of two or more records inside a parsed result: (key or None, record)."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, dict):
        items = list(value.items())
        if len(items) >= 2 and all(isinstance(v, dict) for _, v in items):
            yield [(str(k), v) for k, v in items]
        for _, item in items:
            yield from _collections(item, depth + 1)
    elif isinstance(value, list):
        if len(value) >= 2 and all(isinstance(v, dict) for v in value):
            yield [(None, v) for v in value]
        for item in value:
            yield from _collections(item, depth + 1)


def candidate_sets(
    earlier: Sequence[Read], memo: dict[tuple[str, int], Any] | None = None
) -> list[list[Candidate]]:
    """Every set of records a choice could be made among, from the reads before a call.
    `memo` keeps each read's candidates (by `id`) for the next call of the same run."""
    memo = {} if memo is None else memo
    sets: list[list[Candidate]] = []
    for read in earlier:
        key = ("lists", id(read))
        if key not in memo:
            memo[key] = [[_candidate(record, read, k) for k, record in collection]
                         for collection in _collections(read.parsed)]  # fmt: skip
        sets.extend(memo[key])
    by_tool: dict[str, dict[str, Read]] = defaultdict(dict)
    for read in earlier:  # the latest read of each record, per read tool
        if isinstance(read.parsed, dict):
            by_tool[read.tool][read.key] = read
    for records in by_tool.values():
        if len(records) < 2:
            continue
        group = []
        for read in records.values():
            if ("whole", id(read)) not in memo:
                memo["whole", id(read)] = _candidate(read.parsed, read, None)
            found = memo["whole", id(read)]
            args = parse_json(read.step.input)
            ids = {words(str(v)) for _, v in flatten(args) if isinstance(v, (str, int))}
            group.append(Candidate(found.identity | {i for i in ids if i}, found.values,
                                   found.flags, found.schema, read, found.label,
                                   found.scalars))  # fmt: skip
        sets.append(group)
    return sets


_FIELDS: dict[str, frozenset[str]] = {}


def _fields(read: Read) -> frozenset[str]:
    """The `words` texts of a read result's field values (not the elements of a list of plain
    values: a list of ids is a listing, not a record naming one)."""
    key = read.observed
    if key not in _FIELDS:
        if len(_FIELDS) > 1 << 14:
            _FIELDS.clear()
        _FIELDS[key] = frozenset(
            words(str(v)) for path, v in flatten(read.parsed)
            if isinstance(v, (str, int)) and not isinstance(v, bool) and not path.endswith("[]")
        )  # fmt: skip
    return _FIELDS[key]


def _scalars(value: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, str, str]]:
    """(argument path, `words` text, raw text) of every scalar of a call's arguments (list
    items share their list's path)."""
    if depth > MAX_DEPTH or value is None or isinstance(value, bool):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _scalars(item, f"{path}.{key}" if path else str(key), depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item, path, depth + 1)
    else:
        text = words(str(value))
        if text:
            yield path or "input", text, str(value)


_DASHES = str.maketrans({c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015"})
_PUNCTUATION = re.compile(r"[^\w#@.$%]+|\.(?!\w)")


def words(text: str) -> str:
    """`ungrounded.loose` text with punctuation as spaces ("red," = "red"; "1.5" stays)."""
    return _words(text) if len(text) <= _CACHE_TEXT else _spaced(text)


def _spaced(text: str) -> str:
    return " ".join(_PUNCTUATION.sub(" ", loose(text.translate(_DASHES))).split())


_CACHE_TEXT = 4096  # texts up to this length recur (record fields, in every run that reads them)
_words = lru_cache(maxsize=1 << 16)(_spaced)


def user_text(run: Run, before: int, after: int = -1) -> str:
    """What the user said between positions `after` and `before`, loosely normalised and
    padded: the messages with role user; the run input only in a run without any (where the
    run has user messages, its input may be what the user was told, not what they said: the
    instruction of a simulated user)."""
    messages = [s for s in run.steps if s.role == "user" and not is_tool(s)]
    texts = [s.input or s.output or "" for s in messages if after < s.position < before]
    if not messages and run.root is not None and after < run.root.position < before:
        texts = [run.root.input or ""]
    return " " + " ".join(words(t) for t in texts) + " "


@dataclass(frozen=True)
class Choice:
    """One write argument value that picked one record among candidates."""

    step: Step
    tool: str
    arg: str
    value: str
    chosen: Candidate
    rivals: list[Candidate]  # the other candidates, less those the call names too
    named_by_user: bool
    matched: frozenset[tuple[str, str]]  # the chosen record's values in the user's words
    best: Candidate | None  # the rival matching the user's words best
    best_matched: frozenset[tuple[str, str]]
    deciding: frozenset[tuple[str, str]]  # the rival's, where the chosen one's are not said
    candidates: tuple[Candidate, ...] = ()  # the whole collection, the chosen record included
    rival_said: tuple[frozenset[tuple[str, str]], ...] = ()  # per rival, its values said

    @property
    def wrong(self) -> bool:
        return (
            not self.named_by_user
            and self.best is not None
            and len(self.best_matched) > len(self.matched)
            and bool(self.deciding)
        )


def _said(
    candidate: Candidate,
    shared: frozenset[tuple[str, str]],
    own: frozenset[tuple[str, str]],
    told: str,
) -> frozenset[tuple[str, str]]:
    """The candidate's values, less those every candidate has and those of the records the call
    names too, that occur in the user's words."""
    own_texts = {v for _, v in own}
    return frozenset(
        (p, v) for p, v in candidate.values - shared if v not in own_texts and f" {v} " in told
    )


def choices(
    run: Run,
    never: set[tuple[str, str, str]] | None = None,
    common: Callable[[str], bool] | None = None,
) -> Iterator[Choice]:
    """The choices of a run's writes (see the module docstring); `never`: (tool, arg, flag)
    states no rival may have; `common`: words users say whatever they want ("yes")."""
    all_reads = reads(run)
    memo: dict[tuple[str, int], Any] = {}  # each read's candidates (the reads outlive it)
    previous = -1  # the request a write serves: what the user said since the previous write
    acted = {  # every record some write of the run names: the user's words about it are served
        text for s in run.steps if is_write(s) for _, text, _ in _scalars(parse_json(s.input))
    }
    for step in run.steps:
        if not is_write(step):
            continue
        since, previous = previous, step.position
        earlier = [r for r in all_reads if r.step.position < step.position]
        if not earlier:
            continue
        scalars = list(_scalars(parse_json(step.input)))
        if not scalars:
            continue
        named = {text for _, text, _ in scalars}
        told = user_text(run, step.position, since)
        tool = step.tool or step.name
        seen: set[tuple[str, str]] = set()
        for candidates in candidate_sets(earlier, memo):
            start = min(c.read.step.position for c in candidates)
            same = {c.read.key for c in candidates} | {c.read.tool for c in candidates[1:2]}
            before = [r for r in earlier if r.step.position < start
                      and r.key not in same and r.tool not in same]  # fmt: skip
            for arg, value, raw in scalars:
                holding = [c for c in candidates if value in c.identity] or _unique_field(
                    candidates, value
                )
                if len(holding) != 1 or (arg, value) in seen:
                    continue
                if any(value in _fields(r) for r in before):
                    continue  # a record the run had already found elsewhere, not chosen here
                seen.add((arg, value))
                chosen = holding[0]
                others = [c for c in candidates if c is not chosen]
                also = [c for c in others if c.identity & named]  # the call names it too
                rivals = [
                    c for c in others
                    if c not in also
                    and not c.identity & acted
                    and not (never and any((tool, arg, f) in never for f in c.flags))
                ]  # fmt: skip
                if not rivals:
                    continue
                shared = frozenset.intersection(*(c.values for c in (chosen, *rivals)))
                own = frozenset().union(*(c.values for c in also))
                if common is not None:
                    shared |= {(p, v) for c in (chosen, *rivals) for p, v in c.values if common(v)}
                mine = _said(chosen, shared, own, told)
                said_paths = {p for p, v in chosen.values - shared if f" {v} " in told}
                scored = [(_said(c, shared, own, told), i, c) for i, c in enumerate(rivals)]
                matched, _, best = max(scored, key=lambda t: (len(t[0]), -t[1]))
                # a rival's value decides only where the chosen record's is not said as well
                deciding = frozenset((p, v) for p, v in matched if p not in said_paths)
                named_by_user = any(f" {i} " in told for i in chosen.identity)
                yield Choice(step, tool, arg, raw, chosen, rivals, named_by_user, mine,
                             best, matched, deciding, tuple(candidates),
                             tuple(t[0] for t in scored))  # fmt: skip


def _unique_field(candidates: Sequence[Candidate], value: str) -> list[Candidate]:
    """The one candidate whose own field holds `value` where no other candidate has it at that
    field (an identity that neither looks like an id nor is named like one), else none."""
    paths = {p for c in candidates for p, t in c.scalars if t == value}
    for path in sorted(paths):
        holding = [c for c in candidates if (path, value) in c.scalars]
        if len(holding) == 1:
            return holding
    return []


class WrongChoice(Detector):
    """Writes on a record the user's words do not describe, while another candidate does
    (module docstring).

    Parameters: `min_support` (3) successful calls for an argument's calibration and for a
    state never chosen, `max_success_share` (0.05) of successful calls the rule may flag,
    `max_common` (0.25) of the runs a word may be said in and still be evidence.
    """

    name = WRONG_CHOICE
    description = (
        "Acts on the wrong one of several records it looked up (a variant, an order, a payment "
        "method) where another matches what the user asked for better"
    )

    def __init__(
        self, min_support: int = 3, max_success_share: float = 0.05, max_common: float = 0.25
    ) -> None:
        self.min_support = min_support
        self.max_success_share = max_success_share
        self.max_common = max_common
        self.texts_: list[str] = []
        self._common: dict[str, bool] = {}
        self._holding: dict[str, list[int]] = {}  # word -> the texts_ (indexes) saying it
        self.never_: set[tuple[str, str, str]] = set()
        self.disabled_: set[tuple[str, str]] = set()
        self.calls_: Counter[tuple[str, str]] = Counter()
        self.flagged_: Counter[tuple[str, str]] = Counter()
        # the arguments checked with the support of at least `min_support` successful calls
        self.rules_: list[tuple[str, str]] = []
        self._checked: set[tuple[str, str]] = set()

    def common(self, value: str) -> bool:
        """Whether users say `value` in more than `max_common` of the runs, and in at least
        `COMMON_RUNS` (whatever they want: "yes", "no"); never, before `fit`."""
        if value not in self._common:
            tokens = set(value.split())
            # only the texts holding its rarest word can hold the value: not every run per value
            holding = (min((self._holding.get(t, ()) for t in tokens), key=len) if tokens
                       else range(len(self.texts_)))  # fmt: skip
            found = sum(f" {value} " in self.texts_[i] for i in holding)
            self._common[value] = (
                found >= COMMON_RUNS and found / len(self.texts_) > self.max_common
            )
        return self._common[value]

    def fit(self, runs: Sequence[Run]) -> WrongChoice:
        successes = [r for r in runs if r.success is True]
        end = 1 << 62
        self.texts_, self._common = [user_text(r, end) for r in runs], {}
        self._holding = defaultdict(list)
        for i, text in enumerate(self.texts_):
            for word in set(text.split()):
                self._holding[word].append(i)
        self._holding = dict(self._holding)
        held: Counter[tuple[str, str, str]] = Counter()  # flag among candidates, per call
        chosen: set[tuple[str, str, str]] = set()
        for run in successes:
            for choice in choices(run, common=self.common):
                if choice.step.failed:
                    continue
                for flag in frozenset().union(*(c.flags for c in choice.rivals)):
                    held[choice.tool, choice.arg, flag] += 1
                chosen |= {(choice.tool, choice.arg, f) for f in choice.chosen.flags}
        self.never_ = {k for k, n in held.items() if n >= self.min_support and k not in chosen}
        self.calls_, self.flagged_ = Counter(), Counter()
        for run in successes:
            for choice in choices(run, self.never_, self.common):
                if choice.step.failed:
                    continue
                self.calls_[choice.tool, choice.arg] += 1
                self.flagged_[choice.tool, choice.arg] += choice.wrong
        self.disabled_ = {
            k for k, n in self.calls_.items()
            if n >= self.min_support and self.flagged_[k] / n > self.max_success_share
        }  # fmt: skip
        self.rules_ = sorted(
            k for k, n in self.calls_.items() if n >= self.min_support and k not in self.disabled_
        )
        self._checked = set(self.rules_)
        return self

    def detect(self, run: Run) -> list[Finding]:
        findings: dict[str, Finding] = {}
        for choice in choices(run, self.never_, self.common):
            if not choice.wrong or (choice.tool, choice.arg) not in self._checked:
                continue
            key = f"{self.name}:{choice.tool}.{choice.arg}"
            if key in findings or choice.best is None:
                continue
            best = choice.best
            spans = [choice.step.span_id, choice.chosen.read.step.span_id, best.read.step.span_id]
            findings[key] = Finding(
                detector=self.name, key=key, trace_id=run.trace_id, **step_ref(choice.step),
                span_ids=tuple(dict.fromkeys(spans)), confidence=0.6,
                message=(
                    f"{choice.tool}({choice.arg}={choice.value!r}) picks a record "
                    f"({choice.chosen.label}) among {len(choice.rivals) + 1} that "
                    f"{choice.chosen.read.tool} returned; the user's words match another "
                    f"({best.label}) better: "
                    f"{', '.join(sorted(v for _, v in choice.best_matched))} against "
                    f"{', '.join(sorted(v for _, v in choice.matched)) or 'nothing'}"
                ),
                details={
                    "tool": choice.tool, "argument": choice.arg, "value": choice.value,
                    "chosen": sorted(v for _, v in choice.chosen.values)[:12],
                    "better_match": sorted(v for _, v in choice.best_matched),
                    "matched": sorted(v for _, v in choice.matched),
                    "candidates": len(choice.rivals) + 1,
                    "read_position": choice.chosen.read.step.position,
                    "calibration": {"successful_calls": self.calls_[choice.tool, choice.arg],
                                    "flagged": self.flagged_[choice.tool, choice.arg]},
                },
            )  # fmt: skip
        return list(findings.values())
