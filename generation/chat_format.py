"""The model's own chat format: render OpenAI-shaped conversations and parse replies back.

    from tracegym.generation.chat_format import ChatFormat
    fmt = ChatFormat(tokenizer)                       # or ChatFormat.from_folder(folder)
    prompt = fmt.render(messages, tools=tools)        # the model's template, not ours
    reply = fmt.parse_reply(generated_text)           # Reply(content, tool_calls)

Messages and tools are OpenAI-shaped (roles system/user/assistant/tool; assistant `tool_calls`
with `function.name`/`function.arguments`; tool results with `tool_call_id`; tools as
`{"type": "function", "function": {...}}`). Everything a family's template needs differently
(arguments as a dict, Mistral's 9-character call ids) is normalised in `normalise_messages`,
in one place. Replies are parsed by transformers' `parse_response` when the tokenizer carries a
response template, else by a small parser per family; a reply that cannot be read as a tool call
is plain content, never an exception.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

CHATML, LLAMA3, MISTRAL, GEMMA, UNKNOWN = "chatml", "llama3", "mistral", "gemma", "unknown"
FAMILIES = (CHATML, LLAMA3, MISTRAL)
TEMPLATE_FILES = {CHATML: "chatml_tools.jinja", LLAMA3: "llama3.jinja", MISTRAL: "mistral.jinja"}
# What ends a reply in each family: stripped before parsing.
END_MARKERS = {
    CHATML: ("<|im_end|>", "<|endoftext|>"),
    LLAMA3: ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    MISTRAL: ("</s>",),
    GEMMA: ("<end_of_turn>", "<eos>"),
    UNKNOWN: (),
}
PROBE_TOOL = "tracegym_probe_tool"
# Response schemas (transformers' `response_template` language) for families whose tokenizers
# ship none: the assistant's text up to the end marker, and each <tool_call> block as JSON.
RESPONSE_SCHEMAS: dict[str, dict[str, Any]] = {
    CHATML: {
        "version": 1,
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "content": {"close": "<|im_end|>", "content": "text"},
            "tool_calls": {
                "open": "<tool_call>",
                "close": "</tool_call>",
                "content": "json",
                "repeats": True,
            },
        },
    }
}
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; `arguments` is the decoded JSON object."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    def to_openai(self, index: int = 0) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry (arguments as a JSON string, an id always present)."""
        return {
            "id": self.id or f"call_{index}",
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass(frozen=True)
class Reply:
    """A parsed assistant reply: text content (None when there is none) and its tool calls."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI assistant message."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [c.to_openai(i) for i, c in enumerate(self.tool_calls)]
        return message


# Templates -------------------------------------------------------------------------------------
def template_text(family: str) -> str:
    """The tool-capable template kept in the repository for `family` (chatml, llama3, mistral)."""
    if family not in TEMPLATE_FILES:
        raise ValueError(f"no template for family {family!r}; known: {', '.join(FAMILIES)}")
    return (
        resources.files("tracegym.generation")
        .joinpath("templates", TEMPLATE_FILES[family])
        .read_text()
    )


def template_of(tokenizer: Any) -> str:
    """The tokenizer's chat template as text ('' when it has none; the default one of several)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("tool_use") or template.get("default") or ""
    return template or ""


def family_of(tokenizer_or_template: Any) -> str:
    """The template's family, from the markers its text uses."""
    text = (
        tokenizer_or_template
        if isinstance(tokenizer_or_template, str)
        else template_of(tokenizer_or_template)
    )
    if "<|im_start|>" in text:
        return CHATML
    if "<|start_header_id|>" in text:
        return LLAMA3
    if "[INST]" in text or "[TOOL_CALLS]" in text:
        return MISTRAL
    if "<start_of_turn>" in text:
        return GEMMA
    return UNKNOWN


# Normalising messages --------------------------------------------------------------------------
def mistral_call_id(call_id: str) -> str:
    """A 9-character alphanumeric id (what Mistral's templates demand), stable for one input."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    digest = hashlib.sha256(call_id.encode()).digest()
    return "".join(_ID_ALPHABET[b % len(_ID_ALPHABET)] for b in digest[:9])


def _arguments_dict(arguments: Any) -> Any:
    """Arguments as the dict templates `tojson`; a string that is not a JSON object stays text."""
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
        return decoded if isinstance(decoded, dict) else arguments
    return dict(arguments) if isinstance(arguments, Mapping) else arguments


def normalise_messages(messages: Sequence[Mapping[str, Any]], family: str) -> list[dict[str, Any]]:
    """OpenAI-shaped messages as the family's template reads them (copies; input untouched)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping) or "role" not in message:
            raise ValueError(f"a message must be an object with a 'role', got {message!r}")
        item = dict(message)
        content = item.get("content")
        if isinstance(content, list):  # OpenAI content parts: the text parts, joined
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        item["content"] = "" if content is None else content
        calls = []
        for index, call in enumerate(item.get("tool_calls") or []):
            function = dict(call.get("function") or call)
            function["arguments"] = _arguments_dict(function.get("arguments", {}))
            call_id = call.get("id") or f"call_{len(out)}_{index}"
            if family == MISTRAL:
                call_id = mistral_call_id(call_id)
            calls.append({"id": call_id, "type": "function", "function": function})
        if calls:
            item["tool_calls"] = calls
        else:
            item.pop("tool_calls", None)
        if item["role"] == "tool" and family == MISTRAL and item.get("tool_call_id"):
            item["tool_call_id"] = mistral_call_id(item["tool_call_id"])
        out.append(item)
    return out


def normalise_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tool schemas in OpenAI's shape (a bare function schema is wrapped)."""
    if not tools:
        return None
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            raise ValueError(f"a tool must be an object, got {tool!r}")
        out.append(
            dict(tool) if "function" in tool else {"type": "function", "function": dict(tool)}
        )
    return out


# Parsing replies -------------------------------------------------------------------------------
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def _call_from(
    obj: Any, arguments_keys: tuple[str, ...] = ("arguments", "parameters")
) -> ToolCall | None:
    if not isinstance(obj, Mapping):
        return None
    if isinstance(obj.get("function"), Mapping):
        obj = {**obj["function"], "id": obj.get("id")}
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments: Any = {}
    for key in arguments_keys:
        if key in obj:
            arguments = _arguments_dict(obj[key])
            break
    if not isinstance(arguments, dict):
        return None
    call_id = obj.get("id")
    return ToolCall(name, arguments, call_id if isinstance(call_id, str) else None)


def _strip(text: str, family: str) -> str:
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for marker in END_MARKERS.get(family, ()):
            if text.endswith(marker):
                text, changed = text[: -len(marker)].rstrip(), True
    return text


def _without_cut_close(text: str, close: str = "</tool_call>") -> str:
    """`text` less a closing tag the token limit cut short at its very end (`</tool_call`):
    the call before it is whole, and a reply stopped by `max_tokens` keeps it."""
    for n in range(len(close) - 1, 1, -1):
        if text.endswith(close[:n]):
            return text[:-n]
    return text


def parse_hermes(text: str) -> Reply:
    """Hermes/Qwen: any number of `<tool_call>{json}</tool_call>` blocks, text around them (the
    last one's closing tag may be missing or cut short: a reply stopped at its token limit)."""
    if "<tool_call>" not in text:
        return Reply(text or None)
    text = _without_cut_close(text)
    calls = []
    for block in _TOOL_CALL_RE.findall(text):
        try:
            call = _call_from(json.loads(block))
        except json.JSONDecodeError:
            call = None
        if call is None:
            return Reply(text or None)
        calls.append(call)
    content = _TOOL_CALL_RE.sub("", text).strip()
    return Reply(content or None, calls)


def parse_llama3(text: str) -> Reply:
    """Llama 3: the reply is one JSON object `{"name": ..., "parameters": ...}` (or `<|python_tag|>`
    then such objects separated by `;`)."""
    body = text.removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return Reply(text or None)
    calls = []
    decoder = json.JSONDecoder()
    position = 0
    while position < len(body):
        try:
            obj, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return Reply(text or None)
        call = _call_from(obj)
        if call is None:
            return Reply(text or None)
        calls.append(call)
        position = end
        while position < len(body) and body[position] in " \t\r\n;":
            position += 1
    return Reply(None, calls)


def parse_mistral(text: str) -> Reply:
    """Mistral: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments", "id"}` objects."""
    head, marker, tail = text.partition("[TOOL_CALLS]")
    if not marker:
        return Reply(text or None)
    try:
        obj, _ = json.JSONDecoder().raw_decode(tail.strip())
    except json.JSONDecodeError:
        return Reply(text or None)
    items = obj if isinstance(obj, list) else [obj]
    calls = [_call_from(item) for item in items]
    if not calls or any(c is None for c in calls):
        return Reply(text or None)
    return Reply(head.strip() or None, [c for c in calls if c is not None])


PARSERS = {CHATML: parse_hermes, LLAMA3: parse_llama3, MISTRAL: parse_mistral}


def attempts_call(text: str, family: str) -> bool:
    """Whether a reply that parsed as no call was meant as one: it opens the family's call
    syntax (a malformed call, which an environment counts as an invalid step)."""
    stripped = text.lstrip()
    if family == CHATML:
        return "<tool_call>" in text
    if family == MISTRAL:
        return "[TOOL_CALLS]" in text
    if family == LLAMA3:
        return stripped.startswith(("{", "<|python_tag|>")) and '"name"' in text
    return "<tool_call>" in text or "[TOOL_CALLS]" in text


def parse_any(text: str) -> Reply:
    """A reply from a model of unknown family: the first parser that finds a tool call."""
    for parser in PARSERS.values():
        reply = parser(text)
        if reply.tool_calls:
            return reply
    return Reply(text or None)


# The format ------------------------------------------------------------------------------------
class ChatFormat:
    """A tokenizer's chat format: renders conversations and parses replies in its family."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        self.family = family_of(tokenizer)

    @classmethod
    def from_folder(cls, folder: str | Path, chat_template: str | Path | None = None) -> ChatFormat:
        """The format of a model folder, loading only its tokenizer (never the weights)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(Path(folder))
        template = Path(chat_template).read_text() if chat_template is not None else None
        return cls(tokenizer, template)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text the model's own template makes of this conversation."""
        return self.tokenizer.apply_chat_template(
            normalise_messages(messages, self.family),
            tools=normalise_tools(tools),
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def render_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The prompt as token ids (the rendered text tokenized without adding special tokens
        again: the template already wrote them)."""
        text = self.render(messages, tools, add_generation_prompt)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def parse_reply(self, text: str, prefix: str | None = None) -> Reply:
        """The content and tool calls of a generated reply (the text after the prompt `prefix`).
        transformers' parse_response reads it when the tokenizer carries a response template or
        the family has a known one (Hermes/Qwen); what that cannot read, or a family without a
        schema, goes to the family's own parser. Never raises on what a model wrote."""
        own = getattr(self.tokenizer, "response_template", None)
        schema = own if own is not None else RESPONSE_SCHEMAS.get(self.family)
        if schema is not None:
            anchor = schema.get("start_anchor", "") if isinstance(schema, Mapping) else ""
            try:
                message = self.tokenizer.parse_response(
                    text, schema=schema, prefix=prefix or anchor
                )
                reply = _reply_from_message(message)
            except Exception:  # a reply the schema cannot read falls back below
                reply = None
            if reply is not None:
                return reply
        text = _strip(text, self.family)
        parser = PARSERS.get(self.family, parse_any)
        try:
            return parser(text)
        except Exception:  # a model's output must never raise here
            return Reply(text or None)


def _reply_from_message(message: Any) -> Reply | None:
    """A parse_response message as a Reply; None when a call in it is not a call (the family
    parser then keeps the whole text as content)."""
    if not isinstance(message, Mapping):
        return None
    calls = [_call_from(call) for call in message.get("tool_calls") or []]
    if any(call is None for call in calls):
        return None
    content = message.get("content")
    content = content.strip() if isinstance(content, str) else None
    return Reply(content or None, [c for c in calls if c is not None])


def supports_tools(tokenizer: Any, chat_template: str | None = None) -> bool:
    """Whether the template can express tools: a probe conversation with one tool is rendered
    and the tool's name must reach the prompt."""
    template = chat_template if chat_template is not None else template_of(tokenizer)
    if not template:
        return False
    probe_tools = [
        {
            "type": "function",
            "function": {
                "name": PROBE_TOOL,
                "description": "A probe.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    messages = [{"role": "user", "content": "hello"}]
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=probe_tools,
            chat_template=template,
            add_generation_prompt=True,
            tokenize=False,
        )
    except Exception:
        return False
    return PROBE_TOOL in text


__all__ = [
    "CHATML",
    "FAMILIES",
    "LLAMA3",
    "MISTRAL",
    "RESPONSE_SCHEMAS",
    "ChatFormat",
    "Reply",
    "ToolCall",
    "attempts_call",
    "family_of",
    "mistral_call_id",
    "normalise_messages",
    "normalise_tools",
    "parse_any",
    "parse_hermes",
    "parse_llama3",
    "parse_mistral",
    "supports_tools",
    "template_text",
]
