"""The agent's conventions: mined from its runs, and followed by the environments built for it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracegym.synthesis.base import run_actions
from tracegym.synthesis.conventions import (
    Conventions,
    MinedRun,
    instructions_text,
    mine_conventions,
    system_message,
)
from tracegym.synthesis.families import build_spec
from tracegym.synthesis.fixtures import gap, shop_traces
from tracegym.synthesis.registry import from_spec
from tracegym.synthesis.spec import catalog_from_store, infer_catalog
from tracegym.synthesis.validity import check_environment

RETAIL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "agentrx-tau-retail"
ACTION = "cancel_pending_order"
PROMPT = "You are the shop's agent. Always find the customer first."
TOOLS = [
    {"type": "function", "function": {"name": "get_order_details", "description": "the agent's",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip


def runs(n: int = 30, **chat) -> list[MinedRun]:
    return [MinedRun(calls=t, **chat) for t in shop_traces(n)]


def test_opening_and_lookups_are_what_the_runs_share():
    mined = mine_conventions(runs(system_instructions=PROMPT, tool_definitions=TOOLS))
    assert mined.runs == 30
    assert mined.opening[:2] == ["find_user_id_by_email", "get_user_details"]
    assert mined.lookups[ACTION] == "get_order_details"
    assert mined.system_prompt == PROMPT and mined.tools == TOOLS


def test_nothing_is_a_convention_without_enough_successful_runs():
    few = runs(2)
    assert mine_conventions(few) == Conventions(runs=2)
    # failed runs count for lookups (the backend accepted the writes) but not for the rest
    failed = [MinedRun(calls=r.calls, success=False, system_instructions=PROMPT) for r in runs(30)]
    mined = mine_conventions(failed[:27] + runs(3))
    assert mined.runs == 3 and mined.system_prompt == ""
    assert mined.lookups[ACTION] == "get_order_details"


def test_a_prompt_only_some_runs_use_is_not_a_convention():
    mixed = runs(10, system_instructions=PROMPT) + runs(10, system_instructions="other")
    assert mine_conventions(mixed).system_prompt == ""


def test_instructions_text_reads_both_recorded_shapes():
    assert instructions_text('[{"type": "text", "content": "be kind"}]') == "be kind"
    assert instructions_text("plain words") == "plain words"
    assert instructions_text(None) == ""


@pytest.fixture(scope="module")
def catalog():
    return infer_catalog(shop_traces(40))


@pytest.mark.parametrize("detector", ["budget_waste", "invalid_invocation", "premature_finish"])
def test_environments_follow_the_agents_conventions(catalog, detector):
    conventions = mine_conventions(runs(system_instructions=PROMPT, tool_definitions=TOOLS))
    plain = from_spec(build_spec(gap(detector, [ACTION]), catalog))
    env = from_spec(build_spec(gap(detector, [ACTION]), catalog, conventions))
    task = env.make_task(5)
    assert task.system_prompt.startswith(PROMPT)
    assert not plain.make_task(5).system_prompt.startswith(PROMPT)
    names = [a.get("name") for a in task.oracle]
    opening = task.goal.opening
    assert names[: len(opening)] == opening and opening[0] == "find_user_id_by_email"
    assert "email" in task.instruction  # the user says who they are
    for i, name in enumerate(names):  # every write follows its lookup on the same order
        if name == ACTION:
            order_id = task.oracle[i]["arguments"]["order_id"]
            assert {"name": "get_order_details", "arguments": {"order_id": order_id}} in (
                task.oracle[:i]
            )
    # the oracle passes; skipping the opening fails the verifier
    assert run_actions(env, 5, task.oracle)[1].passed
    skipped = [a for a in task.oracle if a.get("name") not in opening]
    verdict = run_actions(env, 5, skipped)[1]
    assert not verdict.passed
    assert any(c["name"] == "opening" and not c["ok"] for c in verdict.checks)
    # the recorded tool definitions replace the inferred ones
    schemas = {s["function"]["name"]: s for s in env.tool_schemas()}
    assert schemas["get_order_details"] == TOOLS[0]
    assert check_environment(env, 40).ok


def test_the_budget_counts_the_calls_conventions_add(catalog):
    conventions = mine_conventions(runs())
    env = from_spec(build_spec(gap("budget_waste", [ACTION]), catalog, conventions))
    task = env.make_task(3)
    calls = sum(1 for a in task.oracle if "name" in a)
    budget = calls + int(env.knobs["slack"])
    assert f"budget of {budget} tool calls" in task.system_prompt
    assert task.max_steps == budget + 1


def test_lookups_are_learnt_per_id_argument_and_cover_writes_never_seen():
    never_called = [
        {"type": "function", "function": {"name": "refund_order", "parameters": {
            "type": "object", "properties": {"order_id": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "update_address", "parameters": {
            "type": "object", "properties": {"user_id": {}, "address": {}}}}},
    ]  # fmt: skip
    mined = mine_conventions(runs(tool_definitions=never_called))
    assert mined.lookups["refund_order"] == "get_order_details"  # it takes an order_id too
    assert "update_address" not in mined.lookups  # no accepted write shows a read by user_id


def test_the_system_message_of_the_recorded_chat_is_the_agents_instructions():
    messages = [{"role": "system", "content": "Cancel only pending orders."},
                {"role": "user", "content": "hi"}]  # fmt: skip
    assert system_message(messages) == "Cancel only pending orders."
    assert system_message('[{"role": "user", "content": "hi"}]') == ""
    assert system_message("not json") == ""


def test_imported_runs_give_their_system_message_as_the_prompt(tmp_path):
    runs = RETAIL / "tau_dataset_full.json"
    if not runs.exists():
        pytest.skip(f"shared data absent: {runs} (AgentRx tau-retail)")
    from tracegym.store.importers import import_path
    from tracegym.synthesis.conventions import conventions_from_store

    import_path("tau-bench", runs, tmp_path)
    conventions = conventions_from_store(tmp_path)
    assert conventions.system_prompt.startswith("# Retail agent policy")
    spec = build_spec(gap("wrong_tool_order", ["cancel_pending_order"]),
                      catalog_from_store(tmp_path), conventions)  # fmt: skip
    assert from_spec(spec).make_task(0).system_prompt.startswith("# Retail agent policy")


def test_recorded_tool_definitions_get_back_the_order_the_agent_sent():
    """The tracer stores attributes with sorted keys; a chat template renders the definitions
    as JSON text, so the environments must render them as the agent sent them."""
    import json

    from tracegym.examples.domains import DOMAINS
    from tracegym.synthesis.conventions import openai_order

    for domain in DOMAINS.values():
        sent = [dict(t) for t in domain.tool_schemas]
        recorded = json.loads(json.dumps(sent, sort_keys=True))
        assert json.dumps(recorded) != json.dumps(sent)  # what the store gives back
        assert json.dumps(openai_order(recorded)) == json.dumps(sent)
