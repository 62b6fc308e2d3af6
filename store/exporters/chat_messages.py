"""Recorded LLM messages, whatever their shape, as OpenAI chat messages (the export's own
reader; to be merged with the tracer's read-side converter, `tracegym.tracer.messages`, once
that lands).

Shapes read (a JSON text or the parsed value):
- the GenAI convention's messages: `[{"role", "parts": [{"type": "text", "content"},
  {"type": "tool_call", "id", "name", "arguments"}, {"type": "tool_call_response", "id",
  "response"}]}]` (reasoning and media parts are left out);
- OpenAI chat messages (`role`, `content` as text or text parts, `tool_calls`,
  `tool_call_id`), as the tracer used to record them;
- OpenInference's flattened messages as the OTLP mapping rebuilds them (tool calls as
  `tool_calls.N.tool_call.function.name` keys of the message);
- Anthropic messages (`content` blocks `text`, `tool_use`, `tool_result`);
- a raw OpenAI response (`{"choices": [{"message": ...}]}`), an Anthropic response
  (`{"role": "assistant", "content": [...]}`), a `{"messages": [...]}` request, or plain text
  (a message of the default role).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


def _parsed(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in ("[", "{", '"'):
            try:
                return json.loads(text)
            except ValueError:
                return value
    return value


def _text(value: Any) -> str:
    """Content as text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _arguments(value: Any) -> str:
    """Tool call arguments as the JSON string OpenAI's format wants."""
    if isinstance(value, str):
        return value
    return json.dumps({} if value is None else value, ensure_ascii=False, default=str)


def _call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    return {
        "id": str(call_id) if call_id is not None else "",
        "type": "function",
        "function": {"name": str(name or ""), "arguments": _arguments(arguments)},
    }


def _content_parts(content: list[Any]) -> tuple[list[str], list[dict[str, Any]], list[Any]]:
    """(texts, tool calls, tool results) of OpenAI / Anthropic content blocks."""
    texts, calls, results = [], [], []
    for block in content:
        if isinstance(block, str):
            texts.append(block)
            continue
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_call(block.get("id"), block.get("name"), block.get("input")))
        elif kind == "tool_result":
            inner = block.get("content")
            if isinstance(inner, list):
                inner = "\n".join(_content_parts(inner)[0])
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""),
                            "content": _text(inner if inner is not None else "")})  # fmt: skip
    return texts, calls, results


def _genai(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    texts, calls, results = [], [], []
    for part in message.get("parts") or []:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "text":
            texts.append(_text(part.get("content", "")))
        elif kind == "tool_call":
            calls.append(_call(part.get("id"), part.get("name"), part.get("arguments")))
        elif kind == "tool_call_response":
            response = part.get("response", part.get("result", ""))
            results.append(
                {"role": "tool", "tool_call_id": str(part.get("id") or ""),
                 "content": _text(response)}
            )  # fmt: skip
    return _assemble(role, texts, calls, results)


def _assemble(
    role: Any, texts: list[str], calls: list[dict[str, Any]], results: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if role == "tool" or (results and not texts and not calls):
        return results
    message: dict[str, Any] = {"role": str(role), "content": "\n".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    out.append(message)
    return results + out if results else out


def _openai(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    if role == "function":  # the legacy function-result message
        role = "tool"
    content = message.get("content")
    if role == "tool":
        if isinstance(content, list):
            content = "\n".join(_content_parts(content)[0])
        call_id = message.get("tool_call_id", message.get("id"))
        return [{"role": "tool", "tool_call_id": str(call_id or ""), "content": _text(content)}]
    texts, calls, results = [], [], []
    if isinstance(content, list):
        texts, calls, results = _content_parts(content)
    elif content is not None:
        texts = [_text(content)]
    for call in message.get("tool_calls") or []:
        if isinstance(call, Mapping):
            fn = call.get("function") or {}
            calls.append(_call(call.get("id"), fn.get("name"), fn.get("arguments")))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        calls.append(_call(None, legacy.get("name"), legacy.get("arguments")))
    calls += _flat_calls(message)
    return _assemble(role, texts, calls, results)


_FLAT_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)$")


def _flat_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """OpenInference's flattened tool calls (`tool_calls.0.tool_call.function.name`, as the
    OTLP mapping leaves them inside a message) as calls."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in message.items():
        match = _FLAT_CALL.match(key) if isinstance(key, str) else None
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = value
    return [
        _call(f.get("id"), f.get("function.name"), f.get("function.arguments"))
        for _, f in sorted(found.items())
    ]


def to_openai(value: Any, default_role: str = "user") -> list[dict[str, Any]]:
    """Recorded messages (any shape above) as OpenAI chat messages; [] when there are none.
    Roles are kept as recorded (the validator refuses what fine-tuning does not take)."""
    value = _parsed(value)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if isinstance(value, list):
        out: list[dict[str, Any]] = []
        for item in value:
            out.extend(to_openai(item, default_role))
        return out
    if not isinstance(value, Mapping):
        return [{"role": default_role, "content": _text(value)}]
    if isinstance(value.get("choices"), list):
        messages = [c.get("message") for c in value["choices"][:1] if isinstance(c, Mapping)]
        return to_openai([m for m in messages if m is not None], "assistant")
    if isinstance(value.get("messages"), list) and "role" not in value:
        return to_openai(value["messages"], default_role)
    if "parts" in value and "role" in value:
        return _genai(value)
    if "role" in value:
        return _openai(value)
    if isinstance(value.get("content"), (str, list)):  # a bare completion-like object
        return _openai({**value, "role": default_role})
    return [{"role": default_role, "content": _text(value)}]


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
