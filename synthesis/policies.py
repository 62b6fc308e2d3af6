"""Scripted policies: callables `policy(observation, info) -> action`.

A model policy is any such callable (it sees `info["system_prompt"]` and `info["tools"]` on the
first step, `info["step"] == 0`, and keeps its own history). These scripted ones prove an
environment solvable (`OraclePolicy`), unsolvable by cheating (`NullPolicy`, `RandomToolPolicy`,
`AllToolsPolicy`) and calibratable (`NoisyOraclePolicy`, which errs with probability p).
Policies that need the environment itself (the oracle) get it through `bind(env)`, which
`Environment.rollout` calls before each episode.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from tracegym.synthesis.base import Action, Environment

_VALUE = re.compile(r"#?[A-Za-z0-9_.@-]*\d[A-Za-z0-9_.@-]*")


def harvest(text: str) -> list[str]:
    """Id-like values in a text (what a policy could copy into arguments)."""
    seen: dict[str, None] = {}
    for match in _VALUE.findall(text):
        value = match.strip(".-")
        if len(value) >= 3 and sum(c.isdigit() for c in value) >= 2:
            seen.setdefault(value, None)
    return list(seen)


class ScriptedPolicy:
    """Base: remembers the tools and what it has seen in the current episode."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.env: Environment | None = None
        self.rng = random.Random(seed)
        self.tools: list[dict[str, Any]] = []
        self.seen: list[str] = []
        self.texts: list[str] = []

    def bind(self, env: Environment) -> None:
        self.env = env

    def observe(self, observation: dict[str, Any], info: dict[str, Any]) -> None:
        if info.get("step") == 0:
            self.tools = info.get("tools", [])
            self.seen, self.texts = [], []
            self.rng = random.Random(f"{self.seed}:{info.get('seed')}:{self.episodes()}")
            self.start(info)
        content = str(observation.get("content", ""))
        self.texts.append(content)
        for value in harvest(content):
            if value not in self.seen:
                self.seen.append(value)

    def start(self, info: dict[str, Any]) -> None:
        """A new episode begins."""

    def episodes(self) -> int:
        self._episodes = getattr(self, "_episodes", 0) + 1
        return self._episodes

    def __call__(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        self.observe(observation, info)
        return self.act(observation, info)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        raise NotImplementedError

    # arguments from what was seen
    def arguments(self, tool: dict[str, Any], prefer_first: bool = False) -> dict[str, Any]:
        params = tool["function"]["parameters"]
        out: dict[str, Any] = {}
        for name in params.get("required", []):
            schema = params["properties"].get(name, {})
            out[name] = self.value(schema, prefer_first)
        return out

    def value(self, schema: dict[str, Any], prefer_first: bool = False) -> Any:
        kind = schema.get("type", "string")
        if schema.get("enum"):
            return self.rng.choice(schema["enum"])
        if kind == "array":
            return [self.value(schema.get("items", {"type": "string"}), prefer_first)]
        if kind in ("number", "integer"):
            number = self.rng.choice([v for v in self.numbers()] or [self.rng.uniform(1, 500)])
            return int(number) if kind == "integer" else round(float(number), 2)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "object":
            return {}
        pattern = schema.get("pattern")
        pool = [v for v in self.seen if not pattern or re.match(pattern, v)] or self.seen
        if not pool:
            return "unknown"
        return pool[0] if prefer_first else self.rng.choice(pool)

    def numbers(self) -> list[float]:
        out = []
        for text in self.texts:
            for match in re.findall(r"\d+\.\d{2}\b", text):
                out.append(float(match))
        return out[:50]


class OraclePolicy(ScriptedPolicy):
    """Replays the environment's oracle for the current task."""

    def start(self, info: dict[str, Any]) -> None:
        assert self.env is not None and self.env.task is not None, "bind(env) first"
        self.queue = [dict(a) for a in self.env.task.oracle]

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        return self.queue.pop(0) if self.queue else {"answer": ""}


class NullPolicy(ScriptedPolicy):
    """Answers at once, with nothing."""

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        return {"answer": ""}


class RandomToolPolicy(ScriptedPolicy):
    """Random tools with arguments copied at random from what it has seen; answers with a random
    seen value after a random number of calls."""

    def __init__(self, seed: int = 0, mean_calls: float = 6.0) -> None:
        super().__init__(seed)
        self.mean_calls = mean_calls

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        if not self.tools or self.rng.random() < 1.0 / (1.0 + self.mean_calls):
            answer = " ".join(self.rng.sample(self.seen, min(len(self.seen), 2)))
            return {"answer": answer or "done"}
        tool = self.rng.choice(self.tools)
        return {"name": tool["function"]["name"], "arguments": self.arguments(tool)}


class AllToolsPolicy(ScriptedPolicy):
    """Calls every tool once (arguments: the first matching value seen), then answers with
    everything it saw: the verifier must not be fooled by breadth."""

    def start(self, info: dict[str, Any]) -> None:
        self.pending = list(self.tools)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        if self.pending:
            tool = self.pending.pop(0)
            return {
                "name": tool["function"]["name"],
                "arguments": self.arguments(tool, prefer_first=True),
            }
        return {"answer": "\n".join(self.texts)}


class NoisyOraclePolicy(OraclePolicy):
    """The oracle, except that each action goes wrong with probability `p`: it is dropped, its
    arguments are corrupted, or the policy answers early."""

    def __init__(self, p: float = 0.1, seed: int = 0) -> None:
        super().__init__(seed)
        self.p = p

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        if not self.queue:
            return {"answer": ""}
        action = self.queue.pop(0)
        if self.rng.random() >= self.p:
            return action
        mistake = self.rng.randrange(3)
        if mistake == 0 and self.queue:  # skip this step
            return self.queue.pop(0)
        if mistake == 1 and "arguments" in action and action["arguments"]:
            args = json.loads(json.dumps(action["arguments"]))
            name = self.rng.choice(sorted(args))
            value = args[name]
            others = [v for v in self.seen if v != value]
            if isinstance(value, list):
                args[name] = value[:-1] if len(value) > 1 else [self.rng.choice(others or ["x"])]
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                args[name] = round(value * 1.1 + 1, 2)
            else:
                args[name] = self.rng.choice(others) if others else f"{value}x"
            return {"name": action["name"], "arguments": args}
        return {"answer": "All done."}


__all__ = [
    "AllToolsPolicy",
    "NoisyOraclePolicy",
    "NullPolicy",
    "OraclePolicy",
    "RandomToolPolicy",
    "ScriptedPolicy",
    "harvest",
]
