"""`export openai-ft` takes a run's tools from its spans' own definitions (descriptions and
`required` kept), and rebuilds them from the calls only for a tool no span describes."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tracegym.store.exporters import select_runs
from tracegym.store.exporters.openai_ft import PASSED, run_examples, write_examples
from tracegym.store.records import outcome_record, write_spool_file
from tracegym.store.store import Store
from tracegym.tests.store.test_exports import RunBuilder
from tracegym.tracer import semconv as sc

pytest.importorskip("duckdb", reason="the store needs tracegym[analysis]")

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}},
    "required": ["order_id"],
    "additionalProperties": False,
}


def _export(home: Path) -> list[dict[str, Any]]:
    """What `tracegym export openai-ft --from runs` writes (its exporter, without the CLI)."""
    out = io.StringIO()
    with Store(home) as store:
        report = write_examples(run_examples(store, select_runs(store, extra=PASSED)), out)
    assert report.skipped == Counter(), report.examples
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _agents_sdk_shaped_run(tag: str, definitions: list[dict[str, Any]] | None) -> RunBuilder:
    """An Agents SDK run as its instrumentor records it with the chat-completions model: LLM
    spans without tool definitions (unless given), tool spans with description and schema."""
    run = RunBuilder(tag, agent="order-helper")
    extra = {sc.TOOL_DEFINITIONS: json.dumps(definitions)} if definitions else {}
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_order", "arguments": '{"order_id": "A1"}'}}  # fmt: skip
    run.llm(
        [{"role": "user", "content": "where is A1?"}],
        [{"role": "assistant", "content": None, "tool_calls": [call]}],
        **extra,
    )
    run.tool("get_order", {"order_id": "A1"}, "shipped", call_id="call_1")
    run.records[-1]["attributes"].update({
        "tool.description": "Look up an order by its id.",
        "gen_ai.tool.description": "Look up an order by its id.",
        "tool.parameters": json.dumps(ORDER_SCHEMA),
    })  # fmt: skip
    run.tool("notify", {"text": "done", "urgent": True}, "ok", call_id="call_2")  # no schema
    run.llm(
        [{"role": "user", "content": "where is A1?"},
         {"role": "assistant", "content": None, "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_2", "type": "function",
              "function": {"name": "notify", "arguments": '{"text": "done", "urgent": true}'}}]},
         {"role": "tool", "tool_call_id": "call_2", "content": "ok"}],
        [{"role": "assistant", "content": "It shipped."}],
        **extra,
    )  # fmt: skip
    return run


def test_tools_come_from_the_tool_spans_when_the_llm_spans_carry_none(tmp_path: Path):
    run = _agents_sdk_shaped_run("sdk", None)
    write_spool_file(tmp_path, run.finish("where is A1?", "It shipped.", True), "runs")
    [line] = _export(tmp_path)
    tools = {t["function"]["name"]: t["function"] for t in line["tools"]}
    assert tools["get_order"] == {
        "name": "get_order",
        "description": "Look up an order by its id.",
        "parameters": ORDER_SCHEMA,
    }
    # No span describes `notify`: its schema is rebuilt from the call, as before.
    assert tools["notify"] == {
        "name": "notify",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"},
                                                        "urgent": {"type": "boolean"}}},
    }  # fmt: skip


def test_the_llm_spans_definitions_win(tmp_path: Path):
    offered = [
        {"type": "function", "function": {
            "name": "get_order", "description": "As the model saw it.",
            "parameters": ORDER_SCHEMA}},
        {"type": "function", "function": {
            "name": "notify", "description": "Tell the user.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}},
    ]  # fmt: skip
    run = _agents_sdk_shaped_run("offered", offered)
    write_spool_file(tmp_path, run.finish("where is A1?", "It shipped.", True), "runs")
    [line] = _export(tmp_path)
    assert line["tools"] == offered


@pytest.mark.slow
def test_a_real_agents_sdk_run_exports_its_tools_with_descriptions(tmp_path: Path, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai-agents]")
    agents = pytest.importorskip("agents", reason="needs tracegym[openai-agents]")
    pytest.importorskip("openinference.instrumentation.openai_agents")
    import tracegym as tg
    from tracegym.tests.fixtures.fake_llm_server import FakeLLMServer
    from tracegym.tracer import integrations

    home = tmp_path / "home"
    tracer_setup(home=home)

    @agents.function_tool
    def get_order(order_id: str, verbose: bool = False) -> str:
        """Look up an order by its id."""
        return f"order {order_id}: shipped"

    with FakeLLMServer() as server, integrations.instrumenting("openai-agents"):
        client = openai.AsyncOpenAI(base_url=server.openai_url, api_key="k", max_retries=0)
        model = agents.OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
        helper = agents.Agent(name="order-helper", instructions="Help.", tools=[get_order],
                              model=model)  # fmt: skip

        @tg.agent("outer", run_id="sdk-run")
        def run(question: str) -> str:
            return agents.Runner.run_sync(helper, question).final_output

        run("where is A1?")
    assert tg.flush(10)
    write_spool_file(home, [outcome_record("sdk-run", time_ns=1, success=True)], "outcome")
    [line] = _export(home)
    [tool] = line["tools"]
    assert tool["function"]["description"] == "Look up an order by its id."
    assert tool["function"]["parameters"]["required"] == ["order_id", "verbose"]
    assert tool["function"]["parameters"]["properties"]["verbose"]["type"] == "boolean"
