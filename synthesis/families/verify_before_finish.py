"""The `verify_before_finish` family: check that a write took effect before finishing."""

from __future__ import annotations

from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.gap import Gap
from tracegym.synthesis.base import Action, Task
from tracegym.synthesis.families.chain import (
    ChainEnvironment,
    Ctx,
    human,
    write_effects,
)
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import Catalog
from tracegym.synthesis.world import Roles


class VerifyBeforeFinishEnv(ChainEnvironment):
    family = "verify_before_finish"
    capability = "Check that a write took effect (and redo it if not) before finishing."
    detectors = (dn.PREMATURE_FINISH,)

    @classmethod
    def requirements(cls, roles: Roles, catalog: Catalog, gap: Gap) -> None:
        """A lookup after the write must show whether it took effect: the traces must show
        what the write changes."""
        super().requirements(roles, catalog, gap)
        cls.require_effects(roles, catalog)

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

    def _shown(self, ctx: Ctx, t: str, changes: bool) -> list[str]:
        """The values a lookup shows once the write took effect, which the answer must report."""
        status = ctx.state.status
        if changes and status:
            return [str(status["after"])]
        call = ctx.calls[t]
        return [str(call[name]) for name in self.world.sets if name in call]

    def answer(self, ctx: Ctx, done: list[str], refused: list[str]) -> str:
        text = super().answer(ctx, done, refused)
        shown = [
            f"{human(name)} now {self._say(ctx.calls[t][name])} for {self.roles.entity_noun} {t}"
            for t in done
            for name in self.world.sets
            if name in ctx.calls[t]
        ]
        return text[:-1] + "; " + "; ".join(shown) + "." if shown else text

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n = int(k["targets"])
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + int(k["distractors"]))
        r = self.roles
        changes, _ = write_effects(r, self.catalog)
        silent = ctx.state.silent
        for t in ctx.rng.sample(ctx.targets, min(int(k.get("silent", 0)), n)):
            silent[t] = 1
        oracle: list[Action] = self.owner_chain(ctx) if ctx.needs_owner else []
        goal = Goal(required_calls=[], verify_after=[], answer_includes=[])
        for t in ctx.targets:
            check = self.lookup_call(t, ctx)
            oracle += [check, self.action_call(ctx, t), check]
            if silent.get(t):
                oracle += [self.action_call(ctx, t), check]
            goal.required_calls.append(self.action_call(ctx, t))
            goal.verify_after.append((check, {"name": r.action, "arguments": {r.id_arg: t}}))
            goal.answer_includes += [t, *self._shown(ctx, t, changes)]
        oracle.append({"answer": self.answer(ctx, ctx.targets, [])})
        confirm = "the new status" if changes else "that the change went through"
        instruction = (
            f"Hi. {self.identity(ctx) if ctx.needs_owner else ''}"
            f"{self.request(ctx, ctx.targets)} Please confirm {confirm}."
        )
        # that a write can report success without saving is what the task trains: not said
        return self.build_task(seed, ctx, instruction, goal, oracle)
