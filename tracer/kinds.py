"""The span kinds of the contract (see semconv.py): what each is called and what it records."""

from __future__ import annotations

import itertools
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link
from tracegym.tracer import internal
from tracegym.tracer import messages as genai
from tracegym.tracer import semconv as sc
from tracegym.tracer.context import (
    ActiveRun,
    Budget,
    PendingCall,
    Scope,
    claim_call,
    current,
    expect_calls,
    last_run,
)
from tracegym.tracer.openinference import TEXT, wants_values
from tracegym.tracer.operations import Handle, Operation, _caught, _record_usage, state
from tracegym.tracer.operations import _openinference as _openinference  # where it was
from tracegym.tracer.serialize import content_hash, to_json

# Call ids come from a generator of our own: drawing from `random` would shift the agent's own
# seeded stream, and os.urandom is a system call on every tool call. They are drawn _CALL_IDS at
# a time (one big draw and one hex conversion: a fifth of the cost of one of each per call), so
# a tool call pops one; a forked child reseeds and drops what its parent had drawn.
_ids = random.Random(os.urandom(16))
_CALL_IDS = 64
_call_ids: list[str] = []


def _draw_call_ids() -> str:
    """A fresh call id; the next _CALL_IDS - 1 are kept for the calls to come."""
    digits = f"{_ids.getrandbits(64 * _CALL_IDS):0{16 * _CALL_IDS}x}"
    drawn = ["call_" + digits[i : i + 16] for i in range(0, 16 * _CALL_IDS, 16)]
    _call_ids.extend(drawn[1:])  # atomic: threads drawing at once never share an id
    return drawn[0]


def _reseed_in_child() -> None:
    _ids.seed(os.urandom(16))
    _call_ids.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_in_child)


# Records of one memory read whose ids and content hashes are recorded: hashing is the costly
# part (a million records cost 9.5 s on the agent's thread); the rest are counted in
# tracegym.memory.result.omitted.
MEMORY_RESULT_LIMIT = 1000


def _json(value: Any) -> str:
    return to_json(value, state.settings.max_value_length)


def _record_id(value: Any) -> str:
    """A record id as text: strings as they are, anything else safely serialised."""
    return value if type(value) is str else to_json(value, 256)


def _text(value: Any) -> str | None:
    """str(value) for a user-given id, or None (counted) when its __str__ raises."""
    if type(value) is str:
        return value
    try:
        return str.__str__(str(value))
    except BaseException as exc:
        internal.swallow("inspect", exc)
        return None


def _input_of(op: Operation, arguments: dict[str, Any]) -> Any:
    """Decorator form: the call's arguments; `with` form: its `input=` value."""
    if op._binder is None:
        return arguments.get("input")
    return arguments


def _budget_used(handle: Handle, limits: Mapping[str, float | None]) -> None:
    """Write a scope's usage (steps, tokens, seconds) and whether it exceeded its limits."""
    budget = handle.scope.budgets[-1]  # type: ignore[union-attr]
    seconds = time.monotonic() - budget.started
    span = handle.span
    span.set_attribute(sc.USED_STEPS, budget.steps)
    span.set_attribute(sc.USED_TOKENS, budget.tokens)
    span.set_attribute(sc.USED_SECONDS, round(seconds, 6))
    used = {"steps": budget.steps, "tokens": budget.tokens, "seconds": seconds}
    if any(v is not None for v in limits.values()):
        exceeded = any(limit is not None and used[k] > limit for k, limit in limits.items())
        span.set_attribute(sc.BUDGET_EXCEEDED, exceeded)


