"""The `amount` family: pass the amount the record gives, by the relation successful runs keep.

Built only from a `wrong_amount` gap's mined rule (`Gap.rules`, kind ``amount``: e.g.
"issue_refund(amount) = get_order.total - get_order.service_fee"); without one, or when its tool,
record or fields are not in the catalog, it refuses (`NotSynthesizable`) rather than invent a
formula. Per seed the looked-up records hold numbers drawn from the observed range and precision
of the relation's fields (the catalog's result shapes), the user asks for the action on one or
more records in the users' recorded words, and the verifier checks what the gap names: each
action call carries the amount the relation gives on that record (compared at the amount's
precision; "45.10", 45.1 and "$45.10" are one amount, `analysis.arithmetic.parse_number`), on
the right record, and the answer reports it. The system prompt is the agent's own (or the
shared one) and never states the relation. Knobs: `targets` (records to act on; at least two
where the relation is one field, so that calling the action once with any number seen cannot
pass), `distractors` (other records of the customer), `items` (list elements summed).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.arithmetic import (
    amount_of,
    close_to,
    numbers_in,
    parse_number,
    record_numbers,
)
from tracegym.analysis.detectors.amounts import AmountRule
from tracegym.analysis.gap import Gap, MinedRule
from tracegym.synthesis.base import Action, Episode, Task
from tracegym.synthesis.families.chain import ChainEnvironment, Ctx, human, join_and
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import Catalog, EnvironmentSpec
from tracegym.synthesis.wording import fill_record_template, learn_record_template
from tracegym.synthesis.world import (
    NotSynthesizable,
    Roles,
    WorldBuilder,
    WorldState,
    path_tokens,
    set_at,
    shape_at,
)

SUPPORTED = ("field", "share", "sum", "difference", "sum_over")
DRAWS = 100  # tries at numbers whose amount is in the argument's recorded range, and no other
# number of the record


def shape_path(path: str) -> str:
    """An analysis record path (`items[].price`) as a synthesis one (`items[*].price`)."""
    return path.replace("[]", "[*]")


def amount_rule(gap: Gap) -> MinedRule:
    """The gap's mined amount rule, or NotSynthesizable saying there is none."""
    for rule in gap.rules:
        if rule.kind == "amount" and rule.relation and rule.values and rule.argument:
            return rule
    raise NotSynthesizable(
        "no amount relation was mined from the successful runs (the gap's findings carry no "
        "mined rule), so there is no formula to enforce"
    )


def _number_shape(shape: Mapping[str, Any]) -> tuple[float, float, int, bool] | None:
    """(low, high, decimals, written as text) of a numeric leaf's observed values."""
    if shape.get("type") in ("number", "integer") and shape.get("min") is not None:
        decimals = int(shape.get("decimals") or 0) if shape["type"] == "number" else 0
        return float(shape["min"]), float(shape["max"]), decimals, False
    found = [amount_of(v) for v in shape.get("examples") or []]
    numbers = [n for n in found if n is not None]
    if shape.get("type") == "string" and len(numbers) >= 2:
        decimals = max(len(str(v).rsplit(".", 1)[1]) if "." in str(v) else 0
                       for v in shape["examples"])  # fmt: skip
        return min(numbers), max(numbers), min(decimals, 2), True
    return None


