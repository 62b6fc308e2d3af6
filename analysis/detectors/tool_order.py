"""Wrong tool order: precedence rules mined from the successful runs, broken in a run.

`fit` mines, over the successful runs, for every ordered pair of tools (A, B):

- *precedence* "A before B": among the successful runs that call both, the share whose first
  call of A comes before their first call of B. A rule when at least `min_support` runs call
  both and the share is at least `min_confidence` (1.0 by default: every such run). The default
  support of 5 keeps chance orderings out: two unrelated tools fall in the same order in 5 runs
  out of 5 with probability 1/32, in 3 out of 3 with 1/8.
- *prerequisite* "B needs A": among the successful runs that call B, the share that called A
  before B's first call; a prerequisite when at least `min_support` runs call B and the share is
  at least `min_confidence`.

Any call counts (failed ones too): the rule is about the order of attempts.

Rules are rates, too (`rate_rules`, with `by_rate`): a prerequisite (a look-up A, by its name,
of the record an action B acts on: they share an identifier) that successful runs keep
far more often than failed runs, though not always (lucky successes break it: a cancel without
the look-up goes through when the order happened to be cancellable), is one when at least
`min_support` successful runs call B and at least 30% of them call A first, and, among the runs
no rule every successful run keeps already explains, at least 3 failed runs break it and the
one-sided Fisher exact test of the share of failed runs breaking it against that of successful
runs gives p <= `max_p` (0.05). Its findings say the rates and the p-value
(`details["p_value"]`, `failed_rate`), with 0.1 less confidence. What the successful runs that
break it do in its place (a memory search instead of the policy look-up: done before B in 80%
of them, 0.3 more often than by those that follow it) is a substitute: a run doing it does not
break the rule. A write too few successful runs make for a test of its own (2 to 4) is tested
against the record's look-up as a whole: where successful runs call A before 90% of their calls
of the writes on A's record, its failed calls without A are tested against those.

`detect` looks at each rule's B in the run (its first call) and flags

- A called only *after* B (the precedence is reversed; confidence 0.9), or
- A never called, where A is a prerequisite of B (confidence 0.7) and B is *not* the run's final
  action: ending with B without the usual earlier calls is a premature finish, which
  `PrematureFinish` reports; a mid-run B without its prerequisite is a wrong order.

A third source of rules is the tools themselves: a failed call of B whose error text (its
result, its span status's message, a message attribute, or else the tool message answering it
in the next chat span's input: what the model read) names another known tool A together
with a word of order ("call get_booking first", "must ... before", "requires", "run X",
"use X") is a wrong order when A was not called (successfully) before it:
the error names the fix (confidence 0.95, `details["error_names_fix"]`). This needs no
successful run at all, and `InvalidInvocation` leaves such an error to this detector (the error
is the symptom, the missing step the cause).

Decisive step: B's first call; A's (later) first call follows it in `span_ids`. Key
``wrong_tool_order:A>B``. When several rules are broken at the same call, each gets a finding;
the rule with the most support comes first. Nothing about any domain is hard-coded: the rules
are whatever successful runs always do.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from tracegym.analysis.detector_names import WRONG_TOOL_ORDER
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.features import final_action_step, is_agent_call, step_ref
from tracegym.analysis.run_memory import PerRunMemory
from tracegym.analysis.runs import Run, Step, parse_json
from tracegym.analysis.tool_kinds import is_answer_tool, is_read_tool
from tracegym.tracer import semconv as sc
from tracegym.tracer.messages import chat_messages


@dataclass(frozen=True)
class Rule:
    """A mined rule: `before` comes before `after` in successful runs."""

    before: str
    after: str
    support: int  # successful runs that call both (precedence) or call `after` (prerequisite)
    confidence: float
    prerequisite: bool  # `after` is never called without `before` earlier in successful runs
    # a rule of rates (`rate_rules`): the share of failed runs that follow it, how many failed
    # runs it was measured on, and the one-sided Fisher p-value of the two rates
    failed_rate: float | None = None
    failed_support: int = 0
    p_value: float | None = None
    # what the successful runs that break it do in its place before `after` (a memory search
    # instead of the policy look-up): a run doing it does not break the rule
    substitutes: tuple[str, ...] = ()
    broken_failed: int = 0  # (rates) failed runs breaking it, among those no exact rule explains
    broken_succeeded: int = 0  # ... and successful ones
    # a thin write's rule (`rate_rules`): (calls made after A, calls) by successful runs, pooled
    # over the writes A looks the record up for, which its test is made against
    pooled: tuple[int, int] | None = None

    @property
    def key(self) -> str:
        return f"wrong_tool_order:{self.before}>{self.after}"

    @property
    def by_rate(self) -> bool:
        """Mined from the two rates, not from every successful run following it."""
        return self.p_value is not None


def fisher_greater(followed: int, n: int, followed_failed: int, n_failed: int) -> float:
    """One-sided Fisher exact p-value that successful runs (`followed` of `n`) follow a rule more
    often than failed runs (`followed_failed` of `n_failed`)."""
    from scipy.stats import fisher_exact

    table = [[followed, n - followed], [followed_failed, n_failed - followed_failed]]
    return float(fisher_exact(table, alternative="greater").pvalue)


_ORDER_WORDS = re.compile(
    r"\b(?:first|before|prior|beforehand|requires?|required|needs?|must|call|run|use|invoke"
    r"|look\s*up|fetch)\b",
    re.IGNORECASE,
)


def error_text(step: Step, run: Run | None = None) -> str:
    """What a failed call said: its result, its span status's message (where an SDK-traced
    tool's raised error keeps its text), any message attribute and, when `run` is given and
    the span holds no text, the tool message the model saw next (the result as the agent read
    it: a chat span's input message answering the call's id)."""
    texts = [step.output or ""]
    if step.status_message and step.status_message not in texts:
        texts.append(step.status_message)
    texts += [v for k, v in step.attributes.items() if isinstance(v, str) and "message" in k]
    if run is not None and not any(texts):
        texts.append(_answer_seen(step, run))
    return "\n".join(t for t in texts if t)


def _answer_seen(call: Step, run: Run) -> str:
    """The content of the tool message answering `call` in the next chat span's input."""
    for step in run.steps[call.position + 1 :]:
        if step.operation != sc.OP_CHAT or not step.input:
            continue
        if not isinstance(parse_json(step.input), (list, dict)):
            continue
        for message in reversed(chat_messages(step.input)):  # GenAI or older shape
            if not isinstance(message, dict) or message.get("role") not in ("tool", "function"):
                continue
            same_id = call.call_id and message.get("tool_call_id") == call.call_id
            same_name = not call.call_id and message.get("name") == (call.tool or call.name)
            if same_id or same_name:
                content = message.get("content")
                return content if isinstance(content, str) else json.dumps(content)
        return ""
    return ""


