"""LLM messages in the GenAI message/parts shape (tracer/messages.py), read back in either shape
by the readers, and the OpenInference attributes tracegym's spans carry for Phoenix."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tracegym as tg
from tracegym.analysis.attribution import _chat_text
from tracegym.analysis.detectors.tool_order import _answer_seen
from tracegym.analysis.detectors.ungrounded import _message_sources
from tracegym.analysis.runs import Step
from tracegym.synthesis.conventions import system_message
from tracegym.tracer import semconv as sc
from tracegym.tracer.messages import (
    chat_messages,
    encode,
    input_messages,
    output_messages,
    system_instructions,
)
from tracegym.tracer.openinference import ATTRIBUTES, attributes_for
from tracegym.tracer.serialize import TRUNCATION_MARKER, to_json
from tracegym.tracer.spool import span_record

# An OpenAI-shaped conversation: system, user, an assistant tool call, the tool's answer.
OPENAI_INPUT = [
    {"role": "system", "content": "You are the shop's assistant."},
    {"role": "user", "content": "Where is order W-1?"},
    {
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
    {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
]
GENAI_INPUT = [
    {"role": "system", "parts": [{"type": "text", "content": "You are the shop's assistant."}]},
    {"role": "user", "parts": [{"type": "text", "content": "Where is order W-1?"}]},
    {
        "role": "assistant",
        "parts": [
            {
                "type": "tool_call",
                "id": "call_1",
                "name": "get_order",
                "arguments": {"order_id": "W-1"},
            }
        ],
    },
    {
        "role": "tool",
        "parts": [
            {"type": "tool_call_response", "id": "call_1", "response": '{"status": "shipped"}'}
        ],
    },
]
OPENAI_RESPONSE = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "It has shipped."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 31, "completion_tokens": 5, "total_tokens": 36},
}
ANTHROPIC_MESSAGES = [
    {"role": "user", "content": "Where is order W-1?"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "get_order",
                "input": {"order_id": "W-1"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "shipped"}],
            }
        ],
    },
]
ANTHROPIC_RESPONSE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [
        {"type": "thinking", "thinking": "The tool said shipped.", "signature": "sig"},
        {"type": "text", "text": "It has shipped."},
    ],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 40, "output_tokens": 7},
}


def a(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


# The write side: OpenAI ------------------------------------------------------------------------
def test_openai_messages_become_parts():
    assert input_messages(OPENAI_INPUT) == GENAI_INPUT


def test_openai_content_parts_and_legacy_shapes():
    got = input_messages(
        [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "name": "mia", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ]},
            {"role": "assistant", "content": None,
             "function_call": {"name": "lookup", "arguments": "not json"}},
            {"role": "function", "name": "lookup", "content": "42"},
        ]
    )  # fmt: skip
    assert got == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "name": "mia", "parts": [
            {"type": "text", "content": "What is this?"},
            {"type": "uri", "modality": "image", "mime_type": None, "uri": "https://x.test/a.png"},
            {"type": "blob", "modality": "image", "mime_type": "image/png",
             "content": "iVBORw0KGgo="},
        ]},
        {"role": "assistant", "parts": [
            {"type": "tool_call", "id": None, "name": "lookup", "arguments": "not json"}]},
        {"role": "tool", "name": "lookup", "parts": [
            {"type": "tool_call_response", "id": None, "response": "42"}]},
    ]  # fmt: skip


def test_a_tool_message_with_text_parts_keeps_its_call_id():
    message = {"role": "tool", "tool_call_id": "c7", "content": [{"type": "text", "text": "ok"}]}
    assert input_messages([message]) == [
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c7", "response": "ok"}]}
    ]


def test_openai_response_becomes_output_messages_with_finish_reasons():
    assert output_messages(OPENAI_RESPONSE) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "It has shipped."}],
         "finish_reason": "stop"}
    ]  # fmt: skip
    calls = {
        "choices": [
            {"message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c2", "type": "function",
                 "function": {"name": "refund", "arguments": '{"amount": 5}'}}]},
             "finish_reason": "tool_calls"},
            {"message": {"role": "assistant", "content": "Refund of"}, "finish_reason": "length"},
        ]
    }  # fmt: skip
    out = output_messages(calls)
    assert [m["finish_reason"] for m in out] == ["tool_call", "length"]
    assert out[0]["parts"] == [
        {"type": "tool_call", "id": "c2", "name": "refund", "arguments": {"amount": 5}}
    ]


def test_openai_sdk_objects_normalise_like_their_dicts():
    openai = pytest.importorskip("openai", reason="the openai SDK's pydantic types")
    from openai.types.chat import ChatCompletion

    completion = ChatCompletion.model_validate(OPENAI_RESPONSE)
    assert output_messages(completion) == output_messages(OPENAI_RESPONSE)
    assert openai.types.chat.ChatCompletionMessage  # the message type, read by attribute
    message = completion.choices[0].message
    assert input_messages([message]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "It has shipped."}]}
    ]


def test_plain_objects_are_read_by_attribute():
    """SDK-like objects without pydantic: attributes are read as the dict keys would be."""

    class Function:
        name = "get_order"
        arguments = '{"order_id": "W-1"}'

    class Call:
        id = "call_1"
        type = "function"
        function = Function()

    class Message:
        role = "assistant"
        content = None

        def __init__(self) -> None:
            self.tool_calls = [Call()]

    class Choice:
        message = Message()
        finish_reason = "tool_calls"

    class Completion:
        def __init__(self) -> None:
            self.choices = (Choice(),)

    assert output_messages(Completion()) == [
        {"role": "assistant", "parts": [GENAI_INPUT[2]["parts"][0]], "finish_reason": "tool_call"}
    ]


# The write side: Anthropic, Responses, Gemini ----------------------------------------------------
def test_anthropic_blocks_become_parts_and_tool_results_a_tool_message():
    assert input_messages(ANTHROPIC_MESSAGES) == [
        {"role": "user", "parts": [{"type": "text", "content": "Where is order W-1?"}]},
        {"role": "assistant", "parts": [
            {"type": "text", "content": "Let me look."},
            {"type": "tool_call", "id": "toolu_1", "name": "get_order",
             "arguments": {"order_id": "W-1"}},
        ]},
        {"role": "tool", "parts": [
            {"type": "tool_call_response", "id": "toolu_1", "response": "shipped"}]},
    ]  # fmt: skip


def test_anthropic_message_becomes_an_output_message():
    expected = [
        {"role": "assistant", "parts": [
            {"type": "reasoning", "content": "The tool said shipped."},
            {"type": "text", "content": "It has shipped."},
        ], "finish_reason": "stop"}
    ]  # fmt: skip
    assert output_messages(ANTHROPIC_RESPONSE) == expected
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK's pydantic types")
    assert output_messages(anthropic.types.Message.model_validate(ANTHROPIC_RESPONSE)) == expected
    block = {"type": "tool_use", "id": "toolu_2", "name": "refund", "input": {"amount": 5}}
    tool_use = {**ANTHROPIC_RESPONSE, "stop_reason": "tool_use", "content": [block]}
    assert output_messages(tool_use)[0]["finish_reason"] == "tool_call"


def test_anthropic_system_goes_to_system_instructions():
    assert system_instructions("Be kind.") == [{"type": "text", "content": "Be kind."}]
    assert system_instructions([{"type": "text", "text": "Be kind.", "cache_control": {}}]) == [
        {"type": "text", "content": "Be kind."}
    ]


def test_responses_api_and_gemini_shapes():
    response = {
        "status": "completed",
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
            {"type": "function_call", "call_id": "fc_1", "name": "get_order",
             "arguments": '{"order_id": "W-1"}'},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Looking."}]},
        ],
    }  # fmt: skip
    (out,) = output_messages(response)
    assert [p["type"] for p in out["parts"]] == ["reasoning", "tool_call", "text"]
    assert out["parts"][1]["id"] == "fc_1" and out["finish_reason"] == "stop"
    items = [
        {"role": "user", "content": "Where is W-1?"},
        {"type": "function_call_output", "call_id": "fc_1", "output": "shipped"},
    ]
    assert input_messages(items)[1] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "fc_1", "response": "shipped"}],
    }
    gemini = {"candidates": [{"content": {"role": "model", "parts": [
        {"text": "Hi"}, {"functionCall": {"name": "f", "args": {"x": 1}}}]},
        "finishReason": "STOP"}]}  # fmt: skip
    assert output_messages(gemini) == [
        {"role": "assistant", "parts": [
            {"type": "text", "content": "Hi"},
            {"type": "tool_call", "id": None, "name": "f", "arguments": {"x": 1}}],
         "finish_reason": "stop"}
    ]  # fmt: skip


def test_genai_messages_pass_through_unchanged():
    assert input_messages(GENAI_INPUT) == GENAI_INPUT
    outputs = output_messages(OPENAI_RESPONSE)
    assert output_messages(outputs) == outputs


def test_unknown_shapes_become_a_text_part_of_the_value():
    assert input_messages({"question": "why?", "n": 2}) == [
        {"role": "user", "parts": [{"type": "text", "content": '{"question":"why?","n":2}'}]}
    ]
    assert output_messages(42) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "42"}], "finish_reason": "stop"}
    ]
    assert input_messages([{"role": "user", "content": [{"type": "widget", "w": 1}]}]) == [
        {"role": "user", "parts": [{"type": "text", "content": '{"type":"widget","w":1}'}]}
    ]


class Hostile:
    """Raises from everything tracegym may touch."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name}")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __len__(self) -> int:
        raise RuntimeError("no len")


