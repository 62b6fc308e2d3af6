"""The public constructors: each is a decorator (bare or with options) and a context manager.

@tg.tool                                 # bare
@tg.tool(name="lookup", capture=False)   # with options
with tg.tool("lookup", arguments={"q": q}) as call: call.set_result(...)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from tracegym.tracer import context as scope_context
from tracegym.tracer import semconv as sc
from tracegym.tracer.kinds import (
    LLM,
    Agent,
    MemoryDelete,
    MemoryRead,
    MemoryWrite,
    Step,
    Subtask,
    Tool,
)
from tracegym.tracer.openinference import SPAN_KINDS, wants_kinds
from tracegym.tracer.operations import Operation, _caught, _record_usage, state
from tracegym.tracer.serialize import to_json

F = TypeVar("F", bound=Callable[..., Any])
Op = TypeVar("Op", bound=Operation)


def _build(cls: type[Op], first: Any, name: str | None, options: dict[str, Any]) -> Any:
    if isinstance(first, (staticmethod, classmethod)) or (
        callable(first) and not isinstance(first, str)
    ):  # used bare: @tg.tool
        return cls(name, **options)(first)
    return cls(first if first is not None else name, **options)


@overload
def agent(fn: F, /) -> F: ...
@overload
def agent(name: str | None = None, /, **options: Any) -> Agent: ...
def agent(first: Any = None, /, name: str | None = None, **options: Any) -> Any:
    """An `invoke_agent` span. The outermost one starts a run (a trace of its own).

    Options: agent_id, conversation_id, run_id (a string, or a callable given the call's
    arguments by name), capture; the `with` form also takes input=.
    """
    return _build(Agent, first, name, options)


@overload
def tool(fn: F, /) -> F: ...
@overload
def tool(name: str | None = None, /, **options: Any) -> Tool: ...
def tool(first: Any = None, /, name: str | None = None, **options: Any) -> Any:
    """An `execute_tool` span. Options: call_id, capture; the `with` form takes arguments=."""
    return _build(Tool, first, name, options)


@overload
def llm(fn: F, /) -> F: ...
@overload
def llm(name: str | None = None, /, **options: Any) -> LLM: ...
def llm(first: Any = None, /, name: str | None = None, **options: Any) -> Any:
    """A `chat {model}` span. Options: model, provider, usage (result -> (input, output)
    tokens; OpenAI/Anthropic shapes are read by default), capture_messages, capture,
    system_instructions, tool_definitions; the `with` form takes messages=."""
    return _build(LLM, first, name, options)


def memory_write(first: Any = None, /, store: str | None = None, **options: Any) -> Any:
    """An `update_memory` span: record id and content hash. Options: id_from, content_from
    (parameter names); the `with` form takes record_id= and content=."""
    return _build(MemoryWrite, first, store, options)


def memory_read(first: Any = None, /, store: str | None = None, **options: Any) -> Any:
    """A `search_memory` span: query, and ids and hashes of the records returned. Options:
    query_from, records (result -> iterable of (id, content)); the `with` form takes query=."""
    return _build(MemoryRead, first, store, options)


def memory_delete(first: Any = None, /, store: str | None = None, **options: Any) -> Any:
    """A `delete_memory` span. Options: id_from; the `with` form takes record_id=."""
    return _build(MemoryDelete, first, store, options)


def step(first: Any = None, /, name: str | None = None, **options: Any) -> Any:
    """A `step` span for one turn of the agent's own loop; the `with` form takes input=."""
    return _build(Step, first, name, options)


def subtask(
    first: Any = None,
    /,
    name: str | None = None,
    *,
    budget_steps: int | None = None,
    budget_tokens: int | None = None,
    budget_seconds: float | None = None,
    **options: Any,
) -> Any:
    """A `subtask` span with an optional budget; records the steps, tokens and seconds used."""
    options.update(
        budget_steps=budget_steps, budget_tokens=budget_tokens, budget_seconds=budget_seconds
    )
    return _build(Subtask, first, name, options)


def set_usage(input_tokens: int | None = None, output_tokens: int | None = None) -> None:
    """Record token usage on the current span (inside an `llm` call) and charge the budgets."""
    _record_usage(trace.get_current_span(), input_tokens, output_tokens)


def current_span() -> trace.Span:
    """The innermost active span (OpenTelemetry's), for setting attributes of your own."""
    return trace.get_current_span()


current_run_id = scope_context.current_run_id
last_run_id = scope_context.last_run_id


def current_trace_id() -> str | None:
    """The current trace id as 32 hex digits, or None outside any recorded span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def record_outcome(
    run: str,
    *,
    success: bool | None = None,
    reward: float | None = None,
    source: str = "user",
    labels: Mapping[str, Any] | Iterable[str] | None = None,
) -> None:
    """Record how a run ended, after the fact, from any process.

    `run` is a run id (`current_run_id()`, or the one given to `agent(run_id=...)`) or a trace
    id. The outcome travels as a small span of its own through the same pipelines, so it reaches
    the spool and OTLP backends alike; the store joins it to the run. Never raises.
    """
    try:
        attrs: dict[str, Any] = {sc.OPERATION: sc.OP_OUTCOME, sc.OUTCOME_TARGET: str(run)}
        if success is not None:
            attrs[sc.OUTCOME_SUCCESS] = bool(success)
        if reward is not None:
            attrs[sc.OUTCOME_REWARD] = float(reward)
        attrs[sc.OUTCOME_SOURCE] = str(source)
        if wants_kinds(state.settings.openinference):
            attrs[sc.OI_SPAN_KIND] = SPAN_KINDS[sc.OP_OUTCOME]
        if labels is not None:
            attrs[sc.OUTCOME_LABELS] = to_json(
                labels if issubclass(type(labels), Mapping) else list(labels),
                state.settings.max_value_length,
            )
        span = state.tracer.start_span(
            sc.OUTCOME_SPAN_NAME, context=otel_context.Context(), attributes=attrs
        )
        span.end()
    except BaseException as exc:  # run, labels...: the user's values, whose __str__ may raise
        _caught("record_outcome", exc)
