"""CLI output counts in the singular for one: "1 failed run has", "2 failed runs have"."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("duckdb")

from rich.console import Console
from tracegym.analysis.commands import NearMiss, NothingKept, failed_runs, render_nothing_kept


def _printed(empty: NothingKept) -> str:
    out = io.StringIO()
    render_nothing_kept(Console(file=out, width=200, color_system=None), empty)
    return out.getvalue()


def test_failed_runs_agree_with_their_number():
    assert [failed_runs(n) for n in (0, 1, 2)] == [
        "0 failed runs", "1 failed run", "2 failed runs"
    ]  # fmt: skip
    one = NearMiss("invalid_invocation:get", 1, 1.0, 0.5, 2, ("stable in 2/10 < 7",), "")
    text = _printed(NothingKept(1, 3, 0, 1, (one,), ()))
    assert "1 of 1 failed run has no finding from any detector." in text
    assert "invalid_invocation:get: 1 failed run, coverage" in text
    assert "failed runs" not in text
    two = _printed(NothingKept(2, 3, 0, 2, (), ()))
    assert "2 of 2 failed runs have no finding" in two


def test_the_gaps_headline_and_the_judge_plan_count_in_the_singular():
    from tracegym.analysis.commands import render_gaps
    from tracegym.analysis.gap import GapsDocument, RunCounts
    from tracegym.analysis.judge import JudgePlan

    out = io.StringIO()
    render_gaps(Console(file=out, width=200, color_system=None),
                GapsDocument(runs=RunCounts(total=1, failed=1)))  # fmt: skip
    assert "0 capability gaps from 1 run (1 failed" in out.getvalue()
    plan = JudgePlan(failed_shown=1, runs=1, labellers=1, prompt_tokens=10, reply_tokens=5)
    assert "1 to propose from 1 failed run," in plan.describe()