class Agent(Operation):
    """`invoke_agent {name}`. The outermost agent call starts a run: a new trace of its own
    (linked to any span the application had open), with a run id and a step counter."""

    operation = sc.OP_AGENT
    takes_step = False

    def __init__(
        self,
        name: str | None = None,
        *,
        agent_id: str | None = None,
        conversation_id: str | None = None,
        run_id: str | Callable[..., str] | None = None,
        capture: bool | None = None,
        **call: Any,
    ) -> None:
        super().__init__(name, capture=capture, **call)
        self.agent_id = agent_id
        self.conversation_id = conversation_id
        self.run_id = run_id

    def static_attributes(self) -> dict[str, Any]:
        attrs = {sc.OPERATION: self.operation, sc.AGENT_NAME: self.name}
        if self.agent_id:
            attrs[sc.AGENT_ID] = self.agent_id
        if self.conversation_id:
            attrs[sc.CONVERSATION_ID] = self.conversation_id
        return attrs

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        attrs[sc.AGENT_NAME] = self.name  # an agent span names itself, not its parent
        if capture and arguments:
            attrs[sc.INPUT] = _json(_input_of(self, arguments))
        run_id = self.run_id
        if callable(run_id):
            try:
                run_id = run_id(**arguments)
            except BaseException as exc:  # the user's callback: the run still gets an id
                _caught("run_id", exc)
                run_id = None
        if run_id is not None:
            run_id = _text(run_id)
            if run_id is not None:
                attrs[sc.RUN_ID] = run_id

    def start_span(self, attrs: dict[str, Any], parent: Scope | None) -> trace.Span:
        if parent is not None:  # a sub-agent: a child in the same run
            return super().start_span(attrs, parent)
        outer = trace.get_current_span().get_span_context()
        links = [Link(outer, {"tracegym.link": "caller"})] if outer.is_valid else None
        return state.tracer.start_span(
            self._span_name,
            context=otel_context.Context(),  # a run is a trace of its own
            attributes=attrs,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        )

    def open_scope(self, span: trace.Span, parent: Scope | None, arguments: dict) -> Scope:
        budget = Budget()
        if parent is not None:
            return Scope(parent.run, self.name or "", (*parent.budgets, budget))
        run_id = span.attributes.get(sc.RUN_ID) if hasattr(span, "attributes") else None  # type: ignore[attr-defined]
        if run_id is None:
            ctx = span.get_span_context()
            run_id = format(ctx.trace_id, "032x") if ctx.is_valid else uuid.uuid4().hex
            span.set_attribute(sc.RUN_ID, run_id)
        return Scope(ActiveRun(str(run_id)), self.name or "", (budget,))

    def on_result(self, handle: Handle, result: Any, capture: bool) -> None:
        if capture:
            handle.span.set_attribute(sc.OUTPUT, _json(result))

    def on_end(self, handle: Handle) -> None:
        _budget_used(handle, {})
        scope = handle.scope
        if scope is not None and len(scope.budgets) == 1:  # the outermost agent: its run ends
            last_run.set(scope.run.run_id)


class Tool(Operation):
    """`execute_tool {name}`: call id, arguments and result (when content is captured)."""

    operation = sc.OP_TOOL

    def __init__(self, name: str | None = None, *, call_id: str | None = None, **kw: Any):
        super().__init__(name, **kw)
        self.call_id = call_id

    def static_attributes(self) -> dict[str, Any]:
        return {sc.OPERATION: self.operation, sc.TOOL_NAME: self.name}

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        given = None
        if capture:
            if self._binder is None:  # `with` form: `tool("name", arguments={...})`
                arguments = arguments.get("arguments", {})
            given = attrs[sc.TOOL_ARGUMENTS] = to_json(arguments, state.settings.max_value_length)
        call_id = self.call_id
        if not call_id:  # the model's id when its latest reply asked for this call
            call_id = claim_call(self.name, given)
        if not call_id:
            try:
                call_id = _call_ids.pop()
            except IndexError:
                call_id = _draw_call_ids()
        attrs[sc.TOOL_CALL_ID] = call_id

    def on_result(self, handle: Handle, result: Any, capture: bool) -> None:
        if capture:
            handle.span.set_attribute(
                sc.TOOL_RESULT, to_json(result, state.settings.max_value_length)
            )


def _is_mapping(value: Any) -> bool:
    """isinstance(value, Mapping) from `type(value)`: never the value's own `__class__`."""
    return issubclass(type(value), Mapping)


