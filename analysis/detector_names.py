"""Detector names as constants, and which findings are symptoms rather than causes.

Analysis, synthesis and the dashboard compare detector names; a typo in a string literal there
fails silently (a gap no family fits). Every built-in detector takes its `name` from here:

    from tracegym.analysis.detector_names import WRONG_TOOL_ORDER  # name = WRONG_TOOL_ORDER

*Symptoms* are behaviours that follow a cause in the same runs: running out of steps, repeating
a call, spending more calls of a tool than successful runs do (often the retries after an
error, or calls the task needed). Gap selection (`analysis.gaps.select`) folds a symptom into a
cause covering the same failed runs instead of ranking it as a gap of its own.
"""

from __future__ import annotations

UNGROUNDED_ARGUMENT = "ungrounded_argument"
WRONG_TOOL_ORDER = "wrong_tool_order"
POISONED_MEMORY = "poisoned_memory"
BUDGET_WASTE = "budget_waste"
INVALID_INVOCATION = "invalid_invocation"
PREMATURE_FINISH = "premature_finish"
UNSERVED_REQUEST = "unserved_request"
FORBIDDEN_ACTION = "forbidden_action"
MISSED_ACTION = "missed_action"
WRONG_AMOUNT = "wrong_amount"
WRONG_LIST = "wrong_list"
UNKNOWN_VALUE = "unknown_value"
MISSED_REQUEST = "missed_request"
WRONG_CHOICE = "wrong_choice"
WRONG_SOURCE = "wrong_source"
# Opt-in (not in BUILT_IN, not run by default: `registry.OPT_IN`; docs/detectors.md).
MISSED_WRITE = "missed_write"
# Not a detector of the registry: the name of the optional LLM judge's candidates
# (`analysis/judge.py`, keys "judge:<capability>").
JUDGE = "judge"

# The detectors analysis runs by default, in the order they run (ties in gap ranking follow
# it). The registry takes its set and order from here and refuses a detector module that is
# not listed (and not opt-in), so the two cannot disagree.
BUILT_IN: tuple[str, ...] = (
    UNGROUNDED_ARGUMENT,
    WRONG_TOOL_ORDER,
    POISONED_MEMORY,
    BUDGET_WASTE,
    INVALID_INVOCATION,
    PREMATURE_FINISH,
    UNSERVED_REQUEST,
    FORBIDDEN_ACTION,
    MISSED_ACTION,
    WRONG_AMOUNT,
    WRONG_LIST,
    UNKNOWN_VALUE,
    MISSED_REQUEST,
    WRONG_CHOICE,
    WRONG_SOURCE,
)
# Detectors that measure spending (calls, steps, tokens): their contrast is drawn against
# successful runs serving the same kind of request (see `analysis.gaps.like_with_like`).
SPEND_DETECTORS: frozenset[str] = frozenset({BUDGET_WASTE})

# Finding-key prefixes of symptom kinds (a key is "<detector>:<detail>"). A subtask over its
# budget (`budget_waste:subtask:<kind>`) names a behaviour of its own and is not among them.
SYMPTOM_KEY_PREFIXES: tuple[str, ...] = (
    f"{BUDGET_WASTE}:out_of_steps",  # the run stopped at the ceiling
    f"{BUDGET_WASTE}:loop:",  # the same call repeated
    f"{BUDGET_WASTE}:tool:",  # more calls of a tool than successful runs make (retries ...)
    "retry:",
    "retries:",
    "apology:",
    "apologies:",
)
# Detectors whose whole kind (the candidate `detector:<name>`) is a symptom kind.
SYMPTOM_DETECTORS: frozenset[str] = frozenset({BUDGET_WASTE, "retry", "retries", "apology",
                                               "apologies"})  # fmt: skip


def is_symptom(key: str) -> bool:
    """Whether a candidate key (a finding key, or `detector:<name>`) is a symptom kind."""
    if key.startswith("detector:"):
        return key.split(":", 1)[1] in SYMPTOM_DETECTORS
    return key.startswith(SYMPTOM_KEY_PREFIXES)


__all__ = [
    "BUDGET_WASTE",
    "BUILT_IN",
    "FORBIDDEN_ACTION",
    "INVALID_INVOCATION",
    "JUDGE",
    "MISSED_ACTION",
    "MISSED_REQUEST",
    "MISSED_WRITE",
    "POISONED_MEMORY",
    "PREMATURE_FINISH",
    "SPEND_DETECTORS",
    "SYMPTOM_DETECTORS",
    "SYMPTOM_KEY_PREFIXES",
    "UNGROUNDED_ARGUMENT",
    "UNKNOWN_VALUE",
    "UNSERVED_REQUEST",
    "WRONG_AMOUNT",
    "WRONG_CHOICE",
    "WRONG_LIST",
    "WRONG_SOURCE",
    "WRONG_TOOL_ORDER",
    "is_symptom",
]