def named_prerequisites(
    step: Step, tools: Collection[str], called_before: Collection[str], run: Run | None = None
) -> list[str]:
    """The known `tools` a failed call's error names as a step to take first (with a word of
    order: "call X first", "X is required") that were not `called_before` it."""
    if not step.failed:
        return []
    text = error_text(step, run)
    if not text or not _ORDER_WORDS.search(text):
        return []
    own = step.tool or step.name
    named = []
    for tool in sorted(tools, key=lambda t: (-len(t), t)):
        if tool == own or tool in called_before or len(tool) < 3:
            continue
        if re.search(r"(?<![\w.])" + re.escape(tool) + r"(?![\w])", text):
            named.append(tool)
    return named


def _first_calls(run: Run) -> dict[str, Step]:
    first: dict[str, Step] = {}
    for step in run.steps:
        if is_agent_call(step):
            first.setdefault(step.tool or step.name, step)
    return first


_FIRSTS = PerRunMemory(_first_calls)
# Within it, `first_calls` works each run out once: fitting and detecting ask for a run's first
# calls once per rule. The runs must not change inside it.
remembering_first_calls = _FIRSTS.scope


def first_calls(run: Run) -> dict[str, Step]:
    """Each tool's first call in the run (do not change the dict: it may be remembered)."""
    return _FIRSTS.get(run)


