"""`tracegym.instrument`: the real OpenInference instrumentors on tracegym's provider, driving the
real OpenAI and Anthropic clients against a loopback fake server, and a LangGraph graph over a
fake chat model. What lands in the store: nesting under the user's `@tg.agent`, model and tokens
in `llm_calls`, tool calls linked to the run, run/step bookkeeping, redaction and the content
policy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tracegym as tg
from tracegym.tests.fixtures.fake_llm_server import (
    ORDER_TOOL,
    TOOL_CALL_ID,
    FakeLLMServer,
    order_agent,
)
from tracegym.tracer import integrations
from tracegym.tracer import semconv as sc

pytest.importorskip("duckdb", reason="the store needs tracegym[analysis]")
from tracegym.store.store import Store

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as running:
        yield running


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def spans_of(home: Path) -> list[dict[str, Any]]:
    """Every span in the store, attributes parsed (flushes tracegym first)."""
    assert tg.flush(10)
    with Store(home) as store:
        rows = list(store.rows("SELECT trace_id, span_id, parent_span_id, name, scope, "
                               "start_ns, attributes FROM spans"))  # fmt: skip
    for row in rows:
        row["attributes"] = json.loads(row["attributes"])
    return rows


def query(home: Path, sql: str) -> list[tuple[Any, ...]]:
    assert tg.flush(10)
    with Store(home) as store:
        return store.sql(sql).fetchall()


def ancestors(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[str]:
    """Names of the span's ancestors, innermost first."""
    names = []
    parent = by_id.get(span["parent_span_id"] or "")
    while parent is not None:
        names.append(parent["name"])
        parent = by_id.get(parent["parent_span_id"] or "")
    return names


def spool_text(home: Path) -> str:
    assert tg.flush(10)
    return "".join(p.read_text() for p in sorted((home / "spool").glob("*.jsonl")))


# ---------------------------------------------------------------------------------------------
# OpenAI


def test_openai_calls_nest_under_the_agent_and_fill_llm_and_tool_calls(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    tracer_setup(home=home, capture_messages=True)
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)
    usages = []

    support = order_agent(client, usages)

    with integrations.instrumenting("openai") as active:
        assert "openai" in active
        answer = support("where is order A1?")
    assert answer == "The order ships tomorrow."  # the user's code saw the real reply

    spans = spans_of(home)
    by_id = {s["span_id"]: s for s in spans}
    (root,) = [s for s in spans if s["name"] == "invoke_agent support"]
    chats = sorted((s for s in spans if s["name"] == "ChatCompletion"), key=lambda s: s["start_ns"])
    assert len(chats) == 2
    for chat in chats:  # same trace, a child of the user's agent span
        assert chat["trace_id"] == root["trace_id"]
        assert chat["parent_span_id"] == root["span_id"]
        assert ancestors(chat, by_id) == ["invoke_agent support"]

    rows = query(
        home,
        "SELECT trace_id, agent, model, input_tokens, output_tokens, step_index, output_messages "
        "FROM llm_calls ORDER BY start_time",
    )
    assert [r[0] for r in rows] == [root["trace_id"]] * 2
    assert [r[1] for r in rows] == ["support", "support"]
    assert [r[2] for r in rows] == ["gpt-4o-mini-2024-08-06"] * 2  # the response's model
    assert [(r[3], r[4]) for r in rows] == [(u.prompt_tokens, u.completion_tokens) for u in usages]
    assert rows[0][3] != rows[1][3]  # the second call's prompt is longer: counts are real
    # The model's tool call is linked to the tool the agent ran: same id, same run, in order.
    # Messages are in the GenAI message/parts shape, as tracegym's own LLM spans write them.
    (asked,) = json.loads(rows[0][6])
    assert (asked["role"], asked["finish_reason"]) == ("assistant", "tool_call")
    assert asked["parts"] == [{"type": "tool_call", "id": TOOL_CALL_ID, "name": "get_order",
                               "arguments": {"order_id": "order_id-1"}}]  # fmt: skip
    (second_input,) = query(home, "SELECT input_messages FROM llm_calls ORDER BY start_time")[1:]
    sent = json.loads(second_input[0])  # the messages, not the whole request body
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[0]["parts"] == [{"type": "text", "content": "where is order A1?"}]
    assert sent[2]["parts"] == [
        {"type": "tool_call_response", "id": TOOL_CALL_ID, "response": "shipped"}
    ]
    tools = query(home, "SELECT trace_id, tool, call_id, arguments, step_index FROM tool_calls")
    assert tools == [(root["trace_id"], "get_order", TOOL_CALL_ID, '{"order_id":"order_id-1"}',
                      tools[0][4])]  # fmt: skip
    assert rows[0][5] < tools[0][4] < rows[1][5]  # one step counter for the run
    # The tools offered, where synthesis and the exports read them (as tg.llm records them).
    assert json.loads(chats[0]["attributes"][sc.TOOL_DEFINITIONS]) == [ORDER_TOOL]
    assert sc.TOOL_DEFINITIONS not in chats[1]["attributes"]  # none offered the second time
    run = query(home, "SELECT run_id, llm_calls, tool_calls, tokens FROM traces")
    tokens = sum(u.prompt_tokens + u.completion_tokens for u in usages)
    assert run == [(root["attributes"][sc.RUN_ID], 2, 1, tokens)]
    # The run's budget was charged with the instrumented calls: two LLM steps and the tool.
    assert root["attributes"][sc.USED_TOKENS] == tokens
    assert root["attributes"][sc.USED_STEPS] == 3


