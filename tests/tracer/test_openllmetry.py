"""OpenLLMetry (Traceloop) spans fill the same columns whether they reach the store through
tracegym's provider in process (the spool) or over OTLP (`tracegym collect`'s receiver).

One `tracegym.init` exports the same spans to both: the spool of one home and, over OTLP/HTTP,
a receiver writing another home; the `llm_calls`, `tool_calls` and `traces` rows of the two must
be identical (and right). The LLM spans come from the real `opentelemetry-instrumentation-openai`
(OpenLLMetry's) driving a real `openai` client against the loopback fake server.

Traceloop's workflow/task/agent/tool spans come from `traceloop-sdk`'s decorators, which this
venv does not install: traceloop-sdk 0.62.4 pins OpenTelemetry 1.34 (this project runs 1.45) and
pulls ~30 instrumentations, grpc and posthog. The spans are built here with the plain OpenTelemetry
API, with exactly what its decorators and span processor write (read from its source,
`traceloop/sdk/decorators/base.py` `_setup_span`, `_handle_span_input/_output`, and
`traceloop/sdk/tracing/tracing.py` `default_span_processor_on_start`): span name
`<entity>.<kind>`, `traceloop.span.kind`, `traceloop.entity.name`, `traceloop.entity.input` /
`output` as `json.dumps({"args": ..., "kwargs": ...})` / `json.dumps(result)`, `gen_ai.tool.name`
on tools, and on every span started inside: `traceloop.workflow.name`, `traceloop.entity.path`,
`gen_ai.agent.name` (inside an agent).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tracegym as tg
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk.trace import Span, SpanProcessor
from tracegym.tests.fixtures.fake_llm_server import (
    ORDER_TOOL,
    REPLY,
    TOOL_CALL_ID,
    FakeLLMServer,
    order_agent,
)

openai = pytest.importorskip("openai", reason="needs the openai client")
openllmetry = pytest.importorskip(
    "opentelemetry.instrumentation.openai",
    reason="needs OpenLLMetry's opentelemetry-instrumentation-openai",
)
pytest.importorskip("duckdb", reason="the store needs tracegym[analysis]")
from tracegym.store.receiver import Receiver  # noqa: E402
from tracegym.store.store import Store  # noqa: E402

pytestmark = pytest.mark.timeout(120)

LLM_SQL = (
    "SELECT trace_id, span_id, agent, model, input_tokens, output_tokens, step_index, "
    "input_messages, output_messages, status FROM llm_calls ORDER BY start_time"
)
TOOL_SQL = (
    "SELECT trace_id, span_id, tool, call_id, arguments, result, step_index, status "
    "FROM tool_calls ORDER BY start_time"
)
TRACE_SQL = "SELECT trace_id, agent, spans, llm_calls, tool_calls, tokens FROM traces"


@dataclass
class TwoPaths:
    """The same spans, spooled in process into `local` and sent over OTLP into `remote`."""

    local: Path
    remote: Path
    receiver: Receiver
    provider: Any

    def rows(self, sql: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """`sql` on both homes (flushes tracegym and stops the receiver first)."""
        assert tg.flush(10)
        self.receiver.stop()
        with Store(self.local) as local, Store(self.remote) as remote:
            return local.sql(sql).fetchall(), remote.sql(sql).fetchall()


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as running:
        yield running


@pytest.fixture
def paths(tmp_path: Path, tracer_setup: Callable[..., Any]) -> Iterator[TwoPaths]:
    with Receiver(tmp_path / "remote", port=0) as receiver:
        provider = tracer_setup(
            home=tmp_path / "local", otlp_endpoint=receiver.url, capture_messages=True
        )
        instrumentor = openllmetry.OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            yield TwoPaths(tmp_path / "local", tmp_path / "remote", receiver, provider)
        finally:
            instrumentor.uninstrument()
            _unwrap_openllmetry()


def _openllmetry_wrappers() -> Iterator[tuple[type, str, Any]]:
    """(class, attribute, wrapper) of each `openai` method OpenLLMetry's wrappers hold."""
    import inspect
    import sys

    for name, module in list(sys.modules.items()):
        if not name.startswith("openai.resources") or module is None:
            continue
        for cls in [v for v in vars(module).values() if inspect.isclass(v)]:
            for attribute, value in list(vars(cls).items()):
                wrapper = getattr(value, "_self_wrapper", None)
                if getattr(wrapper, "__module__", "").startswith(openllmetry.__name__):
                    yield cls, attribute, value


