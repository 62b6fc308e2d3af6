"""Status rules read from a tool's definition (`synthesis.described_rules`)."""

from __future__ import annotations

import pytest
from tracegym.synthesis.described_rules import (
    definition_text,
    described_status_rule,
    with_described_refusals,
)
from tracegym.synthesis.spec import infer_catalog

STATUSES = ("pending", "processed", "delivered", "cancelled")


def _catalog(statuses=STATUSES, action="cancel_pending_order"):
    traces = [
        [{"tool": "get_order", "arguments": {"order_id": f"#W{100 + i}"},
          "result": {"order_id": f"#W{100 + i}", "status": statuses[i % len(statuses)]}},
         {"tool": action, "arguments": {"order_id": f"#W{100 + i}"}, "result": {"ok": True}}]
        for i in range(12)
    ]  # fmt: skip
    return infer_catalog(traces)


def test_the_state_in_the_tool_name_wins_over_a_description_naming_several():
    """tau-bench retail: 'Cancel a pending order. If the order is already processed or
    delivered, it cannot be cancelled.' names three states; the tool's name names one."""
    description = "Cancel a pending order. If the order is already processed or delivered, no."
    rule = described_status_rule(_catalog(), "cancel_pending_order", "get_order", description)
    assert rule is not None and rule.allowed == ["pending"]
    assert rule.refused == ["cancelled", "delivered", "processed"]
    assert rule.lookup == "get_order" and rule.field == "status" and rule.after is None


@pytest.mark.parametrize(
    ("description", "allowed"),
    [
        ("refund a delivered order", ["delivered"]),
        (
            "Refund an order once it was DELIVERED. Pending or processed orders are cancelled.",
            ["delivered"],
        ),  # only the first sentence counts
        ("refund an order", None),  # no state named
        ("refund a pending or delivered order", None),  # two: not clear which
        ("refund an undelivered order", None),  # a word containing a state is not the state
    ],
)
def test_the_first_sentence_of_the_description_names_at_most_one_state(description, allowed):
    catalog = _catalog(action="refund_order")
    rule = described_status_rule(catalog, "refund_order", "get_order", description)
    assert (rule.allowed if rule else None) == allowed


def test_no_rule_without_two_observed_states_or_a_lookup():
    one = _catalog(statuses=("delivered",), action="refund_order")
    assert (
        described_status_rule(one, "refund_order", "get_order", "refund a delivered order") is None
    )
    many = _catalog(action="refund_order")
    assert described_status_rule(many, "refund_order", None, "refund a delivered order") is None
    assert described_status_rule(many, "unknown_tool", "get_order", "a delivered order") is None


def test_refusals_join_a_mined_rule_only_where_the_runs_showed_none():
    catalog = _catalog(action="refund_order")
    text = "refund a delivered order"
    mined = {"field": "status", "allowed": ["delivered"], "refused": [], "after": "refunded",
             "mined": True}  # fmt: skip
    joined = with_described_refusals(mined, catalog, "refund_order", "get_order", text)
    assert joined["refused"] == ["cancelled", "pending", "processed"]
    assert joined["after"] == "refunded" and joined["described"]
    # refusals the runs showed are kept as they are
    seen = {**mined, "refused": ["pending"]}
    assert with_described_refusals(seen, catalog, "refund_order", "get_order", text) is seen
    # a mined rule that allows other states than the definition names: the runs win
    other = {**mined, "allowed": ["processed"]}
    assert with_described_refusals(other, catalog, "refund_order", "get_order", text) is other
    # no mined rule: the definition's
    fresh = with_described_refusals(None, catalog, "refund_order", "get_order", text)
    assert fresh["allowed"] == ["delivered"] and fresh["mined"] and fresh["after"] is None
    assert with_described_refusals(None, catalog, "refund_order", "get_order", "refund") is None


def test_definition_text_reads_openai_style_definitions():
    assert definition_text({"type": "function", "function": {"description": "x"}}) == "x"
    assert definition_text({"name": "t", "description": "y"}) == "y"
    assert definition_text(None) == ""
