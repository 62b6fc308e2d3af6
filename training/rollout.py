"""Run a policy model in an environment, traced with tracegym.

    from tracegym.training.rollout import rollout
    result = rollout(policy, env, seed=1_000_000, temperature=0.0)
    result.passed, result.reward, result.messages

The prompt is the model's own chat template rendering the episode's OpenAI-shaped messages with
the environment's tool schemas (`apply_chat_template(messages, tools=...)`, through
`generation.chat_tokens`), and replies are parsed in the model's own tool-call format
(`ChatFormat.parse_reply`): what `tracegym serve` or vLLM would render and parse for the same
conversation. One call per assistant turn is executed (the first, if the model wrote several); a
reply without a call is the final answer. A malformed call (bad JSON, no name, an unknown tool)
goes to the environment as an invalid step the verifier sees; it never raises.

Generation is KV-cached across the whole episode: each turn only feeds the new tokens (the tool
result, the next assistant header) and keeps the cache. Each episode is a tracegym run
(`invoke_agent policy`, one `chat` span per generation with token usage, one `execute_tool` span
per call, the verifier's outcome recorded), so rollouts are queryable like any other run when
tracing is initialised (and cost next to nothing when it is not).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import tracegym as tg
from tracegym.generation import tokens
from tracegym.generation.batching import map_batched
from tracegym.generation.chat_format import Reply, attempts_call, parse_hermes
from tracegym.generation.chat_tokens import ChatTokens, Conversation
from tracegym.generation.model import Policy, cache_argument


# Replies as actions ----------------------------------------------------------------------------
def action_of(reply: Reply, text: str, family: str) -> dict[str, Any]:
    """The action a parsed reply stands for: its first tool call, an answer, or (a reply that
    opened the family's call syntax but is not a call) a malformed call the environment rejects
    as an invalid step."""
    if reply.tool_calls:
        call = reply.tool_calls[0]
        return {"name": call.name, "arguments": dict(call.arguments)}
    if attempts_call(text, family):
        return {"name": None, "arguments": (text.strip() or "<empty>") + " <malformed>"}
    return {"answer": (reply.content or "").strip()}


def reply_message(reply: Reply, text: str) -> dict[str, Any]:
    """The reply as the OpenAI assistant message the conversation continues from (a malformed
    call stays text, as a server would return it)."""
    if reply.tool_calls:
        first = Reply(reply.content, reply.tool_calls[:1])
        return first.to_openai()
    return {"role": "assistant", "content": text.strip()}


def conversation_calls(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of the tools an OpenAI-shaped conversation's assistant turns call (`tool_calls`
    entries, or Hermes `<tool_call>` text in conversations recorded as plain text)."""
    names: list[str] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            name = (call.get("function") or call).get("name")
            if isinstance(name, str):
                names.append(name)
        content = message.get("content")
        if isinstance(content, str) and "<tool_call>" in content:
            names += [c.name for c in parse_hermes(content).tool_calls]
    return names


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
    messages: list[dict[str, Any]]  # the episode as OpenAI-shaped messages
    tools: list[dict[str, Any]] | None = None  # the tool schemas the prompt rendered
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

    def conversation(self) -> Conversation:
        """The episode as a training conversation (its messages and tools)."""
        return Conversation(list(self.messages), self.tools)


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
    observation, info = env.reset(seed=seed)
    tools = info.get("tools", []) or None
    chat = ChatTokens(policy.chat_format, tools)
    system = str(info.get("system_prompt", "") or "")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": str(observation.get("content", ""))})
    session: Any = LaneSession(lm) if lm is not None else Session(policy, use_cache=use_cache)
    mask: list[int] = []

    def feed(ids: list[int]) -> None:
        session.feed(ids)
        mask.extend([0] * len(ids))

    feed(chat.prompt(messages))
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
            before = len(session.ids)
            sampling = (max_new_tokens, chat.stop_id, temperature, generator)
            if trace:
                with tg.llm("generate", model=policy.name) as call:
                    new, full = session.generate(*sampling)
                    call.set_usage(before, len(new))
            else:
                new, full = session.generate(*sampling)
            mask.extend([1] * len(new))
            prompt += before
            generated += len(new)
            text = chat.reply_text(new)
            reply = policy.chat_format.parse_reply(text)
            action = action_of(reply, text, policy.chat_format.family)
            if turn >= budget and "answer" not in action:
                action = {"answer": ""}  # out of steps: the environment has truncated already
            if full:
                action = {"answer": text.strip()}
            if "answer" in action:
                messages.append({"role": "assistant", "content": action["answer"]})
            else:
                messages.append(reply_message(reply, text))
            actions.append(action)
            if trace and "answer" not in action:
                with tg.tool(str(action.get("name")), arguments=action.get("arguments")) as t:
                    obs, _reward, terminated, truncated, info = env.step(action)
                    t.set_result(obs.get("content"))
            else:
                obs, _reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                if not (new and new[-1] == chat.stop_id):
                    feed([chat.stop_id])  # the episode's tokens end where its turn ends
                verdict = info.get("verdict", {})
                break
            result = {"role": "tool", "content": str(obs.get("content", ""))}
            call_id = (messages[-1].get("tool_calls") or [{}])[0].get("id")
            if call_id:
                result["tool_call_id"] = call_id
            ended = bool(new) and new[-1] == chat.stop_id
            feed(chat.after_reply(messages, [result], ended=ended))
            messages.append(result)
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
        tools=tools,
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
    "LaneSession",
    "RolloutResult",
    "Session",
    "action_of",
    "conversation_calls",
    "reply_message",
    "rollout",
    "rollout_batched",
    "success_rate",
]
