"""The planted-causes generator's extended catalogue (wrong_field, wrong_record, hands_off,
lucky_rule): seeds the older benchmarks score draw what they drew, extended seeds plant the new
kinds as their docstring says, and wrong_source finds the two argument kinds."""

from __future__ import annotations

import pytest
from tracegym.analysis.detectors.provenance import WrongSource
from tracegym.analysis.detectors.state import is_write
from tracegym.analysis.runs import Run, load_runs, parse_json
from tracegym.store import Store
from tracegym.tests.fixtures import planted as pl


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory):
    out = {}
    for seed in (202, 205):  # wrong_field + wrong_record; hands_off + lucky_rule
        home = tmp_path_factory.mktemp(f"planted{seed}")
        planted = pl.generate(home, seed)
        with Store(home) as store:
            out[seed] = (planted, {r.trace_id: r for r in load_runs(store)})
    return out


def test_older_seeds_draw_what_they_drew() -> None:
    assert pl.plan(0)[1] == ["early_wrong_assumption", "ungrounded_id"]
    assert pl.plan(100)[1] == ["never_called", "side_task_budget", "wrong_order"]
    assert pl.plan(119)[1] == ["policy_forbidden", "wrong_order"]
    for seed in (*range(10), *range(100, 120)):
        domain, causes, tasks, _ = pl.plan(seed)
        assert not domain.extended and set(causes) <= set(pl.CAUSES)
        assert all(t.kind != pl.ITEM_REFUND and not t.skip_read for t in tasks)
    assert pl.is_extended(200) and not pl.is_extended(5) and pl.is_extended(5, True)


def test_extended_seeds_draw_new_kinds_among_old_ones() -> None:
    drawn = [pl.plan(seed)[1] for seed in range(200, 220)]
    assert all(2 <= len(c) <= 3 and set(c) & set(pl.NEW_CAUSES) for c in drawn)
    assert set(pl.NEW_CAUSES) <= {k for c in drawn for k in c}
    assert all(set(c) & set(pl.CAUSES) for c in drawn)


def _call(run: Run, tool: str) -> dict:
    step = next(s for s in run.steps if is_write(s) and s.tool == tool and not s.failed)
    return parse_json(step.input)


def test_argument_kinds_take_the_wrong_field_and_the_wrong_record(sets) -> None:
    planted, runs = sets[202]
    d = planted.domain
    by_cause = planted.causes
    for trace in by_cause[pl.WRONG_FIELD]:
        run = runs[trace]
        args = _call(run, d.refund_tool)
        read = next(
            parse_json(s.output) for s in run.steps if s.tool == d.read_tool and not s.failed
        )
        assert args["amount"] == read[d.amount_field]  # the total, not the item's price
        assert args["amount"] not in [i[d.price_field] for i in read[d.items_field]]
    for trace in by_cause[pl.WRONG_RECORD]:
        run = runs[trace]
        args = _call(run, d.refund_tool)
        found = next(
            parse_json(s.output) for s in run.steps if s.tool == d.lookup_tool and not s.failed
        )
        methods = found[d.methods_field]
        said = next(s.input for s in run.steps if s.parent_span_id is None)
        assert args[d.method_arg] == methods[0][d.method_id_field]
        assert methods[0][d.method_kind_field] not in said.split("refund it to my ")[1]
    # every planted run names its decisive chat span and the call that carried it out
    for r in planted.runs:
        if r.cause in (pl.WRONG_FIELD, pl.WRONG_RECORD):
            assert r.decisive_span_id and r.acted_span_id and not r.success


def test_hands_off_and_lucky_rule(sets) -> None:
    planted, _ = sets[205]
    d = planted.domain
    item_refunds = [r for r in planted.runs if r.kind == pl.ITEM_REFUND]
    for r in item_refunds:
        if r.cause == pl.HANDS_OFF:
            assert d.refund_tool not in r.tools and not r.success
            assert (d.transfer_tool in r.tools) == (d.hands_off_style == "transfer")
        elif r.cause is None:
            assert d.refund_tool in r.tools and d.transfer_tool not in r.tools
    others = [r for r in planted.runs if r.kind != pl.ITEM_REFUND and r.success]
    assert sum(d.transfer_tool in r.tools for r in others) >= 5  # transfers are common there
    cancels = [r for r in planted.runs if r.kind == pl.CANCEL]
    broke = [r for r in cancels if d.cancel_tool in r.tools and d.read_tool not in r.tools]
    lucky = [r for r in broke if r.success]
    assert {r.trace_id for r in broke if not r.success} == planted.causes[pl.LUCKY_RULE]
    assert lucky and len(lucky) < len([r for r in cancels if r.success])  # some, not all


def test_wrong_source_finds_both_argument_kinds(sets) -> None:
    planted, runs = sets[202]
    detector = WrongSource().fit(list(runs.values()))
    flagged: dict[str, set[str]] = {}
    for run in runs.values():
        for f in detector.detect(run):
            flagged.setdefault(f.details["argument"], set()).add(run.trace_id)
    d = planted.domain
    assert flagged["amount"] == planted.causes[pl.WRONG_FIELD]
    assert flagged[d.method_arg] == planted.causes[pl.WRONG_RECORD]
