"""Run a policy model in an environment, traced with tracegym.

    from tracegym.training.rollout import rollout
    result = rollout(policy, env, seed=1_000_000, temperature=0.0)
    result.passed, result.reward, result.messages

The chat format is ChatML (`<|im_start|>role\\n...<|im_end|>`, what SmolLM2 and the tiny test
model use). The system message is the task's system prompt plus the tool schemas and how to call
them: one call per assistant message, written `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`; a message without a tool call is the final answer. Malformed calls (bad JSON, no
name, an unknown tool) go to the environment as invalid steps the verifier sees; they never raise.

Generation is KV-cached across the whole episode: each turn only feeds the new tokens (the tool
result, the next assistant prefix) and keeps the cache. Each episode is a tracegym run
(`invoke_agent policy`, one `chat` span per generation with token usage, one `execute_tool` span
per call, the verifier's outcome recorded), so rollouts are queryable like any other run when
tracing is initialised (and cost next to nothing when it is not).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import tracegym as tg
from tracegym.generation import tokens
from tracegym.generation.batching import map_batched
from tracegym.generation.model import IM_END, IM_START, Policy, cache_argument

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
CALL_HELP = (
    "To call a tool, reply with exactly one call and nothing else: "
    '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>. '
    "When you are done, reply to the user in plain text (no tool call)."
)


# Prompt and parsing ----------------------------------------------------------------------------
def describe_tools(tools: Sequence[dict[str, Any]]) -> str:
    """Compact tool schemas: `- name(arg: type, ...): description` per line."""
    lines = []
    for tool in tools:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        desc = (fn.get("description") or "").strip()
        lines.append(f"- {fn.get('name')}({args})" + (f": {desc}" if desc else ""))
    return "\n".join(lines)


def system_message(system_prompt: str, tools: Sequence[dict[str, Any]]) -> str:
    parts = [system_prompt.strip()] if system_prompt and system_prompt.strip() else []
    if tools:
        parts.append("Tools:\n" + describe_tools(tools))
    parts.append(CALL_HELP)
    return "\n\n".join(parts)


def format_call(name: Any, arguments: Any) -> str:
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_OPEN}{body}{TOOL_CLOSE}"


def to_chat(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], system_prompt: str = ""
) -> list[dict[str, str]]:
    """OpenAI-format messages (an episode's, a demonstration's) as plain role/content messages
    in the policy's format: the system message with tool schemas, tool calls as text."""
    out: list[dict[str, str]] = []
    system = system_prompt
    for message in messages:
        role = message.get("role")
        if role == "system":
            system = message.get("content") or system
            continue
        if role == "assistant" and message.get("tool_calls"):
            fn = message["tool_calls"][0]["function"]
            out.append({"role": "assistant", "content": format_call(fn["name"], fn["arguments"])})
        elif role == "tool":
            out.append({"role": "tool", "content": str(message.get("content") or "")})
        else:
            out.append({"role": str(role), "content": str(message.get("content") or "")})
    return [{"role": "system", "content": system_message(system, tools)}, *out]


_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')


def parse_action(text: str) -> dict[str, Any]:
    """The action a model's reply stands for: a tool call, an answer, or a malformed call (an
    action the environment rejects as an invalid step). Never raises."""
    body = None
    if TOOL_OPEN in text:
        body = text.split(TOOL_OPEN, 1)[1].split(TOOL_CLOSE, 1)[0].strip()
    elif text.lstrip().startswith("{") and '"name"' in text:
        body = text.strip()
    if body is None:
        return {"answer": text.replace(IM_END, "").strip()}
    try:
        data = json.loads(body)
    except ValueError:
        found = _NAME.search(body)
        raw = body if body else "<empty>"
        # arguments that are not valid JSON: the environment records an invalid step
        return {"name": found.group(1) if found else None, "arguments": raw + " <malformed>"}
    if not isinstance(data, dict):
        return {"name": None, "arguments": {}}
    arguments = data.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, (dict, str)):
        arguments = json.dumps(arguments) + " <malformed>"
    name = data.get("name")
    return {"name": name if isinstance(name, str) else None, "arguments": arguments}


