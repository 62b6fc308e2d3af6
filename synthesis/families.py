"""Task-template families: one capability each, instantiated with the gap's own tools.

| family               | trains                                             | from detector        |
|----------------------|----------------------------------------------------|----------------------|
| tool_order           | the mined prerequisite call before the action      | wrong_tool_order     |
| grounding            | ids and values taken from lookups, never guessed   | ungrounded_argument  |
| memory_hygiene       | re-checking a stale/errored note before using it   | poisoned_memory      |
| budget               | the main request within the step budget, despite   | budget_waste         |
|                      | distractor side requests                           |                      |
| verify_before_finish | checking that a write took effect before finishing | premature_finish     |
| exact_arguments      | ids, amounts, lists in the exact recorded format   | invalid_invocation   |
| requested_action     | calling the tool the user asked for, in the users' | unserved_request     |
|                      | own wording (needs no recorded call of it)         |                      |

Every family runs on the same simulated backend (`world.py`): the user asks for the gap's write
tool (the *action*) on one or more records; lookups return records generated from the recorded
result shapes; what differs is what the user says, the backend's quirks (a flaky lookup, a write
that silently does not apply, strict formats, a tight budget) and what the verifier requires.
`family_for_gap(gap)` picks the family from the gap's detector; `build_spec(gap, catalog)` turns
a gap into an `EnvironmentSpec` or raises `NotSynthesizable` with the reason.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.gap import Gap, GapError, as_gap
from tracegym.analysis.tool_kinds import is_read_tool
from tracegym.synthesis.base import Action, Environment, Task, contains_token
from tracegym.synthesis.conventions import Conventions
from tracegym.synthesis.spec import ArgSchema, Catalog, EnvironmentSpec, is_id_name
from tracegym.synthesis.wording import Wording, WordingError, learn_wording
from tracegym.synthesis.world import (
    LABEL_NAMES,
    MEMORY_SEARCH,
    MEMORY_UPDATE,
    Gen,
    NotSynthesizable,
    Roles,
    ToolError,
    ToolWorld,
    WorldBuilder,
    canonical,
    clone,
    get_all,
    infer_roles,
    is_wordlike,
    loosen,
    money,
    path_tokens,
    shape_at,
    sibling_descriptor,
    synthetic_status,
)

SYSTEM_PROMPT = (
    "You are a customer-support agent. Use the tools to look records up and to act on them. "
    "Never guess an id or a value: take it from the user's message or from a tool result. "
    "Act only on what the user asked for. When you are done, give the user one short final "
    "answer that names every record you handled and what happened to it."
)


def human(name: str) -> str:
    """`payment_method_id` -> `payment method`, `item_ids` -> `items`."""
    plural = bool(re.search(r"(_ids|Ids)$", name))
    text = re.sub(r"(_ids?|Ids?|ID)$", "", name).replace("_", " ").strip() or name
    return text + "s" if plural and not text.endswith("s") else text


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _and(items: list[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


@dataclass
class Ctx:
    """One generated world and what the user wants done in it."""

    rng: random.Random
    state: dict[str, Any]
    owner_id: str | None
    attrs: dict[str, Any]
    entities: list[str]
    targets: list[str]
    labels: dict[str, str]
    calls: dict[str, dict[str, Any]]  # target -> the exact arguments of the action
    phrases: dict[str, list[str]]  # target -> how the user describes the other arguments
    needs_owner: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class ChainEnvironment(Environment):
    """Shared machinery: roles, world generation, oracle chains, instruction phrasing."""

    family = "chain"
    capability = ""
    detectors: tuple[str, ...] = ()
    needs_status = False
    memory = False
    strict_formats = False
    mode = "id"  # how the user names the records: "id" or "label" (via their own identity)

    def __init__(self, spec: EnvironmentSpec, **knobs: Any) -> None:
        super().__init__(spec, **knobs)
        self.catalog = spec.catalog
        self.roles = Roles.from_dict(spec.roles)
        wants_status = self.needs_status or int(self.knobs.get("refused", 0)) > 0
        if wants_status and not self.roles.status:
            self.roles.status = synthetic_status(self.roles)
        self.world = ToolWorld(
            self.catalog, self.roles, memory=self.memory, strict_formats=self.strict_formats
        )
        self.answer_tool, self.answer_arg = self.roles.answer_tool, self.roles.answer_arg
        self.conventions = Conventions.from_dict(spec.extra.get("conventions"))
        self._schemas = self._as_recorded(self.world.json_schemas())
        self.action_schema = self.catalog.tools[self.roles.action]

    def _as_recorded(self, schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The agent's own definitions (and order) for the tools it recorded them for."""
        if not self.conventions.tools:
            return schemas
        order = {
            str(t.get("function", t).get("name")): i for i, t in enumerate(self.conventions.tools)
        }
        out = [self.conventions.tool_definition(s["function"]["name"]) or s for s in schemas]
        return sorted(out, key=lambda s: order.get(s["function"]["name"], len(order)))

    # Environment hooks ---------------------------------------------------------------------
    def fork_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The backend only replaces top-level fields of records, notes and counters, and
        appends writes: copying those levels is enough (and much cheaper than a deep copy)."""
        out = dict(state)
        for key in ("entities", "owners"):
            out[key] = {k: dict(v) for k, v in state[key].items()}
        for key in ("memory", "_flaky", "_silent"):
            out[key] = dict(state[key])
        out["writes"] = list(state["writes"])
        return out

    def call_tool(self, state: dict[str, Any], name: str, arguments: Any) -> Any:
        return self.world.call(state, name, arguments)

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._schemas

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": 1, "distractors": 1, "slack": 6}

    def levels(self) -> list[dict[str, Any]]:
        base = {k: v for k, v in self.knobs.items()}
        return [
            {**base, "targets": t, "distractors": d}
            for t, d in ((1, 0), (1, 1), (2, 1), (2, 2), (3, 2), (3, 3), (4, 4))
        ]

    # Spec construction ---------------------------------------------------------------------
    @classmethod
    def requirements(cls, roles: Roles, catalog: Catalog, gap: Gap) -> None:
        """Raise NotSynthesizable when the roles cannot express this family's tasks."""
        if roles.lookup is None:
            raise NotSynthesizable(
                f"no recorded read tool returns the record {roles.action} acts on "
                f"(none takes {roles.id_arg}), so there is nothing to look up first"
            )

    @classmethod
    def choose_action(cls, gap: Gap, catalog: Catalog) -> tuple[str, list[str], str]:
        """The write tool the tasks ask for, other gap tools to keep callable, and a note on
        the choice: the gap's own write tool when it fits, else the most used one that does."""
        tools = [t for t in gap.tools if t in catalog.tools]
        for pattern in gap.argument_patterns:
            name = pattern.split("(", 1)[0].strip()
            if name in catalog.tools and name not in tools:
                tools.append(name)
        writes = [t for t in tools if not catalog.tools[t].read and not _answer(t)]
        why = []
        for name in writes:
            try:
                infer_roles(catalog, name)
            except NotSynthesizable as exc:
                why.append(str(exc))
                continue
            return name, tools, f"{name}: the gap's own write tool"
        candidates = [t for t in catalog.tools.values() if not t.read and not _answer(t.name)]
        for tool in sorted(candidates, key=lambda t: (-t.calls, t.name)):
            if tool.name in writes:
                continue
            try:
                infer_roles(catalog, tool.name)
            except NotSynthesizable as exc:
                why.append(str(exc))
                continue
            reason = f" ({'; '.join(why)})" if why else ""
            own = "no write tool of the gap fits" if writes else "the gap names no write tool"
            return tool.name, tools, f"{tool.name}: the most used recorded write; {own}{reason}"
        raise NotSynthesizable(
            "no recorded write tool fits" + (f" ({'; '.join(why[:3])})" if why else "")
        )

    @classmethod
    def build_spec(
        cls, gap: Gap, catalog: Catalog, conventions: Conventions | None = None
    ) -> EnvironmentSpec:
        action, extra_tools, note = cls.choose_action(gap, catalog)
        roles = infer_roles(catalog, action, extra_tools=extra_tools)
        cls.requirements(roles, catalog, gap)
        gap_id = gap.id
        env_id = f"{cls.family}-{gap_id.removeprefix('gap-')}"
        used = {
            n
            for n in (
                roles.action,
                roles.lookup,
                roles.owner,
                roles.finder,
                roles.answer_tool,
                *roles.others,
            )
            if n
        }
        spec = EnvironmentSpec(
            env_id=env_id,
            family=cls.family,
            entry_point=f"{cls.__module__}:{cls.__name__}",
            gap=gap.summary(),
            catalog=catalog.subset(used),
            roles=roles.to_dict(),
            description=f"{cls.capability} Action: {action}; lookup: {roles.lookup}"
            + (f"; owner: {roles.owner}" if roles.owner else "")
            + (f"; finder: {roles.finder}" if roles.finder else "")
            + ".",
            extra={"action_choice": note},
        )
        if conventions is not None and conventions.runs:
            spec.extra["conventions"] = conventions.to_dict()
        spec.knobs = cls(spec).knobs
        return spec

    # World generation ----------------------------------------------------------------------
    def world_ctx(
        self,
        seed: int,
        *,
        n_targets: int,
        n_entities: int,
        refused: int = 0,
        user_extras: bool = False,
    ) -> Ctx:
        """Owner, entities and the target calls for one task."""
        rng = random.Random(f"{self.family}:{seed}")
        r = self.roles
        mined = bool(r.status and r.status.get("mined"))
        status = r.status if (self.needs_status or refused or mined) else None
        builder = WorldBuilder(self.catalog, r, rng, status)
        gen = builder.gen
        owner_id, attrs = None, {}
        if r.owner:
            owner_id = builder.new_id(self.catalog.tools[r.owner].arguments.get(r.owner_arg))
            finder = self.catalog.tools.get(r.finder) if r.finder else None
            if finder:
                attrs = {a: gen.argument(finder.arguments[a]) for a in finder.required}
            else:
                attrs = {r.owner_arg: owner_id}
        entities = [
            builder.new_id(self.action_schema.arguments[r.id_arg]) for _ in range(n_entities)
        ]
        targets = entities[:n_targets]
        refused_set = set(rng.sample(targets, min(refused, len(targets))))
        extras = {} if user_extras else r.extras
        # entity records, with the values the action's other arguments come from
        records: dict[str, dict[str, Any]] = {}
        for eid in entities:
            plants = [
                (
                    src["path"],
                    self._sibling_values(
                        builder,
                        self.action_schema.arguments[name],
                        builder.lookup_shape,
                        src["path"],
                    ),
                )
                for name, src in extras.items()
                if src["source"] in ("lookup", "record")
            ]
            value = None
            if status:
                refuse = eid in refused_set or (eid not in targets and rng.random() < 0.5)
                value = rng.choice(status["refused"]) if refuse else status["allowed"][0]
            records[eid] = builder.entity(eid, owner_id, value, plants)
        # the owner's record, listing the entities (and e.g. its payment methods)
        owners: dict[str, Any] = {}
        needs_owner = False
        if r.owner and owner_id is not None:
            shape = self.catalog.tools[r.owner].result
            record = builder.owner(owner_id, entities, records, attrs)
            for name, src in extras.items():
                if src["source"] == "owner":
                    values = self._sibling_values(
                        builder, self.action_schema.arguments[name], shape, src["path"]
                    )
                    record = builder.plant(record, src["path"], values, shape)
                    needs_owner = True
            owners[owner_id] = record
        # what the user wants: exact arguments, and how the user describes them
        calls: dict[str, dict[str, Any]] = {t: {r.id_arg: t} for t in targets}
        phrases: dict[str, list[str]] = {t: [] for t in targets}
        for t in targets:
            for name, src in r.extras.items():
                arg = self.action_schema.arguments[name]
                if user_extras or src["source"] == "user":
                    value = gen.argument(arg)
                    calls[t][name] = value
                    phrases[t].append(f"{human(name)}: {self._say(value)}")
                    continue
                where, record = (
                    ("account", owners[owner_id])
                    if src["source"] == "owner"
                    else (r.entity_noun, records[t])
                )
                chosen = self._choose(rng, arg, get_all(record, path_tokens(src["path"])))
                calls[t][name] = chosen
                phrases[t].append(self._phrase(name, record, src["path"], chosen, where))
        labels = {}
        if r.label_path:
            for eid in entities:
                found = get_all(records[eid], path_tokens(r.label_path))
                if found:
                    labels[eid] = found[0]
        state = {
            "owners": owners,
            "entities": records,
            "memory": {},
            "writes": [],
            "_finder": {owner_id: attrs} if owner_id is not None else {},
            "_flaky": {},
            "_silent": {},
            "_seed": seed,
            "_status": status,
            "_guard": bool(self.knobs.get("guard", False)),
        }
        return Ctx(
            rng, state, owner_id, attrs, entities, targets, labels, calls, phrases, needs_owner
        )

    def _sibling_values(
        self, builder: WorldBuilder, arg: ArgSchema, shape: Mapping[str, Any], path: str
    ) -> list[Any]:
        tokens = path_tokens(path)
        fan = next((i for i, t in enumerate(tokens) if t in ("[*]", "{*}")), None)
        count = 1
        if fan is not None:
            element = shape_at(shape, tokens[: fan + 1])
            labelled = any(
                k in LABEL_NAMES and v.get("type") == "string"
                for k, v in element.get("properties", {}).items()
            )
            if labelled:
                count = 2 + min(int(self.knobs.get("distractors", 1)), 2)
            if arg.type == "array" and count < 2:
                count = 2
        make = (
            (lambda: builder.new_id(arg))
            if (arg.formats or arg.type == "string")
            else (lambda: builder.gen.argument(arg))
        )
        return [make() for _ in range(count)]

    @staticmethod
    def _choose(rng: random.Random, arg: ArgSchema, values: list[Any]) -> Any:
        if not values:
            return [] if arg.type == "array" else None
        if arg.type == "array":
            k = 1 if len(values) < 3 else rng.randint(1, 2)
            picked = rng.sample(values, k)
            return [v for v in values if v in picked]
        return rng.choice(values)

    def _phrase(self, name: str, record: Any, path: str, chosen: Any, where: str) -> str:
        values = chosen if isinstance(chosen, list) else [chosen]
        descs = [sibling_descriptor(record, path, v) for v in values]
        tokens = path_tokens(path)
        fan = next((i for i, t in enumerate(tokens) if t in ("[*]", "{*}")), None)
        siblings = len(get_all(record, tokens[: fan + 1])) if fan is not None else 1
        if siblings > 1 and all(descs):
            return f"{human(name)}: {_and(descs)}"  # type: ignore[arg-type]
        if siblings == 1 or fan is None:
            return f"{human(name)}: the one on the {where}'s record"
        return f"{human(name)}: {self._say(chosen)}"

    @staticmethod
    def _say(value: Any) -> str:
        if isinstance(value, list):
            return _and([str(v) for v in value])
        return str(value)

    # Phrasing and oracle helpers -----------------------------------------------------------
    def identity(self, ctx: Ctx) -> str:
        if not ctx.attrs:
            return ""
        parts = [f"{human(k)} {v}" for k, v in ctx.attrs.items()]
        return f"I'm the customer with {_and(parts)}. "

    def request(
        self, ctx: Ctx, targets: list[str], how: str = "id", ids: Mapping[str, str] | None = None
    ) -> str:
        verb = human(self.roles.action)
        noun = self.roles.entity_noun
        # "refund order" + "order ORD-1" -> "refund order ORD-1"; else "... for order ORD-1"
        joined = verb.endswith(noun)
        out = []
        for i, t in enumerate(targets):
            if how == "label":
                what = f"my {noun} with the {ctx.labels[t]}"
            else:
                what = f"{noun} {(ids or {}).get(t, t)}"
            if joined and i == 0 and how != "label":
                what = what[len(noun) + 1 :]
            extra = f" ({'; '.join(ctx.phrases[t])})" if ctx.phrases[t] else ""
            out.append(f"{what}{extra}")
        if joined and how != "label":
            return f"Please {verb} {_and(out)}."
        return f"Please {verb} for {_and(out)}."

    def lookup_call(self, eid: str) -> Action:
        return {"name": self.roles.lookup, "arguments": {self.roles.lookup_arg: eid}}

    def action_call(self, ctx: Ctx, eid: str) -> Action:
        return {"name": self.roles.action, "arguments": dict(ctx.calls[eid])}

    def owner_chain(self, ctx: Ctx) -> list[Action]:
        r = self.roles
        chain: list[Action] = []
        if r.finder:
            chain.append({"name": r.finder, "arguments": dict(ctx.attrs)})
        if r.owner:
            chain.append({"name": r.owner, "arguments": {r.owner_arg: ctx.owner_id}})
        return chain

    def status_of(self, ctx: Ctx, eid: str) -> Any:
        status = ctx.state["_status"]
        return ctx.state["entities"][eid].get(status["field"]) if status else None

    def allowed(self, ctx: Ctx, eid: str) -> bool:
        status = ctx.state["_status"]
        return status is None or self.status_of(ctx, eid) in status["allowed"]

    def answer(self, ctx: Ctx, done: list[str], refused: list[str]) -> str:
        noun = self.roles.entity_noun
        status = ctx.state["_status"]
        parts = []
        for t in done:
            after = f" (status now {status['after']})" if status else ""
            parts.append(f"{human(self.roles.action)} done for {noun} {t}{after}")
        for t in refused:
            parts.append(f"{noun} {t} was left unchanged: its status is {self.status_of(ctx, t)}")
        return "; ".join(parts) + "."

    def build_task(
        self,
        seed: int,
        ctx: Ctx,
        instruction: str,
        goal: dict[str, Any],
        oracle: list[Action],
        max_steps: int | None = None,
        prompt: str = "",
    ) -> Task:
        instruction, goal, oracle, added = self.follow_conventions(ctx, instruction, goal, oracle)
        calls = sum(1 for a in oracle if "name" in a)
        if max_steps is not None:
            max_steps += added
        steps = max_steps if max_steps is not None else calls + int(self.knobs.get("slack", 6))
        system = self.conventions.system_prompt or SYSTEM_PROMPT
        system += " " + prompt if prompt else ""
        if self.answer_tool:
            system += f" Give the final answer by calling {self.answer_tool}."
        return Task(
            seed=seed,
            instruction=instruction,
            state=ctx.state,
            goal=goal,
            oracle=oracle,
            max_steps=steps,
            system_prompt=system,
            meta={"targets": ctx.targets, "knobs": dict(self.knobs)},
        )

    def follow_conventions(
        self, ctx: Ctx, instruction: str, goal: dict[str, Any], oracle: list[Action]
    ) -> tuple[str, dict[str, Any], list[Action], int]:
        """The task as the agent's successful runs would do it: its opening calls first (the user
        says who they are), and the read it makes before each write on the same record. Returns
        the instruction, goal and oracle, and how many calls were added."""
        conv = self.conventions
        oracle = list(oracle)
        added = 0
        r = self.roles
        chain = {c["name"]: c for c in self.owner_chain(ctx)}
        opening: list[Action] = []
        for name in conv.opening:  # the part of the agent's opening this world can answer
            if name not in chain:
                break
            opening.append(dict(chain[name]))
        if opening:
            names = [c["name"] for c in opening]
            if [a.get("name") for a in oracle[: len(opening)]] != names:
                oracle = opening + oracle
                added += len(opening)
            said = self.identity(ctx)
            if said and not all(str(v) in instruction for v in ctx.attrs.values()):
                instruction = said + instruction
            goal = {**goal, "opening": names}
        lookup = conv.lookups.get(r.action)
        if lookup and lookup == r.lookup:
            out: list[Action] = []
            order = list(goal.get("order", []))
            for action in oracle:
                eid = (action.get("arguments") or {}).get(r.id_arg)
                if action.get("name") == r.action and isinstance(eid, str):
                    read = self.lookup_call(eid)
                    if not any(a.get("name") == lookup and a == read for a in out):
                        out.append(read)
                        added += 1
                    pair = [read, {"name": r.action, "arguments": {r.id_arg: eid}}]
                    if pair not in order:
                        order.append(pair)
                out.append(action)
            oracle = out
            goal = {**goal, "order": order}
        return instruction, goal, oracle, added

    def status_rule_text(self) -> str:
        status = self.roles.status
        if not status:
            return ""
        return (
            f"Call {self.roles.action} only for {_a(self.roles.entity_noun)} whose "
            f"{status['field']} is {_and(status['allowed'])}; otherwise leave it unchanged "
            "and tell the user why."
        )


