"""wrong_choice: a write on one of several records looked up where another matches the user's
words better; on small hand-built runs (a product's variants, orders read one by one, a user's
payment methods), with successful-run controls, and on the real tau-bench runs (skipped where
../shared/data is absent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tracegym.analysis.detector_names import BUILT_IN, WRONG_CHOICE
from tracegym.analysis.detectors.choice import WrongChoice, choices, words
from tracegym.analysis.detectors.registry import DETECTORS
from tracegym.analysis.runs import Run
from tracegym.tests.analysis.test_detectors import RunBuilder

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
GROK = DATA / "tau-bench-grok3-retail" / "grok-3-retail.json"


def _variant(item: str, color: str, size: str, available: bool = True) -> dict[str, Any]:
    return {"item_id": item, "options": {"color": color, "size": size}, "available": available}


VARIANTS = {
    "product_id": "P-77",
    "variants": {
        "1001": _variant("1001", "red", "small"),
        "1002": _variant("1002", "red", "large"),
        "1003": _variant("1003", "black", "large"),
        "1004": _variant("1004", "green", "large", available=False),
        "1005": _variant("1005", "blue", "small"),
    },
}


def exchange_run(said: str, new: str, *, success: bool = True, listing: Any = None) -> Run:
    """The user asks for a variant in `said`; the agent looks the product up and exchanges the
    item 1001 (red, small) for `new`."""
    b = RunBuilder("exchange", success=success)
    b.user("Hi, I want to exchange the kettle I got.")
    b.tool("get_order", {"order_id": "W-1"}, {"order_id": "W-1", "items": [{"item_id": "1001"}]})
    b.tool("get_product", {"product_id": "P-77"}, listing or VARIANTS)
    b.user(said)
    b.tool("exchange_item", {"order_id": "W-1", "item_id": "1001", "new_item_id": new},
           {"ok": True})  # fmt: skip
    b.tool("reply", {"text": "done"}, {"sent": True})
    return b.build()


def population() -> list[Run]:
    """Successful runs where the user's words pick the variant, several phrasings."""
    return [
        exchange_run("The black one in large, please.", "1003"),
        exchange_run("I'd like it in BLACK, size large.", "1003"),
        exchange_run("Blue, small one please", "1005"),
        exchange_run("red but large", "1002"),
        exchange_run("Make it the large red kettle.", "1002"),
    ]


def test_words_normalise_punctuation_and_separators() -> None:
    assert words("Black, LARGE!") == "black large"
    assert words("1.5 liters.") == "1.5 liters"
    assert words("high\u2011ventilation") == "high ventilation"
    assert words("gift_card_7250692") == "gift card 7250692"


def test_a_variant_other_than_the_one_the_user_described_is_flagged() -> None:
    detector = WrongChoice().fit(population())
    run = exchange_run("I want the black one, large please.", "1002", success=False)
    [finding] = detector.detect(run)
    write = next(s for s in run.steps if s.tool == "exchange_item")
    listing = next(s for s in run.steps if s.tool == "get_product")
    assert finding.detector == WRONG_CHOICE
    assert finding.key == "wrong_choice:exchange_item.new_item_id"
    assert finding.position == write.position
    assert finding.span_ids[:2] == (write.span_id, listing.span_id)
    assert finding.details["better_match"] == ["black", "large"]
    assert finding.details["matched"] == ["large"]
    assert finding.details["value"] == "1002"
    assert "black" in finding.message
    # the controls: the same request served right, and every successful run, are not flagged
    assert detector.detect(exchange_run("I want the black one, large please.", "1003")) == []
    assert all(detector.detect(r) == [] for r in population())


def test_nothing_is_flagged_without_successful_calls_to_compare_with() -> None:
    run = exchange_run("I want the black one, large please.", "1002", success=False)
    assert any(c.wrong for c in choices(run))
    assert WrongChoice().detect(run) == []  # unfitted
    assert WrongChoice().fit([*population()[:2], run]).detect(run) == []  # 2 successful calls


def test_a_choice_the_user_named_by_id_or_did_not_describe_is_not_flagged() -> None:
    detector = WrongChoice().fit(population())
    named = exchange_run("Black would be nice, but give me item 1002 after all.", "1002",
                         success=False)  # fmt: skip
    assert detector.detect(named) == []
    vague = exchange_run("Whatever you think is best.", "1002", success=False)
    assert detector.detect(vague) == []


