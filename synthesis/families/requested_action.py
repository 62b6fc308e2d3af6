"""The `requested_action` family: call the tool the user asked for, in the users' own wording."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.gap import Gap
from tracegym.analysis.tool_kinds import is_read_tool
from tracegym.synthesis.base import Action, Environment, Task
from tracegym.synthesis.conventions import Conventions, openai_order
from tracegym.synthesis.described_rules import definition_text, with_described_refusals
from tracegym.synthesis.families.chain import (
    SYSTEM_PROMPT,
    ChainEnvironment,
    Ctx,
    human,
    is_answer,
    join_and,
)
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import (
    ArgSchema,
    Catalog,
    EnvironmentSpec,
    ToolSchema,
    is_id_name,
    matches_format,
)
from tracegym.synthesis.wording import (
    CUSTOMER,
    Wording,
    WordingError,
    fill_record_template,
    learn_record_template,
    learn_wording,
)
from tracegym.synthesis.world import (
    Gen,
    NotSynthesizable,
    Roles,
    ToolError,
    canonical,
    clone,
    fits,
    leaf_paths_cached,
    path_tokens,
    replace_at,
)


class RequestedActionEnv(Environment):
    """Do what the user asks: find the user's record the way the agent always does, then call
    the tool that performs the requested action, with ids from the record and values from the
    request. For `unserved_request` gaps, where the agent never calls that tool at all.

    Unlike the chain families it needs no recorded call of the action: the tool's definition
    comes from the agent's conventions (`gen_ai.tool.definitions`), the wording of the request
    from the users' own requests (`Gap.requests`, see `synthesis.wording`), the record from
    the recorded result of the agent's opening call. Where the action acts on a record the user
    names and the agent looks up first, `build_spec` builds a `RequestedRecordActionEnv`.
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
        self._pools = self._value_pools()

    def _value_pools(self) -> list[list[str]]:
        """Per user value: the users' recorded words for it, those the recorded calls of the
        action would have taken where it was called (all of them where none fit)."""
        schema = self.catalog.tools.get(self.action)
        pools = []
        for name, pool in zip(self.user_args, self.wording.values, strict=True):
            arg = schema.arguments.get(name) if schema else None
            shape = getattr(arg, "shape", None) if arg else None
            fitting = [v for v in pool if fits(v, shape)] if shape else []
            pools.append(fitting or list(pool))
        return pools

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
        if is_read_tool(action) or is_answer(action):
            raise NotSynthesizable(f"{action} is not a write tool the user asked for")
        definition = conv.tool_definition(action) or (
            catalog.tools[action].json_schema() if action in catalog.tools else None
        )
        if definition is None:
            raise NotSynthesizable(f"{action}'s definition is unknown (not recorded, never called)")
        if conv.lookups.get(action):  # the record the user names, looked up first
            return RequestedRecordActionEnv.build_spec(gap, catalog, conv)
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
        if looked_up:  # a record the user names, which a read looks up
            return RequestedRecordActionEnv.build_spec(gap, catalog, conv)
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
        subset, overruled = _users_words_over_calls(catalog.subset(tools), action, user_args,
                                                    wording)  # fmt: skip
        spec = EnvironmentSpec(
            env_id=f"{cls.family}-{gap_id.removeprefix('gap-')}",
            family=cls.family,
            entry_point=f"{cls.__module__}:{cls.__name__}",
            gap=gap.summary(),
            catalog=subset,
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
                    "overruled_formats": overruled,
                },
            },
        )
        if conv.runs:
            spec.extra["conventions"] = conv.to_dict()
        spec.knobs = cls(spec).knobs
        return spec

    # Environment hooks ---------------------------------------------------------------------
    def tool_schemas(self) -> list[dict[str, Any]]:
        if self.conventions.tools:  # as the agent sent them (specs saved before kept sorted keys)
            return [openai_order(t) for t in self.conventions.tools]
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
        shape = self.catalog.tools[self.opening].result
        record = gen.value(shape)
        if not isinstance(record, dict):
            record = {}
        fields = shape.get("properties") or {}
        for name in self.record_args:  # a field most records lacked: as the others showed it
            if record.get(name) in (None, "", [], {}):
                record[name] = gen.value(fields[name])
            if record.get(name) in (None, "", [], {}):  # the traces never showed a value of it
                record[name] = f"{name[:1].upper()}{rng.randrange(100, 1000)}"
        values = [rng.choice(pool) for pool in self._pools]
        call = {name: record[name] for name in self.record_args}
        call.update(dict(zip(self.user_args, values, strict=True)))
        instruction = self.wording.fill(str(key), values)
        action = {"name": self.action, "arguments": call}
        oracle: list[Action] = [
            {"name": self.opening, "arguments": {self.key_arg: key}},
            action,
            {"answer": f"Done: {human(self.action)} ({join_and([str(v) for v in values])})."},
        ]
        system = self.conventions.system_prompt or SYSTEM_PROMPT
        return Task(
            seed=seed,
            instruction=instruction,
            state={"record": record, "writes": [], "_key": key},
            goal=Goal(required_calls=[action], opening=[self.opening]),
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
        if name == self.action:  # the values the user gave land in the user's record
            record = state["record"] = self._updated(record, args)
        return self._result(state, name, args, record)

    def _updated(self, record: Mapping[str, Any], args: Mapping[str, Any]) -> dict[str, Any]:
        """The record after the action: each value from the user set where the record keeps a
        field of that name (a top-level field, or the one nested field so named), else added
        under the argument's name."""
        shape = self.catalog.tools[self.opening].result
        out = dict(record)
        for name in self.user_args:
            if name not in args:
                continue
            paths = leaf_paths_cached(shape, name)
            tokens = path_tokens(paths[0]) if len(paths) == 1 else [name]
            out = replace_at(out, tokens, args[name])
        return out

    def _result(
        self, state: Mapping[str, Any], name: str, args: Mapping[str, Any], record: Any
    ) -> Any:
        """A write's result: in the shape the traces recorded for the tool (the record's fields
        and the call's arguments where it has them), else the record as it now stands."""
        schema = self.catalog.tools.get(name)
        shape = schema.result if schema is not None and schema.calls else None
        if not shape or shape.get("type") != "object" or not shape.get("properties"):
            return clone(record)
        made = Gen(random.Random(f"{state['_key']}:{name}:{canonical(args)}")).value(shape)
        made = made if isinstance(made, dict) else {}
        echoed = {
            f: args[a] for a, f in (getattr(schema, "echoes", None) or {}).items() if a in args
        }
        out = {}
        for key in shape.get("required", shape["properties"]):
            for source in (echoed, args, record, made):
                if key in source:
                    out[key] = source[key]
                    break
            else:
                out[key] = None
        return out


class RequestedRecordActionEnv(ChainEnvironment):
    """`requested_action` where the action acts on a record the user names and the agent looks
    up first (its conventions' lookup for the action, or a read taking the action's id): the
    user, in their own recorded words, asks for the action on one of their records; the agent
    finds them the way it always does, looks the record up and calls the action on it, and
    leaves their other records alone. Built by `RequestedActionEnv.build_spec` (the same
    detector and capability), on the chain families' world.

    Like `RequestedActionEnv` it needs no recorded call of the action: an action never called is
    known from its definition, its id argument from the read that takes the same argument.
    What it does to the record is unknown then, so the world logs the write and changes
    nothing the traces never showed. No status rule can be mined for it; where its definition
    names the state it acts in (`described_rules`), that rule is taught: a share of the records
    the user names (`refused_share`) are in another state, and the agent looks them up and
    leaves them alone.
    """

    family = "requested_action"
    capability = RequestedActionEnv.capability
    detectors = ()  # chosen by RequestedActionEnv.build_spec, never by detector

    def __init__(self, spec: EnvironmentSpec, **knobs: Any) -> None:
        super().__init__(spec, **knobs)
        self.template: str = spec.extra.get("requested", {}).get("template", "")

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": 1, "distractors": 1, "slack": 4, "refused_share": 0.5}

    def levels(self) -> list[dict[str, Any]]:
        base = dict(self.knobs)
        return [
            {**base, "targets": t, "distractors": d}
            for t, d in ((1, 0), (1, 1), (1, 2), (2, 1), (2, 2), (3, 2))
        ]

    def contrast_knobs(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Every target allowed, and every target refused (with a status rule that refuses)."""
        if not (self.roles.status and self.roles.status.get("refused")):
            return None
        return {"refused_share": 0.0}, {"refused_share": 1.0}

    @classmethod
    def choose_action(cls, gap: Gap, catalog: Catalog) -> tuple[str, list[str], str]:
        action = gap.key.split(":", 1)[1]
        return action, [action], f"{action}: the tool the users asked for"

    @classmethod
    def build_spec(
        cls, gap: Gap, catalog: Catalog, conventions: Conventions | None = None
    ) -> EnvironmentSpec:
        conv = conventions or Conventions()
        action = gap.key.split(":", 1)[1]
        definition = conv.tool_definition(action)
        if action not in catalog.tools and definition is not None:
            catalog = with_defined_tool(catalog, definition, conv.lookups.get(action))
        spec = super().build_spec(gap, catalog, conv)
        roles = Roles.from_dict(spec.roles)
        roles.status = with_described_refusals(roles.status, spec.catalog, action, roles.lookup,
                                               definition_text(definition))  # fmt: skip
        spec.roles = roles.to_dict()
        ids = _any_format(spec.catalog.tools[action].arguments[roles.id_arg].formats)
        owner = spec.catalog.tools[roles.owner].arguments.get(roles.owner_arg or "") if (
            roles.owner) else None  # fmt: skip
        owners = _any_format(owner.formats) if owner is not None else None
        template = learn_record_template(gap.requests, ids, owners) if ids else ""
        spec.extra["requested"] = {"action": action, "template": template,
                                   "called": catalog.tools[action].calls}  # fmt: skip
        spec.knobs = cls(spec).knobs
        return spec

    def generate(self, seed: int) -> Task:
        k = self.knobs
        n = max(int(k["targets"]), 1)
        r = self.roles
        # with a status rule that refuses some states, a share of the targets are in one: the
        # agent looks each record up and acts only on those the rule allows
        refusing = bool(r.status and r.status.get("refused"))
        share = float(k.get("refused_share", 0.5)) if refusing else 0.0
        # exactly `share` of the targets of any run of consecutive seeds (one target: every
        # other seed), so each look of an evaluation over consecutive seeds sees both kinds
        n_refused = min(n, math.floor((seed + 1) * share * n) - math.floor(seed * share * n))
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + int(k.get("distractors", 0)),
                             refused=n_refused)  # fmt: skip
        oracle: list[Action] = self.owner_chain(ctx) if ctx.needs_owner else []
        goal = Goal(required_calls=[], forbidden_calls=[], answer_includes=[])
        done, left = [], []
        for t in ctx.targets:
            act = {"name": r.action, "arguments": {r.id_arg: t}}
            if refusing:
                read = self.lookup_call(t, ctx)
                oracle.append(read)
                goal.required_calls.append(read)
            if self.allowed(ctx, t):
                oracle.append(self.action_call(ctx, t))  # (the conventions' lookup before it)
                goal.required_calls.append(self.action_call(ctx, t))
                if refusing:
                    goal.order.append((read, act))
                done.append(t)
            else:
                goal.forbidden_calls.append(act)
                goal.answer_includes.append(str(self.status_of(ctx, t)))
                left.append(t)
            goal.answer_includes.append(t)
        for other in ctx.entities[n:]:
            goal.forbidden_calls.append({"name": r.action, "arguments": {r.id_arg: other}})
        if not done:  # nothing to act on: not even an attempt of the action, on any record
            goal.forbidden_attempts.append({"name": r.action})
        oracle.append({"answer": self.answer(ctx, done, left)})
        return self.build_task(seed, ctx, self.instruction(ctx), goal, oracle)

    def instruction(self, ctx: Ctx) -> str:
        """The request in the users' own recorded words where the gap kept them, else the
        chain families' phrasing."""
        if not self.template or (CUSTOMER in self.template and ctx.owner_id is None):
            return f"Hi. {self.identity(ctx)}{self.request(ctx, ctx.targets)}"
        said = [p for t in ctx.targets for p in ctx.phrases[t]]
        return fill_record_template(self.template, join_and(ctx.targets), str(ctx.owner_id or ""),
                                    said)  # fmt: skip


def _any_format(formats: list[dict[str, Any]]) -> str | None:
    """One regex matching a value of any of the recorded formats that are more than noise (at
    least MIN_FORMAT_SHARE of the values: `^\\d{2}$` for 1 id in 40 would match the digits in
    every email); None: none recorded."""
    kept = [f for f in formats if f.get("share", 1.0) >= MIN_FORMAT_SHARE] or formats[:1]
    if not kept:
        return None
    return "(?:" + "|".join(f["regex"].strip("^$") for f in kept) + ")"


MIN_FORMAT_SHARE = 0.2


def with_defined_tool(
    catalog: Catalog, definition: Mapping[str, Any], lookup: str | None = None
) -> Catalog:
    """The catalog with a write tool the runs never called, from its definition (OpenAI-style):
    each argument a read also takes (the agent's `lookup` for it first) keeps what the read's
    recorded calls show of it (the ids it looks records up by); the others only their type."""
    fn = definition.get("function", definition)
    name = str(fn.get("name", ""))
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or props)
    reads = sorted(
        (t for t in catalog.tools.values() if t.read),
        key=lambda t: (t.name != lookup, -t.calls, t.name),
    )
    arguments: dict[str, ArgSchema] = {}
    for arg, facts in props.items():
        kind = facts.get("type", "string") if isinstance(facts, Mapping) else "string"
        seen = next((t.arguments[arg] for t in reads if arg in t.arguments), None)
        if seen is not None and seen.type == kind:
            arguments[arg] = replace(seen, required=arg in required)
        else:
            arguments[arg] = ArgSchema(arg, type=str(kind), required=arg in required)
    # no recorded result: the world answers with the record as it now stands (an object
    # without properties), as `RequestedActionEnv` does, not with a bare "ok"
    tool = ToolSchema(name=name, arguments=arguments, read=False, result={"type": "object"},
                      description=str(fn.get("description") or ""))  # fmt: skip
    return replace(catalog, tools={**catalog.tools, name: tool})


def _users_words_over_calls(
    catalog: Catalog, action: str, user_args: list[str], wording: Wording
) -> tuple[Catalog, dict[str, str]]:
    """The catalog, with the recorded shape of each user value argument of `action` dropped
    where it fits none of the values the users' requests give it: an agent that never serves the
    request records only its mistaken calls (the demo's `update_address(address="O9049")`), and
    the users' recorded words are the better record of what the argument holds. Returns the
    catalog and, per argument overruled, why."""
    schema = catalog.tools.get(action)
    if schema is None:
        return catalog, {}
    arguments, overruled = dict(schema.arguments), {}
    for name, said in zip(user_args, wording.values, strict=False):
        arg = arguments.get(name)
        if arg is None or not said or not (arg.formats or arg.shape or arg.enum):
            continue
        if arg.formats and any(matches_format(v, arg.formats) for v in said):
            continue
        if not arg.formats and arg.shape and any(fits(v, arg.shape) for v in said):
            continue
        arguments[name] = replace(arg, formats=[], shape=None, enum=None, examples=list(said[:12]))
        overruled[name] = (
            f"the recorded calls' values of {name} ({', '.join(map(str, arg.examples[:3]))}) fit "
            f"none of the users' words for it ({', '.join(said[:3])}): the words are kept"
        )
    if not overruled:
        return catalog, {}
    tools = dict(catalog.tools)
    tools[action] = replace(schema, arguments=arguments)
    return replace(catalog, tools=tools), overruled
