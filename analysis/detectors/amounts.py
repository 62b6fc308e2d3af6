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

`fit` also mines, per write tool and amount argument, the *relation* successful calls keep with
the record they act on (`state.acted_on`; failing any, the reads before the call):
`arithmetic.Relation`, e.g. "= get_order.total - get_order.service_fee", "= the sum of
get_order.items[].price". Among the relations holding in at least `min_support` (5) successful
calls and `min_confidence` (0.8) of them, the most held wins (then the simplest form). A finding
whose call breaks its argument's relation carries it as ``details["mined_rule"]``
(`MinedRule(kind="amount")`: `relation` the form, `read_tool`, `path` the first field, `values`
every field and, for a share, the divisor last; `AmountRule.relation_of` reads it back), with the
run's request and first call (`request`, `first_call`: the users' words, for synthesis). The
relation adds no finding and removes none.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.analysis.arithmetic import (
    Relation,
    amount_of,
    decimals_of,
    derived,
    numbers_in,
    relations_holding,
)
from tracegym.analysis.detector_names import WRONG_AMOUNT
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import Read, acted_on, flatten, is_write, reads
from tracegym.analysis.detectors.ungrounded import Evidence
from tracegym.analysis.detectors.unserved import first_call, request_text
from tracegym.analysis.features import step_ref
from tracegym.analysis.gap import MinedRule
from tracegym.analysis.runs import Run, Step, parse_json

EVIDENCE_RUNS = 10  # successful trace ids a mined rule keeps as its evidence


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
        value = amount_of(raw)  # a digit string is an id, not an amount
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


@dataclass(frozen=True)
class AmountRule:
    """The relation successful calls of `tool` keep between `argument` and a `read_tool`
    record: held in `support` of `calls` successful calls."""

    tool: str
    argument: str
    read_tool: str
    relation: Relation
    support: int
    calls: int
    evidence_runs: tuple[str, ...] = ()

    @property
    def confidence(self) -> float:
        return self.support / self.calls if self.calls else 0.0

    def statement(self) -> str:
        return (
            f"{self.tool}({self.argument}) = {self.relation.text(self.read_tool)} of the record "
            f"the call acts on, in {self.support} of {self.calls} successful calls"
        )

    def holds(self, value: float, records: Sequence[Read], decimals: int, named: list[str]) -> bool:
        return any(
            r.tool == self.read_tool
            and abs((self.relation.value(r.parsed, named) or float("inf")) - value)
            <= 0.5 * 10**-decimals + 1e-9
            for r in records
        )

    def to_mined(self) -> MinedRule:
        divisor = (str(self.relation.divisor),) if self.relation.divisor else ()
        return MinedRule(
            detector=WRONG_AMOUNT, kind="amount", tool=self.tool, statement=self.statement(),
            read_tool=self.read_tool, path=self.relation.paths[0],
            values=(*self.relation.paths, *divisor), argument=self.argument,
            relation=self.relation.form, support=self.support,
            confidence=round(self.confidence, 4), evidence_runs=self.evidence_runs,
        )  # fmt: skip

    @staticmethod
    def relation_of(rule: MinedRule) -> Relation:
        """The `Relation` a mined amount rule states (ValueError when it states none)."""
        if rule.kind != "amount" or not rule.relation or not rule.values:
            raise ValueError("not an amount rule with a relation")
        paths, divisor = rule.values, None
        if rule.relation == "share":
            paths, divisor = rule.values[:-1], int(rule.values[-1])
        return Relation(rule.relation, tuple(paths), divisor)


def _call_records(step: Step, run_reads: list[Read]) -> list[Read]:
    """The records a write acts on; failing any, every read before it."""
    return acted_on(step, run_reads) or [r for r in run_reads if r.step.position < step.position]


def _named(step: Step) -> list[str]:
    """The texts a call's arguments name (ids of the items it is about)."""
    return [str(v) for _, v in flatten(parse_json(step.input)) if isinstance(v, str)]


