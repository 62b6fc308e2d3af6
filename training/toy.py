"""A small, learnable environment for tests, docs and benchmarks.

`PressEnv`: "Ticket XXXXXX: please press the COLOR button." The agent must call
`press(color=COLOR)` (no other colour) and then reply `done`. A random model never solves it; a
tiny model learns it from the oracle's demonstrations in a few hundred LoRA steps.

    from tracegym.training.toy import press_env
    env = press_env()                     # EnvironmentSpec'd, so it registers like any other

`PickEnv`: "Ticket XXXXXX: which button? The COLOR one." The agent replies with the colour, in one
short message and no tool call. It is the GRPO test's environment: an episode is a few tokens (so
a test can sample hundreds of them in seconds) and its graded reward has no trap: naming the right
colour scores 1.0, a wrong colour, several colours or none score the same 0.87 (an empty reply
0.6), so the only way up is the right colour. (In PressEnv, answering `done` without pressing
scores 0.8 and a wrong press 0.7: a policy that is still guessing colours does better by pressing
nothing, and that is what GRPO learns there from a weak start.)
"""

from __future__ import annotations

import random
from typing import Any

from tracegym.synthesis.base import Environment, Task
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import EnvironmentSpec
from tracegym.synthesis.world import ToolError

COLORS = ("red", "blue", "green", "yellow")
SYSTEM = "You operate a button panel. Press the button the ticket asks for, then reply done."


class _ColorEnv(Environment):
    """A ticket naming one of the first `colors` colours (what both toy tasks draw)."""

    max_steps = 1

    def default_knobs(self) -> dict[str, Any]:
        return {"colors": len(COLORS), "max_steps": self.max_steps}

    def draw(self, seed: int) -> tuple[random.Random, tuple[str, ...], str]:
        rng = random.Random(seed)
        colors = COLORS[: int(self.knobs["colors"])]
        return rng, colors, rng.choice(colors)


class PressEnv(_ColorEnv):
    family = "toy_press"
    max_steps = 3

    def generate(self, seed: int) -> Task:
        rng, colors, color = self.draw(seed)
        return Task(
            seed=seed,
            instruction=f"Ticket {rng.getrandbits(24):06x}: please press the {color} button.",
            state={"pressed": []},
            goal=Goal(
                required_calls=[{"name": "press", "arguments": {"color": color}}],
                forbidden_calls=[
                    {"name": "press", "arguments": {"color": c}} for c in colors if c != color
                ],
                answer_includes=["done"],
                answer_excludes=["not done"],
            ),
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


PICK_SYSTEM = "Reply with the colour of the button the ticket names, and nothing else."


class PickEnv(_ColorEnv):
    family = "toy_pick"

    def generate(self, seed: int) -> Task:
        rng, colors, color = self.draw(seed)
        return Task(
            seed=seed,
            instruction=f"Ticket {rng.getrandbits(24):06x}: which button? The {color} one.",
            state={},
            goal=Goal(
                answer_includes=[color],
                answer_excludes=[c for c in colors if c != color],
            ),
            oracle=[{"answer": color}],
            max_steps=int(self.knobs["max_steps"]),
            system_prompt=PICK_SYSTEM,
            meta={"color": color},
        )

    def call_tool(self, state: dict[str, Any], name: str, arguments: Any) -> Any:
        raise ToolError(f"there are no tools (called {name!r})", invalid=True)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    def extra_checks(self, episode: Any) -> list[dict[str, Any]]:
        """Exactly one colour named: without it a reply naming no colour (0.92) would beat a
        wrong one (0.84), and a policy unsure of the colour would learn to name none."""
        answer = (episode.answer or "").casefold()
        named = [c for c in COLORS if c in answer]
        ok = len(named) == 1
        detail = "names one colour" if ok else f"names {len(named)} colours"
        return [{"name": "one_colour", "part": "communication", "ok": ok, "detail": detail}]


def pick_env(env_id: str = "toy-pick", **knobs: Any) -> PickEnv:
    spec = EnvironmentSpec(
        env_id=env_id,
        family=PickEnv.family,
        entry_point="tracegym.training.toy:PickEnv",
        gap={"id": env_id, "name": "names the wrong button", "description": PICK_SYSTEM},
        description=PICK_SYSTEM,
    )
    return PickEnv(spec, **knobs)


__all__ = ["COLORS", "PickEnv", "PressEnv", "pick_env", "press_env", "press_spec"]
