"""The shop's support agent: a small LM that reads the request, calls tools as JSON and answers.

Written the way a user writes an agent: the episode is a `@tg.agent` function, each model call a
`tg.llm` span with token usage, each tool a `@tg.tool` method (`examples/shop.py`), and the
verifier's verdict is recorded with `tg.record_outcome`, so its runs land in the store exactly as
a production agent's would. Its prompt is the model's own chat template rendering OpenAI-shaped
messages with the shop's tool schemas, and replies are parsed in the model's own tool-call format
(`generation.chat_tokens`), as `tracegym serve` or vLLM would for the same conversation; rollouts
in synthesized environments use the same, so adapters learn the prompt the agent sends.

    agent = ShopAgent(load_policy(folder), notes=CustomerNotes(path))
    result = agent.run(make_task(7))            # one task, alone
    results = agent.run_many(tasks, batch_size=8)   # batched generation across tasks

Its memory is `CustomerNotes`: after each conversation it writes a note about the customer
(`update_memory`), and when a customer it has notes on comes back it reads them (`search_memory`)
and shows them to the model with the request.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tracegym as tg
from tracegym.examples.shop import RULES, TOOL_SCHEMAS, ShopTask, ShopTools, verify
from tracegym.generation.batching import map_batched
from tracegym.generation.chat_tokens import ChatTokens
from tracegym.generation.model import Policy
from tracegym.store.home import read_json, write_json
from tracegym.training.rollout import LaneSession, Session, action_of, reply_message

AGENT_NAME = "shop-agent"
NOTES_STORE = "customer-notes"
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


class CustomerNotes:
    """What the agent remembers about its customers, one note per email, kept across
    conversations (and, with a `path`, across processes: `save()`).

    Reads see the notes as they were when these notes were opened, so tasks see the same notes
    whatever order or batch they run in (a comparison of two agents on the same tasks stays
    fair); writes are kept for `save()`."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        loaded = {}
        if self.path is not None:
            loaded = read_json(self.path, {})
        self.notes: dict[str, str] = dict(loaded)
        self._opened = dict(loaded)
        self._lock = threading.Lock()

    @tg.memory_read(store=NOTES_STORE)
    def read(self, email: str) -> str | None:
        return self._opened.get(email)

    def notes_as_opened(self) -> dict[str, str]:
        """The notes reads see (as they were when opened), untraced."""
        return dict(self._opened)

    @tg.memory_write(store=NOTES_STORE)
    def write(self, email: str, note: str) -> None:
        with self._lock:
            self.notes[email] = note

    def save(self) -> None:
        if self.path is None:
            return
        with self._lock:
            notes = dict(sorted(self.notes.items()))
        write_json(self.path, notes, indent=1)