def test_openai_streaming_call_records_usage(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    tracer_setup(home=home)
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)

    @tg.agent("streamer")
    def run() -> tuple[str, Any]:
        stream = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "say something short"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        for chunk in stream:
            text += "".join(c.delta.content or "" for c in chunk.choices)
            usage = chunk.usage or usage
        return text, usage

    with integrations.instrumenting("openai"):
        text, usage = run()
    assert text.strip() == "The order ships tomorrow."
    assert query(home, "SELECT agent, input_tokens, output_tokens FROM llm_calls") == [
        ("streamer", usage.prompt_tokens, usage.completion_tokens)
    ]


def test_concurrent_async_calls_each_nest_under_their_agent(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    import asyncio

    tracer_setup(home=home)
    client = openai.AsyncOpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)

    @tg.agent("async-agent")
    async def run(question: str) -> int:
        replies = await asyncio.gather(*(
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"{question} {i}"}]
            )
            for i in range(3)
        ))  # fmt: skip
        return sum(r.usage.total_tokens for r in replies)

    async def two_runs() -> list[int]:
        return list(await asyncio.gather(run("first"), run("second run")))

    with integrations.instrumenting("openai"):
        totals = asyncio.run(two_runs())
    spans = spans_of(home)
    roots = {s["span_id"]: s for s in spans if s["name"] == "invoke_agent async-agent"}
    assert len(roots) == 2
    chats = [s for s in spans if s["name"] == "ChatCompletion"]
    assert len(chats) == 6
    by_root: dict[str, list[dict[str, Any]]] = {}
    for chat in chats:  # each call in its own run's trace, a child of that run's agent span
        root = roots[chat["parent_span_id"]]
        assert chat["trace_id"] == root["trace_id"]
        by_root.setdefault(chat["parent_span_id"], []).append(chat)
    assert len(by_root) == 2
    for children in by_root.values():
        assert sorted(c["attributes"][sc.STEP_INDEX] for c in children) == [0, 1, 2]
    assert sorted(r["attributes"][sc.USED_TOKENS] for r in roots.values()) == sorted(totals)


