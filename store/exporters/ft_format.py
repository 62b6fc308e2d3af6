"""A check of one line of OpenAI chat fine-tuning data (`{"messages": [...], "tools": [...]}`).

What is checked is what OpenAI's fine-tuning format asks of a line, so a file the exporter
writes uploads without a format error:
- `messages`: a non-empty list; roles system, user, assistant or tool; only the keys of a chat
  message (role, content, name, tool_calls, tool_call_id, weight); text content (a string, or
  a list of text parts), which only an assistant message that calls tools may leave out;
- at least one assistant message, and the last message is the assistant's;
- assistant `tool_calls`: each with an id (unique in the line), `type: "function"`, a function
  name, and `function.arguments` a string that parses as JSON (an object);
- every tool call answered by a later tool message with its `tool_call_id` before the next
  assistant message, and every tool message answering a call before it;
- `tools` (optional): function tools, `{"type": "function", "function": {"name",
  "description"?, "parameters": a JSON-schema object}}`, names unique, and every called
  function among them; `parallel_tool_calls` (optional) a boolean.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

ROLES = {"system", "user", "assistant", "tool"}
MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "weight"}
LINE_KEYS = {"messages", "tools", "parallel_tool_calls"}
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _text_content(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    )


def _check_tools(tools: Any) -> tuple[list[str], set[str]]:
    if not isinstance(tools, list):
        return ["tools is not a list"], set()
    problems, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            problems.append(f"tools[{i}] is not a function tool")
            continue
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            problems.append(f"tools[{i}] has no function name")
            continue
        if not _NAME.match(fn["name"]):
            problems.append(f"tools[{i}] name {fn['name'][:40]!r} is not [a-zA-Z0-9_-]{{1,64}}")
        if fn["name"] in names:
            problems.append(f"tools[{i}] repeats the name {fn['name']!r}")
        names.add(fn["name"])
        parameters = fn.get("parameters")
        if parameters is not None and (
            not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object"
        ):
            problems.append(f"tools[{i}] parameters is not a JSON-schema object")
        if "description" in fn and not isinstance(fn["description"], str):
            problems.append(f"tools[{i}] description is not text")
    return problems, names


def _check_calls(i: int, calls: Any, seen: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(problems, call ids, function names) of one assistant message's tool_calls."""
    if not isinstance(calls, list) or not calls:
        return [f"messages[{i}] tool_calls is not a non-empty list"], [], []
    problems, ids, names = [], [], []
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        if not isinstance(call, Mapping):
            problems.append(f"{where} is not an object")
            continue
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            problems.append(f"{where} has no id")
        elif call_id in seen or call_id in ids:
            problems.append(f"{where} repeats the id {call_id!r}")
        else:
            ids.append(call_id)
        if call.get("type") != "function":
            problems.append(f"{where} type is not 'function'")
        fn = call.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            problems.append(f"{where} has no function name")
            continue
        names.append(fn["name"])
        arguments = fn.get("arguments")
        if not isinstance(arguments, str):
            problems.append(f"{where} arguments is not a JSON string")
            continue
        try:
            parsed = json.loads(arguments)
        except ValueError:
            problems.append(f"{where} arguments do not parse as JSON")
            continue
        if not isinstance(parsed, dict):
            problems.append(f"{where} arguments are not a JSON object")
    return problems, ids, names


def reason_kind(problem: str) -> str:
    """A problem with its positions and values taken out, to count problems by kind."""
    problem = re.sub(r"\[\d+\]", "[i]", problem)
    return re.sub(r"\(?'[^']*'\)?|\(None\)|\[(?!i\])[^\]]*\]", "...", problem)


def validate_example(example: Any) -> list[str]:
    """What is wrong with one fine-tuning line (an empty list when nothing is)."""
    if not isinstance(example, Mapping):
        return ["the line is not a JSON object"]
    problems: list[str] = [f"unknown key {k!r}" for k in example if k not in LINE_KEYS]
    if "parallel_tool_calls" in example and not isinstance(example["parallel_tool_calls"], bool):
        problems.append("parallel_tool_calls is not a boolean")
    tool_names: set[str] | None = None
    if "tools" in example:
        tool_problems, tool_names = _check_tools(example["tools"])
        problems += tool_problems
    messages = example.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "messages is not a non-empty list"]
    pending: list[str] = []  # calls not answered yet
    seen: set[str] = set()
    called: list[str] = []
    assistants = 0
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            problems.append(f"messages[{i}] is not an object")
            continue
        role = message.get("role")
        if role not in ROLES:
            problems.append(f"messages[{i}] role {str(role)[:20]!r} is not one of {sorted(ROLES)}")
            continue
        extra = sorted(set(message) - MESSAGE_KEYS)
        if extra:
            problems.append(f"messages[{i}] has unknown keys {extra}")
        content = message.get("content")
        calls = message.get("tool_calls")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                problems.append(f"messages[{i}] answers no pending tool call ({call_id!r})")
            else:
                pending.remove(call_id)
            if not isinstance(content, str):
                problems.append(f"messages[{i}] tool content is not text")
            continue
        if pending:
            problems.append(f"messages[{i}] comes before the results of tool calls {pending}")
            pending = []
        if "tool_call_id" in message:
            problems.append(f"messages[{i}] has tool_call_id but is not a tool message")
        if role == "assistant":
            assistants += 1
            if calls is not None:
                call_problems, ids, names = _check_calls(i, calls, seen)
                problems += call_problems
                pending, called = ids, called + names
                seen.update(ids)
            if "weight" in message and message["weight"] not in (0, 1):
                problems.append(f"messages[{i}] weight is not 0 or 1")
        elif calls is not None:
            problems.append(f"messages[{i}] has tool_calls but is not the assistant's")
        if content is None and not (role == "assistant" and calls):
            problems.append(f"messages[{i}] has no content")
        elif content is not None and not _text_content(content):
            problems.append(f"messages[{i}] content is not text")
    if pending:
        problems.append(f"tool calls {pending} have no tool result")
    if assistants == 0:
        problems.append("no assistant message")
    last = messages[-1]
    if not isinstance(last, Mapping) or last.get("role") != "assistant":
        problems.append("the last message is not the assistant's")
    if tool_names is not None:
        unknown = sorted(set(called) - tool_names)
        if unknown:
            problems.append(f"calls to functions not in tools: {unknown}")
    return problems
