"""A small, deterministic customer-support agent over an in-memory shop, traced with tracegym.

No LLM and no network: `policy` is a scripted stand-in for the model (traced with `tg.llm` under
the fake model name `scripted-support-1`, with token usage), so every run follows from the seed.
The agent looks customers and orders up with tools, keeps notes in a memory store shared across
runs, works inside budgeted subtasks, and a programmatic verifier records each run's outcome.

Some runs fail, for recurring reasons that analysis of the traces should be able to find:

- `wrong_tool_order`: `refund_order` is called before `get_order` for that order; the shop
  refuses, and the agent tells the customer the refund went through anyway.
- `ungrounded_argument`: the policy invents an order id that appears in no message and no tool
  result, `get_order` fails, and the agent gives up.
- `poisoned_memory`: one run misreads the refund policy (90 days instead of 30) and writes that to
  its notes; the next runs read the note back and refund orders outside the window.
- `budget_burn`: the policy wanders into a side task (product recommendations), overruns that
  subtask's budget and runs out of turns before it resolves the ticket.
- `wrong_assumption`: the policy assumes the customer means their most recent order instead of
  the one with the item they named.

    import tracegym as tg
    from tracegym.examples.support_agent import run_demo

    tg.init(service="support-demo")
    for run in run_demo(n_tasks=40, seed=0):
        print(run["task_id"], run["success"], run["flaw"])

`run_demo` does not call `tg.init`: spans go wherever the process's tracing is configured (the
`tracegym demo` command sends them to the embedded store).
"""

from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import dataclass
from typing import Any

import tracegym as tg

MODEL = "scripted-support-1"
AGENT_NAME = "support-agent"
NOTES_STORE = "support-notes"
WINDOW_NOTE = "refund_window_days"

MAX_TURNS = 12  # policy calls per ticket, side tasks included
MAIN_BUDGET_STEPS = 40
MAIN_BUDGET_TOKENS = 6000
SIDE_BUDGET_STEPS = 6
NOTE_TTL_RUNS = 3  # a note older than this many runs is stale and re-read from the policy

FLAWS = (
    "wrong_tool_order",
    "ungrounded_argument",
    "poisoned_memory",
    "budget_burn",
    "wrong_assumption",
)

POLICIES = {
    "refund": (
        "Refunds are issued for delivered orders within 30 days of delivery. "
        "Unopened items can be exchanged within 90 days."
    ),
    "cancel": "An order can be cancelled only while its status is processing.",
}
REFUND_WINDOW_DAYS = 30

SYSTEM_PROMPT = (
    "You are the support agent of a small electronics shop. Look the customer and the order up "
    "before acting, follow the shop's policies, and answer in one short message."
)

_ITEMS = [
    ("headphones", 59.0),
    ("keyboard", 89.0),
    ("monitor", 229.0),
    ("desk lamp", 35.0),
    ("backpack", 49.0),
    ("webcam", 75.0),
    ("mouse", 25.0),
    ("charger", 19.0),
    ("speaker", 99.0),
    ("tablet stand", 29.0),
]
_NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
_CATALOG = [
    {"sku": "SKU-1", "name": "Studio headphones", "category": "audio", "price": 149.0},
    {"sku": "SKU-2", "name": "Travel headphones", "category": "audio", "price": 79.0},
    {"sku": "SKU-3", "name": "Mechanical keyboard", "category": "keyboards", "price": 119.0},
    {"sku": "SKU-4", "name": "Compact keyboard", "category": "keyboards", "price": 59.0},
    {"sku": "SKU-5", "name": "27-inch monitor", "category": "monitors", "price": 299.0},
    {"sku": "SKU-6", "name": "Portable monitor", "category": "monitors", "price": 189.0},
    {"sku": "SKU-7", "name": "HD webcam", "category": "cameras", "price": 69.0},
]
_SIDE_TOPICS = ["headphones", "keyboard", "monitor", "webcam"]


# The shop ---------------------------------------------------------------------------------------
class ToolError(Exception):
    """A tool refused the call; the agent sees the message as the tool's result."""


class UserNotFound(ToolError):
    pass


class OrderNotFound(ToolError):
    pass


class PreconditionFailed(ToolError):
    pass


class NotAllowed(ToolError):
    pass


