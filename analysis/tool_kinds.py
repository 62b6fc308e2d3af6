"""Read, write or answer: what a tool is, from its name alone (no domain knowledge).

Analysis (which requests went unserved) and synthesis (which tool is the action, which the
lookup) must agree on it, so it lives here once.
"""

from __future__ import annotations

import re

# A tool is a *read* (no side effects) when its name starts with one of these verbs; everything
# else (cancel, modify, refund, exchange, transfer, send ...) is a *write*.
READ_VERBS = frozenset(
    [
        "get",
        "find",
        "list",
        "search",
        "lookup",
        "look",
        "fetch",
        "read",
        "query",
        "check",
        "calculate",
        "compute",
        "think",
        "show",
        "describe",
        "view",
        "count",
        "retrieve",
        "inspect",
        "lookup_",
        "locate",
        "resolve",
        "estimate",
        "preview",
        "browse",
        "scan",
        "explore",
        "verify",
        "validate",
    ]
)
# Write tools that are the agent's channel to the user: calling one is giving the final answer.
ANSWER_WORDS = ("reply", "respond", "answer", "send_message", "final", "finish", "submit")


def is_read_tool(name: str) -> bool:
    first = re.split(r"[_\-. ]|(?<=[a-z])(?=[A-Z])", name.strip())[0].lower()
    return first in READ_VERBS


def is_answer_tool(name: str) -> bool:
    lowered = name.lower()
    return not is_read_tool(name) and any(word in lowered for word in ANSWER_WORDS)


__all__ = ["ANSWER_WORDS", "READ_VERBS", "is_answer_tool", "is_read_tool"]
