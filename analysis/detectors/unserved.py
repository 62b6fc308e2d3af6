"""Unserved request: the user asked for something one of the agent's tools does, and it never did.

A capability the agent lacks entirely leaves no failed call behind to contrast: it simply never
calls the tool. What the traces do hold is the request and the agent's toolbox: the tool
definitions the agent passes its model (`gen_ai.tool.definitions` on its chat spans) or, without
them, every tool any run called.

`fit` learns each write tool's *words*: its name split into words, less generic verbs (`update`,
`set`, `get` ...): `update_address` -> {address}, `cancel_order` -> {cancel, order}.

`detect` flags a run whose request (its first user message, else its root span's input) contains
every word of a write tool (a word matches a request word that starts with it, so `cancel`
matches "cancelled") and that never called the tool without an error: key
``unserved_request:<tool>``, decisive step: the agent's final action (where it stopped without
acting); its details keep the request and the run's first call, so synthesis can ask in the
users' own words. Runs where not acting was right (a cancel the rules refuse) are flagged too and
succeed: the success/failure contrast, not this detector, decides whether it is a gap.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from tracegym.analysis.detector_names import UNSERVED_REQUEST
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.features import final_action_step, is_tool, step_ref
from tracegym.analysis.runs import Run
from tracegym.analysis.tool_kinds import is_answer_tool, is_read_tool
from tracegym.tracer import semconv as sc

GENERIC_VERBS = frozenset(
    [
        "add",
        "apply",
        "change",
        "create",
        "delete",
        "do",
        "edit",
        "get",
        "list",
        "make",
        "modify",
        "perform",
        "process",
        "put",
        "remove",
        "run",
        "set",
        "submit",
        "update",
    ]
)
_WORD = re.compile(r"[a-z]+")


def tool_words(name: str) -> frozenset[str]:
    """A tool name's words less generic verbs: `update_address` -> {address}."""
    spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).lower()
    return frozenset(w for w in _WORD.findall(spaced) if w not in GENERIC_VERBS and len(w) > 2)


def request_text(run: Run) -> str:
    """What the user asked: the first user message, else the root span's input (its longest
    text argument when the input is the agent function's arguments)."""
    for step in run.steps:
        if step.role == "user":
            return step.input or step.output or ""
    root = run.root
    raw = (root.input or "") if root is not None else ""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(data, dict):
        texts = [v for v in data.values() if isinstance(v, str)]
        return max(texts, key=len) if texts else raw
    return data if isinstance(data, str) else raw


def first_call(run: Run) -> dict[str, Any] | None:
    """The run's first tool call that did not fail: {"tool", "arguments"}."""
    for step in run.steps:
        if is_tool(step) and not step.failed:
            args = step.arguments
            return {
                "tool": step.tool or step.name,
                "arguments": args if isinstance(args, dict) else {},
            }
    return None


def _declared(run: Run) -> list[str]:
    """Tool names from `gen_ai.tool.definitions` on the run's chat spans."""
    for step in run.steps:
        raw = step.attributes.get(sc.TOOL_DEFINITIONS) if step.operation == sc.OP_CHAT else None
        if not raw:
            continue
        try:
            tools = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            continue
        names = []
        for tool in tools if isinstance(tools, list) else []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else {}
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                names.append(fn["name"])
        return names
    return []


def _matches(words: frozenset[str], request: set[str]) -> bool:
    return all(any(r.startswith(w[:6]) for r in request) for w in words)


class UnservedRequest(Detector):
    """A request for a tool's action that the run never performed (see the module docstring).

    Parameters: `min_words` (1): a tool needs at least this many words to be matched.
    """

    name = UNSERVED_REQUEST
    description = (
        "Does not do what the user asked: the request names an action one of the agent's own "
        "tools performs, and the run ends without calling that tool"
    )

    def __init__(self, min_words: int = 1) -> None:
        self.min_words = min_words
        self.tools_: dict[str, frozenset[str]] = {}  # write tool -> its words

    def fit(self, runs: Sequence[Run]) -> UnservedRequest:
        names: set[str] = set()
        for run in runs:
            names.update(_declared(run))
            names.update(s.tool or s.name for s in run.steps if is_tool(s))
        self.tools_ = {
            n: w
            for n in sorted(names)
            if not is_read_tool(n)
            and not is_answer_tool(n)
            and len(w := tool_words(n)) >= self.min_words
        }
        return self

    def detect(self, run: Run) -> list[Finding]:
        if not self.tools_:
            return []
        text = request_text(run)
        request = set(_WORD.findall(text.lower()))
        if not request:
            return []
        done = {s.tool or s.name for s in run.steps if is_tool(s) and not s.failed}
        final = final_action_step(run)
        findings = []
        for tool, words in self.tools_.items():
            if tool in done or not _matches(words, request):
                continue
            attempts = tuple(
                s.span_id for s in run.steps if is_tool(s) and (s.tool or s.name) == tool
            )
            where = f"; the run ended at step {final.position}" if final is not None else ""
            findings.append(
                Finding(
                    detector=self.name,
                    key=f"{self.name}:{tool}",
                    trace_id=run.trace_id,
                    **step_ref(final),
                    span_ids=((final.span_id,) if final is not None else ()) + attempts,
                    message=(
                        f"the request mentions {', '.join(sorted(words))} but {tool} was never "
                        f"called{' successfully' if attempts else ''}{where}"
                    ),
                    confidence=0.6,
                    details={
                        "tool": tool,
                        "words": sorted(words),
                        "attempted": len(attempts),
                        "request": text[:500],
                        "first_call": first_call(run),
                    },
                )
            )
        return findings