@dataclass
class World:
    """The shop's database: users, orders (mutated by refunds and cancellations), policies."""

    users: dict[str, dict[str, Any]]
    orders: dict[str, dict[str, Any]]

    def copy(self) -> World:
        return World(copy.deepcopy(self.users), copy.deepcopy(self.orders))

    def user_by_email(self, email: str) -> dict[str, Any] | None:
        return next((u for u in self.users.values() if u["email"] == email), None)


def build_world(rng: random.Random) -> World:
    """8 users with 3 orders each; every kind of order (recent, old, processing, shipped) occurs."""
    categories = ["recent", "old", "processing", "shipped"] * 6
    rng.shuffle(categories)
    users: dict[str, dict[str, Any]] = {}
    orders: dict[str, dict[str, Any]] = {}
    next_id = 1001
    for index, name in enumerate(_NAMES):
        user_id = f"U-{101 + index}"
        items = rng.sample(_ITEMS, 3)
        order_ids = []
        for item, price in items:
            category = categories.pop()
            order_id = f"ORD-{next_id}"
            next_id += 1
            status = "delivered" if category in ("recent", "old") else category
            days = {"recent": rng.randint(2, 25), "old": rng.randint(35, 80)}.get(category)
            orders[order_id] = {
                "order_id": order_id,
                "user_id": user_id,
                "item": item,
                "amount": price,
                "status": status,
                "delivered_days_ago": days,
                "category": category,  # the generator's label; tools never show it
            }
            order_ids.append(order_id)
        users[user_id] = {
            "user_id": user_id,
            "name": name.title(),
            "email": f"{name}@example.com",
            "order_ids": order_ids,
        }
    return World(users, orders)


