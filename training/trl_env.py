"""A tracegym environment as TRL's `GRPOTrainer(environment_factory=...)` wants it.

    from trl import GRPOConfig, GRPOTrainer
    from tracegym.training.trl_env import trl_dataset, trl_environment_factory, verifier_reward
    trainer = GRPOTrainer(
        model, args=GRPOConfig(...), processing_class=tokenizer,
        train_dataset=trl_dataset(env, n=256),             # one row per task: system prompt, seed
        environment_factory=trl_environment_factory(env),  # a class: one method per tool
        reward_funcs=verifier_reward,                      # the verifier's graded reward
    )

The contract (TRL 1.16, `trl/trainer/grpo_trainer.py`): TRL makes instances with no arguments
(one per concurrent rollout, reused), calls `reset(**row)` before each rollout with the dataset
row's columns and appends the string it returns to the last user message; every public method
but `reset`/`get_reward` is a tool, its JSON schema built by transformers' `get_json_schema` from
the signature and the Google-style docstring; TRL calls `method(**arguments)` and puts `str()` of
what it returns (or `{"error": ...}` when it raises) in a tool message. Reward functions get the
rollouts' instances as `environments=`.

Here: `reset(seed=...)` runs task `seed` (the row's `seed`, else one drawn from the train range)
and returns the user's request, prefixed with the system prompt when the row's prompt has no
system message; each tool method steps the tracegym environment and returns the tool message's
text (errors read `Error: ...`, as in tracegym; an answer tool such as `send_reply` ends the
episode). The model's last plain assistant message is the final answer: TRL's `get_reward()`
takes no arguments and cannot see it, so the reward is the reward function `verifier_reward`,
which gives that answer to the environment and returns the verifier's reward (an episode whose
last message is still a tool call, cut by `max_completion_length` or
`max_tool_calling_iterations`, is scored as out of steps). The class defines no `get_reward`, so
TRL adds no second reward column. The environment's episode is what is scored: when TRL drops a
tool result that would overflow `max_completion_length`, the call has already run and counts.

Use `trl_dataset`: GRPO compares the `num_generations` rollouts of one row, and only the row's
seed makes them the same task (without a dataset TRL sends empty rows and each rollout draws its
own task). Nothing here imports TRL; `trl_dataset` needs `datasets` (which TRL depends on).
"""

from __future__ import annotations

import copy
import inspect
import json
import keyword
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tracegym.synthesis.base import Environment, Verdict

RESERVED = ("reset", "get_reward")  # TRL's own names on an environment class
_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
    "array": list,
    "null": type(None),
}


def _hint(schema: Mapping[str, Any]) -> Any:
    """The Python type hint transformers turns back into (the type part of) `schema`."""
    kind = schema.get("type")
    if isinstance(kind, list):
        hints = [_hint({**schema, "type": k}) for k in kind]
        out = hints[0]
        for h in hints[1:]:
            out = out | h
        return out
    if kind == "array":
        items = schema.get("items")
        return list[_hint(items)] if isinstance(items, Mapping) and items.get("type") else list
    if kind == "object" and isinstance(schema.get("additionalProperties"), Mapping):
        return dict[str, _hint(schema["additionalProperties"])]
    return _TYPES.get(kind, Any) if isinstance(kind, str) else Any


def _one_line(text: str) -> str:
    # the docstring parser splits arguments at `name:` lines and sections at `Args:`/`Returns:`
    return re.sub(r"\b(Args|Returns|Raises):", r"\1 -", " ".join(str(text).split()))


def _argument_doc(name: str, schema: Mapping[str, Any]) -> str:
    parts = [_one_line(schema.get("description") or f"The {name}.")]
    if schema.get("pattern"):
        parts.append(f"Format: {schema['pattern']}")
    items = schema.get("items")
    if isinstance(items, Mapping) and items.get("pattern"):
        parts.append(f"Each item's format: {items['pattern']}")
    if isinstance(items, Mapping) and items.get("properties"):
        parts.append(f"Items: {json.dumps(items, ensure_ascii=False)}")
    if schema.get("enum"):
        parts.append(f"(choices: {json.dumps(list(schema['enum']), ensure_ascii=False)})")
    return " ".join(parts)


def tool_method(schema: Mapping[str, Any]) -> Callable[..., str]:
    """A method standing for one OpenAI-format tool schema: `get_json_schema` of it gives the
    tool's name, description, argument names, types, required ones and enums back."""
    function = schema.get("function", schema)
    name = function["name"]
    parameters = function.get("parameters") or {}
    properties: Mapping[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ValueError(f"tool {name!r} cannot be a method name, so TRL cannot call it")
    bad = [a for a in properties if not a.isidentifier() or keyword.iskeyword(a)]
    if bad:
        raise ValueError(f"tool {name}: argument {bad[0]!r} cannot be a Python keyword argument")

    def method(self: TRLEnvironment, **arguments: Any) -> str:
        return self._call(name, arguments)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for arg, arg_schema in properties.items():
        default = inspect.Parameter.empty if arg in required else None
        annotations[arg] = hint = _hint(arg_schema)
        params.append(
            inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint)
        )
    annotations["return"] = str
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    lines = [_one_line(function.get("description") or f"The {name} tool."), ""]
    if properties:
        lines += ["Args:", *(f"    {a}: {_argument_doc(a, s)}" for a, s in properties.items()), ""]
    lines += ["Returns:", "    The tool's result as text; errors start with 'Error:'."]
    method.__doc__ = "\n".join(lines)
    return method


