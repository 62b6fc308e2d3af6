"""Ungrounded arguments: tool argument values the agent had no evidence for.

A value an agent passes to a tool (an id, an amount, a name) should come from somewhere the agent
could see *before* the call: the run's input (the root span's input; only in a run without user
messages, since an imported benchmark run keeps there what its simulated user was told), a user
or system message, a tool result or a memory read. Values the agent wrote itself (assistant
messages, earlier tool arguments) are not evidence. `UngroundedArgument` flags

- *invented* values: found in no earlier evidence at all (key
  ``ungrounded_argument:<tool>.<arg>``, confidence 0.9), and
- *unsupported choices* (an early wrong assumption): a value found only in a tool result, as
  the field of one record in a list of records, where that record shares nothing with what the
  user asked for while another record of the same list does (the agent picked "the latest
  order" when the user named the item of another one). Key
  ``ungrounded_argument:choice:<tool>.<arg>``, confidence 0.6.

Each finding's decisive step is the first tool call that used the value; the assistant message
or LLM call that produced it (`details["origin_position"]`) and the later tool calls and memory
writes that used it again (`details["downstream"]`: its consequences) follow it in `span_ids`.

Values compare after normalisation: case, whitespace, thousands separators and number formatting
("99.0" = "99", "$1,299.50" = "1299.5") are ignored, hyphens, underscores and spaces between words
are the same separator ("one_way" = "one-way" = "One Way"), an id with digits matches the same
digits in another format ("#W9502126" = "9502126"), and a one-word value matches the same word
inflected otherwise (`word_stem`: "messaging" = "messages"). What is checked
(`significant_tokens`): a one-token value whole (unless shorter than `min_token_length` or a whole
number within +-`min_number`); in text of several tokens, only the identifier-like tokens (letters
mixed with digits, '@', '#', '_'), amounts and long numbers (a decimal point or 4+ digits) and, in
short text (up to `max_words` tokens), capitalised words (names) -- plain words are the agent's own
phrasing ("best webcam under 100"). A value is grounded when all of these occur in the evidence, or
the whole value does. Booleans and nulls are never checked.

A number that is not in the evidence as such is grounded when it is arithmetic on numbers that
are (`arithmetic.derived`: a total, a difference, a split); in a write (not a read, not the
answer) such amounts are left to `wrong_amount`, which checks them with the same arithmetic.

`fit` learns each argument's *vocabulary*: values that successful runs pass to the same tool
argument without evidence in at least `vocabulary_runs` different runs (the agent's own
constants, such as a policy topic or a return reason) are exempt. Nothing about any domain is
hard-coded.

The evidence index (`Evidence`) and the value helpers are shared with the memory detector.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tracegym.analysis.arithmetic import decimals_of, derived, numbers_in, parse_number
from tracegym.analysis.detector_names import UNGROUNDED_ARGUMENT
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.features import is_tool, step_ref
from tracegym.analysis.runs import Run, Step, parse_json
from tracegym.analysis.tool_kinds import is_answer_tool, is_read_tool
from tracegym.tracer import semconv as sc
from tracegym.tracer.messages import chat_messages

_TOKEN = re.compile(r"[\w#@][\w#@.\-/]*")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_DIGIT_RUN = re.compile(r"\d{4,}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})
_EVIDENCE_ROLES = {"user": "request", "system": "system", "tool": "observation",
                   "function": "observation", "ipython": "observation"}  # fmt: skip
_MAX_DEPTH = 16


# Normalised values -------------------------------------------------------------------------------
def normalize(text: str) -> str:
    """Casefolded, single-spaced, thousands separators removed."""
    text = _THOUSANDS.sub("", text.translate(_QUOTES).casefold())
    return " ".join(text.split())


def number_token(token: str) -> str:
    """A numeric token in one canonical form ("99.0" -> "99", "007" -> "7", "2.50" -> "2.5")."""
    if not _NUMBER.fullmatch(token):
        return token
    try:
        number = float(token)
    except ValueError:  # pragma: no cover - the pattern only admits valid floats
        return token
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return repr(number)


def tokens(text: str) -> tuple[str, ...]:
    """Normalised tokens of `text`: words, ids (ORD-1017, #W123, a@b.com) and numbers."""
    return _tokens(text) if len(text) <= _CACHE_TEXT else _tokenize(text)


def _tokenize(text: str) -> tuple[str, ...]:
    found = []
    for raw in _TOKEN.findall(normalize(text)):
        token = raw.rstrip(".-/")
        if token:
            found.append(number_token(token))
    return tuple(found)


_SEPARATORS = re.compile(r"[\s_\-]+")


def loose(text: str) -> str:
    """Normalised text with hyphens, underscores and whitespace all one space: "one-way",
    "one_way" and "One Way" are the same words."""
    return _loose(text) if len(text) <= _CACHE_TEXT else _loosen(text)


def _loosen(text: str) -> str:
    return " ".join(_SEPARATORS.split(normalize(text))).strip()


_CACHE_TEXT = 4096  # texts up to this length are tokenised once (they recur across spans)
_tokens = lru_cache(maxsize=1 << 16)(_tokenize)
_loose = lru_cache(maxsize=1 << 16)(_loosen)  # record fields and messages recur in every run


def digit_runs(token_set: Iterable[str]) -> set[str]:
    """The runs of >= 4 digits inside tokens: "#w9502126" -> {"9502126"}."""
    return {run for t in token_set for run in _DIGIT_RUN.findall(t)}


def leaf_texts(value: Any, depth: int = 0) -> Iterator[str]:
    """Every scalar (and dict key) inside a parsed JSON value, as text; strings that hold JSON
    are opened too."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from leaf_texts(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from leaf_texts(item, depth + 1)
    elif isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] in ("{", "[") and depth < _MAX_DEPTH:
            parsed = parse_json(stripped)
            if not isinstance(parsed, str):
                yield from leaf_texts(parsed, depth + 1)
                return
        yield value
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def text_of(raw: Any) -> str:
    """The readable text of a span input/output: JSON leaves joined, or the text itself."""
    return " | ".join(leaf_texts(parse_json(raw) if isinstance(raw, str) else raw))


@lru_cache(maxsize=1 << 14)
def analyse(raw: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """(JSON leaves, their tokens) of a span input/output; cached: the same message or result
    text recurs in every later LLM call's input."""
    leaves = tuple(leaf_texts(parse_json(raw)))
    return leaves, frozenset(t for leaf in leaves for t in tokens(leaf))


def token_set_of(raw: Any) -> frozenset[str]:
    """The tokens of a span input/output."""
    return analyse(raw if isinstance(raw, str) else json.dumps(raw))[1]


def _is_number(token: str) -> bool:
    return bool(_NUMBER.fullmatch(token))


@dataclass(frozen=True)
class Value:
    """One checkable value inside a tool call's arguments."""

    arg: str  # argument path: top-level name, nested keys joined by "." (list indices dropped)
    raw: str  # the value as the agent passed it
    norm: str  # normalised text
    significant: tuple[str, ...]  # the tokens that must all occur in the evidence
    in_list: bool = False  # one of several values of a list argument


_CAPITALISED = re.compile(r"(?<![\w#@.\-/])[A-Z][a-z]+")


def _id_like(token: str) -> bool:
    """Letters and digits mixed (ORD-1017, credit_card_7815826), or an '@', '#' or '_'."""
    has_digit = any(c.isdigit() for c in token)
    return (has_digit and any(c.isalpha() for c in token)) or any(c in "@#_" for c in token)


def significant_tokens(
    text: str, *, min_token_length: int = 3, min_number: float = 10, max_words: int = 4
) -> tuple[str, ...]:
    """The tokens of a value that must be grounded.

    A one-token value: itself, unless shorter than `min_token_length` or a whole number
    within +-`min_number`. Text of several tokens: its identifier-like tokens (letters mixed
    with digits, '@', '#', '_'), its amounts and long numbers (with a decimal point or 4+
    digits) and, in short text (up to `max_words` tokens), its capitalised words after the
    first (names; in text of one or two tokens, the first too); plain words are the agent's
    own phrasing ("best webcam under 100")."""
    raw_tokens = [t.rstrip(".-/") for t in _TOKEN.findall(normalize(text))]
    raw_tokens = [t for t in raw_tokens if t]
    if len(raw_tokens) == 1:
        token = number_token(raw_tokens[0])
        if _is_number(token):
            small = float(token).is_integer() and abs(float(token)) < min_number
            return () if small else (token,)
        return (token,) if len(token) >= min_token_length else ()
    names = set()
    if len(raw_tokens) <= max_words:  # a name: capitalised, and not just a sentence's start
        start = len(text) - len(text.lstrip())
        names = {
            normalize(m.group())
            for m in _CAPITALISED.finditer(text)
            if m.start() > start or len(raw_tokens) <= 2
        }
    keep = []
    for token in raw_tokens:
        if _is_number(token):
            digits = sum(c.isdigit() for c in token)
            if "." in token or digits >= 4:
                number = number_token(token)
                if not (float(number).is_integer() and abs(float(number)) < min_number):
                    keep.append(number)
        elif _id_like(token) or (token in names and len(token) >= min_token_length):
            keep.append(token)
    return tuple(dict.fromkeys(keep))


def argument_values(step: Step, **options: Any) -> list[Value]:
    """The checkable values in a tool call's arguments, in argument order."""
    arguments = parse_json(step.input)
    values: list[Value] = []

    def walk(value: Any, path: str, depth: int, in_list: bool) -> None:
        if depth > _MAX_DEPTH or value is None or isinstance(value, bool):
            return
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else str(key), depth + 1, in_list)
        elif isinstance(value, list):
            for item in value:
                walk(item, path, depth + 1, in_list or len(value) > 1)
        else:
            raw = value if isinstance(value, str) else json.dumps(value)
            significant = significant_tokens(raw, **options)
            if significant:
                values.append(Value(path or "input", raw, normalize(raw), significant, in_list))

    walk(arguments, "" if isinstance(arguments, dict) else "input", 0, False)
    return values


