"""Recorded LLM messages as OpenAI chat fine-tuning messages, and tool definitions as
OpenAI function tools.

Reading the messages is the tracer's read side (`tracegym.tracer.messages.chat_messages`: the
GenAI convention's parts, OpenAI and Anthropic messages, raw responses, `{"messages": [...]}`
requests, plain text); this module adds OpenInference's flattened tool calls (the OTLP mapping
leaves `tool_calls.N.tool_call.function.name` keys inside a message) and keeps only what a
fine-tuning line holds: `role`, `content` (text; None only beside tool calls), `tool_calls`,
`tool_call_id`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from tracegym.tracer.messages import chat_messages

_KEYS = ("role", "content", "tool_calls", "tool_call_id")
_FLAT_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)$")


def _parsed(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _text(value: Any) -> str:
    """Content as text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _unflattened(message: Any) -> Any:
    """A message with OpenInference's flattened tool calls as OpenAI `tool_calls`."""
    if not isinstance(message, Mapping):
        return message
    found: dict[int, dict[str, Any]] = {}
    rest: dict[str, Any] = {}
    for key, value in message.items():
        match = _FLAT_CALL.match(key) if isinstance(key, str) else None
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = value
        else:
            rest[key] = value
    if not found:
        return message
    calls = [
        {
            "id": f.get("id"),
            "type": "function",
            "function": {"name": f.get("function.name"), "arguments": f.get("function.arguments")},
        }
        for _, f in sorted(found.items())
    ]
    return {**rest, "tool_calls": [*(rest.get("tool_calls") or []), *calls]}


def _fine_tuning(message: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: message[k] for k in _KEYS if k in message}
    if out.get("role") == "tool":
        out["tool_call_id"] = str(out.get("tool_call_id") or "")
        out["content"] = _text(out.get("content") or "")
        return out
    calls = [
        {
            "id": str(call.get("id") or ""),
            "type": "function",
            "function": {
                "name": str((call.get("function") or {}).get("name") or ""),
                "arguments": (call.get("function") or {}).get("arguments") or "{}",
            },
        }
        for call in out.get("tool_calls") or []
        if isinstance(call, Mapping)
    ]
    if calls:
        out["tool_calls"] = calls
    else:
        out.pop("tool_calls", None)
        if out.get("content") is None:
            out["content"] = ""
    return out


def to_openai(value: Any, default_role: str = "user") -> list[dict[str, Any]]:
    """Recorded messages (any shape the tracer's reader knows) as fine-tuning messages; []
    when there are none. `default_role` is the side read ("assistant" for outputs). Roles are
    kept as read (the validator refuses what fine-tuning does not take)."""
    value = _parsed(value)
    if isinstance(value, list):
        value = [_unflattened(m) for m in value]
    elif isinstance(value, Mapping):
        value = _unflattened(value)
    return [_fine_tuning(m) for m in chat_messages(value, default_role)]


def system_messages(instructions: Any) -> list[dict[str, Any]]:
    """`gen_ai.system_instructions` (text parts or plain text) as one system message."""
    value = _parsed(instructions)
    if not value:
        return []
    if isinstance(value, list):
        texts = [
            p.get("content") if isinstance(p, Mapping) else p
            for p in value
            if isinstance(p, str) or (isinstance(p, Mapping) and p.get("type", "text") == "text")
        ]
        text = "\n".join(_text(t) for t in texts if t)
    else:
        text = _text(value)
    return [{"role": "system", "content": text}] if text else []


def tool_schema(definition: Any) -> dict[str, Any] | None:
    """A tool definition (OpenAI's nested function, the GenAI / Responses flat form, or
    Anthropic's `input_schema`) as an OpenAI function tool; None when it is none of these."""
    if not isinstance(definition, Mapping):
        return None
    fn = definition.get("function") if isinstance(definition.get("function"), Mapping) else None
    source = fn or definition
    name = source.get("name")
    if not isinstance(name, str) or not name:
        return None
    kind = definition.get("type", "function")
    if kind != "function" and fn is None and "input_schema" not in definition:
        return None  # e.g. a provider's built-in tool (web search): not a function
    parameters = source.get("parameters", source.get("input_schema"))
    out: dict[str, Any] = {"name": name}
    if isinstance(source.get("description"), str):
        out["description"] = source["description"]
    out["parameters"] = (
        dict(parameters)
        if isinstance(parameters, Mapping)
        else {"type": "object", "properties": {}}
    )
    return {"type": "function", "function": out}


def tool_schemas(definitions: Any) -> list[dict[str, Any]]:
    """`gen_ai.tool.definitions` as OpenAI function tools (unrecognised entries left out)."""
    value = _parsed(definitions)
    if not isinstance(value, list):
        return []
    return [t for t in (tool_schema(d) for d in value) if t is not None]


_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (list, "array"), (dict, "object"))  # fmt: skip


def inferred_tools(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function tools for the calls in `messages` when no definitions were recorded: each
    tool's parameters are the argument names seen, typed by the values seen."""
    tools: dict[str, dict[str, Any]] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call["function"]
            properties = tools.setdefault(fn["name"], {})
            try:
                arguments = json.loads(fn["arguments"])
            except ValueError:
                continue
            if not isinstance(arguments, dict):
                continue
            for key, value in arguments.items():
                kind = next((t for cls, t in _JSON_TYPES if isinstance(value, cls)), None)
                entry = properties.setdefault(key, {"type": kind} if kind else {})
                if kind and entry.get("type") not in (None, kind):
                    entry.pop("type")  # seen with different types: leave it open
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "parameters": {"type": "object", "properties": properties},
            },
        }
        for name, properties in tools.items()
    ]