# Encoding --------------------------------------------------------------------------------------
class ChatEncoder:
    """ChatML token ids, one message at a time (the same ids for training and for rollouts)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids(IM_END)
        if self.end_id is None or self.end_id == tokenizer.unk_token_id:
            raise ValueError(
                f"the tokenizer has no {IM_END} token: only ChatML models are supported"
            )
        self._cache: dict[str, list[int]] = {}

    def text(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if len(text) < 64:
                self._cache[text] = ids
        return list(ids)

    def header(self, role: str) -> list[int]:
        return self.text(f"{IM_START}{role}\n")

    def message(self, role: str, content: str) -> tuple[list[int], list[int]]:
        """(ids, mask): mask is 1 on the tokens a model is trained to produce (assistant content
        and its end token)."""
        head, body, tail = self.header(role), self.text(content), self.text("\n")
        train = 1 if role == "assistant" else 0
        ids = [*head, *body, self.end_id, *tail]
        mask = [0] * len(head) + [train] * (len(body) + 1) + [0] * len(tail)
        return ids, mask

    def conversation(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        mask: list[int] = []
        for m in messages:
            i, k = self.message(m["role"], m["content"])
            ids += i
            mask += k
        return ids, mask


# Generation ------------------------------------------------------------------------------------
class Session:
    """A growing token sequence with its KV cache (or none: `use_cache=False` recomputes the
    whole sequence for every token, for comparison)."""

    def __init__(
        self, policy: Policy, *, use_cache: bool = True, max_length: int | None = None
    ) -> None:
        self.policy = policy
        self.use_cache = use_cache
        self.ids: list[int] = []
        self.cached = 0
        self.past: Any = None
        limit = getattr(policy.model.config, "max_position_embeddings", 2048) or 2048
        self.max_length = min(max_length or limit, limit)

    def feed(self, ids: Iterable[int]) -> None:
        self.ids.extend(ids)

    def _logits(self) -> Any:
        import torch

        model = self.policy.model
        device = self.policy.device
        if not self.use_cache:
            out = model(
                input_ids=torch.tensor([self.ids], device=device), use_cache=False, logits_to_keep=1
            )
            return out.logits[0, -1]
        if self.past is None:
            from transformers import DynamicCache

            self.past = DynamicCache()
        new = self.ids[self.cached :]
        tokens.add(fed=len(new))
        kwargs = {cache_argument(model): self.past}
        out = model(
            input_ids=torch.tensor([new], device=device), use_cache=True, logits_to_keep=1, **kwargs
        )
        self.cached = len(self.ids)  # the cache object is updated in place
        return out.logits[0, -1]

    def generate(
        self,
        max_new_tokens: int,
        stop_id: int,
        temperature: float = 0.0,
        generator: Any = None,
    ) -> tuple[list[int], bool]:
        """Sample up to `max_new_tokens` (stopping after `stop_id`, which is kept). Returns the new
        ids and whether the context ran out."""
        import torch

        out: list[int] = []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                if len(self.ids) >= self.max_length:
                    return out, True
                logits = self._logits().float()
                if temperature and temperature > 0:
                    probs = torch.softmax(logits / temperature, dim=-1)
                    token = int(torch.multinomial(probs.cpu(), 1, generator=generator).item())
                else:
                    token = int(torch.argmax(logits).item())
                self.ids.append(token)
                out.append(token)
                tokens.add(generated=1)
                if token == stop_id:
                    break
        return out, False


class LaneSession:
    """`Session`'s interface over a `batching.Lane`: the wave holds the KV cache."""

    def __init__(self, lane: Any) -> None:
        self.lane = lane
        self.ids: list[int] = []
        self.max_length = lane.max_length

    def feed(self, ids: Iterable[int]) -> None:
        self.ids.extend(ids)

    def generate(
        self, max_new_tokens: int, stop_id: int, temperature: float = 0.0, generator: Any = None
    ) -> tuple[list[int], bool]:
        """The wave samples with its own temperature and generators (set when it is made)."""
        new, full = self.lane.generate(self.ids, max_new_tokens, stop_id)
        self.ids.extend(new)
        return new, full


# Rollouts --------------------------------------------------------------------------------------
@dataclass
class RolloutResult:
    env_id: str
    seed: int
    task_id: str
    passed: bool
    reward: float
    reasons: list[str]
    messages: list[dict[str, str]]  # the episode in the policy's chat format
    actions: list[dict[str, Any]] = field(default_factory=list)
    invalid: int = 0
    truncated: bool = False
    generated_tokens: int = 0
    prompt_tokens: int = 0
    seconds: float = 0.0
    run_id: str = ""
    adapter: str | None = None
    # the exact token ids of the episode and 1 on those the policy sampled (a policy gradient
    # must use these: decoding and re-encoding the text can give other ids)
    token_ids: list[int] = field(default_factory=list, repr=False)
    sampled_mask: list[int] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("token_ids", "sampled_mask")}


