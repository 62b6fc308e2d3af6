"""The `@tg.llm` side: reading messages must not slow the agent, nor consume
what it passes or gets back.

Before the fix, tracer/messages.py read the messages of an LLM call with `isinstance`, which
looks up a value's `__class__` on every miss (an ABC such as Mapping on every check): about a
hundred lookups per call, each costing what a slow `__class__` property costs. It also compared
and tested the user's values (`==`, `or`), running their `__eq__` and `__bool__`. Now it reads
types with `type(x)` and exact strings only, as serialize.py does. The tests count calls; none
measures time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import tracegym as tg
from tracegym.tracer import messages as genai
from tracegym.tracer import semconv as sc


class Looks:
    """Counts of the hooks the tracer must not call."""

    cls = 0
    iters = 0
    hooks = 0


@pytest.fixture(autouse=True)
def _reset_looks():
    Looks.cls = Looks.iters = Looks.hooks = 0


class SlowClass:
    """A value with a slow `__class__` property (isinstance looks it up on every miss); it
    sleeps a millisecond so a hundred lookups would show, but the tests count them."""

    @property  # type: ignore[misc]
    def __class__(self):  # type: ignore[override]
        Looks.cls += 1
        time.sleep(0.001)
        return SlowClass


class SlowMessage(SlowClass):
    """An SDK-like message object (attributes, no dict) with a slow `__class__`."""

    def __init__(self, role: str, content: Any, **extra: Any) -> None:
        self.role = role
        self.content = content
        for key, value in extra.items():
            setattr(self, key, value)


class Hooked:
    """A value whose `__eq__`, `__bool__` and `__len__` count: comparing it or testing its
    truth runs the user's code."""

    def __eq__(self, other: object) -> bool:
        Looks.hooks += 1
        return False

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        Looks.hooks += 1
        return True

    def __len__(self) -> int:
        Looks.hooks += 1
        return 1


class Once(Mapping):
    """A Mapping whose items can be read only once (a stream, a cursor)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data
        self._used = False

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[str]:
        Looks.iters += 1
        if self._used:
            return iter(())
        self._used = True
        return iter(list(self._data))


def _llm():
    @tg.llm(model="m", capture_messages=True)
    def chat(messages, reply=None):
        return reply if reply is not None else messages

    return chat


def _slow_conversation() -> list[Any]:
    """OpenAI-, Anthropic- and Responses-shaped messages, each holding slow values."""
    return [
        SlowClass(),
        SlowMessage("system", SlowClass()),
        {"role": "user", "content": SlowClass()},
        {"role": "user", "content": [SlowClass(), {"type": "text", "text": SlowClass()}]},
        SlowMessage(
            "assistant",
            None,
            tool_calls=[SlowClass(), {"id": SlowClass(), "function": SlowClass()}],
        ),
        {"role": "tool", "tool_call_id": SlowClass(), "content": [SlowClass()]},
        {"type": "function_call", "call_id": "c1", "name": SlowClass(), "arguments": SlowClass()},
        {"role": "user", "content": [{"type": "tool_result", "content": [SlowClass()]}]},
        {"role": SlowClass(), "parts": SlowClass(), "name": SlowClass()},
        [SlowClass(), [SlowClass()]],
    ]


def test_messages_whose_class_is_slow_are_never_asked_for_it(cap):
    conversation = _slow_conversation()
    assert _llm()(conversation) is conversation
    assert Looks.cls == 0  # before: 1096 lookups
    attrs = cap.one("chat m").attributes
    inputs = json.loads(attrs[sc.INPUT_MESSAGES])
    assert inputs[0]["role"] == "user"
    for message in (inputs[0], inputs[2]):  # the default repr, which runs none of its code
        [part] = message["parts"]
        assert part["type"] == "text" and "SlowClass object at 0x" in part["content"]
    assert len(json.loads(attrs[sc.OUTPUT_MESSAGES])) == len(inputs)


@pytest.mark.parametrize(
    "reply",
    [
        SlowClass(),
        SlowMessage("assistant", SlowClass(), stop_reason=SlowClass()),
        {"choices": [SlowClass(), {"message": SlowClass(), "finish_reason": SlowClass()}]},
        {"candidates": [SlowClass()]},
        {"output": [SlowClass()], "status": SlowClass()},
    ],
    ids=["value", "message", "openai", "gemini", "responses"],
)
def test_a_reply_whose_class_is_slow_is_never_asked_for_it(cap, reply):
    assert _llm()("hi", reply=reply) is reply
    assert Looks.cls == 0  # before: 21 to 144 lookups
    assert json.loads(cap.one("chat m").attributes[sc.OUTPUT_MESSAGES])


def test_the_users_eq_and_bool_are_never_run(cap):
    conversation = [
        {"role": "user", "content": [{"type": Hooked(), "text": "a"}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": Hooked()}]},
        {"type": "refusal", "refusal": Hooked()},
        {"role": "assistant", "content": [{"type": "function_call", "call_id": Hooked()}]},
    ]
    reply = {"choices": [{"message": None, "text": Hooked(), "finish_reason": "stop"}]}
    assert _llm()(conversation, reply=reply) is reply
    assert Looks.hooks == 0  # before: 3 calls
    assert cap.one("chat m").attributes[sc.INPUT_MESSAGES]


def test_a_mapping_readable_once_reaches_the_caller_whole(cap):
    once = Once({"role": "user", "content": "hello"})
    inside = Once({"role": "user", "content": "again"})
    given = _llm()(once)
    assert given is once
    assert _llm()([inside]) == [inside]
    assert Looks.iters == 0  # the tracer never iterated them
    assert dict(given.items()) == {"role": "user", "content": "hello"}
    assert dict(inside.items()) == {"role": "user", "content": "again"}
    first, second = (json.loads(s.attributes[sc.INPUT_MESSAGES]) for s in cap.spans)
    assert first == [{"role": "user", "parts": [{"type": "text", "content": "hello"}]}]
    assert second == [{"role": "user", "parts": [{"type": "text", "content": "again"}]}]


def test_a_generator_of_messages_or_a_streamed_reply_is_recorded_not_consumed(cap):
    messages = ({"role": "user", "content": t} for t in ("a", "b"))
    chunks = iter([{"choices": [{"delta": {"content": "x"}}]}])
    assert _llm()(messages, reply=chunks) is chunks
    assert [m["content"] for m in messages] == ["a", "b"]
    assert len(list(chunks)) == 1
    attrs = cap.one("chat m").attributes
    assert "<generator object" in attrs[sc.INPUT_MESSAGES]
    assert "list_iterator object at 0x" in attrs[sc.OUTPUT_MESSAGES]


class Counted(list):
    """A list subclass whose own iteration and indexing count: the tracer reads the list."""

    def __iter__(self):
        Looks.iters += 1
        return super().__iter__()

    def __getitem__(self, index):
        Looks.iters += 1
        return super().__getitem__(index)

    def __len__(self) -> int:
        Looks.iters += 1
        return super().__len__()


def test_list_subclasses_are_read_without_their_overrides():
    got = genai.input_messages(Counted([{"role": "user", "content": Counted(["hi"])}]))
    assert got == [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    assert Looks.iters == 0  # before: 3 calls
