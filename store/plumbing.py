"""Framework plumbing in a run's story: the spans `tracegym show` folds unless `--full`.

Frameworks record their own machinery as spans: a LangGraph run with two LLM calls is a dozen
graph, node, RunnableSequence and prompt-template spans around them, and an OpenAI Agents SDK
run nests an `Agent workflow` span in another of the same name and a `turn` around each model
call. What the agent did (its agents, LLM calls, tool calls, memory) is in the other spans.

A span is plumbing when another instrumentation recorded it (not tracegym's own `tg.step`s),
it is a chain, prompt or step of that framework (OpenInference's CHAIN or PROMPT kind, or no
kind), and it did not fail (a failing node stays in view). Folding one hangs its children on
its nearest kept ancestor, so the tree keeps its shape minus the wrappers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from tracegym.tracer import semconv as sc

T = TypeVar("T")

OWN_SCOPE = sc.INSTRUMENTATION_SCOPE
PLUMBING_KINDS = ("CHAIN", "PROMPT")

# Parameterised: the trace id is the only value, and it travels as one.
PLUMBING_SQL = f"""
    SELECT span_id FROM spans
    WHERE trace_id = $t AND scope IS DISTINCT FROM '{OWN_SCOPE}'
      AND coalesce(status, '') <> 'ERROR' AND error_type IS NULL
      AND operation = '{sc.OP_STEP}'
      AND coalesce(json_extract_string(attributes, '$."{sc.OI_SPAN_KIND}"'), 'CHAIN')
          IN {PLUMBING_KINDS}
"""


def plumbing_spans(store: Any, trace_id: str) -> frozenset[str]:
    """The span ids of the run's framework plumbing (see the module docstring)."""
    return frozenset(row[0] for row in store.sql(PLUMBING_SQL, {"t": trace_id}).fetchall())


def fold(steps: Sequence[T], hidden: Collection[str]) -> list[T]:
    """`steps` (dataclasses with `span_id`, `parent_span_id`) less those in `hidden`, each
    kept one re-parented onto its nearest ancestor that is kept."""
    parent_of = {s.span_id: s.parent_span_id for s in steps}  # type: ignore[attr-defined]
    kept: list[T] = []
    for step in steps:
        if step.span_id in hidden:  # type: ignore[attr-defined]
            continue
        parent = step.parent_span_id  # type: ignore[attr-defined]
        seen: set[str] = set()
        while parent in hidden and parent not in seen:  # `seen`: a cycle cannot loop forever
            seen.add(parent)
            parent = parent_of.get(parent)
        if parent != step.parent_span_id:  # type: ignore[attr-defined]
            step = dataclasses.replace(step, parent_span_id=parent)  # type: ignore[type-var]
        kept.append(step)
    return kept
