"""Invalid invocations: tool calls that fail, call tools that don't exist, or break the schema.

`fit` learns, from the population:

- the *known tools*: those with at least one call that did not fail (anywhere);
- a *schema* per tool, inferred from its calls that did not fail in successful runs (from its
  calls that did not fail in any run where no successful run calls it), once there are at least
  `min_support` of them: the argument names seen (allowed), the names present in every call
  (required), and the JSON types each argument takes (an integer passes where numbers were seen).

`detect` flags, per run,

- ``invalid_invocation:<tool>``: a failed call (`details["reasons"]` has "error" and the
  `error.type`) that the run did not recover from (with `ignore_recovered`, the default, an
  error followed later by a call of the same tool that did not fail is left out: agents that
  retry with better arguments succeed as often as not), or a call of a tool that never
  succeeded anywhere in the population ("unknown_tool"; needs `fit`);
- ``invalid_invocation:<tool>.<arg>``: an argument the schema does not know ("unknown_argument"),
  a required one missing ("missing_argument") or one of another type ("wrong_type").

An error whose text names a tool to call first that the run had not called (`tool_order.
named_prerequisites`: "call get_booking first") is left to `WrongToolOrder`: the error is the
symptom, the missing step the cause.

The decisive step is the first such call; later ones with the same key follow in `span_ids`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.analysis.detector_names import INVALID_INVOCATION
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.detectors.tool_order import error_text, named_prerequisites
from tracegym.analysis.features import is_agent_call, step_ref
from tracegym.analysis.runs import Run, Step, json_type, parse_json


@dataclass(frozen=True)
class Schema:
    """What successful calls of a tool look like."""

    calls: int
    allowed: frozenset[str]
    required: frozenset[str]
    types: dict[str, frozenset[str]]
    object_arguments: bool  # arguments are a JSON object

    def accepts(self, arg: str, value: Any) -> bool:
        seen = self.types.get(arg, frozenset())
        kind = json_type(value)
        return kind in seen or (kind == "integer" and "number" in seen) or kind == "null"


def infer_schema(calls: Sequence[Step]) -> Schema:
    """The schema of a tool from calls that worked."""
    present: Counter[str] = Counter()
    types: dict[str, set[str]] = defaultdict(set)
    objects = 0
    for call in calls:
        arguments = parse_json(call.input)
        if not isinstance(arguments, dict):
            continue
        objects += 1
        for name, value in arguments.items():
            present[name] += 1
            types[name].add(json_type(value))
    return Schema(
        calls=len(calls),
        allowed=frozenset(present),
        required=frozenset(n for n, c in present.items() if c == objects and objects),
        types={n: frozenset(t) for n, t in types.items()},
        object_arguments=objects == len(calls) and objects > 0,
    )


class InvalidInvocation(Detector):
    """Failed tool calls, unknown tools and schema violations (see the module docstring).

    Parameters: `min_support` (3) successful calls a tool's schema needs; `errors` (True),
    `unknown_tools` (True), `schema` (True) switch the three checks; `ignore_recovered` (True)
    leaves out errors that a later call of the same tool recovered from.
    """

    name = INVALID_INVOCATION
    description = (
        "Calls tools in ways that fail: errors, tools that do not exist, missing, unknown or "
        "mistyped arguments"
    )

    def __init__(
        self,
        min_support: int = 3,
        errors: bool = True,
        unknown_tools: bool = True,
        schema: bool = True,
        ignore_recovered: bool = True,
    ) -> None:
        self.ignore_recovered = ignore_recovered
        self.min_support = min_support
        self.errors = errors
        self.unknown_tools = unknown_tools
        self.schema = schema
        self.known_tools_: set[str] | None = None
        self.schemas_: dict[str, Schema] = {}

    def fit(self, runs: Sequence[Run]) -> InvalidInvocation:
        good: dict[str, list[Step]] = defaultdict(list)
        good_anywhere: dict[str, list[Step]] = defaultdict(list)
        for run in runs:
            for step in run.steps:
                if is_agent_call(step) and not step.failed:
                    tool = step.tool or step.name
                    good_anywhere[tool].append(step)
                    if run.success is True:
                        good[tool].append(step)
        self.known_tools_ = set(good_anywhere) or None  # nothing learned: no unknown tools
        self.schemas_ = {}
        for tool, calls in good_anywhere.items():
            chosen = good.get(tool) or calls
            if len(chosen) >= self.min_support:
                self.schemas_[tool] = infer_schema(chosen)
        return self

    def _problems(
        self, call: Step, recovered: bool, order_error: bool = False
    ) -> list[tuple[str, str, str]]:
        """(key suffix, reason, message) for one call (`order_error`: its error names a missing
        earlier step, which `WrongToolOrder` reports)."""
        tool = call.tool or call.name
        problems = []
        if (
            self.errors
            and call.failed
            and not order_error
            and not (recovered and self.ignore_recovered)
        ):
            said = next((line.strip() for line in error_text(call).splitlines() if line.strip()),
                        "")  # fmt: skip
            what = said[:120] or call.error_type or call.status  # the real error, not its type
            problems.append((tool, "error", f"{tool} failed ({what})"))
        if self.unknown_tools and self.known_tools_ is not None and tool not in self.known_tools_:
            problems.append((tool, "unknown_tool", f"{tool} never succeeded in any run"))
        schema = self.schemas_.get(tool) if self.schema else None
        if schema is None or not schema.object_arguments:
            return problems
        arguments = parse_json(call.input)
        if not isinstance(arguments, dict):
            problems.append((tool, "not_an_object", f"{tool} got arguments that are no object"))
            return problems
        for name in sorted(schema.required - set(arguments)):
            problems.append((f"{tool}.{name}", "missing_argument",
                             f"{tool} was called without {name!r}, which every successful call "
                             "passes"))  # fmt: skip
        for name, value in arguments.items():
            if name not in schema.allowed:
                problems.append((f"{tool}.{name}", "unknown_argument",
                                 f"{tool} got argument {name!r}, which no successful call "
                                 "passes"))  # fmt: skip
            elif not schema.accepts(name, value):
                problems.append((f"{tool}.{name}", "wrong_type",
                                 f"{tool} got {name!r} as {json_type(value)}; successful calls "
                                 f"pass {'/'.join(sorted(schema.types[name]))}"))  # fmt: skip
        return problems

    def detect(self, run: Run) -> list[Finding]:
        found: dict[str, dict[str, Any]] = {}
        last_good: dict[str, int] = {}
        for step in run.steps:
            if is_agent_call(step) and not step.failed:
                last_good[step.tool or step.name] = step.position
        called_now = {s.tool or s.name for s in run.steps if is_agent_call(s)}
        tools = (self.known_tools_ or set()) | called_now
        called: set[str] = set()
        for call in run.steps:
            if not is_agent_call(call):
                continue
            recovered = last_good.get(call.tool or call.name, -1) > call.position
            order_error = bool(named_prerequisites(call, tools, called, run))
            if not call.failed:
                called.add(call.tool or call.name)
            for suffix, reason, message in self._problems(call, recovered, order_error):
                key = f"{self.name}:{suffix}"
                entry = found.setdefault(key, {"step": call, "reasons": [], "messages": [],
                                               "spans": [], "error_types": []})  # fmt: skip
                if reason not in entry["reasons"]:
                    entry["reasons"].append(reason)
                    entry["messages"].append(message)
                entry["spans"].append(call.span_id)
                if reason == "error" and call.error_type:
                    entry["error_types"].append(call.error_type)
        findings = []
        for key, entry in found.items():
            step = entry["step"]
            reasons = entry["reasons"]
            confidence = 0.9 if "unknown_tool" in reasons else 0.8 if "error" in reasons else 0.7
            findings.append(Finding(
                detector=self.name, key=key, trace_id=run.trace_id, **step_ref(step),
                span_ids=tuple(dict.fromkeys(entry["spans"])), message="; ".join(entry["messages"]),
                confidence=confidence,
                details={"tool": step.tool or step.name, "reasons": reasons,
                         "error_types": sorted(set(entry["error_types"])),
                         "calls": len(entry["spans"])},
            ))  # fmt: skip
        findings.sort(key=lambda f: (f.position or 0, f.key))
        return findings
