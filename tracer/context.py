"""Per-run state carried in a context variable: run id, step counter, budgets, current agent.

A context variable (not a thread-local) so asyncio tasks inherit it, and `tracegym.wrap` /
`tracegym.ContextThreadPoolExecutor` carry it into threads. The objects inside are shared by
reference, so a step taken on a worker thread still advances the run's one counter.
"""

from __future__ import annotations

import itertools
import time
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(eq=False)
class Budget:
    """Usage of one run or subtask: steps taken and tokens spent inside it."""

    steps: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class ActiveRun:
    """One agent run: the outermost agent call and everything under it."""

    run_id: str
    budget: Budget = field(default_factory=Budget)
    counter: itertools.count = field(default_factory=itertools.count)


@dataclass(frozen=True, eq=False)
class Scope:
    """What spans started here belong to: the run, the innermost agent, open subtasks."""

    run: ActiveRun
    agent: str
    budgets: tuple[Budget, ...]  # the run's budget first, then each open subtask's


current: ContextVar[Scope | None] = ContextVar("tracegym_scope", default=None)


def next_step(scope: Scope) -> int:
    """Claim the next step index of the run and charge a step to every open budget."""
    for budget in scope.budgets:
        budget.steps += 1
    return next(scope.run.counter)


def charge_tokens(tokens: int) -> None:
    """Charge LLM tokens to the current run and every open subtask."""
    scope = current.get()
    if scope is not None:
        for budget in scope.budgets:
            budget.tokens += tokens


def current_run_id() -> str | None:
    """The id of the run the caller is inside, or None outside any agent run."""
    scope = current.get()
    return scope.run.run_id if scope is not None else None