def _answer(name: str) -> bool:
    from tracegym.analysis.tool_kinds import is_answer_tool

    return is_answer_tool(name)


# The families -----------------------------------------------------------------------------------
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
        gen = Gen(random.Random(f"side:{ctx.state['_seed']}:{eid}"))
        args: dict[str, Any] = {}
        pinned: dict[str, Any] = {}
        for name in schema.required:
            found: list[Any] = []
            for flow in self.catalog.flows_into(tool, name):
                if flow.source == r.lookup:
                    found = get_all(ctx.state["entities"][eid], path_tokens(flow.path))
                elif flow.source == r.owner and ctx.owner_id is not None:
                    found = get_all(ctx.state["owners"][ctx.owner_id], path_tokens(flow.path))
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
        goal: dict[str, Any] = {
            "required_calls": [],
            "forbidden_calls": [],
            "order": [],
            "answer_includes": [],
        }
        done, refused = [], []
        afters: set[str] = set()
        for t in ctx.targets:
            oracle.append(self.lookup_call(t))
            side: dict[str, Action] = {}
            for tool in (before, after):
                if tool not in chain:
                    call, side[tool] = self._side_call(ctx, tool, t)
                    oracle.append(call)
            if self.allowed(ctx, t):
                oracle.append(self.action_call(ctx, t))
                goal["required_calls"].append(self.action_call(ctx, t))
                done.append(t)
            else:
                goal["forbidden_calls"].append({"name": r.action, "arguments": {r.id_arg: t}})
                goal["answer_includes"].append(str(self.status_of(ctx, t)))
                refused.append(t)
            rule = [side.get(tool) or self._pattern(ctx, tool, t) for tool in (before, after)]
            # one rule per distinct `after` call: its first occurrence must follow `before`
            if (after != r.action or t in done) and canonical(rule[1]) not in afters:
                afters.add(canonical(rule[1]))
                goal["order"].append(rule)
            goal["answer_includes"].append(t)
        oracle.append({"answer": self.answer(ctx, done, refused)})
        who = self.identity(ctx) if (ctx.needs_owner or in_owner_chain) else ""
        instruction = f"Hi. {who}{self.request(ctx, ctx.targets, 'label' if by_label else 'id')}"
        rule = f"Always call {before} before {after}" + (
            f" for the same {r.entity_noun}." if before == r.lookup and after == r.action else "."
        )
        return self.build_task(
            seed, ctx, instruction, goal, oracle, prompt=f"{rule} {self.status_rule_text()}".strip()
        )


