"""The environment base class: seeded tasks, a simulated backend, a step budget, a verifier.

The API follows Gymnasium's:

    env = SomeEnvironment(spec)
    observation, info = env.reset(seed=7)
    while True:
        action = policy(observation, info)  # {"name", "arguments"} or {"answer": text}
        observation, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    info["verdict"]  # {"reward", "passed", "reasons", "checks"}

Observations are chat messages: the first is the user's request (`{"role": "user", "content"}`),
then one tool message per call (`{"role": "tool", "name", "content"}`; failed calls read
`Error: ...`). `info` on reset carries the system prompt and the tool schemas (OpenAI format).
The reward is 0 until the episode ends; then it is the verifier's graded reward.

To write your own environment, subclass `Environment` and implement `generate(seed) -> Task`,
`call_tool(state, name, arguments)` and `tool_schemas()`. `Task.goal` says what the verifier
checks (see `Environment.verify`); the expected final state is derived by replaying `Task.oracle`
on the initial state, so a goal never has to spell a state out by hand.

A task's state is the environment's own: a plain JSON-like dict (keys starting with `_` are
bookkeeping the state hash leaves out) or, for the chain world every synthesized family shares,
a typed `WorldState` (synthesis/world/state.py). The verifier hashes its public part either way
(`public_state`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import EnvironmentSpec, is_id_value
from tracegym.synthesis.world import (
    ToolError,
    WorldState,
    canonical,
    canonical_value,
    clone,
    digest,
    public_state,
)

Action = dict[str, Any]
State = dict[str, Any] | WorldState  # a plain dict state, or the chain world's typed one
Policy = Callable[[dict[str, Any], dict[str, Any]], Action]

ACTION_WEIGHT = 0.6
COMMUNICATION_WEIGHT = 0.4


@dataclass
class Task:
    """One generated task: what the agent is asked, the backend's initial state, the goal."""

    seed: int
    instruction: str
    state: State
    goal: Goal
    oracle: list[Action]
    max_steps: int
    system_prompt: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.goal, Goal):  # a mapping of its parts (TypeError on a typo)
            self.goal = Goal.from_dict(self.goal)

    def fingerprint(self) -> str:
        """The same for the same task, whatever the seed that made it."""
        return digest(
            {"instruction": self.instruction, "state": public_state(self.state, memory=True)}
        )


@dataclass
class Verdict:
    reward: float
    passed: bool
    reasons: list[str]  # why points were lost (empty when passed)
    checks: list[dict[str, Any]]  # {"name", "part", "ok", "detail"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "passed": self.passed,
            "reasons": self.reasons,
            "checks": self.checks,
        }


