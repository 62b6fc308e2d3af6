"""Other instrumentations' span attributes -> tracegym's (GenAI) attribute names.

The tracer applies this mapping to the spans of other instrumentations it records in process
(`spool.py`, `third_party.py`), and the store applies the same one to spans that arrive over OTLP
or are imported (`tracegym.store.otlp`): one definition, so a span lands in the same columns
whichever way it comes. Standard library and the tracer's own modules only.

Attribute mapping (`normalize_attributes`): keys are only ever added, never replaced, so
existing `gen_ai.*` values win and the originals stay queryable.

- operation (gen_ai.operation.name), from the first of:
  - openinference.span.kind: LLM -> chat, TOOL -> execute_tool, AGENT -> invoke_agent,
    CHAIN -> step, RETRIEVER -> search_memory, EMBEDDING -> embeddings, RERANKER -> rerank,
    GUARDRAIL -> guardrail, EVALUATOR -> evaluate, PROMPT -> step;
  - traceloop.span.kind: workflow -> invoke_agent (a workflow is the run's outer agent),
    agent -> invoke_agent, task -> step, tool -> execute_tool;
  - llm.request.type (OpenLLMetry's LLM spans): chat and completion -> chat (so that the
    llm_calls view sees them), embedding -> embeddings, rerank -> rerank.
- input.value / traceloop.entity.input, by operation: execute_tool -> gen_ai.tool.call.arguments,
  chat -> gen_ai.input.messages, search_memory -> gen_ai.memory.query.text, else tracegym.input.
- output.value / traceloop.entity.output: execute_tool -> gen_ai.tool.call.result,
  chat -> gen_ai.output.messages, else tracegym.output.
- chat spans: the flattened messages first (llm.input_messages.N.message.* or gen_ai.prompt.N.*;
  llm.output_messages.N.message.* or gen_ai.completion.N.*; OpenInference's tool calls, tool
  results and content parts included) in the GenAI convention's message/parts shape, as
  tracegym's own LLM spans write them (`tracer/messages.py`; outputs with their finish_reason,
  from llm.finish_reason); the input/output value (a whole request or response body) as it is,
  only when there are none.
- chat spans: gen_ai.tool.definitions (the tools offered, as a JSON list) from
  llm.tools.N.tool.json_schema, or OpenLLMetry's llm.request.functions.N.{name, description,
  parameters}.
- gen_ai.tool.name: tool.name, tool_call.function.name, else (tool spans) traceloop.entity.name
  or the span name. gen_ai.tool.call.id: tool_call.id. gen_ai.tool.description: tool.description.
- gen_ai.agent.name: agent.name, else (agent spans) traceloop.entity.name or the span name, else
  traceloop.workflow.name (which OpenLLMetry puts on every span of a workflow).
- tracegym.step.name (step spans): traceloop.entity.name or the span name.
- gen_ai.request.model: llm.request.model_name, llm.model_name, llm.request.model,
  embedding.model_name, reranker.model_name. gen_ai.response.model: llm.response.model_name,
  llm.response.model.
- gen_ai.usage.cache_read.input_tokens / cache_creation.input_tokens:
  llm.token_count.prompt_details.cache_read / cache_write (and OpenLLMetry's
  gen_ai.usage.cache_read_input_tokens / cache_creation_input_tokens).
- gen_ai.provider.name: llm.provider, llm.system, gen_ai.system.
- gen_ai.usage.input_tokens: llm.token_count.prompt, gen_ai.usage.prompt_tokens,
  llm.usage.prompt_tokens; output_tokens likewise from the completion counts.
- gen_ai.conversation.id: session.id, traceloop.association.properties.session_id or
  conversation_id.
- search_memory spans: retrieval.documents.N.document.id / .content ->
  tracegym.memory.result.record_ids / content_hashes (provenance links, as the tracer's reads).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from tracegym.tracer import semconv as sc
from tracegym.tracer.serialize import content_hash

__all__ = [
    "error_type_from_events",
    "mapped_operation",
    "normalize_attributes",
    "operation_of",
    "token_counts",
]


def error_type_from_events(attributes: dict[str, Any], events: list[dict[str, Any]]) -> None:
    """Fill `error.type` of an ERROR span from the `exception.type` of its last exception."""
    for event in reversed(events):
        if event["name"] == "exception":
            kind = event["attributes"].get("exception.type")
            if kind is not None:
                attributes[sc.ERROR_TYPE] = kind
            return


# ---------------------------------------------------------------------------------------------
# Attribute conventions: OpenInference and OpenLLMetry -> GenAI / tracegym keys

OI_KIND = "openinference.span.kind"
TL_KIND = "traceloop.span.kind"
TL_ENTITY = "traceloop.entity.name"
TL_WORKFLOW = "traceloop.workflow.name"
TOOL_DESCRIPTION = "gen_ai.tool.description"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"

OPENINFERENCE_OPERATIONS = {
    "LLM": sc.OP_CHAT,
    "TOOL": sc.OP_TOOL,
    "AGENT": sc.OP_AGENT,
    "CHAIN": sc.OP_STEP,
    "RETRIEVER": sc.OP_MEMORY_SEARCH,
    "EMBEDDING": "embeddings",
    "RERANKER": "rerank",
    "GUARDRAIL": "guardrail",
    "EVALUATOR": "evaluate",
    "PROMPT": sc.OP_STEP,
}
OPENLLMETRY_OPERATIONS = {
    "workflow": sc.OP_AGENT,
    "agent": sc.OP_AGENT,
    "task": sc.OP_STEP,
    "tool": sc.OP_TOOL,
}
LLM_REQUEST_TYPES = {
    "chat": sc.OP_CHAT,
    "completion": sc.OP_CHAT,
    "embedding": "embeddings",
    "rerank": "rerank",
}

# Plain renames: the first source key present fills the target (when the target is absent).
_RENAMES: list[tuple[str, tuple[str, ...]]] = [
    (sc.REQUEST_MODEL, ("llm.request.model_name", "llm.model_name", "llm.request.model",
                        "embedding.model_name", "reranker.model_name")),
    (sc.RESPONSE_MODEL, ("llm.response.model_name", "llm.response.model")),
    (sc.PROVIDER, ("llm.provider", "llm.system", "gen_ai.system")),
    (sc.INPUT_TOKENS, ("llm.token_count.prompt", "gen_ai.usage.prompt_tokens",
                       "llm.usage.prompt_tokens")),
    (sc.OUTPUT_TOKENS, ("llm.token_count.completion", "gen_ai.usage.completion_tokens",
                        "llm.usage.completion_tokens")),
    (CACHE_READ_TOKENS, ("llm.token_count.prompt_details.cache_read",
                         "gen_ai.usage.cache_read_input_tokens")),
    (CACHE_WRITE_TOKENS, ("llm.token_count.prompt_details.cache_write",
                          "gen_ai.usage.cache_creation_input_tokens")),
    (sc.CONVERSATION_ID, ("session.id", "traceloop.association.properties.session_id",
                          "traceloop.association.properties.conversation_id")),
    (sc.TOOL_CALL_ID, ("tool_call.id",)),
    (TOOL_DESCRIPTION, ("tool.description",)),
]  # fmt: skip


def token_counts(attrs: Mapping[str, Any]) -> tuple[Any, Any]:
    """(input, output) token counts of an LLM span in any of the conventions mapped here."""
    return (
        _first(attrs, (sc.INPUT_TOKENS, *_TOKEN_SOURCES[sc.INPUT_TOKENS])),
        _first(attrs, (sc.OUTPUT_TOKENS, *_TOKEN_SOURCES[sc.OUTPUT_TOKENS])),
    )


_TOKEN_SOURCES = {target: keys for target, keys in _RENAMES}
_INPUT_KEYS = ("input.value", "traceloop.entity.input")
_OUTPUT_KEYS = ("output.value", "traceloop.entity.output")
_IO_KEYS = {
    sc.OP_TOOL: (sc.TOOL_ARGUMENTS, sc.TOOL_RESULT),
    sc.OP_CHAT: (sc.INPUT_MESSAGES, sc.OUTPUT_MESSAGES),
    sc.OP_MEMORY_SEARCH: (sc.MEMORY_QUERY, sc.OUTPUT),
}
_DEFAULT_IO = (sc.INPUT, sc.OUTPUT)

# A span with none of these keys has nothing to map (the fast path).
_TRIGGERS = frozenset(
    {OI_KIND, TL_KIND, TL_ENTITY, TL_WORKFLOW, "llm.request.type", "tool.name", "agent.name",
     "tool_call.function.name", *_INPUT_KEYS, *_OUTPUT_KEYS}
    | {key for _, keys in _RENAMES for key in keys}
)  # fmt: skip

_FLAT_MESSAGES = (
    # (target, flattened prefix, item infix, fields under the item)
    (sc.INPUT_MESSAGES, "llm.input_messages.", ".message."),
    (sc.OUTPUT_MESSAGES, "llm.output_messages.", ".message."),
    (sc.INPUT_MESSAGES, "gen_ai.prompt.", "."),
    (sc.OUTPUT_MESSAGES, "gen_ai.completion.", "."),
)
MESSAGES_LENGTH = 1 << 20  # characters of one message list (each part is cut before that)
_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def _flattened_list(attrs: Mapping[str, Any], prefix: str, infix: str) -> list[dict[str, Any]]:
    """`prefix.N<infix>field = v` keys gathered into [{field: v}, ...] in N order."""
    items: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix) :].partition(".")
        if not index.isdigit() or not rest:
            continue
        field = ("." + rest)[len(infix) :] if ("." + rest).startswith(infix) else rest
        items.setdefault(int(index), {})[field] = value
    return [items[i] for i in sorted(items)]


def _indexed(fields: Mapping[str, Any], head: str, strip: str) -> list[dict[str, Any]]:
    """`head.N.<strip>rest = v` fields gathered into [{rest: v}, ...] in N order."""
    items: dict[int, dict[str, Any]] = {}
    for field, value in fields.items():
        index, _, rest = field[len(head) :].partition(".")
        if index.isdigit() and rest:
            items.setdefault(int(index), {})[rest.removeprefix(strip)] = value
    return [items[i] for i in sorted(items)]


def _openinference_message(fields: dict[str, Any]) -> dict[str, Any]:
    """One OpenInference message (its flattened fields) in the chat shape of OpenAI's API:
    role, content (text, or a list of text/image parts), tool_calls, tool_call_id, name."""
    message = {k: v for k, v in fields.items() if not k.startswith(("tool_calls.", "contents."))}
    calls = _indexed({k: v for k, v in fields.items() if k.startswith("tool_calls.")},
                     "tool_calls.", "tool_call.")  # fmt: skip
    if calls:
        message["tool_calls"] = [
            {"id": c.get("id"), "type": "function",
             "function": {"name": c.get("function.name"),
                          "arguments": c.get("function.arguments")}}
            for c in calls
        ]  # fmt: skip
    contents = _indexed({k: v for k, v in fields.items() if k.startswith("contents.")},
                        "contents.", "message_content.")  # fmt: skip
    if contents and "content" not in message:
        parts = []
        for c in contents:  # tool_use blocks repeat the tool calls above
            if c.get("type") == "text" or ("text" in c and "type" not in c):
                parts.append({"type": "text", "text": c.get("text")})
            elif c.get("type") == "image":
                parts.append({"type": "image_url", "image_url": {"url": c.get("image.image.url")}})
        if parts:
            message["content"] = parts
    return message


def _json_value(text: Any) -> Any:
    """A JSON attribute value parsed; anything else (or text that is not JSON) as it is."""
    if isinstance(text, str):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _tool_definitions(attrs: Mapping[str, Any]) -> list[Any]:
    """The tools offered to the model: OpenInference's llm.tools.N.tool.json_schema (each the
    tool as the API was given it) or OpenLLMetry's llm.request.functions.N.*."""
    tools = [
        _json_value(t["json_schema"])
        for t in _flattened_list(attrs, "llm.tools.", ".tool.")
        if "json_schema" in t
    ]
    if tools:
        return tools
    return [
        {"type": "function", "function": {
            k: _json_value(v) if k == "parameters" else v for k, v in f.items()
        }}
        for f in _flattened_list(attrs, "llm.request.functions.", ".")
        if "name" in f
    ]  # fmt: skip