# The evidence an agent could see ------------------------------------------------------------------
class Source:
    """One piece of evidence: a message, tool result or memory read, with its tokens."""

    __slots__ = ("_loose", "_records", "_text", "kind", "leaves", "parsed", "position", "step",
                 "token_set")  # fmt: skip

    def __init__(self, step: Step, kind: str, raw: Any) -> None:
        self.step = step
        self.position = step.position
        self.kind = kind  # request (user, run input) | system | observation (results, reads)
        self.parsed = raw  # parsed on demand (records)
        self.leaves, self.token_set = analyse(raw if isinstance(raw, str) else json.dumps(raw))
        self._text: str | None = None
        self._loose: str | None = None
        self._records: list[tuple[list[set[str]], list[frozenset[str]]]] | None = None

    @property
    def text(self) -> str:
        """The normalised text (for whole-value matches)."""
        if self._text is None:
            self._text = normalize(" | ".join(self.leaves))
        return self._text

    @property
    def loose_text(self) -> str:
        """The text with separators made equal (`loose`)."""
        if self._loose is None:
            self._loose = loose(" | ".join(self.leaves))
        return self._loose

    def records(self) -> list[tuple[list[set[str]], list[frozenset[str]]]]:
        """Per list of records inside: each record's words and tokens (computed once)."""
        if self._records is None:
            self._records = [
                ([_words(leaf_texts(r)) for r in records],
                 [frozenset(t for leaf in leaf_texts(r) for t in tokens(leaf)) for r in records])
                for records in _record_lists(parse_json(self.parsed))
            ]  # fmt: skip
        return self._records


