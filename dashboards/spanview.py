"""A span as the run page's detail pane reads it: texts with real newlines, messages as a chat.

Everything here returns plain strings and lists for the template to print (autoescaped):
JSON text is parsed and indented, JSON strings inside it (a stack trace in an event, a tool
result that is itself JSON) become their text, so a traceback reads as lines, not as one
string full of literal `\\n`. Nothing raises: a value that does not parse is shown as it is.
"""

from __future__ import annotations

import json
from typing import Any

from tracegym.tracer.messages import chat_messages

# Attributes the input/output tab already shows, left out of the attributes tab's table.
SHOWN_ELSEWHERE = {
    "tracegym.input",
    "tracegym.output",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
}
REQUEST_KEYS = ("message", "query", "question", "request", "task", "prompt", "input", "text")


def parse(text: Any) -> Any:
    """JSON text -> its value (strings that hold JSON are parsed once more); else the text."""
    if not isinstance(text, str):
        return text
    stripped = text.strip()
    if not stripped or stripped[0] not in '[{"':
        return text
    try:
        value = json.loads(stripped)
    except ValueError:
        return text
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        return parse(value)
    return value


def _unescape(value: Any) -> Any:
    """Strings inside a value that are JSON objects or lists, parsed (for indenting)."""
    if isinstance(value, dict):
        return {k: _unescape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unescape(v) for v in value]
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        parsed = parse(value)
        return value if isinstance(parsed, str) else _unescape(parsed)
    return value


def text(value: Any) -> str:
    """Any recorded value as readable text: a string as it is (its newlines real), anything
    else (JSON text included) indented, with strings that span lines kept readable."""
    value = parse(value)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    value = _unescape(value)
    if _has_multiline(value):
        return _block(value, 0)
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _has_multiline(value: Any) -> bool:
    if isinstance(value, str):
        return "\n" in value
    if isinstance(value, dict):
        return any(_has_multiline(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_multiline(v) for v in value)
    return False


def _block(value: Any, depth: int) -> str:
    """YAML-like indented text, used when some string spans lines (JSON would escape them)."""
    pad = "  " * depth
    if isinstance(value, dict):
        entries = [(f"{key}:", item) for key, item in value.items()]
    elif isinstance(value, list):
        entries = [("-", item) for item in value]
    else:
        return pad + _scalar(value)
    lines = []
    for label, item in entries:
        if isinstance(item, (dict, list)) and item:
            lines.append(f"{pad}{label}\n{_block(item, depth + 1)}")
        elif isinstance(item, str) and "\n" in item:
            body = "\n".join(pad + "  " + line for line in item.rstrip("\n").split("\n"))
            lines.append(f"{pad}{label} |\n{body}")
        else:
            lines.append(f"{pad}{label} {_scalar(item)}")
    return "\n".join(lines)


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def attributes(raw: Any) -> list[tuple[str, str]]:
    """(key, readable value) per attribute, sorted, less those the input/output tab shows."""
    value = parse(raw)
    if not isinstance(value, dict):
        return [("attributes", text(raw))] if raw else []
    return [(k, text(v)) for k, v in sorted(value.items()) if k not in SHOWN_ELSEWHERE]


def events(raw: Any, start_ns: int | None) -> list[dict[str, Any]]:
    """Each event: its name, when (ms after the span started) and its attributes, readable."""
    value = parse(raw)
    if not isinstance(value, list):
        return [{"name": "events", "at_ms": None, "attributes": [("", text(raw))]}] if raw else []
    out = []
    for event in value:
        if not isinstance(event, dict):
            out.append({"name": "event", "at_ms": None, "attributes": [("", text(event))]})
            continue
        at = event.get("time_ns") or event.get("timestamp")
        at_ms = round((at - start_ns) / 1e6, 2) if isinstance(at, int) and start_ns else None
        attrs = event.get("attributes")
        items = [(k, text(v)) for k, v in attrs.items()] if isinstance(attrs, dict) else []
        out.append({"name": str(event.get("name") or "event"), "at_ms": at_ms, "attributes": items})
    return out


def chat(raw: Any, role: str) -> list[dict[str, Any]]:
    """Recorded LLM messages as chat entries: role, text, tool calls (name, arguments), the
    call a tool message answers. [] when the text holds no JSON (then it is shown as text)."""
    if not isinstance(raw, str) or not raw.strip():
        return []
    try:
        json.loads(raw)
    except ValueError:
        return []
    entries = []
    for message in chat_messages(raw, role):
        calls = []
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            calls.append(
                {
                    "name": str(function.get("name") or "?"),
                    "id": call.get("id"),
                    "arguments": text(function.get("arguments")),
                }
            )
        content = message.get("content")
        entries.append(
            {
                "role": str(message.get("role") or role),
                "content": text(content) if content is not None else "",
                "tool_calls": calls,
                "tool_call_id": message.get("tool_call_id"),
            }
        )
    return entries


def request(raw: Any, limit: int = 240) -> str:
    """A run's request in one line, from its root span's input: the user's message when the
    input holds one (a `message`/`query`/... field, the last user message of a chat), else the
    input as text; cut at `limit` characters."""
    value = parse(raw)
    found: Any = value
    if isinstance(value, dict):
        found = next((value[k] for k in REQUEST_KEYS if isinstance(value.get(k), str)), None)
        if found is None:
            strings = [v for v in value.values() if isinstance(v, str)]
            found = max(strings, key=len) if strings else value
    elif isinstance(value, list):
        users = [m for m in chat_messages(raw, "user") if m.get("role") == "user"]
        found = users[-1].get("content") if users and users[-1].get("content") else value
    line = " ".join(text(found).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