def _genai_messages(messages: list[dict[str, Any]], output: bool, finish: Any) -> str:
    """Chat-shaped messages as the GenAI convention's JSON (role, parts; outputs with their
    finish_reason), as tracegym's own LLM spans write them (`tracer/messages.py`)."""
    from tracegym.tracer import messages as genai

    if not output:
        return genai.encode(genai.input_messages(messages, MESSAGES_LENGTH), MESSAGES_LENGTH)
    shaped = genai.output_messages(messages, MESSAGES_LENGTH)
    if isinstance(finish, str) and finish and len(shaped) == 1:
        shaped[0]["finish_reason"] = genai.FINISH_REASONS.get(finish.lower(), finish)
    return genai.encode(shaped, MESSAGES_LENGTH)


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None and value != "" and key not in out:
        out[key] = value


def _first(attrs: Mapping[str, Any], keys: Iterable[str]) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


def mapped_operation(attrs: Mapping[str, Any]) -> str | None:
    """The gen_ai.operation.name another convention's attributes stand for (None: unknown)."""
    operation = None
    oi_kind = attrs.get(OI_KIND)
    tl_kind = attrs.get(TL_KIND)
    if isinstance(oi_kind, str):
        operation = OPENINFERENCE_OPERATIONS.get(oi_kind.upper())
    elif isinstance(tl_kind, str):
        operation = OPENLLMETRY_OPERATIONS.get(tl_kind.lower())
    if operation is None:
        request_type = attrs.get("llm.request.type")
        if isinstance(request_type, str):
            operation = LLM_REQUEST_TYPES.get(request_type.lower())
    return operation


