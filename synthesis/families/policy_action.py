"""The `policy_action` family: the record's state decides whether to act.

Built only from the rules the diagnosis mined from the agent's own successful runs (`Gap.rules`,
kinds ``precondition`` from `forbidden_action` and ``trigger`` from `missed_action`); a gap
without one is not synthesizable. Per seed the user asks for the action on a few records; the
read tool shows each record's state, drawn from the values the traces showed at the rule's
path: a forbidden one (a value the rule names, or a number beyond its threshold) on some
records, one successful runs acted in on the others. The verifier checks the capability and
nothing else: every record was looked up (its state is only visible there), the action was
called on each allowed record after its read and on none of the forbidden ones, and the answer
names every record and, for a forbidden one, the state that stopped it. The system prompt is the
agent's own (`Conventions`), never the rule.

Which rules: those of the gap's most broken rule's action and read tool; the preconditions
broken by at least half as many failed runs as the most broken one are *checked* (tasks show them
broken), the others only *respected* (no task breaks them: a coincidence of the successful runs
is not taught); trigger rules only where the gap has no precondition. Allowed states: the rule's
`allowed` values when the diagnosis records them; else the values the catalog's status rule saw
the action succeed on (the same read tool and field); else the only other observed value (a
flag). Anything else is refused rather than guessed. A write leaves the record in the state the
traces recorded after it (the catalog's status rule), where they did.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from copy import deepcopy
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.detectors.state import DAY_OFFSET, date_value, enum_value, show_number
from tracegym.analysis.gap import Gap, MinedRule
from tracegym.synthesis.base import Action, Task
from tracegym.synthesis.conventions import Conventions
from tracegym.synthesis.families.chain import ChainEnvironment, Ctx, human, join_and
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import Catalog, EnvironmentSpec
from tracegym.synthesis.wording import CUSTOMER, fill_record_template, learn_record_template
from tracegym.synthesis.world import (
    Gen,
    NotSynthesizable,
    Roles,
    get_all,
    path_tokens,
    set_at,
    shape_at,
)

PRECONDITION, TRIGGER = "precondition", "trigger"


@dataclass
class StateField:
    """One field of the read tool's record that a rule reads, with the values a task may put
    there: enum values as the traces wrote them, or the observed range of a number or date."""

    path: str  # the catalog's path: `status`, `items[*].status`
    kind: str  # "enum", "number" or "date"
    allowed: list[Any] = field(default_factory=list)  # enum values successful runs acted in
    forbidden: list[Any] = field(default_factory=list)  # enum values a checked rule forbids
    low: float | None = None  # observed range (dates as detector day numbers)
    high: float | None = None
    allowed_low: float | None = None  # the part of it no rule forbids
    allowed_high: float | None = None
    integer: bool = False
    decimals: int = 2
    time_suffix: str = ""  # dates written with a time: `T10:00:00`

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StateField:
        return cls(**data)


@dataclass
class Policy:
    """What the environment enforces: the checked rules (shown broken on forbidden records),
    the trigger rules (their state shown on records to act on) and the fields they read."""

    checked: list[MinedRule]
    triggers: list[MinedRule]
    respected: list[MinedRule]  # other mined rules of the action: never broken by a task
    fields: dict[str, StateField]  # rule path -> field
    # the state the action leaves a record in, where the traces recorded it (the catalog's
    # status rule for the action and the read tool): {"field", "value"}
    after: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": [r.to_dict() for r in self.checked],
            "triggers": [r.to_dict() for r in self.triggers],
            "respected": [r.to_dict() for r in self.respected],
            "fields": {k: asdict(v) for k, v in self.fields.items()},
            "after": self.after,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Policy:
        return cls(
            [MinedRule.from_dict(r) for r in data.get("checked", [])],
            [MinedRule.from_dict(r) for r in data.get("triggers", [])],
            [MinedRule.from_dict(r) for r in data.get("respected", [])],
            {k: StateField.from_dict(v) for k, v in data.get("fields", {}).items()},
            data.get("after"),
        )


def catalog_path(path: str) -> str:
    """The detector's `items[].status` as the catalog writes it: `items[*].status`."""
    return path.replace("[]", "[*]")


def breaks(rule: MinedRule, value: Any) -> bool:
    """Whether a record holding `value` at the rule's path is in the state the rule names, as
    the detector reads it (`analysis.detectors.state`: state texts, numbers, ISO dates)."""
    if rule.values:
        return enum_value(value) in rule.values
    number = date_value(value) if isinstance(value, str) else value
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        return False
    return (rule.above is not None and number > rule.above) or (
        rule.below is not None and number < rule.below
    )


