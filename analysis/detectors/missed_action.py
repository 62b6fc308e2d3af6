"""Missed actions: a record read in a state where successful runs always act on it, left alone.

The converse of `forbidden_action`. `fit` looks, in the successful runs, at every record read
(`state.acted_run`: a read-tool result, and the writes that acted on it) and, per read tool R,
enum field path and value v (e.g. "status" = "suspended") and write tool T, at how often T
acted on records of R holding v:

- at least `min_support` distinct records hold v (the same record in the same state read in
  several runs is one record), and the field takes at most `max_values` (12) values (more are
  identifiers or prose, not states);
- T acted on the record in at least `min_confidence` (0.9) of the (run, record) readings of
  records holding v, and
- in at most half that share of the readings of R-records whose field has another value (the
  action follows from the state, not from reading R at all).

`detect` flags each record of a run read in such a state that no call of T acted on: key
``missed_action:T``; decisive step: the (latest) read that showed the state, where the run
should have gone on to act; the run's last step follows in `span_ids`. Confidence 0.6: a user
may have changed their mind. Each finding carries the rule it breaks as `details["mined_rule"]`
(`analysis.gap.MinedRule`, kind ``trigger``, with the successful runs it was mined from), and the
run's request and first call (`request`, `first_call`): what synthesis may enforce, and how users
ask. Nothing about any domain is hard-coded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tracegym.analysis.detector_names import MISSED_ACTION
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.precondition import evidence
from tracegym.analysis.detectors.state import acted_run
from tracegym.analysis.detectors.unserved import first_call, request_text
from tracegym.analysis.features import step_ref
from tracegym.analysis.gap import MinedRule
from tracegym.analysis.runs import Run


@dataclass(frozen=True)
class Obligation:
    """Successful runs call `tool` on records of `read_tool` whose `path` holds `value`."""

    tool: str
    read_tool: str
    path: str
    value: str
    records: int  # distinct records holding the value
    share: float  # of readings of such records followed by the action
    other_share: float  # of readings of records with another value
    evidence_runs: tuple[str, ...] = ()  # successful runs it was mined from (sorted, <= 10)

    def to_rule(self) -> MinedRule:
        """The rule as the typed contract synthesis reads (`Gap.rules`): `confidence` is the
        share of readings in the state that successful runs followed with the action."""
        return MinedRule(
            detector=MISSED_ACTION, kind="trigger", tool=self.tool,
            statement=f"after {self.read_tool} shows {self.path} = {self.value}, {self.tool} is "
            "called on that record",
            read_tool=self.read_tool, path=self.path, values=(self.value,),
            support=self.records, confidence=round(self.share, 3),
            evidence_runs=self.evidence_runs,
        )  # fmt: skip


def mine_obligations(
    runs: Sequence[Run],
    *,
    min_support: int = 3,
    min_confidence: float = 0.9,
    max_values: int = 12,
) -> list[Obligation]:
    """The obligations successful `runs` keep (see the module docstring)."""
    # (read tool, path, value) -> readings, readings acted on by each tool, distinct records
    readings: dict[tuple[str, str, str], int] = defaultdict(int)
    acted: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    distinct: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    paths: dict[tuple[str, str], set[str]] = defaultdict(set)
    writes_on: dict[str, set[str]] = defaultdict(set)  # read tool -> write tools acting on it
    # (read tool, path, value) -> write tool -> successful runs that read the state and acted
    acted_in: dict[tuple[str, str, str], dict[str, set[str]]] = defaultdict(
        lambda: defaultdict(set)
    )
    for run in runs:
        if run.success is not True:
            continue
        paired = acted_run(run, failed_writes=False)
        for record in paired.records:
            tools = paired.acted.get(record.key, frozenset())
            writes_on[record.tool] |= tools
            for path, values in record.enums.items():
                if "[]" in path:
                    continue  # a state of the record itself, not of items inside it
                for value in values:
                    key = (record.tool, path, value)
                    readings[key] += 1
                    distinct[key].add(record.observed)
                    paths[record.tool, path].add(value)
                    for tool in tools:
                        acted[key][tool] += 1
                        acted_in[key][tool].add(run.trace_id)
    rules = []
    for (read_tool, path, value), n in sorted(readings.items()):
        if len(distinct[read_tool, path, value]) < min_support:
            continue
        if len(paths[read_tool, path]) > max_values:
            continue  # an identifier or prose, not a state
        for tool in sorted(writes_on[read_tool]):
            share = acted[read_tool, path, value].get(tool, 0) / n
            if share < min_confidence:
                continue
            others = [v for v in paths[read_tool, path] if v != value]
            other_n = sum(readings[read_tool, path, v] for v in others)
            other_acted = sum(acted[read_tool, path, v].get(tool, 0) for v in others)
            other_share = other_acted / other_n if other_n else 0.0
            if other_n and other_share <= share / 2:
                runs_in = acted_in[read_tool, path, value][tool]
                rules.append(Obligation(tool, read_tool, path, value,
                                        len(distinct[read_tool, path, value]), share,
                                        other_share, evidence(runs_in, set())))  # fmt: skip
    return rules


class MissedAction(Detector):
    """Records left alone in a state where successful runs act (see the module docstring).

    Parameters: `min_support` (3) distinct records in the state, `min_confidence` (0.9) share
    of their readings followed by the action.
    """

    name = MISSED_ACTION
    description = (
        "Leaves a record alone in a state where successful runs always act on it (resume, "
        "refund, enable ...): the needed action never taken"
    )

    def __init__(self, min_support: int = 3, min_confidence: float = 0.9) -> None:
        self.min_support = min_support
        self.min_confidence = min_confidence
        self.rules_: list[Obligation] = []

    def fit(self, runs: Sequence[Run]) -> MissedAction:
        self.rules_ = mine_obligations(
            runs, min_support=self.min_support, min_confidence=self.min_confidence
        )
        self.rules_.sort(key=lambda r: (-r.records, r.tool, r.path))
        return self

    def detect(self, run: Run) -> list[Finding]:
        if not self.rules_:
            return []
        paired = acted_run(run)
        called = {w.tool or w.name for w, _ in paired.writes}
        last = run.steps[-1] if run.steps else None
        findings: list[Finding] = []
        flagged: set[str] = set()
        for record in paired.records:
            done = paired.acted.get(record.key, frozenset())
            for rule in self.rules_:
                if (
                    rule.read_tool != record.tool
                    or rule.tool in done
                    or rule.tool in flagged
                    or rule.value not in record.enums.get(rule.path, frozenset())
                ):
                    continue
                flagged.add(rule.tool)
                spans = [record.step.span_id]
                if last is not None and last is not record.step:
                    spans.append(last.span_id)
                message = (
                    f"{record.tool} at step {record.step.position} showed {rule.path} = "
                    f"{rule.value}, and {rule.tool} was never called on that record; "
                    f"successful runs call {rule.tool} after {rule.share:.0%} of such reads "
                    f"({rule.records} records), after {rule.other_share:.0%} of the others"
                )
                findings.append(Finding(
                    detector=self.name, key=f"{self.name}:{rule.tool}", trace_id=run.trace_id,
                    **step_ref(record.step), span_ids=tuple(spans), message=message,
                    confidence=0.6,
                    details={"tool": rule.tool, "read_tool": record.tool, "path": rule.path,
                             "value": rule.value, "records": rule.records,
                             "share": round(rule.share, 3),
                             "other_share": round(rule.other_share, 3),
                             "called_elsewhere": rule.tool in called,
                             "mined_rule": rule.to_rule().to_dict(),
                             "request": request_text(run)[:500], "first_call": first_call(run)},
                ))  # fmt: skip
        return findings