def _unwrap_openllmetry() -> None:
    """Undo what `OpenAIInstrumentor().uninstrument()` leaves wrapped: 0.62.4 calls
    `unwrap("openai.resources.chat.completions", "Completions.create")`, which
    opentelemetry-instrumentation 0.66's `unwrap` reads as attribute "Completions.create" of
    module `openai.resources.chat`, so nothing is unwrapped, and later tests in the process
    would still get OpenLLMetry's spans."""
    for cls, attribute, value in list(_openllmetry_wrappers()):
        setattr(cls, attribute, value.__wrapped__)
    assert not list(_openllmetry_wrappers())


def client(server: FakeLLMServer) -> Any:
    return openai.OpenAI(base_url=server.openai_url, api_key="test-key", max_retries=0)


def test_openllmetry_chat_spans_fill_the_same_rows_in_process_and_over_otlp(server, paths):
    llm = client(server)
    usages = []

    support = order_agent(llm, usages)

    assert support("where is order A1?") == REPLY  # the user's code saw the real reply

    local, remote = paths.rows(LLM_SQL)
    assert local == remote
    assert len(local) == 2
    assert {r[2] for r in local} == {"support"}
    assert [r[3] for r in local] == ["gpt-4o-mini-2024-08-06"] * 2  # the response's model
    assert [(r[4], r[5]) for r in local] == [(u.prompt_tokens, u.completion_tokens) for u in usages]
    assert local[0][4] != local[1][4]  # the second prompt is longer: the counts are real
    (asked,) = json.loads(local[0][8])  # GenAI message/parts shape
    assert asked["role"] == "assistant"
    assert asked["parts"] == [{"type": "tool_call", "id": TOOL_CALL_ID, "name": "get_order",
                               "arguments": {"order_id": "order_id-1"}}]  # fmt: skip
    sent = json.loads(local[1][7])
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[0]["parts"] == [{"type": "text", "content": "where is order A1?"}]
    (answer,) = json.loads(local[1][8])
    assert answer["parts"] == [{"type": "text", "content": REPLY}]

    local_tools, remote_tools = paths.rows(TOOL_SQL)
    assert local_tools == remote_tools
    ((trace_id, _, tool, call_id, arguments, _, step, _),) = local_tools
    assert (trace_id, tool, call_id, json.loads(arguments)) == (
        local[0][0], "get_order", TOOL_CALL_ID, {"order_id": "order_id-1"}
    )  # fmt: skip
    assert local[0][6] < step < local[1][6]  # one step counter for the run

    local_traces, remote_traces = paths.rows(TRACE_SQL)
    assert local_traces == remote_traces
    tokens = sum(u.prompt_tokens + u.completion_tokens for u in usages)
    assert local_traces == [(local[0][0], "support", 4, 2, 1, tokens)]


# ---------------------------------------------------------------------------------------------
# Traceloop's workflow / task / agent / tool spans (what traceloop-sdk's decorators write)


class TraceloopContextProcessor(SpanProcessor):
    """traceloop-sdk's `default_span_processor_on_start`: names from the context on every span
    started inside a workflow, agent or task (OpenLLMetry's LLM spans included)."""

    def on_start(self, span: Span, parent_context: context_api.Context | None = None) -> None:
        workflow = context_api.get_value("workflow_name")
        if workflow is not None:
            span.set_attribute("traceloop.workflow.name", str(workflow))
        agent = context_api.get_value("agent_name")
        if agent is not None:
            span.set_attribute("gen_ai.agent.name", str(agent))
        path = context_api.get_value("entity_path")
        if path is not None:
            span.set_attribute("traceloop.entity.path", str(path))


