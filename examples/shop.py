"""A small simulated customer-support shop: seeded database, tools, policy rules, tasks, verifier.

In the spirit of tau-bench, small enough for a 135M model on a CPU. Each task has its own seeded
database (one customer, two or three orders); the customer asks for one thing:

| kind    | the request                          | what the verifier wants                         |
|---------|--------------------------------------|-------------------------------------------------|
| status  | "what is the status of order O1234?" | look it up; the answer names its status         |
| cancel  | "please cancel order O1234"          | look it up; cancel it only if it is pending     |
| refund  | "I want a refund for order O1234"    | look it up; refund it only if it was delivered  |
| address | "please change my address to ..."    | update the customer's address, exactly          |

The rules the agent is told (`RULES`): find the customer by email before anything else; look an
order up before cancelling or refunding it; only pending orders can be cancelled; only delivered
orders can be refunded. The tools enforce the first two and the verifier checks the final
database against the one the oracle (`oracle_actions`) leaves, the order of the required calls,
and the answer. Development and held-out tasks come from disjoint seed ranges (`DEV_SEEDS`,
`HELDOUT_SEEDS`); `DEMO_SEEDS` are for demonstrations.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from typing import Any

import tracegym as tg

KINDS = ("status", "cancel", "refund", "address")
DEV_SEEDS = (0, 100_000)
DEMO_SEEDS = (500_000, 600_000)
HELDOUT_SEEDS = (1_000_000, 1_100_000)

RULES = (
    "You are a support agent for an online shop. Rules: first find the customer with find_user "
    "using their email. Look an order up with get_order before you cancel or refund it. Only "
    "pending orders can be cancelled. Only delivered orders can be refunded. When done, answer "
    "the customer in one short sentence."
)

_NAMES = ["ana", "ben", "cleo", "dan", "eva", "finn", "gus", "hana", "ivo", "jade", "kai", "lea"]
_ITEMS = ["lamp", "kettle", "mouse", "backpack", "speaker", "jacket", "blender", "monitor"]
_STREETS = ["Oak St", "Pine Rd", "Elm Ave", "Lake Dr", "Hill Ln", "Park Way"]
_STATUSES = ("pending", "shipped", "delivered")

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string"} for arg in args},
                "required": list(args),
            },
        },
    }
    for name, args, description in [
        ("find_user", ("email",), "the customer's user id and order ids"),
        ("get_order", ("order_id",), "an order's item and status"),
        ("cancel_order", ("order_id",), "cancel a pending order"),
        ("refund_order", ("order_id",), "refund a delivered order"),
        ("update_address", ("user_id", "address"), "set the customer's address"),
    ]
]


class ShopError(Exception):
    """A tool refused the call; the agent sees the message as the tool's result."""


@dataclass
class ShopTask:
    """One customer request, generated from its seed."""

    seed: int
    kind: str
    email: str
    user_id: str
    orders: dict[str, dict[str, str]]  # order id -> {"item", "status"}
    address: str
    order_id: str | None = None  # the order the request is about
    new_address: str | None = None

    @property
    def task_id(self) -> str:
        return f"shop:{self.seed}"

    @property
    def request(self) -> str:
        hello = f"Hi, my email is {self.email}."
        return (
            hello
            + " "
            + {
                "status": f"What is the status of my order {self.order_id}?",
                "cancel": f"Please cancel my order {self.order_id}.",
                "refund": f"I want a refund for my order {self.order_id}.",
                "address": f"Please change my address to {self.new_address}.",
            }[self.kind]
        )

    def database(self) -> dict[str, Any]:
        return {
            "users": {self.user_id: {"email": self.email, "address": self.address}},
            "orders": copy.deepcopy(self.orders),
        }