def _raw_values(shape: dict[str, Any]) -> list[Any]:
    """The values the traces showed at a leaf: strings as written, booleans, null."""
    if shape.get("type") == "boolean":
        return [True, False]
    out: list[Any] = list(shape.get("examples") or []) if shape.get("type") == "string" else []
    return out + ([None] if shape.get("nullable") else [])


def _by_state(values: Sequence[Any]) -> dict[str, Any]:
    """Raw values by the detector's state text (`Pending ` -> `pending`, True -> `true`)."""
    out: dict[str, Any] = {}
    for value in values:
        text = enum_value(value)
        if text is not None:
            out.setdefault(text, value)
    return out


def _allowed_states(
    rules: Sequence[MinedRule], catalog: Catalog, tool: str, path: str, others: Sequence[str]
) -> list[str]:
    """The states a task may show as allowed (see the module docstring), or []."""
    recorded = [getattr(r, "allowed", None) for r in rules]
    named = {str(v) for values in recorded if values for v in values}
    if named:
        return [s for s in others if s in named]
    status = catalog.status_rules.get(tool)
    if status and status.lookup == rules[0].read_tool and status.field == path:
        succeeded = _by_state(status.allowed)
        found = [s for s in others if s in succeeded]
        if found:
            return found
    return list(others) if len(others) == 1 else []


def resolve_policy(gap: Gap, catalog: Catalog) -> Policy:
    """The rules of `gap` this family can enforce on the catalog's tools, or NotSynthesizable."""
    usable = [r for r in gap.rules if r.kind in (PRECONDITION, TRIGGER)]
    if not usable:
        raise NotSynthesizable(
            "the gap carries no mined precondition or trigger rule (Gap.rules is empty for "
            f"{gap.detector}): there is no state rule to enforce, and none is invented"
        )
    tool, read_tool = usable[0].tool, usable[0].read_tool
    if tool not in catalog.tools or catalog.tools[tool].read:
        raise NotSynthesizable(f"the rule's action {tool} has no recorded write calls")
    if not read_tool or read_tool not in catalog.tools:
        raise NotSynthesizable(f"the rule's read tool {read_tool} has no recorded calls")
    mine = [r for r in usable if r.tool == tool and r.read_tool == read_tool]
    # a trigger rule is enforced where the gap has no precondition on the action (a record in
    # the trigger state and in a forbidden one would ask for two things at once)
    if any(r.kind == PRECONDITION for r in mine):
        mine = [r for r in mine if r.kind == PRECONDITION]
    shape = catalog.tools[read_tool].result
    fields: dict[str, StateField] = {}
    why: list[str] = []
    kept: list[MinedRule] = []
    for rule in mine:
        path = rule.path or ""
        leaf = dict(shape_at(shape, path_tokens(catalog_path(path))))
        if not path or leaf.get("type") in (None, "object"):  # absent, or not a leaf
            why.append(f"{read_tool}'s recorded results have no field {path!r}")
            continue
        if rule.kind == PRECONDITION and not rule.values and rule.above is rule.below is None:
            why.append(f"the rule on {path} names no forbidden value or threshold")
            continue
        try:
            known = fields.get(path)
            fields[path] = _merge(deepcopy(known), rule, leaf, catalog, tool, mine)
        except NotSynthesizable as exc:
            why.append(str(exc))
            continue
        kept.append(rule)
    if not kept:
        raise NotSynthesizable("no mined rule fits the recorded results: " + "; ".join(why))
    preconditions = [r for r in kept if r.kind == PRECONDITION]
    top = max((r.failed_runs for r in preconditions), default=0)
    checked = [r for r in preconditions if r.failed_runs * 2 >= top]
    respected = [r for r in preconditions if r not in checked]
    triggers = [r for r in kept if r.kind == TRIGGER]
    used = {r.path for r in (*checked, *respected, *triggers)}
    status = catalog.status_rules.get(tool)
    after = None
    if status and status.after and status.lookup == read_tool:
        after = {"field": status.field, "value": status.after}
    return Policy(
        checked, triggers, respected, {p: f for p, f in fields.items() if p in used}, after
    )


