"""Gap selection keeps a rule of rates on its two-rate test: lucky successes that break the
rule shrink its delta under min_delta, not its evidence (`gap_selection.rules_as_rates`)."""

from __future__ import annotations

import json

import pytest
from tracegym.analysis.detectors.base import Finding
from tracegym.analysis.gap_selection import (
    NEAR_ZERO,
    Candidate,
    Thresholds,
    describe,
    like_with_like,
    rule_of_rates,
    score,
)
from tracegym.analysis.runs import ROLE, Run

from tests.fixtures.analysis_steps import make_step

KEY = "wrong_tool_order:get_order>cancel_order"


def _run(trace: str, success: bool) -> Run:
    asked = make_step(trace, 0, operation="chat", input="Please cancel my order, thanks.",
                  output=None, attributes={ROLE: "user"})  # fmt: skip
    steps = [asked, make_step(trace, 1, tool="cancel_order", input=json.dumps({"order_id": trace}))]
    return Run(trace, trace, "a", success, None, {}, None, steps)


def _population(failed: int, succeeded: int) -> tuple[list[Run], list[str], list[str]]:
    runs = [_run(f"f{i:02d}", False) for i in range(failed)]
    runs += [_run(f"s{i:02d}", True) for i in range(succeeded)]
    return runs, [r.trace_id for r in runs[:failed]], [r.trace_id for r in runs[failed:]]


def _candidate(lacking: list[str], p_value: float | None) -> Candidate:
    """The rule's findings: the detector's own Fisher p in each (None: an exact rule)."""
    findings = [Finding("wrong_tool_order", KEY, t, 1, 1, "a", (f"{t}-1",), "no look-up",
                        details={"p_value": p_value}) for t in lacking]  # fmt: skip
    return Candidate(KEY, "finding", "wrong_tool_order", set(lacking), findings)


def _scored(broken_failed: int, broken_succeeded: int, p_value: float | None,
            failed: int = 33, succeeded: int = 69):  # fmt: skip
    runs, f, s = _population(failed, succeeded)
    lacking = f[:broken_failed] + s[:broken_succeeded]
    t = Thresholds()
    scored = [score(_candidate(lacking, p_value), f, s, t)]
    like_with_like(scored, runs, t)
    return scored[0], runs


def test_a_rule_lucky_successes_break_is_kept_on_its_fisher_test():
    # the planted lucky_rule's tuning seed 200: 8/33 failed and 5/69 successful runs break it
    s, runs = _scored(8, 5, p_value=0.02)
    assert NEAR_ZERO < s.delta < Thresholds().min_delta
    assert s.kept and s.by_rates is not None
    assert s.by_rates["p_value"] <= 0.05 and s.by_rates["failed"] == 8
    assert "rule of rates" in s.why and "Fisher" in s.why
    gap = describe(s, "g", {r.trace_id: r for r in runs}, [r for r in runs if r.success], {})
    assert "Kept as a rule of rates: 8/33 failed and 5/69 successful runs break it" in (
        gap.description
    )


def test_the_same_runs_without_a_rule_of_rates_are_not_kept():
    # an exact rule (no p-value in its findings) or any other candidate: min_delta stands
    s, _ = _scored(8, 5, p_value=None)
    assert not s.kept and s.by_rates is None and "delta 0.17 < 0.2" in s.why
    assert not rule_of_rates(_candidate(["f00"], None))
    assert not rule_of_rates(_candidate([], 0.01))  # no finding, no rule


@pytest.mark.parametrize(
    ("broken_failed", "broken_succeeded", "failed", "succeeded", "tested"),
    [
        (8, 12, 33, 69, True),  # successful runs break it nearly as often: delta 0.07, p 0.28
        (5, 0, 40, 10, True),  # a delta of 0.125 on 10 successful runs: p 0.31
        (3, 0, 33, 69, False),  # too few failed runs break it (coverage 0.09): never tested
    ],
)
def test_weak_rates_are_not_kept(broken_failed, broken_succeeded, failed, succeeded, tested):
    s, _ = _scored(broken_failed, broken_succeeded, 0.01, failed, succeeded)
    assert not s.kept and s.by_rates is None
    assert ("as a rule of rates: one-sided Fisher p" in s.why) == tested


def test_a_delta_at_or_under_near_zero_is_never_rescued():
    s, _ = _scored(3, 6, 0.001, failed=30, succeeded=60)  # 0.10 - 0.10: no contrast
    assert s.delta is not None and s.delta <= NEAR_ZERO and not s.kept


def test_a_rule_whose_delta_passes_but_is_unstable_is_judged_by_its_rates():
    # delta 0.21 >= min_delta, but resamples often fall under it: the stability at min_delta
    # failed; judged by its rates (Fisher p, a delta over NEAR_ZERO in the resamples) it holds
    s, _ = _scored(13, 5, p_value=0.01, failed=40, succeeded=45)
    assert s.delta is not None and s.delta >= Thresholds().min_delta
    assert s.kept and s.by_rates is not None
    assert "not stable at 0.2" in s.why and "rule of rates" in s.why
    exact, _ = _scored(13, 5, p_value=None, failed=40, succeeded=45)
    assert not exact.kept and "stable in" in exact.why  # an exact rule: min_delta's stability


def test_the_floor_within_kinds_is_near_zero_for_any_rule_of_rates():
    t = Thresholds()
    _, f, s = _population(10, 10)
    rule = score(_candidate(f[:7] + s[:2], 0.01), f, s, t)
    exact = score(_candidate(f[:7] + s[:2], None), f, s, t)
    assert rule.by_rates is None and rule.delta_floor(t) == NEAR_ZERO
    assert exact.delta_floor(t) == t.min_delta