def make_task(seed: int, kinds: tuple[str, ...] = KINDS, weights: Any = None) -> ShopTask:
    """The task for `seed`: kinds drawn uniformly unless `weights` says otherwise."""
    rng = random.Random(seed)
    kind = rng.choices(list(kinds), weights=weights)[0]
    name = rng.choice(_NAMES)
    user_id = f"U{rng.randint(100, 999)}"
    n_orders = rng.randint(2, 3)
    orders: dict[str, dict[str, str]] = {}
    while len(orders) < n_orders:
        orders[f"O{rng.randint(1000, 9999)}"] = {
            "item": rng.choice(_ITEMS),
            "status": rng.choice(_STATUSES),
        }
    street = f"{rng.randint(1, 99)} {rng.choice(_STREETS)}"
    task = ShopTask(
        seed=seed,
        kind=kind,
        email=f"{name}{rng.randint(1, 99)}@mail.com",
        user_id=user_id,
        orders=orders,
        address=street,
    )
    if kind == "address":
        task.new_address = f"{rng.randint(1, 99)} {rng.choice(_STREETS)}"
        while task.new_address == street:
            task.new_address = f"{rng.randint(1, 99)} {rng.choice(_STREETS)}"
    else:
        task.order_id = rng.choice(sorted(orders))
    return task


# The tools ----------------------------------------------------------------------------------------
class Shop:
    """The tools' logic over one task's database (untraced: the oracle and the verifier use it;
    the agent uses `ShopTools`)."""

    def __init__(self, task: ShopTask) -> None:
        self.task = task
        self.db = task.database()
        self.authenticated: str | None = None
        self.looked_up: set[str] = set()
        self.calls: list[tuple[str, dict[str, Any], bool]] = []  # (name, arguments, ok)

    def _order(self, order_id: str) -> dict[str, str]:
        order = self.db["orders"].get(order_id)
        if order is None:
            raise ShopError(f"order {order_id} not found")
        return order

    def _need_user(self) -> None:
        if self.authenticated is None:
            raise ShopError("find the customer with find_user first")

    def find_user(self, email: str) -> dict[str, Any]:
        for user_id, user in self.db["users"].items():
            if user["email"] == email:
                self.authenticated = user_id
                return {"user_id": user_id, "orders": sorted(self.db["orders"])}
        raise ShopError(f"no customer with email {email}")

    def get_order(self, order_id: str) -> dict[str, str]:
        self._need_user()
        order = self._order(order_id)
        self.looked_up.add(order_id)
        return {"order_id": order_id, **order}

    def cancel_order(self, order_id: str) -> dict[str, str]:
        self._need_user()
        order = self._order(order_id)
        if order_id not in self.looked_up:
            raise ShopError(f"look order {order_id} up with get_order first")
        if order["status"] != "pending":
            raise ShopError(f"order {order_id} is {order['status']}; only pending can be cancelled")
        order["status"] = "cancelled"
        return {"order_id": order_id, "status": "cancelled"}

    def refund_order(self, order_id: str) -> dict[str, str]:
        self._need_user()
        order = self._order(order_id)
        if order_id not in self.looked_up:
            raise ShopError(f"look order {order_id} up with get_order first")
        if order["status"] != "delivered":
            raise ShopError(f"order {order_id} is {order['status']}; only delivered is refunded")
        order["status"] = "refunded"
        return {"order_id": order_id, "status": "refunded"}

    def update_address(self, user_id: str, address: str) -> dict[str, str]:
        self._need_user()
        if user_id != self.authenticated:
            raise ShopError(f"user {user_id} is not the customer you found")
        self.db["users"][user_id]["address"] = address
        return {"user_id": user_id, "address": address}

    def call(self, name: Any, arguments: Any) -> str:
        """Run a parsed call and return what the agent sees; never raises."""
        tool = getattr(self, name, None) if name in TOOL_NAMES else None
        ok = False
        try:
            if tool is None:
                raise ShopError(f"unknown tool {name!r}")
            if not isinstance(arguments, dict):
                raise ShopError("arguments must be a JSON object")
            result = tool(**{k: str(v) for k, v in arguments.items()})
            ok = True
            return json.dumps(result)
        except TypeError as exc:
            return f"Error: bad arguments for {name}: {exc}"
        except ShopError as exc:
            return f"Error: {exc}"
        finally:
            self.calls.append((str(name), arguments if isinstance(arguments, dict) else {}, ok))


TOOL_NAMES = tuple(t["function"]["name"] for t in TOOL_SCHEMAS)


