"""wrong_source: a write argument taken from another field, record or list element (or another
arithmetic) than successful runs of the same request take it from; on small hand-built runs of
a broken item's refund (the item's price to the payment method the user named), with the
right call as a control. Also wrong_choice's identities that are not 4+ digit texts."""

from __future__ import annotations

from typing import Any

from tracegym.analysis.detector_names import BUILT_IN, WRONG_CHOICE, WRONG_SOURCE
from tracegym.analysis.detectors.choice import WrongChoice
from tracegym.analysis.detectors.provenance import WrongSource, origins_of
from tracegym.analysis.detectors.registry import DETECTORS
from tracegym.analysis.detectors.state import reads
from tracegym.analysis.runs import Run
from tracegym.tests.analysis.test_detectors import RunBuilder

METHODS = [
    {"id": "PM-1", "type": "credit card"},
    {"id": "PM-2", "type": "paypal"},
    {"id": "PM-3", "type": "gift card"},
]
ITEMS = [
    {"item_id": "IT-1", "name": "charger", "price": 19.5},
    {"item_id": "IT-2", "name": "cable", "price": 12.25},
    {"item_id": "IT-3", "name": "stand", "price": 41.0},
]
TOTAL = 72.75


def refund_run(item: int, method: int, *, amount: float | None = None, pay: str | None = None,
               success: bool = True) -> Run:  # fmt: skip
    """The user names the broken item and the method; the agent looks both up and refunds."""
    b = RunBuilder("refund", success=success)
    said = f"The {ITEMS[item]['name']} of order W-1 arrived broken; refund it to my "
    b.user(said + f"{METHODS[method]['type']} please.")
    b.tool("get_profile", {"email": "a@b.c"}, {"user_id": "U-1", "payment_methods": METHODS})
    b.tool("get_order", {"order_id": "W-1"}, {"order_id": "W-1", "total": TOTAL,
                                              "items": ITEMS})  # fmt: skip
    b.message("assistant", "Refunding the item now.")
    args = {"order_id": "W-1", "item_id": ITEMS[item]["item_id"],
            "amount": ITEMS[item]["price"] if amount is None else amount,
            "payment_method_id": pay or METHODS[method]["id"]}  # fmt: skip
    b.tool("refund_item", args, {"ok": True})
    b.tool("reply", {"text": "done"}, {"sent": True})
    return b.build()


def population() -> list[Run]:
    """Successful refunds of every item to every method (the first listed now and then)."""
    return [refund_run(i, m) for i in range(3) for m in range(3)]


def test_registered_by_default() -> None:
    assert DETECTORS[WRONG_SOURCE] is WrongSource and WRONG_SOURCE in BUILT_IN


def test_the_origins_of_a_value_name_field_element_and_how_it_was_chosen() -> None:
    run = refund_run(1, 1)
    earlier = reads(run)
    told = " the cable of order w 1 arrived broken refund it to my paypal please "
    found = origins_of(12.25, earlier, told, {"it 2"})
    assert {"get_order.items[named].price", "get_order.items[call].price",
            "get_order.items[*].price"} <= set(found)  # fmt: skip
    assert "get_order.items[first].price" not in found
    assert set(origins_of(TOTAL, earlier, told, set())) >= {
        "get_order.total",
        "get_order: the sum of items[].price",
    }


def test_an_amount_from_another_field_is_flagged_with_both_sources() -> None:
    detector = WrongSource().fit(population())
    run = refund_run(0, 1, amount=TOTAL, success=False)
    [finding] = detector.detect(run)
    write = next(s for s in run.steps if s.tool == "refund_item")
    chat = next(s for s in run.steps if s.role == "assistant")
    order = next(s for s in run.steps if s.tool == "get_order")
    assert finding.key == "wrong_source:refund_item.amount"
    assert finding.position == write.position
    assert finding.span_ids == (write.span_id, chat.span_id, order.span_id)
    assert "took `amount` from `get_order.total`" in finding.message
    assert "successful runs of this request take it from `get_order.items[" in finding.message
    assert finding.details["took"] == "get_order.total"
    assert finding.details["expected"] in ("get_order.items[call].price",
                                           "get_order.items[named].price")  # fmt: skip


def test_another_record_of_the_list_is_flagged() -> None:
    detector = WrongSource().fit(population())
    run = refund_run(2, 2, pay="PM-1", success=False)  # asked for the gift card, got the first
    [finding] = detector.detect(run)
    assert finding.key == "wrong_source:refund_item.payment_method_id"
    assert finding.details["took"] == "get_profile.payment_methods[first].id"
    assert finding.details["expected"] == "get_profile.payment_methods[named].id"
    assert "payment_methods[first].id" in finding.message