def test_a_rival_in_a_state_successful_runs_never_choose_is_no_rival() -> None:
    """Green is unavailable: the successful runs had it among the variants and never picked it,
    so a user asking for green and getting red is not this detector's finding."""
    detector = WrongChoice().fit(population())
    assert ("exchange_item", "new_item_id", "available=false") in detector.never_
    run = exchange_run("Green and large, please.", "1002", success=False)
    assert detector.detect(run) == []
    assert any(c.wrong for c in choices(run))  # with no state known to be never chosen


def test_an_argument_whose_successful_calls_break_the_rule_is_left_alone() -> None:
    """Where successful runs also pick records the user's words do not describe (the words do
    not decide there), the argument is disabled."""
    runs = population() + [exchange_run("A black large one.", "1002") for _ in range(3)]
    detector = WrongChoice().fit(runs)
    assert ("exchange_item", "new_item_id") in detector.disabled_
    assert detector.detect(exchange_run("black, large", "1002", success=False)) == []


def test_words_every_user_says_are_no_evidence() -> None:
    """'yes' is an option value too, and users say it whatever they want."""
    listing = {
        "variants": {
            i: {"item_id": i, "options": {"waterproof": w}}
            for i, w in (("1001", "no"), ("1002", "yes"), ("1003", "no"))
        }
    }
    runs = [exchange_run("Yes.", "1003", listing=listing) for _ in range(12)]
    detector = WrongChoice().fit(runs)
    assert detector.common("yes") and not detector.common("no")
    assert not detector.disabled_  # not left alone: the word is just no evidence
    failed = exchange_run("yes, go ahead", "1003", success=False, listing=listing)
    assert detector.detect(failed) == []
    assert any(c.wrong for c in choices(failed))  # with no word known as common


def _orders_run(said: str, cancel: str, *, success: bool = True, both: bool = False) -> Run:
    b = RunBuilder("orders", success=success)
    b.user("I need to cancel an order.")
    b.tool(
        "get_order",
        {"order_id": "#W111"},
        {
            "order_id": "#W111",
            "status": "pending",
            "items": [{"name": "Laptop"}, {"name": "Mouse"}],
        },
    )
    b.tool(
        "get_order",
        {"order_id": "#W222"},
        {"order_id": "#W222", "status": "pending", "items": [{"name": "Desk Lamp"}]},
    )
    b.user(said)
    b.tool("cancel_order", {"order_id": cancel}, {"ok": True})
    if both:
        b.tool("cancel_order", {"order_id": "#W111"}, {"ok": True})
    return b.build()


def test_an_order_other_than_the_one_the_user_described_is_flagged() -> None:
    ok = [_orders_run("The one with the laptop.", "#W111") for _ in range(2)] + [
        _orders_run("the desk lamp order", "#W222") for _ in range(2)
    ]
    detector = WrongChoice().fit(ok)
    [finding] = detector.detect(_orders_run("The one with the laptop.", "#W222", success=False))
    assert finding.key == "wrong_choice:cancel_order.order_id"
    assert finding.details["better_match"] == ["laptop"]
    # the order the run acts on with another call is no rival: both requests were served
    said = "Cancel the laptop and mouse order."
    assert detector.detect(_orders_run(said, "#W222", success=False)) != []
    assert detector.detect(_orders_run(said, "#W222", both=True, success=False)) == []


def _payment_run(said: str, method: str, *, success: bool = True) -> Run:
    b = RunBuilder("refund", success=success)
    b.user("I want to return my order.")
    b.tool(
        "get_user",
        {"user_id": "u1"},
        {
            "payment_methods": {
                "gift_card_11": {"source": "gift_card", "id": "gift_card_11"},
                "paypal_22": {"source": "paypal", "id": "paypal_22"},
                "credit_card_33": {
                    "source": "credit_card",
                    "brand": "visa",
                    "id": "credit_card_33",
                },
            }
        },
    )
    b.user(said)
    b.tool("return_items", {"order_id": "#W1", "payment_method_id": method}, {"ok": True})
    return b.build()