class GroundingEnv(ChainEnvironment):
    family = "grounding"
    capability = "Resolve ids and values through lookups instead of guessing them."
    detectors = (dn.UNGROUNDED_ARGUMENT, "wrong_assumption")

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
        goal: dict[str, Any] = {
            "required_calls": [],
            "grounded": True,
            "answer_includes": [],
            "forbidden_calls": [],
        }
        for t in ctx.targets:
            oracle += [self.lookup_call(t), self.action_call(ctx, t)]
            goal["required_calls"].append(self.action_call(ctx, t))
            goal["answer_includes"].append(t)
        for other in ctx.entities[len(ctx.targets) :]:
            goal["forbidden_calls"].append({"name": r.action, "arguments": {r.id_arg: other}})
        oracle.append({"answer": self.answer(ctx, ctx.targets, [])})
        if by_label:
            instruction = f"Hi. {self.identity(ctx)}{self.request(ctx, ctx.targets, 'label')}"
        else:
            who = self.identity(ctx) if ctx.needs_owner else ""
            instruction = f"Hi. {who}{self.request(ctx, ctx.targets)}"
        prompt = (
            (f"Find the user's {r.entity_noun}s with the tools; the user does not know the ids.")
            if by_label
            else ""
        )
        return self.build_task(seed, ctx, instruction, goal, oracle, prompt=prompt)


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

    def _stale_field(self) -> str | None:
        for name, source in self.roles.extras.items():
            if source["source"] in ("lookup", "record"):
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
        status = ctx.state["_status"]
        if field_name is None and status is None:
            status = ctx.state["_status"] = synthetic_status(r)
            for eid in ctx.entities:
                ctx.state["entities"][eid][status["field"]] = ctx.rng.choice(
                    [status["allowed"][0], *status["refused"]]
                )
        memory = ctx.state["memory"]
        flaky = ctx.state["_flaky"]
        oracle: list[Action] = self.owner_chain(ctx) if ctx.needs_owner else []
        goal: dict[str, Any] = {
            "required_calls": [],
            "forbidden_calls": [],
            "memory_excludes": [],
            "memory_includes": {},
            "answer_includes": [],
        }
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
                wrong = (
                    status["allowed"][0]
                    if current != status["allowed"][0]
                    else status["refused"][0]
                )
                stale, true = wrong, current
                fact, fresh = f"{status['field']}: {wrong}", f"{status['field']}: {current}"
            memory[key] = {
                "content": fact,
                "source": f"{r.lookup} (the call returned an error)",
                "written": f"{3 + i} days ago",
            }
            goal["memory_excludes"].append(str(stale))
            goal["memory_includes"][key] = str(true)
            attempts = int(k.get("flaky", 0)) if i == 0 else min(int(k.get("flaky", 0)), 1)
            if attempts:
                flaky[t] = attempts
            oracle += [self.lookup_call(t)] * (attempts + 1)
            if self.allowed(ctx, t):
                oracle.append(self.action_call(ctx, t))
                goal["required_calls"].append(self.action_call(ctx, t))
                done.append(t)
            else:
                goal["forbidden_calls"].append({"name": r.action, "arguments": {r.id_arg: t}})
                refused.append(t)
            oracle.append({"name": MEMORY_UPDATE, "arguments": {"key": key, "content": fresh}})
            goal["answer_includes"].append(t)
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
        prompt = (
            f"Your notes ({MEMORY_SEARCH}/{MEMORY_UPDATE}) may be stale or written from "
            "failed tool calls: check a note's facts with the tools before acting on "
            f"them, retry a lookup that errored, and when done update the note "
            f"('{r.entity_noun} <id>') with the facts you verified, never with a value "
            f"from a failed call. {self.status_rule_text()}"
        )
        return self.build_task(seed, ctx, instruction, goal, oracle, prompt=prompt.strip())

    def extra_checks(self, episode: Any) -> list[dict[str, Any]]:
        memory = episode.state.get("memory", {})
        out = []
        for key, text in episode.task.goal.get("memory_includes", {}).items():
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


