"""Rules as rates (lucky successes that break a rule do not hide it), handing off instead of
acting within one kind of request, no gap for a behaviour successful runs show as often, and
what `analyze` says when it keeps no gap."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import numpy as np
import pytest
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.premature import PrematureFinish
from tracegym.analysis.detectors.tool_order import WrongToolOrder, fisher_greater, rate_rules
from tracegym.analysis.embeddings import Embedder
from tracegym.analysis.gap_selection import (
    Thresholds,
    candidates_from_findings,
    like_with_like,
    score,
    select,
)
from tracegym.analysis.runs import ROLE, Run
from tracegym.cli import app
from typer.testing import CliRunner

from tests.fixtures.analysis_steps import make_step


def _run(trace: str, success: bool, request: str, tools: list[str], *, reply: str = "",
         args: dict | None = None) -> Run:  # fmt: skip
    """A run: the user's request, the tool calls (each with `args`), then the agent's reply."""
    steps = [make_step(trace, 0, operation="chat", input=request, output=None,
                   attributes={ROLE: "user"})]  # fmt: skip
    given = json.dumps(args or {})
    steps += [make_step(trace, i, tool=tool, input=given) for i, tool in enumerate(tools, 1)]
    if reply:
        steps.append(make_step(trace, len(steps), operation="chat", input=None, output=reply,
                           attributes={ROLE: "assistant"}))  # fmt: skip
    return Run(trace, trace, "a", success, None, {}, None, steps)


# Rules as rates -----------------------------------------------------------------------------
CANCEL = "Please cancel my order #W{n:05d}, I do not need it any more."


def _cancels(succeeded: int, looked_up: int, failed: int) -> list[Run]:
    """`succeeded` successful cancels, the first `looked_up` after the look-up (the others
    cancel blind and were lucky); `failed` failed ones, only the first after the look-up."""
    runs = []
    for outcome, n, first, prefix, base in ((True, succeeded, looked_up, "s", 10000),
                                            (False, failed, 1, "f", 20000)):  # fmt: skip
        for i in range(n):
            tools = ["get_order", "cancel_order"] if i < first else ["cancel_order"]
            runs.append(_run(f"{prefix}{i:02d}", outcome, CANCEL.format(n=base - 10000 + i),
                             tools, reply="Done.", args={"order_id": f"W{base + i}"}))  # fmt: skip
    return runs


def _cancel_runs() -> list[Run]:
    """Successful runs look the order up first in 10 of 15 (5 lucky ones cancel blind, and the
    order happened to be cancellable); failed runs in 1 of 10."""
    return _cancels(15, 10, 10)


def test_a_rule_lucky_successes_break_is_still_found_with_its_p_value():
    runs = _cancel_runs()
    successes = [r for r in runs if r.success]
    failures = [r for r in runs if not r.success]
    # every-successful-run mining misses it: 5 of 15 successes cancel without the look-up
    assert WrongToolOrder(by_rate=False).fit(runs).detect(failures[1]) == []
    [rule] = rate_rules(successes, failures)
    assert (rule.before, rule.after, rule.prerequisite) == ("get_order", "cancel_order", True)
    assert rule.confidence == 0.6667 and rule.failed_rate == 0.1 and not rule.substitutes
    # the test: failed runs breaking it (9 of 10) against successful ones (5 of 15)
    assert (rule.broken_failed, rule.broken_succeeded) == (9, 5)
    assert rule.p_value == pytest.approx(fisher_greater(9, 10, 5, 15)) and rule.p_value <= 0.01
    # a look-up of another record (no identifier shared with the cancel) is no prerequisite
    other = [_run(r.trace_id, r.success, CANCEL.format(n=0), [s.tool for s in r.steps if s.tool],
                  reply="Done.", args={"order_id": f"W3{i:04d}"})
             for i, r in enumerate(runs)]  # fmt: skip
    for r in other:
        for s in r.steps:
            if s.tool == "get_order":
                s.input = json.dumps({"query": "recent"})
    assert rate_rules([r for r in other if r.success], [r for r in other if not r.success]) == []
    detector = WrongToolOrder().fit(runs)
    [finding] = detector.detect(failures[1])
    assert finding.key == "wrong_tool_order:get_order>cancel_order"
    assert finding.details["p_value"] == rule.p_value and finding.details["missing"] is True
    assert "67% of 15 successful runs" in finding.message and "p = " in finding.message
    assert detector.detect(failures[0]) == []  # it looked the order up first
    # and the gap is kept: 9/10 failed runs break it, 5/15 successful ones
    findings = [f for r in runs for f in detector.detect(r)]
    failed = [r.trace_id for r in failures]
    succeeded = [r.trace_id for r in successes]
    t = Thresholds()
    scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
    like_with_like(scored, runs, t)
    kept = [s.candidate.key for s in select(scored, failed, t)]
    assert kept[0] == "wrong_tool_order:get_order>cancel_order"


def test_what_the_successful_runs_breaking_a_rule_do_instead_is_no_break():
    runs = _cancel_runs()
    for r in runs:  # the lucky successes and most failures search their notes instead
        if r.trace_id in {"s10", "s11", "s12", "s13", "s14", "f01", "f02", "f03"}:
            r.steps.insert(1, make_step(r.trace_id, 1, operation="search_memory",
                                    name="search_memory notes"))  # fmt: skip
            for i, step in enumerate(r.steps):
                step.position = i
    detector = WrongToolOrder().fit(runs)
    [rule] = [x for x in detector.rules_ if x.p_value is not None]
    assert rule.substitutes == ("search_memory notes",)
    failures = {r.trace_id: r for r in runs if not r.success}
    assert detector.detect(failures["f01"]) == []  # it searched the notes instead
    assert [f.key for f in detector.detect(failures["f04"])] == [rule.key]


def test_a_rule_both_sides_break_as_often_is_no_rule():
    runs = _cancel_runs()
    for r in runs:  # failed runs look up as often as successful ones
        if not r.success and r.trace_id in {"f01", "f02", "f03", "f04", "f05"}:
            r.steps.insert(1, make_step(r.trace_id, 1, tool="get_order"))
            for i, step in enumerate(r.steps):
                step.position = i
    successes = [r for r in runs if r.success]
    failures = [r for r in runs if not r.success]
    assert rate_rules(successes, failures) == []


REFUND = "My order #W{n:05d} arrived broken, please refund it."


def _thin_cancels(refunds: int = 20, refunds_looked_up: int = 20) -> list[Run]:
    """Four successful cancels (two without the look-up, lucky), nine failed ones (one looked
    up); and `refunds` successful refunds, `refunds_looked_up` of them after the look-up."""
    runs = []
    for i in range(refunds):
        tools = ["get_order", "refund_order"] if i < refunds_looked_up else ["refund_order"]
        runs.append(_run(f"r{i:02d}", True, REFUND.format(n=i), tools, reply="Refunded.",
                         args={"order_id": f"W{30000 + i}"}))  # fmt: skip
    return runs + _cancels(4, 2, 9)


def test_a_rare_write_is_held_to_the_look_up_every_write_on_its_record_gets():
    runs = _thin_cancels()
    successes = [r for r in runs if r.success]
    failures = [r for r in runs if not r.success]
    # 4 successful cancels, 2 of them blind, are too few and too mixed for a test of their own
    assert fisher_greater(8, 9, 2, 4) > 0.05
    [rule] = rate_rules(successes, failures)
    assert (rule.before, rule.after, rule.support, rule.confidence) == (
        "get_order",
        "cancel_order",
        4,
        0.5,
    )
    # ... but 22 of the 24 successful writes on an order came after its look-up
    assert rule.pooled == (22, 24) and (rule.broken_failed, rule.broken_succeeded) == (8, 2)
    assert rule.p_value == pytest.approx(fisher_greater(8, 9, 2, 24))
    [finding] = WrongToolOrder().fit(runs).detect(failures[1])
    assert "before 22 of 24 calls of the writes on its record" in finding.message


@pytest.mark.parametrize("refunds, looked_up", [(0, 0), (3, 3), (20, 14)])
def test_a_rare_write_is_not_judged_by_a_look_up_that_is_no_habit(refunds, looked_up):
    # no other write on the record (4 calls in all); or a look-up the writes skip too often
    # (5 of 7 calls after it; 16 of 24)
    runs = _thin_cancels(refunds, looked_up)
    successes = [r for r in runs if r.success]
    assert rate_rules(successes, [r for r in runs if not r.success]) == []


def _cancel_with_lookup(trace: str, success: bool, order: str, status: str) -> Run:
    run = _run(trace, success, CANCEL.format(n=int(order[1:])), [])
    args = json.dumps({"order_id": order})
    run.steps += [
        make_step(trace, 1, tool="get_order", input=args,
              output=json.dumps({"order_id": order, "status": status})),
        make_step(trace, 2, tool="cancel_order", input=args, output=json.dumps({"ok": True})),
    ]  # fmt: skip
    return run


def test_a_state_lucky_successes_acted_in_is_still_forbidden_by_rates():
    from tracegym.analysis.detectors.precondition import ForbiddenAction, mine_preconditions

    ok = [_cancel_with_lookup(f"s{i:02d}", True, f"W{10000 + i}", "pending") for i in range(10)]
    ok.append(_cancel_with_lookup("s10", True, "W10010", "shipped"))  # lucky
    bad = [_cancel_with_lookup(f"f{i}", False, f"W2000{i}", "shipped") for i in range(5)]
    bad.append(_cancel_with_lookup("f5", False, "W20005", "pending"))
    runs = ok + bad
    [rule] = [r for r in mine_preconditions(runs) if r.path == "status"]
    assert rule.forbidden == frozenset({"shipped"}) and rule.lucky == 1
    assert (rule.failed_holding, rule.failed_acted) == (5, 6) and rule.p_value <= 0.05
    assert rule.to_rule().confidence == round(1 - 1 / 11, 3)
    detector = ForbiddenAction().fit(runs)
    [finding] = detector.detect(bad[0])
    assert finding.key == "forbidden_action:cancel_order"
    assert finding.details["p_value"] == rule.p_value and "Fisher" in finding.message
    assert detector.detect(bad[5]) == [] and detector.detect(ok[0]) == []


def _look_up_only(trace: str, order: str, status: str, colour: str = "red") -> Run:
    """A successful run that read the order and left it alone."""
    run = _run(trace, True, CANCEL.format(n=int(order[1:])), [])
    output = json.dumps({"order_id": order, "status": status, "colour": colour})
    run.steps.append(make_step(trace, 1, tool="get_order", input=json.dumps({"order_id": order}),
                               output=output))  # fmt: skip
    return run


def _with_colour(run: Run, colour: str) -> Run:
    read = run.steps[1]
    read.output = json.dumps({**json.loads(read.output), "colour": colour})
    return run


def test_states_too_rare_to_forbid_alone_are_forbidden_together():
    from tracegym.analysis.detectors.precondition import ForbiddenAction, mine_preconditions

    ok = [_cancel_with_lookup(f"s{i:02d}", True, f"W{10000 + i}", status)
          for i, status in enumerate(["pending"] * 3 + ["processing"] * 3)]  # fmt: skip
    statuses = ["shipped"] * 3 + ["in_transit"] * 3 + ["delivered"] * 4
    left = [_look_up_only(f"l{i:02d}", f"W{11000 + i}", status)
            for i, status in enumerate(statuses)]  # fmt: skip
    bad = [_cancel_with_lookup(f"f{i}", False, f"W2000{i}", status)
           for i, status in enumerate(["shipped"] * 3 + ["in_transit"] * 3)]  # fmt: skip
    runs = ok + left + bad
    # each alone is no rule: 3 of the 6 failed records hold it, against 6 acted records
    # (chance C(6, 3) / C(12, 3) = 0.09), and 3 of 16 records successful runs read (0.29)
    assert comb(6, 3) / comb(12, 3) > 0.05 and (1 - 3 / 16) ** 6 > 0.05
    [rule] = [r for r in mine_preconditions(runs) if r.path == "status"]
    assert rule.forbidden == frozenset({"shipped", "in_transit"}) and rule.p_value is None
    detector = ForbiddenAction().fit(runs)
    assert [f.key for f in detector.detect(bad[4])] == ["forbidden_action:cancel_order"]
    assert "never with status in {in_transit, shipped}" in detector.detect(bad[0])[0].message
    assert detector.detect(ok[0]) == []


def test_a_field_whose_every_record_differs_forbids_nothing_together():
    from tracegym.analysis.detectors.precondition import mine_preconditions

    colours = ["red", "blue", "green", "cyan", "teal", "gold", "pink", "grey", "plum", "rust"]
    ok = [_with_colour(_cancel_with_lookup(f"s{i}", True, f"W1000{i}", "pending"), colours[i])
          for i in range(3)]  # fmt: skip
    left = [_look_up_only(f"l{i}", f"W1100{i}", "shipped", colours[i]) for i in range(10)]
    bad = [_with_colour(_cancel_with_lookup(f"f{i}", False, f"W2000{i}", "pending"), colours[3 + i])
           for i in range(7)]  # fmt: skip
    # the 7 failed records hold colours no successful record does (an unshuffled test would
    # say chance 1 / C(10, 7) = 0.008), but so would any 7 records against any 3: the
    # shuffled outcomes find as many
    assert not [r for r in mine_preconditions(ok + left + bad) if r.path == "colour"]


# Acting versus handing off ------------------------------------------------------------------
CHANGE = "Please change my flight on reservation R{n:05d} to the morning departure."
COMPLAIN = "I want to file a complaint about my lost luggage from trip T{n:05d}, escalate it."


def _airline(failed_change: int = 6) -> list[Run]:
    """Complaints end with a transfer in every successful run; flight changes are made by every
    successful change run, and the failed ones hand off instead."""
    runs = []
    transfer = ["get_trip", "transfer_to_human_agents"]
    change = ["get_reservation", "update_reservation_flights"]
    hand_off = ["get_reservation", "transfer_to_human_agents"]
    for i in range(12):
        runs.append(_run(f"sc{i:02d}", True, COMPLAIN.format(n=i), transfer, reply="Bye."))
    for i in range(8):
        runs.append(_run(f"sf{i:02d}", True, CHANGE.format(n=i), change, reply="Changed."))
    for i in range(failed_change):
        runs.append(_run(f"ff{i:02d}", False, CHANGE.format(n=50 + i), hand_off, reply="Bye."))
    runs.append(_run("fq00", False, CHANGE.format(n=90), ["get_reservation"],
                     reply="Which flight would you like instead?"))  # fmt: skip
    return runs


def test_handing_off_instead_of_the_action_its_kind_takes_is_found():
    runs = _airline()
    detector = PrematureFinish().fit(runs)
    by_run = {r.trace_id: detector.detect(r) for r in runs}
    handed = by_run["ff00"]
    assert [f.key for f in handed] == ["premature_finish:update_reservation_flights"]
    [finding] = handed
    assert finding.details["ending"] == "hand-off"
    assert finding.details["instead"] == ["transfer_to_human_agents"]
    assert "handed off (transfer_to_human_agents) instead" in finding.message
    assert finding.position == 2  # the transfer, where the run turned away
    assert by_run["fq00"][0].details["ending"] == "reply"
    # the wrong way round: transfers are every complaint's success, not a check for changes
    assert not any("transfer" in f.key for fs in by_run.values() for f in fs)
    assert all(not fs for t, fs in by_run.items() if t.startswith("s"))


def test_the_hand_off_gap_is_kept_although_successful_runs_transfer_more():
    runs = _airline()
    detector = PrematureFinish().fit(runs)
    findings = [f for r in runs for f in detector.detect(r)]
    failed = [r.trace_id for r in runs if r.success is False]
    succeeded = [r.trace_id for r in runs if r.success is True]
    t = Thresholds()
    scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
    like_with_like(scored, runs, t)
    [top, *_] = select(scored, failed, t)
    assert top.candidate.key == "premature_finish:update_reservation_flights"
    assert top.failed_lacking == 7 and top.succeeded_lacking == 0


# No gap for what successful runs show as often ----------------------------------------------
ORDER = "Please order a referral to orthopedic surgery for patient S{n:05d} today."
READING = "What is the latest glucose reading of patient S{n:05d} in the chart?"
ADDRESS = "Update the home address on file for patient S{n:05d} to {n} Main Street."


def test_a_behaviour_successful_runs_of_its_kind_show_as_often_is_not_ranked():
    # the finding: 6 failed order runs and all 10 successful ones (within the kind: no
    # contrast), 4 failed reading runs (2 successful readings, too few to judge)
    fo = [_run(f"fo{i}", False, ORDER.format(n=i), ["get_pt", "post"]) for i in range(6)]
    so = [_run(f"so{i}", True, ORDER.format(n=20 + i), ["get_pt", "post"]) for i in range(10)]
    fr = [_run(f"fr{i}", False, READING.format(n=40 + i), ["get_obs"]) for i in range(4)]
    sr = [_run(f"sr{i}", True, READING.format(n=60 + i), ["get_obs"]) for i in range(2)]
    fa = [_run(f"fa{i}", False, ADDRESS.format(n=80 + i), ["put"]) for i in range(10)]
    sa = [_run(f"sa{i:02d}", True, ADDRESS.format(n=100 + i), ["put"]) for i in range(40)]
    runs = fo + so + fr + sr + fa + sa
    showing = fo + so + fr
    findings = [Finding("unknown_value", "unknown_value:post.code", r.trace_id, 1, 1, "a",
                        (f"{r.trace_id}-1",), "x") for r in showing]  # fmt: skip
    failed = [r.trace_id for r in runs if r.success is False]
    succeeded = [r.trace_id for r in runs if r.success is True]
    t = Thresholds()
    scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
    code = next(s for s in scored if s.candidate.key == "unknown_value:post.code")
    assert code.kept and code.delta > 0.2  # pooled: 10/20 failed vs 10/52 successful
    like_with_like(scored, runs, t)
    assert not code.kept
    assert "show it as often or more: within-kind delta 0.00" in code.why
    assert all(s.candidate.key != code.candidate.key for s in select(scored, failed, t))


# When nothing is kept -------------------------------------------------------------------------
class _EveryOther(Detector):
    """Flags every other run, failed or not: no contrast at all."""

    name = "every_other"
    description = "flags every other run"

    def detect(self, run: Run) -> list[Finding]:
        if int(run.trace_id, 16) % 2:
            return []
        step = run.steps[-1]
        return [Finding(self.name, f"{self.name}:x", run.trace_id, step.position,
                        step.step_index, step.agent, (step.span_id,), "every other")]  # fmt: skip


class _Flat(Embedder):
    def _load_model(self):
        class Model:
            def encode(self, texts, **_):
                return np.array([[1.0, float(i)] for i, _ in enumerate(texts)], dtype=np.float32)

        return Model()


def test_analyze_says_why_nothing_was_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tracegym.analysis import pipeline
    from tracegym.tests.fixtures.seat_agent import write_seat_agent

    write_seat_agent(tmp_path, failed=8, succeeded=8, baggage=0)
    monkeypatch.setattr(pipeline, "default_detector_set", lambda: [_EveryOther()])
    monkeypatch.setattr(pipeline, "Embedder", _Flat)
    done = CliRunner().invoke(app, ["--home", str(tmp_path), "analyze"])
    assert done.exit_code == 0, done.output
    text = " ".join(done.stdout.split())
    assert "0 capability gaps" in text and "No gap kept." in text
    assert "of 8 failed runs have no finding from any detector" in text
    # 5 of 8 failed runs vs 3 of 8 successful ones: stability is what it misses
    assert "every_other:x: 5 failed runs, coverage 0.62, delta 0.25" in text
    assert "stable in 4/10 < 8" in text
    assert "Next: more runs: 8 failed and 8 successful so far" in text
    assert "Next: --judge-url URL --judge-model NAME" in text
    done = CliRunner().invoke(app, ["--home", str(tmp_path), "analyze", "--json"])
    assert done.exit_code == 0, done.output
    printed = json.loads(done.stdout)
    empty = printed["nothing_kept"]
    assert printed["gaps"] == [] and empty["failed"] == 8 and empty["succeeded"] == 8
    assert empty["failed_without_findings"] == 3
    near = {m["key"]: m for m in empty["nearest"]}["every_other:x"]
    assert near["missed"] == ["stable in 4/10 < 8"] and near["failed_runs"] == 5
    assert any(s.startswith("--judge-url") for s in empty["next_steps"])
    written = json.loads((tmp_path / "gaps.json").read_text())
    assert "nothing_kept" not in written  # the explanation is the command's, not gaps.json's


def test_the_permutation_test_gives_the_same_p_in_bounded_chunks(monkeypatch):
    from tracegym.analysis.detectors import precondition

    acted = [frozenset({v}) for v in "abcabc"]
    failed = [frozenset({v}) for v in "abdedeca"]
    whole = precondition.outside_states_p(acted, failed, set("abcde"))
    monkeypatch.setattr(precondition, "SHUFFLED_CELLS", 30)  # 2 shuffles of 14 records a chunk
    assert precondition.outside_states_p(acted, failed, set("abcde")) == whole
    assert 0 < whole < 1


def test_states_never_left_alone_do_not_count_however_many_there_are():
    from tracegym.analysis.detectors import precondition

    acted = [frozenset({"pending"})] * 3
    # 80 distinct values only failed records hold, none left alone: nothing to count, no overflow
    failed = [frozenset({f"v{i}", "shipped" if i < 3 else "other"}) for i in range(80)]
    with_shipped = precondition.outside_states_p(acted, failed, {"shipped"})
    stripped = [vs & {"shipped"} for vs in failed]  # the same records, the other values gone
    assert with_shipped == precondition.outside_states_p(acted, stripped, {"shipped"}) < 1.0
    assert precondition.outside_states_p(acted, failed, set()) == 1.0  # k = 0: never extreme
