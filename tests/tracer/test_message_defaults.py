"""The message capture default: LLM messages are captured for the local store, and sent to an
OTLP endpoint only when asked for (`capture_messages=True`, TRACEGYM_CAPTURE_MESSAGES, or the
GenAI convention's OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT); `capture_messages=False`
captures them nowhere. One `tracegym.init` writes the spool of one home and exports over
OTLP/HTTP to a receiver writing another."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tracegym as tg
from tracegym.tracer import semconv as sc

pytest.importorskip("duckdb", reason="the store needs tracegym[analysis]")
from tracegym.store.receiver import Receiver
from tracegym.store.store import Store

MESSAGE_KEYS = (sc.INPUT_MESSAGES, sc.OUTPUT_MESSAGES, sc.SYSTEM_INSTRUCTIONS)
SECRET = "sk-proj-" + "Q7x2" * 10


@tg.llm(model="gpt-test", system_instructions="Be brief.")
def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "choices": [{"message": {"role": "assistant", "content": "It ships Monday."}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4},
    }


@tg.agent("support")
def support(question: str) -> str:
    reply = chat([{"role": "user", "content": question}])
    return reply["choices"][0]["message"]["content"]


@pytest.fixture
def run_both(tmp_path: Path, tracer_setup: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """run(**init_kwargs) -> (local chat span attributes, remote ones, remote agent's)."""
    with Receiver(tmp_path / "remote", port=0) as receiver:

        def run(**kwargs: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
            tracer_setup(home=tmp_path / "local", otlp_endpoint=receiver.url, **kwargs)
            assert support(f"where is order A1? my key is {SECRET}") == "It ships Monday."
            assert tg.flush(10)
            receiver.stop()
            found = []
            for home in (tmp_path / "local", tmp_path / "remote"):
                with Store(home) as store:
                    rows = {r["name"]: json.loads(r["attributes"])
                            for r in store.rows("SELECT name, attributes FROM spans")}  # fmt: skip
                found.append(rows)
            local, remote = found
            assert set(local) == set(remote) == {"invoke_agent support", "chat gpt-test"}
            return local["chat gpt-test"], remote["chat gpt-test"], remote["invoke_agent support"]

        yield run


def test_by_default_messages_stay_in_the_local_store(run_both):
    local, remote, remote_agent = run_both()
    assert json.loads(local[sc.INPUT_MESSAGES]) == [
        {
            "role": "user",
            "parts": [{"type": "text", "content": "where is order A1? my key is [REDACTED]"}],
        }
    ]  # fmt: skip  (redaction applies to the local copy)
    assert json.loads(local[sc.OUTPUT_MESSAGES])[0]["parts"][0]["content"] == "It ships Monday."
    assert sc.SYSTEM_INSTRUCTIONS in local
    assert not [k for k in MESSAGE_KEYS if k in remote]
    # Everything else still goes out: model, tokens, the agent's own input (content, not messages)
    assert (remote[sc.REQUEST_MODEL], remote[sc.INPUT_TOKENS], remote[sc.OUTPUT_TOKENS]) == (
        "gpt-test", 11, 4
    )  # fmt: skip
    assert "where is order A1?" in remote_agent[sc.INPUT]
    assert SECRET not in json.dumps([local, remote, remote_agent])


@pytest.mark.parametrize(
    ("kwargs", "env"),
    [
        ({"capture_messages": True}, {}),
        ({}, {"TRACEGYM_CAPTURE_MESSAGES": "1"}),
        ({}, {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}),
    ],
)
def test_asked_for_messages_are_exported_too(run_both, monkeypatch, kwargs, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    local, remote, _ = run_both(**kwargs)
    for key in MESSAGE_KEYS:
        assert json.loads(remote[key]) == json.loads(local[key])


@pytest.mark.parametrize(
    ("kwargs", "env"),
    [
        ({"capture_messages": False}, {}),
        ({}, {"TRACEGYM_CAPTURE_MESSAGES": "0"}),
        ({}, {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "false"}),
        ({"capture_messages": False}, {"TRACEGYM_CAPTURE_MESSAGES": "1"}),  # the argument wins
    ],
)
def test_switched_off_messages_are_captured_nowhere(run_both, monkeypatch, kwargs, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    local, remote, _ = run_both(**kwargs)
    for attributes in (local, remote):
        # (the instructions given to `tg.llm` itself are the code's, not captured: they stay)
        assert sc.INPUT_MESSAGES not in attributes and sc.OUTPUT_MESSAGES not in attributes
        assert attributes[sc.INPUT_TOKENS] == 11


def test_the_applications_exporters_and_openinference_values_get_no_messages(
    tmp_path, tracer_setup, monkeypatch
):
    """The application's own exporters are other destinations too; and at
    TRACEGYM_OPENINFERENCE=full a chat span mirrors its last message as `input.value`, which
    is a message as well (the agent's `input.value` is its input, and goes out)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setenv("TRACEGYM_OPENINFERENCE", "full")
    memory = InMemorySpanExporter()
    tracer_setup(home=tmp_path, exporters=[memory])
    support("where is order A1?")
    assert tg.flush(10)
    sent = {s.name: dict(s.attributes or {}) for s in memory.get_finished_spans()}
    chat_span, agent_span = sent["chat gpt-test"], sent["invoke_agent support"]
    assert not [k for k in chat_span if k in (*MESSAGE_KEYS, sc.OI_INPUT_VALUE, sc.OI_OUTPUT_VALUE)]
    assert chat_span["openinference.span.kind"] == "LLM"  # the kind, model, tokens still go
    assert chat_span[sc.INPUT_TOKENS] == 11
    assert "where is order A1?" in agent_span[sc.OI_INPUT_VALUE]
    with Store(tmp_path) as store:
        ((messages,),) = store.sql("SELECT input_messages FROM llm_calls").fetchall()
    assert "where is order A1?" in messages


def test_instrumented_llm_spans_follow_the_same_default(tmp_path, tracer_setup):
    """OpenInference's OpenAI spans: messages in the local store, none over OTLP."""
    openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
    pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
    from tracegym.tests.fixtures.fake_llm_server import FakeLLMServer
    from tracegym.tracer import integrations

    with FakeLLMServer() as server, Receiver(tmp_path / "remote", port=0) as receiver:
        tracer_setup(home=tmp_path / "local", otlp_endpoint=receiver.url)
        client = openai.OpenAI(base_url=server.openai_url, api_key="k", max_retries=0)

        @tg.agent("support")
        def run() -> None:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "Pineapple-7731"}]
            )

        with integrations.instrumenting("openai"):
            run()
        assert tg.flush(10)
        receiver.stop()
    sql = "SELECT model, input_tokens, input_messages, output_messages FROM llm_calls"
    with Store(tmp_path / "local") as local, Store(tmp_path / "remote") as remote:
        ((model, tokens, sent, answer),) = local.sql(sql).fetchall()
        assert "Pineapple-7731" in sent and answer is not None
        assert remote.sql(sql).fetchall() == [(model, tokens, None, None)]
        (attributes,) = [json.loads(r[0]) for r in remote.sql(
            "SELECT attributes FROM spans WHERE name = 'ChatCompletion'").fetchall()]  # fmt: skip
    assert "Pineapple" not in json.dumps(attributes)
    assert not [k for k in attributes if k.startswith(("llm.input_messages", "llm.output_messages",
                                                       "input.value", "output.value"))]  # fmt: skip


def test_one_function_asking_for_messages_keeps_them_local(tmp_path, tracer_setup):
    """`@tg.llm(capture_messages=True)` under a global off: captured, and still not exported."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    @tg.llm(model="gpt-test", capture_messages=True)
    def chatty(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}

    memory = InMemorySpanExporter()
    tracer_setup(home=tmp_path, exporters=[memory], capture_messages=False)
    chatty([{"role": "user", "content": "Pineapple-7731"}])
    assert tg.flush(10)
    (sent,) = memory.get_finished_spans()
    assert sc.INPUT_MESSAGES not in (sent.attributes or {})
    with Store(tmp_path) as store:
        ((messages,),) = store.sql("SELECT input_messages FROM llm_calls").fetchall()
    assert "Pineapple-7731" in messages
