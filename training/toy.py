"""A small, learnable environment for tests, docs and benchmarks.

`PressEnv`: "Ticket XXXXXX: please press the COLOR button." The agent must call
`press(color=COLOR)` (no other colour) and then reply `done`. A random model never solves it; a
tiny model learns it from the oracle's demonstrations in a few hundred LoRA steps.

    from tracegym.training.toy import press_env
    env = press_env()                     # EnvironmentSpec'd, so it registers like any other
"""

from __future__ import annotations

import random
from typing import Any

from tracegym.synthesis.base import Environment, Task
from tracegym.synthesis.spec import EnvironmentSpec
from tracegym.synthesis.world import ToolError

COLORS = ("red", "blue", "green", "yellow")
SYSTEM = "You operate a button panel. Press the button the ticket asks for, then reply done."


class PressEnv(Environment):
    family = "toy_press"

    def default_knobs(self) -> dict[str, Any]:
        return {"colors": len(COLORS), "max_steps": 3}

    def generate(self, seed: int) -> Task:
        rng = random.Random(seed)
        colors = COLORS[: int(self.knobs["colors"])]
        color = rng.choice(colors)
        return Task(
            seed=seed,
            instruction=f"Ticket {rng.getrandbits(24):06x}: please press the {color} button.",
            state={"pressed": []},
            goal={
                "required_calls": [{"name": "press", "arguments": {"color": color}}],
                "forbidden_calls": [
                    {"name": "press", "arguments": {"color": c}} for c in colors if c != color
                ],
                "answer_includes": ["done"],
                "answer_excludes": ["not done"],
            },
            oracle=[{"name": "press", "arguments": {"color": color}}, {"answer": "done"}],
            max_steps=int(self.knobs["max_steps"]),
            system_prompt=SYSTEM,
            meta={"color": color},
        )

    def call_tool(self, state: dict[str, Any], name: str, arguments: Any) -> Any:
        if name != "press":
            raise ToolError(f"unknown tool {name!r}", invalid=True)
        if not isinstance(arguments, dict) or arguments.get("color") not in COLORS:
            raise ToolError("press needs a color: one of " + ", ".join(COLORS), invalid=True)
        state["pressed"].append(arguments["color"])
        return "ok"

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": "press",
                    "description": "press a button",
                    "parameters": {
                        "type": "object",
                        "properties": {"color": {"type": "string", "enum": list(COLORS)}},
                        "required": ["color"],
                    },
                },
            }
        ]


def press_spec(
    env_id: str = "toy-press", gap_name: str = "presses the wrong button"
) -> EnvironmentSpec:
    return EnvironmentSpec(
        env_id=env_id,
        family=PressEnv.family,
        entry_point="tracegym.training.toy:PressEnv",
        gap={"id": env_id, "name": gap_name, "description": "press the button the ticket names"},
        description="Press the button the ticket asks for, then reply done.",
    )


def press_env(env_id: str = "toy-press", **knobs: Any) -> PressEnv:
    return PressEnv(press_spec(env_id), **knobs)


__all__ = ["COLORS", "PressEnv", "press_env", "press_spec"]
