"""Detectors: each on small hand-built runs (positive and negative cases), precedence mining,
provenance following, the registry, and end to end on the demo agent (its runs fail for known,
injected reasons) and the AgentRx tau-retail runs (skipped where ../shared/data is absent)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from collections import Counter
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracegym.analysis.detectors.amounts import WrongAmount
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.budget import BudgetWaste
from tracegym.analysis.detectors.invalid import InvalidInvocation, infer_schema
from tracegym.analysis.detectors.memory import PoisonedMemory
from tracegym.analysis.detectors.premature import PrematureFinish
from tracegym.analysis.detectors.registry import DETECTORS, default_detectors, make_detector
from tracegym.analysis.detectors.tool_order import WrongToolOrder, mine_rules
from tracegym.analysis.detectors.ungrounded import (
    UngroundedArgument,
    normalize,
    significant_tokens,
    tokens,
)
from tracegym.analysis.runs import ROLE, Run, Step, load_runs
from tracegym.tracer import semconv as sc

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AGENTRX = DATA / "agentrx-tau-retail" / "tau_dataset_full.json"
_ids = count()


# A terse builder for hand-made runs ---------------------------------------------------------------
class RunBuilder:
    """Steps in run order under one root span; each method appends a step and returns it."""

    def __init__(self, task: str = "", *, success: bool | None = True, agent: str = "bot"):
        self.trace_id = f"t{next(_ids)}"
        self.success = success
        self.agent = agent
        self.steps: list[Step] = []
        self.subtask: str | None = None
        self.root = self._add("invoke_agent bot", sc.OP_AGENT, input=task, parent=None)

    def _add(self, name: str, operation: str | None, parent: Any = "root", **fields: Any) -> Step:
        position = len(self.steps)
        attributes = fields.pop("attributes", {})
        step = Step(
            position=position,
            trace_id=self.trace_id,
            span_id=f"{self.trace_id}.{position}",
            parent_span_id=None if parent is None else f"{self.trace_id}.0",
            name=name,
            operation=operation,
            agent=self.agent,
            step_index=position - 1 if parent is not None else None,
            tool=fields.get("tool"),
            call_id=None,
            input=fields.get("input"),
            output=fields.get("output"),
            status="ERROR" if fields.get("error") else "UNSET",
            error_type=fields.get("error"),
            start_ns=position,
            end_ns=position,
            duration_ms=0.0,
            input_tokens=fields.get("input_tokens"),
            output_tokens=fields.get("output_tokens"),
            memory_store=fields.get("store"),
            memory_record=fields.get("record"),
            memory_content_hash=fields.get("content_hash"),
            memory_result_hashes=list(fields.get("result_hashes", [])),
            subtask=self.subtask if parent is not None else None,
            attributes=attributes,
            source_write_span_ids=list(fields.get("sources", [])),
        )
        self.steps.append(step)
        return step

    def message(self, role: str, text: str) -> Step:
        return self._add(f"step {role}", sc.OP_STEP, input=text, attributes={ROLE: role})

    def user(self, text: str) -> Step:
        return self.message("user", text)

    def system(self, text: str) -> Step:
        return self.message("system", text)

    def llm(self, output: Any = "", messages: list[dict[str, Any]] | None = None, tokens=10):
        text = output if isinstance(output, str) else json.dumps(output)
        return self._add("chat m", sc.OP_CHAT, input=json.dumps(messages or []), output=text,
                         input_tokens=tokens, output_tokens=0)  # fmt: skip

    def tool(self, name: str, args: Any = None, result: Any = None, error: str | None = None):
        return self._add(
            f"execute_tool {name}", sc.OP_TOOL, tool=name,
            input=args if isinstance(args, str) else json.dumps(args or {}),
            output=None if result is None else
            (result if isinstance(result, str) else json.dumps(result)),
            error=error,
        )  # fmt: skip

    def write(self, record: str, content: str, store: str = "notes") -> Step:
        digest = hashlib.sha256(content.encode()).hexdigest()[:32]
        return self._add(f"update_memory {store}", sc.OP_MEMORY_UPDATE, output=content,
                         store=store, record=record, content_hash=digest,
                         attributes={sc.MEMORY_CONTENT: content})  # fmt: skip

    def read(self, query: str, content: str, sources: list[Step], store: str = "notes"):
        hashes = [s.memory_content_hash for s in sources]
        return self._add(f"search_memory {store}", sc.OP_MEMORY_SEARCH, input=query,
                         output=content, store=store, result_hashes=hashes,
                         sources=[s.span_id for s in sources])  # fmt: skip

    def start_subtask(self, name: str, **attributes: Any) -> Step:
        self.subtask = None
        span = self._add(f"subtask {name}", sc.OP_SUBTASK,
                         attributes={sc.SUBTASK_NAME: name, **attributes})  # fmt: skip
        self.subtask = name
        return span

    def build(self) -> Run:
        return Run(
            trace_id=self.trace_id, run_id=self.trace_id, agent=self.agent,
            success=self.success, reward=None, labels={}, source="test", steps=self.steps,
        )  # fmt: skip


def shop_run(*, success: bool = True, order: str = "A-1001", lookup_first: bool = True) -> Run:
    """A lookup-then-act run over a tiny shop: get_order before refund_order, then a reply."""
    b = RunBuilder(f"refund order {order}", success=success)
    b.user(f"Please refund order {order}.")
    if lookup_first:
        b.tool("get_order", {"order_id": order}, {"order_id": order, "status": "delivered"})
    b.tool("refund_order", {"order_id": order}, {"ok": True})
    b.tool("reply", {"text": "done"}, {"sent": True})
    return b.build()


def keys(findings: list[Finding]) -> list[str]:
    return [f.key for f in findings]


# Value normalisation ------------------------------------------------------------------------------
def test_normalisation_of_values() -> None:
    assert normalize("  Hello\n  World ") == "hello world"
    assert tokens("$1,299.50 and 99.0 and 007") == ("1299.5", "and", "99", "and", "7")
    assert significant_tokens("ORD-1017") == ("ord-1017",)
    assert significant_tokens("5") == ()  # tiny integers are never checked
    assert significant_tokens("250") == ("250",)
    assert significant_tokens("ab") == ()
    # the agent's own phrasing is not checked, ids and amounts in text are
    assert significant_tokens("best webcam under 100") == ()
    assert significant_tokens("Refund of $99.0 for ORD-1005 is done, thanks") == ("99", "ord-1005")
    assert significant_tokens("Fatima Johnson") == ("fatima", "johnson")


# UngroundedArgument -------------------------------------------------------------------------------
def test_the_run_input_is_evidence_only_in_a_run_without_user_messages() -> None:
    """An imported benchmark run's input can be what a simulated user was told (tau-bench: its
    hidden instruction), not what it said: where the run has user messages, only they count."""
    b = RunBuilder("You are Ann. Your order is ORD-5555; you want it cancelled.", success=False)
    b.user("Hi, please cancel my order.")
    call = b.tool("cancel_order", {"order_id": "ORD-5555"}, {"ok": True})
    [finding] = UngroundedArgument().detect(b.build())
    assert finding.position == call.position and finding.details["kind"] == "invented"
    told = RunBuilder("cancel order ORD-5555")  # the input is the request: no user message
    told.tool("cancel_order", {"order_id": "ORD-5555"}, {"ok": True})
    assert UngroundedArgument().detect(told.build()) == []


def test_a_word_in_another_inflection_is_not_invented() -> None:
    """The user wrote "MMS messages", the agent checks the "messaging" app: the same word."""
    b = RunBuilder("", success=False)
    b.user("I can't send MMS messages.")
    b.tool("check_app_permissions", {"app_name": "messaging"}, {"sms": True})
    call = b.tool("check_app_permissions", {"app_name": "streaming"}, {"sms": True})
    [finding] = UngroundedArgument().detect(b.build())
    assert finding.position == call.position and finding.details["value"] == "streaming"


def test_invented_id_is_flagged_with_its_consequences() -> None:
    b = RunBuilder("help the customer", success=False)
    b.user("I want a refund for my headphones.")
    origin = b.llm({"call": "get_order", "order_id": "ORD-9093"})
    call = b.tool("get_order", {"order_id": "ORD-9093"}, error="OrderNotFound")
    later = b.tool("refund_order", {"order_id": "ord-9093"}, error="OrderNotFound")
    run = b.build()
    [finding] = UngroundedArgument().detect(run)
    assert finding.detector == "ungrounded_argument"
    assert finding.key == "ungrounded_argument:get_order.order_id"
    assert (finding.position, finding.step_index, finding.agent) == (call.position, 2, "bot")
    assert finding.span_ids == (call.span_id, origin.span_id, later.span_id)
    assert finding.details["kind"] == "invented"
    assert finding.details["origin_position"] == origin.position
    assert [d["position"] for d in finding.details["downstream"]] == [later.position]
    assert finding.confidence == 0.9


@pytest.mark.parametrize(
    "source",
    ["user", "system", "tool_result", "memory_read", "run_input", "chat_input"],
)
def test_values_grounded_in_earlier_evidence_are_not_flagged(source: str) -> None:
    b = RunBuilder("Order W-5199551 for $1,299.50" if source == "run_input" else "a task")
    if source == "user":
        b.user("my order is w-5199551, it cost 1299.5 dollars")
    elif source == "system":
        b.system("Known order: W-5199551 (1,299.50)")
    elif source == "tool_result":
        b.tool("list_orders", {}, [{"order_id": "W-5199551", "total": 1299.50}])
    elif source == "memory_read":
        note = RunBuilder().write("last_order", "W-5199551 1299.5")
        b.read("last order", "W-5199551 costs 1299.50", [note])
    elif source == "chat_input":
        b.llm("ok", messages=[{"role": "user", "content": "order W-5199551, total 1299.50"}])
    b.tool("refund", {"order_id": "W-5199551", "amount": 1299.5, "quantity": 2})
    assert UngroundedArgument().detect(b.build()) == []


def test_evidence_must_come_before_the_call_and_not_from_the_agent() -> None:
    b = RunBuilder("a task")
    b.llm("I will use order W-777 and the total 45.25")  # the agent's own words: no evidence
    b.tool("refund", {"order_id": "W-777", "amount": 45.25})
    b.user("yes, W-777, 45.25")  # too late
    run = b.build()
    assert keys(UngroundedArgument().detect(run)) == ["ungrounded_argument:refund.order_id"]
    # a write's amount is wrong_amount's to judge (with arithmetic), not reported twice
    assert keys(WrongAmount().detect(run)) == ["wrong_amount:refund.amount"]


def test_ids_in_another_format_are_grounded() -> None:
    b = RunBuilder("a task")
    b.user("The order ID is 9502126.")
    b.tool("get_order_details", {"order_id": "#W9502126"})
    assert UngroundedArgument().detect(b.build()) == []


def test_one_finding_per_key_with_the_other_values_in_details() -> None:
    b = RunBuilder("a task")
    b.tool("get_order", {"order_id": "X-1001"})
    b.tool("get_order", {"order_id": "X-1002"})
    [finding] = UngroundedArgument().detect(b.build())
    assert finding.details["values"] == ["X-1001", "X-1002"]


def _choice_run(item: str, success: bool = False) -> tuple[Run, Step]:
    b = RunBuilder(f"Hi, this is a@example.com. I'd like a refund for the {item} I bought.",
                   success=success)  # fmt: skip
    orders = [{"order_id": "ORD-1", "item": "webcam"}, {"order_id": "ORD-2", "item": "desk lamp"},
              {"order_id": "ORD-3", "item": "speaker"}]  # fmt: skip
    b.tool("find_user", {"email": "a@example.com"}, {"user_id": "U-1", "orders": orders})
    call = b.tool("get_order", {"order_id": "ORD-3"})  # the latest order, whatever was asked
    return b.build(), call


def test_unsupported_choice_is_an_early_wrong_assumption() -> None:
    run, call = _choice_run("webcam")
    [finding] = UngroundedArgument().detect(run)
    assert finding.key == "ungrounded_argument:choice:get_order.order_id"
    assert finding.position == call.position
    assert finding.details["kind"] == "unsupported_choice"
    assert finding.details["better_match"] == ["webcam"]
    assert finding.details["chosen"] == ["speaker"]
    assert finding.span_ids[-1] == run.steps[1].span_id  # the list it chose from
    assert finding.confidence == 0.6
    # the choice matches what was asked: nothing to flag; and the check can be switched off
    assert UngroundedArgument().detect(_choice_run("speaker")[0]) == []
    assert UngroundedArgument(choices=False).detect(run) == []


def test_a_choice_named_by_a_compound_of_short_codes_is_judged() -> None:
    # routes of two 3-letter codes: "OSL-BER" is one word of the request, not two short ones
    b = RunBuilder("Hi, this is pia@example.com. Please cancel my booking for the OSL-BER.")
    bookings = [{"id": "BG-51783", "route": "BOS-ORD"}, {"id": "BG-76595", "route": "OSL-BER"},
                {"id": "BG-54921", "route": "LHR-DUB"}]  # fmt: skip
    b.tool("search_passengers", {"email": "pia@example.com"}, {"bookings": bookings})
    b.tool("lookup_booking", {"id": "BG-54921"})  # the most recent, whatever was asked
    [finding] = UngroundedArgument().detect(b.build())
    assert finding.key == "ungrounded_argument:choice:lookup_booking.id"
    assert finding.details["better_match"] == ["osl-ber"]
    assert finding.details["chosen"] == ["lhr-dub"]


def test_vocabulary_learned_from_successful_runs() -> None:
    def run(success: bool) -> Run:
        b = RunBuilder("a task", success=success)
        b.tool("get_policy", {"topic": "refunds-2024"})
        return b.build()

    population = [run(True) for _ in range(3)] + [run(False)]
    detector = UngroundedArgument()
    assert keys(detector.detect(population[-1])) == ["ungrounded_argument:get_policy.topic"]
    detector.fit(population)
    assert detector.detect(population[-1]) == []
    assert UngroundedArgument(vocabulary_runs=4).fit(population).detect(population[-1])


# WrongToolOrder -----------------------------------------------------------------------------------
def test_precedence_rules_are_mined_from_successes() -> None:
    successes = [shop_run() for _ in range(5)]
    rules = {(r.before, r.after): r for r in mine_rules(successes, min_support=5)}
    assert set(rules) == {("get_order", "refund_order"), ("get_order", "reply"),
                          ("refund_order", "reply")}  # fmt: skip
    rule = rules["get_order", "refund_order"]
    assert (rule.support, rule.confidence, rule.prerequisite) == (5, 1.0, True)
    assert rule.key == "wrong_tool_order:get_order>refund_order"
    # below the support, no rule; one run in the other order breaks a rule of confidence 1.0
    assert mine_rules(successes[:4], min_support=5) == []
    reversed_run = RunBuilder()
    reversed_run.tool("refund_order")
    reversed_run.tool("get_order")
    reversed_run.tool("reply")
    mixed = [*successes, reversed_run.build()]
    assert ("get_order", "refund_order") not in {
        (r.before, r.after) for r in mine_rules(mixed, min_support=5)
    }
    relaxed = mine_rules(mixed, min_support=5, min_confidence=0.8)
    assert ("get_order", "refund_order") in {(r.before, r.after) for r in relaxed}


def test_wrong_tool_order_reversed_and_missing() -> None:
    population = [shop_run() for _ in range(5)]
    detector = WrongToolOrder().fit(population)
    # reversed: refund first, the lookup after
    b = RunBuilder("refund A-1", success=False)
    refund = b.tool("refund_order", {"order_id": "A-1"}, error="PreconditionFailed")
    lookup = b.tool("get_order", {"order_id": "A-1"})
    b.tool("reply", {"text": "done"})
    [finding] = detector.detect(b.build())
    assert finding.key == "wrong_tool_order:get_order>refund_order"
    assert finding.position == refund.position
    assert finding.span_ids == (refund.span_id, lookup.span_id)
    assert finding.details["missing"] is False and finding.confidence == 0.9
    # missing prerequisite mid-run
    missing = shop_run(success=False, lookup_first=False)
    [finding] = detector.detect(missing)
    assert finding.key == "wrong_tool_order:get_order>refund_order"
    assert finding.details["missing"] is True and finding.confidence == 0.7
    assert WrongToolOrder(flag_missing=False).fit(population).detect(missing) == []
    # the right order, and unfitted detectors, find nothing
    assert detector.detect(shop_run()) == []
    assert WrongToolOrder().detect(missing) == []


def test_missing_prerequisite_of_the_final_action_is_left_to_premature_finish() -> None:
    population = [shop_run() for _ in range(5)]
    b = RunBuilder("refund A-1", success=False)
    b.tool("reply", {"text": "done"})  # the final action, without any lookup
    run = b.build()
    assert WrongToolOrder().fit(population).detect(run) == []
    assert keys(PrematureFinish().fit(population).detect(run)) == [
        "premature_finish:get_order", "premature_finish:refund_order"]  # fmt: skip


# PoisonedMemory -----------------------------------------------------------------------------------
POLICY = {"window_days": 30, "exchange_days": 90}


def _writer(content: str, *, error: bool, success: bool = True) -> tuple[Run, Step]:
    b = RunBuilder("check the policy", success=success)
    b.tool("get_policy", {"topic": "refunds"}, None if error else POLICY,
           error="Timeout" if error else None)  # fmt: skip
    write = b.write("window_days", content)
    b.tool("reply", {"text": "noted"})
    return b.build(), write


def _reader(write: Step, content: str, *, use: bool = True) -> tuple[Run, Step, Step]:
    b = RunBuilder("refund A-1 delivered 60 days ago", success=False)
    read = b.read("window_days", content, [write])
    used = b.llm("refund it", messages=[{"role": "tool", "content": content if use else "-"}])
    b.tool("refund_order", {"order_id": "A-1"})
    return b.build(), read, used


def test_provenance_is_followed_from_a_read_to_an_errored_write_in_another_run() -> None:
    writer, write = _writer("90", error=True)
    reader, read, used = _reader(write, "90")
    detector = PoisonedMemory().fit([writer, reader])
    assert detector.detect(writer) == []  # nobody read it back in the writing run
    [finding] = detector.detect(reader)
    assert finding.key == "poisoned_memory:notes/window_days"
    assert finding.trace_id == reader.trace_id
    assert finding.position == read.position  # this run's decisive step: where the poison came in
    assert finding.span_ids[:3] == (read.span_id, write.span_id, used.span_id)
    assert finding.span_ids[3] == writer.steps[1].span_id  # the errored tool result
    assert finding.details["write"] == {"trace_id": writer.trace_id, "span_id": write.span_id,
                                        "position": write.position}  # fmt: skip
    assert finding.details["reasons"] == ["errored_source", "ungrounded"]  # "90": seen nowhere
    assert finding.details["used_at"] == used.position
    assert finding.confidence == 0.7
    # without fit, a read of another run's write cannot be followed
    assert PoisonedMemory().detect(reader) == []


def test_poisoned_memory_needs_a_suspect_write_and_a_use() -> None:
    writer, write = _writer("30", error=False)
    reader, _, _ = _reader(write, "30")
    assert PoisonedMemory().fit([writer, reader]).detect(reader) == []  # a clean note
    bad_writer, bad_write = _writer("90", error=True)
    unused, _, _ = _reader(bad_write, "90", use=False)
    assert PoisonedMemory().fit([bad_writer, unused]).detect(unused) == []  # read, never used


def test_same_run_write_is_the_decisive_step() -> None:
    b = RunBuilder("look up the customer", success=False)
    b.user("hi, I am carol")
    write = b.write("customer_id", "C-4242")  # an id nobody gave
    read = b.read("customer_id", "C-4242", [write])
    use = b.tool("get_customer", {"customer_id": "C-4242"})
    [finding] = PoisonedMemory().detect(b.build())
    assert finding.position == write.position
    assert finding.span_ids[:3] == (write.span_id, read.span_id, use.span_id)
    assert finding.details["reasons"] == ["ungrounded"]
    assert finding.confidence == 0.8


def test_contradicted_and_disputed_writes() -> None:
    # contradicted: the reading run later looks the value up and gets another one
    writer, write = _writer("90", error=False)
    b = RunBuilder("refund", success=False)
    read = b.read("window_days", "90", [write])
    b.llm("", messages=[{"role": "tool", "content": "90"}])
    check = b.tool("get_policy", {"topic": "refunds"}, {"window_days": 30})
    run = b.build()
    [finding] = PoisonedMemory().fit([writer, run]).detect(run)
    assert finding.details["reasons"] == ["contradicted"]
    assert check.span_id in finding.span_ids and finding.position == read.position
    # disputed: successful runs back another content of the same record far more
    good = [_writer("30", error=False) for _ in range(4)]
    bad_writer, bad_write = _writer("90", error=False)
    reader, read, _ = _reader(bad_write, "90")
    population = [*(r for r, _ in good), bad_writer, reader]
    [finding] = PoisonedMemory().fit(population).detect(reader)
    assert finding.details["reasons"] == ["disagrees_with_successful_runs"]
    assert finding.details["support"] == {"this": 1, "other": 4}
    assert PoisonedMemory(min_support=5).fit(population).detect(reader) == []


# BudgetWaste --------------------------------------------------------------------------------------
def test_loops_of_identical_calls() -> None:
    b = RunBuilder("a task", success=False)
    calls = [b.tool("search", {"q": "same"}) for _ in range(3)]
    b.tool("search", {"q": "other"})
    [finding] = BudgetWaste().detect(b.build())
    assert finding.key == "budget_waste:loop:search"
    assert finding.position == calls[1].position  # the first repeat
    assert finding.details["repeats"] == 3
    b = RunBuilder("a task")
    b.tool("search", {"q": "same"})
    b.tool("search", {"q": "same"})
    assert BudgetWaste().detect(b.build()) == []


def test_tool_overuse_against_successful_runs() -> None:
    def run(n: int, success: bool = True) -> Run:
        b = RunBuilder("a task", success=success)
        for i in range(n):
            b.tool("search", {"q": f"query {i}"})
        b.tool("reply", {"text": "ok"})
        return b.build()

    population = [run(1), run(1), run(2), run(1), run(7, success=False), run(3, success=False)]
    detector = BudgetWaste().fit(population)
    [finding] = detector.detect(population[4])
    assert finding.key == "budget_waste:tool:search"
    assert finding.position == population[4].steps[3].position  # the first call over the limit
    assert finding.details["calls"] == 7
    assert detector.detect(population[5]) == []  # 3 calls: within the limit + min_excess
    assert all(detector.detect(r) == [] for r in population[:4])


def test_exceeded_subtask_budget_and_out_of_steps() -> None:
    b = RunBuilder("a task", success=False)
    b.start_subtask("side task: browse 12", **{sc.BUDGET_STEPS: 2, sc.BUDGET_EXCEEDED: True})
    inside = [b.tool("search", {"q": f"q{i}"}) for i in range(4)]
    run = b.build()
    [finding] = BudgetWaste().detect(run)
    assert finding.key == "budget_waste:subtask:side task"
    assert finding.position == inside[2].position  # the first step past the budget
    assert finding.details["reasons"] == ["budget_exceeded"]
    assert finding.confidence == 0.8

    def turns(n: int, success: bool) -> Run:
        b = RunBuilder("a task", success=success)
        for _ in range(n):
            b.llm("thinking")
        return b.build()

    population = [turns(3, True), turns(4, True), turns(3, True)] + [
        turns(10, False) for _ in range(3)]  # fmt: skip
    detector = BudgetWaste().fit(population)
    [finding] = detector.detect(population[-1])
    assert finding.key == "budget_waste:out_of_steps"
    assert finding.position == population[-1].steps[5].position  # past the most successes used
    assert detector.detect(population[0]) == []


# InvalidInvocation --------------------------------------------------------------------------------
def test_schema_inference_and_violations() -> None:
    def run(args: Any, *, success: bool = True, error: str | None = None, tool: str = "get"):
        b = RunBuilder("a task", success=success)
        b.tool(tool, args, None if error else {"ok": True}, error=error)
        return b.build()

    population = [run({"order_id": f"A{i}", "verbose": True}) for i in range(2)]
    population += [run({"order_id": "A9"})]
    schema = infer_schema([r.steps[1] for r in population])
    assert schema.required == {"order_id"} and schema.allowed == {"order_id", "verbose"}
    detector = InvalidInvocation().fit(population)
    assert detector.detect(population[0]) == []
    bad = run({"order_id": 17, "colour": "red"}, success=False)
    assert keys(detector.detect(bad)) == [
        "invalid_invocation:get.colour", "invalid_invocation:get.order_id"]  # fmt: skip
    [missing] = detector.detect(run({"verbose": False}, success=False))
    assert missing.key == "invalid_invocation:get.order_id"
    assert missing.details["reasons"] == ["missing_argument"]
    unknown = run({}, success=False, error="NoSuchTool", tool="teleport")
    detector.fit([*population, unknown])
    [finding] = detector.detect(unknown)
    assert finding.key == "invalid_invocation:teleport"
    assert finding.details["reasons"] == ["error", "unknown_tool"]
    assert finding.details["error_types"] == ["NoSuchTool"]
    assert finding.confidence == 0.9


def test_a_failed_call_is_reported_with_its_error_text() -> None:
    b = RunBuilder("a task", success=False)
    b.tool("cancel", {"order_id": "A1"}, "Error: order A1 is delivered and cannot be cancelled",
           error="ToolError")  # fmt: skip
    b.tool("refund", {"order_id": "A1"}, error="Declined")  # no text: its error type
    messages = [f.message for f in InvalidInvocation().detect(b.build())]
    assert messages == ["cancel failed (Error: order A1 is delivered and cannot be cancelled)",
                        "refund failed (Declined)"]  # fmt: skip


def test_tool_errors_and_recovery() -> None:
    b = RunBuilder("a task", success=False)
    first = b.tool("find_user", {"email": "x@y.z"}, error="UserNotFound")
    b.tool("find_user", {"email": "x@y.com"}, {"user_id": "U1"})
    failed = b.tool("cancel", {"order_id": "A1"}, error="NotAllowed")
    run = b.build()
    [finding] = InvalidInvocation().detect(run)  # the recovered error is left out
    assert finding.key == "invalid_invocation:cancel"
    assert finding.position == failed.position and finding.details["reasons"] == ["error"]
    everything = InvalidInvocation(ignore_recovered=False).detect(run)
    assert [f.position for f in everything] == [first.position, failed.position]


# PrematureFinish ----------------------------------------------------------------------------------
def test_premature_finish_learns_checks_per_final_action() -> None:
    population = [shop_run() for _ in range(4)]
    detector = PrematureFinish().fit(population)
    assert detector.checks_["reply"] == {"get_order": 1.0, "refund_order": 1.0}
    b = RunBuilder("refund A-1", success=False)
    attempt = b.tool("get_order", {"order_id": "A-1"}, error="Timeout")  # a failed check
    b.tool("refund_order", {"order_id": "A-1"})
    final = b.tool("reply", {"text": "refunded"})
    [finding] = detector.detect(b.build())
    assert finding.key == "premature_finish:get_order"
    assert finding.position == final.position
    assert finding.span_ids == (final.span_id, attempt.span_id)
    assert finding.details["final_action"] == "reply" and finding.details["attempted"] == 1
    assert detector.detect(shop_run(success=False)) == []
    assert PrematureFinish(min_support=5).fit(population).detect(b.build()) == []


# Registry -----------------------------------------------------------------------------------------
def test_registry() -> None:
    assert list(DETECTORS) == [
        "ungrounded_argument", "wrong_tool_order", "poisoned_memory", "budget_waste",
        "invalid_invocation", "premature_finish", "unserved_request", "forbidden_action",
        "missed_action", "wrong_amount", "wrong_list", "unknown_value",
        "missed_request", "wrong_choice", "wrong_source"]  # fmt: skip
    from tracegym.analysis.detector_names import BUILT_IN

    assert tuple(DETECTORS) == BUILT_IN  # every registered detector's name is a constant
    first, second = default_detectors(), default_detectors()
    assert [d.name for d in first] == list(DETECTORS)
    assert all(isinstance(d, Detector) and d.description for d in first)
    assert all(a is not b for a, b in zip(first, second, strict=True))
    tuned = default_detectors(wrong_tool_order={"min_support": 3})
    assert next(d for d in tuned if d.name == "wrong_tool_order").min_support == 3
    assert make_detector("budget_waste", loop_min=4).loop_min == 4
    with pytest.raises(ValueError, match="unknown detector"):
        make_detector("nope")
    with pytest.raises(ValueError, match="unknown detectors"):
        default_detectors(nope={})


def test_every_detector_is_deterministic_and_quiet_on_an_empty_population() -> None:
    runs = [shop_run(), shop_run(success=False, lookup_first=False), RunBuilder().build()]
    for detector in default_detectors():
        detector.fit([])
        for run in runs:
            detector.detect(run)  # no error without a fitted population
        detector.fit(runs)
        once = [f.to_dict() for r in runs for f in detector.detect(r)]
        again = [f.to_dict() for r in runs for f in detector.detect(r)]
        assert once == again
        json.dumps(once)


# End to end: the demo agent -----------------------------------------------------------------------
FLAW_MATCH = {
    "wrong_tool_order": lambda f: f.detector == "wrong_tool_order",
    "ungrounded_argument": lambda f: (
        f.key.startswith("ungrounded_argument:") and f.details["kind"] == "invented"
    ),
    "wrong_assumption": lambda f: (
        f.detector == "ungrounded_argument" and f.details["kind"] == "unsupported_choice"
    ),
    "poisoned_memory": lambda f: f.detector == "poisoned_memory",
    "budget_burn": lambda f: f.detector == "budget_waste",
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Run], dict[str, str | None]]:
    """60 demo tickets traced into a fresh store (in a subprocess: no global tracer state)."""
    from tracegym.store.store import Store

    home = tmp_path_factory.mktemp("demo-store")
    code = textwrap.dedent(f"""
        import json
        import tracegym
        from opentelemetry.sdk.trace import TracerProvider
        from tracegym.examples.support_agent import run_demo
        tracegym.init(home={str(home)!r}, provider=TracerProvider(), capture_messages=True)
        rows = run_demo(n_tasks=60, seed=0)
        tracegym.shutdown()
        print(json.dumps({{r["run_id"]: r["flaw"] for r in rows}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    flaws = json.loads(done.stdout.strip().splitlines()[-1])
    return load_runs(Store(home)), flaws


def test_demo_findings_recover_the_injected_flaws(demo) -> None:
    runs, flaws = demo
    assert len(runs) == 60
    detectors = [d.fit(runs) for d in default_detectors()]
    findings = {r.trace_id: [f for d in detectors for f in d.detect(r)] for r in runs}
    failed = [r for r in runs if r.success is False]
    succeeded = [r for r in runs if r.success is True]
    for flaw, match in FLAW_MATCH.items():
        with_flaw = [r for r in failed if flaws[r.run_id] == flaw]
        assert with_flaw, flaw
        hits = [r for r in failed if any(match(f) for f in findings[r.trace_id])]
        recall = sum(flaws[r.run_id] == flaw for r in hits) / len(with_flaw)
        precision = sum(flaws[r.run_id] == flaw for r in hits) / len(hits)
        assert recall == 1.0 and precision == 1.0, (flaw, recall, precision)
    # every failed run has a finding; most successful runs have none
    assert all(findings[r.trace_id] for r in failed)
    clean = sum(not findings[r.trace_id] for r in succeeded) / len(succeeded)
    assert clean >= 0.9
    # each finding names a step of its run and the spans that prove it
    for run in runs:
        spans = run.by_span()
        for finding in findings[run.trace_id]:
            step = run.steps[finding.position]
            assert (finding.step_index, finding.agent) == (step.step_index, step.agent)
            assert finding.span_ids[0] == step.span_id
            assert finding.key.startswith(finding.detector + ":")
            assert finding.span_ids[0] in spans


# End to end: AgentRx tau-retail -------------------------------------------------------------------
def test_agentrx_detectors_fire_more_on_failures(tmp_path: Path) -> None:
    if not AGENTRX.is_file():
        pytest.skip(f"shared data absent: {AGENTRX} (AgentRx tau-retail)")
    from tracegym.store.importers import import_path
    from tracegym.store.store import Store

    import_path("tau-bench", AGENTRX, tmp_path)
    runs = load_runs(Store(tmp_path))
    assert len(runs) == 100
    detectors = [d.fit([r for r in runs if r.success is not None]) for d in default_detectors()]
    fired: Counter[tuple[bool, str]] = Counter()
    for run in runs:
        names = {f.detector for d in detectors for f in d.detect(run)}
        for name in names | ({"any"} if names else set()):
            fired[run.success, name] += 1
    n_failed = sum(r.success is False for r in runs)
    n_ok = sum(r.success is True for r in runs)
    assert (n_failed, n_ok) == (27, 73)
    rate = {key: n / (n_ok if key[0] else n_failed) for key, n in fired.items()}
    assert rate[False, "any"] >= 2 * rate[True, "any"]
    for name in ("ungrounded_argument", "wrong_tool_order", "budget_waste", "invalid_invocation"):
        assert rate.get((False, name), 0) > rate.get((True, name), 0), name


# unserved_request ---------------------------------------------------------------------------------
SHOP_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("find_user", "get_order", "cancel_order", "update_address")
]


def _request_run(text: str, calls: list[str], *, success: bool, declared: bool = True) -> Run:
    b = RunBuilder(json.dumps({"request": text, "run_id": "r"}), success=success)
    attributes = {sc.TOOL_DEFINITIONS: json.dumps(SHOP_TOOLS)} if declared else {}
    b._add("chat m", sc.OP_CHAT, attributes=attributes)
    b.tool("find_user", {"email": "ana1@mail.com"}, {"user_id": "U1"})
    for name in calls:
        b.tool(name, {"order_id": "O1"}, "ok")
    b.llm("done")
    return b.build()


def test_a_request_for_a_tool_never_called_is_flagged():
    from tracegym.analysis.detectors.unserved import UnservedRequest

    run = _request_run("Hi, please change my address to 1 Oak St.", ["get_order"], success=False)
    detector = UnservedRequest().fit([run])
    # declared tools only: update_address was never called in any run
    assert set(detector.tools_) == {"cancel_order", "update_address"}
    (finding,) = detector.detect(run)
    assert finding.key == "unserved_request:update_address"
    assert finding.position == run.steps[-1].position  # where it stopped without acting
    assert finding.details["request"] == "Hi, please change my address to 1 Oak St."
    assert finding.details["first_call"] == {"tool": "find_user",
                                             "arguments": {"email": "ana1@mail.com"}}  # fmt: skip
    # a run that did it, or a request for something else, is not flagged
    done = _request_run("Please change my address.", ["update_address"], success=True)
    status = _request_run("What is the status of my order O1?", ["get_order"], success=True)
    assert detector.detect(done) == [] and detector.detect(status) == []


def test_unserved_request_needs_every_word_of_the_tool_and_accepts_inflections():
    from tracegym.analysis.detectors.unserved import UnservedRequest, tool_words

    assert tool_words("update_address") == {"address"}
    assert tool_words("cancelOrder") == {"cancel", "order"}
    runs = [
        _request_run("I cancelled... no: please cancel my order", [], success=False),
        _request_run("Cancel it", [], success=False),  # no "order": not this tool's request
    ]
    detector = UnservedRequest().fit(runs)
    assert keys(detector.detect(runs[0])) == ["unserved_request:cancel_order"]
    assert detector.detect(runs[1]) == []


def test_without_tool_definitions_the_tools_other_runs_called_are_known():
    from tracegym.analysis.detectors.unserved import UnservedRequest

    other = _request_run("cancel my order", ["cancel_order"], success=True, declared=False)
    run = _request_run("please cancel my order", ["get_order"], success=False, declared=False)
    detector = UnservedRequest().fit([other, run])
    assert set(detector.tools_) == {"cancel_order"}
    assert keys(detector.detect(run)) == ["unserved_request:cancel_order"]


# Preconditions, missed actions, amounts, lists, errors that name the fix -----------------------
def ticket_run(
    ticket: str, status: str, *, act: bool, success: bool = True, tier: str = "basic"
) -> Run:
    """A made-up help desk: look a ticket up, then close it (or not). Nothing here is a word any
    detector knows: the rules must come from the runs."""
    b = RunBuilder(f"close ticket {ticket}", success=success)
    b.user(f"Please close ticket {ticket}.")
    b.tool("fetch_ticket", {"ticket_id": ticket},
           {"ticket_id": ticket, "state": status, "tier": tier, "age_days": 3})  # fmt: skip
    if act:
        b.tool("close_ticket", {"ticket_id": ticket, "note": "closed"}, {"ok": True})
    b.tool("reply", {"text": "done"}, {"sent": True})
    return b.build()


def ticket_population() -> list[Run]:
    """Successful runs close open tickets and leave frozen ones alone."""
    runs = [ticket_run(f"TK-{100 + i}", "open", act=True) for i in range(6)]
    runs += [ticket_run(f"TK-{200 + i}", "frozen", act=False) for i in range(5)]
    return runs


def test_forbidden_action_learns_the_state_successful_runs_never_act_in() -> None:
    from tracegym.analysis.detectors.precondition import ForbiddenAction

    detector = ForbiddenAction().fit(ticket_population())
    [rule] = [r for r in detector.rules_ if r.forbidden]
    assert (rule.tool, rule.read_tool, rule.path, rule.forbidden) == (
        "close_ticket", "fetch_ticket", "state", frozenset({"frozen"}))  # fmt: skip
    bad = ticket_run("TK-900", "frozen", act=True, success=False)
    [finding] = detector.detect(bad)
    assert finding.key == "forbidden_action:close_ticket"
    assert finding.position == 3
    assert finding.span_ids == (bad.steps[3].span_id, bad.steps[2].span_id)
    assert finding.details["value"] == "frozen"
    # an allowed state, and a state no successful run showed, are not flagged
    assert detector.detect(ticket_run("TK-901", "open", act=True, success=False)) == []
    assert detector.detect(ticket_run("TK-902", "weird", act=True, success=False)) == []


def test_forbidden_action_needs_more_than_chance() -> None:
    from tracegym.analysis.detectors.precondition import ForbiddenAction

    # 3 acted records all "basic" while 2 of 9 left alone are "gold": (7/9)^3 = 0.47 is chance
    runs = [ticket_run(f"TK-{i}", "open", act=True) for i in range(3)]
    runs += [ticket_run(f"TK-{50 + i}", "open", act=False, tier="gold") for i in range(2)]
    runs += [ticket_run(f"TK-{60 + i}", "open", act=False) for i in range(4)]
    detector = ForbiddenAction().fit(runs)
    assert not [r for r in detector.rules_ if r.path == "tier"]
    # the same record read in many runs counts once: six trials of one frozen ticket are one
    copies = [ticket_run(f"TK-{i}", "open", act=True) for i in range(6)]
    copies += [ticket_run("TK-777", "frozen", act=False) for _ in range(6)]
    assert not [r for r in ForbiddenAction().fit(copies).rules_ if r.forbidden]


def test_missed_action_flags_a_state_successful_runs_always_act_on() -> None:
    from tracegym.analysis.detectors.missed_action import MissedAction

    detector = MissedAction().fit(ticket_population())
    rules = [(r.tool, r.path, r.value) for r in detector.rules_]
    assert rules == [("close_ticket", "state", "open")]
    missed = ticket_run("TK-950", "open", act=False, success=False)
    [finding] = detector.detect(missed)
    assert finding.key == "missed_action:close_ticket" and finding.position == 2
    assert detector.detect(ticket_run("TK-951", "open", act=True, success=False)) == []
    assert detector.detect(ticket_run("TK-952", "frozen", act=False, success=False)) == []


def pay_run(total: str, paid: Any, *, success: bool = True, split: bool = False) -> Run:
    b = RunBuilder("pay the bill", success=success)
    b.user("Please pay my bill, half on each card." if split else "Please pay my bill.")
    b.tool("fetch_bill", {"bill_id": "BL-7"}, {"bill_id": "BL-7", "total": total, "fee": 2.5})
    b.tool("pay_bill", {"bill_id": "BL-7", "amount": paid}, {"ok": True})
    return b.build()


def test_wrong_amount_accepts_arithmetic_and_formatting_and_flags_the_rest() -> None:
    detector = WrongAmount()
    assert detector.detect(pay_run("1,000.00", 1000)) == []  # formatting
    assert detector.detect(pay_run("$1,000.00", "1000.00")) == []
    assert detector.detect(pay_run("1000.00", 1002.5)) == []  # total + fee
    assert detector.detect(pay_run("1000.00", 500.0, split=True)) == []  # a split in two
    assert detector.detect(pay_run("99.99", 33.33)) == []  # a split in three, to the cent
    [finding] = detector.detect(pay_run("1000.00", 950.0, success=False))
    assert finding.key == "wrong_amount:pay_bill.amount" and finding.position == 3
    assert finding.span_ids[1] == finding.span_ids[0].rsplit(".", 1)[0] + ".2"  # the bill


def test_ungrounded_accepts_separators_and_derived_numbers() -> None:
    b = RunBuilder("book a trip")
    b.user("I want a one-way ticket, Business class, fare FR-1.")
    b.tool("search_flights", {"trip_type": "one_way", "cabin": "business class"})
    b.tool("fetch_fare", {"fare": "FR-1"}, {"base": 120.5, "tax": 30.25})
    b.tool("calculate_total", {"amount": 150.75})  # a read, computing on base + tax
    assert UngroundedArgument().detect(b.build()) == []
    b.tool("calculate_total", {"amount": 177.5})  # no arithmetic on what it saw gives this
    assert keys(UngroundedArgument().detect(b.build())) == [
        "ungrounded_argument:calculate_total.amount"
    ]
    b = RunBuilder("book a trip")
    b.user("I want a round trip.")
    b.tool("search_flights", {"trip_type": "one_way"})
    assert keys(UngroundedArgument().detect(b.build())) == [
        "ungrounded_argument:search_flights.trip_type"
    ]


def order_items_run(picked: list[str], *, success: bool = True, named: str = "") -> Run:
    b = RunBuilder("return items", success=success)
    b.user(f"I want to return some items. {named}")
    b.tool("fetch_order", {"order_id": "OR-1"},
           {"order_id": "OR-1", "items": [{"item_id": "IT-11"}, {"item_id": "IT-12"}]})  # fmt: skip
    b.tool("fetch_order", {"order_id": "OR-2"},
           {"order_id": "OR-2", "items": [{"item_id": "IT-21"}, {"item_id": "IT-22"}]})  # fmt: skip
    b.tool("return_items", {"order_id": "OR-1", "item_ids": picked}, {"ok": True})
    return b.build()


def test_wrong_list_flags_a_list_mixing_records() -> None:
    from tracegym.analysis.detectors.list_args import WrongListArgument

    good = [order_items_run(["IT-11"]), order_items_run(["IT-12"]),
            order_items_run(["IT-11", "IT-12"]), order_items_run(["IT-21", "IT-22"]),
            order_items_run(["IT-22"])]  # fmt: skip
    detector = WrongListArgument().fit(good)
    assert detector.rules_ == {("return_items", "item_ids"): "subset"}
    [finding] = detector.detect(order_items_run(["IT-11", "IT-22"], success=False))
    assert finding.key == "wrong_list:return_items.item_ids" and finding.position == 4
    # what the user named is never wrong
    named = order_items_run(["IT-11", "IT-22"], success=False, named="IT-11 and IT-22 please")
    assert detector.detect(named) == []
    assert detector.detect(order_items_run(["IT-12"], success=False)) == []


def one_list_run(items: list[str], picked: list[str], *, success: bool = True) -> Run:
    b = RunBuilder("exchange items", success=success)
    b.user("I want to exchange an item.")
    b.tool("fetch_order", {"order_id": "OR-1"},
           {"order_id": "OR-1", "items": [{"item_id": i} for i in items]})  # fmt: skip
    b.tool("exchange_items", {"order_id": "OR-1", "item_ids": picked}, {"ok": True})
    return b.build()


def test_wrong_list_mines_no_whole_list_rule_from_lists_of_one() -> None:
    """Orders of one item cannot tell "all of the order" from "part of it": successful calls
    on them are no evidence of an "equal" rule, so a part of a longer order is no finding."""
    from tracegym.analysis.detectors.list_args import WrongListArgument

    ones = [one_list_run([f"IT-{n}"], [f"IT-{n}"]) for n in range(6)]
    detector = WrongListArgument().fit(ones)
    assert detector.rules_ == {("exchange_items", "item_ids"): "subset"}
    assert detector.detect(one_list_run(["IT-1", "IT-2"], ["IT-1"], success=False)) == []
    # shown on lists of two or more, the whole-list rule is mined and kept
    wholes = [one_list_run([f"IT-{n}", f"IT-{n}b"], [f"IT-{n}", f"IT-{n}b"]) for n in range(6)]
    detector = WrongListArgument().fit(ones + wholes)
    assert detector.rules_ == {("exchange_items", "item_ids"): "equal"}
    [finding] = detector.detect(one_list_run(["IT-1", "IT-2"], ["IT-1"], success=False))
    assert finding.details["mined_rule"]["relation"] == "equal"


def seat_run(*, lookup: bool, success: bool) -> Run:
    b = RunBuilder("change my seat", success=success)
    b.user("Move me to seat 14C on booking BK-31.")
    if lookup:
        b.tool("get_booking", {"booking_id": "BK-31"}, {"booking_id": "BK-31", "seat": "3A"})
        b.tool("change_seat", {"booking_id": "BK-31", "seat": "14C"}, {"ok": True})
    else:
        error = "Error: unknown booking state; call get_booking first"
        b.tool("change_seat", {"booking_id": "BK-31", "seat": "14C"}, error, error="ToolError")
    b.llm("Sorry, I could not change your seat.")
    return b.build()


def test_an_error_that_names_the_fix_is_a_wrong_order_not_an_invalid_call() -> None:
    runs = [seat_run(lookup=True, success=True) for _ in range(2)]  # too few to mine a rule
    runs += [seat_run(lookup=False, success=False) for _ in range(3)]
    order = WrongToolOrder().fit(runs)
    assert order.rules_ == []
    bad = runs[-1]
    [finding] = order.detect(bad)
    assert finding.key == "wrong_tool_order:get_booking>change_seat"
    assert finding.position == 2 and finding.confidence >= 0.9
    assert finding.details["error_names_fix"] and "get_booking first" in finding.message
    assert InvalidInvocation().fit(runs).detect(bad) == []  # the error is the symptom
    assert order.detect(runs[0]) == []
    # an error naming a tool without a word of order is no fix
    b = RunBuilder("x", success=False)
    b.tool("change_seat", {"booking_id": "BK-1"}, "Error: get_booking timed out", error="E")
    assert WrongToolOrder().fit(runs).detect(b.build()) == []
    invalid = InvalidInvocation().fit(runs).detect(b.build())
    assert keys(invalid) == ["invalid_invocation:change_seat"]


NATIVE_SEAT_AGENT = """
import sys
import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider

tg.init(home=sys.argv[1], provider=TracerProvider(), capture_messages=True)
looked = set()

@tg.tool
def get_booking(booking_id):
    looked.add(booking_id)
    return {"booking_id": booking_id, "seat": "3A"}

@tg.tool
def change_seat(booking_id, seat):
    if booking_id not in looked:
        raise ValueError("call get_booking first")
    return {"ok": True}

@tg.llm(model="stub")
def reply(messages):
    return "done"

for i in range(5):
    careless = i >= 2  # two careful runs: too few to mine an order rule from them
    with tg.agent("seat_agent", run_id=f"run-{i}"):
        reply([{"role": "user", "content": f"Move booking BK-{i} to seat 14C."}])
        try:
            if not careless:
                get_booking(f"BK-{i}")
            change_seat(f"BK-{i}", "14C")
            ok = True
        except ValueError:
            ok = False
            reply([{"role": "user", "content": "it failed"}])
    tg.record_outcome(f"run-{i}", success=ok)
tg.shutdown()
"""


def test_a_natively_traced_tool_error_is_quoted_by_the_finding_and_the_attribution(
    tmp_path: Path,
) -> None:
    """An SDK-traced tool that raises leaves its text only in the span status's message."""
    from tracegym.analysis.attribution import attribute
    from tracegym.dashboards.db import Database
    from tracegym.dashboards.findings import load_runs as dashboard_runs
    from tracegym.store.store import Store

    script = tmp_path / "agent.py"
    script.write_text(NATIVE_SEAT_AGENT)
    subprocess.run([sys.executable, str(script), str(tmp_path / "home")], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    with Store(tmp_path / "home") as store:
        runs = load_runs(store)
    failed = [r for r in runs if r.success is False]
    assert len(runs) == 5 and len(failed) == 3
    call = next(s for s in failed[0].steps if s.tool == "change_seat")
    assert call.failed and not call.output  # the error text is nowhere but the status
    assert call.status_message == "ValueError: call get_booking first"
    order = WrongToolOrder().fit(runs)
    assert order.rules_ == []  # only the error can name the fix
    [finding] = order.detect(failed[0])
    assert finding.key == "wrong_tool_order:get_booking>change_seat"
    assert finding.details["error_names_fix"] and "call get_booking first" in finding.message
    assert all(order.detect(r) == [] for r in runs if r.success)
    result = attribute(failed[0])
    assert result.rule == "failed_execution" and "call get_booking first" in result.reason
    # the dashboard builds its runs through the same `build_runs`: the run page sees the text
    [seen] = dashboard_runs(Database(tmp_path / "home"), [failed[0].trace_id])
    assert next(s for s in seen.steps if s.tool == "change_seat").status_message == (
        call.status_message
    )


def test_unknown_value_knows_an_arguments_closed_vocabulary() -> None:
    from tracegym.analysis.detectors.vocabulary import UnknownValue

    def ship(country: str, city: str, success: bool = True, trip: str = "one-way") -> Run:
        b = RunBuilder("ship it", success=success)
        b.user(f"Ship it to {city}, {country}.")
        b.tool("ship_parcel", {"city": city, "country": country, "mode": trip}, {"ok": True})
        return b.build()

    cities = ["Austin", "Boston", "Denver", "Fresno", "Tulsa", "Omaha"]
    detector = UnknownValue().fit([ship("USA", c) for c in cities])
    assert set(detector.vocabulary_) == {("ship_parcel", "country"), ("ship_parcel", "mode")}
    [finding] = detector.detect(ship("US", "Reno", success=False))
    assert finding.key == "unknown_value:ship_parcel.country" and finding.details["value"] == "US"
    # separators and case are not a different value; cities are no closed vocabulary
    assert detector.detect(ship("usa", "Reno", success=False, trip="One_Way")) == []


def test_the_error_text_may_be_only_in_what_the_model_read_next() -> None:
    b = RunBuilder("change my seat", success=False)
    b.user("Move me to seat 14C on booking BK-31.")
    call = b.tool("change_seat", {"booking_id": "BK-31"}, None, error="ToolError")
    call.call_id = "c1"
    said = "Error: booking BK-31 not loaded: call get_booking first"
    b.llm("Sorry.", messages=[{"role": "tool", "tool_call_id": "c1", "content": said}])
    run = b.build()
    [finding] = WrongToolOrder().fit([run, seat_run(lookup=True, success=True)]).detect(run)
    assert finding.key == "wrong_tool_order:get_booking>change_seat"
    assert finding.details["error"] == said


def test_a_call_the_user_made_is_no_write_of_the_agent() -> None:
    from tracegym.analysis.detectors.state import is_write
    from tracegym.tracer.semconv import TOOL_REQUESTED_BY as REQUESTED_BY

    b = RunBuilder("fix my phone")
    mine = b.tool("toggle_roaming", {})
    theirs = b.tool("toggle_roaming", {})
    theirs.attributes[REQUESTED_BY] = "user"
    assert is_write(mine) and not is_write(theirs)
    assert not is_write(b.tool("get_line", {"line_id": "L1"}))


def _device_run(*, success: bool, by_user: bool) -> Run:
    """A phone fix: the agent reads the line; in failed runs the device checks loop and one
    fails. `by_user`: the user runs the device tools on their phone (tau2-bench telecom)."""
    b = RunBuilder("my data does not work", success=success)
    b.user("My mobile data stopped working.")
    b.tool("get_line", {"line_id": "L1"}, {"line_id": "L1", "roaming": False})
    checks = 1 if success else 6
    for i in range(checks):
        last = not success and i == checks - 1
        call = b.tool("run_speed_test", {}, "no connection" if last else "ok",
                      error="DeviceError" if last else None)  # fmt: skip
        if by_user:
            call.attributes[sc.TOOL_REQUESTED_BY] = "user"
    b.llm("Please try again later.")
    return b.build()


@pytest.mark.parametrize("by_user", [False, True])
def test_calls_the_user_made_are_not_the_agents_behaviour(by_user: bool) -> None:
    from tracegym.analysis.features import final_action_step, is_agent_call

    runs = [_device_run(success=True, by_user=by_user) for _ in range(6)]
    runs += [_device_run(success=False, by_user=by_user) for _ in range(4)]
    bad = runs[-1]
    flagged = {
        f.detector
        for detector in (BudgetWaste(), InvalidInvocation(), WrongToolOrder())
        for f in detector.fit(runs).detect(bad)
        if "run_speed_test" in f.key
    }
    # the agent's own looping, failing device checks are its behaviour; the user's are not
    assert flagged == (set() if by_user else {"budget_waste", "invalid_invocation"})
    speed_tests = [s for s in bad.steps if s.tool == "run_speed_test"]
    assert all(is_agent_call(s) != by_user for s in speed_tests)
    assert final_action_step(bad) is not None and final_action_step(bad).tool is None


_JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers()
    | st.sampled_from(["", "open", "T-1", "1,000.00", "$5", "x y", "{", "[1, 2]"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["id", "state", "items", "amount"]), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(
    st.tuples(st.sampled_from(["get_x", "set_x", "list_y", "pay"]), _JSON, _JSON, st.booleans(),
              st.booleans()),
    max_size=6,
))  # fmt: skip
def test_the_new_detectors_take_any_shape_of_arguments_and_results(calls: list[Any]) -> None:
    from tracegym.analysis.detectors.list_args import WrongListArgument
    from tracegym.analysis.detectors.missed_action import MissedAction
    from tracegym.analysis.detectors.precondition import ForbiddenAction
    from tracegym.analysis.detectors.vocabulary import UnknownValue

    runs = []
    for i in range(4):
        b = RunBuilder("t", success=i % 2 == 0)
        b.user("do T-1 for 1,000.00")
        for tool, args, result, failed, raw in calls:
            b.tool(tool, json.dumps(args) if raw else args, result, error="E" if failed else None)
        runs.append(b.build())
    for detector in (ForbiddenAction(min_support=1, min_abstain=1), MissedAction(min_support=1),
                     WrongAmount(), WrongListArgument(min_support=1), UnknownValue(min_support=1),
                     WrongToolOrder(min_support=1)):  # fmt: skip
        detector.fit(runs)
        for run in runs:
            for finding in detector.detect(run):
                assert finding.trace_id == run.trace_id and finding.span_ids


def test_forbidden_action_learns_a_date_threshold() -> None:
    from tracegym.analysis.detectors.precondition import ForbiddenAction

    def refund(booking: str, day: str, *, act: bool, success: bool = True) -> Run:
        b = RunBuilder(f"refund {booking}", success=success)
        b.user(f"Please refund booking {booking}.")
        b.tool("get_booking", {"booking_id": booking},
               {"booking_id": booking, "booked_on": day, "state": "open"})  # fmt: skip
        if act:
            b.tool("refund_booking", {"booking_id": booking}, {"ok": True})
        return b.build()

    runs = [refund(f"BK-{i}", f"2025-03-{10 + i:02d}", act=True) for i in range(6)]
    runs += [refund(f"BK-{50 + i}", f"2025-01-{10 + i:02d}", act=False) for i in range(6)]
    detector = ForbiddenAction().fit(runs)
    [rule] = detector.rules_
    assert rule.path == "booked_on" and rule.describe() == "booked_on < 2025-03-10"
    [finding] = detector.detect(refund("BK-99", "2025-02-01", act=True, success=False))
    assert finding.details["value"] == "2025-02-01"
    assert detector.detect(refund("BK-98", "2025-03-12", act=True, success=False)) == []


def test_forbidden_action_can_leave_out_a_refused_attempt_the_run_recovered_from() -> None:
    from tracegym.analysis.detectors.precondition import ForbiddenAction

    b = RunBuilder("close ticket TK-5", success=False)
    b.user("Please close ticket TK-5.")
    b.tool("fetch_ticket", {"ticket_id": "TK-5"}, {"ticket_id": "TK-5", "state": "frozen",
                                                    "tier": "basic", "age_days": 3})  # fmt: skip
    b.tool("close_ticket", {"ticket_id": "TK-5"}, "Error: frozen", error="ToolError")
    b.tool("escalate_ticket", {"ticket_id": "TK-5"}, {"ok": True})
    run = b.build()
    assert keys(ForbiddenAction().fit(ticket_population()).detect(run)) == [
        "forbidden_action:close_ticket"
    ]
    assert ForbiddenAction(ignore_recovered=True).fit(ticket_population()).detect(run) == []


def test_forbidden_action_takes_failed_runs_as_evidence_when_there_are_enough() -> None:
    from tracegym.analysis.detectors.precondition import ForbiddenAction

    # few successful runs act, a rare state that successful runs left alone twice
    runs = [ticket_run(f"TK-{i}", "open", act=True) for i in range(3)]
    runs += [ticket_run(f"TK-{20 + i}", "open", act=False) for i in range(20)]
    runs += [ticket_run(f"TK-{60 + i}", "frozen", act=False) for i in range(2)]
    two = [ticket_run(f"TK-{80 + i}", "frozen", act=True, success=False) for i in range(2)]
    four = two + [ticket_run(f"TK-{90 + i}", "frozen", act=True, success=False) for i in range(2)]
    assert not ForbiddenAction().fit(runs + two).rules_  # 2 failed records: too few
    [rule] = ForbiddenAction().fit(runs + four).rules_  # 4 of 4 vs 0 of 3: p = 1/35
    assert rule.path == "state" and rule.forbidden == {"frozen"}


def test_missed_request_learns_the_users_word_for_an_action() -> None:
    from tracegym.analysis.detectors.missed_request import MissedRequest

    def run(receipt: bool, sent: bool, success: bool = True, n: int = 0) -> Run:
        b = RunBuilder("refund", success=success)
        ask = " And the receipt." if receipt else ""
        b.user(f"Please refund order OR-{n}, I will send it back.{ask}")
        b.tool("refund_order", {"order_id": f"OR-{n}"}, {"ok": True})
        if sent:
            b.tool("send_confirmation", {"order_id": f"OR-{n}"}, {"ok": True})
        return b.build()

    runs = [run(True, True, n=i) for i in range(6)] + [
        run(False, False, n=10 + i) for i in range(8)
    ]
    detector = MissedRequest().fit(runs)
    assert {(r.word, r.tool) for r in detector.rules_} == {("receipt", "send_confirmation")}
    [finding] = detector.detect(run(True, False, success=False, n=99))
    assert (
        finding.key == "missed_request:send_confirmation" and finding.details["word"] == "receipt"
    )
    assert detector.detect(run(True, True, success=False, n=98)) == []
    assert detector.detect(run(False, False, success=False, n=97)) == []


def test_missed_request_counts_no_hand_off_as_carrying_the_request_out() -> None:
    from tracegym.analysis.detectors.missed_request import MissedRequest, done, standalone_writes

    def run(n: int, writes: tuple[str, ...], receipt: bool = True, success: bool = True) -> Run:
        b = RunBuilder("refund", success=success)
        b.user(f"Please refund order OR-{n}." + (" And the receipt." if receipt else ""))
        for tool in writes:
            b.tool(tool, {"order_id": f"OR-{n}"}, {"ok": True})
        return b.build()

    served = [run(i, ("refund_order", "send_confirmation")) for i in range(5)]
    # successful runs that handed the request to a person (their only write) sent no receipt:
    # counted as acting, they would make "receipt" -> send_confirmation 5 of 8 (< 0.9)
    handed = [run(20 + i, ("transfer_to_human",)) for i in range(3)]
    plain = [run(40 + i, ("refund_order",), receipt=False) for i in range(4)]
    assert standalone_writes([frozenset({"a", "b"}), frozenset({"c"}), frozenset({"a"})]) == {"c"}
    runs = served + handed + plain
    assert standalone_writes([done(r) for r in runs if r.success]) == {"transfer_to_human"}
    detector = MissedRequest().fit(runs)
    assert ("receipt", "send_confirmation") in {(r.word, r.tool) for r in detector.rules_}
    [finding] = detector.detect(run(99, ("refund_order",), success=False))
    assert finding.key == "missed_request:send_confirmation"
    # a failed run that handed off instead still left the receipt undone
    [handed_off] = detector.detect(run(98, ("transfer_to_human",), success=False))
    assert handed_off.key == "missed_request:send_confirmation"


def test_first_calls_are_remembered_only_inside_the_scope() -> None:
    from tracegym.analysis.detectors.tool_order import first_calls, remembering_first_calls

    run = shop_run()
    assert first_calls(run) is not first_calls(run)  # outside: worked out each time
    with remembering_first_calls():
        remembered = first_calls(run)
        assert first_calls(run) is remembered
        with remembering_first_calls():  # nested: the same memory
            assert first_calls(run) is remembered
        other = shop_run()
        assert first_calls(other) is not remembered and set(first_calls(other)) == set(remembered)
    run.steps = [s for s in run.steps if s.tool != "get_order"]
    assert "get_order" not in first_calls(run)  # after the scope the run is read again
