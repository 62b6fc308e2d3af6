"""The `grounding` family: ids and values taken from lookups, never guessed."""

from __future__ import annotations

from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.gap import Gap
from tracegym.synthesis.base import Task
from tracegym.synthesis.families.chain import (
    ChainEnvironment,
)
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import Catalog
from tracegym.synthesis.world import (
    NotSynthesizable,
    Roles,
)


class GroundingEnv(ChainEnvironment):
    family = "grounding"
    capability = "Resolve ids and values through lookups instead of guessing them."
    detectors = (dn.UNGROUNDED_ARGUMENT,)

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": 1, "distractors": 2, "slack": 8}

    def levels(self) -> list[dict[str, Any]]:
        base = dict(self.knobs)
        return [
            {**base, "targets": t, "distractors": d}
            for t, d in ((1, 1), (1, 2), (1, 3), (2, 3), (2, 4), (3, 5), (4, 6))
        ]

    @classmethod
    def requirements(cls, roles: Roles, catalog: Catalog, gap: Gap) -> None:
        super().requirements(roles, catalog, gap)
        if not roles.owner and not any(s["source"] == "lookup" for s in roles.extras.values()):
            raise NotSynthesizable(
                f"nothing to ground: no recorded tool lists {roles.entity_noun} ids for a user "
                f"to pick from, and {roles.action} takes no value from the "
                f"{roles.entity_noun}'s record"
            )
        if roles.owner and not roles.label_path:
            raise NotSynthesizable(
                f"{roles.lookup}'s records have no name-like field a user could describe a "
                f"{roles.entity_noun} by"
            )

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n = int(k["targets"])
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + int(k["distractors"]))
        r = self.roles
        by_label = bool(r.owner)
        oracle = self.owner_chain(ctx) if (by_label or ctx.needs_owner) else []
        goal = Goal(
            required_calls=[],
            grounded=True,
            answer_includes=[],
            forbidden_calls=[],
        )
        for t in ctx.targets:
            oracle += [self.lookup_call(t, ctx), self.action_call(ctx, t)]
            goal.required_calls.append(self.action_call(ctx, t))
            goal.answer_includes.append(t)
        for other in ctx.entities[len(ctx.targets) :]:
            goal.forbidden_calls.append({"name": r.action, "arguments": {r.id_arg: other}})
        oracle.append({"answer": self.answer(ctx, ctx.targets, [])})
        if by_label:
            instruction = f"Hi. {self.identity(ctx)}{self.request(ctx, ctx.targets, 'label')}"
        else:
            who = self.identity(ctx) if ctx.needs_owner else ""
            instruction = f"Hi. {who}{self.request(ctx, ctx.targets)}"
        # where the ids come from is what the task trains: the prompt does not say
        return self.build_task(seed, ctx, instruction, goal, oracle)
