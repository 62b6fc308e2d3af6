"""Premature or unverified finish: the run ends without the checks successful runs make.

`fit` learns the *checks*: tools that successful runs call, without the call failing, before
their final action (`features.final_action_step`: the last tool call or assistant message) —
in at least `min_share` of them and at least `min_support` runs. Checks are learned per final
action (successful runs that end the same way: with the same tool, or with a message) where
there are at least `min_support` such runs, and over all successful runs otherwise.

`detect` flags each check the run did not complete (no call of it that did not fail) before its
final action: key ``premature_finish:<check tool>``, decisive step: the final action (the step
where the agent stopped although it had not checked), with the failed attempts at the check, if
any, in `span_ids`. Confidence grows with the share of successful runs that make the check.
Nothing about any domain is hard-coded: a check is whatever successful runs always do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tracegym.analysis.detector_names import PREMATURE_FINISH
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.features import action_label, final_action_step, is_tool, step_ref
from tracegym.analysis.runs import Run


def completed_before(run: Run, position: int) -> set[str]:
    """Tools with a call that did not fail before `position`."""
    return {s.tool or s.name for s in run.steps[:position] if is_tool(s) and not s.failed}


class PrematureFinish(Detector):
    """Finishing without the checks successful runs make (see the module docstring).

    Parameters: `min_share` (0.9) of successful runs that must make a check, `min_support` (3)
    successful runs behind it.
    """

    name = PREMATURE_FINISH
    description = (
        "Finishes (answers or acts for the last time) without the lookups or verifications "
        "that successful runs make before finishing"
    )

    def __init__(self, min_share: float = 0.9, min_support: int = 3) -> None:
        self.min_share = min_share
        self.min_support = min_support
        self.checks_: dict[str | None, dict[str, float]] = {}  # final action (None: all) -> checks

    def fit(self, runs: Sequence[Run]) -> PrematureFinish:
        groups: dict[str | None, list[set[str]]] = {None: []}
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
        self.checks_ = {}
        for label, done_sets in groups.items():
            if len(done_sets) < self.min_support:
                continue
            counts = Counter(t for done in done_sets for t in done)
            self.checks_[label] = {
                tool: n / len(done_sets)
                for tool, n in counts.items()
                if n >= self.min_support and n / len(done_sets) >= self.min_share
            }
        return self

    def detect(self, run: Run) -> list[Finding]:
        final = final_action_step(run)
        if final is None or not self.checks_:
            return []
        label = action_label(final)
        group = label if label in self.checks_ else None
        checks = self.checks_.get(group, {})
        done = completed_before(run, final.position)
        findings = []
        for tool, share in sorted(checks.items(), key=lambda kv: (-kv[1], kv[0])):
            if tool in done or tool == label:
                continue
            attempts = [s.span_id for s in run.steps[: final.position]
                        if is_tool(s) and (s.tool or s.name) == tool]  # fmt: skip
            ending = f"ending with {label}" if group is not None else "finishing"
            message = (
                f"the run finished ({label}) without a successful {tool}; {share:.0%} of "
                f"successful runs {ending} call it first"
            )
            findings.append(Finding(
                detector=self.name, key=f"{self.name}:{tool}", trace_id=run.trace_id,
                **step_ref(final), span_ids=(final.span_id, *attempts), message=message,
                confidence=round(0.5 + 0.4 * share, 3),
                details={"check": tool, "share": share, "final_action": label,
                         "learned_from": "final_action" if group is not None else "all",
                         "attempted": len(attempts)},
            ))  # fmt: skip
        return findings