def test_a_payment_method_other_than_the_one_the_user_asked_for_is_flagged() -> None:
    ok = [_payment_run("Refund it to my PayPal.", "paypal_22"),
          _payment_run("to the gift card please", "gift_card_11"),
          _payment_run("My Visa credit card.", "credit_card_33")]  # fmt: skip
    detector = WrongChoice().fit(ok)
    [finding] = detector.detect(_payment_run("Refund to my PayPal.", "gift_card_11", success=False))
    assert finding.key == "wrong_choice:return_items.payment_method_id"
    assert finding.details["better_match"] == ["paypal"]
    assert detector.detect(_payment_run("Refund to my PayPal.", "paypal_22")) == []


def test_the_words_a_write_serves_are_those_since_the_previous_write() -> None:
    """An earlier request (black, for the first exchange) is not what a later write serves."""
    mugs = {"variants": {"M1": {"item_id": "M1", "options": {"color": "black"}},
                         "M2": {"item_id": "M2", "options": {"color": "white"}}}}  # fmt: skip
    b = RunBuilder("two exchanges", success=False)
    b.tool("get_product", {"product_id": "P-77"}, VARIANTS)
    b.tool("get_product", {"product_id": "P-12"}, mugs)
    b.user("First swap my white mug for a black one.")
    b.tool("exchange_item", {"item_id": "M2", "new_item_id": "M1"}, {"ok": True})
    b.user("Then the kettle for a large one.")
    b.tool("exchange_item", {"item_id": "1001", "new_item_id": "1002"}, {"ok": True})
    run = b.build()
    assert not any(c.wrong for c in choices(run))
    # with all the user's words, the black of the first request would decide the second
    whole = RunBuilder("one exchange", success=False)
    whole.tool("get_product", {"product_id": "P-77"}, VARIANTS)
    whole.user("First swap my white mug for a black one.")
    whole.user("Then the kettle for a large one.")
    whole.tool("exchange_item", {"item_id": "1001", "new_item_id": "1002"}, {"ok": True})
    assert any(c.wrong for c in choices(whole.build()))


def test_registered_with_a_constant_name() -> None:
    assert DETECTORS[WRONG_CHOICE] is WrongChoice and WRONG_CHOICE in BUILT_IN


@pytest.mark.slow
@pytest.mark.skipif(not GROK.is_file(), reason="needs ../shared/data/tau-bench-grok3-retail")
def test_on_real_tau_bench_runs_successful_runs_are_rarely_flagged(tmp_path: Path) -> None:
    """Fitted on the grok-3 retail runs (outcome: `base_success`), the detector flags some failed
    runs and at most 5% of the successful ones (where a finding is a false alarm)."""
    import json

    from tracegym.analysis.runs import load_runs
    from tracegym.store.importers import import_path
    from tracegym.store.store import Store

    import_path("tau-bench", GROK, tmp_path)
    with Store(tmp_path) as store:
        runs = load_runs(store)
    outcome = {
        (str(r["task_id"]), str(r["trial"])): bool(
            r["info"]["reward_info"]["components"]["base_success"]
        )
        for r in json.loads(GROK.read_text())
    }
    for run in runs:
        attributes = run.root.attributes if run.root is not None else {}
        key = (
            str(attributes.get("tracegym.source.task_id")),
            str(attributes.get("tracegym.source.trial")),
        )
        run.success = outcome.get(key, run.success)
    detector = WrongChoice().fit(runs)
    assert detector.rules_  # arguments with successful calls to compare with
    flagged = [r for r in runs if detector.detect(r)]
    assert any(r.success is False for r in flagged)
    assert sum(r.success is True for r in flagged) <= 0.05 * sum(r.success is True for r in runs)
    assert all(f.position is not None for r in flagged for f in detector.detect(r))


def test_common_words_are_counted_as_a_scan_of_every_run_would() -> None:
    import random

    from tracegym.analysis.detectors.choice import COMMON_RUNS

    rng = random.Random(5)
    vocabulary = ["yes", "yesterday", "no", "red mug", "mug", "red", "blue", "the red", "x"]
    runs = []
    for _ in range(200):
        b = RunBuilder("a task")
        b.user(" ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 6))))
        runs.append(b.build())
    detector = WrongChoice().fit(runs)
    for value in [*vocabulary, "red mug blue", "yes no", "nothing said"]:
        found = sum(f" {value} " in t for t in detector.texts_)  # every run, the slow way
        expected = found >= COMMON_RUNS and found / len(runs) > detector.max_common
        assert detector.common(value) == expected, value
    assert detector.common("yes") and not detector.common("nothing said")
