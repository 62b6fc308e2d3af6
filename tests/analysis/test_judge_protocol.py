"""TRACE's protocol in the optional LLM judge (analysis/judge.py), against local stub servers: N
independent labellers (their own seed and capability order), a capability kept only when K of N
labellings pass coverage and delta; a labeller that lies (always LACKING, or labels that follow
the outcome and not the run), one that times out and one that answers off the schema are
outvoted or skipped, never trusted alone; the plan (calls, tokens) comes before any call, and
`--judge-budget`, the question and `--yes` decide whether any is made."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

from tracegym.analysis.gap_selection import Thresholds, score
from tracegym.analysis.judge import (
    CHARS_PER_TOKEN,
    JUDGE,
    MAX_CAPABILITIES,
    JudgeConfig,
    Judged,
    JudgeNotStarted,
    JudgePlan,
    Label,
    OpenAICompatibleJudge,
    ProposedCapability,
    judge_candidates,
    judge_hook,
    judge_runs,
    plan,
    vote,
)
from tracegym.analysis.runs import Run
from tracegym.tests.analysis import test_judge as base
from tracegym.tests.analysis.test_judge import PROPOSED, _answer, _run, chat, listed
from tracegym.tests.fixtures.hash_embedder import HashEmbedder

stub = base.stub  # the fixture: a scripted chat-completions server on 127.0.0.1

LOOKUP, POLICY = (c["name"] for c in PROPOSED["capabilities"])


def _runs() -> list[Run]:
    """10 failed runs (the first 6 cancel without a lookup), 10 successful ones, 1 unjudged."""
    failed = [_run(f"f{i}", False, "cancel my order" if i < 6 else "change my seat")
              for i in range(10)]  # fmt: skip
    succeeded = [_run(f"s{i}", True, "change my seat") for i in range(10)]
    return failed + succeeded + [_run("u0", None, "cancel my order")]


CANCELLED = {f"f{i}" for i in range(6)}


def truthful(run: dict[str, Any]) -> list[str]:
    """LACKING the lookup where the run cancelled without one; nothing else."""
    return [LOOKUP] if "cancel" in run["request"] else []


def _judge(url: str, **kw: Any) -> OpenAICompatibleJudge:
    return OpenAICompatibleJudge(url, "m", timeout_s=kw.pop("timeout_s", 2), **kw)


def _verdicts(judged: Judged) -> dict[str, Any]:
    return {v.capability.name: v for v in judged.verdicts}


def test_a_good_judge_is_kept_when_its_labellers_agree(stub):
    s = stub(_answer(truthful))
    judged = judge_runs(_judge(s.url), _runs())
    assert judged.error is None and not judged.skipped
    lookup, policy = _verdicts(judged)[LOOKUP], _verdicts(judged)[POLICY]
    assert lookup.kept and lookup.passed == 3 and lookup.lacking == CANCELLED
    assert [(x.coverage, x.delta, x.failed) for x in lookup.scores] == [(0.6, 0.6, 10)] * 3
    assert not policy.kept and policy.passed == 0  # nobody lacks it
    (candidate,) = judge_candidates(judged, _runs())
    assert candidate.key == f"{JUDGE}:{LOOKUP}" and candidate.lacking == CANCELLED
    assert "at least 2 of 3 judge labellers" in candidate.findings[0].message
    assert len(s.requests) == 1 + 3 * 20  # the unjudged run is not sent


def test_labellers_are_independent_calls_with_their_own_seed_and_order(stub):
    proposed = {"capabilities": [{"name": f"capability_{i}", "description": f"does {i}"}
                                 for i in range(8)]}  # fmt: skip
    s = stub(_answer(lambda run: [], proposed))
    judge_runs(_judge(s.url, label_temperature=0.5), _runs()[:2],
               JudgeConfig(labellers=4, agree=2, seed=7))  # fmt: skip
    labelling = s.requests[1:]
    assert sorted(r["seed"] for r in labelling) == [7, 7, 8, 8, 9, 9, 10, 10]
    assert {r["temperature"] for r in labelling} == {0.5}
    orders = {r["seed"]: tuple(listed(r["messages"][0]["content"])) for r in labelling}
    names = tuple(c["name"] for c in proposed["capabilities"])
    assert orders[7] == names  # the first labeller keeps the proposed order
    assert (
        all(sorted(o) == sorted(names) for o in orders.values()) and len(set(orders.values())) > 1
    )


def test_a_labeller_that_always_says_lacking_is_outvoted(stub):
    everything = [LOOKUP, POLICY]
    s = stub(_answer(lambda run, seed: everything if seed == 2 else truthful(run)))
    judged = judge_runs(_judge(s.url), _runs())
    lookup, policy = _verdicts(judged)[LOOKUP], _verdicts(judged)[POLICY]
    assert [x.passed for x in lookup.scores] == [True, True, False]  # the liar: delta 0
    assert lookup.scores[2].coverage == 1.0 and lookup.scores[2].delta == 0.0
    assert lookup.kept and lookup.lacking == CANCELLED  # its extra vote moves no run over 2
    assert not policy.kept and policy.lacking == frozenset()
    # all three must pass: the liar's labelling now blocks the capability
    strict = judge_runs(_judge(s.url), _runs(), JudgeConfig(agree=3))
    assert not _verdicts(strict)[LOOKUP].kept and judge_candidates(strict, _runs()) == []


def test_labels_that_follow_the_outcome_not_the_run_are_not_kept_alone(stub):
    """Labeller 1 says every failed run lacks respecting the policy (no run shows anything of
    the kind): a perfect contrast in one labelling, not confirmed by the others."""
    s = stub(_answer(truthful))
    runs = _runs()
    failed = {r.trace_id for r in runs if r.success is False}

    class Liar(OpenAICompatibleJudge):  # the stub cannot see outcomes: the test tells it
        def label(self, run, capabilities, labeller):  # type: ignore[no-untyped-def]
            said = super().label(run, capabilities, labeller)
            if labeller.index == 1 and run.trace_id in failed:
                said[POLICY] = Label.LACKING
            return said

    judged = judge_runs(Liar(s.url, "m", timeout_s=2), runs)
    policy = _verdicts(judged)[POLICY]
    assert [x.passed for x in policy.scores] == [False, True, False]
    assert policy.scores[1].coverage == 1.0 and policy.scores[1].delta == 1.0
    assert not policy.kept and f"{JUDGE}:{POLICY}" not in {
        c.key for c in judge_candidates(judged, runs)}  # fmt: skip
    assert _verdicts(judged)[LOOKUP].kept
    # one labeller trusted alone (K = 1) would have kept it: the vote is what stops it
    alone = judge_runs(Liar(s.url, "m", timeout_s=2), runs, JudgeConfig(agree=1))
    assert _verdicts(alone)[POLICY].kept


def test_a_labeller_that_times_out_is_counted_and_the_others_decide(stub):
    answer, never = _answer(truthful), threading.Event()

    def silent_third(body: dict[str, Any]) -> tuple[int, str]:
        if body.get("seed") == 2:
            never.wait(10)  # answers only after the client gave up (set when the test ends)
        return answer(body)

    s = stub(silent_third)
    runs = _runs()
    try:
        judged = judge_runs(_judge(s.url, timeout_s=1), runs, JudgeConfig(workers=20))
        strict = judge_runs(_judge(s.url, timeout_s=1), runs, JudgeConfig(agree=3, workers=20))
    finally:
        never.set()
    assert {x.labeller for x in judged.skipped} == {2} and len(judged.skipped) == 20
    assert all("within 1 s" in x.why for x in judged.skipped)
    assert sorted(judged.labels) == [0, 1]
    lookup = _verdicts(judged)[LOOKUP]
    assert lookup.kept and lookup.scores[2].failed == 0 and not lookup.scores[2].passed
    assert not _verdicts(strict)[LOOKUP].kept  # a silent labeller cannot agree


def test_a_labeller_off_the_schema_is_skipped_not_read(stub):
    answer = _answer(truthful)

    def off_schema(body: dict[str, Any]) -> tuple[int, str]:
        if body.get("seed") == 0:  # a label outside the three, and a capability left out
            return chat(json.dumps({"labels": {LOOKUP: "LACKING", POLICY: "SOMETIMES"}}))
        if body.get("seed") == 1:
            return chat(json.dumps({"labels": {LOOKUP: "LACKING"}}))
        return answer(body)

    s = stub(off_schema)
    judged = judge_runs(_judge(s.url), _runs())
    assert {x.labeller for x in judged.skipped} == {0, 1} and len(judged.skipped) == 40
    whys = {x.labeller: x.why for x in judged.skipped}
    assert "'SOMETIMES' of respect_policy is not NA" in whys[0]
    assert "leaves out capabilities: respect_policy" in whys[1]
    assert sorted(judged.labels) == [2]
    assert not judged.kept  # one labelling left: never K = 2


@pytest.mark.parametrize(
    "content",
    ['{"capabilities": "look_up_before_acting"}', "I think the agent lacks care.",
     '{"capabilities": [{"name": "x", "description": ""}]}'],
)  # fmt: skip
def test_a_proposal_off_the_schema_leaves_no_candidates(stub, content: str):
    s = stub(lambda body: chat(content))
    judged = judge_runs(_judge(s.url), _runs())
    assert judged.error is not None and judged.error.startswith("propose: ")
    assert judge_candidates(judged, _runs()) == [] and len(s.requests) == 1


def test_at_most_ten_capabilities_are_proposed(stub):
    proposed = {"capabilities": [{"name": f"c_{i}", "description": "d"} for i in range(14)]}
    s = stub(_answer(lambda run: [], proposed))
    judged = judge_runs(_judge(s.url), _runs()[:1])
    assert MAX_CAPABILITIES == 10 and [c.name for c in judged.capabilities] == [
        f"c_{i}" for i in range(10)]  # fmt: skip
    assert len(listed(s.requests[1]["messages"][0]["content"])) == 10


def test_the_vote_counts_na_and_present_as_not_lacking():
    runs = [_run(f"f{i}", False, "r") for i in range(4)] + [_run(f"s{i}", True, "r")
                                                           for i in range(4)]  # fmt: skip
    capability = ProposedCapability("c", "d")
    lacking, present, na = Label.LACKING, Label.PRESENT, Label.NA
    labels = {
        0: {"f0": lacking, "f1": na, "f2": present, "f3": na, "s0": na, "s1": present,
            "s2": present, "s3": present},  # coverage 1/4, delta 0.25: passes
        1: {"f0": lacking, "f1": lacking, "f2": na, "s0": lacking, "s1": na},  # f3, s2-3 skipped
    }  # fmt: skip
    labels = {i: {t: {"c": v} for t, v in by_run.items()} for i, by_run in labels.items()}
    (verdict,) = vote([capability], labels, runs, JudgeConfig(labellers=3, agree=2))
    first, second, third = verdict.scores
    assert (first.coverage, first.delta, first.passed) == (0.25, 0.25, True)
    assert (second.coverage, second.failed) == (pytest.approx(2 / 3), 3)
    assert second.delta == pytest.approx(2 / 3 - 1 / 2) and not second.passed  # 0.17 < 0.20
    assert third.failed == 0 and not third.passed  # labelled nothing
    assert not verdict.kept and verdict.lacking == {"f0"}  # f0: two LACKING votes
    assert "not kept, 1 of 3 labellers pass (needs 2)" in verdict.why()


def test_kept_by_the_vote_yet_scored_on_the_runs_the_labellers_agree_on():
    """Each labeller passes, on different runs: the capability is kept by the vote, and its
    candidate lacks only the runs K labellers labelled LACKING, so analysis rejects it."""
    runs = _runs()
    capability = ProposedCapability("c", "d")
    labels = {i: {r.trace_id: {"c": Label.LACKING if r.trace_id in {f"f{2 * i}", f"f{2 * i + 1}"}
                               else Label.PRESENT} for r in runs if r.success is not None}
              for i in range(3)}  # fmt: skip
    (verdict,) = vote([capability], labels, runs, JudgeConfig())
    assert verdict.kept and verdict.passed == 3 and verdict.lacking == frozenset()
    judged = Judged(capabilities=[capability], labels=labels, verdicts=[verdict])
    (candidate,) = judge_candidates(judged, runs)
    failed = [r.trace_id for r in runs if r.success is False]
    succeeded = [r.trace_id for r in runs if r.success is True]
    assert not score(candidate, failed, succeeded, Thresholds()).kept


def test_the_config_is_checked():
    with pytest.raises(ValueError, match=r"agree must be 1\.\.3"):
        JudgeConfig(agree=4)
    with pytest.raises(ValueError, match="labellers must be"):
        JudgeConfig(labellers=0)
    assert [x.seed for x in JudgeConfig(labellers=2, agree=1, seed=5).labeller_list()] == [5, 6]


def test_the_plan_counts_every_call_and_over_estimates_the_prompts(stub):
    s = stub(_answer(truthful))
    runs = _runs()
    estimate = plan(runs, JudgeConfig())
    assert (estimate.failed_shown, estimate.runs, estimate.labellers) == (10, 20, 3)
    assert (
        estimate.calls == 61 and estimate.tokens == estimate.prompt_tokens + estimate.reply_tokens
    )
    seen: list[JudgePlan] = []
    judged = judge_runs(_judge(s.url), runs, approve=lambda p: seen.append(p) or None)
    assert seen == [estimate] and judged.plan == estimate and len(s.requests) == estimate.calls
    sent = sum(len(m["content"]) for r in s.requests for m in r["messages"])
    assert estimate.prompt_tokens >= sent / CHARS_PER_TOKEN  # 10 capabilities of 200 characters
    assert "judge: 61 calls (1 to propose from 10 failed runs, 3 labellers x 20 runs)" in (
        estimate.describe())  # fmt: skip


def test_a_refusal_before_the_first_call_sends_nothing(stub):
    s = stub(_answer(truthful))

    def refuse(p: JudgePlan) -> None:
        raise JudgeNotStarted(f"{p.tokens} is too many")

    with pytest.raises(JudgeNotStarted, match="too many"):
        judge_runs(_judge(s.url), _runs(), approve=refuse)
    assert s.requests == []


def test_the_servers_token_counts_are_added_up(stub):
    answer = _answer(truthful)

    def counted(body: dict[str, Any]) -> tuple[int, str]:
        status, reply = answer(body)
        data = json.loads(reply) | {"usage": {"total_tokens": 100}}
        return status, json.dumps(data)

    s = stub(counted)
    assert judge_runs(_judge(s.url), _runs()).tokens_spent == 100 * 61


# Through analyze and the command ---------------------------------------------------------------
def _seat_home(tmp_path: Path) -> dict[str, set[str]]:
    from tracegym.tests.fixtures.seat_agent import write_seat_agent

    return write_seat_agent(tmp_path, failed=13)


def _seat_truthful(run: dict[str, Any]) -> list[str]:
    failed_seat = any(c["tool"] == "change_seat" and c["error"] for c in run["tool_calls"])
    return [LOOKUP] if failed_seat else []


def test_a_judge_that_times_out_leaves_the_detectors_gaps(stub, tmp_path: Path):
    from tracegym.analysis.pipeline import analyze

    _seat_home(tmp_path)
    s = stub(lambda body: time.sleep(1.0) or chat(json.dumps(PROPOSED)))
    report = Judged()
    hook = judge_hook(_judge(s.url, timeout_s=0.3), report)
    result = analyze(tmp_path, embedder=HashEmbedder(tmp_path / "cache"), write=False,
                     extra_candidates=hook)  # fmt: skip
    assert report.error is not None and "within 0.3 s" in report.error
    assert result.gaps and all(g.detector != JUDGE for g in result.gaps)
    assert len(s.requests) == 1


def _cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, *extra: str,
         stdin: str | None = None) -> Any:  # fmt: skip
    from tracegym.cli import app
    from typer.testing import CliRunner

    monkeypatch.setattr("tracegym.analysis.pipeline.Embedder", HashEmbedder)
    args = ["--home", str(tmp_path), "analyze", "--judge-url", url, "--judge-model", "m", *extra]
    return CliRunner().invoke(app, args, input=stdin)


def test_the_budget_refuses_to_start_above_the_estimate(stub, tmp_path, monkeypatch):
    _seat_home(tmp_path)
    s = stub(_answer(_seat_truthful))
    refused = _cli(tmp_path, monkeypatch, s.url, "--judge-budget", "1000")
    assert refused.exit_code == 2
    assert "judge: 118 calls" in refused.output and "over --judge-budget 1,000" in refused.output
    assert s.requests == [] and not (tmp_path / "gaps.json").exists()
    done = _cli(tmp_path, monkeypatch, s.url, "--judge-budget", "100000000")
    assert done.exit_code == 0, done.output
    assert (
        f"kept (>= 2 of 3 labellings pass): {LOOKUP}; not kept: {POLICY} (0 of 3);" in done.output
    )
    assert len(s.requests) == 118


def test_on_a_terminal_it_asks_and_yes_does_not(stub, tmp_path, monkeypatch):
    _seat_home(tmp_path)
    s = stub(_answer(_seat_truthful))
    monkeypatch.setattr("tracegym.analysis.commands._interactive", lambda: True)
    declined = _cli(tmp_path, monkeypatch, s.url, stdin="n\n")
    assert declined.exit_code == 2 and "Send them?" in declined.output
    assert "judge not started: declined" in declined.output and s.requests == []
    yes = _cli(tmp_path, monkeypatch, s.url, "--yes", "--judge-labellers", "2",
               "--judge-agree", "2")  # fmt: skip
    assert yes.exit_code == 0, yes.output
    assert "Send them?" not in yes.output and "judge: 79 calls" in yes.output
    assert f"pass): {LOOKUP}; not kept: {POLICY} (0 of 2); 78 labellings, 0 skipped" in yes.output
    gaps = json.loads((tmp_path / "gaps.json").read_text())["gaps"]
    assert any(g["detector"] != JUDGE for g in gaps)  # the detectors' gaps, beside the judge's
