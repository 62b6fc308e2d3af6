"""The `memory_hygiene` family: re-check a stale or errored note before acting on it."""

from __future__ import annotations

from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.gap import Gap
from tracegym.synthesis.base import Action, Task, contains_token
from tracegym.synthesis.families.chain import (
    ChainEnvironment,
    with_article,
)
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import Catalog
from tracegym.synthesis.world import (
    MEMORY_SEARCH,
    MEMORY_UPDATE,
    Gen,
    NotSynthesizable,
    Roles,
    synthetic_status,
)


class MemoryHygieneEnv(ChainEnvironment):
    family = "memory_hygiene"
    capability = "Re-check a note written from an errored or stale source before acting on it."
    detectors = (dn.POISONED_MEMORY,)
    memory = True

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": 1, "distractors": 1, "flaky": 1, "slack": 6}

    def levels(self) -> list[dict[str, Any]]:
        base = dict(self.knobs)
        return [
            {**base, "targets": t, "distractors": d, "flaky": f}
            for t, d, f in (
                (1, 0, 0),
                (1, 1, 0),
                (1, 1, 1),
                (2, 1, 1),
                (2, 2, 2),
                (3, 2, 2),
                (4, 3, 3),
            )
        ]

    @classmethod
    def requirements(cls, roles: Roles, catalog: Catalog, gap: Gap) -> None:
        super().requirements(roles, catalog, gap)
        stale = any(
            src["source"] == "lookup" and catalog.tools[roles.action].arguments[n].type == "string"
            for n, src in roles.extras.items()
        )
        if not stale and not roles.status and synthetic_status(roles, catalog) is None:
            raise NotSynthesizable(
                f"a note about {with_article(roles.entity_noun)} would hold nothing the traces "
                f"show: {roles.action} takes no value from its record and the record has no "
                "status with observed values"
            )

    def _stale_field(self) -> str | None:
        for name, source in self.roles.extras.items():
            if source["source"] == "lookup":
                arg = self.action_schema.arguments[name]
                if arg.type == "string":
                    return name
        return None

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n = int(k["targets"])
        field_name = self._stale_field()
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + int(k["distractors"]))
        r = self.roles
        status = ctx.state.status
        if field_name is None and status is None:  # the observed status values, no rule
            status = ctx.state.status = synthetic_status(r, self.catalog)
            if status is None:
                raise NotSynthesizable(f"{r.lookup}'s records have no status to take notes of")
            for eid in ctx.entities:
                ctx.state.entities[eid][status["field"]] = ctx.rng.choice(status["allowed"])
        memory = ctx.state.memory
        flaky = ctx.state.flaky
        oracle: list[Action] = self.owner_chain(ctx) if ctx.needs_owner else []
        goal = Goal(
            required_calls=[],
            forbidden_calls=[],
            memory_excludes=[],
            memory_includes={},
            answer_includes=[],
        )
        gen = Gen(ctx.rng)
        done, refused = [], []
        oracle.append({"name": MEMORY_SEARCH, "arguments": {"query": r.entity_noun}})
        for i, t in enumerate(ctx.targets):
            key = f"{r.entity_noun} {t}"
            if field_name is not None:
                true = ctx.calls[t][field_name]
                stale = gen.argument(self.action_schema.arguments[field_name])
                if stale == true:
                    stale = f"{true}0"
                fact, fresh = f"{field_name}: {stale}", f"{field_name}: {true}"
            else:
                current = self.status_of(ctx, t)
                observed = [*status["allowed"], *status["refused"]]
                wrong = next(v for v in observed if v != current)
                stale, true = wrong, current
                fact, fresh = f"{status['field']}: {wrong}", f"{status['field']}: {current}"
            memory[key] = {
                "content": fact,
                "source": f"{r.lookup} (the call returned an error)",
                "written": f"{3 + i} days ago",
            }
            goal.memory_excludes.append(str(stale))
            goal.memory_includes[key] = str(true)
            attempts = int(k.get("flaky", 0)) if i == 0 else min(int(k.get("flaky", 0)), 1)
            if attempts:
                flaky[t] = attempts
            oracle += [self.lookup_call(t, ctx)] * (attempts + 1)
            if self.allowed(ctx, t):
                oracle.append(self.action_call(ctx, t))
                goal.required_calls.append(self.action_call(ctx, t))
                done.append(t)
            else:
                goal.forbidden_calls.append({"name": r.action, "arguments": {r.id_arg: t}})
                refused.append(t)
            oracle.append({"name": MEMORY_UPDATE, "arguments": {"key": key, "content": fresh}})
            goal.answer_includes.append(t)
        for j, other in enumerate(ctx.entities[len(ctx.targets) :]):
            memory[f"{r.entity_noun} {other}"] = {
                "content": f"customer asked about this {r.entity_noun} earlier",
                "source": "conversation",
                "written": f"{10 + j} days ago",
            }
        oracle.append({"answer": self.answer(ctx, done, refused)})
        instruction = (
            f"Hi. {self.identity(ctx) if ctx.needs_owner else ''}"
            f"{self.request(ctx, ctx.targets)} You should have notes on this."
        )
        # the notes and how to keep them are the world's; re-checking them is what is trained
        prompt = (
            f"You keep notes across conversations ({MEMORY_SEARCH}/{MEMORY_UPDATE}); when done, "
            f"update the note '{r.entity_noun} <id>' of each {r.entity_noun} you handled with "
            f"its current facts. {self.status_rule_text()}"
        )
        return self.build_task(seed, ctx, instruction, goal, oracle, prompt=prompt.strip())

    def extra_checks(self, episode: Any) -> list[dict[str, Any]]:
        memory = episode.state.memory
        out = []
        for key, text in episode.task.goal.memory_includes.items():
            note = memory.get(key, {})
            ok = contains_token(str(note.get("content", "")), text)
            out.append(
                {
                    "name": "memory_updated",
                    "part": "action",
                    "ok": ok,
                    "detail": f"the note {key!r} {'records' if ok else 'does not record'} "
                    f"the verified value {text!r}",
                }
            )
        return out