def traceloop_entity(provider: Any, kind: str, name: str) -> Callable[[Callable[..., Any]], Any]:
    """traceloop-sdk's `@workflow(name=)`, `@task`, `@agent` and `@tool` (sync functions)."""
    tracer = provider.get_tracer("traceloop.tracer")  # traceloop-sdk's TRACER_NAME

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            tokens = []
            if kind == "workflow":
                tokens.append(context_api.attach(context_api.set_value("workflow_name", name)))
            elif kind == "agent":
                tokens.append(context_api.attach(context_api.set_value("agent_name", name)))
            span = tracer.start_span(f"{name}.{kind}")
            tokens.append(context_api.attach(trace.set_span_in_context(span)))
            if kind in ("task", "tool"):
                parent = context_api.get_value("entity_path")
                path = name if parent is None else f"{parent}.{name}"
                tokens.append(context_api.attach(context_api.set_value("entity_path", path)))
            span.set_attribute("traceloop.span.kind", kind)
            span.set_attribute("traceloop.entity.name", name)
            if kind == "tool":
                span.set_attribute("gen_ai.tool.name", name)
            span.set_attribute(
                "traceloop.entity.input", json.dumps({"args": args, "kwargs": kwargs})
            )
            try:
                result = fn(*args, **kwargs)
                span.set_attribute("traceloop.entity.output", json.dumps(result))
                return result
            finally:
                span.end()
                for token in reversed(tokens):
                    context_api.detach(token)

        return wrapper

    return decorate


def test_traceloop_workflow_task_and_tool_spans_fill_the_same_rows_both_ways(server, paths):
    paths.provider.add_span_processor(TraceloopContextProcessor())
    llm = client(server)
    entity = functools.partial(traceloop_entity, paths.provider)

    @entity("tool", "get_order")
    def get_order(order_id: str) -> dict[str, str]:
        return {"order_id": order_id, "status": "shipped"}

    @entity("task", "plan")
    def plan(question: str) -> Any:
        reply = llm.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": question}],
            tools=[ORDER_TOOL],
        )
        return json.loads(reply.choices[0].message.tool_calls[0].function.arguments)

    @entity("workflow", "order_support")
    def order_support(question: str) -> str:
        arguments = plan(question)
        return get_order(**arguments)["status"]

    assert order_support("where is order A1?") == "shipped"

    local_traces, remote_traces = paths.rows(TRACE_SQL)
    assert local_traces == remote_traces
    ((trace_id, agent, spans, llm_calls, tool_calls, tokens),) = local_traces
    assert (agent, spans, llm_calls, tool_calls) == ("order_support", 4, 1, 1)
    assert tokens > 0

    local_llm, remote_llm = paths.rows(LLM_SQL)
    assert local_llm == remote_llm
    ((llm_trace, _, llm_agent, model, *_),) = local_llm
    # The workflow names the agent of every span inside it (traceloop.workflow.name).
    assert (llm_trace, llm_agent, model) == (trace_id, "order_support", "gpt-4o-mini-2024-08-06")

    local_tools, remote_tools = paths.rows(TOOL_SQL)
    assert local_tools == remote_tools
    ((tool_trace, _, tool, _, arguments, result, _, status),) = local_tools
    assert (tool_trace, tool, status) == (trace_id, "get_order", "UNSET")
    # traceloop.entity.input/output of a tool span are its arguments and result
    assert json.loads(arguments) == {"args": [], "kwargs": {"order_id": "order_id-1"}}
    assert json.loads(result) == {"order_id": "order_id-1", "status": "shipped"}

    with Store(paths.local) as local, Store(paths.remote) as remote:
        sql = "SELECT name, operation FROM spans ORDER BY start_ns"
        kinds = local.sql(sql).fetchall()
        assert kinds == remote.sql(sql).fetchall()
    assert kinds == [("order_support.workflow", "invoke_agent"), ("plan.task", "step"),
                     ("openai.chat", "chat"), ("get_order.tool", "execute_tool")]  # fmt: skip