@dataclass
class _Counts:
    """Per ordered pair and per tool, in one population of runs."""

    both: Counter[tuple[str, str]]  # runs calling both
    ordered: Counter[tuple[str, str]]  # ... whose first call of a comes first
    calls: Counter[str]  # runs calling the tool


def _count(runs: Sequence[Run]) -> _Counts:
    both: Counter[tuple[str, str]] = Counter()
    ordered: Counter[tuple[str, str]] = Counter()
    calls: Counter[str] = Counter()
    for run in runs:
        first = {tool: step.position for tool, step in first_calls(run).items()}
        calls.update(first.keys())
        for a, pa in first.items():
            for b, pb in first.items():
                if a == b:
                    continue
                both[a, b] += 1
                if pa < pb:
                    ordered[a, b] += 1
    return _Counts(both, ordered, calls)


SUBSTITUTE_SHARE = 0.8  # of the successful runs breaking a rule of rates, doing the same instead
SUBSTITUTE_MARGIN = 0.3  # ... and this much more often than those that follow it


def done_before(run: Run, position: int) -> set[str]:
    """The tools called and the memory searches made before `position` (by name)."""
    return {step.tool or step.name for step in run.steps[:position]
            if is_agent_call(step) or step.operation == sc.OP_MEMORY_SEARCH}  # fmt: skip


def substitutes(runs: Sequence[Run], before: str, after: str) -> tuple[str, ...]:
    """What the `runs` (successful ones) that call `after` without `before` earlier do before
    it in SUBSTITUTE_SHARE of them, SUBSTITUTE_MARGIN more often than the others."""
    breakers, followers = [], []
    for run in runs:
        first = first_calls(run)
        b = first.get(after)
        if b is None:
            continue
        a = first.get(before)
        done = done_before(run, b.position) - {before, after}
        (followers if a is not None and a.position < b.position else breakers).append(done)
    if not breakers:
        return ()
    counts = Counter(t for done in breakers for t in done)
    return tuple(sorted(
        t for t, n in counts.items()
        if n / len(breakers) >= SUBSTITUTE_SHARE
        and n / len(breakers) - (sum(t in d for d in followers) / len(followers)
                                 if followers else 0.0) >= SUBSTITUTE_MARGIN
    ))  # fmt: skip


def mine_rules(
    runs: Sequence[Run], min_support: int = 5, min_confidence: float = 1.0
) -> list[Rule]:
    """Precedence rules over `runs` (pass the successful ones), sorted by (after, -support)."""
    c = _count(runs)
    rules = []
    for (a, b), n in c.both.items():
        share = c.ordered[a, b] / n
        required = c.calls[b] >= min_support and c.ordered[a, b] / c.calls[b] >= min_confidence
        if n >= min_support and share >= min_confidence:
            rules.append(Rule(a, b, n, share, required))
    rules.sort(key=lambda r: (r.after, -r.support, r.before))
    return rules


def breaks(run: Run, rule: Rule, flag_missing: bool = True) -> tuple[Step, Step | None] | None:
    """(B's first call, A's first call or None) where `run` breaks `rule`: A called only after
    B, or (a prerequisite, with `flag_missing`) never, B not being the run's final action; and
    the run did none of the rule's substitutes before B. None where it keeps the rule."""
    first = first_calls(run)
    b = first.get(rule.after)
    if b is None:
        return None
    a = first.get(rule.before)
    if a is not None and a.position < b.position:
        return None
    if rule.substitutes and set(rule.substitutes) & done_before(run, b.position):
        return None  # it did what the successful runs breaking the rule do instead
    if a is None and not (rule.prerequisite and flag_missing and b is not final_action_step(run)):
        return None
    return b, a


