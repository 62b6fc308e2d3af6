"""Budget waste: steps and tokens spent beyond what successful runs spend.

`fit` learns from the successful runs:

- per tool, the calls a run makes (runs without the tool count as 0);
- per subtask *kind* (the subtask's name before any ':' with digits masked, see
  `features.subtask_kind`), the steps and tokens one subtask spends;
- the run's *ceiling*: the most LLM calls (or tool calls, or spans, where there are none) any run
  of the population made, when at least `min_support` runs stopped exactly there and successful
  runs rarely get there (their `quantile` is below it): a cap the agent ran into.

For each, the *limit* is max(quantile (p90), `ratio` x median, 1). `detect` flags

- ``budget_waste:tool:<tool>``: more calls of a tool than its limit + `min_excess` - 1; decisive
  step: the first call over the limit;
- ``budget_waste:subtask:<kind>``: a subtask over its steps limit (+ `min_excess`) or
  `token_margin` times its tokens limit, or one whose span says its budget was exceeded
  (`tracegym.budget.exceeded`); decisive step: the first step past the budget (or the limit),
  or, when earlier, the first call inside the subtask of a tool flagged above (the first call
  successful runs do not make: where the overspend began, not where it showed);
- ``budget_waste:loop:<tool>``: `loop_min` or more identical calls (same tool, same arguments)
  in one run; decisive step: the first repeat;
- ``budget_waste:out_of_steps``: the run stopped at the ceiling; decisive step: the first action
  past the most any successful run made.

One finding per key and run. Tool and subtask limits need `fit` with at least `min_support`
successful runs (subtask kinds: instances); loops and exceeded budgets don't.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.analysis.detector_names import BUDGET_WASTE
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.features import (
    call_signature,
    is_agent_call,
    quantile,
    step_ref,
    subtask_kind,
)
from tracegym.analysis.runs import Run, Step
from tracegym.tracer import semconv as sc


@dataclass(frozen=True)
class Limit:
    median: float
    high: float  # the quantile
    limit: float
    support: int


def _limit(values: Sequence[float], q: float, ratio: float) -> Limit:
    median, high = quantile(values, 0.5), quantile(values, q)
    return Limit(median, high, max(high, ratio * median, 1.0), len(values))


def _measure(run: Run) -> tuple[str, list[Step]]:
    """What a turn cap counts: LLM calls where the run has any, else tool calls, else spans."""
    chats = [s for s in run.steps if s.operation == sc.OP_CHAT]
    if chats:
        return "llm_calls", chats
    tools = [s for s in run.steps if is_agent_call(s)]
    return ("tool_calls", tools) if tools else ("steps", list(run.steps))


def _subtask_spans(run: Run) -> dict[str, tuple[Step, list[Step]]]:
    """Subtask name -> (its span, the steps whose innermost subtask it is)."""
    spans: dict[str, tuple[Step, list[Step]]] = {}
    for step in run.steps:
        if step.operation == sc.OP_SUBTASK:
            name = step.attributes.get(sc.SUBTASK_NAME, step.name)
            spans.setdefault(name, (step, []))
    for step in run.steps:
        if step.subtask in spans:
            spans[step.subtask][1].append(step)
    return spans


def _crossing(steps: Sequence[Step], steps_limit: float | None, tokens_limit: float | None):
    """The first step at which the steps or the tokens pass their limit."""
    tokens = 0
    for count, step in enumerate(steps, 1):
        tokens += step.tokens
        if steps_limit is not None and count > steps_limit:
            return step
        if tokens_limit is not None and tokens > tokens_limit:
            return step
    return None


def _overspend(inside: Sequence[Step], crossing: Step | None, first_over: set[str]) -> Step | None:
    """Where a subtask's overspend starts: the first call inside it that successful runs do
    not make (a tool's first call over its limit), when that comes before the step where the
    budget is crossed. The crossing is where the waste shows; the extra call is where it began."""
    extra = next((s for s in inside if s.span_id in first_over), None)
    if extra is not None and (crossing is None or extra.position < crossing.position):
        return extra
    return crossing


class BudgetWaste(Detector):
    """Spending beyond what successful runs spend (see the module docstring).

    Parameters: `quantile` (0.9) and `ratio` (2.0) make the limits, `min_excess` (2) how far past
    a limit a count must go, `loop_min` (3) identical calls that make a loop, `min_support` (3)
    successful runs (or subtask instances) a limit needs, `token_margin` (1.5) how many times its
    limit a subtask's tokens must reach.
    """

    name = BUDGET_WASTE
    description = (
        "Spends steps or tokens on tools and subtasks far beyond what successful runs need, "
        "repeats identical calls, or runs out of steps before finishing"
    )

    def __init__(
        self,
        quantile: float = 0.9,
        ratio: float = 2.0,
        min_excess: int = 2,
        loop_min: int = 3,
        min_support: int = 3,
        token_margin: float = 1.5,
    ) -> None:
        self.token_margin = token_margin
        self.quantile = quantile
        self.ratio = ratio
        self.min_excess = min_excess
        self.loop_min = loop_min
        self.min_support = min_support
        self.tool_limits_: dict[str, Limit] = {}
        self.subtask_steps_: dict[str, Limit] = {}
        self.subtask_tokens_: dict[str, Limit] = {}
        self.ceiling_: tuple[str, int, int] | None = None  # (measure, ceiling, success maximum)

    def fit(self, runs: Sequence[Run]) -> BudgetWaste:
        successes = [r for r in runs if r.success is True]
        self.tool_limits_, self.subtask_steps_, self.subtask_tokens_ = {}, {}, {}
        self.ceiling_ = None
        if len(successes) < self.min_support:
            return self
        per_run = [
            Counter(s.tool or s.name for s in r.steps if is_agent_call(s)) for r in successes
        ]
        for tool in set().union(*per_run):
            counts = [c.get(tool, 0) for c in per_run]
            self.tool_limits_[tool] = _limit(counts, self.quantile, self.ratio)
        steps: dict[str, list[float]] = {}
        tokens: dict[str, list[float]] = {}
        for run in successes:
            for name, (_, inside) in _subtask_spans(run).items():
                kind = subtask_kind(name) or name
                steps.setdefault(kind, []).append(len(inside))
                tokens.setdefault(kind, []).append(sum(s.tokens for s in inside))
        for kind, values in steps.items():
            if len(values) >= self.min_support:
                self.subtask_steps_[kind] = _limit(values, self.quantile, self.ratio)
                if any(tokens[kind]):
                    self.subtask_tokens_[kind] = _limit(tokens[kind], self.quantile, self.ratio)
        measured = [_measure(r) for r in runs]
        kinds = Counter(kind for kind, _ in measured)
        kind = kinds.most_common(1)[0][0]
        counts = [len(steps) for k, steps in measured if k == kind]
        ceiling = max(counts)
        success_counts = [len(_measure(r)[1]) for r in successes if _measure(r)[0] == kind]
        if (
            counts.count(ceiling) >= self.min_support
            and success_counts
            and quantile(success_counts, self.quantile) < ceiling
        ):
            self.ceiling_ = (kind, ceiling, max(success_counts))
        return self

    def detect(self, run: Run) -> list[Finding]:
        found: dict[str, dict[str, Any]] = {}

        def add(key: str, step: Step, reason: str, message: str, evidence=(), **details) -> None:
            entry = found.get(key)
            if entry is None:
                found[key] = {"step": step, "reasons": [reason], "messages": [message],
                              "evidence": list(evidence), "details": details}  # fmt: skip
            else:
                entry["reasons"].append(reason)
                entry["messages"].append(message)
                entry["evidence"].extend(evidence)
                entry["details"].update(details)

        tools = [s for s in run.steps if is_agent_call(s)]
        # Loops of identical calls.
        calls: dict[tuple[str, str], list[Step]] = {}
        for step in tools:
            calls.setdefault(call_signature(step), []).append(step)
        for (tool, _), same in calls.items():
            if len(same) >= self.loop_min:
                add(f"{self.name}:loop:{tool}", same[1], "loop",
                    f"{tool} was called {len(same)} times with the same arguments",
                    [s.span_id for s in same[:5]], repeats=len(same))  # fmt: skip
        # Tools used far more than successful runs use them.
        by_tool: dict[str, list[Step]] = {}
        first_over: set[str] = set()  # span ids: each flagged tool's first call over its limit
        for step in tools:
            by_tool.setdefault(step.tool or step.name, []).append(step)
        for tool, steps in by_tool.items():
            limit = self.tool_limits_.get(tool)
            if limit is None and self.tool_limits_:  # a tool no successful run calls
                limit = Limit(0.0, 0.0, 1.0, 0)
            if limit is None or len(steps) < limit.limit + self.min_excess:
                continue
            over = steps[int(limit.limit)]
            first_over.add(over.span_id)
            add(f"{self.name}:tool:{tool}", over, "tool_calls",
                f"{tool} was called {len(steps)} times; successful runs call it at most "
                f"{limit.high:g} times (p{round(self.quantile * 100)}), median {limit.median:g}",
                [s.span_id for s in steps[int(limit.limit):][:5]], calls=len(steps),
                limit=limit.limit)  # fmt: skip
        # Subtasks over their budget or over what successful runs spend on them.
        for name, (span, inside) in _subtask_spans(run).items():
            kind = subtask_kind(name) or name
            key = f"{self.name}:subtask:{kind}"
            attributes = span.attributes
            if attributes.get(sc.BUDGET_EXCEEDED):
                budget_steps = attributes.get(sc.BUDGET_STEPS)
                budget_tokens = attributes.get(sc.BUDGET_TOKENS)
                at = _overspend(inside, _crossing(inside, budget_steps, budget_tokens), first_over)
                at = at or span
                add(key, at, "budget_exceeded",
                    f"subtask {name!r} exceeded its budget (steps {attributes.get(sc.USED_STEPS)}"
                    f"/{budget_steps}, tokens {attributes.get(sc.USED_TOKENS)}/{budget_tokens})",
                    [at.span_id, span.span_id], subtask=name)  # fmt: skip
            steps_limit = self.subtask_steps_.get(kind)
            tokens_limit = self.subtask_tokens_.get(kind)
            n_tokens = sum(s.tokens for s in inside)
            over_steps = steps_limit and len(inside) >= steps_limit.limit + self.min_excess
            over_tokens = tokens_limit and n_tokens > self.token_margin * tokens_limit.limit
            if over_steps or over_tokens:
                crossing = _crossing(
                    inside,
                    steps_limit.limit if over_steps and steps_limit else None,
                    self.token_margin * tokens_limit.limit
                    if over_tokens and tokens_limit
                    else None,
                )
                at = _overspend(inside, crossing, first_over) or span
                add(key, at, "subtask_spend",
                    f"subtask {name!r} took {len(inside)} steps and {n_tokens} tokens; "
                    f"successful runs' limit: {steps_limit.limit if steps_limit else '-'} steps, "
                    f"{tokens_limit.limit if tokens_limit else '-'} tokens",
                    [at.span_id, span.span_id], subtask=name, subtask_steps=len(inside),
                    subtask_tokens=n_tokens)  # fmt: skip
        # Stopped at the population's ceiling.
        if self.ceiling_ is not None:
            kind, ceiling, success_max = self.ceiling_
            measure, steps = _measure(run)
            if measure == kind and len(steps) >= ceiling:
                at = steps[min(success_max, len(steps) - 1)]
                add(f"{self.name}:out_of_steps", at, "out_of_steps",
                    f"the run stopped at {len(steps)} {measure}, the ceiling several runs hit; "
                    f"no successful run needed more than {success_max}",
                    [at.span_id, steps[-1].span_id], ceiling=ceiling)  # fmt: skip
        findings = []
        for key, entry in found.items():
            step = entry["step"]
            findings.append(Finding(
                detector=self.name, key=key, trace_id=run.trace_id, **step_ref(step),
                span_ids=tuple(dict.fromkeys([step.span_id, *entry["evidence"]])),
                message="; ".join(entry["messages"]),
                confidence=0.8 if "budget_exceeded" in entry["reasons"] else 0.6,
                details={"reasons": entry["reasons"], **entry["details"]},
            ))  # fmt: skip
        findings.sort(key=lambda f: (f.position or 0, f.key))
        return findings