class ShopTools(Shop):
    """The agent's tools: each call is an `execute_tool` span (arguments, result, error)."""

    @tg.tool
    def find_user(self, email: str) -> dict[str, Any]:
        return super().find_user(email)

    @tg.tool
    def get_order(self, order_id: str) -> dict[str, str]:
        return super().get_order(order_id)

    @tg.tool
    def cancel_order(self, order_id: str) -> dict[str, str]:
        return super().cancel_order(order_id)

    @tg.tool
    def refund_order(self, order_id: str) -> dict[str, str]:
        return super().refund_order(order_id)

    @tg.tool
    def update_address(self, user_id: str, address: str) -> dict[str, str]:
        return super().update_address(user_id, address)


# The oracle and the verifier ---------------------------------------------------------------------
def oracle_actions(task: ShopTask) -> list[tuple[str, dict[str, str]]]:
    """The calls a perfect agent makes, in order."""
    calls = [("find_user", {"email": task.email})]
    if task.kind == "address":
        return [*calls, ("update_address", {"user_id": task.user_id, "address": task.new_address})]
    assert task.order_id is not None
    calls.append(("get_order", {"order_id": task.order_id}))
    status = task.orders[task.order_id]["status"]
    if task.kind == "cancel" and status == "pending":
        calls.append(("cancel_order", {"order_id": task.order_id}))
    if task.kind == "refund" and status == "delivered":
        calls.append(("refund_order", {"order_id": task.order_id}))
    return calls


def oracle_answer(task: ShopTask) -> str:
    if task.kind == "address":
        return f"Done: your address is now {task.new_address}."
    status = task.orders[task.order_id or ""]["status"]
    if task.kind == "status":
        return f"Your order {task.order_id} is {status}."
    done = {"cancel": ("pending", "cancelled"), "refund": ("delivered", "refunded")}[task.kind]
    if status == done[0]:
        return f"Done: order {task.order_id} is {done[1]}."
    verb = "cancelled" if task.kind == "cancel" else "refunded"
    return f"Sorry, order {task.order_id} is {status}, so it cannot be {verb}."


def expected_database(task: ShopTask) -> dict[str, Any]:
    shop = Shop(task)
    for name, arguments in oracle_actions(task):
        shop.call(name, arguments)
    return shop.db


@dataclass
class Verdict:
    passed: bool
    reward: float
    reasons: list[str] = field(default_factory=list)


def verify(task: ShopTask, tools: Shop, answer: str) -> Verdict:
    """Final database, required call order and the answer; reward is the share of checks met."""
    reasons = []
    if tools.db != expected_database(task):
        reasons.append("the final database is not the expected one")
    ok_calls = [(n, a) for n, a, ok in tools.calls if ok]
    if task.kind != "address" and ("get_order", {"order_id": task.order_id}) not in ok_calls:
        reasons.append(f"order {task.order_id} was never looked up")
    if not answer.strip():
        reasons.append("no answer")
    elif task.kind == "status":
        status = task.orders[task.order_id or ""]["status"]
        if status not in answer.lower():
            reasons.append(f"the answer does not give the status ({status})")
    checks = 3
    return Verdict(not reasons, round(1 - len(reasons) / checks, 4), reasons)


def demonstration(task: ShopTask) -> list[dict[str, Any]]:
    """The oracle episode as OpenAI-format messages (request, calls, tool results, answer)."""
    shop = Shop(task)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.request}]
    for name, arguments in oracle_actions(task):
        call = {"type": "function", "function": {"name": name, "arguments": arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "content": shop.call(name, arguments)})
    messages.append({"role": "assistant", "content": oracle_answer(task)})
    return messages


__all__ = [
    "DEMO_SEEDS",
    "DEV_SEEDS",
    "HELDOUT_SEEDS",
    "KINDS",
    "RULES",
    "TOOL_SCHEMAS",
    "Shop",
    "ShopError",
    "ShopTask",
    "ShopTools",
    "Verdict",
    "demonstration",
    "expected_database",
    "make_task",
    "oracle_actions",
    "oracle_answer",
    "verify",
]