SAME_RECORD = 0.8  # of the successful runs keeping a rule of rates, A and B on one record


def same_record(runs: Sequence[Run], a: str, b: str) -> bool:
    """Whether, in SAME_RECORD of the `runs` (successful ones) calling A before B, a call of A
    before B's first call shares an identifier with B's arguments (`state.write_tokens`): A is
    the look-up of the record B acts on, not a step some runs happen to take first."""
    from tracegym.analysis.detectors.state import write_tokens

    kept = linked = 0
    for run in runs:
        first = first_calls(run)
        if b not in first or a not in first or first[a].position > first[b].position:
            continue
        kept += 1
        wanted = write_tokens(first[b])
        linked += any(write_tokens(s) & wanted for s in run.steps[: first[b].position]
                      if is_agent_call(s) and (s.tool or s.name) == a)  # fmt: skip
    return bool(kept) and linked / kept >= SAME_RECORD


def _read_before_write(a: str, b: str) -> bool:
    """Whether (A, B) is a look-up before an action, by the tools' names (`tool_kinds`): the
    rules of rates are about acting without looking first; an order among reads, which so many
    pairs of tools give, is no such rule and chance finds some."""
    return is_read_tool(a) and not is_read_tool(b) and not is_answer_tool(b)


LOOK_UP_SHARE = 0.9  # of the successful calls of the writes on A's record, made after A


def record_look_up(s: _Counts, successes: Sequence[Run], a: str) -> tuple[int, int]:
    """(Calls made after A, calls) by the `successes`, pooled over the writes B that A looks
    the record up for (`_read_before_write`, `same_record`): how firmly A is *the* look-up
    before acting on its record, whatever the write."""
    writes = [b for b in s.calls if _read_before_write(a, b) and s.ordered[a, b]]
    writes = [b for b in writes if same_record(successes, a, b)]
    return sum(s.ordered[a, b] for b in writes), sum(s.calls[b] for b in writes)


