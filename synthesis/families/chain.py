"""The chain machinery every record-based family shares: roles, world generation, oracle chains
and instruction phrasing (`ChainEnvironment`). A family subclasses it in a module of its own in
this package (see `synthesis/families/__init__.py`)."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tracegym.analysis.gap import Gap
from tracegym.analysis.tool_kinds import is_answer_tool
from tracegym.synthesis.base import Action, Environment, Task
from tracegym.synthesis.conventions import Conventions, openai_order
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import ArgSchema, Catalog, EnvironmentSpec
from tracegym.synthesis.world import (
    LABEL_NAMES,
    Gen,
    NotSynthesizable,
    Roles,
    ToolWorld,
    WorldBuilder,
    WorldState,
    echo_field,
    fits,
    get_all,
    infer_roles,
    path_tokens,
    shape_at,
    sibling_descriptor,
    synthetic_status,
    write_fills,
    write_paths,
)

# The prompt where the agent's own recorded instructions are unknown. It says what any support
# agent is told and how to end, never how to do the task (no family's answer is in it).
SYSTEM_PROMPT = (
    "You are a customer-support agent. Use the tools to look records up and to act on them. "
    "Act only on what the user asked for. When you are done, give the user one short final "
    "answer that names every record you handled and what happened to it."
)


def write_effects(roles: Roles, catalog: Catalog) -> tuple[bool, list[str]]:
    """What a lookup shows of the action: whether its mined status changes (the runs showed the
    status after it, and it differs from the one it needs), and the arguments that name a field
    of the record it acts on (`seat`, `address1` -> `address.address1`; see `write_paths`)."""
    status = roles.status
    changes = bool(
        status and status.get("mined") and status.get("after")
        and status["after"] not in status["allowed"]
    )  # fmt: skip
    return changes, sorted({*write_paths(catalog, roles), *write_fills(catalog, roles)})


def human(name: str) -> str:
    """`payment_method_id` -> `payment method`, `item_ids` -> `items`."""
    plural = bool(re.search(r"(_ids|Ids)$", name))
    text = re.sub(r"(_ids?|Ids?|ID)$", "", name).replace("_", " ").strip() or name
    return text + "s" if plural and not text.endswith("s") else text


def with_article(noun: str) -> str:
    word = noun.lower()
    vowel = word[:1] in "aeiou" and not re.match(r"u[^aeiou][aeiou]", word)  # "a user"
    return ("an " if vowel else "a ") + noun


def join_and(items: list[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


@dataclass
class Ctx:
    """One generated world and what the user wants done in it."""

    rng: random.Random
    state: WorldState
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
        if wants_status and not self.roles.status:  # observed values only, and no rule
            self.roles.status = synthetic_status(self.roles, self.catalog)
        self.world = ToolWorld(
            self.catalog, self.roles, memory=self.memory, strict_formats=self.strict_formats
        )
        self.answer_tool, self.answer_arg = self.roles.answer_tool, self.roles.answer_arg
        self.conventions = Conventions.from_dict(spec.extra.get("conventions"))
        self._schemas = self._as_recorded(self.world.json_schemas())
        self.action_schema = self.catalog.tools[self.roles.action]
        self._id_schemas = self._entity_id_schemas()
        self._owner_ids = self._owner_id_schemas()
        self._planted: dict[tuple[str, str, int], Any] = {}

    def _entity_id_schemas(self) -> tuple[ArgSchema | None, ...]:
        """Every schema an entity id must satisfy: the action's id argument, the lookup's, and
        the id field of the looked-up record (generated ids match all three formats)."""
        r = self.roles
        out: list[ArgSchema | None] = [self.action_schema.arguments.get(r.id_arg)]
        lookup = self.catalog.tools.get(r.lookup) if r.lookup else None
        if lookup is not None:
            out.append(lookup.arguments.get(r.lookup_arg or ""))
            echo = echo_field(lookup, r.lookup_arg)
            facts = (lookup.result.get("properties") or {}).get(echo or "") or {}
            if facts.get("formats"):
                out.append(ArgSchema(echo or "id", formats=facts["formats"]))
        return tuple(out)

    def _owner_id_schemas(self) -> tuple[ArgSchema | None, ...]:
        """Every schema the owner's id must satisfy: the owner lookup's argument, the owner
        record's id field, and the entity records' field naming their owner."""
        r = self.roles
        owner = self.catalog.tools.get(r.owner) if r.owner else None
        if owner is None:
            return (None,)
        out: list[ArgSchema | None] = [owner.arguments.get(r.owner_arg or "")]
        lookup = self.catalog.tools.get(r.lookup) if r.lookup else None
        for tool, name in ((owner, echo_field(owner, r.owner_arg)), (lookup, r.owner_arg)):
            facts = ((tool.result.get("properties") or {}) if tool else {}).get(name or "") or {}
            if facts.get("formats"):
                out.append(ArgSchema(name or "id", formats=facts["formats"]))
        return tuple(out)

    def _as_recorded(self, schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The agent's own definitions (and order) for the tools it recorded them for."""
        if not self.conventions.tools:
            return schemas
        order = {
            str(t.get("function", t).get("name")): i for i, t in enumerate(self.conventions.tools)
        }
        out = [self.conventions.tool_definition(s["function"]["name"]) or s for s in schemas]
        out = [openai_order(s) for s in out]  # as the agent sent them, not as the store sorted them
        return sorted(out, key=lambda s: order.get(s["function"]["name"], len(order)))

    # Environment hooks ---------------------------------------------------------------------
    def fork_state(self, state: WorldState) -> WorldState:
        """The levels the backend changes, copied (`WorldState.fork`)."""
        return state.fork()

    def call_tool(self, state: WorldState, name: str, arguments: Any) -> Any:
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
        shown = catalog.tools.get(roles.lookup)
        if shown is None or not (shown.result.get("properties") or shown.result.get("items")):
            raise NotSynthesizable(
                f"no recorded result of {roles.lookup} shows the {roles.entity_noun}'s record "
                "(the traces hold its calls only): a world would invent every field of it"
            )

    @classmethod
    def require_effects(cls, roles: Roles, catalog: Catalog) -> None:
        """Raise NotSynthesizable when nothing a lookup shows is known to change by the action (for
        a family whose lookup after the write must tell whether it took effect). Elsewhere such
        a write is logged (`WorldState.writes`), never shown as a change the traces never showed."""
        changes, fields = write_effects(roles, catalog)
        if not changes and not fields:
            raise NotSynthesizable(
                f"what {roles.action} does to the {roles.entity_noun} is unknown: the runs show "
                f"no status after it that differs from before, and none of its arguments names a "
                f"field of the {roles.entity_noun}'s record, so a world could only pretend it "
                "changed something"
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
        writes = [t for t in tools if not catalog.tools[t].read and not is_answer(t)]
        why = []
        for name in writes:
            try:
                infer_roles(catalog, name)
            except NotSynthesizable as exc:
                why.append(str(exc))
                continue
            return name, tools, f"{name}: the gap's own write tool"
        candidates = [t for t in catalog.tools.values() if not t.read and not is_answer(t.name)]
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
        builder.reserve = n_entities
        gen = builder.gen
        owner_id, attrs = None, {}
        if r.owner:
            owner_id = builder.new_id(*self._owner_ids)
            finder = self.catalog.tools.get(r.finder) if r.finder else None
            if finder:
                attrs = {a: gen.argument(finder.arguments[a]) for a in finder.required}
            else:
                attrs = {r.owner_arg: owner_id}
        entities = [builder.new_id(*self._id_schemas) for _ in range(n_entities)]
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
            if status and status["refused"]:
                refuse = eid in refused_set or (eid not in targets and rng.random() < 0.5)
                value = rng.choice(status["refused"]) if refuse else status["allowed"][0]
            elif status:  # no rule: any observed value
                value = rng.choice(status["allowed"])
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
                    value = self._user_value(gen, arg, records[t])
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
        # a value the user gives that the lookup also takes (and its result echoes) is the
        # record's own: tau2 telecom's line_id names the line whose usage get_data_usage shows
        lookup = self.catalog.tools.get(r.lookup or "")
        for t in targets:
            for name in lookup.required if lookup else ():
                if name != r.lookup_arg and name in calls[t] and name in records[t]:
                    records[t][name] = calls[t][name]
        labels = {}
        if r.label_path:
            for eid in entities:
                found = get_all(records[eid], path_tokens(r.label_path))
                if found:
                    labels[eid] = found[0]
        state = WorldState(
            owners=owners,
            entities=records,
            seed=seed,
            finder={owner_id: attrs} if owner_id is not None else {},
            status=status,
            guard=bool(self.knobs.get("guard", False)),
        )
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
        wanted, also = self._planted_fields(arg, shape, path)
        if arg.formats or arg.type == "string":

            def make() -> Any:
                value = builder.new_id(arg, *also)
                for _ in range(20):
                    if all(fits(value, f) for f in wanted if f.get("type") == "string"):
                        break
                    builder.taken.discard(value)
                    value = builder.new_id(arg, *also)
                return value

        else:

            def make() -> Any:
                return builder.gen.argument(arg)

        return [make() for _ in range(count)]

    def _planted_fields(
        self, arg: ArgSchema, shape: Mapping[str, Any], path: str
    ) -> tuple[list[Mapping[str, Any]], list[ArgSchema]]:
        """The fields a value planted for `arg` at `path` sits in: the source record's and,
        where the write stores it, the acted-on record's (the value must suit both as well as
        the argument); and their formats as schemas for `new_id`. Cached: ids are compiled
        once per schema."""
        key = (arg.name, path, id(shape))
        cached = self._planted.get(key)
        if cached is not None:
            return cached
        wanted = [shape_at(shape, path_tokens(path))]
        stored = self.world.sets.get(arg.name)
        if stored and self.roles.lookup:
            wanted.append(shape_at(self.catalog.tools[self.roles.lookup].result, stored))
        also = [ArgSchema(arg.name, formats=f["formats"]) for f in wanted if f.get("formats")]
        self._planted[key] = (wanted, also)
        return wanted, also

    @staticmethod
    def _choose(rng: random.Random, arg: ArgSchema, values: list[Any]) -> Any:
        if not values:
            return [] if arg.type == "array" else None
        if arg.type == "array":
            k = 1 if len(values) < 3 else rng.randint(1, 2)
            picked = rng.sample(values, k)
            return [v for v in values if v in picked]
        return rng.choice(values)

    def _user_value(self, gen: Gen, arg: ArgSchema, record: Mapping[str, Any]) -> Any:
        """A value the user gives for `arg`, as the recorded calls took it; where the call sets a
        field of the record, one that field could hold too, and not the one it holds (a change
        to what the record already holds is none)."""
        tokens = self.world.sets.get(arg.name)
        if not tokens:
            return gen.argument(arg)
        facts = shape_at(self.world.catalog.tools[self.roles.lookup].result, tokens)
        current = self._current(record, arg.name)
        # where the write changes other fields too, keeping this one (`country: USA`) is fine
        keep_ok = len(self.world.sets) > 1 or bool(self.world.fills)
        same = other = None
        for _ in range(20):  # what the field has held too, else any recorded argument value
            value = gen.argument(arg)
            fit = fits(value, facts)
            if value != current and fit:
                return value
            if same is None and fit and keep_ok:
                same = value
            if other is None and value != current:
                other = value
        for found in (same, other):
            if found is not None:
                return found
        return value

    def _current(self, record: Mapping[str, Any], name: str) -> Any:
        """What the record holds in the field a call's argument `name` sets (None if none)."""
        tokens = self.world.sets.get(name)
        found = get_all(record, tokens) if tokens else []
        return found[0] if found else None

    def _phrase(self, name: str, record: Any, path: str, chosen: Any, where: str) -> str:
        """How the user names a value the call takes from a record: by what tells it apart from
        its siblings (`the Headphones`), else by the value itself. (`where` names the record.)"""
        values = chosen if isinstance(chosen, list) else [chosen]
        descs = [sibling_descriptor(record, path, v) for v in values]
        tokens = path_tokens(path)
        fan = next((i for i, t in enumerate(tokens) if t in ("[*]", "{*}")), None)
        siblings = len(get_all(record, tokens[: fan + 1])) if fan is not None else 1
        if siblings > 1 and all(descs):
            return f"{human(name)}: {join_and(descs)}"  # type: ignore[arg-type]
        return f"{human(name)}: {self._say(chosen)}"

    @staticmethod
    def _say(value: Any) -> str:
        if isinstance(value, list):
            return join_and([str(v) for v in value])
        return str(value)

    # Phrasing and oracle helpers -----------------------------------------------------------
    def identity(self, ctx: Ctx) -> str:
        if not ctx.attrs:
            return ""
        parts = [f"{human(k)} {v}" for k, v in ctx.attrs.items()]
        return f"I'm the customer with {join_and(parts)}. "

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
            return f"Please {verb} {join_and(out)}."
        if joined:  # "cancel pending order" + "my order with the lamp" -> "cancel my pending
            words = verb[: -len(noun)].split()  # order with the lamp"
            middle = " ".join(words[1:])
            mine = f"my {middle} {noun}" if middle else f"my {noun}"
            out = [o.replace(f"my {noun}", mine, 1) for o in out]
            return f"Please {words[0] if words else verb} {join_and(out)}."
        return f"Please {verb} for {join_and(out)}."

    def lookup_call(self, eid: str, ctx: Ctx | None = None) -> Action:
        """The lookup of record `eid`; the lookup's other required arguments take the record's
        own field of that name, else what the action's call on it passes under that name (tau2
        telecom's `get_data_usage(customer_id, line_id)` before `refuel_data(customer_id,
        line_id, ...)`)."""
        args: dict[str, Any] = {self.roles.lookup_arg: eid}
        schema = self.catalog.tools.get(self.roles.lookup or "")
        call = ctx.calls.get(eid, {}) if ctx is not None else {}
        record = ctx.state.entities.get(eid, {}) if ctx is not None else {}
        for name in schema.required if schema else ():
            if name in args:
                continue
            if isinstance(record, dict) and isinstance(record.get(name), (str, int, float)):
                args[name] = record[name]
            elif name in call:
                args[name] = call[name]
        return {"name": self.roles.lookup, "arguments": args}

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
        status = ctx.state.status
        return ctx.state.entities[eid].get(status["field"]) if status else None

    def allowed(self, ctx: Ctx, eid: str) -> bool:
        status = ctx.state.status
        return status is None or self.status_of(ctx, eid) in status["allowed"]

    def answer(self, ctx: Ctx, done: list[str], refused: list[str]) -> str:
        noun = self.roles.entity_noun
        status = ctx.state.status
        parts = []
        for t in done:
            after = f" (status now {status['after']})" if status and status.get("after") else ""
            parts.append(f"{human(self.roles.action)} done for {noun} {t}{after}")
        for t in refused:
            parts.append(f"{noun} {t} was left unchanged: its status is {self.status_of(ctx, t)}")
        return "; ".join(parts) + "."

    def build_task(
        self,
        seed: int,
        ctx: Ctx,
        instruction: str,
        goal: Goal,
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
        self, ctx: Ctx, instruction: str, goal: Goal, oracle: list[Action]
    ) -> tuple[str, Goal, list[Action], int]:
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
                greeting = "Hi. " if instruction.startswith("Hi. ") else ""
                instruction = greeting + said + instruction[len(greeting) :]
            goal = replace(goal, opening=names)
        lookup = conv.lookups.get(r.action)
        if lookup and lookup == r.lookup:
            out: list[Action] = []
            order = list(goal.order)
            for action in oracle:
                eid = (action.get("arguments") or {}).get(r.id_arg)
                if action.get("name") == r.action and isinstance(eid, str):
                    read = self.lookup_call(eid, ctx)
                    if not any(a.get("name") == lookup and a == read for a in out):
                        out.append(read)
                        added += 1
                    pair = (read, {"name": r.action, "arguments": {r.id_arg: eid}})
                    if pair not in order:
                        order.append(pair)
                out.append(action)
            oracle = out
            goal = replace(goal, order=order)
        return instruction, goal, oracle, added

    def status_rule_text(self) -> str:
        """Kept for families that append it: always empty. A mined status rule is the domain's
        (the agent's own recorded instructions say it where they say it); a prompt that stated
        it would state the answer of the tasks that leave refused records alone."""
        return ""


def is_answer(name: str) -> bool:
    return is_answer_tool(name)