def test_the_right_sources_are_not_flagged_even_in_a_failed_run() -> None:
    detector = WrongSource().fit(population())
    assert detector.detect(refund_run(1, 2, success=False)) == []
    assert detector.detect(refund_run(0, 0, success=False)) == []  # the first is the one named


def test_a_value_with_no_origin_is_left_to_the_amount_detectors() -> None:
    detector = WrongSource().fit(population())
    assert detector.detect(refund_run(0, 1, amount=33.33, success=False)) == []


def test_too_few_successful_calls_learn_no_rule() -> None:
    detector = WrongSource().fit(population()[:4])
    assert detector.rules_ == {}
    assert detector.detect(refund_run(0, 1, amount=TOTAL, success=False)) == []


def order_refund(amount_of: str, *, success: bool = True, total: float = 120.0) -> Run:
    """A whole order refunded: the total less the fee (`net`), or the `total`, or half."""
    b = RunBuilder("refund order", success=success)
    b.user("Please refund my order W-7.")
    b.tool("get_order", {"order_id": "W-7"}, {"order_id": "W-7", "total": total,
                                              "service_fee": 7.5})  # fmt: skip
    amount = {"net": total - 7.5, "total": total, "half": total / 2}[amount_of]
    b.tool("refund_order", {"order_id": "W-7", "amount": amount}, {"ok": True})
    return b.build()


def test_arithmetic_successful_runs_do_not_do_is_flagged() -> None:
    successes = [order_refund("net", total=t) for t in (120.0, 80.0, 99.9, 45.0, 300.0)]
    detector = WrongSource().fit(successes)
    assert {r.origin for r in detector.rules_.values() if r.arg == "amount"} == {
        "get_order: total - service_fee"
    }
    [whole] = detector.detect(order_refund("total", success=False))
    assert whole.details["took"] == "get_order.total"
    assert "successful runs of this request take it from `get_order: total - service_fee`" in (
        whole.message
    )
    [half] = detector.detect(order_refund("half", success=False))
    assert half.details["took"] == "get_order: total / 2"
    assert detector.detect(order_refund("net", success=False)) == []


def test_a_field_successful_runs_copy_is_flagged_when_computed_instead() -> None:
    successes = [order_refund("total", total=t) for t in (120.0, 80.0, 99.9, 45.0, 300.0)]
    detector = WrongSource().fit(successes)
    [finding] = detector.detect(order_refund("net", success=False))
    assert finding.details["took"] == "get_order: total - service_fee"
    assert finding.details["expected"] == "get_order.total"


# wrong_choice: identities that are not texts with 4+ digits ----------------------------------
SLOTS = [
    {"slot_id": "S10", "time": "morning", "doctor": "Dr Ana"},
    {"slot_id": "S11", "time": "afternoon", "doctor": "Dr Ben"},
    {"slot_id": "S12", "time": "evening", "doctor": "Dr Chen"},
]


def booking_run(said: str, slot: str, *, success: bool = True, slots: Any = None) -> Run:
    b = RunBuilder("book", success=success)
    b.user(said)
    b.tool("list_slots", {"day": "2025-03-01"}, {"slots": slots or SLOTS})
    b.tool("book_slot", {"slot": slot}, {"ok": True})
    return b.build()


def test_a_short_id_named_like_an_id_is_a_records_identity() -> None:
    population = [booking_run("The morning one please.", "S10"),
                  booking_run("Evening works for me.", "S12"),
                  booking_run("afternoon, please", "S11"),
                  booking_run("I prefer the morning.", "S10")]  # fmt: skip
    detector = WrongChoice().fit(population)
    [finding] = detector.detect(booking_run("The evening slot, please.", "S10", success=False))
    assert finding.detector == WRONG_CHOICE and finding.details["better_match"] == ["evening"]


def test_a_value_unique_among_the_records_is_an_identity_too() -> None:
    slots = [{"code": "AM", "time": "morning"}, {"code": "PM", "time": "afternoon"},
             {"code": "EV", "time": "evening"}]  # fmt: skip
    population = [booking_run("The morning one please.", "AM", slots=slots),
                  booking_run("Evening works for me.", "EV", slots=slots),
                  booking_run("afternoon, please", "PM", slots=slots)]  # fmt: skip
    detector = WrongChoice().fit(population)
    wrong = booking_run("The evening slot, please.", "AM", success=False, slots=slots)
    [finding] = detector.detect(wrong)
    assert finding.details["better_match"] == ["evening"]
    assert detector.detect(booking_run("evening", "EV", success=False, slots=slots)) == []