class ShopTools:
    """The agent's tools over one ticket's copy of the shop. Each call is an `execute_tool` span."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.looked_up: set[str] = set()  # orders fetched with get_order in this session

    @tg.tool
    def find_user(self, email: str) -> dict[str, Any]:
        user = self.world.user_by_email(email)
        if user is None:
            raise UserNotFound(f"no customer with email {email}")
        orders = [
            {"order_id": oid, "item": self.world.orders[oid]["item"]} for oid in user["order_ids"]
        ]
        return {"user_id": user["user_id"], "name": user["name"], "orders": orders}

    @tg.tool
    def get_order(self, order_id: str) -> dict[str, Any]:
        order = self.world.orders.get(order_id)
        if order is None:
            raise OrderNotFound(f"order {order_id} does not exist")
        self.looked_up.add(order_id)
        return {k: v for k, v in order.items() if k != "category"}

    @tg.tool
    def get_policy(self, topic: str) -> dict[str, str]:
        if topic not in POLICIES:
            raise ToolError(f"no policy about {topic!r}")
        return {"topic": topic, "text": POLICIES[topic]}

    @tg.tool
    def refund_order(self, order_id: str) -> dict[str, Any]:
        order = self.world.orders.get(order_id)
        if order is None:
            raise OrderNotFound(f"order {order_id} does not exist")
        if order_id not in self.looked_up:
            raise PreconditionFailed(f"order {order_id} must be verified with get_order first")
        if order["status"] != "delivered":
            raise NotAllowed(f"order {order_id} is {order['status']}, not delivered")
        order["status"] = "refunded"
        return {"order_id": order_id, "refunded": order["amount"]}

    @tg.tool
    def cancel_order(self, order_id: str) -> dict[str, Any]:
        order = self.world.orders.get(order_id)
        if order is None:
            raise OrderNotFound(f"order {order_id} does not exist")
        if order["status"] != "processing":
            raise NotAllowed(f"order {order_id} is {order['status']}; only processing orders")
        order["status"] = "cancelled"
        return {"order_id": order_id, "status": "cancelled"}

    @tg.tool
    def search_catalog(self, query: str) -> list[dict[str, Any]]:
        words = query.lower().split()
        return [p for p in _CATALOG if any(w in p["name"].lower() for w in words)][:3]


class Notebook:
    """The agent's notes, kept across runs (`update_memory` / `search_memory` spans).

    A note older than NOTE_TTL_RUNS runs is stale: reading it returns nothing, so the agent reads
    the policy again and writes a fresh note.
    """

    def __init__(self) -> None:
        self.notes: dict[str, tuple[str, int]] = {}
        self.clock = 0  # index of the current run

    @tg.memory_write(store=NOTES_STORE)
    def write(self, key: str, content: str) -> None:
        self.notes[key] = (content, self.clock)

    @tg.memory_read(store=NOTES_STORE)
    def read(self, key: str) -> str | None:
        note = self.notes.get(key)
        if note is None or self.clock - note[1] >= NOTE_TTL_RUNS:
            return None
        return note[0]


# Tasks ------------------------------------------------------------------------------------------
@dataclass
class Task:
    task_id: str
    kind: str  # refund | cancel | status
    email: str
    order_id: str
    item: str
    mention_order_id: bool
    side_topic: str | None
    quirk: str | None  # the scripted policy's flaw on this ticket (never shown to the agent)

    def message(self) -> str:
        ref = f" (order {self.order_id})" if self.mention_order_id else ""
        ask = {
            "refund": f"I'd like a refund for the {self.item} I bought{ref}.",
            "cancel": f"Please cancel my order for the {self.item}{ref}.",
            "status": f"Where is my {self.item}{ref}? What's the status of the order?",
        }[self.kind]
        side = f" Also, could you recommend a good {self.side_topic}?" if self.side_topic else ""
        return f"Hi, this is {self.email}. {ask}{side}"


def _pick_order(world: World, rng: random.Random, categories: tuple[str, ...]) -> dict[str, Any]:
    candidates = sorted(
        (o for o in world.orders.values() if o["category"] in categories),
        key=lambda o: o["order_id"],
    )
    return rng.choice(candidates)


def make_tasks(world: World, n_tasks: int, rng: random.Random) -> list[Task]:
    """A seeded mix of clean tickets and tickets on which the scripted policy has a flaw."""
    scenarios = [
        ("refund_ok", 4),
        ("refund_denied", 2),
        ("cancel", 2),
        ("status", 3),
        ("wrong_tool_order", 1),
        ("ungrounded_argument", 1),
        ("poisoned_memory", 1),
        ("budget_burn", 1),
        ("wrong_assumption", 1),
    ]
    names = [s for s, _ in scenarios]
    weights = [w for _, w in scenarios]
    tasks: list[Task] = []

    def add(kind: str, order: dict[str, Any], quirk: str | None = None, **kw: Any) -> None:
        user = world.users[order["user_id"]]
        options = {
            "mention_order_id": rng.random() < 0.5,
            "side_topic": rng.choice(_SIDE_TOPICS) if rng.random() < 0.25 else None,
        }
        options.update(kw)
        tasks.append(
            Task(
                task_id=f"T{len(tasks) + 1:03d}",
                kind=kind,
                email=user["email"],
                order_id=order["order_id"],
                item=order["item"],
                quirk=quirk,
                **options,
            )
        )

    # Every flaw occurs at least once in a task set of 20 or more; the rest is drawn by weight.
    draws = list(FLAWS) if n_tasks >= 20 else []
    while sum(2 if d == "poisoned_memory" else 1 for d in draws) < n_tasks:
        draws.append(rng.choices(names, weights)[0])
    rng.shuffle(draws)
    for scenario in draws:
        if scenario == "refund_ok":
            add("refund", _pick_order(world, rng, ("recent",)))
        elif scenario == "refund_denied":
            add("refund", _pick_order(world, rng, ("old", "processing", "shipped")))
        elif scenario == "cancel":
            add("cancel", _pick_order(world, rng, ("processing", "shipped")))
        elif scenario == "status":
            add("status", _pick_order(world, rng, ("recent", "old", "processing", "shipped")))
        elif scenario == "wrong_tool_order":
            order = _pick_order(world, rng, ("recent",))
            add("refund", order, scenario, mention_order_id=True, side_topic=None)
        elif scenario == "ungrounded_argument":
            order = _pick_order(world, rng, ("recent", "processing", "shipped"))
            add(rng.choice(["refund", "status"]), order, scenario, mention_order_id=False)
        elif scenario == "poisoned_memory":
            # One run misreads the policy and writes the wrong window to its notes; the next
            # ticket asks for a refund outside the real window and trusts that note.
            add("refund", _pick_order(world, rng, ("recent",)), scenario, side_topic=None)
            add("refund", _pick_order(world, rng, ("old",)), side_topic=None)
        elif scenario == "budget_burn":
            order = _pick_order(world, rng, ("processing", "shipped", "recent"))
            add(
                rng.choice(["status", "cancel"]),
                order,
                scenario,
                side_topic=rng.choice(_SIDE_TOPICS),
            )
        elif scenario == "wrong_assumption":
            # an order that is not the customer's most recent one, named by item only
            user = rng.choice(list(world.users.values()))
            order = world.orders[rng.choice(user["order_ids"][:-1])]
            add(rng.choice(["refund", "status"]), order, scenario, mention_order_id=False)
    return tasks[:n_tasks]


# The policy (the LLM stand-in) -------------------------------------------------------------------
@dataclass
class Brain:
    """What the policy has gathered from the conversation so far (its working memory)."""

    task: Task
    rng: random.Random
    user: dict[str, Any] | None = None
    order_id: str | None = None
    order: dict[str, Any] | None = None
    order_missing: bool = False
    window_days: int | None = None
    note_checked: bool = False
    policy_text: str | None = None
    note_written: bool = False
    refund_attempted: bool = False
    refund_error: str | None = None
    result: dict[str, Any] | None = None
    action_error: str | None = None
    side_done: bool = False
    side_searches: int = 0
    side_answer: str | None = None
    invented_id: str | None = None


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool", "name": name, "arguments": arguments}


def _reply(text: str) -> dict[str, Any]:
    return {"type": "reply", "text": text}


def _window_from(text: str, misread: bool) -> int:
    numbers = [int(n) for n in re.findall(r"(\d+) days", text)]
    return numbers[-1] if misread else numbers[0]


def _decide(brain: Brain, in_side_task: bool) -> dict[str, Any]:
    task, quirk = brain.task, brain.task.quirk
    if in_side_task:
        if quirk == "budget_burn":  # keeps browsing: the side task eats the whole run
            phrasing = ["best {}", "{} under 100", "{} reviews", "compare {}", "wireless {}"]
            query = phrasing[brain.side_searches % len(phrasing)].format(task.side_topic)
            return _call("search_catalog", query=query)
        if brain.side_searches == 0:
            return _call("search_catalog", query=str(task.side_topic))
        return {"type": "end_side_task"}
    if task.side_topic and not brain.side_done:
        return {"type": "side_task", "topic": f"recommend a {task.side_topic}"}

    # Which order?
    if brain.order_id is None:
        mentioned = re.search(r"ORD-\d+", task.message())
        if mentioned:
            brain.order_id = mentioned.group(0)
        elif quirk == "ungrounded_argument" and brain.invented_id is None:
            brain.invented_id = f"ORD-{brain.rng.randint(7000, 9999)}"  # made up, never seen
            brain.order_id = brain.invented_id
        elif brain.user is None:
            return _call("find_user", email=task.email)
        else:
            orders = brain.user["orders"]
            if quirk == "wrong_assumption":
                brain.order_id = orders[-1]["order_id"]  # "surely the latest one"
            else:
                match = [o for o in orders if o["item"] == task.item]
                brain.order_id = (match or orders)[0]["order_id"]
    if task.kind == "refund" and quirk == "wrong_tool_order" and not brain.refund_attempted:
        brain.refund_attempted = True
        return _call("refund_order", order_id=brain.order_id)
    if brain.refund_error is not None and quirk == "wrong_tool_order":
        return _reply(f"Your refund for order {brain.order_id} has been submitted.")
    if brain.order is None:
        if brain.order_missing:
            return _reply(f"Sorry, I could not find order {brain.order_id}.")
        return _call("get_order", order_id=brain.order_id)

    order = brain.order
    if task.kind == "status":
        return _reply(f"Your order {order['order_id']} ({order['item']}) is {order['status']}.")
    if task.kind == "cancel":
        if brain.result is not None:
            return _reply(f"Order {order['order_id']} is cancelled.")
        if order["status"] == "processing":
            return _call("cancel_order", order_id=order["order_id"])
        return _reply(
            f"Order {order['order_id']} cannot be cancelled: it is already {order['status']}."
        )

    # Refunds: the window comes from the notes, else from the policy (and is noted down).
    if brain.window_days is None:
        if not brain.note_checked and quirk != "poisoned_memory":
            return {"type": "read_note", "key": WINDOW_NOTE}
        if brain.policy_text is None:
            return _call("get_policy", topic="refund")
        brain.window_days = _window_from(brain.policy_text, misread=quirk == "poisoned_memory")
    if brain.policy_text is not None and not brain.note_written:
        return {"type": "write_note", "key": WINDOW_NOTE, "content": str(brain.window_days)}
    if brain.result is not None:
        return _reply(f"Done: order {order['order_id']} is refunded (${brain.result['refunded']}).")
    if brain.action_error is not None:
        return _reply(f"Sorry, I could not refund order {order['order_id']}.")
    days = order["delivered_days_ago"]
    if order["status"] == "delivered" and days is not None and days <= brain.window_days:
        return _call("refund_order", order_id=order["order_id"])
    return _reply(
        f"Order {order['order_id']} is not eligible for a refund "
        f"(status {order['status']}, refunds within {brain.window_days} days of delivery)."
    )


@tg.llm(model=MODEL, provider="tracegym-demo")
def policy(messages: list[dict[str, Any]], brain: Brain, in_side_task: bool = False) -> dict:
    """The scripted policy: the next action, shaped like a chat completion with token usage."""
    action = _decide(brain, in_side_task)
    content = json.dumps(action, sort_keys=True)
    prompt = sum(_tokens(str(m.get("content", ""))) for m in messages)
    return {
        "model": MODEL,
        "role": "assistant",
        "content": content,
        "action": action,
        "usage": {"input_tokens": prompt + 12, "output_tokens": _tokens(content) + 3},
    }


# The agent --------------------------------------------------------------------------------------
class SupportAgent:
    """Runs one ticket: policy turns, tool calls and notes inside budgeted subtasks."""

    def __init__(self, world: World, notebook: Notebook, task: Task, rng: random.Random) -> None:
        self.tools = ShopTools(world)
        self.notebook = notebook
        self.brain = Brain(task=task, rng=rng)
        self.messages: list[dict[str, Any]] = []
        self.turns = 0
        self.reply: str | None = None
        self.tool_calls = 0
        self.tool_errors = 0

    @tg.agent(name=AGENT_NAME, agent_id="support-agent-v1")
    def handle(self, ticket_id: str, message: str) -> dict[str, Any]:
        tg.current_span().set_attribute("gen_ai.conversation.id", ticket_id)
        self.messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": message},
        ]
        with tg.subtask(
            "resolve ticket", budget_steps=MAIN_BUDGET_STEPS, budget_tokens=MAIN_BUDGET_TOKENS
        ):
            while self.reply is None and self.turns < MAX_TURNS:
                action = self.turn(in_side_task=False)
                if action["type"] == "side_task":
                    with tg.subtask(
                        f"side task: {action['topic']}", budget_steps=SIDE_BUDGET_STEPS
                    ):
                        while self.turns < MAX_TURNS:
                            if self.turn(in_side_task=True)["type"] == "end_side_task":
                                break
                    self.brain.side_done = True
            if self.reply is None:  # out of turns: hand over to a human
                self.send_reply("Sorry, I need to pass your request to a colleague.")
        return {"run_id": tg.current_run_id(), "reply": self.reply, "turns": self.turns}

    def turn(self, in_side_task: bool) -> dict[str, Any]:
        with tg.step("turn", input={"turn": self.turns, "side_task": in_side_task}):
            response = policy(self.messages, self.brain, in_side_task)
            self.turns += 1
            self.messages.append({"role": "assistant", "content": response["content"]})
            action = response["action"]
            self.act(action)
            return action

    def act(self, action: dict[str, Any]) -> None:
        kind, brain = action["type"], self.brain
        if kind == "tool":
            name, arguments = action["name"], action["arguments"]
            self.tool_calls += 1
            try:
                result: Any = getattr(self.tools, name)(**arguments)
            except ToolError as exc:
                self.tool_errors += 1
                result = {"error": type(exc).__name__, "message": str(exc)}
                self.observe_error(name, exc)
            else:
                self.observe(name, result)
            self.messages.append(
                {"role": "tool", "name": name, "content": json.dumps(result, sort_keys=True)}
            )
        elif kind == "read_note":
            content = self.notebook.read(action["key"])
            brain.note_checked = True
            if content is not None:
                brain.window_days = int(content)
            self.messages.append(
                {"role": "tool", "name": "read_note", "content": content or "(no note)"}
            )
        elif kind == "write_note":
            self.notebook.write(action["key"], action["content"])
            brain.note_written = True
            self.messages.append({"role": "tool", "name": "write_note", "content": "saved"})
        elif kind == "reply":
            self.send_reply(action["text"])
        elif kind == "end_side_task":
            pass

    def observe(self, name: str, result: Any) -> None:
        brain = self.brain
        if name == "find_user":
            brain.user = result
        elif name == "get_order":
            brain.order = result
        elif name == "get_policy":
            brain.policy_text = result["text"]
        elif name in ("refund_order", "cancel_order"):
            brain.result = result
        elif name == "search_catalog":
            brain.side_searches += 1
            if result:
                brain.side_answer = result[0]["name"]

    def observe_error(self, name: str, exc: ToolError) -> None:
        brain = self.brain
        if name == "get_order":
            brain.order_missing = True
        elif name == "refund_order" and brain.order is None:
            brain.refund_error = str(exc)
        else:
            brain.action_error = str(exc)

    def send_reply(self, text: str) -> None:
        if self.brain.side_answer and self.brain.task.quirk != "budget_burn":
            text += f" As for your question: I'd suggest the {self.brain.side_answer}."
        # The context-manager form, for code that is not a function of its own.
        with tg.tool("send_reply", arguments={"text": text}) as call:
            call.set_result({"delivered": True})
        self.reply = text
        self.messages.append({"role": "assistant", "content": text})


# The verifier -----------------------------------------------------------------------------------
def verify(task: Task, before: World, after: World, reply: str | None) -> tuple[bool, str]:
    """Did the ticket end in the right shop state with the right answer? (success, verdict)"""
    order = before.orders[task.order_id]
    if task.kind == "refund":
        eligible = (
            order["status"] == "delivered" and order["delivered_days_ago"] <= REFUND_WINDOW_DAYS
        )
        expected = {task.order_id: "refunded"} if eligible else {}
        promise = "refunded" if eligible else "not eligible"
    elif task.kind == "cancel":
        eligible = order["status"] == "processing"
        expected = {task.order_id: "cancelled"} if eligible else {}
        promise = "cancelled" if eligible else "cannot be cancelled"
    else:
        expected, promise = {}, f"is {order['status']}"
    changed = {oid: o["status"] for oid, o in after.orders.items() if o != before.orders.get(oid)}
    if changed != expected:
        return False, "wrong_shop_state"
    if reply is None or promise not in reply or task.order_id not in reply:
        return False, "wrong_reply"
    return True, "ok"


# The demo ---------------------------------------------------------------------------------------
def run_demo(n_tasks: int = 40, seed: int = 0) -> list[dict[str, Any]]:
    """Run `n_tasks` seeded tickets through the agent; record each outcome; return summaries.

    Each summary: task_id, kind, run_id, success, reward, verdict, flaw (the scripted flaw behind
    the run, or "poisoned_memory" when it acted on a poisoned note; None for a clean run), turns,
    tool_calls, tool_errors. Everything but run_id is a function of the seed.
    """
    if n_tasks < 0:
        raise ValueError("n_tasks must be >= 0")
    rng = random.Random(seed)
    world = build_world(rng)
    tasks = make_tasks(world, n_tasks, rng)
    notebook = Notebook()
    summaries = []
    for index, task in enumerate(tasks):
        notebook.clock = index
        before = world.copy()
        after = world.copy()
        agent = SupportAgent(after, notebook, task, random.Random(f"{seed}:{task.task_id}"))
        result = agent.handle(task.task_id, task.message())
        success, verdict = verify(task, before, after, agent.reply)
        run_id = result["run_id"]
        tg.record_outcome(
            run_id,
            success=success,
            reward=1.0 if success else 0.0,
            source="verifier",
            labels={"task_id": task.task_id, "task_kind": task.kind, "verdict": verdict},
        )
        flaw = task.quirk
        if flaw is None and agent.brain.window_days not in (None, REFUND_WINDOW_DAYS):
            flaw = "poisoned_memory"  # acted on a note some earlier run wrote wrong
        summaries.append(
            {
                "task_id": task.task_id,
                "kind": task.kind,
                "run_id": run_id,
                "success": success,
                "reward": 1.0 if success else 0.0,
                "verdict": verdict,
                "flaw": flaw,
                "turns": agent.turns,
                "tool_calls": agent.tool_calls,
                "tool_errors": agent.tool_errors,
            }
        )
    return summaries


if __name__ == "__main__":  # pragma: no cover - a quick look without the CLI
    for row in run_demo():
        print(row)