def mine_amount_rules(
    runs: Sequence[Run], *, min_number: float = 10, min_support: int = 5,
    min_confidence: float = 0.8,
) -> dict[tuple[str, str], AmountRule]:  # fmt: skip
    """Per (write tool, amount argument), the relation successful calls keep (module doc)."""
    calls: Counter[tuple[str, str]] = Counter()
    held: dict[tuple[str, str], Counter[tuple[str, Relation]]] = defaultdict(Counter)
    where: dict[tuple[tuple[str, str], tuple[str, Relation]], set[str]] = defaultdict(set)
    for run in runs:
        if run.success is not True:
            continue
        run_reads: list[Read] | None = None
        for step in run.steps:
            if not is_write(step) or step.failed:
                continue
            found = amounts(step, min_number)
            if not found:
                continue
            run_reads = reads(run) if run_reads is None else run_reads
            records = _call_records(step, run_reads)
            named = _named(step)
            for amount in found:
                key = (step.tool or step.name, amount.arg)
                calls[key] += 1
                holding = {
                    (r.tool, rel)
                    for r in records
                    for rel in relations_holding(amount.value, r.parsed,
                                                 decimals=amount.decimals, named=named)
                }  # fmt: skip
                held[key].update(holding)
                for item in holding:
                    where[key, item].add(run.trace_id)
    rules = {}
    for key, counter in sorted(held.items()):
        best = [(n, item) for item, n in counter.items()
                if n >= min_support and n >= min_confidence * calls[key]]  # fmt: skip
        if not best:
            continue
        n, (read_tool, relation) = min(
            best, key=lambda b: (-b[0], b[1][1].complexity, b[1][1].paths, b[1][0])
        )
        evidence = tuple(sorted(where[key, (read_tool, relation)])[:EVIDENCE_RUNS])
        rules[key] = AmountRule(key[0], key[1], read_tool, relation, n, calls[key], evidence)
    return rules


class WrongAmount(Detector):
    """Amounts in writes that the run's numbers do not give (see the module docstring).

    Parameters: `min_number` (10) whole numbers below it are not checked, `vocabulary_runs` (3)
    successful runs that make an underived value part of an argument's vocabulary,
    `min_support` (5) and `min_confidence` (0.8) of a mined relation.
    """

    name = WRONG_AMOUNT
    description = (
        "Passes an amount (a payment, refund, split or quantity) to an action that no number "
        "the run saw gives, even by simple arithmetic"
    )

    def __init__(
        self,
        min_number: float = 10,
        vocabulary_runs: int = 3,
        min_support: int = 5,
        min_confidence: float = 0.8,
    ) -> None:
        self.min_number = min_number
        self.vocabulary_runs = vocabulary_runs
        self.min_support = min_support
        self.min_confidence = min_confidence
        self.vocabulary_: set[tuple[str, str, float]] = set()
        self.rules_: dict[tuple[str, str], AmountRule] = {}

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
        self.rules_ = mine_amount_rules(
            runs, min_number=self.min_number, min_support=self.min_support,
            min_confidence=self.min_confidence,
        )  # fmt: skip
        return self

    def _broken_rule(self, run: Run, step: Step, amount: Amount, cache: dict[str, Any]) -> Any:
        """The mined rule of the call's argument, as a dict, when the call breaks it."""
        rule = self.rules_.get((step.tool or step.name, amount.arg))
        if rule is None:
            return None
        if "reads" not in cache:
            cache["reads"] = reads(run)
        records = _call_records(step, cache["reads"])
        if rule.holds(amount.value, records, amount.decimals, _named(step)):
            return None
        return rule.to_mined().to_dict()

    def detect(self, run: Run) -> list[Finding]:
        findings: dict[str, Finding] = {}
        evidence = Evidence(run)
        cache: dict[str, Any] = {}
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
            details: dict[str, Any] = {"tool": tool, "argument": amount.arg, "value": amount.value,
                       "nearest_position": near.position if near is not None else None}  # fmt: skip
            broken = self._broken_rule(run, step, amount, cache)
            if broken is not None:
                details.update(mined_rule=broken, request=request_text(run)[:500],
                               first_call=first_call(run))  # fmt: skip
            findings[key] = Finding(
                detector=self.name, key=key, trace_id=run.trace_id, **step_ref(step),
                span_ids=tuple(spans),
                message=(
                    f"{tool}({amount.arg}={amount.raw!r}) passes an amount that no number the "
                    "run saw before (tool results, messages, the run input) gives, as such or "
                    "by a sum, difference, product, split or count"
                ),
                confidence=0.7,
                details=details,
            )  # fmt: skip
        return list(findings.values())
