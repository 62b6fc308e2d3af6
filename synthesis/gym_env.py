"""Every tracegym environment as a real `gymnasium.Env` (install `tracegym[gym]`).

    from tracegym.synthesis.gym_env import to_gymnasium, register_envs
    env = to_gymnasium(registry.load(home, env_id))      # or, by id:
    register_envs(home)                                   # ids "tracegym/<env_id>"
    env = gymnasium.make("tracegym/tool_order-0c7b2237d0")
    obs, info = env.reset(seed=7)                         # obs: '{"role": "user", "content": ...}'
    obs, reward, terminated, truncated, info = env.step(
        json.dumps({"name": "get_order_details", "arguments": {"order_id": "#W4203818"}})
    )

Why text spaces: an observation is a chat message and an action a tool call or an answer, both
of any length and shape, so both spaces are `gymnasium.spaces.Text` over printable ASCII:

- observation: the tracegym message (`{"role": "user"|"tool", "name"?, "content"}`) as JSON
  written with `ensure_ascii=True` (so every character is in the space; `json.loads` gives the
  exact text back), at most `OBSERVATION_MAX` characters;
- action: JSON text of `{"name", "arguments"}` (a tool call) or `{"answer": text}`; text that is
  not JSON is the final answer, as in tracegym's own `Environment.step`. Dicts are accepted too
  (they are not in the space, but spare a `json.dumps`). At most `ACTION_MAX` characters.

`reset(seed=n)` seeds `np_random` and runs task `n` (the same task as tracegym's
`env.reset(seed=n)` and line `n` of `tasks_train.jsonl`); `reset()` draws the task seed from
`np_random` within the split's range: `options={"split": "heldout"}` for the held-out seeds. `info`
is tracegym's (system prompt and tool schemas on reset, the verdict at the end); the reward is 0
until the episode ends, then the verifier's. `render_mode="ansi"` renders the transcript.

Vector envs: `gymnasium.vector.SyncVectorEnv` as is; `AsyncVectorEnv(..., shared_memory=False)`
(a Text space's shared-memory buffer is `OBSERVATION_MAX` characters per env and pads strings).

gymnasium is imported on first use, so this module imports without it.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any, ClassVar

from tracegym.synthesis.base import Environment

OBSERVATION_MAX = 1 << 20
ACTION_MAX = 1 << 14
CHARSET = "".join(chr(c) for c in range(32, 127))  # printable ASCII: what ensure_ascii JSON uses
SPLITS = ("train", "heldout")


def _gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError as exc:
        raise ImportError(
            "tracegym's gymnasium environments need gymnasium: pip install 'tracegym[gym]'"
        ) from exc
    return gymnasium


def _encode(message: dict[str, Any]) -> str:
    return json.dumps(message, ensure_ascii=True)


@functools.cache
def gym_class() -> type:
    """The `gymnasium.Env` subclass wrapping a tracegym `Environment` (built on first use)."""
    gym = _gymnasium()
    from gymnasium import spaces

    class GymEnvironment(gym.Env):
        """A tracegym `Environment` behind gymnasium's API (see the module docstring)."""

        metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}

        def __init__(self, env: Environment, render_mode: str | None = None) -> None:
            if render_mode is not None and render_mode not in self.metadata["render_modes"]:
                raise ValueError(f"render_mode {render_mode!r} is not one of ['ansi', None]")
            self.tracegym_env = env
            self.render_mode = render_mode
            self.observation_space = spaces.Text(OBSERVATION_MAX, min_length=2, charset=CHARSET)
            self.action_space = spaces.Text(ACTION_MAX, min_length=0, charset=CHARSET)

        def _seed_range(self, split: str) -> tuple[int, int]:
            spec = self.tracegym_env.spec
            if split not in SPLITS:
                raise ValueError(f"options['split'] must be one of {SPLITS}, got {split!r}")
            if spec is None:
                return (0, 10_000)
            start, stop = spec.train_seeds if split == "train" else spec.heldout_seeds
            return int(start), int(stop)

        def reset(
            self, *, seed: int | None = None, options: dict[str, Any] | None = None
        ) -> tuple[str, dict[str, Any]]:
            super().reset(seed=seed)
            if seed is None:
                start, stop = self._seed_range((options or {}).get("split", "train"))
                seed = int(self.np_random.integers(start, stop))
            observation, info = self.tracegym_env.reset(seed=int(seed))
            return _encode(observation), copy.deepcopy(info)

        def step(self, action: str | dict[str, Any]) -> tuple[str, float, bool, bool, dict]:
            observation, reward, terminated, truncated, info = self.tracegym_env.step(action)
            return (
                _encode(observation),
                float(reward),
                bool(terminated),
                bool(truncated),
                copy.deepcopy(info),
            )

        def render(self) -> str | None:
            if self.render_mode != "ansi":
                return None
            episode = self.tracegym_env.episode
            if episode is None:
                return ""
            lines = []
            for message in episode.messages():
                if message.get("tool_calls"):
                    call = message["tool_calls"][0]["function"]
                    lines.append(f"assistant: {call['name']}({call['arguments']})")
                else:
                    lines.append(f"{message['role']}: {message['content']}")
            return "\n".join(lines) + "\n"

        def __repr__(self) -> str:
            return f"<GymEnvironment {self.tracegym_env.env_id}>"

    GymEnvironment.__qualname__ = "GymEnvironment"  # picklable: found via the module __getattr__
    return GymEnvironment


def to_gymnasium(env: Environment, render_mode: str | None = None) -> Any:
    """`env` as a `gymnasium.Env` (its `tracegym_env` attribute is `env` itself)."""
    return gym_class()(env, render_mode=render_mode)


def make(home: str, env_id: str, render_mode: str | None = None, **knobs: Any) -> Any:
    """The registered environment `env_id` under `home`, as a `gymnasium.Env`."""
    from tracegym.synthesis import registry

    return to_gymnasium(registry.load(home, env_id, **knobs), render_mode=render_mode)


def register_envs(home: str | Path, namespace: str = "tracegym") -> list[str]:
    """Register every environment under `home` with gymnasium as `<namespace>/<env_id>`, so
    `gymnasium.make(id)` loads it; returns the ids."""
    gym = _gymnasium()
    from tracegym.synthesis import registry

    ids = []
    for item in registry.list_envs(home):
        gym_id = f"{namespace}/{item.env_id}"
        kwargs = {"home": str(home), "env_id": item.env_id}
        known = gym.registry.get(gym_id)
        if known is None or known.kwargs != kwargs:
            gym.register(id=gym_id, entry_point=f"{__name__}:make", kwargs=kwargs)
        ids.append(gym_id)
    return ids


def __getattr__(name: str) -> Any:
    if name == "GymEnvironment":
        return gym_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ACTION_MAX", "OBSERVATION_MAX", "gym_class", "make", "register_envs", "to_gymnasium"]
