"""LLM messages in the OpenTelemetry GenAI convention's shape, written and read.

Write side (the tracer, on the agent's thread): `input_messages`, `output_messages` and
`system_instructions` turn what an LLM call was given and returned (OpenAI- or Anthropic-shaped
dicts or SDK objects, Responses API and Gemini shapes, GenAI messages as they are) into the
convention's JSON:

    [{"role": "user", "parts": [{"type": "text", "content": "..."}]},
     {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "f",
                                      "arguments": {...}}]},
     {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": ...}]}]

and, for outputs, one message per choice with its `finish_reason`. `encode` fits the JSON into
the attribute's length budget by shortening the longest texts (then dropping the oldest
messages), so the attribute stays valid JSON that Phoenix and other GenAI readers can parse.

Read side (analysis, synthesis, dashboards): `chat_messages` turns either shape (the GenAI one,
or the `[{"role", "content"}]` lists, raw responses and `{"messages": [...]}` objects older
stores and the importers hold) into the internal chat shape the readers use, OpenAI's:
`{"role", "content": str | None, "tool_calls": [{"id", "type", "function": {"name",
"arguments"}}], "tool_call_id", "name"}`.

Stdlib only; nothing here raises: a shape it does not know becomes a text part holding the
value serialised (`serialize.to_json`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from tracegym.tracer import internal
from tracegym.tracer.serialize import TRUNCATION_MARKER, to_json, to_plain, truncate

MAX_MESSAGES = 100  # the most recent messages kept (a leading system message stays too)
MAX_PARTS = 100
_DEPTH = 6  # nesting of message lists inside objects ({"messages": ...}, [[...]]) followed

# Provider finish/stop reasons -> the convention's (stop, length, content_filter, tool_call,
# error); others are kept as they are (the convention allows any string).
FINISH_REASONS = {
    "stop": "stop", "end_turn": "stop", "stop_sequence": "stop", "completed": "stop",
    "length": "length", "max_tokens": "length", "max_output_tokens": "length",
    "incomplete": "length", "tool_calls": "tool_call", "function_call": "tool_call",
    "tool_use": "tool_call", "tool_call": "tool_call", "content_filter": "content_filter",
    "refusal": "content_filter", "safety": "content_filter", "error": "error",
    "failed": "error",
}  # fmt: skip
ROLES = {"developer": "system", "function": "tool", "model": "assistant", "human": "user",
         "ai": "assistant"}  # fmt: skip

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


# Access to dicts and objects alike ----------------------------------------------------------
# The user's values are read as serialize.py reads them (running none of their code): types with
# `type(x)`, never `x.__class__` (which isinstance looks up on every miss, and a value may make
# a slow property); lists, tuples and dicts through the builtin's own methods (a subclass's
# overrides never run); other Mappings asked for one key, never iterated; no iterator or
# generator iterated; no `==` or truth test on the user's values (their __eq__, __bool__).
_HEAD = slice(0, 5000)  # the items of a list read at most
_NOT_OBJECTS = (str, bytes, bytearray, int, float, list, tuple)  # nothing to get from these


def _get(obj: Any, key: str) -> Any:
    """obj[key] for mappings, obj.key for objects (SDK models), else None; never raises."""
    kind = type(obj)
    if kind is dict:
        return obj.get(key)
    if obj is None or kind is str or kind is list or kind is tuple:
        return None
    try:
        if issubclass(kind, dict):  # the dict's own item: a subclass's `get` never runs
            return dict.get(obj, key)
        if issubclass(kind, _NOT_OBJECTS):
            return None
        if issubclass(kind, Mapping):  # one key looked up: a Mapping readable once stays whole
            return obj.get(key)
        return getattr(obj, key, None)
    except BaseException as exc:  # a property of the user's object raised
        internal.swallow("inspect", exc)
        return None


def _str(value: Any) -> str | None:
    """The exact text of a str (or a subclass's underlying text), else None."""
    kind = type(value)
    if kind is str:
        return value
    if value is None:
        return None
    try:
        if issubclass(kind, str):
            return str.__str__(value)
    except BaseException as exc:
        internal.swallow("inspect", exc)
    return None


def _list(value: Any) -> list[Any] | None:
    """The items of a list/tuple (at most a few thousand, a new list), else None."""
    kind = type(value)
    if kind is list:
        return value[_HEAD]
    if kind is tuple:
        return list(value[_HEAD])
    if value is None or kind is dict or kind is str:
        return None
    try:
        if issubclass(kind, list):
            return list.__getitem__(value, _HEAD)
        if issubclass(kind, tuple):
            return list(tuple.__getitem__(value, _HEAD))
    except BaseException as exc:
        internal.swallow("inspect", exc)
    return None


def _or(value: Any, default: Any) -> Any:
    """`value or default` without the value's own `__bool__`/`__len__`: None and the empty
    or zero builtins give `default`; any other value is kept."""
    if value is None:
        return default
    kind = type(value)
    if kind is str or kind is list or kind is tuple or kind is dict:
        return value if len(value) else default
    if kind is bool or kind is int or kind is float:
        return value if value else default
    return value


def _either(obj: Any, key: str, other: str) -> Any:
    """obj's `key`, or its `other` where `key` holds nothing: `a or b` without a's __bool__."""
    found = _or(_get(obj, key), None)
    return _get(obj, other) if found is None else found


def _is_text_type(block: Any) -> bool:
    """A block whose `type` is "text" (compared as exact text: never the user's __eq__)."""
    return _str(_get(block, "type")) == "text"


class _Writer:
    """One normalisation: the value length limit its leaf values are bounded by."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length

    def plain(self, value: Any) -> Any:
        return to_plain(value, self.max_length)

    def text(self, value: Any) -> str:
        text = _str(value)
        return truncate(text, self.max_length) if text is not None else self.json(value)

    def json(self, value: Any) -> str:
        return to_json(value, self.max_length)

    def fallback(self, value: Any) -> dict[str, Any]:
        return {"type": "text", "content": self.text(value)}

    def arguments(self, value: Any) -> Any:
        """Tool-call arguments as an object where they are JSON text (OpenAI's), else as given."""
        text = _str(value)
        if text is not None:
            try:
                return json.loads(text)
            except ValueError:
                return truncate(text, self.max_length)
        return self.plain(value)

    # Parts ----------------------------------------------------------------------------------
    def tool_call(self, id_: Any, name: Any, arguments: Any) -> dict[str, Any]:
        name = "" if name is None else self.text(name)
        part: dict[str, Any] = {"type": "tool_call", "id": _str(id_), "name": name}
        if arguments is not None:
            part["arguments"] = self.arguments(arguments)
        return part

    def tool_response(self, id_: Any, response: Any) -> dict[str, Any]:
        blocks = _list(response)
        if blocks is not None and blocks and all(_is_text_type(b) for b in blocks):
            response = "\n".join(self.text(_or(_get(b, "text"), "")) for b in blocks)
        text = _str(response)
        return {
            "type": "tool_call_response",
            "id": _str(id_),
            "response": truncate(text, self.max_length)
            if text is not None
            else self.plain(response),
        }

    def media(self, modality: str, url: Any, mime: Any = None, data: Any = None) -> dict:
        url_text, mime_text = _str(url), _str(mime)
        if url_text is not None and url_text.startswith("data:") and ";base64," in url_text:
            head, _, data = url_text.partition(";base64,")
            mime_text = mime_text or head[5:] or None
            url_text = None
        if url_text is not None:
            return {"type": "uri", "modality": modality, "mime_type": mime_text, "uri": url_text}
        content = _str(data)
        if content is None:
            return self.fallback(data)
        return {"type": "blob", "modality": modality, "mime_type": mime_text,
                "content": truncate(content, self.max_length)}  # fmt: skip

    def part(self, block: Any) -> list[dict[str, Any]]:
        """One content block (OpenAI content part, Anthropic block, GenAI or Gemini part)."""
        text = _str(block)
        if text is not None:
            return [{"type": "text", "content": truncate(text, self.max_length)}]
        kind = _str(_get(block, "type"))
        if kind in ("text", "input_text", "output_text", "summary_text"):
            content = _get(block, "text")
            if content is None:
                content = _get(block, "content")
            return [{"type": "text", "content": self.text(content if content is not None else "")}]
        if kind == "refusal":
            return [{"type": "text", "content": self.text(_or(_get(block, "refusal"), ""))}]
        if kind in ("tool_use", "server_tool_use", "function_call"):  # Anthropic, Responses
            call_id = (
                _either(block, "call_id", "id") if kind == "function_call" else _get(block, "id")
            )
            arguments = _get(block, "input") if kind != "function_call" else None
            if arguments is None:
                arguments = _get(block, "arguments")
            return [self.tool_call(call_id, _get(block, "name"), arguments)]
        if kind == "tool_call":  # GenAI
            return [self.tool_call(_get(block, "id"), _get(block, "name"),
                                   _get(block, "arguments"))]  # fmt: skip
        if kind == "tool_result":  # Anthropic
            return [self.tool_response(_get(block, "tool_use_id"), _get(block, "content"))]
        if kind == "tool_call_response":  # GenAI
            return [self.tool_response(_get(block, "id"), _get(block, "response"))]
        if kind == "function_call_output":  # Responses API
            return [self.tool_response(_get(block, "call_id"), _get(block, "output"))]
        if kind in ("thinking", "reasoning"):
            content = _get(block, "thinking") if kind == "thinking" else _get(block, "content")
            if content is None and kind == "reasoning":  # Responses API: summary parts
                summary = _list(_get(block, "summary")) or []
                content = "\n".join(self.text(_or(_get(s, "text"), s)) for s in summary)
            return [{"type": "reasoning", "content": self.text(_or(content, ""))}]
        if kind == "image_url":  # OpenAI chat
            image = _get(block, "image_url")
            return [self.media("image", _get(image, "url") if image is not None else None)]
        if kind == "input_image":  # Responses API
            return [self.media("image", _get(block, "image_url"))]
        if kind == "image":  # Anthropic
            source = _get(block, "source")
            return [self.media("image", _get(source, "url"), _get(source, "media_type"),
                               _get(source, "data"))]  # fmt: skip
        if kind == "input_audio":
            audio = _get(block, "input_audio")
            return [self.media("audio", None, _get(audio, "format"), _get(audio, "data"))]
        if kind in ("uri", "blob", "file"):  # GenAI parts as they are
            plain = self.plain(block)
            return [plain] if type(plain) is dict else [self.fallback(block)]
        if kind is None:  # Gemini parts: {"text"}, {"functionCall"}, {"functionResponse"}
            for key in ("text", "functionCall", "function_call", "functionResponse"):
                found = _get(block, key)
                if found is None:
                    continue
                if key == "text":
                    return [{"type": "text", "content": self.text(found)}]
                if key == "functionResponse":
                    return [self.tool_response(_get(found, "id"), _get(found, "response"))]
                return [self.tool_call(_get(found, "id"), _get(found, "name"),
                                       _get(found, "args"))]  # fmt: skip
        return [self.fallback(block)]

    def content_parts(self, content: Any) -> list[dict[str, Any]]:
        if content is None:
            return []
        blocks = _list(content)
        if blocks is None:
            return self.part(content)
        parts: list[dict[str, Any]] = []
        for block in blocks[:MAX_PARTS]:
            parts += self.part(block)
        return parts

    # Messages -------------------------------------------------------------------------------
    def message(self, item: Any, default_role: str) -> dict[str, Any]:
        """One message of any known shape as {"role", "parts"[, "name"]}."""
        text = _str(item)
        if text is not None:
            return {"role": default_role, "parts": self.part(text)}
        kind = _str(_get(item, "type"))
        role = _str(_get(item, "role"))
        if role is None and kind in ("function_call", "function_call_output", "reasoning"):
            role = "tool" if kind == "function_call_output" else "assistant"
            return {"role": role, "parts": self.part(item)}
        if role is None and _get(item, "content") is None and _get(item, "parts") is None:
            return {"role": default_role, "parts": [self.fallback(item)]}
        role = ROLES.get(role or default_role, role or default_role)
        parts: list[dict[str, Any]] = []
        given = _get(item, "parts")  # GenAI or Gemini
        if given is not None:
            parts += self.content_parts(given)
        content = _get(item, "content")
        blocks = _list(content)
        if (
            role == "tool"
            and content is not None
            and (blocks is None or all(_is_text_type(b) for b in blocks))
        ):  # OpenAI's tool message: text, or text parts
            parts.append(self.tool_response(_get(item, "tool_call_id"), content))
        else:
            parts += self.content_parts(content)
        for call in _list(_get(item, "tool_calls")) or []:
            function = _get(call, "function")
            if function is None:
                function = call
            parts.append(
                self.tool_call(_get(call, "id"), _get(function, "name"),
                               _get(function, "arguments"))
            )  # fmt: skip
        legacy = _get(item, "function_call")
        if legacy is not None and _get(legacy, "name") is not None:
            parts.append(self.tool_call(None, _get(legacy, "name"), _get(legacy, "arguments")))
        refusal = _str(_get(item, "refusal"))
        if refusal:
            parts.append({"type": "text", "content": truncate(refusal, self.max_length)})
        reasoning = _str(_get(item, "reasoning_content"))
        if reasoning:
            parts.insert(0, {"type": "reasoning", "content": truncate(reasoning, self.max_length)})
        if parts and all(p.get("type") == "tool_call_response" for p in parts):
            role = "tool"  # Anthropic sends tool results in user messages
        out: dict[str, Any] = {"role": role, "parts": parts}
        name = _str(_get(item, "name"))
        if name:
            out["name"] = name
        return out

    def messages(self, value: Any, default_role: str, depth: int = 0) -> list[dict[str, Any]]:
        """A list of input messages from a list, one message, or an object holding a list."""
        items = _list(value)
        if items is None:
            for key in ("messages", "input", "contents", "prompt"):
                inner = _get(value, key)
                if inner is not None and depth < _DEPTH and not _is_message(value):
                    return self.messages(inner, default_role, depth + 1)
            return [self.message(value, default_role)]
        if len(items) > MAX_MESSAGES:  # the latest turns, and the system prompt if it leads
            head = items[:1] if _str(_get(items[0], "role")) in ("system", "developer") else []
            items = head + items[len(items) - (MAX_MESSAGES - len(head)) :]
        out = []
        for item in items:
            nested = _list(item)
            if nested is not None and depth < _DEPTH:
                out += self.messages(nested, default_role, depth + 1)
            else:
                out.append(self.message(item, default_role))
        return out

    # Outputs --------------------------------------------------------------------------------
    def output(self, value: Any, depth: int = 0) -> list[dict[str, Any]]:
        items = _list(value)
        if items is not None:
            out: list[dict[str, Any]] = []
            for item in items[:MAX_MESSAGES]:
                out += self.output(item, depth + 1) if depth < _DEPTH else []
            return out
        choices = _list(_get(value, "choices"))
        if choices is not None:  # OpenAI chat completion (or legacy completion)
            out = []
            for choice in choices[:MAX_MESSAGES]:
                message = _get(choice, "message")
                if message is None:
                    message = _get(choice, "delta")
                if message is None:
                    message = _or(_get(choice, "text"), "")
                out.append(self.finished(self.message(message, "assistant"),
                                         _get(choice, "finish_reason")))  # fmt: skip
            return out
        candidates = _list(_get(value, "candidates"))
        if candidates is not None:  # Gemini
            return [
                self.finished(self.message(_or(_get(c, "content"), {}), "assistant"),
                              _either(c, "finish_reason", "finishReason"))
                for c in candidates[:MAX_MESSAGES]
            ]  # fmt: skip
        output = _list(_get(value, "output"))
        if output is not None and _get(value, "content") is None:  # Responses API
            messages = self.messages(output, "assistant")
            parts = [p for m in messages for p in m["parts"]]
            return [self.finished({"role": "assistant", "parts": parts}, _get(value, "status"))]
        if _str(value) is not None or _is_message(value):
            reason = _either(value, "stop_reason", "finish_reason")
            return [self.finished(self.message(value, "assistant"), reason)]
        return [self.finished({"role": "assistant", "parts": [self.fallback(value)]}, None)]

    def finished(self, message: dict[str, Any], reason: Any) -> dict[str, Any]:
        text = _str(reason)
        if text is None:
            calls = any(p.get("type") == "tool_call" for p in message["parts"])
            text = "tool_call" if calls else "stop"
        message["finish_reason"] = FINISH_REASONS.get(text.lower(), text)
        return message


def _is_message(value: Any) -> bool:
    """A single message (it has a role, content or parts), not a container of them."""
    return any(_get(value, key) is not None for key in ("role", "content", "parts"))


# The write side --------------------------------------------------------------------------------
def _safe(build: Any, value: Any, default_role: str) -> list[dict[str, Any]]:
    try:
        return build()
    except BaseException as exc:  # a bug of ours, or a user value raising where unguarded
        _caught(exc)
        return [{"role": default_role, "parts": [{"type": "text", "content": to_json(value)}]}]


def input_messages(value: Any, max_length: int = 8192) -> list[dict[str, Any]]:
    """What an LLM call was given, as GenAI input messages. Never raises."""
    writer = _Writer(max_length)
    return _safe(lambda: writer.messages(value, "user"), value, "user")


def output_messages(value: Any, max_length: int = 8192) -> list[dict[str, Any]]:
    """What an LLM call returned, as GenAI output messages (with finish_reason). Never raises."""
    writer = _Writer(max_length)
    out = _safe(lambda: writer.output(value), value, "assistant")
    for message in out:
        message.setdefault("finish_reason", "stop")
    return out


def system_instructions(value: Any, max_length: int = 8192) -> list[dict[str, Any]]:
    """Instructions given apart from the messages (Anthropic's `system`, the Responses API's
    `instructions`) as the parts of `gen_ai.system_instructions`. Never raises."""
    writer = _Writer(max_length)
    try:
        return writer.content_parts(value)
    except BaseException as exc:
        _caught(exc)
        return [{"type": "text", "content": to_json(value, max_length)}]


def _caught(exc: BaseException) -> None:
    if issubclass(type(exc), Exception):
        internal.report_error("messages", exc)
    else:
        internal.swallow("messages", exc)


def _shorten(value: Any, limit: int) -> Any:
    """`value` with every string longer than `limit` cut (with the truncation marker)."""
    if type(value) is str:
        return truncate(value, limit)
    if type(value) is dict:
        return {k: _shorten(v, limit) for k, v in value.items()}
    if type(value) is list:
        return [_shorten(v, limit) for v in value]
    return value


def encode(messages: list[Any], max_length: int = 8192) -> str:
    """`messages` as JSON text of at most `max_length` characters that is still valid JSON:
    the longest texts are shortened first (marked as cut), then the oldest messages dropped.
    Never raises."""
    try:
        text = _encode(messages)
        if len(text) <= max_length:
            return text
        limit = max(16, max_length // 2)
        while limit >= 16:
            text = _encode(_shorten(messages, limit))
            if len(text) <= max_length:
                return text
            limit //= 2
        kept = _shorten(messages, 16)
        while len(kept) > 1:
            kept = kept[1:]
            text = _encode(kept)
            if len(text) <= max_length:
                return text
        return to_json(kept, max_length)
    except BaseException as exc:
        _caught(exc)
        return to_json(messages, max_length)


# The read side ---------------------------------------------------------------------------------
def _parsed(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _looks_like_response(value: Any) -> bool:
    return isinstance(value, Mapping) and (
        "choices" in value
        or "candidates" in value
        or ("output" in value and "content" not in value)
        or (value.get("type") == "message" and "stop_reason" in value)
    )


def genai_messages(value: Any, role: str = "user") -> list[dict[str, Any]]:
    """Messages in the GenAI shape from JSON text or values of any known shape (old or new);
    a raw response becomes its output messages. Never raises."""
    data = _parsed(value)
    if data is None or data == "" or data == []:
        return []
    if _looks_like_response(data):
        return output_messages(data, 1 << 20)
    if isinstance(data, list) and data and all(_looks_like_response(d) for d in data):
        return output_messages(data, 1 << 20)
    return input_messages(data, 1 << 20) if role != "assistant" else _as_outputs(data)


def _as_outputs(data: Any) -> list[dict[str, Any]]:
    """Output-side reading: plain message lists stay messages; anything else as an output."""
    if isinstance(data, list) or (isinstance(data, Mapping) and "messages" in data):
        return input_messages(data, 1 << 20)
    return output_messages(data, 1 << 20)


def _response_text(response: Any) -> str:
    if isinstance(response, str):
        return response
    return json.dumps(response, ensure_ascii=False, default=str)


def _arguments_text(arguments: Any) -> str:
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else _encode(arguments)


def _internal(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    role = str(message.get("role") or "user")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    responses: list[dict[str, Any]] = []
    for part in message.get("parts") or []:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind == "text":
            texts.append(str(part.get("content") or ""))
        elif kind == "tool_call":
            calls.append(
                {
                    "id": part.get("id"),
                    "type": "function",
                    "function": {
                        "name": part.get("name"),
                        "arguments": _arguments_text(part.get("arguments")),
                    },
                }
            )
        elif kind == "tool_call_response":
            responses.append(part)
    out: list[dict[str, Any]] = []
    name = message.get("name")
    for part in responses:
        tool: dict[str, Any] = {
            "role": "tool",
            "tool_call_id": part.get("id"),
            "content": _response_text(part.get("response")),
        }
        if name:
            tool["name"] = name
        out.append(tool)
    if texts or calls or not responses:
        chat: dict[str, Any] = {
            "role": role,
            "content": "\n".join(t for t in texts if t) if texts else None,
        }
        if calls:
            chat["tool_calls"] = calls
        if name:
            chat["name"] = name
        if "finish_reason" in message:
            chat["finish_reason"] = message["finish_reason"]
        out.append(chat)
    return out


def chat_messages(value: Any, role: str = "user") -> list[dict[str, Any]]:
    """Recorded messages (JSON text or values, GenAI or older shapes) in the internal chat
    shape: `{"role", "content", "tool_calls", "tool_call_id", "name"}`, OpenAI's. `role` is
    the side read ("assistant" for outputs): it decides the role of bare text and objects.
    Text that is not JSON is one message of that role. Never raises."""
    try:
        data = _parsed(value)
        if isinstance(data, str):
            return [{"role": role, "content": data}] if data.strip() else []
        out: list[dict[str, Any]] = []
        for message in genai_messages(data, role):
            out += _internal(message)
        return out
    except Exception as exc:
        internal.report_error("messages.read", exc)
        return []


def message_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The text contents of internal chat messages, one per line."""
    return "\n".join(
        m["content"] for m in messages if isinstance(m.get("content"), str) and m["content"]
    )


__all__ = [
    "FINISH_REASONS",
    "TRUNCATION_MARKER",
    "chat_messages",
    "encode",
    "genai_messages",
    "input_messages",
    "message_text",
    "output_messages",
    "system_instructions",
]
