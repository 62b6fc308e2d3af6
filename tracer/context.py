"""Per-run state carried in a context variable: run id, step counter, budgets, current agent,
the tool calls the last model reply asked for.

A context variable (not a thread-local) so asyncio tasks inherit it, and `tracegym.wrap` /
`tracegym.ContextThreadPoolExecutor` carry it into threads. The objects inside are shared by
reference, so a step taken on a worker thread still advances the run's one counter.

`last_run_id()` is a context variable of its own, set when an outermost agent call ends: in the
caller's context, so each thread and each asyncio task sees the run it finished last (a task
started with `asyncio.create_task` works on a copy, and its run is its own).
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


@dataclass(frozen=True)
class PendingCall:
    """A tool call the run's latest model reply asked for, not yet carried out."""

    name: str
    arguments: str | None  # the arguments as the tracer's JSON (`serialize.to_json`)
    call_id: str


@dataclass(eq=False)
class ActiveRun:
    """One agent run: the outermost agent call and everything under it."""

    run_id: str
    budget: Budget = field(default_factory=Budget)
    counter: itertools.count = field(default_factory=itertools.count)
    pending: list[PendingCall] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Scope:
    """What spans started here belong to: the run, the innermost agent, open subtasks."""

    run: ActiveRun
    agent: str
    budgets: tuple[Budget, ...]  # the run's budget first, then each open subtask's


current: ContextVar[Scope | None] = ContextVar("tracegym_scope", default=None)
last_run: ContextVar[str | None] = ContextVar("tracegym_last_run", default=None)


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


def last_run_id() -> str | None:
    """The id of the last run an outermost `@tg.agent` call finished in this thread or asyncio
    task (returned or raised), or None before any: for a verifier that runs after the agent
    returns, `tg.record_outcome(tg.last_run_id(), success=...)`."""
    return last_run.get()


def expect_calls(calls: list[PendingCall]) -> None:
    """The tool calls a model reply asked for, in the current run: they replace the earlier
    reply's (calls never carried out are not waited for)."""
    scope = current.get()
    if scope is not None:
        scope.run.pending = calls


def claim_call(name: str | None, arguments: str | None) -> str | None:
    """The model's call id for a tool call about to run, when the latest reply asked for it:
    the first pending call of that name with the same arguments (their JSON); with arguments
    not captured, the only pending call of that name. None otherwise (the tool call keeps an id
    of its own)."""
    scope = current.get()
    if scope is None or not scope.run.pending:
        return None
    pending = scope.run.pending
    named = [c for c in pending if c.name == name]
    if arguments is None:
        match = named[0] if len(named) == 1 else None
    else:
        match = next((c for c in named if c.arguments == arguments), None)
    if match is None:
        return None
    try:
        pending.remove(match)
    except ValueError:  # another thread carried it out first
        return None
    return match.call_id