def test_openai_responses_api_call_fills_llm_calls(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    tracer_setup(home=home, capture_messages=True)
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)
    tool = {"type": "function", "name": "get_order", **{
        k: ORDER_TOOL["function"][k] for k in ("description", "parameters")}}  # fmt: skip

    @tg.agent("responder")
    def run() -> Any:
        return client.responses.create(
            model="gpt-4o-mini", instructions="Be brief.", input="where is A1?", tools=[tool]
        )

    with integrations.instrumenting("openai"):
        response = run()
    (call,) = response.output
    rows = query(home, "SELECT agent, input_tokens, output_tokens, input_messages, "
                       "output_messages FROM llm_calls")  # fmt: skip
    assert [r[:3] for r in rows] == [
        ("responder", response.usage.input_tokens, response.usage.output_tokens)
    ]
    assert [m["role"] for m in json.loads(rows[0][3])] == ["system", "user"]
    (asked,) = json.loads(rows[0][4])
    assert [(p["type"], p["id"], p["name"]) for p in asked["parts"]] == [
        ("tool_call", call.call_id, "get_order")
    ]


def test_a_failing_call_raises_as_before_and_is_recorded_as_an_error(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    tracer_setup(home=home)
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)

    @tg.agent("unlucky")
    def run() -> Any:
        return client.chat.completions.create(
            model="fail-model", messages=[{"role": "user", "content": "hi"}]
        )

    with integrations.instrumenting("openai"), pytest.raises(openai.InternalServerError):
        run()  # the client's own exception, unchanged
    rows = query(home, "SELECT status, error_type FROM llm_calls")
    assert rows == [("ERROR", "openai.InternalServerError")]
    assert tg.stats().internal_errors == 0


def test_tg_llm_around_an_instrumented_call_charges_its_tokens_once(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    tracer_setup(home=home)
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)

    @tg.llm(model="gpt-4o-mini")
    def ask(messages: list[dict[str, str]]) -> Any:
        return client.chat.completions.create(model="gpt-4o-mini", messages=messages)

    @tg.agent("wrapped")
    def run() -> Any:
        return ask([{"role": "user", "content": "hello there"}]).usage

    with integrations.instrumenting("openai"):
        usage = run()
    spans = spans_of(home)
    (root,) = [s for s in spans if s["name"] == "invoke_agent wrapped"]
    (own,) = [s for s in spans if s["name"] == "chat gpt-4o-mini"]
    (inner,) = [s for s in spans if s["name"] == "ChatCompletion"]
    assert inner["parent_span_id"] == own["span_id"]  # nested in the user's own llm span
    assert root["attributes"][sc.USED_TOKENS] == usage.total_tokens  # not twice


# ---------------------------------------------------------------------------------------------
# Anthropic


def test_anthropic_messages_fill_llm_calls(server, home, tracer_setup):
    anthropic = pytest.importorskip("anthropic", reason="needs tracegym[anthropic]")
    pytest.importorskip(
        "openinference.instrumentation.anthropic", reason="needs tracegym[anthropic]"
    )
    tracer_setup(home=home, capture_messages=True)
    client = anthropic.Anthropic(base_url=server.anthropic_url, api_key="test-key", max_retries=0)
    tool = {"name": "get_order", "description": "Look up an order.",
            "input_schema": ORDER_TOOL["function"]["parameters"]}  # fmt: skip

    @tg.agent("claude-support")
    def support(question: str) -> Any:
        return client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=256,
            system="Be brief.",
            messages=[{"role": "user", "content": question}],
            tools=[tool],
        )

    with integrations.instrumenting("anthropic"):
        message = support("where is order A1?")
    assert message.content[0].type == "tool_use"

    spans = spans_of(home)
    (root,) = [s for s in spans if s["name"] == "invoke_agent claude-support"]
    (call,) = [s for s in spans if s["scope"] == "openinference.instrumentation.anthropic"]
    assert (call["trace_id"], call["parent_span_id"]) == (root["trace_id"], root["span_id"])
    rows = query(home, "SELECT agent, model, input_tokens, output_tokens, output_messages "
                       "FROM llm_calls")  # fmt: skip
    assert [r[:4] for r in rows] == [
        ("claude-support", "claude-haiku-4-5", message.usage.input_tokens,
         message.usage.output_tokens)
    ]  # fmt: skip
    assert message.content[0].id in rows[0][4]  # the tool_use the model asked for