def rollout(
    policy: Policy,
    env: Any,
    seed: int,
    *,
    temperature: float = 0.0,
    generator: Any = None,
    max_new_tokens: int = 96,
    max_steps: int | None = None,
    use_cache: bool = True,
    adapter: str | None = None,
    trace: bool = True,
    lm: Any = None,
) -> RolloutResult:
    """One episode of `policy` in `env` on `seed` (see the module docstring). With `lm`, a
    `batching.Lane`, generation is batched with the lane's other episodes."""
    started = time.perf_counter()
    encoder = ChatEncoder(policy.tokenizer)
    observation, info = env.reset(seed=seed)
    system = system_message(info.get("system_prompt", ""), info.get("tools", []))
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": str(observation.get("content", ""))},
    ]
    session: Any = LaneSession(lm) if lm is not None else Session(policy, use_cache=use_cache)
    mask: list[int] = []

    def feed(ids: list[int]) -> None:
        session.feed(ids)
        mask.extend([0] * len(ids))

    for m in messages:
        feed(encoder.message(m["role"], m["content"])[0])
    budget = min(max_steps or info.get("max_steps", 10), info.get("max_steps", 10))
    run_id = uuid.uuid4().hex
    actions: list[dict[str, Any]] = []
    generated = prompt = 0
    verdict: dict[str, Any] = {}
    truncated = False
    agent = tg.agent("policy", run_id=run_id, agent_id=env.env_id) if trace else None
    handle = agent.__enter__() if agent is not None else None
    try:
        for turn in range(budget + 1):
            feed(encoder.header("assistant"))
            before = len(session.ids)
            if trace:
                with tg.llm("generate", model=policy.name) as call:
                    new, full = session.generate(
                        max_new_tokens, encoder.end_id, temperature, generator
                    )
                    call.set_usage(before, len(new))
            else:
                new, full = session.generate(max_new_tokens, encoder.end_id, temperature, generator)
            mask.extend([1] * len(new))
            prompt += before
            generated += len(new)
            text = policy.tokenizer.decode(
                [t for t in new if t != encoder.end_id], skip_special_tokens=False
            )
            if new and new[-1] == encoder.end_id:
                feed(encoder.text("\n"))
            else:
                feed([encoder.end_id, *encoder.text("\n")])  # that end token was not sampled
            messages.append({"role": "assistant", "content": text})
            action = parse_action(text)
            if turn >= budget and "answer" not in action:
                action = {"answer": ""}  # out of steps: the environment has truncated already
            if full:
                action = {"answer": text.strip()}
            actions.append(action)
            if trace and "answer" not in action:
                with tg.tool(str(action.get("name")), arguments=action.get("arguments")) as t:
                    obs, _reward, terminated, truncated, info = env.step(action)
                    t.set_result(obs.get("content"))
            else:
                obs, _reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                verdict = info.get("verdict", {})
                break
            content = str(obs.get("content", ""))
            messages.append({"role": "tool", "content": content})
            feed(encoder.message("tool", content)[0])
        else:  # pragma: no cover - the environment always ends within its budget
            verdict = {"reward": 0.0, "passed": False, "reasons": ["no verdict"]}
        if handle is not None:
            handle.set_result({"passed": verdict.get("passed"), "reward": verdict.get("reward")})
    finally:
        if agent is not None:
            agent.__exit__(None, None, None)
    if trace:
        tg.record_outcome(
            run_id,
            success=bool(verdict.get("passed")),
            reward=float(verdict.get("reward", 0.0)),
            source="verifier",
            labels={"env_id": env.env_id, "seed": seed, "adapter": adapter or "none"},
        )
    episode = env.episode
    return RolloutResult(
        env_id=env.env_id,
        seed=seed,
        task_id=f"{env.env_id}:{seed}",
        passed=bool(verdict.get("passed")),
        reward=float(verdict.get("reward", 0.0)),
        reasons=list(verdict.get("reasons", [])),
        messages=messages,
        actions=actions,
        invalid=episode.invalid if episode is not None else 0,
        truncated=bool(truncated),
        generated_tokens=generated,
        prompt_tokens=prompt,
        seconds=time.perf_counter() - started,
        run_id=run_id,
        adapter=adapter,
        token_ids=list(session.ids),
        sampled_mask=mask,
    )


def success_rate(
    policy: Policy, env: Any, seeds: Iterable[int], **kwargs: Any
) -> tuple[int, int, list[RolloutResult]]:
    """(passed, n, results) of greedy rollouts over `seeds`."""
    results = [rollout(policy, env, s, **kwargs) for s in seeds]
    return sum(r.passed for r in results), len(results), results


def rollout_batched(
    policy: Policy,
    env: Any,
    seeds: Iterable[int],
    *,
    batch_size: int = 8,
    temperature: float = 0.0,
    seed: int = 0,
    on_done: Any = None,
    **kwargs: Any,
) -> list[RolloutResult]:
    """`[rollout(policy, env, s, **kwargs) for s in seeds]` with generation batched
    `batch_size` episodes at a time (each episode gets its own copy of `env`)."""
    import copy

    def one(lane: Any, s: int) -> RolloutResult:
        return rollout(policy, copy.deepcopy(env), s, lm=lane, **kwargs)

    return map_batched(
        policy, one, list(seeds), batch_size=batch_size, temperature=temperature, seed=seed,
        on_done=on_done,
    )  # fmt: skip


__all__ = [
    "ChatEncoder",
    "LaneSession",
    "RolloutResult",
    "Session",
    "describe_tools",
    "format_call",
    "parse_action",
    "rollout",
    "rollout_batched",
    "success_rate",
    "system_message",
    "to_chat",
]