class BudgetEnv(ChainEnvironment):
    family = "budget"
    capability = "Finish the main request within the step budget; side requests come last."
    detectors = (dn.BUDGET_WASTE, "budget_burn")

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

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n, d = int(k["targets"]), int(k["distractors"])
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + d)
        r = self.roles
        oracle: list[Action] = self.owner_chain(ctx) if ctx.needs_owner else []
        goal: dict[str, Any] = {"required_calls": [], "answer_includes": [], "forbidden_calls": []}
        done, refused = [], []
        for t in ctx.targets:
            oracle.append(self.lookup_call(t))
            if self.allowed(ctx, t):
                oracle.append(self.action_call(ctx, t))
                goal["required_calls"].append(self.action_call(ctx, t))
                done.append(t)
            else:
                goal["forbidden_calls"].append({"name": r.action, "arguments": {r.id_arg: t}})
                refused.append(t)
            goal["answer_includes"].append(t)
        for other in ctx.entities[n:]:
            goal["forbidden_calls"].append({"name": r.action, "arguments": {r.id_arg: other}})
        oracle.append({"answer": self.answer(ctx, done, refused)})
        side = []
        others = [
            o
            for o in r.others
            if self.catalog.tools[o].read
            and self.catalog.tools[o].required
            and not o.lower().startswith(("think", "calculate", "compute"))
        ]
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
        prompt = (
            f"You have a budget of {budget} tool calls for this conversation, all of them "
            "counted; at the limit the conversation ends. The user's main request comes "
            "first; side questions only if the budget allows. Do not repeat calls. "
            f"{self.status_rule_text()}"
        )
        return self.build_task(
            seed, ctx, instruction, goal, oracle, max_steps=budget + 1, prompt=prompt.strip()
        )


