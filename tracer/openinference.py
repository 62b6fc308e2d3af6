"""OpenInference attributes for tracegym's own spans, derived from their GenAI/tracegym ones.

Phoenix (and other OpenInference readers) show a span's kind from `openinference.span.kind`
and its input/output panels from `input.value`/`output.value`; Phoenix maps GenAI chat, tool
and agent attributes itself, but not tracegym's step, subtask and memory spans, nor an agent's
or step's input and output. So each span carries, at its end (kinds.py), its kind
(`TRACEGYM_OPENINFERENCE=kinds`, the default) or everything `attributes_for` derives from what
it already holds (`full`; `off`: nothing). docs/messages.md says why kinds is the default:

| operation       | span kind | input.value              | output.value        |
|-----------------|-----------|--------------------------|---------------------|
| invoke_agent    | AGENT     | tracegym.input           | tracegym.output     |
| step            | CHAIN     | tracegym.input           | tracegym.output     |
| subtask         | CHAIN     |                          |                     |
| execute_tool    | TOOL      | gen_ai.tool.call.arguments | gen_ai.tool.call.result |
| chat            | LLM       | last input message text  | output text         |
| search_memory   | RETRIEVER | gen_ai.memory.query.text | tracegym.output     |
| update_memory   | CHAIN     | tracegym.memory.content  |                     |
| delete_memory   | CHAIN     |                          |                     |
| record_outcome  | EVALUATOR |                          |                     |

plus `llm.model_name` and `llm.token_count.prompt/completion/total` on chat spans. Values are
copied only from attributes that are there, so content capture off (no tracegym.input, no
arguments ...) leaves them out too, and the redactor scrubs them like every string attribute.

They are for other backends: tracegym's own store reads the GenAI keys, so `stored` drops
these before a span is spooled (no doubled content on disk, nothing counted twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracegym.tracer import semconv as sc

SPAN_KINDS = {
    sc.OP_AGENT: "AGENT",
    sc.OP_TOOL: "TOOL",
    sc.OP_CHAT: "LLM",
    sc.OP_MEMORY_SEARCH: "RETRIEVER",
    sc.OP_MEMORY_UPDATE: "CHAIN",
    sc.OP_MEMORY_DELETE: "CHAIN",
    sc.OP_STEP: "CHAIN",
    sc.OP_SUBTASK: "CHAIN",
    sc.OP_OUTCOME: "EVALUATOR",
}

# operation -> (attribute mirrored as input.value, attribute mirrored as output.value)
_VALUES: dict[str, tuple[str | None, str | None]] = {
    sc.OP_AGENT: (sc.INPUT, sc.OUTPUT),
    sc.OP_STEP: (sc.INPUT, sc.OUTPUT),
    sc.OP_TOOL: (sc.TOOL_ARGUMENTS, sc.TOOL_RESULT),
    sc.OP_MEMORY_SEARCH: (sc.MEMORY_QUERY, sc.OUTPUT),
    sc.OP_MEMORY_UPDATE: (sc.MEMORY_CONTENT, None),
}

ATTRIBUTES = frozenset(
    {
        sc.OI_SPAN_KIND,
        sc.OI_INPUT_VALUE,
        sc.OI_INPUT_MIME,
        sc.OI_OUTPUT_VALUE,
        sc.OI_OUTPUT_MIME,
        sc.OI_MODEL_NAME,
        sc.OI_PROMPT_TOKENS,
        sc.OI_COMPLETION_TOKENS,
        sc.OI_TOTAL_TOKENS,
    }
)
"""Every key `attributes_for` (and the LLM span's text mirrors) may write."""

JSON = "application/json"
TEXT = "text/plain"


OFF = frozenset({"off", False, None, ""})
FULL = frozenset({"full", True})


def wants_kinds(setting: object) -> bool:
    """Whether `Settings.openinference` asks for span kinds (any level but off)."""
    return setting not in OFF


def wants_values(setting: object) -> bool:
    """Whether `Settings.openinference` asks for everything (level full)."""
    return setting in FULL


def mime_type(text: str) -> str:
    """application/json for serialised objects and lists, text/plain for the rest."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        return JSON
    return TEXT


def attributes_for(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenInference attributes a tracegym span's attributes stand for (never overwriting
    keys it has); {} for spans of no known operation."""
    operation = attrs.get(sc.OPERATION)
    kind = SPAN_KINDS.get(operation) if isinstance(operation, str) else None
    if kind is None:
        return {}
    out: dict[str, Any] = {sc.OI_SPAN_KIND: kind}
    source_in, source_out = _VALUES.get(operation, (None, None))  # type: ignore[arg-type]
    for source, key, mime in (
        (source_in, sc.OI_INPUT_VALUE, sc.OI_INPUT_MIME),
        (source_out, sc.OI_OUTPUT_VALUE, sc.OI_OUTPUT_MIME),
    ):
        value = attrs.get(source) if source is not None else None
        if isinstance(value, str) and key not in attrs:
            out[key] = value
            out[mime] = mime_type(value)
    if operation == sc.OP_CHAT:
        model = attrs.get(sc.RESPONSE_MODEL) or attrs.get(sc.REQUEST_MODEL)
        if isinstance(model, str):
            out[sc.OI_MODEL_NAME] = model
        prompt, completion = attrs.get(sc.INPUT_TOKENS), attrs.get(sc.OUTPUT_TOKENS)
        if isinstance(prompt, int):
            out[sc.OI_PROMPT_TOKENS] = prompt
        if isinstance(completion, int):
            out[sc.OI_COMPLETION_TOKENS] = completion
        if isinstance(prompt, int) or isinstance(completion, int):
            out[sc.OI_TOTAL_TOKENS] = (prompt or 0) + (completion or 0)
    return {k: v for k, v in out.items() if k not in attrs}


def stored(attributes: dict[str, Any]) -> dict[str, Any]:
    """A tracegym span's attributes as tracegym stores them: `attributes` itself, less the
    OpenInference copies (removed in place: the spool passes a copy of its own)."""
    if sc.OI_SPAN_KIND in attributes:
        del attributes[sc.OI_SPAN_KIND]
        if (
            sc.OI_INPUT_VALUE in attributes
            or sc.OI_OUTPUT_VALUE in attributes
            or (sc.OI_MODEL_NAME in attributes or sc.OI_PROMPT_TOKENS in attributes)
        ):
            for key in ATTRIBUTES:
                attributes.pop(key, None)
    elif not ATTRIBUTES.isdisjoint(attributes):
        for key in ATTRIBUTES:
            attributes.pop(key, None)
    return attributes


__all__ = [
    "ATTRIBUTES",
    "SPAN_KINDS",
    "attributes_for",
    "mime_type",
    "stored",
    "wants_kinds",
    "wants_values",
]
