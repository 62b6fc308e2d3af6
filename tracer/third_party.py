"""Spans of other instrumentations (OpenInference, OpenLLMetry, any OpenTelemetry library) in
tracegym's pipelines: the run/step bookkeeping and the content policy tracegym's own spans get.

`tracegym.instrument` installs such instrumentors on tracegym's provider, and an application may
add its own; either way their spans pass through tracegym's one processor
(`processors.FanOutSpanProcessor`), which hands each one here:

- at its start (on the agent's thread, inside the caller's context), a span nested in a
  tracegym run claims the run's next step index and is given the agent it runs in
  (`tracegym.step.index`, `gen_ai.agent.name`), as a child span of tracegym's own would; an agent
  span of the other instrumentation (an OpenAI Agents SDK agent) names the agent its children
  run in;
- at its end, an LLM span's token usage is charged to the run's and subtasks' budgets and an LLM
  or tool span counts as a step of them (framework plumbing, chains and graph nodes, does not);
  then the content policy: with content capture off (`capture_content=False`) inputs, outputs,
  tool arguments, retrieved text and messages are dropped; with message capture off
  (`capture_messages=False`) the messages of LLM spans (and messages other spans carry) are;
  strings longer than `max_value_length` are cut as tracegym cuts its own.

Secret redaction needs nothing here: it runs on every span of tracegym's pipelines on the export
thread. Spans outside any run stay traces of their own, without a run id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, Span
from opentelemetry.trace import Status
from tracegym.tracer import context as scope_context
from tracegym.tracer import internal
from tracegym.tracer import semconv as sc
from tracegym.tracer.attribute_mapping import operation_of, token_counts  # as the receiver maps
from tracegym.tracer.context import Scope
from tracegym.tracer.operations import state
from tracegym.tracer.serialize import truncate

OWN_SCOPE = sc.INSTRUMENTATION_SCOPE
_OPEN_LIMIT = 100_000  # spans started and not ended yet that we remember (a leak's bound)

# Which keys hold content, by policy. Input/output values are messages on LLM spans and plain
# content elsewhere.
_IO_KEYS = frozenset(
    {"input.value", "output.value", "traceloop.entity.input", "traceloop.entity.output"}
)
_MESSAGE_KEYS = frozenset(
    {sc.INPUT_MESSAGES, sc.OUTPUT_MESSAGES, sc.SYSTEM_INSTRUCTIONS, "llm.prompts"}
)
_MESSAGE_PREFIXES = (
    "llm.input_messages.",
    "llm.output_messages.",
    "llm.prompts.",
    "llm.prompt_template.variables",
    "gen_ai.prompt.",
    "gen_ai.completion.",
)
_CONTENT_KEYS = frozenset(
    {*sc.CONTENT_ATTRIBUTES, "tool_call.function.arguments", "reranker.query", "session.input"}
)
# Under these, the text of each document or embedding (their ids and scores stay).
_CONTENT_PREFIXES = (
    "retrieval.documents.",
    "reranker.input_documents.",
    "reranker.output_documents.",
    "embedding.embeddings.",
)
_CONTENT_SUFFIXES = (".content", ".text")
_MESSAGE_EVENTS = frozenset(
    {"gen_ai.content.prompt", "gen_ai.content.completion", "gen_ai.choice",
     "gen_ai.client.inference.operation.details"}
)  # fmt: skip
# Operations that count as a step of the run's budgets (what tracegym's own llm/tool/memory do).
_ACTIONS = frozenset(
    {sc.OP_CHAT, sc.OP_TOOL, sc.OP_MEMORY_SEARCH, sc.OP_MEMORY_UPDATE, sc.OP_MEMORY_DELETE}
)


def is_foreign(span: ReadableSpan) -> bool:
    """True for spans that another instrumentation (not tracegym's tracer) made."""
    scope = span.instrumentation_scope
    return scope is None or scope.name != OWN_SCOPE


def attributes_of(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes; the SDK's own dict when reachable (several times cheaper to walk
    than the locked `BoundedAttributes` behind `span.attributes`, and this runs per span on
    the agent's thread)."""
    inner = getattr(getattr(span, "_attributes", None), "_dict", None)
    return inner if isinstance(inner, dict) else (span.attributes or {})


_SDK_ATTRIBUTES = attrgetter("_attributes._dict")


def attribute_maps(spans: Sequence[ReadableSpan]) -> list[dict[str, Any]]:
    """Each span's attributes as a dict: the SDK's own dicts, gathered in C, for a batch of the
    SDK's ended spans (the export thread's per-span cost); copies, span by span, when one of
    them is not (a copy from `replace_span`, another library's `ReadableSpan`)."""
    try:
        maps: list[Any] = list(map(_SDK_ATTRIBUTES, spans))
    except AttributeError:
        maps = []
    if len(maps) == len(spans) and all(map(dict.__instancecheck__, maps)):
        return maps
    return [dict(attributes_of(span)) for span in spans]


class _Open:
    """What a started span of another instrumentation needs at its end."""

    __slots__ = ("agent", "counted", "in_llm", "scope")

    def __init__(self, scope: Scope, agent: str, in_llm: bool, counted: bool) -> None:
        self.scope = scope
        self.agent = agent  # the agent this span's children run in
        self.in_llm = in_llm  # an LLM span or inside one
        # False inside another LLM span (the OpenAI Agents SDK's generation around the OpenAI
        # client's call): both report the same tokens, the outermost one counts.
        self.counted = counted


class ForeignSpans:
    """The bookkeeping and policy for one tracegym processor (see the module docstring).

    Its table of open spans is touched with single dict operations (atomic under the GIL), so
    spans of many threads need no lock here."""

    def __init__(self) -> None:
        self._open: dict[int, _Open] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        scope = scope_context.current.get()
        parent = span.parent
        if scope is None or parent is None:
            return
        attributes = attributes_of(span)
        operation = operation_of(attributes)
        outer = self._open.get(parent.span_id)
        agent = outer.agent if outer is not None else scope.agent
        # Inside an LLM span: another instrumentation's, or a `tg.llm` around the client call
        # (which charged the response's usage itself).
        inside = outer.in_llm if outer is not None else _in_own_llm_span(parent_context)
        own_agent = None
        if operation == sc.OP_AGENT:
            own_agent = attributes.get("agent.name") or attributes.get(sc.AGENT_NAME) or span.name
            span.set_attribute(sc.STEP_INDEX, next(scope.run.counter))
        else:
            span.set_attributes({sc.STEP_INDEX: next(scope.run.counter), sc.AGENT_NAME: agent})
        children_agent = str(own_agent) if own_agent else agent
        entry = _Open(scope, children_agent, operation == sc.OP_CHAT or inside, not inside)
        if len(self._open) >= _OPEN_LIMIT:  # spans that never ended: forget the oldest
            try:
                self._open.pop(next(iter(self._open)), None)
                internal.add("foreign_spans_forgotten")
            except (StopIteration, RuntimeError):  # emptied or resized by another thread
                pass
        self._open[span.context.span_id] = entry

    def on_end(self, span: ReadableSpan) -> ReadableSpan:
        """`span`, or a copy with the content policy applied."""
        entry = self._open.pop(span.context.span_id, None)
        attributes = attributes_of(span)
        operation = operation_of(attributes)
        if entry is not None and operation in _ACTIONS:
            self._charge(entry, operation, attributes)
        return apply_policy(span, operation, attributes)

    @staticmethod
    def _charge(entry: _Open, operation: str, attributes: Mapping[str, Any]) -> None:
        budgets = entry.scope.budgets
        for budget in budgets:
            budget.steps += 1
        if operation != sc.OP_CHAT or not entry.counted:
            return
        tokens = 0
        for count in token_counts(attributes):
            if type(count) is int and count > 0:
                tokens += count
        for budget in budgets:
            budget.tokens += tokens


def _in_own_llm_span(parent_context: Context | None) -> bool:
    parent = trace.get_current_span(parent_context)
    if not isinstance(parent, ReadableSpan) or is_foreign(parent):
        return False
    return attributes_of(parent).get(sc.OPERATION) == sc.OP_CHAT


# What the policy may drop, by key: kept, an input/output value, messages, content.
_KEEP, _IO, _MESSAGES, _CONTENT = 0, 1, 2, 3
_categories: dict[str, int] = {}


def _category(key: str) -> int:
    if key in _IO_KEYS:
        return _IO
    if key in _MESSAGE_KEYS or key.startswith(_MESSAGE_PREFIXES):
        return _MESSAGES
    if key in _CONTENT_KEYS or (
        key.startswith(_CONTENT_PREFIXES) and key.endswith(_CONTENT_SUFFIXES)
    ):
        return _CONTENT
    return _KEEP


def _drops_event(name: str) -> bool:
    return name in _MESSAGE_EVENTS or (name.startswith("gen_ai.") and name.endswith(".message"))


def apply_policy(
    span: ReadableSpan, operation: str | None, attributes: Mapping[str, Any] | None = None
) -> ReadableSpan:
    """`span` itself when the policy changes nothing, else a copy without what it drops."""
    settings = state.settings
    kept = filter_span(
        span,
        operation,
        attributes,
        content=settings.capture_content,
        messages=settings.capture_messages,
        limit=settings.max_value_length,
    )
    if kept is not span:
        internal.add("foreign_spans_filtered")
    return kept


def filter_span(
    span: ReadableSpan,
    operation: str | None,
    attributes: Mapping[str, Any] | None = None,
    *,
    content: bool,
    messages: bool,
    limit: int | None,
) -> ReadableSpan:
    """`span` less its content (`content=False`) or messages (`messages=False`: the messages
    of LLM spans, their input/output values, message events), strings cut at `limit` (None:
    not cut); `span` itself when that changes nothing. The content policy, and what the OTLP
    pipeline leaves out of tracegym's own spans too when messages stay local (`setup.py`)."""
    messages = content and messages
    if attributes is None:
        attributes = attributes_of(span)
    # Whether each category is dropped here.
    drop_io = not (messages if operation == sc.OP_CHAT else content)
    dropped = (False, drop_io, not messages, not content)
    changed: dict[str, Any] | None = None
    categories = _categories
    for key, value in attributes.items():
        category = categories.get(key)
        if category is None:
            category = _category(key)
            if len(categories) < 8192:
                categories[key] = category
        if dropped[category]:
            if changed is None:
                changed = dict(attributes)
            del changed[key]
        elif limit is not None and type(value) is str and len(value) > limit:
            if changed is None:
                changed = dict(attributes)
            changed[key] = truncate(value, limit)
    events = None
    if not messages and span.events:
        kept = [e for e in span.events if not _drops_event(e.name)]
        if len(kept) != len(span.events):
            events = kept
    if changed is None and events is None:
        return span
    return replace_span(span, attributes=changed, events=events)


def replace_span(
    span: ReadableSpan,
    *,
    attributes: Mapping[str, Any] | None = None,
    events: list[Event] | None = None,
    status: Status | None = None,
) -> ReadableSpan:
    """A copy of the ended `span` with other attributes, events or status (spans are
    immutable)."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes if attributes is not None else span.attributes,
        events=events if events is not None else span.events,
        links=span.links,
        kind=span.kind,
        status=status if status is not None else span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
