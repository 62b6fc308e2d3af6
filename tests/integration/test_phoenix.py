"""tracegym's spans in a real Phoenix: what a Phoenix user sees.

`phoenix serve` runs on loopback (PHOENIX_HOST=127.0.0.1, free ports, a temporary working
directory); an agent traced with tracegym exports to it over OTLP/HTTP through tracegym's own
pipeline (`tg.init(otlp_endpoint=...)`: redaction, batching); Phoenix's REST API then says what
its UI shows for each span: the kind, the input and output panels, the LLM messages (Phoenix
reads them from `gen_ai.input.messages`/`gen_ai.output.messages` only when they have the GenAI
convention's shape) and the token counts. A control run with the OpenInference attributes off
shows what they add (step, subtask and memory spans are UNKNOWN to Phoenix without them); a
third run at the default level, kinds, has every kind right.

Run by `make integration` (which installs arize-phoenix into a venv of its own); skipped, saying
so, where `phoenix` is not importable.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "phoenix.server.main",
    reason="arize-phoenix is not installed (`make integration` installs it in a venv of its own)",
)

import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.tracer.operations import state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START_TIMEOUT_S = 180.0

OPENAI_RESPONSE = {
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_order", "arguments": '{"order_id": "W-1"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 31, "completion_tokens": 5},
}
ANTHROPIC_RESPONSE = {
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "Order W-1 has shipped."}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 40, "output_tokens": 7},
}


@tg.tool
def get_order(order_id: str) -> dict[str, str]:
    return {"order_id": order_id, "status": "shipped"}


@tg.memory_write(store="notes")
def remember(key: str, text: str) -> None:
    return None


@tg.memory_read(store="notes")
def recall(key: str) -> str:
    return "customer prefers email"


@tg.step
def plan(goal: str) -> str:
    return "look the order up"


@tg.llm(model="gpt-4o-mini", provider="openai", capture_messages=True)
def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return OPENAI_RESPONSE


@tg.llm(model="claude-sonnet-4-5", provider="anthropic", capture_messages=True)
def answer(system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return ANTHROPIC_RESPONSE


@tg.agent(name="support")
def support(request: str) -> str:
    plan(request)
    remember("mia", "customer prefers email")
    recall("mia")
    messages: list[dict[str, Any]] = [{"role": "user", "content": request}]
    ask(messages)
    with tg.subtask("lookup", budget_steps=5):
        result = get_order("W-1")
    messages += [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_1", "name": "get_order", "input": {"order_id": "W-1"}}
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": json.dumps(result)}
        ]},
    ]  # fmt: skip
    answer("You are the shop's assistant.", messages)
    return "Order W-1 has shipped."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback only
        return json.load(response)


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`phoenix serve` on loopback; yields its base URL."""
    workdir = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(_free_port()),
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (workdir / "phoenix.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "phoenix.server.main", "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(
                        "phoenix serve did not come up:\n" + Path(log.name).read_text()[-3000:]
                    )
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


LEVELS = ("full", "off", "kinds")  # the runs, in order


@pytest.fixture(scope="module")
def seen(phoenix: str) -> dict[str, dict[str, dict[str, Any]]]:
    """One run exported to Phoenix per OpenInference level: level -> span name -> what
    Phoenix's REST API returns for it."""
    saved = state.tracer, state.settings
    provider = TracerProvider()
    try:
        tg.init(
            service="tracegym-phoenix-test",
            provider=provider,
            spool=False,
            otlp_endpoint=phoenix,
            capture_messages=True,
        )
        for level in LEVELS:
            state.settings.openinference = level
            support("Where is order W-1? My key is sk-proj-A1b2C3d4E5f6G7h8J9k0L1m2")
        assert tg.flush(30)
    finally:
        tg.shutdown()
        provider.shutdown()
        state.tracer, state.settings = saved
    spans: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # Phoenix ingests asynchronously
        spans = _get(f"{phoenix}/v1/projects/default/spans?limit=1000")["data"]
        if len(spans) >= 8 * len(LEVELS):
            break
        time.sleep(0.5)
    roots = {s["context"]["trace_id"] for s in spans if s["name"] == "invoke_agent support"}
    assert len(roots) == len(LEVELS), [s["name"] for s in spans]

    def started(trace_id: str) -> str:  # ISO times of one format: they sort as text
        return min(s["start_time"] for s in spans if s["context"]["trace_id"] == trace_id)

    level_of = dict(zip(sorted(roots, key=started), LEVELS, strict=True))
    by_run: dict[str, dict[str, dict[str, Any]]] = {level: {} for level in LEVELS}
    for span in spans:
        by_run[level_of[span["context"]["trace_id"]]][span["name"]] = span
    return by_run


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return span["attributes"]


def test_span_kinds(seen: dict) -> None:
    kinds = {name: span["span_kind"] for name, span in seen["full"].items()}
    assert {name: span["span_kind"] for name, span in seen["kinds"].items()} == kinds
    assert kinds == {
        "invoke_agent support": "AGENT",
        "step plan": "CHAIN",
        "update_memory notes": "CHAIN",
        "search_memory notes": "RETRIEVER",
        "chat gpt-4o-mini": "LLM",
        "subtask lookup": "CHAIN",
        "execute_tool get_order": "TOOL",
        "chat claude-sonnet-4-5": "LLM",
    }
    # the control: without tracegym's OpenInference attributes Phoenix knows only the GenAI
    # operations it maps itself
    control = {name: span["span_kind"] for name, span in seen["off"].items()}
    assert control["step plan"] == control["subtask lookup"] == "UNKNOWN"
    assert control["search_memory notes"] == "UNKNOWN"
    assert control["invoke_agent support"] == "AGENT"


def test_inputs_and_outputs(seen: dict) -> None:
    agent = _attrs(seen["full"]["invoke_agent support"])
    assert "Where is order W-1?" in agent["input.value"]
    assert "sk-proj-A1b2" not in json.dumps(agent)  # redacted before it left the process
    assert (agent["output.value"], agent["output.mime_type"]) == (
        "Order W-1 has shipped.",
        "text/plain",
    )
    assert _attrs(seen["full"]["step plan"])["output.value"] == "look the order up"
    tool = _attrs(seen["full"]["execute_tool get_order"])
    assert json.loads(tool["input.value"]) == {"order_id": "W-1"}
    assert json.loads(tool["output.value"]) == {"order_id": "W-1", "status": "shipped"}
    read = _attrs(seen["full"]["search_memory notes"])
    assert (read["input.value"], read["output.value"]) == ("mia", "customer prefers email")
    assert _attrs(seen["full"]["update_memory notes"])["input.value"] == "customer prefers email"
    assert "input.value" not in _attrs(seen["off"]["invoke_agent support"])  # the control


def _messages(attrs: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """Phoenix's flattened `llm.input_messages.N.message.*` keys as a list of dicts."""
    found: dict[int, dict[str, Any]] = {}
    prefix = f"llm.{key}."
    for name, value in attrs.items():
        if name.startswith(prefix):
            index, _, field = name[len(prefix) :].partition(".message.")
            found.setdefault(int(index), {})[field] = value
    return [found[i] for i in sorted(found)]


def test_llm_messages(seen: dict) -> None:
    gpt = _attrs(seen["full"]["chat gpt-4o-mini"])
    (user,) = _messages(gpt, "input_messages")
    assert user["role"] == "user" and "Where is order W-1?" in user["content"]
    (reply,) = _messages(gpt, "output_messages")
    assert reply["tool_calls.0.tool_call.function.name"] == "get_order"
    assert json.loads(reply["tool_calls.0.tool_call.function.arguments"]) == {"order_id": "W-1"}
    assert reply["finish_reason"] == "tool_call"
    claude = _attrs(seen["full"]["chat claude-sonnet-4-5"])
    messages = _messages(claude, "input_messages")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[0]["content"] == "You are the shop's assistant."  # from `system=`
    assert messages[2]["tool_calls.0.tool_call.id"] == "call_1"
    assert messages[3]["tool_call_id"] == "call_1"
    assert _messages(claude, "output_messages")[0]["content"] == "Order W-1 has shipped."


def test_tokens_and_models(seen: dict) -> None:
    gpt = _attrs(seen["full"]["chat gpt-4o-mini"])
    tokens = [gpt[f"llm.token_count.{k}"] for k in ("prompt", "completion", "total")]
    assert tokens == [31, 5, 36]
    assert gpt["llm.model_name"] == "gpt-4o-mini-2024-07-18"
    claude = _attrs(seen["full"]["chat claude-sonnet-4-5"])
    assert [claude[f"llm.token_count.{k}"] for k in ("prompt", "completion", "total")] == [
        40,
        7,
        47,
    ]


def test_every_shape_validates_against_the_conventions_schemas() -> None:
    """Phoenix validates gen_ai.* messages with pydantic models generated from the GenAI
    convention's JSON schemas, and drops a whole list when one item fails: every shape the
    normaliser takes, odd ones included, must pass them."""
    from phoenix.trace.gen_ai.__generated__.models import (
        InputMessages,
        OutputMessages,
        SystemInstructions,
    )
    from tracegym.tracer.messages import (
        encode,
        input_messages,
        output_messages,
        system_instructions,
    )

    inputs: list = [
        "hello",
        [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}],
        [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {"type": "widget", "w": 1}]}],
        [{"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "x"}},
         {"role": "function", "name": "f", "content": "42"}],
        [{"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "redacted_thinking", "data": "zz"},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": [1, {"b": None}]}}]},
         {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image",
             "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]},
            {"type": "text", "text": "and?"}]}],
        {"input": [{"type": "function_call_output", "call_id": "c", "output": {"ok": 1}}]},
        {"contents": [{"role": "model", "parts": [{"functionResponse": {"name": "f",
                                                                     "response": {"r": 1}}}]}]},
        {"question": "why?"},
        [None, 3, ["nested"]],
    ]  # fmt: skip
    outputs: list = [
        "text",
        {"choices": [{"message": {"role": "assistant", "content": "a", "refusal": "no"},
                      "finish_reason": "content_filter"},
                     {"text": "legacy", "finish_reason": None}]},
        {"type": "message", "role": "assistant", "content": [], "stop_reason": "pause_turn"},
        {"status": "incomplete", "output": [{"type": "reasoning", "summary": []}]},
        {"candidates": [{"content": {"parts": [{"text": "g"}]}, "finishReason": "SAFETY"}]},
        {"output": "x"},
        [{"role": "assistant", "content": "a"}, "b"],
        None,
    ]  # fmt: skip
    from phoenix.trace.gen_ai.__generated__.models import GenericPart

    def typed(parts: list) -> None:  # a known part type that fails its schema falls back to
        for part in parts:  # GenericPart (any "type"): that would be a malformed part
            assert not isinstance(part, GenericPart), part

    for value in inputs:
        for message in InputMessages.model_validate_json(encode(input_messages(value))).root:
            typed(message.parts)
    for value in outputs:
        for message in OutputMessages.model_validate_json(encode(output_messages(value))).root:
            typed(message.parts)
    for value in ("Be kind.", [{"type": "text", "text": "Be kind."}], {"odd": 1}):
        typed(SystemInstructions.model_validate_json(encode(system_instructions(value))).root)
