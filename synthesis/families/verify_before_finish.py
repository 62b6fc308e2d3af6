"""The `verify_before_finish` family: check that a write took effect before finishing."""

from __future__ import annotations

from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.synthesis.base import Action, Task
from tracegym.synthesis.families.chain import (
    ChainEnvironment,
)
from tracegym.synthesis.spec import EnvironmentSpec
from tracegym.synthesis.world import (
    synthetic_status,
)


class VerifyBeforeFinishEnv(ChainEnvironment):
    family = "verify_before_finish"
    capability = "Check that a write took effect (and redo it if not) before finishing."
    detectors = (dn.PREMATURE_FINISH,)
    needs_status = True

    def __init__(self, spec: EnvironmentSpec, **knobs: Any) -> None:
        super().__init__(spec, **knobs)
        status = self.roles.status
        if status and status["after"] in status["allowed"]:
            self.roles.status = synthetic_status(self.roles)
            self.world.roles = self.roles

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": 1, "distractors": 1, "silent": 1, "slack": 6}

    def levels(self) -> list[dict[str, Any]]:
        base = dict(self.knobs)
        return [
            {**base, "targets": t, "distractors": d, "silent": s}
            for t, d, s in (
                (1, 0, 0),
                (1, 1, 1),
                (2, 1, 1),
                (2, 2, 2),
                (3, 2, 2),
                (4, 3, 3),
                (5, 4, 4),
            )
        ]

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n = int(k["targets"])
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + int(k["distractors"]))
        r = self.roles
        status = ctx.state["_status"]
        silent = ctx.state["_silent"]
        for t in ctx.rng.sample(ctx.targets, min(int(k.get("silent", 0)), n)):
            silent[t] = 1
        oracle: list[Action] = self.owner_chain(ctx) if ctx.needs_owner else []
        goal: dict[str, Any] = {"required_calls": [], "verify_after": [], "answer_includes": []}
        for t in ctx.targets:
            check = self.lookup_call(t)
            oracle += [check, self.action_call(ctx, t), check]
            if silent.get(t):
                oracle += [self.action_call(ctx, t), check]
            goal["required_calls"].append(self.action_call(ctx, t))
            goal["verify_after"].append([check, {"name": r.action, "arguments": {r.id_arg: t}}])
            goal["answer_includes"] += [t, status["after"]]
        oracle.append({"answer": self.answer(ctx, ctx.targets, [])})
        instruction = (
            f"Hi. {self.identity(ctx) if ctx.needs_owner else ''}"
            f"{self.request(ctx, ctx.targets)} Please confirm the new status."
        )
        prompt = (
            f"{r.action} may report success without the change being saved. After "
            f"each {r.action}, check the {r.entity_noun} with {r.lookup}; if the "
            f"{status['field']} did not change, do it again. Tell the user the status "
            "you verified."
        )
        return self.build_task(seed, ctx, instruction, goal, oracle, prompt=prompt)
