"""Missed writes: successful runs asked the same thing all made write T; this run never did.

On tau-bench-style runs the commonest wrong write of a failed run is the expected write never
made: the agent read the records, then handed off, apologised, or let the user leave. What
tells that a write was needed is how the agent's own successful runs served the same request.

`fit` groups the runs by their request (`request_kinds.RequestKinds`: the first user message,
boilerplate cut, values masked, TF-IDF and average-linkage clustering at cosine distance
`distance`, 0.7) and learns, per kind, the write tools that at least `min_share` (0.8) of its
successful runs (at least `min_support`, 2) called without an error. `detect` flags a run of
such a kind that never called T without an error: key ``missed_write:<tool>``. The decisive
step is where the run turned away, not its last step (`turned_away`): the first write called
after its last successful read (a hand-off, another write, the needed one failing), else the
agent's first action after that read (the reply that refused or wrapped up), else the final
action; the last read follows in `span_ids`. Kinds are those of the runs `fit` saw: fit on the
runs you then read, as `analyze` does.
Confidence 0.5: a user may change their mind, and the request kind is only the first message.

Each finding carries the rule as `details["mined_rule"]` (`analysis.gap.MinedRule`, kind
``request``: successful runs of this kind call `tool`; `support` the successful runs of the
kind, `confidence` the share that called it, `evidence_runs` some of them) and the run's request
and first call. Nothing about any domain is hard-coded; no label is read (outcomes only, as every
detector's `fit`).

Not among the default detectors (`registry.OPT_IN`): measured on real runs
(`benchmarks/detectors_real.py`, docs/detectors.md) it is precise and finds few runs. Use
`make_detector("missed_write")`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tracegym.analysis.detector_names import MISSED_WRITE
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.state import is_write
from tracegym.analysis.detectors.unserved import first_call, request_text
from tracegym.analysis.features import final_action_step, is_tool, step_ref
from tracegym.analysis.gap import MinedRule
from tracegym.analysis.request_kinds import RequestKinds
from tracegym.analysis.runs import Run, Step

MAX_EVIDENCE = 10


@dataclass(frozen=True)
class KindWrite:
    """Successful runs of request kind `kind` call `tool`."""

    tool: str
    kind: str
    kind_name: str  # the kind and its most telling words
    runs: int  # successful runs of the kind
    share: float  # of them calling the tool without an error
    evidence_runs: tuple[str, ...] = ()

    def to_rule(self) -> MinedRule:
        return MinedRule(
            detector=MISSED_WRITE, kind="request", tool=self.tool,
            statement=f"successful runs asked {self.kind_name} call {self.tool}",
            values=(self.kind_name,), support=self.runs, confidence=round(self.share, 3),
            evidence_runs=self.evidence_runs,
        )  # fmt: skip


def written(run: Run) -> frozenset[str]:
    """The write tools a run called without an error."""
    return frozenset(s.tool or s.name for s in run.steps if is_write(s) and not s.failed)


def turned_away(run: Run) -> tuple[Step | None, Step | None]:
    """(where the run turned away, its last successful read): the first write called after the
    last successful read (a hand-off, another write, or the needed one failing); failing any, the
    agent's first action after that read (the reply that refused or wrapped up); the final action
    when the run read nothing."""
    last_read = None
    for step in run.steps:
        if is_tool(step) and not step.failed and not is_write(step):
            last_read = step
    final = final_action_step(run)
    if last_read is None:
        return final, None
    after = run.steps[last_read.position + 1 :]
    write = next((s for s in after if is_write(s)), None)
    if write is not None:
        return write, last_read
    for step in after:
        if is_tool(step) or step.role == "assistant" or step is final:
            return step, last_read
    return final, last_read


class MissedWrite(Detector):
    """A write every successful run of the same request makes, never made (module docstring).

    Parameters: `distance` (0.7) under which requests are one kind, `min_support` (2)
    successful runs of the kind, `min_share` (0.8) of them calling the write.
    """

    name = MISSED_WRITE
    description = (
        "Never makes the write that successful runs of the same request make (an exchange, a "
        "refund, a change of address): reads, then hands off, refuses or lets the user go"
    )
    opt_in = True  # not among default_detectors(): see the module docstring

    def __init__(self, distance: float = 0.7, min_support: int = 2, min_share: float = 0.8):
        self.distance = distance
        self.min_support = min_support
        self.min_share = min_share
        self.kinds_ = RequestKinds(distance=distance)
        self.rules_: list[KindWrite] = []
        self._by_kind: dict[str, list[KindWrite]] = {}

    def fit(self, runs: Sequence[Run]) -> MissedWrite:
        self.kinds_ = RequestKinds(distance=self.distance).fit(runs)
        members: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            kind = self.kinds_.kind_of(run)
            if run.success is True and kind is not None:
                members[kind].append(run)
        self.rules_ = []
        for kind, successes in sorted(members.items()):
            if len(successes) < self.min_support:
                continue
            counts = Counter(t for r in successes for t in written(r))
            for tool, n in sorted(counts.items()):
                if n / len(successes) >= self.min_share:
                    evidence = sorted(r.trace_id for r in successes if tool in written(r))
                    self.rules_.append(KindWrite(tool, kind, self.kinds_.name(kind),
                                                 len(successes), n / len(successes),
                                                 tuple(evidence[:MAX_EVIDENCE])))  # fmt: skip
        self._by_kind = defaultdict(list)
        for rule in self.rules_:
            self._by_kind[rule.kind].append(rule)
        return self

    def detect(self, run: Run) -> list[Finding]:
        rules = self._by_kind.get(self.kinds_.kind_of(run) or "", [])
        if not rules:
            return []
        done = written(run)
        missing = [r for r in rules if r.tool not in done]
        if not missing:
            return []
        step, last_read = turned_away(run)
        if step is None:
            return []
        spans = (step.span_id,) + ((last_read.span_id,) if last_read is not None else ())
        attempts = {r.tool: [s.span_id for s in run.steps if is_write(s)
                             and (s.tool or s.name) == r.tool] for r in missing}  # fmt: skip
        after = f"after {', '.join(sorted(done))}" if done else "with no write"
        findings = []
        for rule in missing:
            tried = attempts[rule.tool]
            message = (
                f"{rule.share:.0%} of the {rule.runs} successful runs asked {rule.kind_name} call "
                f"{rule.tool}; this run never did{' successfully' if tried else ''} and turned "
                f"away at step {step.position} ({after})"
            )
            findings.append(Finding(
                detector=self.name, key=f"{self.name}:{rule.tool}", trace_id=run.trace_id,
                **step_ref(step), span_ids=spans + tuple(tried), message=message,
                confidence=0.5,
                details={"tool": rule.tool, "kind": rule.kind_name, "runs": rule.runs,
                         "share": round(rule.share, 3), "attempted": len(tried),
                         "other_writes": sorted(done), "mined_rule": rule.to_rule().to_dict(),
                         "request": request_text(run)[:500], "first_call": first_call(run)},
            ))  # fmt: skip
        return findings
