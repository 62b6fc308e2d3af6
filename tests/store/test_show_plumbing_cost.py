"""`tracegym show` folds framework plumbing (LangGraph graph, node, RunnableSequence and prompt
spans; the Agents SDK's nested `Agent workflow` and `turn` spans) unless `--full`, and prints a
run's cost; `traces` has a cost column; `--prices FILE` overrides the table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

import tracegym as tg
from tracegym.cli import app
from tracegym.tracer import integrations
from typer.testing import CliRunner

from tests.fixtures.priced_home import priced_home

runner = CliRunner()
WIDE = {"COLUMNS": "250"}


def _cli(home: Path, *args: str) -> str:
    result = runner.invoke(app, ["--home", str(home), *args], env=WIDE)
    assert result.exit_code == 0, result.output
    return result.output


def _graph() -> Any:
    pytest.importorskip("langgraph")
    pytest.importorskip("openinference.instrumentation.langchain")
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: shipped"

    call = {"name": "get_order", "args": {"order_id": "A1"}, "id": "call_lc_1"}
    model = FakeMessagesListChatModel(responses=[
        AIMessage(content="", tool_calls=[call],
                  usage_metadata={"input_tokens": 11, "output_tokens": 5, "total_tokens": 16}),
        AIMessage(content="It shipped.",
                  usage_metadata={"input_tokens": 20, "output_tokens": 3, "total_tokens": 23}),
    ])  # fmt: skip
    chain = ChatPromptTemplate.from_messages([("system", "Help."), ("placeholder", "{messages}")])
    chain = chain | model

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [chain.invoke({"messages": state["messages"]})]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([get_order]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


@pytest.fixture
def langgraph_home(tmp_path: Path, tracer_setup: Any) -> Path:
    from langchain_core.messages import HumanMessage

    graph = _graph()
    tracer_setup(home=tmp_path)

    @tg.agent("graph-agent", run_id="lg")
    def run(question: str) -> str:
        return graph.invoke({"messages": [HumanMessage(question)]})["messages"][-1].content

    with integrations.instrumenting("langgraph"):
        assert run("where is A1?") == "It shipped."
    assert tg.flush(10)
    return tmp_path


def test_show_folds_langgraph_plumbing_and_full_shows_it(langgraph_home: Path):
    folded = _cli(langgraph_home, "show", "lg")
    full = _cli(langgraph_home, "show", "lg", "--full")
    for plumbing in ("LangGraph", "RunnableSequence", "ChatPromptTemplate", "tools_condition"):
        assert plumbing not in folded
        assert plumbing in full
    # What the agent did stays, each LLM call and the tool call hung on the agent's span.
    assert folded.count("FakeMessagesListChatModel") == 2 and "get_order" in folded
    assert "10 framework spans folded" in folded and "folded" not in full
    assert len(folded.splitlines()) < len(full.splitlines())


def test_show_keeps_a_failing_framework_span(tmp_path: Path):
    from tracegym.store.records import span_record, write_spool_file
    from tracegym.tracer import semconv as sc

    trace = "ab" * 16
    spans = [
        span_record(trace_id=trace, span_id="a" * 16, name="invoke_agent bot", start_ns=1,
                    end_ns=10, attributes={sc.OPERATION: sc.OP_AGENT, sc.RUN_ID: "r"},
                    scope="tracegym"),
        span_record(trace_id=trace, span_id="b" * 16, parent_span_id="a" * 16, name="ok-node",
                    start_ns=2, end_ns=3, scope="openinference.instrumentation.langchain",
                    attributes={sc.OPERATION: sc.OP_STEP, sc.OI_SPAN_KIND: "CHAIN"}),
        span_record(trace_id=trace, span_id="c" * 16, parent_span_id="a" * 16,
                    name="broken-node", start_ns=4, end_ns=5, status="ERROR",
                    scope="openinference.instrumentation.langchain",
                    attributes={sc.OPERATION: sc.OP_STEP, sc.OI_SPAN_KIND: "CHAIN"}),
        span_record(trace_id=trace, span_id="d" * 16, parent_span_id="a" * 16,
                    name="step mine", start_ns=6, end_ns=7, scope="tracegym",
                    attributes={sc.OPERATION: sc.OP_STEP}),
    ]  # fmt: skip
    write_spool_file(tmp_path, spans, "spans")
    shown = _cli(tmp_path, "show", "r")
    assert "ok-node" not in shown and "broken-node" in shown and "step mine" in shown


def test_traces_and_show_print_the_cost(tmp_path: Path):
    home = priced_home(tmp_path)
    listed = _cli(home, "traces")
    assert "cost" in listed.splitlines()[1]  # the header row, under the table's top border
    assert "$0.0035" in listed  # gpt-4o: 1000 in at $2.50/M, 100 out at $10/M
    assert "cost $0.0035" in _cli(home, "show", "priced")
    assert "cost –" in _cli(home, "show", "unpriced")


def test_the_prices_option_overrides_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tracegym.store.pricing import PRICES_ENV

    monkeypatch.setenv(PRICES_ENV, "")  # the option sets it in this process: undone after
    home = priced_home(tmp_path)
    prices = tmp_path / "my-prices.json"
    prices.write_text(json.dumps({"models": {"in-house-*": {"input": 1000, "output": 0}}}))
    assert "cost $1.00" in _cli(home, "--prices", str(prices), "show", "unpriced")
    bad = tmp_path / "bad.json"
    bad.write_text('{"models": {"x": {"input": "free"}}}')
    result = runner.invoke(app, ["--home", str(home), "--prices", str(bad), "traces"])
    assert result.exit_code == 2 and "bad.json" in result.output


@pytest.mark.slow
def test_show_collapses_the_agents_sdks_nested_workflow_span(tmp_path: Path, tracer_setup: Any):
    openai = pytest.importorskip("openai")
    agents = pytest.importorskip("agents")
    pytest.importorskip("openinference.instrumentation.openai_agents")
    from tracegym.tests.fixtures.fake_llm_server import FakeLLMServer

    tracer_setup(home=tmp_path)

    @agents.function_tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: shipped"

    with FakeLLMServer() as server, integrations.instrumenting("openai-agents"):
        client = openai.AsyncOpenAI(base_url=server.openai_url, api_key="k", max_retries=0)
        model = agents.OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
        helper = agents.Agent(name="order-helper", instructions="Help.", tools=[get_order],
                              model=model)  # fmt: skip
        agents.Runner.run_sync(helper, "where is A1?")
    assert tg.flush(10)
    from tracegym.store.store import Store

    with Store(tmp_path) as store:
        [(trace_id,)] = store.sql("SELECT trace_id FROM traces").fetchall()
    folded = _cli(tmp_path, "show", trace_id)
    full = _cli(tmp_path, "show", trace_id, "--full")

    def spans(name: str, out: str) -> int:  # tree lines, not the header's "agent Agent workflow"
        return sum(bool(re.search(rf"── (#\d+ )?{name} ", line)) for line in out.splitlines())

    assert spans("Agent workflow", full) == 2 and spans("Agent workflow", folded) == 1
    assert spans("turn", full) == 2 and spans("turn", folded) == 0
    assert folded.count("generation") == 2 and "get_order" in folded
