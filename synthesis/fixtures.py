"""Synthetic tool-call traces of a small shop agent, for tests, benchmarks and examples.

    catalog = infer_catalog(shop_traces(40))

The calls look like what the tracer records (`{"tool", "arguments", "result", "error"}` with
JSON text), in the shape of tau-bench's retail tools: a finder, a user lookup listing order ids,
an order lookup, two writes with status preconditions, a search tool and a reply tool.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

FIRST = ("ava", "liam", "mei", "omar", "sofia", "yusuf", "noah", "emma", "ivan", "lei")
LAST = ("rossi", "kim", "garcia", "silva", "ito", "khan", "lopez", "novak", "berg", "moreau")
PRODUCTS = (
    "Headphones", "Keyboard", "Desk Lamp", "Backpack", "Kettle", "Smart Watch", "Tablet",
    "Camera", "Jacket", "Sneakers", "Blender", "Monitor", "Speaker", "Yoga Mat", "Router",
)  # fmt: skip
REASONS = ("no longer needed", "ordered by mistake")


def _call(tool: str, arguments: dict[str, Any], result: Any, error: bool = False) -> dict:
    return {
        "tool": tool,
        "arguments": json.dumps(arguments),
        "result": None if error else (result if isinstance(result, str) else json.dumps(result)),
        "error": error,
    }


def shop_traces(n: int = 40, seed: int = 0) -> list[list[dict[str, Any]]]:
    """`n` traces: find the user, list their orders, look one up, act on it, reply."""
    rng = random.Random(seed)
    traces = []
    for _ in range(n):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        user_id = f"{first}_{last}_{rng.randrange(1000, 10000)}"
        email = f"{first}.{last}{rng.randrange(10, 100)}@example.com"
        card = f"credit_card_{rng.randrange(10**6, 10**7)}"
        orders = []
        for _ in range(rng.randint(1, 3)):
            items = [
                {"name": rng.choice(PRODUCTS), "item_id": str(rng.randrange(10**9, 10**10)),
                 "price": round(rng.uniform(10, 400), 2)}
                for _ in range(rng.randint(1, 3))
            ]  # fmt: skip
            orders.append({
                "order_id": f"#W{rng.randrange(10**6, 10**7)}",
                "user_id": user_id,
                "status": rng.choice(("pending", "delivered", "processed")),
                "items": items,
                "payment_history": [{"transaction_type": "payment", "payment_method_id": card,
                                     "amount": round(sum(i["price"] for i in items), 2)}],
            })  # fmt: skip
        user = {"user_id": user_id, "email": email, "orders": [o["order_id"] for o in orders],
                "payment_methods": {card: {"source": "credit_card", "id": card}}}  # fmt: skip
        calls = [
            _call("find_user_id_by_email", {"email": email}, user_id),
            _call("get_user_details", {"user_id": user_id}, user),
        ]
        order = rng.choice(orders)
        calls.append(_call("get_order_details", {"order_id": order["order_id"]}, order))
        if rng.random() < 0.3:
            calls.append(_call("search_products", {"query": rng.choice(PRODUCTS).lower()},
                               [{"name": p, "product_id": str(rng.randrange(10**9, 10**10))}
                                for p in rng.sample(PRODUCTS, 2)]))  # fmt: skip
        if rng.random() < 0.5:
            ok = order["status"] == "pending"
            done = {**order, "status": "cancelled"}
            calls.append(_call("cancel_pending_order", {"order_id": order["order_id"],
                               "reason": rng.choice(REASONS)}, done, error=not ok))  # fmt: skip
        else:
            ok = order["status"] == "delivered"
            picked = [i["item_id"] for i in order["items"][: rng.randint(1, len(order["items"]))]]
            done = {**order, "status": "return requested"}
            calls.append(_call("return_delivered_order_items", {
                "order_id": order["order_id"], "item_ids": picked,
                "payment_method_id": order["payment_history"][0]["payment_method_id"]},
                done, error=not ok))  # fmt: skip
        calls.append(_call("send_reply", {"text": f"Done with {order['order_id']}."}, "sent"))
        traces.append(calls)
    return traces


def gap(detector: str, tools: list[str], key: str | None = None, **extra: Any) -> dict[str, Any]:
    """A minimal gaps.json gap (docs/gaps.md) for `detector`."""
    detail = key or ">".join(tools) if detector == "wrong_tool_order" else (key or tools[0])
    out = {
        "id": "gap-" + hashlib.sha256(f"{detector}:{detail}".encode()).hexdigest()[:10],
        "rank": 1,
        "name": f"{detector}_{'_'.join(tools)}",
        "key": f"{detector}:{detail}",
        "kind": "finding",
        "detector": detector,
        "description": f"synthetic {detector} gap",
        "coverage": 0.3,
        "delta": 0.25,
        "stability": 10,
        "failed_runs_lacking": 9,
        "successful_runs_lacking": 1,
        "tools": tools,
        "argument_patterns": [],
        "examples": [],
        "successful_behaviour": "",
        "signatures": [],
    }
    out.update(extra)
    return out


__all__ = ["gap", "shop_traces"]