@dataclass
class Episode:
    task: Task
    steps: list[dict[str, Any]] = field(default_factory=list)  # {"action", "observation", ...}
    answer: str | None = None
    truncated: bool = False
    state: State = field(default_factory=dict)  # the backend state now

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Tool calls that ran (successfully or with a tool error)."""
        return [s for s in self.steps if "name" in s["action"]]

    @property
    def invalid(self) -> int:
        return sum(1 for s in self.steps if s.get("invalid"))

    def messages(self, system: bool = True) -> list[dict[str, Any]]:
        """The episode as OpenAI-format chat messages (system, user, assistant tool calls, tool
        results, the final answer): what a model is fine-tuned on."""
        out: list[dict[str, Any]] = []
        if system and self.task.system_prompt:
            out.append({"role": "system", "content": self.task.system_prompt})
        out.append({"role": "user", "content": self.task.instruction})
        for i, step in enumerate(self.steps):
            action = step["action"]
            arguments = action.get("arguments", {})
            call_id = f"call_{i}"
            out.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": action.get("name"),
                                "arguments": arguments
                                if isinstance(arguments, str)
                                else json.dumps(arguments, ensure_ascii=False),
                            },
                        }
                    ],
                }
            )
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "name": action.get("name"),
                    "content": step["observation"]["content"],
                }
            )
        if self.answer is not None:
            out.append({"role": "assistant", "content": self.answer})
        return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def contains_token(text: str, value: str) -> bool:
    """`value` occurs in `text` as a whole token (case-insensitive): `CO` is not in `customer`."""
    pattern = r"(?<![A-Za-z0-9_])" + re.escape(value) + r"(?![A-Za-z0-9_])"
    return re.search(pattern, text, re.IGNORECASE) is not None


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def call_matches(call: Mapping[str, Any], pattern: Mapping[str, Any]) -> bool:
    """A call matches a pattern with the same name and (a superset of) its arguments."""
    if call.get("name") != pattern.get("name"):
        return False
    want = pattern.get("arguments")
    if want is None:
        return True
    have = call.get("arguments") or {}
    return all(k in have and canonical(have[k]) == canonical(v) for k, v in want.items())


def _describe(pattern: Mapping[str, Any]) -> str:
    args = pattern.get("arguments")
    if args is None:
        return f"{pattern['name']}(...)"
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return f"{pattern['name']}({shown})"


class Environment:
    """Base class of every environment (see the module docstring)."""

    family = "custom"
    answer_tool: str | None = None  # a tool whose call is the final answer (e.g. send_reply)
    answer_arg: str | None = None

    def __init__(self, spec: EnvironmentSpec | None = None, **knobs: Any) -> None:
        self.spec = spec
        self.knobs = {**self.default_knobs(), **(spec.knobs if spec else {}), **knobs}
        self.task: Task | None = None
        self.episode: Episode | None = None
        self._rng = random.Random(0)
        self._done = True

    # To implement --------------------------------------------------------------------------
    def default_knobs(self) -> dict[str, Any]:
        return {}

    def generate(self, seed: int) -> Task:
        """The task for `seed`: the same seed must always give the same task."""
        raise NotImplementedError

    def call_tool(self, state: State, name: str, arguments: Any) -> Any:
        """Run one tool call against `state` (mutating it); raise ToolError on failure."""
        raise NotImplementedError

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools the agent sees, in the OpenAI function-calling format."""
        raise NotImplementedError

    def contrast_knobs(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Knob overrides giving two versions of each task, one where the environment's rule
        allows the action and one where it refuses it (None: no such rule). Trained side by
        side, the two versions of a seed differ where the rule looks, so that is what the
        adapter must read to tell their replies apart (see training.sft.capability_data)."""
        return None

    # Difficulty ladder (used by calibration) -----------------------------------------------
    def levels(self) -> list[dict[str, Any]]:
        """Knob settings from easiest to hardest (default: just the current knobs)."""
        return [dict(self.knobs)]

    # Gymnasium-style API -------------------------------------------------------------------
    @property
    def env_id(self) -> str:
        return self.spec.env_id if self.spec else type(self).__name__

    def make_task(self, seed: int) -> Task:
        """The task for `seed` (`generate`); its expected final state is derived on first use."""
        return self.generate(seed)

    def fork_state(self, state: State) -> State:
        """A copy of `state` that tool calls can mutate without touching the original
        (default: a deep copy; override with something cheaper when you know what changes)."""
        if isinstance(state, WorldState):
            return copy.deepcopy(state)
        return clone(state)

    def expected_state_hash(self, task: Task) -> str:
        """The digest of the final state the oracle reaches (cached in `task.goal`)."""
        if task.goal.state_hash is None:
            state = self.fork_state(task.state)
            for action in task.oracle:
                if "name" in action:
                    with contextlib.suppress(ToolError):
                        self.call_tool(state, action["name"], action.get("arguments", {}))
            task.goal.state_hash = digest(public_state(state))
        return task.goal.state_hash

    def reset(
        self,
        *,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is None:
            start, stop = self.spec.train_seeds if self.spec else (0, 10_000)
            seed = self._rng.randrange(start, stop)
        self.task = self.make_task(int(seed))
        self.episode = Episode(task=self.task, state=self.fork_state(self.task.state))
        self._done = False
        observation = {"role": "user", "content": self.task.instruction}
        return observation, self._info(step=0)

    def _info(self, **extra: Any) -> dict[str, Any]:
        task = self.task
        assert task is not None
        info = {
            "env_id": self.env_id,
            "family": self.family,
            "seed": task.seed,
            "task_id": f"{self.env_id}:{task.seed}",
            "max_steps": task.max_steps,
        }
        if extra.get("step") == 0:
            info["system_prompt"] = task.system_prompt
            info["tools"] = self.tool_schemas()
        info.update(extra)
        return info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._done or self.episode is None:
            raise RuntimeError("the episode is over: call reset()")
        episode = self.episode
        action = self._parse(action)
        if "answer" in action:
            episode.answer = action["answer"]
            return self._finish(
                {"role": "user", "content": "(the conversation has ended)"}, truncated=False
            )
        record: dict[str, Any] = {"action": action}
        name = action.get("name")
        error = invalid = False
        if "error" in action:
            content, error, invalid = f"Error: {action['error']}", True, True
        else:
            try:
                result = self.call_tool(episode.state, name, action.get("arguments", {}))
                content = _text(result)
            except ToolError as exc:
                content, error, invalid = f"Error: {exc}", True, exc.invalid
        record.update(
            observation={"role": "tool", "name": name, "content": content},
            error=error,
            invalid=invalid,
        )
        episode.steps.append(record)
        if len(episode.steps) >= episode.task.max_steps:
            episode.truncated = True
            return self._finish(record["observation"], truncated=True, error=error)
        info = self._info(step=len(episode.steps), error=error, invalid=invalid)
        return record["observation"], 0.0, False, False, info

    def _finish(self, observation: dict[str, Any], truncated: bool, **extra: Any):
        assert self.episode is not None
        self._done = True
        verdict = self.verify(self.episode)
        info = self._info(
            step=len(self.episode.steps), verdict=verdict.to_dict(), passed=verdict.passed, **extra
        )
        return observation, verdict.reward, not truncated, truncated, info

    def _parse(self, action: Any) -> Action:
        if isinstance(action, str):
            try:
                action = json.loads(action)
            except ValueError:
                return {"answer": action}
        if not isinstance(action, Mapping):
            return {"name": None, "error": f"an action is a tool call or an answer, got {action!r}"}
        if "answer" in action:
            answer = action["answer"]
            return {"answer": answer if isinstance(answer, str) else _text(answer)}
        name = action.get("name")
        arguments = action.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                return {
                    "name": name,
                    "arguments": arguments,
                    "error": f"{name}: arguments are not valid JSON",
                }
        if self.answer_tool and name == self.answer_tool and isinstance(arguments, Mapping):
            return {"answer": _text(arguments.get(self.answer_arg or "", ""))}
        if not isinstance(name, str) or not name:
            return {"name": name, "arguments": arguments, "error": "a tool call needs a name"}
        return {"name": name, "arguments": arguments}

    # Verification --------------------------------------------------------------------------
    def verify(self, episode: Episode) -> Verdict:
        """Score an episode from the final state and the actions taken.

        `Task.goal` is a `Goal` (synthesis/goal.py: required and forbidden calls, forbidden
        attempts, opening, order, verify_after, grounded, max_invalid, memory, answer
        includes/excludes, amounts); its `state_hash` defaults to the state the oracle reaches
        (`expected_state_hash`).
        Reward: 0.6 x share of action checks passed + 0.4 x share of communication checks.
        """
        goal = episode.task.goal
        checks: list[dict[str, Any]] = []

        def add(name: str, part: str, ok: bool, detail: str) -> None:
            checks.append({"name": name, "part": part, "ok": bool(ok), "detail": detail})

        done = [s for s in episode.calls if not s.get("error")]
        done_calls = [s["action"] for s in done]
        add(
            "finished",
            "action",
            episode.answer is not None and not episode.truncated,
            "answered within the step budget"
            if not episode.truncated
            else f"ran out of steps ({episode.task.max_steps})",
        )
        same = digest(public_state(episode.state)) == self.expected_state_hash(episode.task)
        add(
            "state",
            "action",
            same,
            "the final state is the expected one"
            if same
            else "the final state differs from the expected one",
        )
        for pattern in goal.required_calls:
            ok = any(call_matches(c, pattern) for c in done_calls)
            add(
                "required_call",
                "action",
                ok,
                f"{_describe(pattern)} {'was' if ok else 'was not'} called",
            )
        tried = [s["action"] for s in episode.calls]  # failed calls too
        for name, patterns, calls, verb in (
            ("forbidden_call", goal.forbidden_calls, done_calls, "called"),
            ("forbidden_attempt", goal.forbidden_attempts, tried, "tried"),
        ):
            for pattern in patterns:
                ok = not any(call_matches(c, pattern) for c in calls)
                add(name, "action", ok, f"{_describe(pattern)} {'was not' if ok else 'was'} {verb}")
        opening = list(goal.opening)
        if opening:
            head = [c.get("name") for c in done_calls[: len(opening)]]
            add(
                "opening",
                "action",
                head == opening,
                f"the episode {'opened' if head == opening else 'did not open'} with "
                + ", ".join(opening),
            )
        for before, after in goal.order:
            first_after = next(
                (i for i, c in enumerate(done_calls) if call_matches(c, after)), None
            )
            ok = first_after is not None and any(
                call_matches(c, before) for c in done_calls[:first_after]
            )
            add(
                "order",
                "action",
                ok,
                f"{_describe(before)} {'came' if ok else 'did not come'} before {_describe(after)}",
            )
        for check, write in goal.verify_after:
            last = max(
                (i for i, c in enumerate(done_calls) if call_matches(c, write)), default=None
            )
            ok = last is not None and any(call_matches(c, check) for c in done_calls[last + 1 :])
            add(
                "verified",
                "action",
                ok,
                f"{_describe(check)} "
                f"{'checked' if ok else 'did not check'} the result of {_describe(write)}",
            )
        if goal.grounded:
            unseen = self._ungrounded(episode)
            add(
                "grounded",
                "action",
                not unseen,
                "every id was looked up before use"
                if not unseen
                else f"used {unseen[0]!r} before any message or tool result showed it",
            )
        if goal.max_invalid is not None:
            n = episode.invalid
            add(
                "valid_calls",
                "action",
                n <= goal.max_invalid,
                f"{n} invalid invocation(s) (at most {goal.max_invalid})",
            )
        state = episode.state
        notes = state.memory if isinstance(state, WorldState) else state.get("memory", {})
        memory = json.dumps(notes, ensure_ascii=False)
        for text in goal.memory_excludes:
            ok = not contains_token(memory, str(text))
            add(
                "memory",
                "action",
                ok,
                f"memory {'holds no' if ok else 'still holds the'} stale value {text!r}",
            )
        answer = _norm(episode.answer or "")
        add("answered", "communication", bool(answer), "the answer is not empty")
        for text in goal.answer_includes:
            ok = _norm(str(text)) in answer
            add(
                "answer_includes",
                "communication",
                ok,
                f"the answer {'mentions' if ok else 'does not mention'} {text!r}",
            )
        for text in goal.answer_excludes:
            ok = _norm(str(text)) not in answer
            add(
                "answer_excludes",
                "communication",
                ok,
                f"the answer {'does not claim' if ok else 'wrongly claims'} {text!r}",
            )
        checks.extend(self.extra_checks(episode))
        return self._grade(checks)

    def extra_checks(self, episode: Episode) -> list[dict[str, Any]]:
        """More checks for subclasses: dicts like those `verify` builds."""
        return []

    @staticmethod
    def _grade(checks: list[dict[str, Any]]) -> Verdict:
        parts = {
            "action": [c["ok"] for c in checks if c["part"] == "action"],
            "communication": [c["ok"] for c in checks if c["part"] == "communication"],
        }
        share = {k: (sum(v) / len(v) if v else 1.0) for k, v in parts.items()}
        reward = round(
            ACTION_WEIGHT * share["action"] + COMMUNICATION_WEIGHT * share["communication"], 4
        )
        passed = all(c["ok"] for c in checks)
        return Verdict(
            1.0 if passed else min(reward, 0.99),
            passed,
            [c["detail"] for c in checks if not c["ok"]],
            checks,
        )

    def _ungrounded(self, episode: Episode) -> list[str]:
        seen = episode.task.instruction
        unseen = []
        for step in episode.steps:
            arguments = step["action"].get("arguments")
            if "name" in step["action"] and isinstance(arguments, Mapping):
                for value in arguments.values():
                    for item in value if isinstance(value, list) else [value]:
                        if is_id_value(item) and item not in seen:
                            unseen.append(item)
            seen += "\n" + step["observation"]["content"]
        return unseen

    # Oracle and rollouts -------------------------------------------------------------------
    def oracle(self, seed: int) -> list[Action]:
        """The actions that solve the task for `seed` (the last one is the answer)."""
        return [dict(a) for a in self.make_task(seed).oracle]

    def rollout(self, policy: Policy, seed: int) -> tuple[Episode, Verdict]:
        """Run one episode of `policy` (calls `policy.bind(self)` first if it has one)."""
        bind = getattr(policy, "bind", None)
        if callable(bind):
            bind(self)
        observation, info = self.reset(seed=seed)
        while True:
            action = policy(observation, info)
            observation, _reward, terminated, truncated, info = self.step(action)
            if terminated or truncated:
                assert self.episode is not None
                verdict = info["verdict"]
                return self.episode, Verdict(
                    verdict["reward"], verdict["passed"], verdict["reasons"], verdict["checks"]
                )

    def export_task(self, seed: int, split: str = "train") -> dict[str, Any]:
        """One line of the task dataset."""
        task = self.make_task(seed)
        return {
            "env_id": self.env_id,
            "family": self.family,
            "split": split,
            "seed": seed,
            "task_id": f"{self.env_id}:{seed}",
            "system_prompt": task.system_prompt,
            "tools": self.tool_schemas(),
            "observation": {"role": "user", "content": task.instruction},
            "max_steps": task.max_steps,
            "fingerprint": task.fingerprint(),
        }


def run_actions(env: Environment, seed: int, actions: Sequence[Action]) -> tuple[Episode, Verdict]:
    """Replay a fixed list of actions (ending with an answer, else an empty one) on `seed`."""
    queue = list(actions)

    def policy(observation: dict[str, Any], info: dict[str, Any]) -> Action:
        return queue.pop(0) if queue else {"answer": ""}

    return env.rollout(policy, seed)


__all__ = [
    "Action",
    "Environment",
    "Episode",
    "Policy",
    "State",
    "Task",
    "ToolError",
    "Verdict",
    "call_matches",
    "canonical_value",
    "run_actions",
]
