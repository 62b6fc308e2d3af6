"""Forbidden actions: a write called on a record in a state where successful runs never call it.

`fit` pairs, in the successful runs, every write call that did not fail with the read it acts on
(`state.acted_on`: the latest earlier read sharing an identifier with its arguments) and every
read record with the writes that acted on it. Records count once however many runs read them
(the same task's record, read in every trial, is one record: its fields are not independent
evidence): a record is the read tool, its arguments and the result. For a write tool T and
the read tool R whose records it acts on, per field path of R's results present on at least
`min_presence` (half) of R's records (a state every record has, not an option some items have):

- *enum fields* (strings up to 40 characters, booleans, null: "status", "items[].status",
  "flags.locked"): the values seen on records T acted on (at least `min_support` of them), and
  the values seen on R-records successful runs read and did *not* act on with T. A value is
  *forbidden* for T when successful runs abstained on at least `min_abstain` records holding it,
  never acted on one, and that is unlikely to be chance: if a share p of the R-records hold the
  value, n acted records all missing it has probability (1 - p)^n, which must be at most
  `max_chance` (0.05: with 3 acted records the value must be on 63% of the records, with 40 on
  7%). Or, failed runs' evidence: at least `min_failed` (3) of the m records *failed* runs
  called T on hold the value (a state rare in general but common where failed runs act), and k
  of m holding it while none of the n acted records do has one-sided Fisher probability
  C(m, k) / C(m + n, k) <= `max_chance`. A colour or size that the few acted records happen not
  to have is no rule. Paths with
  more than `max_values` distinct values are identifiers or prose, not states;
- *numeric fields* (numbers and ISO dates, not inside lists): the range [lo, hi] of the values
  on records T acted on (at least `min_threshold_support`, 5, of them: the range of three values
  is their spread).
  Above hi (below lo) is forbidden when at least `min_abstain` abstained records lie there,
  with the same chance bound over the share of records beyond it.

Rules are rates, too: a state value successful runs did act in, on at most a quarter of the
records they acted on (lucky ones: the write went through, or the outcome did not depend on it),
is forbidden when at least `min_failed` of the m records failed runs acted on hold it, their
share exceeds the successful runs' by 0.4, and the one-sided Fisher exact test of the two shares
gives p <= `max_chance`; its findings carry the p-value (`details["p_value"]`, `lucky`) and
0.1 less confidence, and its `MinedRule` the share of successful records that kept it.

`detect` flags each write call of a run (failed ones too: an attempt the system refused is the
same mistake; with `ignore_recovered`, off by default, not when the run went on to make a write
that went through) whose acted-on record holds a forbidden value. Key ``forbidden_action:T``, one
finding per key and run; decisive step: the first such write; the read that showed the state
and later such writes follow in `span_ids`. Confidence 0.8
for an enum value, 0.6 for a threshold. Each finding carries the rule it breaks as
`details["mined_rule"]` (`analysis.gap.MinedRule`, kind ``precondition``, with the successful runs
it was mined from), and the run's request and first call (`request`, `first_call`: the users'
words): what synthesis may enforce, and how users ask. Nothing about any domain is hard-coded.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import comb
from typing import Any

import numpy as np
from tracegym.analysis.detector_names import FORBIDDEN_ACTION
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import Read, acted_run, show_number
from tracegym.analysis.detectors.unserved import first_call, request_text
from tracegym.analysis.features import step_ref
from tracegym.analysis.gap import MinedRule
from tracegym.analysis.runs import Run, Step

MAX_EVIDENCE = 10  # successful trace ids a mined rule names


@dataclass(frozen=True)
class Precondition:
    """A state in which successful runs never call `tool` on a record read by `read_tool`."""

    tool: str
    read_tool: str
    path: str
    forbidden: frozenset[str]  # enum values; empty for a threshold
    above: float | None  # numbers above this are forbidden
    below: float | None  # numbers below this are forbidden
    acted: int  # records successful runs acted on with this field
    abstained: int  # records they read and left alone holding a forbidden value
    evidence_runs: tuple[str, ...] = ()  # successful runs it was mined from (sorted, <= 10)
    acted_values: frozenset[str] = frozenset()  # enum values on the records they acted on
    # a rule of rates (`_Bounds.by_rates`): acted records of successful runs holding a forbidden
    # value (lucky ones), of failed runs (of `failed_acted`), and the one-sided Fisher p-value
    lucky: int = 0
    failed_holding: int = 0
    failed_acted: int = 0
    p_value: float | None = None

    def violated_by(self, read: Read) -> str | None:
        """The forbidden value `read` holds, as text, or None."""
        if self.forbidden:
            held = sorted(read.enums.get(self.path, frozenset()) & self.forbidden)
            return held[0] if held else None
        for number in read.numbers.get(self.path, ()):
            if (self.above is not None and number > self.above) or (
                self.below is not None and number < self.below
            ):
                return show_number(number)
        return None

    def describe(self) -> str:
        if self.forbidden:
            return f"{self.path} in {{{', '.join(sorted(self.forbidden))}}}"
        if self.above is not None:
            return f"{self.path} > {show_number(self.above)}"
        return f"{self.path} < {show_number(self.below or 0.0)}"

    def to_rule(self) -> MinedRule:
        """The rule as the typed contract synthesis reads (`Gap.rules`). Successful runs never
        acted in the forbidden state: it held on every record they acted on."""
        return MinedRule(
            detector=FORBIDDEN_ACTION, kind="precondition", tool=self.tool,
            statement=(f"{self.tool} is never called on a record {self.read_tool} shows with "
                       f"{self.describe()}" if self.p_value is None else
                       f"{self.tool} is seldom called on a record {self.read_tool} shows with "
                       f"{self.describe()} by successful runs ({self.lucky} of {self.acted}), "
                       f"often by failed runs ({self.failed_holding} of {self.failed_acted}; "
                       f"one-sided Fisher p = {self.p_value:.2g})"),
            read_tool=self.read_tool, path=self.path, values=tuple(sorted(self.forbidden)),
            above=self.above, below=self.below, support=self.acted, abstained=self.abstained,
            confidence=round(1.0 - self.lucky / self.acted, 3) if self.acted else 1.0,
            evidence_runs=self.evidence_runs,
        )  # fmt: skip

    def rule_record(self) -> dict[str, Any]:
        """`to_rule().to_dict()`, plus the states successful runs did act in (`allowed`): which
        of the other observed states an environment may show as allowed (a `MinedRule` field
        to come; readers that do not know it ignore it)."""
        return {**self.to_rule().to_dict(), "allowed": sorted(self.acted_values)}


def mine_preconditions(
    runs: Sequence[Run],
    *,
    min_support: int = 3,
    min_abstain: int = 2,
    max_values: int = 12,
    max_chance: float = 0.05,
    min_presence: float = 0.5,
    min_threshold_support: int = 5,
) -> list[Precondition]:
    """The preconditions the successful `runs` keep (see the module docstring)."""
    acted: dict[tuple[str, str], dict[str, Read]] = defaultdict(dict)
    failed: dict[tuple[str, str], dict[str, Read]] = defaultdict(dict)  # acted on in failed runs
    records: dict[str, dict[str, Read]] = defaultdict(dict)
    # which successful runs acted on / read each record (a rule's evidence runs)
    acted_in: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    read_in: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for run in runs:
        if run.success is False:
            for write, linked in acted_run(run).writes:
                for read in linked:
                    failed[write.tool or write.name, read.tool].setdefault(read.observed, read)
        if run.success is not True:
            continue
        paired = acted_run(run, failed_writes=False)
        for write, linked in paired.writes:
            for read in linked:
                acted[write.tool or write.name, read.tool].setdefault(read.observed, read)
                acted_in[write.tool or write.name, read.tool][read.observed].add(run.trace_id)
        for record in paired.records:
            records[record.tool].setdefault(record.observed, record)
            read_in[record.tool][record.observed].add(run.trace_id)
    rules: list[Precondition] = []
    bounds = _Bounds(min_support, min_abstain, max_values, max_chance, min_presence,
                     min_threshold_support)  # fmt: skip
    for (tool, read_tool), by_key in sorted(acted.items()):
        positives = list(by_key.values())
        if len(positives) < min_support:
            continue
        abstained = [r for k, r in records[read_tool].items() if k not in by_key]
        in_failed = list(failed[tool, read_tool].values())
        found = _enum_rules(tool, read_tool, positives, abstained, in_failed, bounds)
        found += _number_rules(tool, read_tool, positives, abstained, in_failed, bounds)
        for rule in found:
            left = {
                t for r in abstained if rule.violated_by(r) for t in read_in[read_tool][r.observed]
            }
            fields = (lambda r: r.enums) if rule.forbidden else (lambda r: r.numbers)
            on = {t for k, r in by_key.items() if rule.path in fields(r)
                  for t in acted_in[tool, read_tool][k]}  # fmt: skip
            rules.append(replace(rule, evidence_runs=evidence(left, on)))
    return rules


def evidence(first: set[str], then: set[str], limit: int = MAX_EVIDENCE) -> tuple[str, ...]:
    """At most `limit` trace ids, sorted: up to half from `first` (runs that abstained in the
    forbidden state), the rest from `then` (runs that acted in another), topped up from either."""
    chosen = set(sorted(first)[: limit // 2])
    chosen |= set(sorted(then - chosen)[: limit - len(chosen)])
    chosen |= set(sorted(first - chosen)[: limit - len(chosen)])
    return tuple(sorted(chosen))


@dataclass(frozen=True)
class _Bounds:
    min_support: int
    min_abstain: int
    max_values: int
    max_chance: float
    min_presence: float
    min_threshold_support: int
    min_failed: int = 3
    max_lucky: float = 0.25  # of the acted records of successful runs, at most this share lucky
    min_gap: float = 0.4  # failed runs' share holding the value exceeds theirs by this much

    def by_rates(self, lucky: int, acted: int, k: int, m: int) -> float | None:
        """The one-sided Fisher p-value that failed runs act on records holding a value (k of
        their m acted records) more often than successful runs do (`lucky` of `acted`), when it
        is at most `max_chance`, k >= `min_failed`, lucky ones are at most `max_lucky` of the
        acted and the failed share exceeds theirs by `min_gap`; None otherwise."""
        if k < self.min_failed or not acted or not m or lucky / acted > self.max_lucky:
            return None
        if k / m - lucky / acted < self.min_gap:
            return None
        from tracegym.analysis.detectors.tool_order import fisher_greater

        p = fisher_greater(k, m, lucky, acted)
        return p if p <= self.max_chance else None

    def together(
        self,
        allowed: set[str],
        forbidden: frozenset[str],
        left: Counter[str],
        acted: list[frozenset[str]],
        in_failed: list[frozenset[str]],
    ) -> frozenset[str]:
        """States forbidden together, each too rare to be alone ("cancel only while booked or
        processing": in transit and shipped are both forbidden): the values successful runs
        left alone (on some record) and never acted in, that failed runs acted in. They are
        forbidden, with those already, when at least `min_failed` of the records failed runs
        acted on hold one of them and a permutation test (`outside_states_p`: the acted records'
        outcomes shuffled, the set chosen again each time) gives p <= `max_chance`."""
        seen = {v for vs in in_failed for v in vs}
        joint = {v for v in seen if v not in allowed and left[v] > 0} - forbidden
        union = joint | forbidden
        if not joint or sum(1 for vs in in_failed if vs & union) < self.min_failed:
            return frozenset()
        p = outside_states_p(acted, in_failed, {v for v, c in left.items() if c > 0})
        return frozenset(joint) if p <= self.max_chance else frozenset()

    def field(self, acted: int, present: int, records: int) -> bool:
        """Whether a path is a state field: on enough acted records and on most records."""
        return acted >= self.min_support and present >= self.min_presence * records

    def unlikely(
        self, holding: int, records: int, acted: int, failed: tuple[int, int] = (0, 0)
    ) -> bool:
        """Whether `acted` records all missing a value that `holding` of `records` hold is
        unlikely to be chance; or that `failed` = (k, m): k of the m records failed runs acted
        on hold it, and k >= `min_failed`, when all k falling among the failed runs' records
        is unlikely (one-sided Fisher: C(m, k) / C(m + acted, k))."""
        if holding < self.min_abstain:
            return False
        share = holding / records if records else 0.0
        if (1 - share) ** acted <= self.max_chance:
            return True
        k, m = failed
        return k >= self.min_failed and comb(m, k) / comb(m + acted, k) <= self.max_chance


PERMUTATIONS = 2000  # shuffles of `outside_states_p` (seeded: the same runs give the same rules)
SHUFFLED_CELLS = 2_000_000  # records x shuffles held at once (16 MB of masks)


def outside_states_p(
    acted: list[frozenset[str]], in_failed: list[frozenset[str]], left_alone: set[str]
) -> float:
    """The permutation p-value of k, the records failed runs acted on that hold a value no
    record successful runs acted on holds and successful runs left alone somewhere (in
    `left_alone`): the acted records' outcomes are shuffled PERMUTATIONS times (seed 0), and the
    set of values is chosen again from each shuffle's successful records, so that a field with
    many values, where any few records miss most of them, gives no rule."""
    # only values left alone can count, and they are few (a state field's, `max_values`): one
    # bit each; whatever else a record holds never makes it count
    values = sorted(left_alone)
    bit = {v: 1 << i for i, v in enumerate(values)}
    masks = np.array([sum(bit.get(v, 0) for v in vs) for vs in acted + in_failed], dtype=np.int64)
    n = len(acted)

    def outside(succ: np.ndarray, failed: np.ndarray) -> np.ndarray:
        held = np.bitwise_or.reduce(succ, axis=-1)
        return ((failed & ~held[..., None]) != 0).sum(axis=-1)

    k = int(outside(masks[:n], masks[n:]))
    rng = np.random.default_rng(0)
    rows = max(1, min(PERMUTATIONS, SHUFFLED_CELLS // len(masks)))  # memory bounded per chunk
    as_extreme = 0
    for start in range(0, PERMUTATIONS, rows):
        chunk = min(rows, PERMUTATIONS - start)
        shuffled = masks[rng.permuted(np.tile(np.arange(len(masks)), (chunk, 1)), axis=1)]
        as_extreme += int((outside(shuffled[:, :n], shuffled[:, n:]) >= k).sum())
    return (1 + as_extreme) / (1 + PERMUTATIONS)


def _enum_rules(
    tool: str,
    read_tool: str,
    positives: list[Read],
    abstained: list[Read],
    failed: list[Read],
    bounds: _Bounds,
) -> list[Precondition]:
    rules = []
    paths = Counter(p for r in positives for p in r.enums)
    for path, n in sorted(paths.items()):
        with_path = [r for r in abstained if path in r.enums]
        if not bounds.field(n, n + len(with_path), len(positives) + len(abstained)):
            continue
        allowed = {v for r in positives for v in r.enums.get(path, ())}
        left = Counter(v for r in with_path for v in r.enums[path])
        if len(allowed | set(left)) > bounds.max_values:
            continue
        records = n + len(with_path)
        in_failed = [r.enums[path] for r in failed if path in r.enums]

        def in_failed_runs(value: str, held: list[frozenset[str]] = in_failed) -> tuple[int, int]:
            return sum(value in vs for vs in held), len(held)

        forbidden = frozenset(
            v
            for v, c in left.items()
            if v not in allowed and bounds.unlikely(c, records, n, in_failed_runs(v))
        )
        acted = [r.enums[path] for r in positives if path in r.enums]
        forbidden |= bounds.together(allowed, forbidden, left, acted, in_failed)
        if forbidden:
            count = sum(1 for r in abstained if r.enums.get(path, frozenset()) & forbidden)
            rules.append(Precondition(tool, read_tool, path, forbidden, None, None, n, count,
                                      acted_values=frozenset(allowed)))  # fmt: skip
        # rules as rates: a state successful runs acted in a few times (lucky ones) and failed
        # runs far more often
        for value in sorted(allowed - forbidden):
            lucky = sum(value in r.enums.get(path, ()) for r in positives)
            k, m = in_failed_runs(value)
            p = bounds.by_rates(lucky, n, k, m)
            if p is None:
                continue
            held = sum(1 for r in abstained if value in r.enums.get(path, frozenset()))
            rules.append(Precondition(
                tool, read_tool, path, frozenset({value}), None, None, n, held,
                acted_values=frozenset(allowed - {value}), lucky=lucky, failed_holding=k,
                failed_acted=m, p_value=p,
            ))  # fmt: skip
    return rules


def _number_rules(
    tool: str,
    read_tool: str,
    positives: list[Read],
    abstained: list[Read],
    failed: list[Read],
    bounds: _Bounds,
) -> list[Precondition]:
    rules = []
    paths = Counter(p for r in positives for p in r.numbers if "[]" not in p)
    for path, n in sorted(paths.items()):
        others = [x for r in abstained for x in r.numbers.get(path, ())]
        if n < bounds.min_threshold_support:
            continue  # a range fitted to a handful of values is their spread, not a rule
        if not bounds.field(n, n + len(others), len(positives) + len(abstained)):
            continue
        values = [x for r in positives for x in r.numbers.get(path, ())]
        lo, hi = min(values), max(values)
        if not others:
            continue
        in_failed = [x for r in failed for x in r.numbers.get(path, ())]
        for above, below, beyond, failed_beyond in (
            (hi, None, [x for x in others if x > hi], [x for x in in_failed if x > hi]),
            (None, lo, [x for x in others if x < lo], [x for x in in_failed if x < lo]),
        ):
            failed_counts = (len(failed_beyond), len(in_failed))
            if bounds.unlikely(len(beyond), n + len(others), n, failed_counts):
                rules.append(
                    Precondition(tool, read_tool, path, frozenset(), above, below, n, len(beyond))
                )
    return rules


class ForbiddenAction(Detector):
    """Writes on records in a state where successful runs never make them (module docstring).

    Parameters: `min_support` (3) records successful runs acted on, `min_abstain` (2) records
    they left alone in the forbidden state, `max_values` (12) distinct values an enum field may
    take, `max_chance` (0.05) the chance bound, `min_presence` (0.5) share of records a field
    is on, `thresholds` (True) whether numeric fields count, `ignore_recovered` (False) whether a
    refused write followed by a write that went through is left out.
    """

    name = FORBIDDEN_ACTION
    description = (
        "Takes an action (cancel, change, refund ...) on a record in a state where successful "
        "runs never take it: the policy's preconditions, learnt from what they read first"
    )

    def __init__(
        self,
        min_support: int = 3,
        min_abstain: int = 2,
        max_values: int = 12,
        max_chance: float = 0.05,
        min_presence: float = 0.5,
        thresholds: bool = True,
        ignore_recovered: bool = False,
    ) -> None:
        self.ignore_recovered = ignore_recovered
        self.min_presence = min_presence
        self.min_support = min_support
        self.min_abstain = min_abstain
        self.max_values = max_values
        self.max_chance = max_chance
        self.thresholds = thresholds
        self.rules_: list[Precondition] = []

    def fit(self, runs: Sequence[Run]) -> ForbiddenAction:
        rules = mine_preconditions(
            runs,
            min_support=self.min_support,
            min_abstain=self.min_abstain,
            max_values=self.max_values,
            max_chance=self.max_chance,
            min_presence=self.min_presence,
        )
        self.rules_ = [r for r in rules if r.forbidden or self.thresholds]
        self.rules_.sort(key=lambda r: (not r.forbidden, -r.acted, r.path))
        return self

    def detect(self, run: Run) -> list[Finding]:
        if not self.rules_:
            return []
        findings: dict[str, Finding] = {}  # one per key: the first such write; later ones
        writes = acted_run(run).writes  # follow in its span_ids
        last_done = max((w.position for w, _ in writes if not w.failed), default=-1)
        for write, linked in writes:
            if self.ignore_recovered and write.failed and last_done > write.position:
                continue  # refused, and the run went on to act otherwise
            finding = self._check(run, write, {r.tool: r for r in linked})
            if finding is None:
                continue
            first = findings.get(finding.key)
            if first is None:
                findings[finding.key] = finding
            elif write.span_id not in first.span_ids:
                findings[finding.key] = replace(first, span_ids=(*first.span_ids, write.span_id))
        return list(findings.values())

    def _check(self, run: Run, write: Step, linked: dict[str, Read]) -> Finding | None:
        tool = write.tool or write.name
        for rule in self.rules_:
            read = linked.get(rule.read_tool)
            if rule.tool != tool or read is None:
                continue
            value = rule.violated_by(read)
            if value is None:
                continue
            message = (
                f"{tool} was called on a record whose {rule.path} is {value} (read by "
                f"{read.tool} at step {read.step.position}); successful runs called {tool} on "
                f"{rule.acted} such records, never with {rule.describe()}, and left "
                f"{rule.abstained} alone"
            )
            if rule.p_value is not None:
                message = (
                    f"{tool} was called on a record whose {rule.path} is {value} (read by "
                    f"{read.tool} at step {read.step.position}); successful runs did so on "
                    f"{rule.lucky} of the {rule.acted} records they called {tool} on, failed "
                    f"runs on {rule.failed_holding} of {rule.failed_acted} (one-sided Fisher "
                    f"p = {rule.p_value:.2g})"
                )
            return Finding(
                detector=self.name, key=f"{self.name}:{tool}", trace_id=run.trace_id,
                **step_ref(write), span_ids=(write.span_id, read.step.span_id), message=message,
                confidence=(0.8 if rule.forbidden else 0.6) - (0.1 if rule.p_value else 0.0),
                details={"tool": tool, "read_tool": read.tool, "path": rule.path, "value": value,
                         "rule": rule.describe(), "acted": rule.acted,
                         "abstained": rule.abstained, "read_position": read.step.position,
                         "write_failed": write.failed, "mined_rule": rule.rule_record(),
                         "p_value": rule.p_value, "lucky": rule.lucky,
                         "request": request_text(run)[:500], "first_call": first_call(run)},
            )  # fmt: skip
        return None