class VerifyBeforeFinishEnv(ChainEnvironment):
    family = "verify_before_finish"
    capability = "Check that a write took effect (and redo it if not) before finishing."
    detectors = (dn.PREMATURE_FINISH, "unverified_finish")
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
        goal: dict[str, Any] = {
            "required_calls": [],
            "answer_includes": [],
            "max_invalid": int(k.get("max_invalid", 0)),
        }
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
                    shown = _and([loosen(v, rng) if isinstance(v, str) else str(v) for v in value])
                elif isinstance(value, str) and arg.formats and loose >= 2:
                    shown = loosen(value, rng)
                else:
                    shown = self._say(value)
                phrases.append(f"{human(name)}: {shown}")
            ctx.phrases[t] = phrases
            oracle.append(self.action_call(ctx, t))
            goal["required_calls"].append(self.action_call(ctx, t))
            goal["answer_includes"].append(t)
        oracle.append({"answer": self.answer(ctx, ctx.targets, [])})
        instruction = f"Hi. {self.request(ctx, ctx.targets, ids=said)}"
        prompt = (
            "Tool arguments must match the tool's schema exactly (types, lists, and the "
            "id patterns given); write ids in that exact format. Invalid calls count "
            "against you."
        )
        return self.build_task(seed, ctx, instruction, goal, oracle, prompt=prompt)


