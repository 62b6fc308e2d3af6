"""What a run had read when it acted: read-tool results as flat fields, and which one a write
acts on.

Shared by the precondition detectors (`forbidden_action`, `missed_action`) and the list-argument
detector. Nothing about any domain is known here:

- a *read* is a tool call whose name says it has no side effects (`tool_kinds.is_read_tool`)
  and whose result parses as JSON; a *write* is any other tool call that is not the agent's
  answer channel (`tool_kinds.is_answer_tool`) nor made by the user (tau2-bench's user-side
  tools: `tracegym.tool.requested_by` = user);
- a read's *fields* are its result flattened to paths ("status", "items[].status",
  "address.city"): each path with the scalar values found there: numbers, ISO dates (as day
  numbers, for thresholds) and short texts, booleans and nulls (states);
- the reads a write *acts on* are the earlier reads whose arguments share an identifier-like
  value with the write's arguments (get_order(order_id=X) ... cancel(order_id=X)), the latest
  of each record; failing any, the latest whose result holds one (a user record listing X).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import date
from typing import Any

from tracegym.analysis.arithmetic import parse_number
from tracegym.analysis.detectors.ungrounded import argument_values, token_set_of
from tracegym.analysis.features import is_agent_call, is_tool
from tracegym.analysis.run_memory import PerRunMemory
from tracegym.analysis.runs import Run, Step, flatten, parse_json
from tracegym.analysis.tool_kinds import is_answer_tool, is_read_tool

MAX_DEPTH = 8
MAX_ENUM_TEXT = 40  # longer strings are prose, not a state value


def is_write(step: Step) -> bool:
    """A tool call of the agent's that changes something (not a read, not the answer to the
    user, not a call the user made on their own device)."""
    name = step.tool or step.name
    return is_agent_call(step) and not is_read_tool(name) and not is_answer_tool(name)


_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?\S*)?")
DAY_OFFSET = 1e6  # dates are numbers too: days since 0001-01-01, plus this (no count is so big)


def date_value(value: Any) -> float | None:
    """An ISO date or date-time string as a number of days (fractional for times), offset by
    `DAY_OFFSET` so that it is never mistaken for an amount; None for anything else."""
    if not isinstance(value, str) or not (match := _ISO_DATE.fullmatch(value.strip())):
        return None
    year, month, day, hour, minute, second = match.groups()
    try:
        days = date(int(year), int(month), int(day)).toordinal()
    except ValueError:
        return None
    seconds = int(hour or 0) * 3600 + int(minute or 0) * 60 + int(second or 0)
    return DAY_OFFSET + days + seconds / 86400


def show_number(number: float) -> str:
    """A number as text; a date (see `date_value`) as its ISO date."""
    if number >= DAY_OFFSET + 1:
        return date.fromordinal(int(number - DAY_OFFSET)).isoformat()
    return f"{number:g}"


def enum_value(value: Any) -> str | None:
    """A scalar as a state value ("true", "pending"), or None for prose and numbers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str) and len(value) <= MAX_ENUM_TEXT and parse_number(value) is None:
        return " ".join(value.casefold().split())
    return None


@dataclass(frozen=True)
class Read:
    """One read-tool result as fields."""

    step: Step
    tool: str
    key: str  # the tool and its canonical arguments: the same record read twice has one key
    observed: str  # the key and the result: the same record in the same state, in any run
    arg_tokens: frozenset[str]  # identifier-like tokens of the read's arguments
    result_tokens: frozenset[str]
    enums: dict[str, frozenset[str]]  # path -> state values found there
    numbers: dict[str, tuple[float, ...]]  # path -> numbers found there
    parsed: Any