def _message_sources(step: Step) -> Iterator[tuple[str, Any]]:
    """(kind, content) for the non-assistant messages of a chat span's input."""
    if not isinstance(parse_json(step.input), (list, dict)):
        return
    for message in chat_messages(step.input):  # GenAI or older shape
        kind = _EVIDENCE_ROLES.get(str(message.get("role", "")).lower())
        if kind is not None and message.get("content"):
            yield kind, message.get("content")


def step_sources(step: Step) -> Iterator[tuple[str, Any]]:
    """(kind, raw content) of what `step` lets the agent see."""
    if step.parent_span_id is None or step.operation == sc.OP_AGENT:
        if step.input:
            yield "request", step.input  # the run's (or a sub-agent's) task
        return
    if is_tool(step) or step.operation == sc.OP_MEMORY_SEARCH:
        if step.output:
            yield "observation", step.output
        return
    if step.operation == sc.OP_CHAT:
        yield from _message_sources(step)
        return
    kind = _EVIDENCE_ROLES.get(str(step.role or "").lower())
    if kind is not None:
        for raw in (step.input, step.output):
            if raw:
                yield kind, raw


_SUFFIXES = ("ing", "es", "ed", "s")


def word_stem(token: str) -> str | None:
    """A plain word of 5+ letters less one inflection ("messaging", "messages" -> "messag"),
    or None for anything else: an argument in another form of the user's word is not
    invented."""
    if len(token) < 5 or not token.isalpha():
        return None
    for suffix in _SUFFIXES:
        if token.endswith(suffix) and len(token) - len(suffix) >= 4:
            return token[: -len(suffix)]
    return token