def operation_of(attrs: Mapping[str, Any]) -> str | None:
    """The span's operation: its own gen_ai.operation.name, else the one its convention maps to."""
    operation = attrs.get(sc.OPERATION)
    return operation if isinstance(operation, str) else mapped_operation(attrs)


def normalize_attributes(attrs: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """Add tracegym / GenAI keys for OpenInference and OpenLLMetry attributes.

    Returns `attrs` itself when there is nothing to map, else a new dict with the originals
    plus the added keys. Existing keys are never overwritten. `name` (the span name) fills a
    tool, agent or step name the attributes do not give.
    """
    if _TRIGGERS.isdisjoint(attrs):
        return attrs if isinstance(attrs, dict) else dict(attrs)
    out = dict(attrs)

    _put(out, sc.OPERATION, mapped_operation(attrs))
    operation = out.get(sc.OPERATION)  # an existing operation wins

    for target, sources in _RENAMES:
        if target not in out:
            _put(out, target, _first(attrs, sources))

    entity = attrs.get(TL_ENTITY)
    # Names by operation.
    tool_name = _first(attrs, ("tool.name", "tool_call.function.name"))
    if tool_name is None and operation == sc.OP_TOOL:
        tool_name = entity or name or None
    _put(out, sc.TOOL_NAME, tool_name)
    agent_name = attrs.get("agent.name")
    if agent_name is None and operation == sc.OP_AGENT:
        agent_name = entity or name or None
    if agent_name is None:
        agent_name = attrs.get(TL_WORKFLOW)
    _put(out, sc.AGENT_NAME, agent_name)
    if operation == sc.OP_STEP:
        _put(out, sc.STEP_NAME, entity or name or None)

    # Input and output, under the keys the operation reads them from.
    in_key, out_key = _IO_KEYS.get(operation, _DEFAULT_IO)  # type: ignore[arg-type]
    if operation == sc.OP_CHAT and (sc.INPUT_MESSAGES not in out or sc.OUTPUT_MESSAGES not in out):
        # The flattened messages first: the input/output values are whole request and response
        # bodies (model, tools, usage...), the messages are what the model read and wrote.
        for target, prefix, infix in _FLAT_MESSAGES:
            if target not in out:
                messages = _flattened_list(attrs, prefix, infix)
                if messages:
                    if infix == ".message.":
                        messages = [_openinference_message(m) for m in messages]
                    out[target] = _genai_messages(
                        messages, target == sc.OUTPUT_MESSAGES, attrs.get("llm.finish_reason")
                    )
    if operation == sc.OP_CHAT and sc.TOOL_DEFINITIONS not in out:
        tools = _tool_definitions(attrs)
        if tools:
            out[sc.TOOL_DEFINITIONS] = _json_encode(tools)
    _put(out, in_key, _first(attrs, _INPUT_KEYS))
    _put(out, out_key, _first(attrs, _OUTPUT_KEYS))
    if operation == sc.OP_MEMORY_SEARCH and sc.MEMORY_RESULT_IDS not in out:
        documents = _flattened_list(attrs, "retrieval.documents.", ".document.")
        if documents:
            out[sc.MEMORY_RESULT_IDS] = [str(d.get("id", "")) for d in documents]
            if sc.MEMORY_RESULT_HASHES not in out:
                out[sc.MEMORY_RESULT_HASHES] = [
                    content_hash(d["content"]) if "content" in d else "" for d in documents
                ]
    return out