class RequestedActionEnv(Environment):
    """Do what the user asks: find the user's record the way the agent always does, then call
    the tool that performs the requested action, with ids from the record and values from the
    request. For `unserved_request` gaps, where the agent never calls that tool at all.

    Unlike the chain families it needs no recorded call of the action: the tool's definition
    comes from the agent's conventions (`gen_ai.tool.definitions`), the wording of the request
    from the users' own requests (`Gap.requests`, see `synthesis.wording`), the record from
    the recorded result of the agent's opening call.
    """

    family = "requested_action"
    capability = "Do what the user asked for: call the tool that performs it."
    detectors = (dn.UNSERVED_REQUEST,)

    def __init__(self, spec: EnvironmentSpec, **knobs: Any) -> None:
        super().__init__(spec, **knobs)
        extra = spec.extra["requested"]
        self.catalog = spec.catalog
        self.conventions = Conventions.from_dict(spec.extra.get("conventions"))
        self.action: str = extra["action"]
        self.action_def: dict[str, Any] = extra["definition"]
        self.opening: str = extra["opening"]
        self.key_arg: str = extra["key_arg"]
        self.record_args: list[str] = extra["record_args"]
        self.user_args: list[str] = extra["user_args"]
        self.wording = Wording.from_dict(extra["wording"])
        self._arguments: dict[str, set[str]] | None = None

    def default_knobs(self) -> dict[str, Any]:
        return {"slack": 4}

    # Spec construction ---------------------------------------------------------------------
    @classmethod
    def build_spec(
        cls, gap: Gap, catalog: Catalog, conventions: Conventions | None = None
    ) -> EnvironmentSpec:
        conv = conventions or Conventions()
        key = gap.key
        if not key.startswith(f"{dn.UNSERVED_REQUEST}:"):
            raise NotSynthesizable(
                "the gap is not about one tool (its per-tool unserved_request gaps are)"
            )
        action = key.split(":", 1)[1]
        if is_read_tool(action) or _answer(action):
            raise NotSynthesizable(f"{action} is not a write tool the user asked for")
        if conv.lookups.get(action):
            raise NotSynthesizable(
                f"{action} acts on a record the agent looks up first ({conv.lookups[action]}); "
                "this family covers actions on the user's own record (the chain families cover "
                "the rest)"
            )
        definition = conv.tool_definition(action) or (
            catalog.tools[action].json_schema() if action in catalog.tools else None
        )
        if definition is None:
            raise NotSynthesizable(f"{action}'s definition is unknown (not recorded, never called)")
        params = definition.get("function", definition).get("parameters") or {}
        required = list(params.get("required") or list(params.get("properties") or {}))
        requests = gap.requests
        firsts = Counter(r.first_call.get("tool") for r in requests if r.first_call)
        opening = conv.opening[0] if conv.opening else (firsts.most_common(1) or [(None, 0)])[0][0]
        if not opening or opening not in catalog.tools:
            raise NotSynthesizable(
                "no recorded opening call finds the user's record (nothing to take ids from)"
            )
        opening_schema = catalog.tools[opening]
        if len(opening_schema.required) != 1:
            raise NotSynthesizable(f"{opening} does not take exactly one key argument")
        key_arg = opening_schema.required[0]
        shape = opening_schema.result
        fields = shape.get("properties", {}) if shape.get("type") == "object" else {}
        record_args = [a for a in required if a in fields]
        user_args = [a for a in required if a not in fields]
        looked_up = [
            (a, t.name)
            for a in user_args
            if is_id_name(a)
            for t in catalog.tools.values()
            if t.read and a in t.required and t.name != opening
        ]
        if looked_up:
            arg, read = looked_up[0]
            raise NotSynthesizable(
                f"{action} acts on a record the user names ({arg}) and {read} looks up: this "
                "family covers actions on the user's own record (the chain families cover the "
                "rest)"
            )
        said = []
        for r in requests:
            call = r.first_call or {}
            value = (
                (call.get("arguments") or {}).get(key_arg) if call.get("tool") == opening else None
            )
            said.append((r.text, value if isinstance(value, str) else None))
        try:
            wording = learn_wording(said)
        except WordingError as exc:
            raise NotSynthesizable(f"cannot learn how users ask for {action}: {exc}") from None
        if "identity" not in wording.slots:
            raise NotSynthesizable(f"the requests never state the {key_arg} {opening} needs")
        if wording.value_slots != len(user_args):
            raise NotSynthesizable(
                f"the requests vary in {wording.value_slots} place(s) but {action} takes "
                f"{len(user_args)} value(s) from the user ({', '.join(user_args) or 'none'})"
            )
        gap_id = gap.id
        tools = [opening] + [t for t in catalog.tools if t != opening]
        spec = EnvironmentSpec(
            env_id=f"{cls.family}-{gap_id.removeprefix('gap-')}",
            family=cls.family,
            entry_point=f"{cls.__module__}:{cls.__name__}",
            gap=gap.summary(),
            catalog=catalog.subset(tools),
            roles={"action": action, "lookup": opening},
            description=f"{cls.capability} Action: {action}; the record from {opening}.",
            extra={
                "requested": {
                    "action": action,
                    "definition": definition,
                    "opening": opening,
                    "key_arg": key_arg,
                    "record_args": record_args,
                    "user_args": user_args,
                    "wording": wording.to_dict(),
                },
            },
        )
        if conv.runs:
            spec.extra["conventions"] = conv.to_dict()
        spec.knobs = cls(spec).knobs
        return spec

    # Environment hooks ---------------------------------------------------------------------
    def tool_schemas(self) -> list[dict[str, Any]]:
        if self.conventions.tools:
            return [dict(t) for t in self.conventions.tools]
        schemas = [t.json_schema() for t in self.catalog.tools.values() if t.name != self.action]
        return [*schemas, self.action_def]

    def _known(self) -> dict[str, set[str]]:
        """Tool name -> its argument names (computed once: every tool call checks it)."""
        if self._arguments is None:
            self._arguments = {
                str(t.get("function", t).get("name")): set(
                    (t.get("function", t).get("parameters") or {}).get("properties") or {}
                )
                for t in self.tool_schemas()
            }
        return self._arguments

    def generate(self, seed: int) -> Task:
        rng = random.Random(f"{self.family}:{seed}")
        gen = Gen(rng)
        key = gen.argument(self.catalog.tools[self.opening].arguments[self.key_arg])
        record = gen.value(self.catalog.tools[self.opening].result)
        if not isinstance(record, dict):
            record = {}
        for name in self.record_args:
            if record.get(name) in (None, "", [], {}):
                record[name] = f"{name[:1].upper()}{rng.randrange(100, 1000)}"
        values = [rng.choice(pool) for pool in self.wording.values]
        call = {name: record[name] for name in self.record_args}
        call.update(dict(zip(self.user_args, values, strict=True)))
        instruction = self.wording.fill(str(key), values)
        action = {"name": self.action, "arguments": call}
        oracle: list[Action] = [
            {"name": self.opening, "arguments": {self.key_arg: key}},
            action,
            {"answer": f"Done: {human(self.action)} ({_and([str(v) for v in values])})."},
        ]
        system = self.conventions.system_prompt or SYSTEM_PROMPT
        return Task(
            seed=seed,
            instruction=instruction,
            state={"record": record, "writes": [], "_key": key},
            goal={"required_calls": [action], "opening": [self.opening]},
            oracle=oracle,
            max_steps=2 + int(self.knobs.get("slack", 4)),
            system_prompt=system,
            meta={"values": values},
        )

    def call_tool(self, state: dict[str, Any], name: str, arguments: Any) -> Any:
        known = self._known()
        if name not in known:
            raise ToolError(f"unknown tool {name!r}", invalid=True)
        args = dict(arguments) if isinstance(arguments, Mapping) else {}
        unknown = set(args) - known[name]
        if unknown and known[name]:
            raise ToolError(f"{name}: unknown argument(s) {', '.join(sorted(unknown))}", True)
        record = state["record"]
        if name == self.opening:
            if args.get(self.key_arg) != state["_key"]:
                raise ToolError(f"no record with {self.key_arg} {args.get(self.key_arg)!r}")
            return clone(record)
        if name == self.action:
            missing = [a for a in self.record_args + self.user_args if a not in args]
            if missing:
                raise ToolError(f"{name}: missing argument(s) {', '.join(missing)}", True)
            wrong = [a for a in self.record_args if args[a] != record.get(a)]
            if wrong:
                raise ToolError(f"{name}: no record with {wrong[0]} {args[wrong[0]]!r}")
        if is_read_tool(name):
            return "not found"  # this world holds the user's record only
        state["writes"].append({"name": name, "arguments": canonical(args)})
        return {"status": "done", **args}