def _usage_of(result: Any) -> tuple[Any, Any] | None:
    """Token usage from the response shapes of common clients (OpenAI, Anthropic, dicts).
    Reads the user's result (properties, __getattr__): the caller guards it."""
    usage = result.get("usage") if _is_mapping(result) else getattr(result, "usage", None)
    if usage is None:
        return None
    if _is_mapping(usage):
        get = usage.get
    else:

        def get(key: str) -> Any:
            return getattr(usage, key, None)

    input_tokens = get("input_tokens")
    output_tokens = get("output_tokens")
    if input_tokens is None:
        input_tokens = get("prompt_tokens")
    if output_tokens is None:
        output_tokens = get("completion_tokens")
    return input_tokens, output_tokens


class LLM(Operation):
    """`chat {model}`: model, token usage, and the messages when message capture is on.

    `system_instructions` and `tool_definitions`, when the agent passes them, are recorded as
    given (`gen_ai.system_instructions`, `gen_ai.tool.definitions`): synthesis reads them so
    that training environments speak to the model the way the agent does."""

    operation = sc.OP_CHAT

    def __init__(
        self,
        name: str | None = None,
        *,
        model: str | None = None,
        provider: str | None = None,
        usage: Callable[[Any], tuple[int | None, int | None]] | None = None,
        capture_messages: bool | None = None,
        system_instructions: str | list[Any] | None = None,
        tool_definitions: list[Any] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(name, **kw)
        self.model = model
        self.provider = provider
        self.usage = usage
        self.capture_messages = capture_messages
        self.system_instructions = system_instructions
        self.tool_definitions = tool_definitions

    def span_name(self) -> str:
        return f"chat {self.model or self.name}"

    def static_attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {sc.OPERATION: self.operation}
        if self.model:
            attrs[sc.REQUEST_MODEL] = self.model
        if self.provider:
            attrs[sc.PROVIDER] = self.provider
        instructions = self.system_instructions
        if isinstance(instructions, str):
            instructions = [{"type": "text", "content": instructions}]
        if instructions:
            attrs[sc.SYSTEM_INSTRUCTIONS] = _json(instructions)
        if self.tool_definitions:
            attrs[sc.TOOL_DEFINITIONS] = _json(self.tool_definitions)
        return attrs

    def _messages_on(self, capture: bool) -> bool:
        wanted = self.capture_messages
        if wanted is None:
            wanted = state.settings.capture_messages
        return capture and wanted

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        model = arguments.get("model")
        if type(model) is str:
            attrs[sc.REQUEST_MODEL] = model
        elif model is not None:
            model = _text_if_str(model)
            if model is not None:
                attrs[sc.REQUEST_MODEL] = model
        if self._messages_on(capture):
            limit = state.settings.max_value_length
            messages = genai.input_messages(_messages_given(arguments), limit)
            attrs[sc.INPUT_MESSAGES] = genai.encode(messages, limit)
            system = _system_given(arguments)
            if system is not None and sc.SYSTEM_INSTRUCTIONS not in attrs:
                parts = genai.system_instructions(system, limit)
                attrs[sc.SYSTEM_INSTRUCTIONS] = genai.encode(parts, limit)
            if wants_values(state.settings.openinference) and messages:
                text = _parts_text(messages[-1])
                if text:
                    attrs[sc.OI_INPUT_VALUE] = text
                    attrs[sc.OI_INPUT_MIME] = TEXT

    def on_result(self, handle: Handle, result: Any, capture: bool) -> None:
        span = handle.span
        try:
            usage = self.usage(result) if self.usage is not None else _usage_of(result)
        except BaseException as exc:  # the user's callback, or the result's own properties
            if self.usage is not None:
                _caught("usage", exc)
            else:
                internal.swallow("inspect", exc)
            usage = None
        if usage is not None:
            try:
                input_tokens, output_tokens = usage
            except BaseException as exc:
                internal.swallow("inspect", exc)
            else:
                _record_usage(span, input_tokens, output_tokens)
        try:
            model = result.get("model") if _is_mapping(result) else getattr(result, "model", None)
            model = _text_if_str(model)
        except BaseException as exc:
            internal.swallow("inspect", exc)
            model = None
        if model is not None:
            span.set_attribute(sc.RESPONSE_MODEL, model)
        if self._messages_on(capture):
            limit = state.settings.max_value_length
            messages = genai.output_messages(result, limit)
            span.set_attribute(sc.OUTPUT_MESSAGES, genai.encode(messages, limit))
            _expect_tool_calls(messages, limit)
            text = "\n".join(t for t in map(_parts_text, messages) if t)
            if text and wants_values(state.settings.openinference):
                span.set_attribute(sc.OI_OUTPUT_VALUE, text)
                span.set_attribute(sc.OI_OUTPUT_MIME, TEXT)


def _expect_tool_calls(messages: list[dict[str, Any]], limit: int) -> None:
    """The tool calls (with ids) of a model reply become the run's pending calls, so that the
    `@tg.tool` calls carrying them out record the model's call ids (`context.claim_call`)."""
    calls = []
    for message in messages:
        for part in message.get("parts") or ():
            if type(part) is dict and part.get("type") == "tool_call" and part.get("id"):
                arguments = part.get("arguments")  # parsed from OpenAI's JSON text already
                text = None if arguments is None else to_json(arguments, limit)
                calls.append(PendingCall(str(part.get("name") or ""), text, str(part["id"])))
    expect_calls(calls)


_MESSAGE_KEYS = ("messages", "input", "contents", "prompt")


def _messages_given(arguments: dict[str, Any]) -> Any:
    """What an LLM call was given to say: `messages` (OpenAI, Anthropic), `input` (the
    Responses API), `contents` (Gemini) or `prompt`; else the only text argument; else all."""
    for key in _MESSAGE_KEYS:
        value = arguments.get(key)
        if value is not None:
            return value
    texts = [v for v in arguments.values() if issubclass(type(v), str)]
    return texts[0] if len(texts) == 1 and len(arguments) == 1 else arguments


def _system_given(arguments: dict[str, Any]) -> Any:
    """Instructions given apart from the messages: Anthropic's `system`, the Responses API's
    `instructions`."""
    value = arguments.get("system")
    return value if value is not None else arguments.get("instructions")


def _parts_text(message: dict[str, Any]) -> str:
    """The text parts of a GenAI message, one per line."""
    return "\n".join(
        p["content"] for p in message.get("parts", ()) if p.get("type") == "text" and p["content"]
    )


def _text_if_str(value: Any) -> str | None:
    """`value` as exact text when it is a str (or a subclass), else None; never raises."""
    if type(value) is str:
        return value
    try:
        return str.__str__(value) if issubclass(type(value), str) else None
    except BaseException as exc:  # pragma: no cover - type(x), not x.__class__: nothing to run
        internal.swallow("inspect", exc)
        return None


class _Memory(Operation):
    """Shared by memory operations: the store, and which argument names the record."""

    operation = ""
    verb = ""

    def __init__(
        self,
        store: str | None = None,
        *,
        id_from: str | None = None,
        content_from: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(store, **kw)
        self.id_from = id_from  # decorator form: the parameter that holds the record id
        self.content_from = content_from  # decorator form: the parameter that holds the content

    def span_name(self) -> str:
        return f"{self.operation} {self.name}"

    def static_attributes(self) -> dict[str, Any]:
        return {sc.OPERATION: self.operation, sc.MEMORY_STORE: self.name}

    def _pick(self, arguments: dict[str, Any], wanted: str | None, position: int) -> Any:
        if self._binder is None:  # `with` form: the values themselves were given
            return self.call.get({0: "record_id", 1: "content"}[position])
        if wanted is not None:
            return arguments.get(wanted)
        values = list(arguments.values())
        return values[position] if len(values) > position else None


class MemoryWrite(_Memory):
    """`update_memory {store}`: record id and content hash (plus content when captured).

    Decorator form: the record id is the first argument (or the one `id_from` names) and the
    content the second (or the one `content_from` names), else the return value. The `with`
    form takes the values themselves: `memory_write("notes", record_id=k, content=v)`.
    """

    operation = sc.OP_MEMORY_UPDATE

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        record = self._pick(arguments, self.id_from, 0)
        if record is not None:
            attrs[sc.MEMORY_RECORD] = _record_id(record)
        content = self._pick(arguments, self.content_from, 1)
        if content is not None:
            attrs[sc.MEMORY_CONTENT_HASH] = content_hash(content)
            if capture:
                attrs[sc.MEMORY_CONTENT] = _json(content)

    def on_result(self, handle: Handle, result: Any, capture: bool) -> None:
        attributes = getattr(handle.span, "attributes", None) or {}
        if sc.MEMORY_CONTENT_HASH not in attributes and result is not None:
            handle.span.set_attribute(sc.MEMORY_CONTENT_HASH, content_hash(result))
            if capture:
                handle.span.set_attribute(sc.MEMORY_CONTENT, _json(result))


class MemoryDelete(_Memory):
    """`delete_memory {store}`: the record id deleted."""

    operation = sc.OP_MEMORY_DELETE

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        record = self._pick(arguments, self.id_from, 0)
        if record is not None:
            attrs[sc.MEMORY_RECORD] = _record_id(record)


def _pair(item: Any) -> tuple[Any, Any]:
    """(record id, content) of one item of a memory read's result."""
    try:
        if issubclass(type(item), tuple) and tuple.__len__(item) == 2:
            return tuple.__getitem__(item, 0), tuple.__getitem__(item, 1)
        if _is_mapping(item) and "id" in item:
            content = next((item[k] for k in ("content", "text", "value") if k in item), item)
            return item["id"], content
    except BaseException as exc:  # the item's own methods raised: an anonymous record
        internal.swallow("inspect", exc)
    return None, item


def _size(value: Any) -> int | None:
    try:
        return len(value)
    except BaseException as exc:
        internal.swallow("inspect", exc)
        return None


def _sequence_base(value: Any) -> type | None:
    """list or tuple when `value` is one (or a subclass: read through the base's own methods,
    as serialize.py does, so no override runs), else None."""
    kind = type(value)
    if issubclass(kind, list):
        return list
    return tuple if issubclass(kind, tuple) else None


def _records(result: Any, query: Any, limit: int) -> tuple[list[tuple[Any, Any]], int]:
    """The first `limit` (record id, content) pairs of what a memory read returned, and how
    many records it returned in all.

    A list of (id, content) pairs or of dicts with an "id" key give their own ids; a list of
    anything else gives anonymous records; a single value is the record stored under the query
    key (so `remember(k, v)` then `recall(k) -> v` links up); None is nothing found.
    """
    if result is None:
        return [], 0
    base = _sequence_base(result)
    if base is not None:
        pairs = [_pair(item) for item in itertools.islice(base.__iter__(result), limit)]
        return pairs, max(base.__len__(result), len(pairs))
    return [(query, result)], 1


def _given_records(records: Iterable[Any], limit: int) -> tuple[list[tuple[Any, Any]], int]:
    """`_records` for what a `records=` callback returned: an iterable of (id, content)."""
    iterator = iter(records)
    pairs = []
    for item in itertools.islice(iterator, limit):
        try:
            record_id, content = item
        except BaseException as exc:
            internal.swallow("inspect", exc)
            record_id, content = None, item
        pairs.append((record_id, content))
    total = _size(records) if hasattr(type(records), "__len__") else None
    if total is None:  # an iterator: the rest is counted, not serialised or hashed
        total = len(pairs) + sum(1 for _ in iterator)
    return pairs, max(total, len(pairs))


def _walked(walk: Callable[..., tuple[list[tuple[Any, Any]], int]], *args: Any):
    """`walk(*args)`, or no records when iterating the user's result raised."""
    try:
        return walk(*args)
    except BaseException as exc:
        internal.swallow("inspect", exc)
        return [], 0


class MemoryRead(_Memory):
    """`search_memory {store}`: the query, and the ids and content hashes of what came back,
    so analysis can link this read to the write that produced each record. Only the first
    MEMORY_RESULT_LIMIT records are hashed; how many more there were is recorded."""

    operation = sc.OP_MEMORY_SEARCH

    def __init__(
        self,
        store: str | None = None,
        *,
        query_from: str | None = None,
        records: Callable[[Any], Iterable[tuple[Any, Any]]] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(store, **kw)
        self.query_from = query_from
        self.records = records

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        query = self._query_of(arguments)
        if query is not None and capture:
            attrs[sc.MEMORY_QUERY] = _json(query)

    def _pairs(self, handle: Handle, result: Any) -> tuple[list[tuple[Any, Any]], int]:
        """At most MEMORY_RESULT_LIMIT records of `result`, and the count of all of them."""
        if self.records is None:
            return _walked(_records, result, self._query_of(handle.arguments), MEMORY_RESULT_LIMIT)
        try:
            given = self.records(result)
        except BaseException as exc:  # the user's callback raised: a bug to show them
            _caught("memory.records", exc)
            return [], 0
        return _walked(_given_records, given, MEMORY_RESULT_LIMIT)

    def _query_of(self, arguments: dict[str, Any]) -> Any:
        if self._binder is None:
            return self.call.get("query")
        if self.query_from is not None:
            return arguments.get(self.query_from)
        return next(iter(arguments.values()), None)

    def on_result(self, handle: Handle, result: Any, capture: bool) -> None:
        pairs, total = self._pairs(handle, result)
        span = handle.span
        span.set_attribute(
            sc.MEMORY_RESULT_IDS, [_record_id(i) if i is not None else "" for i, _ in pairs]
        )
        span.set_attribute(sc.MEMORY_RESULT_HASHES, [content_hash(c) for _, c in pairs])
        if total > len(pairs):
            span.set_attribute(sc.MEMORY_RESULT_OMITTED, total - len(pairs))
        if capture:
            span.set_attribute(sc.OUTPUT, _json(result))


class Step(Operation):
    """`step {name}`: one step of the agent's own loop (plan, reflect, act ...)."""

    operation = sc.OP_STEP

    def static_attributes(self) -> dict[str, Any]:
        return {sc.OPERATION: self.operation, sc.STEP_NAME: self.name}

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        if capture and arguments:
            attrs[sc.INPUT] = _json(_input_of(self, arguments))

    def on_result(self, handle: Handle, result: Any, capture: bool) -> None:
        if capture:
            handle.span.set_attribute(sc.OUTPUT, _json(result))


class Subtask(Operation):
    """`subtask {name}`: a part of the run with an optional budget; records what it used."""

    operation = sc.OP_SUBTASK
    takes_step = False

    def __init__(
        self,
        name: str | None = None,
        *,
        budget_steps: int | None = None,
        budget_tokens: int | None = None,
        budget_seconds: float | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(name, **kw)
        self.limits = {"steps": budget_steps, "tokens": budget_tokens, "seconds": budget_seconds}

    def static_attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {sc.OPERATION: self.operation, sc.SUBTASK_NAME: self.name}
        for key, attr in (
            ("steps", sc.BUDGET_STEPS),
            ("tokens", sc.BUDGET_TOKENS),
            ("seconds", sc.BUDGET_SECONDS),
        ):
            if self.limits[key] is not None:
                attrs[attr] = self.limits[key]
        return attrs

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        parent = current.get()
        if parent is not None:
            attrs[sc.AGENT_NAME] = parent.agent

    def open_scope(self, span: trace.Span, parent: Scope | None, arguments: dict) -> Scope:
        budget = Budget()
        if parent is None:  # a subtask outside any agent still counts its own steps
            return Scope(ActiveRun(uuid.uuid4().hex), "", (budget,))
        return Scope(parent.run, parent.agent, (*parent.budgets, budget))

    def on_end(self, handle: Handle) -> None:
        _budget_used(handle, self.limits)