class _Pool:
    """Tokens (and their digit runs and word stems) of a set of sources."""

    def __init__(self) -> None:
        self.token_set: set[str] = set()
        self.digits: set[str] = set()
        self.stems: set[str] = set()
        self.sources: list[Source] = []

    def add(self, source: Source) -> None:
        new = source.token_set - self.token_set
        self.token_set |= new
        self.digits |= digit_runs(new)
        self.stems |= {stem for t in new if (stem := word_stem(t))}
        self.sources.append(source)

    def has(self, token: str) -> bool:
        if token in self.token_set:
            return True
        runs = _DIGIT_RUN.findall(token)  # an id in another format: "#W9502126" ~ "9502126"
        return bool(runs) and not _is_number(token) and all(r in self.digits for r in runs)

    def grounded(self, value: Value) -> bool:
        if all(self.has(t) for t in value.significant):
            return True
        stem = word_stem(value.significant[0]) if len(value.significant) == 1 else None
        if stem is not None and stem in self.stems:  # "messaging" where the user said "messages"
            return True
        if " " in value.norm:
            pattern = re.compile(r"(?<!\w)" + re.escape(value.norm) + r"(?!\w)")
            if any(pattern.search(s.text) for s in self.sources):
                return True
        # the same words with other separators: "one_way" where the user wrote "one-way"
        words = loose(value.raw)
        if not words:
            return False
        pattern = re.compile(r"(?<![^\W_])" + re.escape(words) + r"(?![^\W_])")
        return any(pattern.search(s.loose_text) for s in self.sources)


class Evidence:
    """What the agent could see before a position of one run; queried in increasing position."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.sources: list[Source] = []
        self.everything = _Pool()
        self.told = _Pool()  # request and system sources
        self.request_tokens: set[str] = set()
        self._next = 0
        # where the run has user messages, its input is no evidence: an imported benchmark run
        # puts there what a simulated user was told (its hidden instruction), not what it said
        self._root = run.root if any(s.role == "user" for s in run.steps) else None

    def advance(self, position: int) -> None:
        """Take in the evidence of every step before `position`."""
        steps = self.run.steps
        while self._next < len(steps) and steps[self._next].position < position:
            step = steps[self._next]
            self._next += 1
            if step is self._root:
                continue
            for kind, raw in step_sources(step):
                source = Source(step, kind, raw)
                if not source.token_set:
                    continue
                self.sources.append(source)
                self.everything.add(source)
                if kind in ("request", "system"):
                    self.told.add(source)
                if kind == "request":
                    self.request_tokens |= source.token_set

    def grounded(self, value: Value) -> bool:
        """Whether anything taken in so far contains the value."""
        return self.everything.grounded(value)

    def told_by_user(self, value: Value) -> bool:
        """Whether the run input, a user or a system message contains the value."""
        return self.told.grounded(value)

    def sources_with(self, value: Value, kind: str) -> list[Source]:
        """The sources of `kind` that hold every significant token of the value, latest first."""
        return [
            s
            for s in reversed(self.sources)
            if s.kind == kind and all(t in s.token_set for t in value.significant)
        ]


# Unsupported choices -----------------------------------------------------------------------------
def _stem(token: str) -> str:
    return (
        token[:-1] if len(token) > 3 and token.endswith("s") and not token.endswith("ss") else token
    )


_JOINERS = str.maketrans("", "", "-/.")


def _is_word(token: str) -> bool:
    """Alphabetic, of >= 4 letters, counting a compound's parts together ("osl-ber", a route
    of two 3-letter codes, is one word; "ord-1017" is an id, not a word)."""
    letters = token.translate(_JOINERS)
    return len(letters) >= 4 and letters.isalpha()


def _words(texts: Iterable[str]) -> set[str]:
    """Words (`_is_word`, plural 's' dropped) of some texts."""
    return {_stem(t) for text in texts for t in tokens(text) if _is_word(t)}


def _record_lists(value: Any, depth: int = 0) -> Iterator[list[dict[str, Any]]]:
    """Lists of two or more records (dicts) anywhere inside a parsed value."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        value = parse_json(value.strip())
    if isinstance(value, dict):
        for item in value.values():
            yield from _record_lists(item, depth + 1)
    elif isinstance(value, list):
        records = [v for v in value if isinstance(v, dict)]
        if len(records) >= 2 and len(records) == len(value):
            yield records
        for item in value:
            yield from _record_lists(item, depth + 1)


