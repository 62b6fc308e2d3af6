"""`Goal`: what an environment's verifier checks at the end of an episode (`Environment.verify`).

Every part is optional and empty by default: an empty goal checks only that the episode
answered within its step budget and reached the oracle's final state. Families fill the parts
their capability needs; a call pattern is `{"name": tool, "arguments": {...}}` (exact argument
values; `arguments` may be left out of a forbidden call to forbid every call of the tool).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

Call = dict[str, Any]  # {"name": tool, "arguments": {...}}


@dataclass
class Goal:
    """The parts of a task's goal (see the module docstring)."""

    required_calls: list[Call] = field(default_factory=list)  # must have run (exact arguments)
    forbidden_calls: list[Call] = field(default_factory=list)  # must not have run
    forbidden_attempts: list[Call] = field(default_factory=list)  # not even tried (errors too)
    opening: list[str] = field(default_factory=list)  # the first successful calls, in order
    order: list[tuple[Call | str, Call | str]] = field(default_factory=list)  # before, after
    verify_after: list[tuple[Call, Call]] = field(default_factory=list)  # check after write
    grounded: bool = False  # every id-like argument value was seen before it was used
    max_invalid: int | None = None  # at most this many invalid invocations
    memory_includes: dict[str, str] = field(default_factory=dict)  # note key -> text it holds
    memory_excludes: list[str] = field(default_factory=list)  # text no note may hold
    answer_includes: list[str] = field(default_factory=list)  # the answer holds each
    answer_excludes: list[str] = field(default_factory=list)  # the answer holds none
    amounts: dict[str, float] = field(default_factory=dict)  # record -> the amount to pass
    state_hash: str | None = None  # the expected final state's digest (default: the oracle's)

    def to_dict(self) -> dict[str, Any]:
        """The parts that are set, as plain JSON (what task exports and tests read)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value or (f.name == "max_invalid" and value is not None):
                out[f.name] = [list(v) for v in value] if f.name in _PAIRS else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Goal:
        """A goal from its parts; TypeError naming any part that is not one (a typo would
        otherwise check nothing)."""
        if isinstance(data, Goal):
            return data
        unknown = set(data) - _NAMES
        if unknown:
            raise TypeError(
                f"unknown goal part(s): {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(_NAMES))})"
            )
        parts = dict(data)
        for name in _PAIRS:
            if name in parts:
                parts[name] = [tuple(pair) for pair in parts[name]]
        return cls(**parts)


_NAMES = frozenset(f.name for f in fields(Goal))
_PAIRS = ("order", "verify_after")

__all__ = ["Call", "Goal"]
