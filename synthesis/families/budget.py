"""The `budget` family: the main request within the step budget, despite side requests."""

from __future__ import annotations

from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.synthesis.base import Action, Task
from tracegym.synthesis.families.chain import (
    ChainEnvironment,
)
from tracegym.synthesis.goal import Goal

_NOT_LOOKUPS = ("think", "calculate", "compute")


class BudgetEnv(ChainEnvironment):
    family = "budget"
    capability = "Finish the main request within the step budget; side requests come last."
    detectors = (dn.BUDGET_WASTE,)

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": 2, "distractors": 2, "slack": 1}

    def levels(self) -> list[dict[str, Any]]:
        base = dict(self.knobs)
        return [
            {**base, "targets": t, "distractors": d, "slack": s}
            for t, d, s in (
                (1, 1, 3),
                (1, 2, 2),
                (2, 2, 1),
                (2, 3, 1),
                (3, 3, 0),
                (3, 4, 0),
                (4, 5, 0),
            )
        ]

    def _side_reads(self) -> list[str]:
        """Other reads a side request may ask for: those that take the record's own id (a
        request to look an order up with a product lookup would mean nothing)."""
        r = self.roles
        formats = {f["regex"] for f in self.action_schema.arguments[r.id_arg].formats}
        out = []
        for name in r.others:
            tool = self.catalog.tools[name]
            if not tool.read or len(tool.required) != 1 or name.lower().startswith(_NOT_LOOKUPS):
                continue
            arg = tool.arguments[tool.required[0]]
            if arg.name == r.id_arg or formats & {f["regex"] for f in arg.formats}:
                out.append(name)
        return out

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n, d = int(k["targets"]), int(k["distractors"])
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + d)
        r = self.roles
        oracle: list[Action] = self.owner_chain(ctx) if ctx.needs_owner else []
        goal = Goal(required_calls=[], answer_includes=[], forbidden_calls=[])
        done, refused = [], []
        for t in ctx.targets:
            oracle.append(self.lookup_call(t, ctx))
            if self.allowed(ctx, t):
                oracle.append(self.action_call(ctx, t))
                goal.required_calls.append(self.action_call(ctx, t))
                done.append(t)
            else:
                goal.forbidden_calls.append({"name": r.action, "arguments": {r.id_arg: t}})
                refused.append(t)
            goal.answer_includes.append(t)
        for other in ctx.entities[n:]:
            goal.forbidden_calls.append({"name": r.action, "arguments": {r.id_arg: other}})
        oracle.append({"answer": self.answer(ctx, done, refused)})
        side = []
        others = self._side_reads()
        for i, other in enumerate(ctx.entities[n:]):
            what = f"({i + 1}) tell me everything about {r.entity_noun} {other}"
            if others:
                what += f" and look it up with {others[i % len(others)]} too"
            side.append(what)
        instruction = (
            f"Hi. {self.identity(ctx) if ctx.needs_owner else ''}"
            f"{self.request(ctx, ctx.targets)}"
            + (f" Also, if you have time: {'; '.join(side)}." if side else "")
        )
        # the budget counts the calls the agent's own conventions add
        instruction, goal, oracle, _ = self.follow_conventions(ctx, instruction, goal, oracle)
        budget = sum(1 for a in oracle if "name" in a) + int(k["slack"])
        # the budget is the world's rule and is said; how to spend it is what the task trains
        prompt = (
            f"You have a budget of {budget} tool calls for this conversation, all of them "
            f"counted; at the limit the conversation ends. {self.status_rule_text()}"
        )
        return self.build_task(
            seed, ctx, instruction, goal, oracle, max_steps=budget + 1, prompt=prompt.strip()
        )