def unsupported_choice(value: Value, evidence: Evidence) -> dict[str, Any] | None:
    """Where `value` is only grounded as a field of one record in a list of records, and that
    record shares no distinctive word with the user's request while a sibling record does: the
    evidence of that mismatch (the source, the chosen record's words, the better match's).

    A record's distinctive words are those found in fewer than half of the list's records; the
    better match must share a word with the request that no other record has."""
    request_words = {_stem(t) for t in evidence.request_tokens}
    if not request_words:
        return None
    for source in evidence.sources_with(value, "observation"):
        for words, token_sets in source.records():
            holds = [all(t in ts for t in value.significant) for ts in token_sets]
            if sum(holds) != 1:
                continue  # the value is in no record (or in several): no choice to judge
            chosen = holds.index(True)
            counts = Counter(w for ws in words for w in ws)
            limit = len(words) / 2
            distinctive = [{w for w in ws if counts[w] < limit} for ws in words]
            unique = [{w for w in ws if counts[w] == 1} for ws in words]
            scores = [len(ws & request_words) for ws in unique]
            best = max(range(len(words)), key=lambda i: (scores[i], -i))
            if distinctive[chosen] and not distinctive[chosen] & request_words and scores[best] > 0:
                return {
                    "source_position": source.position,
                    "source_span_id": source.step.span_id,
                    "chosen": sorted(distinctive[chosen])[:8],
                    "better_match": sorted(unique[best] & request_words)[:8],
                    "candidates": len(words),
                }
    return None


# The detector ------------------------------------------------------------------------------------
def _origin(run: Run, call: Step, value: Value) -> Step | None:
    """The latest LLM call or assistant message before `call` whose output holds the value."""
    for step in reversed(run.steps[: call.position]):
        if step.operation == sc.OP_CHAT or step.role == "assistant":
            out = token_set_of(step.output) if step.output else frozenset()
            if all(t in out for t in value.significant):
                return step
    return None


def downstream(run: Run, after: int, significant: Sequence[str], limit: int = 10) -> list[Step]:
    """Later tool calls and memory writes whose inputs/content use the value."""
    found = []
    for step in run.steps[after + 1 :]:
        if is_tool(step):
            raw = step.input
        elif step.operation == sc.OP_MEMORY_UPDATE:
            raw = step.output or step.attributes.get(sc.MEMORY_CONTENT)
        else:
            continue
        if raw and all(t in token_set_of(raw) for t in significant):
            found.append(step)
            if len(found) >= limit:
                break
    return found


