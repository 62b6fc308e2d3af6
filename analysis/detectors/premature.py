"""Premature or unverified finish: the run ends without the checks successful runs make, or
without the action successful runs of the same request take (it hands off, refuses or leaves a
question unanswered instead).

`fit` learns the *checks*: tools that successful runs call, without the call failing, before
their final action (`features.final_action_step`: the last tool call or assistant message) —
in at least `min_share` of them and at least `min_support` runs. Checks are learned three ways:

- per *kind of request* (`request_kinds.RequestKinds`, learnt from the request text, as gap
  selection's like-with-like contrast): the reads at least `min_share` of the kind's successful
  runs make before their final action, and the writes at least `min_act_share` of them make
  anywhere (the action the request asks for), where the kind has `min_support` successful runs;
- per final action (successful runs that end the same way: with the same tool, or with a
  message) where there are at least `min_support` such runs, and
- over all successful runs otherwise.

A run of a kind with its own checks is judged by them: a transfer that successful runs of
*other* kinds end with is no check for it (the wrong way round: flagging runs that did not
hand off because other requests' successes do).

`detect` flags each check the run did not complete (no call of it that did not fail) before its
final action (a write of its kind: anywhere, and only in a run that never tried it: a failed
attempt is another detector's): key ``premature_finish:<check tool>``. Decisive
step: for a read, the final action (the step where the agent stopped although it had not
checked), with the failed attempts at the check in `span_ids`; for a write of the kind, where the
run turned away (`missed_write.turned_away`: the hand-off, the refusal), and the finding says
what the run did instead (`details["instead"]`: the writes it made, all rare among the kind's
successful runs, e.g. a transfer; "reply" when it made none; "unanswered" when the user spoke
last). Confidence grows with the share of successful runs that make the check. Nothing about any
domain is hard-coded: a check is whatever successful runs always do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tracegym.analysis.detector_names import PREMATURE_FINISH
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.missed_write import turned_away, written
from tracegym.analysis.detectors.state import is_write
from tracegym.analysis.features import action_label, final_action_step, is_tool, step_ref
from tracegym.analysis.request_kinds import RequestKinds
from tracegym.analysis.runs import Run

RARE = 0.25  # a write made by fewer of a kind's successful runs is no action of that kind


def completed_before(run: Run, position: int) -> set[str]:
    """Tools with a call that did not fail before `position`."""
    return {s.tool or s.name for s in run.steps[:position] if is_tool(s) and not s.failed}


def _read_checks(run: Run, position: int) -> set[str]:
    """Completed calls before `position` that are not the agent's writes."""
    return {s.tool or s.name for s in run.steps[:position]
            if is_tool(s) and not s.failed and not is_write(s)}  # fmt: skip


def ending(run: Run, tool: str, kind_writes: dict[str, float]) -> tuple[str, list[str]]:
    """How a run that never made `tool` ended: ("hand-off", the writes it made instead, all rare
    among its kind's successful runs), ("other action", the kind's writes it made instead),
    ("unanswered", []) when the user spoke last, ("reply", []) otherwise."""
    others = sorted(written(run) - {tool})
    if others:
        common = [w for w in others if kind_writes.get(w, 0.0) >= RARE]
        return ("other action", common) if common else ("hand-off", others)
    last = next((s for s in reversed(run.steps) if s.role in ("user", "assistant")
                 or is_tool(s)), None)  # fmt: skip
    return ("unanswered", []) if last is not None and last.role == "user" else ("reply", [])