def _merge(
    known: StateField | None,
    rule: MinedRule,
    leaf: dict[str, Any],
    catalog: Catalog,
    tool: str,
    rules: Sequence[MinedRule],
) -> StateField:
    """The field `rule` reads, with the rule's constraint added to what `known` holds."""
    path = catalog_path(rule.path or "")
    if rule.kind == TRIGGER or rule.values:
        states = _by_state(_raw_values(leaf))
        missing = [v for v in rule.values if v not in states]
        if missing:
            raise NotSynthesizable(
                f"{rule.read_tool}'s recorded {rule.path} never shows {', '.join(missing)}"
            )
        out = known or StateField(path, "enum")
        if rule.kind == TRIGGER:
            out.allowed = [states[rule.values[0]]]
            return out
        forbidden = set(rule.values)
        others = [s for s in states if s not in forbidden]
        same = [r for r in rules if r.path == rule.path and r.kind == PRECONDITION]
        allowed = _allowed_states(same, catalog, tool, rule.path or "", others)
        if not allowed:
            raise NotSynthesizable(
                f"the rule on {rule.path} names the states successful runs never act in "
                f"({', '.join(sorted(forbidden))}), not which of the others "
                f"({', '.join(others) or 'none'}) they act in"
            )
        out.forbidden = sorted({*out.forbidden, *(states[v] for v in forbidden)}, key=str)
        out.allowed = [states[s] for s in allowed if states[s] not in out.forbidden]
        if not out.allowed:
            raise NotSynthesizable(f"no recorded value of {rule.path} is allowed")
        return out
    # a threshold: numbers, or ISO dates as day numbers
    if leaf.get("type") in ("integer", "number") and leaf.get("min") is not None:
        out = known or StateField(path, "number", low=float(leaf["min"]), high=float(leaf["max"]))
        out.integer = leaf.get("type") == "integer"
        out.decimals = int(leaf.get("decimals") or 0)
    else:
        examples = [e for e in leaf.get("examples") or [] if isinstance(e, str)]
        days = [d for d in (date_value(e) for e in examples) if d is not None]
        if not days:
            raise NotSynthesizable(f"{rule.read_tool}'s recorded {rule.path} holds no numbers")
        timed = next((e[10:] for e in examples if len(e) > 10 and date_value(e)), "")
        out = known or StateField(path, "date", low=min(days), high=max(days), time_suffix=timed)
    lo = out.allowed_low if out.allowed_low is not None else out.low
    hi = out.allowed_high if out.allowed_high is not None else out.high
    assert lo is not None and hi is not None
    if rule.above is not None:
        hi = min(hi, rule.above)
        if (out.high or 0.0) <= rule.above:
            raise NotSynthesizable(
                f"no recorded {rule.path} lies above {show_number(rule.above)}: a task could not "
                "show the forbidden state"
            )
    if rule.below is not None:
        lo = max(lo, rule.below)
        if (out.low or 0.0) >= rule.below:
            raise NotSynthesizable(
                f"no recorded {rule.path} lies below {show_number(rule.below)}: a task could not "
                "show the forbidden state"
            )
    if lo > hi:
        raise NotSynthesizable(f"the thresholds on {rule.path} leave no allowed value")
    out.allowed_low, out.allowed_high = lo, hi
    return out