def rate_rules(
    successes: Sequence[Run],
    failures: Sequence[Run],
    *,
    min_support: int = 5,
    min_failed: int = 3,
    min_rate: float = 0.2,
    max_p: float = 0.05,
    known: Collection[tuple[str, str]] = (),
    explained: Collection[str] = (),
) -> list[Rule]:
    """Prerequisites ("B needs A": a look-up A before an action B, `_read_before_write`, of the
    record B acts on, `same_record`) that successful runs keep far more often than failed runs,
    though not always (lucky successes break them). A pair is one when at least `min_support`
    successful runs call B and at least `min_rate` of them (not all: those are `mine_rules`')
    call A first; and, among the runs no rule every successful run keeps already explains (not
    in `explained`), at least `min_failed` failed runs break it (`breaks`) and the one-sided
    Fisher exact test of the share of failed runs breaking it against that of successful runs
    gives p <= `max_p`. Pairs in `known` are skipped. The rule's `confidence` is the share of
    successful runs calling B that call A first, `failed_rate` that of failed runs.

    A *thin* write, one that 2 to `min_support` - 1 successful runs call (at least `min_rate`
    of them after A, all of them allowed), is judged against the record's look-up as a whole
    (`record_look_up`): where successful runs make `min_support` or more calls of A's writes
    and LOOK_UP_SHARE of them after A, the failed runs calling B that break the rule are tested
    (one-sided Fisher, `Rule.pooled`) against the successful calls of those writes made
    without A first. A rare write is looked up like every other write on the record."""
    s, f = _count(successes), _count(failures)
    succeeded = [r for r in successes if r.trace_id not in explained]
    failed = [r for r in failures if r.trace_id not in explained]
    look_ups: dict[str, tuple[int, int]] = {}
    rules = []
    for (a, b), _ in sorted(s.both.items()):
        n_s = s.calls[b]
        if (a, b) in known or n_s < 2 or not _read_before_write(a, b):
            continue
        rate = s.ordered[a, b] / n_s
        thin = n_s < min_support
        if rate < min_rate or (rate >= 1.0 and not thin) or not same_record(successes, a, b):
            continue
        pooled = None
        if thin:
            if a not in look_ups:
                look_ups[a] = record_look_up(s, successes, a)
            pooled = look_ups[a]
            if pooled[1] < min_support or pooled[0] < LOOK_UP_SHARE * pooled[1]:
                continue
        n_f = f.calls[b]
        rule = Rule(a, b, n_s, round(rate, 4), True,
                    round(f.ordered[a, b] / n_f, 4) if n_f else None, n_f,
                    substitutes=substitutes(successes, a, b), pooled=pooled)  # fmt: skip
        broken_f = sum(breaks(r, rule) is not None for r in failed)
        if broken_f < min_failed:
            continue
        broken_s = sum(breaks(r, rule) is not None for r in succeeded)
        if pooled is None:
            p = fisher_greater(broken_f, len(failed), broken_s, len(succeeded))
        else:
            calling = sum(rule.after in first_calls(r) for r in failed)
            p = fisher_greater(broken_f, calling, pooled[1] - pooled[0], pooled[1])
        if p <= max_p:
            rules.append(replace(rule, p_value=p, broken_failed=broken_f,
                                 broken_succeeded=broken_s))  # fmt: skip
    rules.sort(key=lambda r: (r.after, -r.support, r.before))
    return rules