class BadProperty:
    role = "user"

    @property
    def content(self) -> str:
        raise KeyboardInterrupt  # not even BaseException escapes into the user's code


def _garbage() -> list[Any]:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    deep: Any = "bottom"
    for _ in range(500):
        deep = {"role": "user", "content": [deep]}
    return [
        None, 0, float("nan"), b"\xff\xfe", "", [], {}, Hostile(), [Hostile()], cyclic, deep,
        {"choices": Hostile()}, {"choices": [Hostile(), None, 3]}, {"role": Hostile()},
        {"role": "user", "content": Hostile()}, {"messages": {"messages": {"messages": []}}},
        [{"role": "tool", "content": [{"type": "tool_result", "content": Hostile()}]}],
        {"content": [{"type": "tool_use", "name": Hostile(), "input": cyclic}]},
        [{"role": "user", "parts": ["text", {"type": None}, {"type": "blob", "content": 5}]}],
        "x" * 100_000, list(range(5000)), [{"role": "user", "content": "m"}] * 3000,
    ]  # fmt: skip


@pytest.mark.parametrize("value", _garbage(), ids=lambda v: type(v).__name__)
def test_garbage_never_raises_and_gives_valid_messages(value: Any):
    for messages in (input_messages(value, 500), output_messages(value, 500)):
        assert isinstance(messages, list)
        text = encode(messages, 2000)
        assert len(text) <= 2000 + 40
        for message in json.loads(text):
            assert isinstance(message["role"], str) and isinstance(message["parts"], list)
            assert all(
                isinstance(p, dict) and isinstance(p.get("type"), str) for p in message["parts"]
            )
    for messages in (output_messages(value),):
        assert all("finish_reason" in m for m in messages)
    assert isinstance(chat_messages(value), list)
    assert isinstance(chat_messages(to_json(value)[:3000]), list)