class PrematureFinish(Detector):
    """Finishing without the checks successful runs make (see the module docstring).

    Parameters: `min_share` (0.9) of successful runs that must make a check, `min_support` (3)
    successful runs behind it, `min_act_share` (0.8) of a kind's successful runs that must make
    a write for it to be the kind's action, `by_kind` (True) whether kinds of request learn
    checks of their own.
    """

    name = PREMATURE_FINISH
    description = (
        "Finishes (answers, hands off or acts for the last time) without the lookups, "
        "verifications or the action that successful runs of the same request make first"
    )

    def __init__(
        self,
        min_share: float = 0.9,
        min_support: int = 3,
        min_act_share: float = 0.8,
        by_kind: bool = True,
    ) -> None:
        self.min_share = min_share
        self.min_support = min_support
        self.min_act_share = min_act_share
        self.by_kind = by_kind
        self.checks_: dict[str | None, dict[str, float]] = {}  # final action (None: all) -> checks
        self.kind_checks_: dict[str, dict[str, float]] = {}  # request kind -> checks
        self.kind_writes_: dict[str, dict[str, float]] = {}  # request kind -> writes' shares
        self.kind_actions_: dict[str, set[str]] = {}  # request kind -> its writes among checks
        self.kinds_ = RequestKinds()

    def _shares(self, sets: Sequence[set[str] | frozenset[str]], share: float) -> dict[str, float]:
        counts = Counter(t for done in sets for t in done)
        return {tool: n / len(sets) for tool, n in counts.items()
                if n >= self.min_support and n / len(sets) >= share}  # fmt: skip

    def fit(self, runs: Sequence[Run]) -> PrematureFinish:
        groups: dict[str | None, list[set[str]]] = {None: []}
        by_kind: dict[str, list[Run]] = {}
        self.kinds_ = RequestKinds().fit(runs) if self.by_kind else RequestKinds()
        for run in runs:
            if run.success is not True:
                continue
            final = final_action_step(run)
            if final is None:
                continue
            label = action_label(final)
            done = completed_before(run, final.position) - {label}
            groups[None].append(done)
            groups.setdefault(label, []).append(done)
            kind = self.kinds_.kind_of(run)
            if kind is not None:
                by_kind.setdefault(kind, []).append(run)
        self.checks_ = {
            label: self._shares(sets, self.min_share)
            for label, sets in groups.items()
            if len(sets) >= self.min_support
        }
        self.kind_checks_, self.kind_writes_, self.kind_actions_ = {}, {}, {}
        for kind, successes in sorted(by_kind.items()):
            if len(successes) < self.min_support:
                continue
            reads = []
            for run in successes:
                final = final_action_step(run)
                label = action_label(final)
                reads.append(_read_checks(run, final.position if final else 0) - {label})
            writes = [written(r) for r in successes]
            counts = Counter(t for w in writes for t in w)
            self.kind_writes_[kind] = {t: n / len(writes) for t, n in counts.items()}
            actions = self._shares(writes, self.min_act_share)
            self.kind_actions_[kind] = set(actions)
            self.kind_checks_[kind] = {**self._shares(reads, self.min_share), **actions}
        return self

    def detect(self, run: Run) -> list[Finding]:
        final = final_action_step(run)
        if final is None or not (self.checks_ or self.kind_checks_):
            return []
        label = action_label(final)
        kind = self.kinds_.kind_of(run)
        if kind is not None and kind in self.kind_checks_:
            return self._by_kind(run, final, label, kind)
        group = label if label in self.checks_ else None
        checks = self.checks_.get(group, {})
        done = completed_before(run, final.position)
        findings = []
        for tool, share in sorted(checks.items(), key=lambda kv: (-kv[1], kv[0])):
            if tool in done or tool == label:
                continue
            ending_with = f"ending with {label}" if group is not None else "finishing"
            message = (
                f"the run finished ({label}) without a successful {tool}; {share:.0%} of "
                f"successful runs {ending_with} call it first"
            )
            learned = "final_action" if group is not None else "all"
            findings.append(self._read_finding(run, final, label, tool, share, message, learned))
        return findings

    def _read_finding(self, run: Run, final, label, tool: str, share: float, message: str,
                      learned: str, **details) -> Finding:  # fmt: skip
        attempts = [s.span_id for s in run.steps[: final.position]
                    if is_tool(s) and (s.tool or s.name) == tool]  # fmt: skip
        return Finding(
            detector=self.name, key=f"{self.name}:{tool}", trace_id=run.trace_id,
            **step_ref(final), span_ids=(final.span_id, *attempts), message=message,
            confidence=round(0.5 + 0.4 * share, 3),
            details={"check": tool, "share": share, "final_action": label,
                     "learned_from": learned, "attempted": len(attempts), **details},
        )  # fmt: skip

    def _by_kind(self, run: Run, final, label, kind: str) -> list[Finding]:
        checks = self.kind_checks_[kind]
        actions = self.kind_actions_.get(kind, set())
        name = self.kinds_.name(kind)
        done = completed_before(run, final.position)
        made = written(run)
        findings = []
        for tool, share in sorted(checks.items(), key=lambda kv: (-kv[1], kv[0])):
            if tool == label or (tool in made if tool in actions else tool in done):
                continue
            if tool not in actions:
                message = (f"the run finished ({label}) without a successful {tool}; {share:.0%} "
                           f"of the successful runs asked {name} call it first")  # fmt: skip
                findings.append(self._read_finding(run, final, label, tool, share, message,
                                                   "request_kind", kind=name))  # fmt: skip
                continue
            if any(is_write(s) and (s.tool or s.name) == tool for s in run.steps):
                continue  # it tried to act: why the attempt failed is another detector's
            how, instead = ending(run, tool, self.kind_writes_.get(kind, {}))
            step, last_read = turned_away(run)
            step = step or final
            spans = (step.span_id,) + ((last_read.span_id,) if last_read is not None else ())
            did = {"hand-off": f"handed off ({', '.join(instead)}) instead",
                   "other action": f"made {', '.join(instead)} instead",
                   "unanswered": "left the user's last message unanswered",
                   "reply": "ended with a reply and no write"}[how]  # fmt: skip
            message = (f"the run never called {tool} and {did}; {share:.0%} of the "
                       f"successful runs asked {name} call {tool}")  # fmt: skip
            findings.append(Finding(
                detector=self.name, key=f"{self.name}:{tool}", trace_id=run.trace_id,
                **step_ref(step), span_ids=spans, message=message,
                confidence=round(0.5 + 0.4 * share, 3),
                details={"check": tool, "share": share, "final_action": label,
                         "learned_from": "request_kind", "kind": name, "action": True,
                         "ending": how, "instead": instead, "attempted": 0},
            ))  # fmt: skip
        return findings
