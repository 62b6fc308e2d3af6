"""Gap statistics on a synthetic population with planted gaps; clustering determinism; the
embedding cache; gaps.json through `analyze` with a custom detector."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from tracegym.analysis.clustering import assign, cluster
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.embeddings import Embedder
from tracegym.analysis.gap import Gap
from tracegym.analysis.gap_selection import (
    Thresholds,
    candidates_from_findings,
    describe,
    like_with_like,
    rates,
    score,
    select,
)
from tracegym.analysis.runs import ROLE, Run, Step
from tracegym.analysis.signatures import mask

# Planted gaps: (share of failed runs lacking it, share of successful runs lacking it).
PLANTED = {"a": (0.40, 0.02), "b": (0.25, 0.00)}
DECOYS = {"c": (0.30, 0.25), "d": (0.05, 0.00), "e": (0.12, 0.10)}


def population(n_failed: int = 200, n_succeeded: int = 200):
    """Findings laid out so each key is lacking in exactly its planted share of runs."""
    failed = [f"f{i:04d}" for i in range(n_failed)]
    succeeded = [f"s{i:04d}" for i in range(n_succeeded)]
    findings = []
    for offset, (key, (fail_share, succ_share)) in enumerate({**PLANTED, **DECOYS}.items()):
        for ids, share in ((failed, fail_share), (succeeded, succ_share)):
            count = round(share * len(ids))
            start = (offset * 37) % len(ids)  # overlap the keys differently
            for k in range(count):
                trace = ids[(start + k) % len(ids)]
                findings.append(Finding("synthetic", f"synthetic:{key}", trace, 0, 0, "agent",
                                        ("span",), f"{key} happened"))  # fmt: skip
    return failed, succeeded, findings


def test_rates_match_the_planted_shares():
    failed, succeeded, findings = population()
    by_key = {c.key: c for c in candidates_from_findings(findings)}
    for key, (fail_share, succ_share) in {**PLANTED, **DECOYS}.items():
        coverage, delta = rates(by_key[f"synthetic:{key}"].lacking, failed, succeeded)
        assert coverage == pytest.approx(fail_share, abs=1e-9)
        assert delta == pytest.approx(fail_share - succ_share, abs=1e-9)


def test_exactly_the_planted_gaps_are_kept():
    failed, succeeded, findings = population()
    t = Thresholds()
    candidates = [c for c in candidates_from_findings(findings) if c.kind == "finding"]
    scored = [score(c, failed, succeeded, t) for c in candidates]
    kept = {s.candidate.key for s in select(scored, failed, t)}
    assert kept == {f"synthetic:{k}" for k in PLANTED}
    why = {s.candidate.key: s.why for s in scored}
    assert "delta" in why["synthetic:c"] and "coverage" in why["synthetic:d"]
    # The planted ones pass in every resample; ranking is by coverage x delta.
    ranked = [s.candidate.key for s in select(scored, failed, t)]
    assert ranked == ["synthetic:a", "synthetic:b"]


def test_stability_is_deterministic_and_thresholds_are_configurable():
    failed, succeeded, findings = population()
    candidates = [c for c in candidates_from_findings(findings) if c.kind == "finding"]
    loose = Thresholds(min_coverage=0.05, min_delta=0.0, min_stability=8)
    first = [score(c, failed, succeeded, loose) for c in candidates]
    second = [score(c, failed, succeeded, loose) for c in candidates]
    assert [(s.stability, s.kept) for s in first] == [(s.stability, s.kept) for s in second]
    assert {s.candidate.key for s in first if s.kept} >= {
        "synthetic:a",
        "synthetic:b",
        "synthetic:c",
    }


def test_without_successes_coverage_alone_ranks():
    failed, _, findings = population()
    t = Thresholds()
    candidates = [c for c in candidates_from_findings(findings) if c.kind == "finding"]
    scored = [score(c, failed, [], t) for c in candidates]
    assert all(s.delta is None for s in scored)
    kept = [s.candidate.key for s in select(scored, failed, t)]
    assert kept[0] == "synthetic:a" and "synthetic:d" not in kept  # coverage 0.05 < 0.10


def test_detector_level_candidate_yields_to_its_precise_keys():
    failed, succeeded, findings = population()
    t = Thresholds()
    scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
    kept = [s.candidate for s in select(scored, failed, t)]
    assert "detector:synthetic" not in {c.key for c in kept} or len(kept) > 2


def test_clustering_is_deterministic_and_order_free():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 16))
    points = np.concatenate([c + 0.05 * rng.normal(size=(10, 16)) for c in centers])
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    labels = cluster(points, 0.35)
    assert list(labels) == list(cluster(points, 0.35))
    assert len(set(labels)) == 3 and all(
        len(set(labels[i * 10 : i * 10 + 10])) == 1 for i in range(3)
    )
    order = rng.permutation(len(points))
    permuted = cluster(points[order], 0.35)
    same = {(labels[i], permuted[k]) for k, i in enumerate(order)}
    assert len(same) == 3  # the same partition, whatever the input order
    centroids = np.stack([points[labels == k].mean(axis=0) for k in range(3)])
    assert list(assign(points[:3], centroids, 0.35)) == [labels[0]] * 3
    assert list(assign(-points[:1], centroids, 0.35)) == [-1]  # nothing close: no cluster


class _CountingModel:
    def __init__(self) -> None:
        self.calls = 0

    def encode(self, texts, **_):
        self.calls += len(texts)
        return np.array([[len(t), t.count("a"), 1.0] for t in texts], dtype=np.float32)


class _FakeEmbedder(Embedder):
    model = _CountingModel()

    def _load_model(self):
        return self.model


def test_embeddings_are_cached_by_content(tmp_path: Path):
    first = _FakeEmbedder(tmp_path)
    vectors = first.encode(["alpha", "beta", "alpha"])
    assert first.computed == 2 and np.array_equal(vectors[0], vectors[2])
    second = _FakeEmbedder(tmp_path)  # a later process: everything from the cache
    again = second.encode(["beta", "alpha"])
    assert second.computed == 0 and second._model is None
    assert np.array_equal(again, vectors[[1, 0]])


def test_mask_hides_run_specific_values():
    assert mask("refund_order(order_id=W0012345) amount 12.50") == mask(
        "refund_order(order_id=W0099999) amount 7"
    )


class _ToolErrors(Detector):
    name = "tool_errors"
    description = "tool calls that fail"

    def detect(self, run):
        return [
            Finding(self.name, f"{self.name}:{s.tool}", run.trace_id, s.position, s.step_index,
                    s.agent, (s.span_id,), f"{s.tool} failed with {s.error_type}")
            for s in run.tool_calls() if s.failed
        ]  # fmt: skip


def test_analyze_writes_gaps_json(tmp_path: Path):
    pytest.importorskip("duckdb")
    from tracegym.analysis.pipeline import analyze
    from tracegym.tests.fixtures.declined_store import write_declined_store

    write_declined_store(tmp_path)

    class _Fake(_FakeEmbedder):
        pass

    result = analyze(tmp_path, detectors=[_ToolErrors()], embedder=_Fake(tmp_path / "cache"))
    assert result.contrast == "failed vs successful runs"
    document = json.loads((tmp_path / "gaps.json").read_text())
    assert document["runs"] == {"total": 40, "failed": 20, "succeeded": 20, "unknown": 0}
    (gap,) = document["gaps"]
    assert gap["key"] == "tool_errors:pay" and gap["name"] == "tool_errors_pay"
    assert gap["coverage"] == 1.0 and gap["delta"] == 1.0 and gap["stability"] == 10
    assert gap["tools"] == ["pay"] and len(gap["examples"]) == 5
    # every failed run is a member, at its failed call; examples are the first five
    assert len(gap["members"]) == 20 and gap["examples"] == gap["members"][:5]
    assert all(m["evidence"] == "pay failed with Declined" for m in gap["members"])
    assert "Tool calls that fail" in gap["description"]
    assert gap["id"].startswith("gap-") and gap["rank"] == 1


# Causes, not symptoms ---------------------------------------------------------------------------
def _f(key: str, trace: str, position: int) -> Finding:
    return Finding(key.split(":", 1)[0], key, trace, position, position, "agent",
                   (f"{trace}-{position}",), f"{key} at {position}")  # fmt: skip


def _select(findings, failed, succeeded, **options):
    t = Thresholds()
    scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
    return select(scored, failed, t, **options), scored


def test_a_symptom_that_follows_a_cause_is_folded_into_it():
    failed = [f"f{i:02d}" for i in range(30)]
    succeeded = [f"s{i:02d}" for i in range(30)]
    findings = [_f("wrong_tool_order:get_booking>change_seat", t, 2) for t in failed[:12]]
    findings += [_f("budget_waste:out_of_steps", t, 4) for t in failed[:12]]  # after the cause
    findings += [_f("unserved_request:change_seat", t, 5) for t in failed[:11]]  # after too
    kept, scored = _select(findings, failed, succeeded)
    assert [s.candidate.key for s in kept] == ["wrong_tool_order:get_booking>change_seat"]
    folded = {x.key: x for x in kept[0].symptoms}
    assert {"budget_waste:out_of_steps", "unserved_request:change_seat"} <= set(folded)
    assert folded["unserved_request:change_seat"].shared == 11
    why = {s.candidate.key: s.why for s in scored}
    assert why["budget_waste:out_of_steps"].startswith("follows ")


def test_what_comes_first_is_the_cause_and_other_runs_keep_their_gap():
    failed = [f"f{i:02d}" for i in range(30)]
    succeeded = [f"s{i:02d}" for i in range(30)]
    # the order finding comes first this time: the grounding finding follows it
    findings = [_f("wrong_tool_order:a>b", t, 1) for t in failed[:10]]
    findings += [_f("ungrounded_argument:b.x", t, 3) for t in failed[:10]]
    # a budget symptom in other (and more) runs than any cause's: a gap of its own, and a
    # symptom kind never ranks above a cause
    findings += [_f("budget_waste:loop:search", t, 6) for t in failed[15:30]]
    kept, _ = _select(findings, failed, succeeded)
    keys = [s.candidate.key for s in kept]
    assert keys == ["wrong_tool_order:a>b", "budget_waste:loop:search"]
    assert {x.key for x in kept[0].symptoms} == {"ungrounded_argument:b.x",
                                                 "detector:ungrounded_argument"}  # fmt: skip
    # reversed positions: the grounding finding is the cause
    findings = [_f("wrong_tool_order:a>b", t, 3) for t in failed[:10]]
    findings += [_f("ungrounded_argument:b.x", t, 1) for t in failed[:10]]
    kept, _ = _select(findings, failed, succeeded)
    assert [s.candidate.key for s in kept] == ["ungrounded_argument:b.x"]


def test_a_refused_forbidden_write_is_the_forbidden_action_not_an_invalid_call():
    failed = [f"f{i:02d}" for i in range(30)]
    succeeded = [f"s{i:02d}" for i in range(30)]
    # the refused write: both findings sit on the same call, in every run of the cause
    findings = [_f("forbidden_action:cancel_order", t, 3) for t in failed[:12]]
    findings += [_f("invalid_invocation:cancel_order", t, 3) for t in failed[:12]]
    findings += [_f("invalid_invocation:cancel_order", t, 5) for t in failed[12:14]]  # others
    kept, scored = _select(findings, failed, succeeded)
    assert [s.candidate.key for s in kept] == ["forbidden_action:cancel_order"]
    folded = {x.key: x for x in kept[0].symptoms}
    assert folded["invalid_invocation:cancel_order"].shared == 12
    assert folded["invalid_invocation:cancel_order"].failed_runs == 14
    why = {s.candidate.key: s.why for s in scored}
    assert why["invalid_invocation:cancel_order"].startswith("follows forbidden_action:")


def test_a_candidate_on_the_same_steps_as_a_more_specific_cause_is_its_symptom():
    failed = [f"f{i:02d}" for i in range(30)]
    succeeded = [f"s{i:02d}" for i in range(30)]
    # a wider account of the same calls: 10 of its 22 runs sit on wrong_amount's call, 9
    # follow an earlier wrong order, 3 are its own (19/22 explained)
    findings = [_f("wrong_amount:pay.amount", t, 4) for t in failed[:10]]
    findings += [_f("ungrounded_argument:pay.amount", t, 4) for t in failed[:10]]
    findings += [_f("wrong_tool_order:get_bill>pay", t, 1) for t in failed[10:19]]
    findings += [_f("ungrounded_argument:pay.amount", t, 4) for t in failed[10:22]]
    kept, _ = _select(findings, failed, succeeded)
    keys = [s.candidate.key for s in kept]
    assert "ungrounded_argument:pay.amount" not in keys and keys[0] == "wrong_amount:pay.amount"
    assert "ungrounded_argument:pay.amount" in {x.key for x in kept[0].symptoms}
    # the previous rule (only failed calls and symptom kinds tie at a step) kept it
    before, _ = _select(findings, failed, succeeded, same_span=False)
    assert "ungrounded_argument:pay.amount" in [s.candidate.key for s in before]
    # a failed call never explains another behaviour found at its own step
    findings = [_f("invalid_invocation:pay", t, 4) for t in failed[:10]]
    findings += [_f("ungrounded_argument:pay.amount", t, 4) for t in failed[:12]]
    kept, _ = _select(findings, failed, succeeded)
    assert kept[0].candidate.key == "ungrounded_argument:pay.amount"


def test_a_detector_kind_whose_findings_sit_on_its_causes_steps_is_no_gap():
    failed = [f"f{i:02d}" for i in range(30)]
    succeeded = [f"s{i:02d}" for i in range(30)]
    # a refund outside the window follows a poisoned memory read (a symptom of it); another
    # write is forbidden on its own: the detector's whole kind holds both, on the same calls
    findings = [_f("poisoned_memory:notes/window", t, 1) for t in failed[:9]]
    findings += [_f("forbidden_action:refund", t, 4) for t in failed[:9]]
    findings += [_f("forbidden_action:void", t, 2) for t in failed[10:19]]
    kept, scored = _select(findings, failed, succeeded)
    assert {s.candidate.key for s in kept} == {"poisoned_memory:notes/window",
                                               "forbidden_action:void"}  # fmt: skip
    why = {s.candidate.key: s.why for s in scored}
    assert why["detector:forbidden_action"].startswith("follows ")
    before, _ = _select(findings, failed, succeeded, same_span=False)
    assert "detector:forbidden_action" in [s.candidate.key for s in before]  # two causes merged


def test_failure_itself_is_not_a_capability():
    failed = [f"f{i:02d}" for i in range(20)]
    succeeded = [f"s{i:02d}" for i in range(20)]
    findings = [_f("budget_waste:out_of_steps", t, 3) for t in failed]  # every failed run
    kept, scored = _select(findings, failed, succeeded)
    assert kept == []
    why = {s.candidate.key: s.why for s in scored}
    assert "failure itself" in why["budget_waste:out_of_steps"]
    assert "failure itself" in why["detector:budget_waste"]
    # a precise behaviour covering every failed run is kept
    findings = [_f("wrong_tool_order:a>b", t, 3) for t in failed]
    kept, _ = _select(findings, failed, succeeded)
    assert [s.candidate.key for s in kept] == ["wrong_tool_order:a>b"]


def _run(trace: str, success: bool, tools: list[str]) -> Run:
    steps = [Step(position=i, trace_id=trace, span_id=f"{trace}-{i}", parent_span_id=None,
                  name=tool, operation="execute_tool", agent="a", step_index=i, tool=tool,
                  call_id=None, input="{}", output="{}", status="OK", error_type=None,
                  start_ns=i, end_ns=i, duration_ms=0.0, input_tokens=None, output_tokens=None,
                  memory_store=None, memory_record=None, memory_content_hash=None,
                  memory_result_hashes=[], subtask=None, attributes={})
             for i, tool in enumerate(tools)]  # fmt: skip
    return Run(trace, trace, "a", success, None, {}, None, steps)


def test_spending_is_judged_against_runs_of_the_same_kind_of_request():
    # failed booking runs search a lot; so do successful booking runs; refund runs do not
    failed = [_run(f"f{i:02d}", False, ["search", "search", "search", "book"]) for i in range(10)]
    booking = [_run(f"b{i:02d}", True, ["search", "search", "search", "book"]) for i in range(8)]
    refunds = [_run(f"r{i:02d}", True, ["get_order", "refund"]) for i in range(30)]
    runs = failed + booking + refunds
    findings = [_f("budget_waste:tool:search", r.trace_id, 2) for r in failed + booking[:7]]
    findings += [_f("wrong_tool_order:get_order>refund", r.trace_id, 3) for r in failed]
    t = Thresholds()
    ids_f = [r.trace_id for r in failed]
    ids_s = [r.trace_id for r in booking + refunds]
    scored = [score(c, ids_f, ids_s, t) for c in candidates_from_findings(findings)]
    budget = next(s for s in scored if s.candidate.key == "budget_waste:tool:search")
    assert budget.kept  # pooled: 10/10 failed vs 7/38 successful
    assert {r.request_kind() for r in failed} == {"book"}
    like_with_like(scored, runs, t)
    assert not budget.kept and "same kind of request (book)" in budget.why
    order = next(s for s in scored if s.candidate.key == "wrong_tool_order:get_order>refund")
    assert order.kept  # not a spend detector: untouched


def test_the_seat_agent_ranks_the_wrong_order_not_the_budget(tmp_path: Path):
    """The seat agent: change_seat without get_booking, then an apology."""
    from tracegym.analysis.pipeline import analyze
    from tracegym.tests.fixtures.seat_agent import write_seat_agent

    truth = write_seat_agent(tmp_path, failed=13)
    result = analyze(tmp_path, embedder=_FakeEmbedder(tmp_path / "cache"), write=False)
    assert result.gaps, [(s.candidate.key, s.why) for s in result.scored]
    top = result.gaps[0]
    assert top.key == "wrong_tool_order:get_booking>change_seat"
    assert {m.trace_id for m in top.members} == truth["wrong_order"]
    assert all(not g.key.startswith("budget_waste") for g in result.gaps)
    why = {s.candidate.key: s.why for s in result.scored}
    out_of_steps = why.get("budget_waste:out_of_steps", "follows")
    assert out_of_steps.startswith("follows") or "failure itself" in out_of_steps


def test_a_cause_of_one_kind_of_request_is_contrasted_within_that_kind():
    # 6 of the 8 failed cancel runs cancel without the lookup; 32 failed booking runs do not;
    # pooled, the contrast is diluted by the other kind (delta 0.15 < 0.2)
    cancels = [_run(f"fc{i}", False, ["cancel"]) for i in range(8)]
    bookings = [_run(f"fb{i:02d}", False, ["search", "book"]) for i in range(32)]
    ok_cancel = [_run(f"sc{i}", True, ["get_order", "cancel"]) for i in range(10)]
    ok_book = [_run(f"sb{i:02d}", True, ["search", "book"]) for i in range(40)]
    runs = cancels + bookings + ok_cancel + ok_book
    failed = [r.trace_id for r in cancels + bookings]
    succeeded = [r.trace_id for r in ok_cancel + ok_book]
    t = Thresholds()

    def scored_with(findings):
        scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
        return scored, next(s for s in scored if s.candidate.key == "wrong_tool_order:get>cancel")

    findings = [_f("wrong_tool_order:get>cancel", r.trace_id, 0) for r in cancels[:6]]
    scored, order = scored_with(findings)
    assert not order.kept and "delta 0.15" in order.why
    like_with_like(scored, runs, t)
    assert order.kept and order.why.startswith("kept within its kind of request (cancel")
    assert order.within_kind == {"kinds": ["cancel"], "failed": 8, "succeeded": 10,
                                 "delta": 0.75, "stability": 10}  # fmt: skip
    assert not next(s for s in scored if s.candidate.kind == "detector").kept  # not specific
    # the same share in the successful cancel runs: no contrast within the kind either
    findings += [_f("wrong_tool_order:get>cancel", r.trace_id, 1) for r in ok_cancel[:7]]
    scored, order = scored_with(findings)
    like_with_like(scored, runs, t)
    assert not order.kept
    # fewer failed runs than MIN_PEERS: the pooled contrast stands
    scored, order = scored_with(findings[:4])
    like_with_like(scored, runs, t)
    assert not order.kept


def _asked(trace: str, success: bool, text: str, tools: list[str]) -> Run:
    """A run whose first user message is `text`, then `tools`."""
    run = _run(trace, success, tools)
    user = Step(position=0, trace_id=trace, span_id=f"{trace}-user", parent_span_id=None,
                name="user", operation="chat", agent="a", step_index=None, tool=None,
                call_id=None, input=text, output=None, status="OK", error_type=None, start_ns=0,
                end_ns=0, duration_ms=0.0, input_tokens=None, output_tokens=None,
                memory_store=None, memory_record=None, memory_content_hash=None,
                memory_result_hashes=[], subtask=None, attributes={ROLE: "user"})  # fmt: skip
    for step in run.steps:
        step.position += 1
    run.steps.insert(0, user)
    return run


READING = "What is the latest glucose reading of patient S{n:05d} in the chart?"
ORDER = "Please order a referral to orthopedic surgery for patient S{n:05d} today."
ADDRESS = "Update the home address on file for patient S{n:05d} to {n} Main Street."


def _kind_population(ok_order_showing: int):
    """10 failed reading runs (no reading run succeeds), 10 failed and 10 successful order
    runs, 50 successful address runs; `ok_order_showing` of the successful order runs show the
    order candidate, which 8 of the failed order runs show."""
    fr = [_asked(f"fr{i}", False, READING.format(n=i), ["get_obs"]) for i in range(10)]
    fo = [_asked(f"fo{i}", False, ORDER.format(n=100 + i), ["get_pt", "post"]) for i in range(10)]
    so = [_asked(f"so{i}", True, ORDER.format(n=200 + i), ["get_pt", "post"]) for i in range(10)]
    sa = [_asked(f"sa{i:02d}", True, ADDRESS.format(n=300 + i), ["put"]) for i in range(50)]
    runs = fr + fo + so + sa
    findings = [_f("invalid_invocation:get_obs._count", r.trace_id, 1) for r in fr]
    showing = fo[:8] + so[:ok_order_showing]
    findings += [_f("unknown_value:post.code", r.trace_id, 2) for r in showing]
    failed = [r.trace_id for r in fr + fo]
    succeeded = [r.trace_id for r in so + sa]
    t = Thresholds()
    scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
    by_key = {s.candidate.key: s for s in scored}
    return runs, scored, by_key, t


def test_a_gap_confined_to_a_request_kind_no_run_of_which_succeeds_is_the_kind_itself():
    runs, scored, by_key, t = _kind_population(ok_order_showing=0)
    reading, order = by_key["invalid_invocation:get_obs._count"], by_key["unknown_value:post.code"]
    assert reading.kept and order.kept  # pooled: 10/20 and 8/20 failed vs 0/60
    like_with_like(scored, runs, t, kind_itself=False)
    assert reading.kept and order.kept
    like_with_like(scored, runs, t)
    assert reading.kept and order.kept  # nothing in the store tells: kept, but marked
    assert reading.confined.startswith("10 of its 10 failed runs serve request kind")
    assert "10 failed and 0 successful runs" in reading.confined and "glucose" in reading.confined
    assert order.confined is None  # its kind's 10 successful runs never show it: delta 0.8
    failed = [r.trace_id for r in runs if r.success is False]
    ranked = [x.candidate.key for x in select(scored, failed, t)]
    assert ranked.index("unknown_value:post.code") < ranked.index(reading.candidate.key)
    gap = describe(reading, "g", {r.trace_id: r for r in runs},
                   [r for r in runs if r.success], {})  # fmt: skip
    assert "Confined to failing kinds of request: 10 of its 10" in gap.description
    assert gap.confined == reading.confined  # typed, not only in the text
    assert Gap.from_dict(gap.to_dict()).confined == gap.confined


def test_a_gap_the_successful_runs_of_its_kind_show_as_often_is_the_kind_itself():
    runs, scored, by_key, t = _kind_population(ok_order_showing=7)
    order = by_key["unknown_value:post.code"]
    assert order.kept and order.delta > 0.25  # pooled: 8/20 failed vs 7/60 successful
    like_with_like(scored, runs, t)
    assert not order.kept and "within the kind delta 0.10 < 0.2" in order.why
    # fewer than MIN_PEERS successful runs of the kind: the pooled verdict stands
    runs, scored, by_key, t = _kind_population(ok_order_showing=7)
    few = [r for r in runs if r.trace_id not in {f"so{i}" for i in range(3, 10)}]
    like_with_like(scored, few, t)
    assert by_key["unknown_value:post.code"].kept


def test_within_kind_contrasts_use_the_kinds_learnt_from_the_requests():
    # two kinds of question that only read (no first write tool tells them apart): the failed
    # status questions show the finding, their successful peers never do; the successful
    # opening-hours questions often do, and under the first-write kind they are the peers
    status, hours = "What is the status of parcel PX{n:05d}?", "When does the depot in {n} open?"
    fs = [_asked(f"fs{i}", False, status.format(n=i), ["get_parcel"]) for i in range(8)]
    fb = [_asked(f"fb{i:02d}", False, ORDER.format(n=i), ["get_pt", "post"]) for i in range(32)]
    ss = [_asked(f"ss{i}", True, status.format(n=50 + i), ["get_parcel"]) for i in range(10)]
    sh = [_asked(f"sh{i:02d}", True, hours.format(n=i), ["get_depot"]) for i in range(40)]
    sb = [_asked(f"sb{i:02d}", True, ORDER.format(n=90 + i), ["get_pt", "post"]) for i in range(40)]
    runs = fs + fb + ss + sh + sb
    findings = [_f("wrong_tool_order:find>get_parcel", r.trace_id, 1) for r in fs[:6] + sh[:30]]
    failed = [r.trace_id for r in fs + fb]
    succeeded = [r.trace_id for r in ss + sh + sb]
    t = Thresholds()
    for contrast, kept in (("first_write", False), ("learnt", True)):
        scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
        order = next(s for s in scored if s.candidate.key == "wrong_tool_order:find>get_parcel")
        assert not order.kept  # pooled: 6/40 failed vs 30/90 successful
        like_with_like(scored, runs, t, contrast_kinds=contrast)
        assert order.kept is kept, (contrast, order.why)
    assert order.within_kind["failed"] == 8 and order.within_kind["succeeded"] == 10
    assert "status" in order.within_kind["kinds"][0]


def test_a_gap_over_several_kinds_is_judged_within_each():
    # 10 reading runs, all failed, all showing it; 6 failed order runs (`ordering` showing)
    # next to 10 successful order runs; 40 successful address runs that never show it
    def population(ok_showing: int, ordering: int = 5):
        fr = [_asked(f"fr{i}", False, READING.format(n=i), ["get_obs"]) for i in range(10)]
        fo = [_asked(f"fo{i}", False, ORDER.format(n=50 + i), ["post"]) for i in range(6)]
        so = [_asked(f"so{i}", True, ORDER.format(n=80 + i), ["post"]) for i in range(10)]
        sa = [_asked(f"sa{i:02d}", True, ADDRESS.format(n=200 + i), ["put"]) for i in range(40)]
        showing = fr + fo[:ordering] + so[:ok_showing]
        findings = [_f("unserved_request:post", r.trace_id, 1) for r in showing]
        failed, succeeded = [r.trace_id for r in fr + fo], [r.trace_id for r in so + sa]
        t = Thresholds()
        scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
        found = next(s for s in scored if s.candidate.key == "unserved_request:post")
        assert found.kept  # pooled: 10 + `ordering` of 16 failed vs at most 8/50 successful
        return fr + fo + so + sa, scored, found, t

    runs, scored, found, t = population(ok_showing=8)
    like_with_like(scored, runs, t, spread=False)
    assert found.kept  # 10 of its 15 failed runs are of one kind: under KIND_SHARE
    runs, scored, found, t = population(ok_showing=8)
    like_with_like(scored, runs, t)
    assert not found.kept and found.why.startswith("the kinds of request themselves: 10 of")
    assert "Mantel-Haenszel delta 0.03" in found.why
    runs, scored, found, t = population(ok_showing=0)  # within the order kind it separates
    like_with_like(scored, runs, t)
    assert found.kept and found.confined is None
    # fewer than MIN_PEERS of its failed runs where a contrast exists: kept, but marked
    runs, scored, found, t = population(ok_showing=8, ordering=4)
    like_with_like(scored, runs, t)
    assert found.kept and "serve kinds of request no run of which succeeded" in found.confined


def test_a_candidate_whose_kind_has_no_successes_is_not_rescued_and_says_so():
    runs, _, _, t = _kind_population(ok_order_showing=0)
    failed = [r.trace_id for r in runs if r.success is False]
    succeeded = [r.trace_id for r in runs if r.success is True]
    showing = [r.trace_id for r in runs if r.trace_id.startswith("fr")] + succeeded[10:30]
    findings = [_f("invalid_invocation:get_obs._count", x, 1) for x in showing]
    scored = [score(c, failed, succeeded, t) for c in candidates_from_findings(findings)]
    count = next(s for s in scored if s.candidate.key == "invalid_invocation:get_obs._count")
    assert not count.kept  # pooled: 10/20 failed vs 20/60 successful
    like_with_like(scored, runs, t)
    assert not count.kept and count.why.endswith("have 0 successful runs, under 5: no contrast "
                                                 "within them")  # fmt: skip
    assert "glucose" in count.why