def _answer(completion: Any) -> str | None:
    """The final answer in a TRL completion: its last message when that is plain assistant text,
    None when the rollout stopped on a tool call or a tool result."""
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    last = completion[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    content = last.get("content") or ""
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return content


class TRLEnvironment:
    """Base class of the classes `trl_environment_factory` makes. Its own helpers are private
    (TRL takes every public method for a tool)."""

    _make_env: Callable[[], Environment]

    def __init__(self) -> None:
        self._env = self._make_env()
        self._rng = random.Random()
        self._verdict: Verdict | None = None

    def reset(self, seed: int | None = None, prompt: Any = None, **row: Any) -> str:
        """Start task `seed` (the row's, else a random train seed); the request for the model."""
        env = self._env
        if seed is None:
            start, stop = env.spec.train_seeds if env.spec else (0, 10_000)
            seed = self._rng.randrange(start, stop)
        observation, info = env.reset(seed=int(seed))
        self._verdict = None
        text = observation["content"]
        has_system = isinstance(prompt, list) and any(
            isinstance(m, Mapping) and m.get("role") == "system" for m in prompt
        )
        if info.get("system_prompt") and not has_system:
            text = f"{info['system_prompt']}\n\n{text}"
        return text

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._verdict is not None or self._env.episode is None:
            raise RuntimeError("the episode is over: no more tool calls")
        observation, _, terminated, truncated, info = self._env.step(
            {"name": name, "arguments": arguments}
        )
        if terminated or truncated:
            self._verdict = Verdict(**info["verdict"])
        return observation["content"]

    def _score(self, completion: Any) -> Verdict:
        """The verdict of this rollout, giving the completion's final answer first."""
        if self._verdict is None:
            episode = self._env.episode
            if episode is None:
                raise RuntimeError("reset() was never called")
            answer = _answer(completion)
            if answer is None:  # the rollout was cut before a final answer
                episode.truncated = True
                self._verdict = self._env.verify(episode)
            else:
                _, _, _, _, info = self._env.step({"answer": answer})
                self._verdict = Verdict(**info["verdict"])
        return self._verdict


def trl_environment_factory(
    env: Environment | Callable[[], Environment],
) -> type[TRLEnvironment]:
    """A class for `GRPOTrainer(environment_factory=...)`: one method per tool of `env` (each
    instance runs its own copy of `env`, or what a zero-argument callable returns)."""
    make: Callable[[], Environment]
    if isinstance(env, Environment):
        template = env

        def make() -> Environment:
            return copy.deepcopy(template)
    else:
        make = env
    probe = make()
    namespace: dict[str, Any] = {
        "_make_env": staticmethod(make),
        "__doc__": f"The tools of tracegym environment {probe.env_id} for TRL.",
    }
    for schema in probe.tool_schemas():
        method = tool_method(schema)
        name = method.__name__
        if name in RESERVED or hasattr(TRLEnvironment, name) or name in namespace:
            raise ValueError(f"tool {name!r} clashes with a name TRL or the adapter reserves")
        namespace[name] = method
    title = "".join(p.capitalize() for p in re.split(r"[^0-9A-Za-z]+", probe.env_id) if p)
    return type(f"{title or 'Tracegym'}TRLEnv", (TRLEnvironment,), namespace)


def verifier_reward(
    completions: Sequence[Any],
    environments: Sequence[TRLEnvironment] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    log_extra: Callable[[str, list[Any]], None] | None = None,
    **kwargs: Any,
) -> list[float]:
    """TRL reward function: each rollout's verdict from its environment (see the module
    docstring); logs the pass rate as `tracegym/passed` and each verdict's reasons."""
    if environments is None:
        raise ValueError("verifier_reward needs GRPOTrainer(environment_factory=...)")
    verdicts = [e._score(c) for c, e in zip(completions, environments, strict=True)]
    if log_metric is not None and verdicts:
        log_metric("tracegym/passed", sum(v.passed for v in verdicts) / len(verdicts))
    if log_extra is not None:
        log_extra("tracegym_reasons", ["; ".join(v.reasons) for v in verdicts])
    return [v.reward for v in verdicts]


def trl_dataset(
    env: Environment,
    n: int | None = None,
    split: str = "train",
    seeds: Sequence[int] | None = None,
) -> Any:
    """A `datasets.Dataset` of tasks: `prompt` (the system prompt, then an empty user message
    that `reset` fills) and `seed` (which `reset` receives), for `n` seeds of `split` (or the
    given `seeds`)."""
    from datasets import Dataset

    if seeds is None:
        if env.spec is not None:
            start, stop = env.spec.train_seeds if split == "train" else env.spec.heldout_seeds
        else:
            start, stop = (0, 10_000)
        seeds = range(start, stop if n is None else min(stop, start + n))
    rows: dict[str, list[Any]] = {"prompt": [], "seed": []}
    for seed in seeds:
        task = env.make_task(int(seed))
        prompt = [{"role": "user", "content": ""}]
        if task.system_prompt:
            prompt.insert(0, {"role": "system", "content": task.system_prompt})
        rows["prompt"].append(prompt)
        rows["seed"].append(int(seed))
    return Dataset.from_dict(rows)


__all__ = [
    "TRLEnvironment",
    "tool_method",
    "trl_dataset",
    "trl_environment_factory",
    "verifier_reward",
]
