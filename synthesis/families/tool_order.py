"""The `tool_order` family: the prerequisite call successful runs always make, then the act."""

from __future__ import annotations

import random
from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.gap import Gap
from tracegym.synthesis.base import Action, Task
from tracegym.synthesis.families.chain import (
    ChainEnvironment,
    Ctx,
)
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import Catalog
from tracegym.synthesis.world import (
    Gen,
    NotSynthesizable,
    Roles,
    canonical,
    get_all,
    path_tokens,
)


class ToolOrderEnv(ChainEnvironment):
    family = "tool_order"
    capability = "Call the prerequisite tool the successful runs always call first, then act."
    detectors = (dn.WRONG_TOOL_ORDER,)

    def default_knobs(self) -> dict[str, Any]:
        # two records, one of which must be left alone: calling every tool cannot pass
        return {"targets": 2, "distractors": 1, "refused": 1, "slack": 6, "guard": False}

    def levels(self) -> list[dict[str, Any]]:
        base = dict(self.knobs)
        return [
            {**base, "targets": t, "distractors": d, "refused": f}
            for t, d, f in (
                (1, 0, 0),
                (1, 1, 0),
                (2, 1, 1),
                (2, 2, 1),
                (3, 2, 1),
                (4, 3, 2),
                (5, 4, 2),
            )
        ]

    @classmethod
    def pair(cls, key: str) -> tuple[str, str] | None:
        """The (before, after) tools of a `wrong_tool_order:before>after` key."""
        detail = key.split(":", 1)[1] if ":" in key else key
        if ">" in detail:
            before, after = (s.strip() for s in detail.split(">", 1))
            return before, after
        return None

    @classmethod
    def choose_action(cls, gap: Gap, catalog: Catalog) -> tuple[str, list[str], str]:
        pair = cls.pair(gap.key)
        if pair and pair[1] in catalog.tools and not catalog.tools[pair[1]].read:
            tools = [t for t in gap.tools if t in catalog.tools]
            tools += [t for t in pair if t in catalog.tools and t not in tools]
            return pair[1], tools, f"{pair[1]}: the action of the mined rule {pair[0]} > {pair[1]}"
        action, tools, note = super().choose_action(gap, catalog)
        if pair:
            tools = [*tools, *(t for t in pair if t in catalog.tools and t not in tools)]
        return action, tools, note

    @classmethod
    def requirements(cls, roles: Roles, catalog: Catalog, gap: Gap) -> None:
        super().requirements(roles, catalog, gap)
        pair = cls.pair(gap.key)
        if pair:
            missing = [t for t in pair if t not in catalog.tools]
            if missing:
                raise NotSynthesizable(
                    f"no recorded calls of {', '.join(missing)}: their schemas are unknown"
                )

    def _prereq(self) -> tuple[str, str]:
        """The (before, after) pair the verifier enforces: the gap's mined rule when both tools
        are in this world, else lookup before action."""
        pair = ToolOrderEnv.pair(str(self.spec.gap.get("key") or "")) if self.spec else None
        if pair and all(t in self.world.schemas for t in pair) and pair[0] != pair[1]:
            return pair
        return (self.roles.lookup or "", self.roles.action)

    def _pattern(self, ctx: Ctx, tool: str, eid: str) -> dict[str, Any]:
        r = self.roles
        if tool == r.lookup:
            return {"name": tool, "arguments": {r.lookup_arg: eid}}
        if tool == r.action:
            return {"name": tool, "arguments": {r.id_arg: eid}}
        if tool == r.owner:
            return {"name": tool, "arguments": {r.owner_arg: ctx.owner_id}}
        return {"name": tool}

    def _side_call(self, ctx: Ctx, tool: str, eid: str) -> tuple[Action, dict[str, Any]]:
        """A call of a tool outside the chain, with arguments from the record where the traces
        say they come from (`get_product_details(product_id=<items[*].product_id>)`), else
        generated; and the pattern the order rule checks (only the record-derived arguments:
        nobody can be expected to reproduce a generated `thought`)."""
        r = self.roles
        schema = self.catalog.tools[tool]
        gen = Gen(random.Random(f"side:{ctx.state.seed}:{eid}"))
        args: dict[str, Any] = {}
        pinned: dict[str, Any] = {}
        for name in schema.required:
            found: list[Any] = []
            for flow in self.catalog.flows_into(tool, name):
                if flow.source == r.lookup:
                    found = get_all(ctx.state.entities[eid], path_tokens(flow.path))
                elif flow.source == r.owner and ctx.owner_id is not None:
                    found = get_all(ctx.state.owners[ctx.owner_id], path_tokens(flow.path))
                if found:
                    break
            if found:
                args[name] = pinned[name] = found[0]
            else:
                args[name] = gen.argument(schema.arguments[name])
        pattern = {"name": tool, "arguments": pinned} if pinned else {"name": tool}
        return {"name": tool, "arguments": args}, pattern

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n = int(k["targets"])
        ctx = self.world_ctx(
            seed,
            n_targets=n,
            n_entities=n + int(k["distractors"]),
            refused=int(k.get("refused", 0)),
        )
        before, after = self._prereq()
        r = self.roles
        chain = {r.lookup, r.action, r.owner, r.finder}
        in_owner_chain = bool({before, after} & {r.owner, r.finder} - {None})
        by_label = in_owner_chain and bool(r.label_path) and bool(ctx.labels)
        oracle: list[Action] = self.owner_chain(ctx) if (ctx.needs_owner or in_owner_chain) else []
        goal = Goal(
            required_calls=[],
            forbidden_calls=[],
            order=[],
            answer_includes=[],
        )
        done, refused = [], []
        afters: set[str] = set()
        for t in ctx.targets:
            oracle.append(self.lookup_call(t, ctx))
            side: dict[str, Action] = {}
            for tool in (before, after):
                if tool not in chain:
                    call, side[tool] = self._side_call(ctx, tool, t)
                    oracle.append(call)
            if self.allowed(ctx, t):
                oracle.append(self.action_call(ctx, t))
                goal.required_calls.append(self.action_call(ctx, t))
                done.append(t)
            else:
                goal.forbidden_calls.append({"name": r.action, "arguments": {r.id_arg: t}})
                goal.answer_includes.append(str(self.status_of(ctx, t)))
                refused.append(t)
            rule = [side.get(tool) or self._pattern(ctx, tool, t) for tool in (before, after)]
            # one rule per distinct `after` call: its first occurrence must follow `before`
            if (after != r.action or t in done) and canonical(rule[1]) not in afters:
                afters.add(canonical(rule[1]))
                goal.order.append((rule[0], rule[1]))
            goal.answer_includes.append(t)
        oracle.append({"answer": self.answer(ctx, done, refused)})
        who = self.identity(ctx) if (ctx.needs_owner or in_owner_chain) else ""
        instruction = f"Hi. {who}{self.request(ctx, ctx.targets, 'label' if by_label else 'id')}"
        # the order is what the task trains: learnt from the verifier, never told
        return self.build_task(seed, ctx, instruction, goal, oracle, prompt=self.status_rule_text())