class UngroundedArgument(Detector):
    """Tool argument values with no earlier evidence in the run (see the module docstring).

    Parameters: `min_token_length` (3) and `min_number` (10) say which tokens are checked,
    `max_words` (4) which strings are checked whole rather than for identifier-like tokens,
    `vocabulary_runs` (3) how many successful runs make a value part of an argument's
    vocabulary, `choices` (True) whether to flag unsupported choices.
    """

    name = UNGROUNDED_ARGUMENT
    description = (
        "Uses tool argument values (ids, amounts, names) that appear nowhere in what the agent "
        "was told or has looked up, or picks a record that does not match the request"
    )

    def __init__(
        self,
        min_token_length: int = 3,
        min_number: float = 10,
        max_words: int = 4,
        vocabulary_runs: int = 3,
        choices: bool = True,
    ) -> None:
        self.min_token_length = min_token_length
        self.min_number = min_number
        self.max_words = max_words
        self.vocabulary_runs = vocabulary_runs
        self.choices = choices
        self.vocabulary_: set[tuple[str, str, str]] = set()

    @property
    def _options(self) -> dict[str, Any]:
        return {"min_token_length": self.min_token_length, "min_number": self.min_number,
                "max_words": self.max_words}  # fmt: skip

    @staticmethod
    def _grounded(evidence: Evidence, call: Step, value: Value) -> bool:
        """Grounded as text, or an amount: one of a write's (`wrong_amount` checks those, with
        arithmetic) or, in any other call, arithmetic on the numbers seen (`derived`)."""
        if evidence.grounded(value):
            return True
        number = parse_number(value.raw) if len(value.significant) == 1 else None
        if number is None or not _is_number(value.significant[0]):
            return False
        if not (is_read_tool(call.tool or call.name) or is_answer_tool(call.tool or call.name)):
            return True
        known = numbers_in(leaf for source in evidence.sources for leaf in source.leaves)
        return derived(number, known, decimals=max(decimals_of(value.raw), 2)) is not None

    def fit(self, runs: Sequence[Run]) -> UngroundedArgument:
        counts: Counter[tuple[str, str, str]] = Counter()
        for run in runs:
            if run.success is not True:
                continue
            evidence = Evidence(run)
            seen = set()
            for call in run.steps:
                if not is_tool(call):
                    continue
                evidence.advance(call.position)
                for value in argument_values(call, **self._options):
                    if not self._grounded(evidence, call, value):
                        seen.add((call.tool or call.name, value.arg, value.norm))
            counts.update(seen)
        self.vocabulary_ = {k for k, n in counts.items() if n >= self.vocabulary_runs}
        return self

    def detect(self, run: Run) -> list[Finding]:
        evidence = Evidence(run)
        findings: list[Finding] = []
        flagged: set[tuple[str, ...]] = set()
        by_key: dict[str, list[str]] = {}
        for call in run.steps:
            if not is_tool(call):
                continue
            evidence.advance(call.position)
            tool = call.tool or call.name
            for value in argument_values(call, **self._options):
                if (
                    value.significant in flagged
                    or (tool, value.arg, value.norm) in self.vocabulary_
                ):
                    continue
                if not self._grounded(evidence, call, value):
                    kind, confidence, extra = "invented", 0.9, {}
                    key = f"{self.name}:{tool}.{value.arg}"
                    message = (
                        f"{tool}({value.arg}={value.raw!r}) uses a value that appears in no "
                        "earlier user message, tool result, memory read or run input"
                    )
                elif self.choices and not value.in_list and not evidence.told_by_user(value):
                    extra = unsupported_choice(value, evidence)
                    if extra is None:
                        continue
                    kind, confidence = "unsupported_choice", 0.6
                    key = f"{self.name}:choice:{tool}.{value.arg}"
                    message = (
                        f"{tool}({value.arg}={value.raw!r}) picks a record that shares nothing "
                        f"with the request, while another one matches it "
                        f"({', '.join(extra['better_match'])})"
                    )
                else:
                    continue
                flagged.add(value.significant)
                if key in by_key:  # one finding per key and run; more values go in its details
                    by_key[key].append(value.raw)
                    continue
                by_key[key] = values = [value.raw]
                origin = _origin(run, call, value)
                later = downstream(run, call.position, value.significant)
                spans = [call.span_id]
                if origin is not None:
                    spans.append(origin.span_id)
                if extra.get("source_span_id"):
                    spans.append(extra["source_span_id"])
                spans += [s.span_id for s in later]
                findings.append(Finding(
                    detector=self.name, key=key, trace_id=run.trace_id, **step_ref(call),
                    span_ids=tuple(dict.fromkeys(spans)), message=message, confidence=confidence,
                    details={
                        "kind": kind, "tool": tool, "argument": value.arg, "value": value.raw,
                        "values": values,
                        "origin_position": origin.position if origin else None,
                        "downstream": [{"position": s.position, "span_id": s.span_id,
                                        "label": s.label} for s in later],
                        **extra,
                    },
                ))  # fmt: skip
        return findings