class PolicyActionEnv(ChainEnvironment):
    """Look each record up, act on the allowed ones only, say why the others were left alone
    (see the module docstring); knobs: `targets` (records per task) and `forbidden_share`."""

    family = "policy_action"
    capability = (
        "Act on a record only in a state the agent's successful runs act in; in a state they "
        "never act in, leave it alone and tell the user why."
    )
    detectors = (dn.FORBIDDEN_ACTION, dn.MISSED_ACTION)

    def __init__(self, spec: EnvironmentSpec, **knobs: Any) -> None:
        super().__init__(spec, **knobs)
        data = spec.extra.get("policy_action")
        self.policy = Policy.from_dict(data) if data else None
        self.template = str((data or {}).get("template") or "")

    def default_knobs(self) -> dict[str, Any]:
        # two records, one of them forbidden: acting on every record cannot pass
        return {"targets": 2, "forbidden_share": 0.5, "distractors": 0, "slack": 4}

    def levels(self) -> list[dict[str, Any]]:
        base = dict(self.knobs)
        return [
            {**base, "targets": t, "forbidden_share": s}
            for t, s in ((2, 0.5), (3, 0.34), (3, 0.67), (4, 0.5), (5, 0.4), (6, 0.5))
        ]

    # Spec construction ---------------------------------------------------------------------
    @classmethod
    def choose_action(cls, gap: Gap, catalog: Catalog) -> tuple[str, list[str], str]:
        policy = resolve_policy(gap, catalog)
        rule = (policy.checked or policy.triggers)[0]
        tools = [rule.tool, *(t for t in gap.tools if t in catalog.tools and t != rule.tool)]
        return rule.tool, tools, f"{rule.tool}: the action of the mined rule '{rule.statement}'"

    @classmethod
    def requirements(cls, roles: Roles, catalog: Catalog, gap: Gap) -> None:
        super().requirements(roles, catalog, gap)
        policy = resolve_policy(gap, catalog)
        read_tool = (policy.checked or policy.triggers)[0].read_tool
        if roles.lookup != read_tool:
            raise NotSynthesizable(
                f"the rule reads {read_tool}, but the record {roles.action} acts on is looked "
                f"up with {roles.lookup}"
            )

    @classmethod
    def build_spec(
        cls, gap: Gap, catalog: Catalog, conventions: Conventions | None = None
    ) -> EnvironmentSpec:
        spec = super().build_spec(gap, catalog, conventions)
        policy = resolve_policy(gap, catalog)
        spec.roles["status"] = None  # the mined rules are the only policy here
        roles = Roles.from_dict(spec.roles)
        id_formats = catalog.tools[roles.action].arguments[roles.id_arg].formats
        owner = (
            catalog.tools[roles.owner].arguments.get(roles.owner_arg or "") if roles.owner else None
        )
        template = (
            learn_record_template(
                gap.requests,
                id_formats[0]["regex"],
                owner.formats[0]["regex"] if owner and owner.formats else None,
            )
            if id_formats
            else ""
        )
        spec.extra["policy_action"] = {**policy.to_dict(), "template": template}
        spec.extra["rules"] = [r.to_dict() for r in (*policy.checked, *policy.triggers)]
        spec.description += " Rules: " + "; ".join(
            r.statement for r in (*policy.checked, *policy.triggers)
        )
        spec.knobs = cls(spec).knobs
        return spec

    # Tasks ---------------------------------------------------------------------------------
    def _value(
        self, rng: random.Random, f: StateField, forbidden: MinedRule | None, path: str
    ) -> Any:
        """A value for field `f`: one `forbidden` forbids, else one no mined rule on the field
        forbids (a state successful runs acted in). Numbers are drawn, then held to the rules
        as the detector reads them (a rounding or a time of day must not cross a threshold)."""
        if f.kind == "enum":
            if forbidden is None:
                return rng.choice(f.allowed)
            states = _by_state(f.forbidden)
            return rng.choice([states[v] for v in forbidden.values if v in states])
        assert self.policy is not None and f.low is not None and f.high is not None
        rules = [r for r in (*self.policy.checked, *self.policy.respected) if r.path == path]
        lo = f.allowed_low if f.allowed_low is not None else f.low
        hi = f.allowed_high if f.allowed_high is not None else f.high
        if forbidden is not None and forbidden.above is not None:
            lo, hi = forbidden.above, f.high
        elif forbidden is not None and forbidden.below is not None:
            lo, hi = f.low, forbidden.below
        value: Any = None
        for _ in range(20):
            x = lo + rng.random() * max(hi - lo, 0.0)
            if f.kind == "date":
                value = date.fromordinal(int(x - DAY_OFFSET)).isoformat() + f.time_suffix
            else:
                value = round(x) if f.integer else round(x, f.decimals)
            if forbidden is not None and breaks(forbidden, value):
                return value
            if forbidden is None and not any(breaks(r, value) for r in rules):
                return value
        raise NotSynthesizable(f"no value of {path} in its observed range fits the mined rules")

    def _put(self, record: dict[str, Any], f: StateField, value: Any, rng: random.Random) -> None:
        tokens = path_tokens(f.path)
        fan = next((i for i, t in enumerate(tokens) if t == "[*]"), None)
        if fan is None:
            set_at(record, tokens, value)
            return
        items = [i for i in get_all(record, tokens[: fan + 1]) if isinstance(i, dict)]
        if not items:  # a state on list items needs an item to show it
            shape = self.catalog.tools[self.roles.lookup or ""].result
            item = Gen(rng).value(shape_at(shape, tokens[: fan + 1]))
            item = item if isinstance(item, dict) else {}
            set_at(record, tokens[:fan], [item])
            items = [item]
        for item in items:
            set_at(item, tokens[fan + 1 :], value)

    def _mirror(self, ctx: Ctx) -> None:
        """The owner's list of records mirrors their fields (`orders[*].status`): show the
        states just set there too, so that no read shows another one."""
        r = self.roles
        if not (r.owner and ctx.owner_id is not None and r.owner_path):
            return
        tokens = path_tokens(r.owner_path)
        fan = next((i for i, t in enumerate(tokens) if t == "[*]"), None)
        if fan is None or not tokens[fan + 1 :]:
            return
        records = ctx.state.entities
        for item in get_all(ctx.state.owners[ctx.owner_id], tokens[: fan + 1]):
            found = get_all(item, tokens[fan + 1 :])
            record = records.get(found[0]) if found and isinstance(found[0], str) else None
            if isinstance(item, dict) and record is not None:
                for key in item:
                    if key in record and not isinstance(record[key], (dict, list)):
                        item[key] = record[key]

    def _shown(self, value: Any) -> str:
        if isinstance(value, bool) or value is None:
            return enum_value(value) or ""
        return str(value)

    def generate(self, seed: int) -> Task:
        assert self.policy is not None, "a policy_action spec carries its rules"
        k = self.knobs
        n = max(int(k["targets"]), 1)
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + int(k.get("distractors", 0)))
        rng, r, policy = ctx.rng, self.roles, self.policy
        if policy.after:  # the backend's write then leaves the record in the recorded state
            ctx.state.status = {"field": policy.after["field"], "allowed": [],
                                "refused": [], "after": policy.after["value"]}  # fmt: skip
        n_forbidden = round(n * float(k.get("forbidden_share", 0.5))) if policy.checked else 0
        refused = set(rng.sample(ctx.targets, min(n_forbidden, n)))
        why: dict[str, tuple[str, str, bool]] = {}  # refused -> (field, value shown, telling)
        for eid in ctx.entities:
            record = ctx.state.entities[eid]
            broken = rng.choice(policy.checked) if eid in refused else None
            for path, f in policy.fields.items():
                rule = broken if broken is not None and broken.path == path else None
                value = self._value(rng, f, rule, path)
                self._put(record, f, value, rng)
                if rule is not None:
                    why[eid] = (path, self._shown(value), not isinstance(value, bool))
        self._mirror(ctx)
        oracle: list[Action] = self.owner_chain(ctx) if ctx.needs_owner else []
        goal = Goal(
            required_calls=[],
            forbidden_calls=[],
            order=[],
            answer_includes=[],
        )
        done, left = [], []
        for t in ctx.targets:
            read = self.lookup_call(t, ctx)
            oracle.append(read)
            goal.required_calls.append(read)
            act = {"name": r.action, "arguments": {r.id_arg: t}}
            if t in refused:
                goal.forbidden_calls.append(act)
                if why[t][2]:  # the state that stopped it (a flag's true/false says nothing)
                    goal.answer_includes.append(why[t][1])
                left.append(t)
            else:
                oracle.append(self.action_call(ctx, t))
                goal.required_calls.append(self.action_call(ctx, t))
                goal.order.append((read, act))
                done.append(t)
            goal.answer_includes.append(t)
        oracle.append({"answer": self._answer(done, left, why)})
        task = self.build_task(seed, ctx, self.instruction(ctx), goal, oracle)
        task.meta["forbidden"] = sorted(refused)
        task.meta["actions"] = {t: self.action_call(ctx, t) for t in ctx.targets}  # each record's
        return task

    def instruction(self, ctx: Ctx) -> str:
        """The request in the users' own recorded words where the gap kept them, else the
        chain families' phrasing; the action's other arguments as the user states them."""
        if not self.template or (CUSTOMER in self.template and ctx.owner_id is None):
            who = self.identity(ctx) if ctx.needs_owner else ""
            return f"Hi. {who}{self.request(ctx, ctx.targets)}"
        said = [p for t in ctx.targets for p in ctx.phrases[t]]
        return fill_record_template(self.template, join_and(ctx.targets), str(ctx.owner_id or ""),
                                    said)  # fmt: skip

    def _answer(
        self, done: list[str], left: list[str], why: dict[str, tuple[str, str, bool]]
    ) -> str:
        noun, verb = self.roles.entity_noun, human(self.roles.action)
        parts = [f"{verb} done for {noun} {t}" for t in done]
        parts += [
            f"{noun} {t} could not be changed ({verb}): its {why[t][0]} is {why[t][1]}"
            for t in left
        ]
        return "; ".join(parts) + "."

    def rule_text(self) -> str:
        """The rules enforced, for people (never shown to the agent)."""
        assert self.policy is not None
        return "; ".join(r.statement for r in (*self.policy.checked, *self.policy.triggers))