class WrongToolOrder(Detector):
    """Breaks of the tool-precedence rules that successful runs follow (see the module docstring).

    Parameters: `min_support` (5) successful runs behind a rule, `min_confidence` (1.0) share of
    them that follow it, `flag_missing` (True) whether a missing prerequisite counts, `by_rate`
    (True) whether rules of rates count too, `max_p` (0.05) their Fisher p-value bound.
    """

    name = WRONG_TOOL_ORDER
    description = (
        "Calls tools in an order successful runs never use, or use far more rarely than failed "
        "runs do (lucky successes use it too): an action before the lookup or check that "
        "successful runs make first"
    )

    def __init__(
        self,
        min_support: int = 5,
        min_confidence: float = 1.0,
        flag_missing: bool = True,
        by_rate: bool = True,
        max_p: float = 0.05,
    ) -> None:
        self.min_support = min_support
        self.min_confidence = min_confidence
        self.flag_missing = flag_missing
        self.by_rate = by_rate
        self.max_p = max_p
        self.rules_: list[Rule] = []
        self.tools_: set[str] = set()

    def fit(self, runs: Sequence[Run]) -> WrongToolOrder:
        with remembering_first_calls():
            return self._fit(runs)

    def _fit(self, runs: Sequence[Run]) -> WrongToolOrder:
        successes = [r for r in runs if r.success is True]
        self.rules_ = mine_rules(successes, self.min_support, self.min_confidence)
        if self.by_rate:
            failures = [r for r in runs if r.success is False]
            known = {(r.before, r.after) for r in self.rules_ if r.prerequisite}
            flag = self.flag_missing
            explained = {run.trace_id for run in runs
                         if any(breaks(run, rule, flag) for rule in self.rules_)}  # fmt: skip
            rated = rate_rules(successes, failures, min_support=self.min_support,
                               max_p=self.max_p, known=known, explained=explained)  # fmt: skip
            # a prerequisite by rates replaces the same pair's precedence (it flags both)
            replaced = {(r.before, r.after) for r in rated}
            self.rules_ = [r for r in self.rules_ if (r.before, r.after) not in replaced] + rated
            self.rules_.sort(key=lambda r: (r.after, -r.support, r.before))
        self.tools_ = {s.tool or s.name for r in runs for s in r.steps if is_agent_call(s)}
        return self

    def _named_fixes(self, run: Run) -> list[Finding]:
        """Failed calls whose error names a tool the run had not called first."""
        tools = self.tools_ | {s.tool or s.name for s in run.steps if is_agent_call(s)}
        called: set[str] = set()
        findings: dict[str, Finding] = {}
        first = first_calls(run)
        for step in run.steps:
            if not is_agent_call(step):
                continue
            tool = step.tool or step.name
            for before in named_prerequisites(step, tools, called, run):
                key = f"{self.name}:{before}>{tool}"
                if key in findings:
                    continue
                later = first.get(before)
                spans = [step.span_id] + ([later.span_id] if later is not None else [])
                text = error_text(step, run).strip().splitlines()[0][:200]
                findings[key] = Finding(
                    detector=self.name, key=key, trace_id=run.trace_id, **step_ref(step),
                    span_ids=tuple(spans), confidence=0.95,
                    message=(f"{tool} was called before {before}, and its error names the fix: "
                             f"{text!r}"),
                    details={"before": before, "after": tool, "support": 0,
                             "rule_confidence": 1.0, "missing": later is None,
                             "before_position": later.position if later else None,
                             "error_names_fix": True, "error": text},
                )  # fmt: skip
            if not step.failed:
                called.add(tool)
        return list(findings.values())

    def detect(self, run: Run) -> list[Finding]:
        with remembering_first_calls():
            return self._detect(run)

    def _detect(self, run: Run) -> list[Finding]:
        named = self._named_fixes(run)
        if not self.rules_:
            return named
        findings = []
        for rule in self.rules_:
            broken = breaks(run, rule, self.flag_missing)
            if broken is None:
                continue
            b, a = broken
            if a is not None:
                confidence, evidence = 0.9, [b.span_id, a.span_id]
                message = (
                    f"{rule.after} was called before {rule.before}; in all {rule.support} "
                    f"successful runs that call both, {rule.before} comes first"
                )
            else:
                confidence, evidence = 0.7, [b.span_id]
                message = (
                    f"{rule.after} was called without {rule.before} before it; successful runs "
                    f"always call {rule.before} first"
                )
            if rule.by_rate:
                confidence = round(confidence - 0.1, 3)
                how = "before" if a else "without"
                tail = "" if a else " before it"
                pooled = ("" if rule.pooled is None else
                          f"successful runs call {rule.before} before {rule.pooled[0]} of "
                          f"{rule.pooled[1]} calls of the writes on its record; ")  # fmt: skip
                message = (f"{rule.after} was called {how} {rule.before}{tail}; {pooled}"
                           f"{rule.confidence:.0%} of {rule.support} successful runs calling "
                           f"{rule.after} call {rule.before} first, {rule.failed_rate or 0:.0%} "
                           f"of {rule.failed_support} failed ones; {rule.broken_failed} failed "
                           f"and {rule.broken_succeeded} successful runs break it (one-sided "
                           f"Fisher p = {rule.p_value:.2g})")  # fmt: skip
            findings.append(Finding(
                detector=self.name, key=rule.key, trace_id=run.trace_id, **step_ref(b),
                span_ids=tuple(evidence), message=message, confidence=confidence,
                details={"before": rule.before, "after": rule.after, "support": rule.support,
                         "rule_confidence": rule.confidence,
                         "missing": a is None, "before_position": a.position if a else None,
                         "failed_rate": rule.failed_rate, "failed_support": rule.failed_support,
                         "p_value": rule.p_value},
            ))  # fmt: skip
        keys = {f.key for f in named}
        findings = named + [f for f in findings if f.key not in keys]
        findings.sort(key=lambda f: (f.position or 0, -f.confidence, -f.details["support"]))
        return findings
