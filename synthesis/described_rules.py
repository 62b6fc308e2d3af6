"""Status rules an action's own definition states, for actions the runs never show refused.

A status rule is mined from the traces (`spec.StatusRule`: the states a write succeeded and
failed in). An action the agent never called leaves nothing to mine, and an environment without
a rule teaches the action on every record the user names, whatever its state: an adapter trained
on it then acts where the agent rightly declined (the demo's seed 5: refunds of orders not yet
delivered). Tool definitions often say the state they act on, in the name (tau-bench retail's
`cancel_pending_order`, `return_delivered_order_items`) or the description ("refund a delivered
order"). `described_status_rule` reads that: exactly one of the looked-up record's observed
status values named in the tool's name, else in the first sentence of its description, is the
state the action is allowed in; the other observed values are refused. Anything less clear
gives no rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tracegym.synthesis.spec import Catalog, StatusRule
from tracegym.synthesis.world import STATUS_FIELD, observed_statuses


def _named(values: list[str], text: str) -> list[str]:
    return [
        v for v in values if re.search(rf"(?<![a-z0-9]){re.escape(v.lower())}(?![a-z0-9])", text)
    ]


def definition_text(definition: Mapping[str, Any] | None) -> str:
    """The description in an OpenAI-style tool definition ('' for none)."""
    fn = (definition or {}).get("function", definition or {})
    return str(fn.get("description") or "") if isinstance(fn, Mapping) else ""


def described_status_rule(
    catalog: Catalog, action: str, lookup: str | None, description: str = ""
) -> StatusRule | None:
    """The status rule `action`'s name or description (`description`, else the catalog's) states
    (see the module docstring), or None: fewer than two observed statuses, or not exactly one of
    them named."""
    tool = catalog.tools.get(action)
    values = observed_statuses(catalog, lookup)
    if tool is None or lookup is None or len(values) < 2:
        return None
    named = _named(values, action.lower().replace("_", " "))
    if len(named) != 1:
        text = (description or tool.description).strip()
        first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
        named = _named(values, first.lower())
    if len(named) != 1:
        return None
    refused = [v for v in values if v != named[0]]
    return StatusRule(tool=action, lookup=lookup, field=STATUS_FIELD, allowed=named,
                      refused=refused, after=None)  # fmt: skip


def with_described_refusals(
    status: dict[str, Any] | None,
    catalog: Catalog,
    action: str,
    lookup: str | None,
    description: str = "",
) -> dict[str, Any] | None:
    """`Roles.status` with the states the definition refuses, where the runs showed none: no
    mined rule (the definition's rule), or a mined one that never saw a refusal and allows the
    state the definition names (its refusals added). Otherwise `status` as it is."""
    if status and status.get("refused"):
        return status
    rule = described_status_rule(catalog, action, lookup, description)
    if rule is None:
        return status
    if status and status.get("mined"):
        if status.get("field") != rule.field or rule.allowed[0] not in status["allowed"]:
            return status
        refused = [v for v in rule.refused if v not in status["allowed"]]
        return {**status, "refused": refused, "described": True} if refused else status
    return {"field": rule.field, "allowed": rule.allowed, "refused": rule.refused, "after": None,
            "mined": True, "described": True}  # fmt: skip