def test_a_property_that_raises_keyboard_interrupt_is_swallowed():
    """The user's value may raise anything while we read it; the call goes on."""
    got = input_messages([BadProperty()])
    assert got[0]["role"] == "user"


def test_encode_stays_valid_json_within_the_budget():
    long = [{"role": "user", "parts": [{"type": "text", "content": "x" * 50_000}]},
            {"role": "assistant", "parts": [{"type": "text", "content": "short answer"}],
             "finish_reason": "stop"}]  # fmt: skip
    text = encode(long, 1000)
    assert len(text) <= 1000
    parsed = json.loads(text)
    assert parsed[1]["parts"][0]["content"] == "short answer"  # short texts survive
    assert TRUNCATION_MARKER.split("{}")[0] in parsed[0]["parts"][0]["content"]
    many = [{"role": "user", "parts": [{"type": "text", "content": f"m{i}"}]} for i in range(400)]
    kept = json.loads(encode(many, 600))
    assert kept[-1]["parts"][0]["content"] == "m399"  # the latest turns are the ones kept
    assert (
        input_messages([{"role": "system", "content": "rules"}] + many * 1)[0]["role"] == "system"
    )


# The read side: both shapes -----------------------------------------------------------------
def test_chat_messages_reads_both_shapes_alike():
    internal = chat_messages(json.dumps(GENAI_INPUT))
    assert internal == chat_messages(json.dumps(OPENAI_INPUT)) == [
        {"role": "system", "content": "You are the shop's assistant."},
        {"role": "user", "content": "Where is order W-1?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_order", "arguments": '{"order_id":"W-1"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
    ]  # fmt: skip
    # the older shapes: {"messages": [...]}, a raw response, bare text
    assert chat_messages({"messages": OPENAI_INPUT}) == internal
    said = chat_messages(json.dumps(OPENAI_RESPONSE), "assistant")
    assert said == [{"role": "assistant", "content": "It has shipped.", "finish_reason": "stop"}]
    assert chat_messages("not json", "assistant") == [{"role": "assistant", "content": "not json"}]
    assert chat_messages(None) == chat_messages("") == []


def _traced(messages: Any, result: Any) -> tuple[str, str]:
    """(gen_ai.input.messages, gen_ai.output.messages) as the tracer writes them now."""

    @tg.llm(model="m", capture_messages=True)
    def call(messages: Any) -> Any:
        return result

    with tg.testing.capture() as cap:
        call(messages)
    chat = a(cap.one("chat m"))
    return chat[sc.INPUT_MESSAGES], chat[sc.OUTPUT_MESSAGES]


def _chat_step(position: int, input: str | None = None, output: str | None = None) -> Step:
    return Step(
        position=position, trace_id="t", span_id=f"s{position}", parent_span_id="s0",
        name="chat m", operation=sc.OP_CHAT, agent="bot", step_index=position, tool=None,
        call_id=None, input=input, output=output, status="UNSET", error_type=None,
        start_ns=position, end_ns=position + 1, duration_ms=0.0, input_tokens=None,
        output_tokens=None, memory_store=None, memory_record=None, memory_content_hash=None,
        memory_result_hashes=[], subtask=None,
        attributes={sc.OUTPUT_MESSAGES: output} if output else {},
    )  # fmt: skip


def test_readers_see_the_same_conversation_in_either_shape():
    """attribution, the detectors and synthesis read a chat recorded in the GenAI shape (as the
    tracer writes it now) as they read the older shape (older stores, the importers)."""
    reply = {"role": "assistant", "content": "Refunding.", "tool_calls": [
        {"id": "call_2", "type": "function",
         "function": {"name": "refund", "arguments": '{"order_id":"W-1"}'}}]}  # fmt: skip
    new_in, new_out = _traced(OPENAI_INPUT, [reply])
    assert json.loads(new_in) == GENAI_INPUT  # the new shape, for real
    assert "parts" in json.loads(new_out)[0]
    old_in, old_out = json.dumps(OPENAI_INPUT), json.dumps([reply])
    readings = []
    for messages, output in ((old_in, old_out), (new_in, new_out)):
        chat = _chat_step(2, messages, output)
        call = SimpleNamespace(position=1, call_id="call_1", tool="get_order", name="get_order")
        run = SimpleNamespace(steps=[_chat_step(0), call, chat])
        readings.append(
            (
                _chat_text(chat),  # attribution: what the chat said, and its call ids
                list(_message_sources(chat)),  # ungrounded: what the agent was told
                _answer_seen(call, run),  # tool_order: the tool's answer in the next chat
                system_message(messages),  # synthesis: the agent's system prompt
            )
        )
    assert readings[0] == readings[1]
    text, sources, answer, system = readings[1]
    assert text == ('Refunding.\nrefund({"order_id":"W-1"})', ("call_2",))
    assert ("observation", '{"status": "shipped"}') in sources
    assert ("request", "Where is order W-1?") in sources
    assert answer == '{"status": "shipped"}'
    assert system == "You are the shop's assistant."


def test_the_dashboard_shows_either_shape_as_the_same_transcript():
    pages = pytest.importorskip("tracegym.dashboards.pages", reason="the dashboards' extras")
    old = pages.chat_pretty(json.dumps(OPENAI_INPUT), "user")
    assert old == pages.chat_pretty(json.dumps(GENAI_INPUT), "user")
    assert old.splitlines() == [
        "[system] You are the shop's assistant.",
        "[user] Where is order W-1?",
        '[assistant] -> get_order({"order_id":"W-1"})',
        '[tool call_1] {"status": "shipped"}',
    ]
    assert pages.chat_pretty('[{"role": "user", "content": "cut sho', "user") == ""  # not JSON


# Spans -----------------------------------------------------------------------------------
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


@tg.llm(model="gpt-4o-mini", capture_messages=True)
def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return OPENAI_RESPONSE


@tg.llm(model="claude-sonnet-4-5", provider="anthropic", capture_messages=True)
def ask_claude(system: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return ANTHROPIC_RESPONSE


@tg.agent(name="support")
def support(request: str) -> str:
    plan(request)
    remember("mia", "customer prefers email")
    recall("mia")
    with tg.subtask("lookup", budget_steps=5):
        get_order("W-1")
    ask([{"role": "user", "content": request}])
    ask_claude("Be kind.", ANTHROPIC_MESSAGES)
    return "It has shipped."


def test_spans_carry_genai_messages_and_openinference_attributes():
    with tg.testing.capture(openinference="full") as cap:
        support("Where is order W-1?")
    chat = a(cap.one("chat gpt-4o-mini"))
    assert json.loads(chat[sc.INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Where is order W-1?"}]}
    ]
    assert json.loads(chat[sc.OUTPUT_MESSAGES])[0]["finish_reason"] == "stop"
    assert chat[sc.OI_SPAN_KIND] == "LLM"
    assert chat[sc.OI_MODEL_NAME] == "gpt-4o-mini-2024-07-18"  # the model that answered
    assert (chat[sc.OI_PROMPT_TOKENS], chat[sc.OI_COMPLETION_TOKENS]) == (31, 5)
    assert chat[sc.OI_TOTAL_TOKENS] == 36
    assert (chat[sc.OI_INPUT_VALUE], chat[sc.OI_OUTPUT_VALUE]) == (
        "Where is order W-1?", "It has shipped.")  # fmt: skip
    claude = a(cap.one("chat claude-sonnet-4-5"))
    assert json.loads(claude[sc.SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": "Be kind."}]
    assert json.loads(claude[sc.INPUT_MESSAGES])[2]["role"] == "tool"
    agent = a(cap.one("invoke_agent support"))
    assert agent[sc.OI_SPAN_KIND] == "AGENT"
    assert json.loads(agent[sc.OI_INPUT_VALUE]) == {"request": "Where is order W-1?"}
    assert agent[sc.OI_INPUT_MIME] == "application/json"
    assert (agent[sc.OI_OUTPUT_VALUE], agent[sc.OI_OUTPUT_MIME]) == (
        "It has shipped.",
        "text/plain",
    )
    tool = a(cap.one("execute_tool get_order"))
    assert tool[sc.OI_SPAN_KIND] == "TOOL"
    assert tool[sc.OI_INPUT_VALUE] == tool[sc.TOOL_ARGUMENTS]
    assert tool[sc.OI_OUTPUT_VALUE] == tool[sc.TOOL_RESULT]
    kinds = {s.name: a(s).get(sc.OI_SPAN_KIND) for s in cap.spans}
    assert kinds["step plan"] == kinds["subtask lookup"] == kinds["update_memory notes"] == "CHAIN"
    assert kinds["search_memory notes"] == "RETRIEVER"
    read = a(cap.one("search_memory notes"))
    assert (read[sc.OI_INPUT_VALUE], read[sc.OI_OUTPUT_VALUE]) == ("mia", "customer prefers email")
    assert a(cap.one("update_memory notes"))[sc.OI_INPUT_VALUE] == "customer prefers email"
    assert a(cap.one("step plan"))[sc.OI_OUTPUT_VALUE] == "look the order up"


def test_content_capture_off_drops_the_openinference_values_too():
    with tg.testing.capture(capture_content=False, openinference="full") as cap:
        support("Where is order W-1?")
    for span in cap.spans:
        attrs = a(span)
        assert not (sc.CONTENT_ATTRIBUTES & set(attrs)), span.name
        assert sc.OI_INPUT_MIME not in attrs and sc.OI_OUTPUT_MIME not in attrs
        assert sc.OI_SPAN_KIND in attrs  # kinds, models and tokens are no content
    assert a(cap.one("chat gpt-4o-mini"))[sc.OI_PROMPT_TOKENS] == 31


def test_openinference_off_leaves_the_genai_attributes_alone():
    with tg.testing.capture(openinference="off") as cap:
        support("Where is order W-1?")
    assert not any(ATTRIBUTES & set(a(s)) for s in cap.spans)
    assert sc.INPUT_MESSAGES in a(cap.one("chat gpt-4o-mini"))


def test_by_default_only_the_kinds_are_written():
    """The default level, kinds: one short attribute per span, no copied content."""
    with tg.testing.capture() as cap:
        support("Where is order W-1?")
        tg.record_outcome("r1", success=True)
    for span in cap.spans:
        assert ATTRIBUTES & set(a(span)) == {sc.OI_SPAN_KIND}, span.name
    kinds = {s.name: a(s)[sc.OI_SPAN_KIND] for s in cap.spans}
    assert kinds["invoke_agent support"] == "AGENT" and kinds["step plan"] == "CHAIN"
    assert kinds["search_memory notes"] == "RETRIEVER" and kinds["tracegym.outcome"] == "EVALUATOR"


@pytest.mark.parametrize(
    ("raw", "level"),
    [(None, "kinds"), ("kinds", "kinds"), ("1", "full"), ("full", "full"), ("0", "off"),
     ("off", "off"), ("bogus", "kinds")],
)  # fmt: skip
def test_the_level_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, level: str
):
    from tracegym.tracer.config import Settings

    if raw is None:
        monkeypatch.delenv("TRACEGYM_OPENINFERENCE", raising=False)
    else:
        monkeypatch.setenv("TRACEGYM_OPENINFERENCE", raw)
    assert Settings.from_env().openinference == level


def test_openinference_values_are_redacted_like_the_rest():
    secret = "sk-proj-" + "A1b2C3d4E5f6G7h8J9k0" * 2
    with tg.testing.capture(openinference="full") as cap:
        support(f"my key is {secret}")
    for span in cap.spans:
        for value in a(span).values():
            assert secret not in str(value), span.name
    assert "[REDACTED]" in a(cap.one("invoke_agent support"))[sc.OI_INPUT_VALUE]


def test_the_spool_keeps_tracegym_keys_only():
    """OpenInference copies are for other backends: the spool (and so the store) holds each
    value once, under its GenAI / tracegym key."""
    with tg.testing.capture(openinference="full") as cap:
        support("Where is order W-1?")
    for span in cap.spans:
        record = span_record(span)
        assert not (ATTRIBUTES & set(record["attributes"])), span.name
        assert set(record["attributes"]) == set(a(span)) - ATTRIBUTES


def test_attributes_for_never_overwrites_and_knows_only_tracegym_operations():
    assert attributes_for({sc.OPERATION: "embeddings"}) == {}
    assert attributes_for({}) == {}
    given = {sc.OPERATION: sc.OP_AGENT, sc.INPUT: "hi", sc.OI_INPUT_VALUE: "mine"}
    assert attributes_for(given) == {sc.OI_SPAN_KIND: "AGENT"}


def test_messages_module_is_stdlib_only():
    source = Path(sys.modules["tracegym.tracer.messages"].__file__ or "").read_text()
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    allowed = ("from __future__", "import json", "from collections", "from typing",
               "from tracegym.tracer")  # fmt: skip
    assert all(line.startswith(allowed) for line in imports), imports


def test_the_receiver_keeps_tracegym_spans_as_the_spool_does():
    """A tracegym span sent over OTLP (`tracegym collect`) is stored as the tracer spools it in
    process: tracegym keys only, no OpenInference copies, nothing mapped onto it twice."""
    encoder = pytest.importorskip(
        "opentelemetry.exporter.otlp.proto.common.trace_encoder", reason="the OTLP encoder"
    )
    from tracegym.store.otlp import records_from_request

    with tg.testing.capture(openinference="full") as cap:
        support("Where is order W-1?")
    received = {r["span_id"]: r for r in records_from_request(encoder.encode_spans(cap.spans))}
    assert len(received) == len(cap.spans)
    for span in cap.spans:
        spooled = json.loads(json.dumps(span_record(span)))
        got = received[spooled["span_id"]]
        assert got["attributes"] == spooled["attributes"], span.name
        assert not ATTRIBUTES & set(got["attributes"])