FAMILIES: dict[str, type[ChainEnvironment] | type[RequestedActionEnv]] = {
    cls.family: cls
    for cls in (
        ToolOrderEnv,
        GroundingEnv,
        MemoryHygieneEnv,
        BudgetEnv,
        VerifyBeforeFinishEnv,
        ExactArgumentsEnv,
        RequestedActionEnv,
    )
}
DETECTOR_FAMILY: dict[str, str] = {
    d: cls.family for cls in FAMILIES.values() for d in cls.detectors
}


def gap_detector(gap: Gap | Mapping[str, Any]) -> str | None:
    """The detector behind a gap (a gaps.json record without one: the detector its key or its
    failure signatures name, see `Gap.from_dict`); None when there is none."""
    try:
        return as_gap(gap).detector
    except GapError:
        return None


def _typed(gap: Gap | Mapping[str, Any]) -> Gap:
    try:
        return as_gap(gap)
    except GapError as exc:
        raise NotSynthesizable(str(exc)) from None


def family_for_gap(
    gap: Gap | Mapping[str, Any],
) -> type[ChainEnvironment] | type[RequestedActionEnv]:
    detector = _typed(gap).detector
    family = DETECTOR_FAMILY.get(detector)
    if family is None:
        raise NotSynthesizable(
            f"no family exercises detector {detector!r} "
            f"(families cover: {', '.join(sorted(DETECTOR_FAMILY))})"
        )
    return FAMILIES[family]


def build_spec(
    gap: Gap | Mapping[str, Any], catalog: Catalog, conventions: Conventions | None = None
) -> EnvironmentSpec:
    """The environment spec for `gap` (a `Gap`, or its gaps.json record), following the
    agent's `conventions` when known, or NotSynthesizable with the reason."""
    typed = _typed(gap)
    return family_for_gap(typed).build_spec(typed, catalog, conventions)


__all__ = [
    "DETECTOR_FAMILY",
    "FAMILIES",
    "BudgetEnv",
    "ChainEnvironment",
    "ExactArgumentsEnv",
    "GroundingEnv",
    "MemoryHygieneEnv",
    "RequestedActionEnv",
    "ToolOrderEnv",
    "VerifyBeforeFinishEnv",
    "build_spec",
    "family_for_gap",
    "gap_detector",
    "is_wordlike",
]
