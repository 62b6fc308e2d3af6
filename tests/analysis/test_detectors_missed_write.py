"""missed_write: a write every successful run of the same request kind makes, never made.

Small hand-built runs (the `RunBuilder` of test_detectors.py), the opt-in registry entry, and
the tau2-bench development runs (skipped where ../shared/data is absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracegym.analysis.detector_names import BUILT_IN, MISSED_WRITE
from tracegym.analysis.detectors.missed_write import MissedWrite, turned_away
from tracegym.analysis.detectors.registry import DETECTORS, OPT_IN, default_detectors, make_detector
from tracegym.analysis.runs import Run
from tracegym.tests.analysis.test_detectors import RunBuilder

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
TAU2 = DATA / "tau2-retail-telecom"

EXCHANGE = "Hi, I want to exchange the {item} I got in order {order} for another colour."
STATUS = "Hello, what is the status of my order {order}? I have been waiting for {item}."


def shop(request: str, order: str, *, write: str | None, success: bool, hand_off: bool = False,
         failed_write: bool = False) -> Run:  # fmt: skip
    """One customer: asks, the agent reads the order, then writes, hands off or just answers."""
    b = RunBuilder(success=success)
    b.user(request.format(order=order, item="lamp"))
    b.tool("get_order_details", {"order_id": order}, {"order_id": order, "status": "delivered"})
    b.message("assistant", "I found your order.")
    b.user("Yes please go ahead.")
    if write is not None:
        b.tool(write, {"order_id": order}, None if failed_write else {"ok": True},
               error="PolicyError" if failed_write else None)  # fmt: skip
    if hand_off:
        b.tool("transfer_to_human_agents", {"summary": "customer"}, {"ok": True})
    b.message("assistant", "Is there anything else?")
    b.user("No, thanks.")
    b.message("assistant", "Goodbye!")
    return b.build()


def fitted(*runs: Run) -> MissedWrite:
    """Fitted as `analyze` fits it: on the population with the runs it then reads (a request
    kind is the kind of a fitted run)."""
    return MissedWrite().fit([*population(), *runs])


def population() -> list[Run]:
    runs = [shop(EXCHANGE, f"W{n}", write="exchange_items", success=True) for n in range(4)]
    runs += [shop(STATUS, f"W{n}", write=None, success=True) for n in range(10, 14)]
    return runs


def test_a_run_asked_what_successful_runs_always_write_for_and_never_writing_is_flagged() -> None:
    run = shop(EXCHANGE, "W99", write=None, success=False, hand_off=True)
    detector = fitted(run)
    assert [(r.tool, r.runs, r.share) for r in detector.rules_] == [("exchange_items", 4, 1.0)]
    [finding] = detector.detect(run)
    assert finding.key == "missed_write:exchange_items" and finding.detector == MISSED_WRITE
    # a run it was not fitted on (a streamed analysis fits on a sample) has its request's kind
    [unfitted] = MissedWrite().fit(population()).detect(run)
    assert (unfitted.key, unfitted.position) == (finding.key, finding.position)
    # decisive: the hand-off right after the last read, not the goodbye at the end
    hand_off = next(s for s in run.steps if s.tool == "transfer_to_human_agents")
    read = next(s for s in run.steps if s.tool == "get_order_details")
    assert finding.position == hand_off.position != run.steps[-1].position
    assert finding.span_ids[:2] == (hand_off.span_id, read.span_id)
    rule = finding.details["mined_rule"]
    assert rule["detector"] == MISSED_WRITE and rule["kind"] == "request"
    assert rule["tool"] == "exchange_items" and rule["support"] == 4
    assert len(rule["evidence_runs"]) == 4 and finding.details["other_writes"] == [
        "transfer_to_human_agents"
    ]
    json.dumps(finding.to_dict())


def test_the_decisive_step_is_the_reply_after_the_last_read_when_nothing_was_called() -> None:
    run = shop(EXCHANGE, "W98", write=None, success=False)
    [finding] = fitted(run).detect(run)
    reply = run.steps[run.steps.index(next(s for s in run.steps if s.tool)) + 1]
    assert reply.role == "assistant" and finding.position == reply.position
    assert turned_away(run) == (reply, next(s for s in run.steps if s.tool))


def test_a_failed_write_does_not_count_as_made_but_is_kept_as_evidence() -> None:
    run = shop(EXCHANGE, "W97", write="exchange_items", success=False, failed_write=True)
    [finding] = fitted(run).detect(run)
    attempt = next(s for s in run.steps if s.tool == "exchange_items")
    assert finding.details["attempted"] == 1 and finding.span_ids[-1] == attempt.span_id
    # the failed write is the turn: the first action after the last read
    assert finding.position == attempt.position


def test_quiet_where_the_write_was_made_or_the_request_kind_asks_for_none() -> None:
    made = shop(EXCHANGE, "W96", write="exchange_items", success=False)
    asked_none = shop(STATUS, "W95", write=None, success=False)
    detector = fitted(made, asked_none)
    assert detector.detect(made) == [] and detector.detect(asked_none) == []
    # a kind whose successful runs do not agree on a write learns no rule
    mixed = population()[:2] + [shop(EXCHANGE, f"W{n}", write=None, success=True)
                                for n in range(20, 23)]  # fmt: skip
    assert MissedWrite().fit(mixed).rules_ == []
    # too few successful runs of the kind
    assert MissedWrite(min_support=5).fit(population()).rules_ == []
    assert MissedWrite().fit([]).detect(shop(EXCHANGE, "W94", write=None, success=False)) == []


def test_labels_are_not_read_only_outcomes() -> None:
    """The same runs with other labels learn the same rules."""
    runs = population()
    for run in runs:
        run.labels = {"task_id": "secret", "expected": "exchange_items"}
    again = MissedWrite().fit(runs)
    assert [r.tool for r in again.rules_] == [
        r.tool for r in MissedWrite().fit(population()).rules_
    ]


def test_opt_in_not_default() -> None:
    assert MISSED_WRITE in OPT_IN and MISSED_WRITE not in DETECTORS
    assert MISSED_WRITE not in BUILT_IN
    assert all(d.name != MISSED_WRITE for d in default_detectors())
    assert isinstance(make_detector(MISSED_WRITE, distance=0.5), MissedWrite)


@pytest.mark.slow
@pytest.mark.skipif(not TAU2.is_dir(), reason=f"real runs absent: {TAU2}")
def test_tau2_retail_findings_are_expected_writes_never_made(tmp_path: Path) -> None:
    """On tau2-bench retail (development data), every finding names an expected write the run did
    not match, and no successful run is flagged (docs/detectors.md)."""
    from tracegym.analysis.runs import load_runs
    from tracegym.store.importers import import_path
    from tracegym.store.store import Store

    import_path("tau2-bench", TAU2, tmp_path)
    with Store(tmp_path) as store:
        runs = [r for r in load_runs(store) if _source(r, "domain") == "retail"]
    detector = MissedWrite().fit(runs)
    assert not any(detector.detect(r) for r in runs if r.success is True)
    found = [(r, f) for r in runs if r.success is False for f in detector.detect(r)]
    assert len(found) >= 2
    for run, finding in found:
        info = _source(run, "reward_info")
        info = json.loads(info) if isinstance(info, str) else info
        unmatched = {c["action"]["name"] for c in info["action_checks"] if not c["action_match"]}
        assert finding.details["tool"] in unmatched


def _source(run: Run, name: str):
    return run.root.attributes.get(f"tracegym.source.{name}") if run.root is not None else None