class AmountEnv(ChainEnvironment):
    """Act on the records the user names with the amount the mined relation gives on each."""

    family = "amount"
    capability = "Pass the amount the looked-up record gives (the relation successful runs keep)."
    detectors = (dn.WRONG_AMOUNT,)

    def __init__(self, spec: EnvironmentSpec, **knobs: Any) -> None:
        rules = [MinedRule.from_dict(r) for r in spec.extra.get("rules") or []]
        self.rule = rules[0] if rules else None
        self.relation = AmountRule.relation_of(self.rule) if self.rule else None
        super().__init__(spec, **knobs)
        extra = spec.extra.get("amount") or {}
        self.argument = self.rule.argument if self.rule else ""
        self.template = str(extra.get("template") or "")
        self.roles.extras.pop(self.argument, None)  # the amount is this family's, not a copy
        arg = self.action_schema.arguments.get(self.argument)
        self.arg_type = arg.type if arg else "number"
        # compared and written at the argument's precision, at least cents (as the detector does)
        recorded = int(arg.decimals or 0) if arg else 0
        self.decimals = 0 if self.arg_type == "integer" else max(recorded, 2)
        low = arg.minimum if arg and arg.minimum is not None else 0.0
        high = arg.maximum if arg and arg.maximum is not None else float("inf")
        self.amount_range = (max(float(low), 10**-self.decimals), float(high))

    # Knobs ---------------------------------------------------------------------------------
    @property
    def min_targets(self) -> int:
        return 2 if self.relation is not None and self.relation.form == "field" else 1

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": self.min_targets, "distractors": 1, "items": 3, "slack": 6}

    def levels(self) -> list[dict[str, Any]]:
        base, m = dict(self.knobs), self.min_targets
        return [
            {**base, "targets": m + t, "distractors": d, "items": i}
            for t, d, i in ((0, 0, 2), (0, 1, 3), (1, 1, 3), (1, 2, 4), (2, 2, 5), (3, 3, 6))
        ]

    # Spec construction ---------------------------------------------------------------------
    @classmethod
    def choose_action(cls, gap: Gap, catalog: Catalog) -> tuple[str, list[str], str]:
        rule = amount_rule(gap)
        if rule.tool not in catalog.tools:
            raise NotSynthesizable(f"the mined relation's tool {rule.tool} was never recorded")
        tools = [t for t in gap.tools if t in catalog.tools]
        return rule.tool, tools, f"{rule.tool}: the tool of the mined amount relation"

    @classmethod
    def requirements(cls, roles: Roles, catalog: Catalog, gap: Gap) -> None:
        """The rule's own conditions first (their reasons name the relation), then the chain's."""
        rule = amount_rule(gap)
        relation = AmountRule.relation_of(rule)
        if relation.form not in SUPPORTED:
            raise NotSynthesizable(
                f"the mined relation ({relation.text(rule.read_tool or '')}) sums the list "
                "elements the call names: this family does not generate named elements"
            )
        if rule.read_tool != roles.lookup:
            raise NotSynthesizable(
                f"the mined relation reads {rule.read_tool}, but the records {roles.action} acts "
                f"on are looked up with {roles.lookup}"
            )
        if rule.argument not in catalog.tools[roles.action].arguments:
            raise NotSynthesizable(
                f"{rule.argument} is not a top-level argument of {roles.action}: this family "
                "sets top-level amounts only"
            )
        shape = catalog.tools[roles.lookup].result
        for path in relation.paths:
            if _number_shape(shape_at(shape, path_tokens(shape_path(path)))) is None:
                raise NotSynthesizable(
                    f"{roles.lookup}'s recorded results show no numbers at {path}, so there is "
                    "no observed range to draw from"
                )
        super().requirements(roles, catalog, gap)

    @classmethod
    def build_spec(cls, gap: Gap, catalog: Catalog, conventions: Any = None) -> EnvironmentSpec:
        rule = amount_rule(gap)
        spec = super().build_spec(gap, catalog, conventions)
        roles = Roles.from_dict(spec.roles)
        id_formats = catalog.tools[roles.action].arguments[roles.id_arg].formats
        owner_formats = (
            catalog.tools[roles.owner].arguments[roles.owner_arg].formats
            if roles.owner and roles.owner_arg
            else []
        )
        template = (
            learn_record_template(
                gap.requests,
                id_formats[0]["regex"],
                owner_formats[0]["regex"] if owner_formats else None,
                left_over=r"\d{3,}",
            )
            if id_formats
            else ""
        )
        spec.extra["rules"] = [rule.to_dict()]
        spec.extra["amount"] = {"argument": rule.argument, "template": template}
        spec.description += f" Amount: {rule.statement}"
        spec.knobs = {}  # those of the instance built before the rule was in the spec
        spec.knobs = cls(spec).knobs
        return spec

    # Records -------------------------------------------------------------------------------
    def _draw(self, rng: random.Random, path: str) -> Any:
        """A number at `path`, drawn from its observed range, at its observed precision."""
        shape = shape_at(self.world_shape, path_tokens(shape_path(path)))
        low, high, decimals, text = _number_shape(shape) or (1.0, 100.0, 2, False)
        value = round(rng.uniform(low, high), decimals)
        if text:
            return f"{value:.{decimals}f}"
        return int(value) if decimals == 0 else value

    @property
    def world_shape(self) -> Mapping[str, Any]:
        return self.catalog.tools[self.roles.lookup].result

    def _plant(self, builder: WorldBuilder, record: dict[str, Any], rng: random.Random) -> float:
        """Set the relation's fields of `record` and return the amount it gives (`_plausible`
        where some of `DRAWS` draws is)."""
        assert self.relation is not None
        relation = self.relation
        amount = None
        for _ in range(DRAWS):
            if relation.form == "sum_over":
                n = max(2, int(self.knobs.get("items", 3)))
                values = [self._draw(rng, relation.paths[0]) for _ in range(n)]
                shaped = shape_path(relation.paths[0])
                record.update(builder.plant(record, shaped, values, self.world_shape))
            else:
                for path in relation.paths:
                    set_at(record, path_tokens(path), self._draw(rng, path))
            amount = relation.value(record)
            if amount is not None and self._plausible(amount, record):
                break
        if amount is None:
            raise NotSynthesizable(f"the relation gives no amount on {self.roles.lookup}'s records")
        return amount

    def _plausible(self, amount: float, record: Mapping[str, Any]) -> bool:
        """In the argument's recorded range, and no other number the record shows (so that
        copying a number seen is no way to the right amount)."""
        low, high = self.amount_range
        if not low <= amount <= high:
            return False
        relation = self.relation
        assert relation is not None
        scalars, lists = record_numbers(record)
        own = set(relation.paths) if relation.form == "field" else set()
        others = [v for p, v in scalars.items() if p not in own]
        if relation.form != "sum_over":
            others += [v for values in lists.values() for v in values]
        return not any(close_to(amount, v, self.decimals) for v in others)

    def written(self, amount: float) -> Any:
        """The amount as the action's argument takes it (its recorded type, rounded)."""
        value = round(amount, self.decimals)
        if self.arg_type == "string":
            return f"{value:.{self.decimals}f}"
        return int(value) if self.arg_type == "integer" else value

    # Environment hooks ---------------------------------------------------------------------
    def call_tool(self, state: WorldState, name: str, arguments: Any) -> Any:
        """The action's amount is read as a number whatever its formatting ("$45.10", "45.1")."""
        if name == self.roles.action and isinstance(arguments, Mapping):
            number = parse_number(arguments.get(self.argument))
            if number is not None:
                arguments = {**arguments, self.argument: self.written(number)}
        return super().call_tool(state, name, arguments)

    def generate(self, seed: int) -> Task:
        if self.relation is None:
            raise NotSynthesizable("the spec holds no mined amount rule")
        k = self.knobs
        n = max(int(k.get("targets", 1)), self.min_targets)
        ctx = self.world_ctx(seed, n_targets=n, n_entities=n + int(k.get("distractors", 1)))
        rng = ctx.rng
        builder = WorldBuilder(self.catalog, self.roles, random.Random(f"amount:{seed}"), None)
        amounts = {eid: self._plant(builder, ctx.state.entities[eid], rng) for eid in ctx.entities}
        expected = {t: self.written(amounts[t]) for t in ctx.targets}
        oracle: list[Action] = []
        goal = Goal(required_calls=[], answer_includes=list(ctx.targets))
        for t in ctx.targets:
            goal.required_calls.append(self.action_call(ctx, t))  # the record, any amount
            ctx.calls[t][self.argument] = expected[t]
            oracle += [self.lookup_call(t, ctx), self.action_call(ctx, t)]
        goal.amounts = {t: float(parse_number(v) or 0.0) for t, v in expected.items()}
        oracle.append({"answer": self.amount_answer(ctx, expected)})
        return self.build_task(seed, ctx, self.instruction(ctx), goal, oracle)

    def instruction(self, ctx: Ctx) -> str:
        if not self.template:
            return f"Hi. {self.request(ctx, ctx.targets)}"
        said = [p for t in ctx.targets for p in ctx.phrases[t]]
        return fill_record_template(self.template, join_and(ctx.targets), str(ctx.owner_id or ""),
                                    said)  # fmt: skip

    def amount_answer(self, ctx: Ctx, expected: Mapping[str, Any]) -> str:
        noun, what = self.roles.entity_noun, human(self.argument)
        parts = [
            f"{human(self.roles.action)} done for {noun} {t}: {what} {float(v):.{self.decimals}f}"
            for t, v in expected.items()
        ]
        return "; ".join(parts) + "."

    def extra_checks(self, episode: Episode) -> list[dict[str, Any]]:
        wanted: Mapping[str, float] = episode.task.goal.amounts or {}
        r = self.roles
        done = [s["action"] for s in episode.calls if not s.get("error")]
        answer = numbers_in([episode.answer or ""])
        checks = []
        for t, amount in wanted.items():
            passed = [
                parse_number((a.get("arguments") or {}).get(self.argument))
                for a in done
                if a.get("name") == r.action and (a.get("arguments") or {}).get(r.id_arg) == t
            ]
            ok = bool(passed) and all(close_to(amount, p, self.decimals) for p in passed)
            shown = ", ".join("?" if p is None else f"{p:g}" for p in passed) or "no call"
            checks.append({"name": "amount", "part": "action", "ok": ok,
                           "detail": f"{r.action} for {t}: {self.argument} {shown} "
                           f"({'the' if ok else 'not the'} amount the record gives)"})  # fmt: skip
            reported = any(close_to(amount, x, self.decimals) for x in answer)
            checks.append({"name": "amount_reported", "part": "communication", "ok": reported,
                           "detail": f"the answer {'states' if reported else 'does not state'} "
                           f"the amount for {t}"})  # fmt: skip
        return checks