def read_of(step: Step) -> Read | None:
    """The step as a `Read`, when it is a read call that returned a JSON object or list."""
    if not is_tool(step) or not is_read_tool(step.tool or step.name) or step.failed:
        return None
    parsed = parse_json(step.output)
    if not isinstance(parsed, (dict, list)):
        return None
    enums: dict[str, set[str]] = {}
    numbers: dict[str, list[float]] = {}
    for path, value in flatten(parsed):
        number = None if isinstance(value, bool) else parse_number(value)
        day = date_value(value)
        if number is not None and not isinstance(value, str):
            numbers.setdefault(path, []).append(number)
        elif day is not None:
            numbers.setdefault(path, []).append(day)
        elif (text := enum_value(value)) is not None:
            enums.setdefault(path, set()).add(text)
    arguments = parse_json(step.input)
    key = f"{step.tool or step.name}:{json.dumps(arguments, sort_keys=True, default=str)}"
    digest = hashlib.sha256(json.dumps(parsed, sort_keys=True, default=str).encode()).hexdigest()
    return Read(
        step=step,
        tool=step.tool or step.name,
        key=key,
        observed=f"{key}:{digest[:16]}",
        arg_tokens=frozenset(t for v in argument_values(step) for t in v.significant),
        result_tokens=token_set_of(step.output or ""),
        enums={p: frozenset(v) for p, v in enums.items()},
        numbers={p: tuple(v) for p, v in numbers.items()},
        parsed=parsed,
    )


def _reads(run: Run) -> list[Read]:
    return [r for r in (read_of(s) for s in run.steps) if r is not None]


_READS = PerRunMemory(_reads)
# Within it, `reads` works each run's reads out once (several detectors ask for them when one
# run is detected on). The runs must not change inside it.
remembering_reads = _READS.scope


def reads(run: Run) -> list[Read]:
    """The run's reads, in run order (a new list; the reads themselves may be remembered)."""
    return list(_READS.get(run))


def write_tokens(step: Step) -> frozenset[str]:
    """The identifier-like tokens of a write's arguments (what links it to a record)."""
    return frozenset(t for v in argument_values(step) for t in v.significant)


def acted_on(write: Step, earlier: list[Read]) -> list[Read]:
    """The reads `write` acts on (see the module docstring), among reads before it: the latest
    read of each record whose arguments share an identifier with the write's (a write on a
    customer's line acts on both the customer and the line); failing any, the latest read whose
    result holds one."""
    tokens = write_tokens(write)
    if not tokens:
        return []
    before = [r for r in earlier if r.step.position < write.position]
    linked: dict[str, Read] = {}
    for read in before:
        if read.arg_tokens & tokens:
            linked[read.key] = read
    if linked:
        return sorted(linked.values(), key=lambda r: r.step.position)
    holding = [r for r in before if r.result_tokens & tokens]
    return holding[-1:]


@dataclass(frozen=True)
class ActedRun:
    """A run's reads, one per record (the one the first write on it acted on: the state it was
    acted in, not the state after; for a record no write acted on, its latest read), and its
    writes, each with the reads it acts on."""

    records: list[Read]
    writes: list[tuple[Step, list[Read]]]
    acted: dict[str, frozenset[str]]  # read key -> the write tools that acted on that record


def acted_run(run: Run, *, failed_writes: bool = True) -> ActedRun:
    """Reads and writes of `run` paired (see `ActedRun`); `failed_writes=False` leaves out
    write calls that failed (a policy error is no evidence of what the policy allows)."""
    all_reads = reads(run)
    writes = []
    acted: dict[str, set[str]] = {}
    for step in run.steps:
        if not is_write(step) or (step.failed and not failed_writes):
            continue
        linked = acted_on(step, all_reads)
        writes.append((step, linked))
        for read in linked:
            acted.setdefault(read.key, set()).add(step.tool or step.name)
    shown = {r.key: r for r in all_reads}  # the latest read of each record ...
    for _, linked in reversed(writes):  # ... or the one the first write on it acted on
        shown.update({r.key: r for r in linked})
    return ActedRun(
        records=sorted(shown.values(), key=lambda r: r.step.position),
        writes=writes,
        acted={k: frozenset(v) for k, v in acted.items()},
    )


__all__ = [
    "ActedRun",
    "Read",
    "acted_on",
    "acted_run",
    "enum_value",
    "flatten",
    "is_write",
    "read_of",
    "reads",
]
