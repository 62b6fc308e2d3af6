"""The `exact_arguments` family: ids, amounts and lists in the exact recorded format."""

from __future__ import annotations

from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.gap import Gap
from tracegym.synthesis.base import Action, Task
from tracegym.synthesis.families.chain import (
    ChainEnvironment,
    human,
    join_and,
)
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import Catalog
from tracegym.synthesis.world import (
    NotSynthesizable,
    Roles,
    loosen,
    money,
)


class ExactArgumentsEnv(ChainEnvironment):
    family = "exact_arguments"
    capability = "Pass ids, amounts and lists exactly in the format the tool expects."
    detectors = (dn.INVALID_INVOCATION,)
    strict_formats = True

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": 1, "distractors": 0, "loose": 1, "max_invalid": 0, "slack": 4}

    def levels(self) -> list[dict[str, Any]]:
        base = dict(self.knobs)
        return [
            {**base, "targets": t, "loose": lo}
            for t, lo in ((1, 0), (1, 1), (2, 1), (2, 2), (3, 2), (4, 2), (5, 2))
        ]

    @classmethod
    def requirements(cls, roles: Roles, catalog: Catalog, gap: Gap) -> None:
        schema = catalog.tools[roles.action]
        exact = [
            a
            for a in schema.arguments.values()
            if a.required and (a.formats or a.type in ("number", "integer", "array"))
        ]
        if not exact:
            raise NotSynthesizable(
                f"{roles.action}'s arguments have no recorded format, "
                "amount or list to get exactly right"
            )

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n = int(k["targets"])
        ctx = self.world_ctx(
            seed, n_targets=n, n_entities=n + int(k.get("distractors", 0)), user_extras=True
        )
        r = self.roles
        loose = int(k.get("loose", 1))
        rng = ctx.rng
        goal = Goal(
            required_calls=[],
            answer_includes=[],
            max_invalid=int(k.get("max_invalid", 0)),
        )
        oracle: list[Action] = []
        said: dict[str, str] = {}
        for t in ctx.targets:
            call = ctx.calls[t]
            said[t] = loosen(t, rng) if loose >= 1 else t
            phrases = []
            for name, value in call.items():
                if name == r.id_arg:
                    continue
                arg = self.action_schema.arguments[name]
                if isinstance(value, float) and loose >= 2:
                    shown = money(value, rng)
                elif isinstance(value, list) and loose >= 1:
                    shown = join_and(
                        [loosen(v, rng) if isinstance(v, str) else str(v) for v in value]
                    )
                elif isinstance(value, str) and arg.formats and loose >= 2:
                    shown = loosen(value, rng)
                else:
                    shown = self._say(value)
                phrases.append(f"{human(name)}: {shown}")
            ctx.phrases[t] = phrases
            oracle.append(self.action_call(ctx, t))
            goal.required_calls.append(self.action_call(ctx, t))
            goal.answer_includes.append(t)
        oracle.append({"answer": self.answer(ctx, ctx.targets, [])})
        instruction = f"Hi. {self.request(ctx, ctx.targets, ids=said)}"
        # the tools' own schemas carry the formats; writing ids in them is what is trained
        prompt = "Invalid tool calls count against you."
        return self.build_task(seed, ctx, instruction, goal, oracle, prompt=prompt)