# ---------------------------------------------------------------------------------------------
# LangGraph over a fake chat model (no server)


def _order_graph() -> Any:
    pytest.importorskip("langgraph", reason="needs tracegym[langchain] and langgraph")
    pytest.importorskip(
        "openinference.instrumentation.langchain", reason="needs tracegym[langchain]"
    )
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: shipped"

    model = FakeMessagesListChatModel(
        responses=[
            AIMessage(
                content="",
                tool_calls=[{"name": "get_order", "args": {"order_id": "A1"}, "id": "call_lc_1"}],
                usage_metadata={"input_tokens": 11, "output_tokens": 5, "total_tokens": 16},
            ),
            AIMessage(
                content="It shipped.",
                usage_metadata={"input_tokens": 20, "output_tokens": 3, "total_tokens": 23},
            ),
        ]
    )

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([get_order]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def test_langgraph_graph_nests_under_the_agent(home, tracer_setup):
    graph = _order_graph()
    from langchain_core.messages import HumanMessage

    tracer_setup(home=home)

    @tg.agent("graph-agent")
    def run(question: str) -> str:
        return graph.invoke({"messages": [HumanMessage(question)]})["messages"][-1].content

    with integrations.instrumenting("langgraph"):  # an alias of "langchain"
        assert run("where is A1?") == "It shipped."

    spans = spans_of(home)
    by_id = {s["span_id"]: s for s in spans}
    (root,) = [s for s in spans if s["name"] == "invoke_agent graph-agent"]
    langchain = [s for s in spans if s["scope"] == "openinference.instrumentation.langchain"]
    assert len(langchain) >= 5
    for span in langchain:  # every span of the graph is in the run, under the agent
        assert span["trace_id"] == root["trace_id"]
        assert ancestors(span, by_id)[-1] == "invoke_agent graph-agent"
        assert span["attributes"][sc.AGENT_NAME] == "graph-agent"
    (graph_span,) = [s for s in langchain if s["name"] == "LangGraph"]
    assert graph_span["parent_span_id"] == root["span_id"]

    rows = query(home, "SELECT trace_id, input_tokens, output_tokens, step_index FROM llm_calls "
                       "ORDER BY start_time")  # fmt: skip
    assert [r[:3] for r in rows] == [(root["trace_id"], 11, 5), (root["trace_id"], 20, 3)]
    tools = query(home, "SELECT trace_id, tool, arguments, result, step_index FROM tool_calls")
    assert [t[:2] for t in tools] == [(root["trace_id"], "get_order")]
    assert "A1" in tools[0][2] and "shipped" in tools[0][3]
    assert rows[0][3] < tools[0][4] < rows[1][3]
    assert root["attributes"][sc.USED_TOKENS] == 11 + 5 + 20 + 3
    assert root["attributes"][sc.USED_STEPS] == 3  # two LLM calls and the tool, not the plumbing


# ---------------------------------------------------------------------------------------------
# OpenAI Agents SDK


def test_openai_agents_run_names_its_agent(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai-agents]")
    agents = pytest.importorskip("agents", reason="needs tracegym[openai-agents]")
    pytest.importorskip(
        "openinference.instrumentation.openai_agents", reason="needs tracegym[openai-agents]"
    )
    tracer_setup(home=home)

    @agents.function_tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: shipped"

    client = openai.AsyncOpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)
    model = agents.OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
    helper = agents.Agent(name="order-helper", instructions="Help.", tools=[get_order],
                          model=model)  # fmt: skip

    @tg.agent("outer")
    def run(question: str) -> str:
        return agents.Runner.run_sync(helper, question).final_output

    with integrations.instrumenting("openai-agents"):
        assert run("where is A1?") == "The order ships tomorrow."

    spans = spans_of(home)
    (root,) = [s for s in spans if s["name"] == "invoke_agent outer"]
    rows = query(home, "SELECT trace_id, agent, input_tokens FROM llm_calls ORDER BY start_time")
    assert len(rows) == 2
    # The LLM calls run in the SDK's agent, which runs in the user's.
    assert {(r[0], r[1]) for r in rows} == {(root["trace_id"], "order-helper")}
    assert all(r[2] for r in rows)
    assert query(home, "SELECT trace_id, tool, agent FROM tool_calls") == [
        (root["trace_id"], "get_order", "order-helper")
    ]
    assert query(home, "SELECT agent FROM spans WHERE operation = 'invoke_agent' AND "
                       "scope LIKE 'openinference%' AND name = 'order-helper'") == [
        ("order-helper",)
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# LiteLLM (its import alone takes seconds)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic, on litellm's own types
def test_litellm_completion_fills_llm_calls(server, home, tracer_setup, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list
    litellm = pytest.importorskip("litellm", reason="needs tracegym[litellm]")
    pytest.importorskip("openinference.instrumentation.litellm", reason="needs tracegym[litellm]")
    tracer_setup(home=home)

    @tg.agent("router")
    def run() -> Any:
        return litellm.completion(
            model="openai/gpt-4o-mini",
            api_base=server.openai_url,
            api_key="test-key",
            messages=[{"role": "user", "content": "where is order A1?"}],
        )

    with integrations.instrumenting("litellm"):
        response = run()
    (root,) = [s for s in spans_of(home) if s["name"] == "invoke_agent router"]
    assert query(home, "SELECT trace_id, parent_span_id, agent, model, input_tokens, "
                       "output_tokens FROM llm_calls") == [
        (root["trace_id"], root["span_id"], "router", "openai/gpt-4o-mini",
         response.usage.prompt_tokens, response.usage.completion_tokens)
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Content policy and redaction


def _one_openai_call(server: FakeLLMServer, content: str) -> Any:
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)

    responses = []

    @tg.agent("policy")
    def run() -> None:  # returns nothing: the agent span's own output holds no content
        responses.append(client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": content}], tools=[ORDER_TOOL]
        ))  # fmt: skip

    with integrations.instrumenting("openai"):
        run()
    return responses[0]


@pytest.mark.parametrize(
    ("settings", "messages_kept"),
    [
        ({"capture_content": False}, False),
        ({}, True),  # captured by default for the local store, as for tracegym's own llm spans
        ({"capture_messages": False}, False),
        ({"capture_messages": True}, True),
    ],
)
def test_content_policy_applies_to_instrumented_spans(
    server, home, tracer_setup, settings, messages_kept
):
    tracer_setup(home=home, **settings)
    marker = "Pineapple-7731 is my private order note"
    response = _one_openai_call(server, marker)
    assert response.usage.prompt_tokens > 0
    text = spool_text(home)
    assert (marker in text) is messages_kept
    assert ("order_id-1" in text) is messages_kept  # the model's tool call arguments
    (row,) = query(home, "SELECT model, input_tokens, output_tokens, input_messages, "
                         "output_messages FROM llm_calls")  # fmt: skip
    assert row[:3] == ("gpt-4o-mini-2024-08-06", response.usage.prompt_tokens,
                       response.usage.completion_tokens)  # fmt: skip
    assert (row[3] is not None, row[4] is not None) == (messages_kept, messages_kept)
    if not messages_kept:  # no masked placeholders either: the keys are gone
        (span,) = [s for s in spans_of(home) if s["name"] == "ChatCompletion"]
        assert not [k for k in span["attributes"] if k.startswith(("llm.input_messages",
                    "llm.output_messages", "input.value", "output.value"))]  # fmt: skip


def test_capture_off_drops_tool_arguments_of_instrumented_tools(home, tracer_setup):
    graph = _order_graph()
    from langchain_core.messages import HumanMessage

    tracer_setup(home=home, capture_content=False)

    @tg.agent("graph-agent")
    def run() -> str:
        return graph.invoke({"messages": [HumanMessage("where is A1?")]})["messages"][-1].content

    with integrations.instrumenting("langchain"):
        assert run() == "It shipped."
    text = spool_text(home)
    assert "where is A1" not in text and "shipped" not in text
    assert query(home, "SELECT tool, arguments, result FROM tool_calls") == [
        ("get_order", None, None)
    ]
    assert [r[0] for r in query(home, "SELECT input_tokens FROM llm_calls")] == [11, 20]


def test_secrets_in_instrumented_spans_are_redacted(server, home, tracer_setup):
    tracer_setup(home=home, capture_messages=True)
    secret = "sk-proj-" + "Q7x2" * 10
    _one_openai_call(server, f"my key is {secret}, where is my order?")
    text = spool_text(home)
    assert secret not in text
    (row,) = query(home, "SELECT input_messages FROM llm_calls")
    assert "[REDACTED]" in row[0] and "where is my order" in row[0]


@pytest.mark.parametrize("after_init", [False, True])
def test_testing_capture_sees_instrumented_spans(server, home, tracer_setup, after_init):
    """`tracegym.testing.capture()` records the instrumentors' spans with tracegym's, through
    the same processors (bookkeeping, content policy, redaction), and nothing reaches the
    installation `tracegym.init` made meanwhile."""
    if after_init:
        tracer_setup(home=home, capture_messages=True)
    secret = "sk-proj-" + "Q7x2" * 10
    with tg.testing.capture(capture_messages=True) as captured:
        response = _one_openai_call(server, f"my key is {secret}, where is my order?")
    (root,) = captured.by_operation(sc.OP_AGENT)
    (chat,) = captured.by_operation(sc.OP_CHAT)  # the OpenInference LLM span, by the mapping
    assert chat.name == "ChatCompletion" and captured.children(root) == [chat]
    assert chat.attributes[sc.AGENT_NAME] == "policy"  # tracegym's run bookkeeping ran
    assert chat.attributes[sc.STEP_INDEX] == 0
    assert root.attributes[sc.USED_TOKENS] == response.usage.total_tokens  # charged to the run
    assert captured.tree() == [("invoke_agent policy", [("ChatCompletion", [])])]
    (record,) = [r for r in captured.records() if r["name"] == "ChatCompletion"]
    attributes = record["attributes"]  # as the store would hold it
    assert attributes[sc.INPUT_TOKENS] == response.usage.prompt_tokens
    assert attributes[sc.REQUEST_MODEL] == "gpt-4o-mini-2024-08-06"  # llm.model_name
    assert "where is my order" in attributes[sc.INPUT_MESSAGES]
    assert secret not in json.dumps(record) and "[REDACTED]" in attributes[sc.INPUT_MESSAGES]
    with tg.testing.capture(capture_messages=False) as quiet:  # the capture's content policy
        _one_openai_call(server, "Pineapple-7731")
    assert quiet.by_operation(sc.OP_CHAT) and "Pineapple" not in json.dumps(quiet.records())
    if after_init:  # the calls made inside the captures went to the captures only
        assert not [s for s in spans_of(home) if s["name"] == "ChatCompletion"]
        _one_openai_call(server, "after the capture")
        assert [s["name"] for s in spans_of(home)].count("ChatCompletion") == 1


def test_long_values_are_cut_at_max_value_length(server, home, tracer_setup):
    tracer_setup(home=home, capture_messages=True, max_value_length=200)
    _one_openai_call(server, "word " * 400)
    (span,) = [s for s in spans_of(home) if s["name"] == "ChatCompletion"]
    attributes = span["attributes"]
    recorded = {k: v for k, v in attributes.items() if not k.startswith("gen_ai.")}
    assert not [k for k, v in recorded.items() if isinstance(v, str) and len(v) > 260]
    assert "truncated" in attributes["input.value"]
    # The messages built from them are still valid JSON, their text cut the same way.
    (message,) = json.loads(attributes[sc.INPUT_MESSAGES])
    text = message["parts"][0]["content"]
    assert len(text) < 260 and "truncated" in text


# ---------------------------------------------------------------------------------------------
# Lifecycle: before init, uninstrument, missing packages


def test_instrument_before_init_runs_untraced_then_records(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    from tracegym.tracer import setup

    setup._installed.provider = None  # as in a fresh process: no `init` yet
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)
    messages = [{"role": "user", "content": "hello"}]
    with integrations.instrumenting("openai"):
        before = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert before.choices[0].message.content == "The order ships tomorrow."
        tracer_setup(home=home)
        after = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    assert query(home, "SELECT input_tokens FROM llm_calls") == [(after.usage.prompt_tokens,)]
    assert tg.stats().internal_errors == 0


def test_uninstrument_restores_the_client(server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    tracer_setup(home=home)
    original = openai.OpenAI.request
    assert tg.instrument("openai") == ["openai"]
    assert tg.instrument("openai") == ["openai"]  # twice: still one instrumentor
    assert openai.OpenAI.request is not original
    assert tg.uninstrument("openai") == []
    assert openai.OpenAI.request is original
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    assert query(home, "SELECT count(*) FROM llm_calls") == [(0,)]


def test_missing_packages_and_unknown_names_are_refused_with_the_extra(monkeypatch):
    fake = integrations.Integration(
        "nosuchlib", "tracegym_no_such_library", "openinference.instrumentation.nosuchlib",
        "NoSuchInstrumentor", "openinference-instrumentation-nosuchlib", "nosuchlib",
    )  # fmt: skip
    monkeypatch.setitem(integrations.INTEGRATIONS, "nosuchlib", fake)
    with pytest.raises(tg.IntegrationError) as refused:
        tg.instrument("nosuchlib")
    message = str(refused.value)
    assert "pip install 'tracegym[nosuchlib]'" in message
    assert "tracegym_no_such_library" in message
    assert "openinference-instrumentation-nosuchlib" in message
    assert isinstance(refused.value, ImportError)
    with pytest.raises(tg.IntegrationError, match="unknown integration 'gemini'"):
        tg.instrument("gemini")
    # strict=False: logged, nothing raised, nothing installed
    assert "nosuchlib" not in tg.instrument("nosuchlib", strict=False)
    assert integrations.instrumented() == []
    assert "nosuchlib" not in integrations.available()


def test_no_names_instruments_every_installed_integration(monkeypatch, server, home, tracer_setup):
    pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    missing = integrations.Integration(
        "nosuchlib", "tracegym_no_such_library", "openinference.instrumentation.nosuchlib",
        "NoSuchInstrumentor", "openinference-instrumentation-nosuchlib", "nosuchlib",
    )  # fmt: skip
    only = {"openai": integrations.INTEGRATIONS["openai"], "nosuchlib": missing}
    monkeypatch.setattr(integrations, "INTEGRATIONS", only)
    try:
        assert tg.instrument() == ["openai"]  # the missing one is skipped without a word
    finally:
        tg.uninstrument()
    assert integrations.instrumented() == []


def test_a_failure_of_tracegym_never_reaches_the_agent(monkeypatch, server, home, tracer_setup):
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    from tracegym.tracer import third_party as foreign

    tracer_setup(home=home)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug in tracegym")

    monkeypatch.setattr(foreign, "apply_policy", broken)
    monkeypatch.setattr(foreign.ForeignSpans, "_charge", broken)
    client = openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)

    @tg.agent("robust")
    def run() -> str:
        reply = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        return reply.choices[0].message.content

    with integrations.instrumenting("openai"):
        assert run() == "The order ships tomorrow."
    stats = tg.stats()
    assert stats.errors.get("foreign.end") == 1
    # The span the content policy could not check is dropped and counted, never written.
    assert stats.counters.get("spans_dropped.content_policy") == 1
    assert query(home, "SELECT count(*) FROM llm_calls") == [(0,)]
    assert query(home, "SELECT count(*) FROM spans WHERE name = 'invoke_agent robust'") == [(1,)]