@dataclass
class TaskResult:
    """One task's outcome, for reports."""

    task_id: str
    seed: int
    kind: str
    passed: bool
    reward: float
    reasons: list[str]
    answer: str
    calls: list[str] = field(default_factory=list)
    run_id: str = ""
    adapter: str | None = None
    generated_tokens: int = 0
    seconds: float = 0.0
    messages: list[dict[str, Any]] = field(default_factory=list)  # the OpenAI-shaped chat

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Episode:
    """One task's conversation: the model's session, the tools, the tokens spent."""

    def __init__(self, agent: ShopAgent, task: ShopTask, session: Any) -> None:
        self.agent = agent
        self.task = task
        self.tools = ShopTools(task)
        self.session = session
        self.generated = 0
        self.messages: list[dict[str, Any]] = []
        self.ended = True  # whether the last reply ended with the stop token

    def start(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)
        self.session.feed(self.agent.chat.prompt(self.messages))

    def add_tool_result(self, content: str) -> None:
        result: dict[str, Any] = {"role": "tool", "content": content}
        call_id = (self.messages[-1].get("tool_calls") or [{}])[0].get("id")
        if call_id:
            result["tool_call_id"] = call_id
        self.session.feed(self.agent.chat.after_reply(self.messages, [result], ended=self.ended))
        self.messages.append(result)

    def think(self) -> dict[str, Any]:
        """One model reply (a `chat` span with the token usage), as an action."""
        agent, session, chat = self.agent, self.session, self.agent.chat
        before = len(session.ids)
        with tg.llm(
            "generate",
            model=agent.policy.name,
            system_instructions=RULES,
            tool_definitions=TOOL_SCHEMAS,
        ) as call:
            new, _full = session.generate(agent.max_new_tokens, chat.stop_id)
            call.set_usage(before, len(new))
        self.generated += len(new)
        self.ended = bool(new) and new[-1] == chat.stop_id
        text = chat.reply_text(new)
        reply = agent.policy.chat_format.parse_reply(text)
        action = action_of(reply, text, agent.policy.chat_format.family)
        if "answer" in action:
            self.messages.append({"role": "assistant", "content": action["answer"]})
        else:
            self.messages.append(reply_message(reply, text))
        return action

    @tg.agent(AGENT_NAME, run_id=lambda **call: call.get("run_id"))
    def solve(self, request: str, run_id: str) -> str:
        """Recall the customer, converse, and note what happened."""
        notes = self.agent.notes
        found = _EMAIL.search(request)
        email = found.group() if found and notes is not None else None
        note = notes.read(email) if notes is not None and email else None
        user = request + (f"\n(Your notes on this customer: {note})" if note else "")
        self.start([{"role": "system", "content": RULES}, {"role": "user", "content": user}])
        answer = self.converse()
        if notes is not None and email:
            done = ", ".join(name for name, _, _ in self.tools.calls) or "no tool"
            notes.write(email, f"asked: {request} | did: {done} | answered: {answer[:160]}")
        return answer

    def converse(self) -> str:
        """Think, call a tool, read its result, until the model answers or runs out of turns."""
        for _ in range(self.agent.max_turns):
            action = self.think()
            if "answer" in action:
                return str(action["answer"])
            self.add_tool_result(self.tools.call(action.get("name"), action.get("arguments")))
        return ""


class ShopAgent:
    """The LM policy as an agent over the shop (see the module docstring)."""

    def __init__(
        self,
        policy: Policy,
        *,
        max_turns: int = 6,
        max_new_tokens: int = 48,
        split: str = "",
        notes: CustomerNotes | None = None,
    ) -> None:
        self.policy = policy
        self.notes = notes
        self.chat = ChatTokens(policy.chat_format, TOOL_SCHEMAS)
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.split = split

    def run(self, task: ShopTask, *, lane: Any = None, adapter: str | None = None) -> TaskResult:
        """Solve one task (batched with `lane`'s wave when given) and record its outcome."""
        started = time.perf_counter()
        session = LaneSession(lane) if lane is not None else Session(self.policy)
        episode = _Episode(self, task, session)
        run_id = uuid.uuid4().hex
        answer = episode.solve(task.request, run_id=run_id)
        verdict = verify(task, episode.tools, answer)
        labels = {"task_id": task.task_id, "split": self.split, "adapter": adapter or "none"}
        tg.record_outcome(
            run_id, success=verdict.passed, reward=verdict.reward, source="verifier", labels=labels
        )
        return TaskResult(
            task_id=task.task_id,
            seed=task.seed,
            kind=task.kind,
            passed=verdict.passed,
            reward=verdict.reward,
            reasons=verdict.reasons,
            answer=answer,
            calls=[
                f"{name}({', '.join(map(str, args.values()))})"
                for name, args, _ in episode.tools.calls
            ],
            run_id=run_id,
            adapter=adapter,
            generated_tokens=episode.generated,
            seconds=round(time.perf_counter() - started, 3),
            messages=episode.messages,
        )

    def run_many(
        self,
        tasks: Sequence[ShopTask],
        *,
        batch_size: int = 8,
        adapter: str | None = None,
        on_done: Callable[[TaskResult], None] | None = None,
    ) -> list[TaskResult]:
        """`[run(t) for t in tasks]`, generating for `batch_size` tasks at a time."""

        def one(lane: Any, task: ShopTask) -> TaskResult:
            return self.run(task, lane=lane, adapter=adapter)

        return map_batched(self.policy, one, tasks, batch_size=batch_size, on_done=on_done)


__all__ = ["AGENT_NAME", "CustomerNotes", "ShopAgent", "TaskResult"]
