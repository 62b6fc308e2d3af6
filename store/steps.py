"""The one step numbering, and the decisive step as every surface names it.

`tracegym show`, `tracegym attribute`, the dashboard's run page and its gaps page all number a
run's steps here: a span's number is the tracer's `tracegym.step.index` (an importer's source
index) where the run records them, else its place in run order (start time, step index, span
id: the order `analysis.runs.build_runs` gives `Step.position`). `show` prints it as `#N`.

The decisive step of a failed run is the step where the agent decided wrong: for a tool call a
model call asked for, that model call (the planted causes' gold, tests/fixtures/planted.py, and
what `analysis.attribution` blames); the tool call is named as what carried it out. A finding
on the tool call (a gap's evidence) and attribution's choice of the model call so name the same
step: `describe(spans, span_id)`.

Spans are read duck-typed (the dashboard's row dicts, `show`'s and analysis' `Step`s): span_id,
parent_span_id, name, operation, step_index, start_ns, tool, call_id or the call id attribute,
output or the output messages attribute.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.tracer import semconv as sc
from tracegym.tracer.messages import chat_messages


def _get(span: Any, key: str) -> Any:
    return span.get(key) if isinstance(span, Mapping) else getattr(span, key, None)


def _attributes(span: Any) -> Mapping[str, Any]:
    value = _get(span, "attributes")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, Mapping) else {}


def _call_id(span: Any) -> str | None:
    value = _get(span, "call_id") or _attributes(span).get(sc.TOOL_CALL_ID)
    return str(value) if value else None


def _requested(span: Any) -> list[tuple[str | None, str | None]]:
    """(call id, tool name) of each tool call a model call's reply asked for."""
    raw = _attributes(span).get(sc.OUTPUT_MESSAGES) or _get(span, "output")
    calls = []
    for message in chat_messages(raw, "assistant") if isinstance(raw, str) else ():
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping):
                function = call.get("function") or {}
                name = function.get("name") if isinstance(function, Mapping) else None
                calls.append((str(call["id"]) if call.get("id") else None, name))
    return calls


def run_order(spans: Sequence[Any]) -> list[Any]:
    """The spans in run order: start time, then step index (none first), then span id."""
    return sorted(
        spans,
        key=lambda s: (
            _get(s, "start_ns") or 0,
            -1 if _get(s, "step_index") is None else _get(s, "step_index"),
            _get(s, "span_id") or "",
        ),
    )


def step_numbers(spans: Sequence[Any]) -> dict[str, int]:
    """span id -> its step number: the step index where the run records them (spans without
    one, such as agent spans, get none), else the place in run order from 0."""
    indexed = {
        _get(s, "span_id"): int(_get(s, "step_index"))
        for s in spans
        if _get(s, "step_index") is not None
    }
    if indexed:
        return indexed
    return {_get(s, "span_id"): i for i, s in enumerate(run_order(spans))}


def decisions(spans: Sequence[Any]) -> dict[str, str]:
    """tool call span id -> the model call whose reply asked for it: by call id, else the
    latest model call before it when that one asked for a call of this tool. One pass in run
    order (each reply read once)."""
    by_call: dict[str, str] = {}
    last: tuple[str, set[str]] | None = None  # the latest model call and the tools it asked for
    out: dict[str, str] = {}
    for span in run_order(spans):
        operation, span_id = _get(span, "operation"), _get(span, "span_id")
        if operation == sc.OP_CHAT:
            calls = _requested(span)
            by_call.update({cid: span_id for cid, _ in calls if cid})
            last = (span_id, {n for _, n in calls if n})
        elif operation == sc.OP_TOOL:
            call_id, tool = _call_id(span), _get(span, "tool")
            if call_id and call_id in by_call:
                out[span_id] = by_call[call_id]
            elif last is not None and tool and tool in last[1]:
                out[span_id] = last[0]
    return out


def decision_of(spans: Sequence[Any], span_id: str) -> str:
    """The span of the step that decided `span_id`: for a tool call a model call asked for,
    that model call (`decisions`); any other span is its own decision."""
    return decisions(spans).get(span_id, span_id)


@dataclass(frozen=True)
class StepName:
    """One step as the surfaces print it: `#N name` (the name alone where it has no number)."""

    span_id: str
    number: int | None
    name: str

    def __str__(self) -> str:
        return f"#{self.number} {self.name}" if self.number is not None else self.name


@dataclass(frozen=True)
class DecisiveStep:
    """The decisive step (the decision) and the tool calls that carried it out."""

    step: StepName
    acted: tuple[StepName, ...] = ()

    @property
    def span_id(self) -> str:
        return self.step.span_id

    @property
    def number(self) -> int | None:
        return self.step.number

    def __str__(self) -> str:
        if not self.acted:
            return str(self.step)
        return f"{self.step} (carried out by {', '.join(map(str, self.acted))})"


def describe(spans: Sequence[Any], span_id: str) -> DecisiveStep | None:
    """The decisive step a span names (a tool call names the model call that asked for it),
    numbered as `show` numbers it; None when the span is not in the run."""
    by_id = {_get(s, "span_id"): s for s in spans}
    if span_id not in by_id:
        return None
    numbers = step_numbers(spans)

    def name(sid: str) -> StepName:
        return StepName(sid, numbers.get(sid), str(_get(by_id[sid], "name") or "(no name)"))

    decided = decisions(spans)
    decision = decided.get(span_id, span_id)
    if decision != span_id:  # a tool call: the model call decided, this call carried it out
        return DecisiveStep(name(decision), (name(span_id),))
    acted = tuple(
        name(_get(s, "span_id"))
        for s in run_order(spans)
        if decided.get(_get(s, "span_id")) == span_id
    )
    return DecisiveStep(name(span_id), acted)
