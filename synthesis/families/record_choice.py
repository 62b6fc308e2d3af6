"""The `record_choice` family: act on the one record, among several looked up, that the user's
words describe.

Built from a `wrong_choice` gap (key ``wrong_choice:<tool>.<arg>``: `tool`'s `arg` picked one of
several records the run looked up while the user's words described another). Supported where
`arg` names the record the action acts on (its id argument, `Roles.id_arg`) and a recorded read
lists the user's records (`Roles.owner`: ``find_user -> orders[*]``): per seed the owner holds
`candidates` records generated from the recorded shapes, which differ in the fields users state
(*describing fields*: short word-like texts with 2+ recorded values, such as a colour, a size, a
product name, on the listed element or on the record the lookup returns; never the id, the
status the rules read, or a field the action writes). The user names their record by the
values of `fields` of those fields, never by its id, and those values fit exactly one record;
with the knob `shared`, that many other records share all but one of them, so only the whole
description decides. The records' order is shuffled, so no position is the answer.

The verifier checks that the action's id argument named that record (compared as `wrong_choice`
compares it: `analysis.detectors.choice.words`), that the action ran on it exactly once and on
no other record; nothing else the agent already does (the reads before it, its other
arguments, the answer's wording) is checked. The request follows the users' recorded words
where the gap keeps requests that share them (`Gap.requests`, via `learn_wording`), else the
chain's phrasing. The system prompt is the agent's own recorded instructions.

Refused (`NotSynthesizable`, with the reason) when the gap's key names no recorded tool and
argument, when the argument is not the id of the record the action acts on (a payment method
or a variant chosen inside one record: not built yet), when no recorded read lists the
candidates, or when the candidates have no describing field.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.detectors.choice import words
from tracegym.analysis.gap import Gap
from tracegym.synthesis.base import Episode, Task, Verdict
from tracegym.synthesis.conventions import Conventions
from tracegym.synthesis.families.chain import ChainEnvironment, Ctx, human, join_and
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import Catalog, EnvironmentSpec
from tracegym.synthesis.wording import IDENTITY, Wording, WordingError, learn_wording
from tracegym.synthesis.world import (
    NotSynthesizable,
    Roles,
    echo_field,
    get_all,
    infer_roles,
    path_tokens,
    set_at,
    shape_at,
    write_paths,
)

MIN_VALUES = 2  # recorded values a describing field needs, to tell two records apart
MIN_CHARS, MAX_CHARS = 3, 40  # the lengths of text `wrong_choice` scores
MAX_DIGITS = 4  # more digits: an id, a date or a phone, not a described property
MAX_FIELDS = 3  # describing fields a plan keeps


@dataclass(frozen=True)
class Describing:
    """A field users describe a record by: where it lives and the values it was seen to hold.

    `place` is ``record`` (a top-level field of what the lookup returns) or ``listed`` (a
    field of the owner's list element naming the record); a field in both is kept as one."""

    name: str
    values: tuple[str, ...]
    record: bool = False
    listed: bool = False


@dataclass(frozen=True)
class ChoicePlan:
    """The argument chosen, the owner's list of candidates, and their describing fields."""

    argument: str
    list_path: str  # `orders[*]` in the owner's record
    fields: tuple[Describing, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChoicePlan:
        described = tuple(
            Describing(str(f["name"]), tuple(str(v) for v in f.get("values") or ()),
                       bool(f.get("record")), bool(f.get("listed")))
            for f in data.get("fields") or () if isinstance(f, Mapping)
        )  # fmt: skip
        return cls(str(data.get("argument") or ""), str(data.get("list_path") or ""), described)


def chosen_argument(gap: Gap) -> tuple[str, str]:
    """(tool, argument) from the gap's key ``wrong_choice:<tool>.<arg>``, or NotSynthesizable."""
    prefix, _, rest = gap.key.partition(":")
    tool, dot, arg = rest.partition(".")
    if prefix != dn.WRONG_CHOICE or not dot or not tool or not arg:
        raise NotSynthesizable(
            f"the gap's key {gap.key!r} names no write argument ({dn.WRONG_CHOICE}:<tool>.<arg>)"
        )
    return tool, arg


def _texts(shape: Mapping[str, Any]) -> tuple[str, ...]:
    """The distinct recorded values of a string field that `wrong_choice` could score."""
    if shape.get("type") != "string" or shape.get("formats"):
        return ()
    seen = [str(v) for v in (shape.get("enum") or shape.get("examples") or [])]
    kept = []
    for value in seen:
        text = words(value)
        digits = sum(c.isdigit() for c in text)
        if MIN_CHARS <= len(text) <= MAX_CHARS and digits <= MAX_DIGITS and value not in kept:
            kept.append(value)
    return tuple(sorted(kept)) if len({words(v) for v in kept}) >= MIN_VALUES else ()


def describing_fields(
    roles: Roles, catalog: Catalog, evidence: Sequence[str] = ()
) -> tuple[str, list[Describing]]:
    """The owner's candidate list (`orders[*]`) and the fields its records differ in; those whose
    values the gap's evidence quotes come first."""
    if not roles.owner or not roles.owner_path or roles.owner not in catalog.tools:
        raise NotSynthesizable(
            f"no recorded read lists the {roles.entity_noun}s a user holds (no owner lookup of "
            f"{roles.action}'s {roles.id_arg}): there are no candidates to choose among"
        )
    tokens = path_tokens(roles.owner_path)
    fan = next((i for i, t in enumerate(tokens) if t == "[*]"), None)
    if fan is None:
        raise NotSynthesizable(f"{roles.owner}'s {roles.owner_path} is not a list of records")
    list_path = "".join(t if t.startswith("[") else f".{t}" for t in tokens[: fan + 1])
    list_path = list_path.lstrip(".")
    element = shape_at(catalog.tools[roles.owner].result, tokens[: fan + 1])
    lookup = catalog.tools.get(roles.lookup or "")
    record = (lookup.result.get("properties") or {}) if lookup else {}
    skip = {roles.id_arg, roles.lookup_arg, echo_field(lookup, roles.lookup_arg), roles.owner_arg}
    if roles.status:
        skip.add(str(roles.status.get("field")))
    written = {t[0] for t in write_paths(catalog, roles).values() if t}
    found: dict[str, Describing] = {}
    listed = (element.get("properties") or {}) if element.get("type") == "object" else {}
    for name, sub in [*record.items(), *listed.items()]:
        if name in skip or name in written or name in found:
            continue
        texts = _texts(sub)
        if texts:
            found[name] = Describing(name, texts, name in record, name in listed)
    if not found:
        raise NotSynthesizable(
            f"the {roles.entity_noun}s {roles.owner} lists have no field users describe them by "
            f"(a short text with {MIN_VALUES}+ recorded values, on the listed element or on what "
            f"{roles.lookup} returns): nothing tells one candidate from another"
        )
    said = " " + " ".join(words(e) for e in evidence) + " "
    ranked = sorted(
        found.values(),
        key=lambda d: (-sum(f" {words(v)} " in said for v in d.values), -d.listed, d.name),
    )
    return list_path, ranked[:MAX_FIELDS]


def learn_request(gap: Gap, fields: Sequence[Describing]) -> Wording | None:
    """The users' wording of the request, with the description in a value slot, from the gap's
    recorded requests (identity: the value of the run's first call); None unless they share one
    whose only value slot held recorded values of a describing field."""
    pairs = []
    for request in gap.requests:
        call = request.first_call or {}
        args = call.get("arguments") if isinstance(call, Mapping) else None
        values = [v for v in (args or {}).values() if isinstance(v, str)]
        pairs.append((request.text, values[0] if values else None))
    if len(pairs) < 2:
        return None
    try:
        wording = learn_wording(pairs)
    except WordingError:
        return None
    known = {words(v) for d in fields for v in d.values}
    if wording.value_slots != 1 or not all(words(v) in known for v in wording.values[0]):
        return None
    return wording


def _renamed(value: Any, old: str, new: str) -> Any:
    """`value` with every string equal to `old` replaced by `new`."""
    if isinstance(value, str):
        return new if value == old else value
    if isinstance(value, dict):
        return {k: _renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, old, new) for v in value]
    return value


def _norm(value: Any) -> str:
    return words(str(value))


class RecordChoiceEnv(ChainEnvironment):
    """The record the user described, among the several a lookup lists (module docstring)."""

    family = "record_choice"
    capability = (
        "Act on the record the user described among the several a lookup lists: the one whose "
        "fields match every value the user stated, not the first, the latest or a near match."
    )
    detectors = (dn.WRONG_CHOICE,)

    def __init__(self, spec: EnvironmentSpec, **knobs: Any) -> None:
        super().__init__(spec, **knobs)
        planned = spec.extra.get("choice")
        self.plan = ChoicePlan.from_dict(planned) if isinstance(planned, Mapping) else None
        worded = spec.extra.get("wording")
        self.wording = Wording.from_dict(worded) if isinstance(worded, dict) else None

    def default_knobs(self) -> dict[str, Any]:
        return {"candidates": 3, "fields": 1, "shared": 0, "slack": 6}

    def levels(self) -> list[dict[str, Any]]:
        """Easiest to hardest: candidates, fields the user states, candidates that share all but
        one stated value (capped by the fields the plan has)."""
        base = dict(self.knobs)
        n = len(self.plan.fields) if self.plan else 1
        ladder = ((2, 1, 0), (3, 1, 0), (3, 2, 1), (4, 2, 1), (4, 2, 2), (5, 3, 2), (6, 3, 3))
        keys = ("candidates", "fields", "shared")
        out = []
        for c, f, s in ladder:
            level = {**base, **dict(zip(keys, (c, min(f, n), s if n > 1 else 0), strict=True))}
            if level not in out:
                out.append(level)
        return out

    # Spec construction ---------------------------------------------------------------------
    @classmethod
    def _planned(cls, gap: Gap, catalog: Catalog) -> tuple[Roles, ChoicePlan]:
        tool, arg = chosen_argument(gap)
        if tool not in catalog.tools:
            raise NotSynthesizable(f"{tool} is not in the recorded tools")
        if arg not in catalog.tools[tool].arguments:
            raise NotSynthesizable(f"{tool} has no recorded argument {arg!r}")
        extra = [t for t in gap.tools if t != tool and t in catalog.tools]
        roles = infer_roles(catalog, tool, extra_tools=extra)
        if arg != roles.id_arg:
            raise NotSynthesizable(
                f"the choice is of {tool}'s {arg}, not of the {roles.entity_noun} it acts on "
                f"({roles.id_arg}): choosing an option inside one record (a variant, a payment "
                "method) is not built yet"
            )
        ChainEnvironment.requirements(roles, catalog, gap)
        evidence = [m.evidence for m in gap.members]
        list_path, fields = describing_fields(roles, catalog, evidence)
        return roles, ChoicePlan(arg, list_path, tuple(fields))

    @classmethod
    def choose_action(cls, gap: Gap, catalog: Catalog) -> tuple[str, list[str], str]:
        roles, _plan = cls._planned(gap, catalog)
        tools = [t for t in gap.tools if t in catalog.tools]
        return roles.action, tools, f"{roles.action}: the write whose choice the gap names"

    @classmethod
    def build_spec(
        cls, gap: Gap, catalog: Catalog, conventions: Conventions | None = None
    ) -> EnvironmentSpec:
        _roles, plan = cls._planned(gap, catalog)
        spec = super().build_spec(gap, catalog, conventions)
        spec.extra["choice"] = plan.to_dict()
        wording = learn_request(gap, plan.fields)
        spec.extra["wording"] = wording.to_dict() if wording is not None else None
        spec.description += (
            f" The user describes the {plan.argument} by {join_and([d.name for d in plan.fields])}."
        )
        spec.knobs = cls(spec).knobs
        return spec

    # World generation ----------------------------------------------------------------------
    def _descriptions(
        self, rng: random.Random, n: int, fields: Sequence[Describing]
    ) -> list[dict[str, str]]:
        """One value per field for each of `n` records, the first (the target) told apart by
        its stated values: `shared` of the others share all of them but one."""
        shared = min(int(self.knobs.get("shared", 0)), n - 1) if len(fields) > 1 else 0
        target = {d.name: rng.choice(d.values) for d in fields}
        out = [target]
        for k in range(1, n):
            for _ in range(50):
                other = {d.name: rng.choice(d.values) for d in fields}
                if k <= shared:  # differs from the target in exactly one stated field
                    differ = rng.choice(fields)
                    other = dict(target)
                    other[differ.name] = rng.choice(
                        [v for v in differ.values if words(v) != words(target[differ.name])]
                    )
                if any(words(other[d.name]) != words(target[d.name]) for d in fields):
                    break
            else:  # pragma: no cover - `_texts` keeps 2+ distinct values per field
                raise NotSynthesizable("the describing fields cannot tell the records apart")
            out.append(other)
        return out

    def _recorded_owner(self, ctx: Ctx, rng: random.Random) -> None:
        """Where the owner lookup's argument took a few recorded values only (an enum: the
        traces' customers' emails), the owner is one of them, not an invented one."""
        r = self.roles
        tool = self.catalog.tools.get(r.owner or "")
        arg = tool.arguments.get(r.owner_arg or "") if tool else None
        old = ctx.owner_id
        enum = (arg.enum or (arg.shape or {}).get("enum")) if arg is not None else None
        if not enum or old is None or r.finder or old in enum:
            return
        new = str(rng.choice(sorted(str(v) for v in enum)))
        state = ctx.state
        state.owners = {new if k == old else k: _renamed(v, old, new)
                        for k, v in state.owners.items()}  # fmt: skip
        state.entities = {k: _renamed(v, old, new) for k, v in state.entities.items()}
        ctx.attrs = {k: new if v == old else v for k, v in ctx.attrs.items()}
        ctx.owner_id = new

    def _listed(self, ctx: Ctx) -> list[Any]:
        """The owner's list of candidates (the list object itself, to edit in place)."""
        assert self.plan is not None
        owner = ctx.state.owners.get(ctx.owner_id) if ctx.owner_id is not None else None
        tokens = path_tokens(self.plan.list_path)
        found = get_all(owner, tokens[:-1]) if isinstance(owner, dict) else []
        return found[0] if found and isinstance(found[0], list) else []

    def generate(self, seed: int) -> Task:
        plan, r = self.plan, self.roles
        if plan is None:
            raise NotSynthesizable("the spec holds no choice plan (build it with build_spec)")
        n = max(2, int(self.knobs.get("candidates", 3)))
        stated = plan.fields[: max(1, min(int(self.knobs.get("fields", 1)), len(plan.fields)))]
        ctx = self.world_ctx(seed, n_targets=1, n_entities=n)
        rng = random.Random(f"{self.family}:{seed}:choice")
        self._recorded_owner(ctx, rng)
        [target] = ctx.targets
        described = self._descriptions(rng, n, plan.fields)
        listed = self._listed(ctx)
        by_id = {}
        for item in listed:
            key = item if not isinstance(item, dict) else item.get(r.id_arg)
            by_id[str(key)] = item
        for eid, values in zip(ctx.entities, described, strict=True):
            record = ctx.state.entities[eid]
            for d in plan.fields:
                if d.record:
                    record = set_at(record, [d.name], values[d.name])
                item = by_id.get(str(eid))
                if d.listed and isinstance(item, dict):
                    item[d.name] = values[d.name]
            ctx.state.entities[eid] = record
        rng.shuffle(listed)  # no position is the answer
        said = {d.name: described[0][d.name] for d in stated}
        ctx.labels[target] = self._describe(stated, said)
        instruction = self._instruction(ctx, target, said)
        oracle = [
            *self.owner_chain(ctx),
            self.lookup_call(target, ctx),
            self.action_call(ctx, target),
            {"answer": self.answer(ctx, [target], [])},
        ]
        task = self.build_task(seed, ctx, instruction, Goal(), oracle)
        task.meta["choice"] = {
            "target": target,
            "others": [e for e in ctx.entities if e != target],
            "said": said,
        }
        return task

    @staticmethod
    def _describe(stated: Sequence[Describing], said: Mapping[str, str]) -> str:
        """`laptop` for one field; `colour black and size large` for several."""
        if len(stated) == 1:
            return said[stated[0].name]
        return join_and([f"{human(d.name)} {said[d.name]}" for d in stated])

    def _instruction(self, ctx: Ctx, target: str, said: Mapping[str, str]) -> str:
        """The users' recorded words where they were learnt and one field is stated (the
        description in its slot, the owner's identity in its own, the other arguments in
        brackets); else the chain's phrasing, naming the record by its description."""
        wording = self.wording
        identity = next(iter(ctx.attrs.values()), None) if ctx.attrs else None
        if wording is not None and len(said) == 1 and (identity or IDENTITY not in wording.parts):
            text = wording.fill(identity=str(identity or ""), values=list(said.values()))
            rest = ctx.phrases[target]
            return text.strip() + (f" ({'; '.join(rest)})" if rest else "")
        return f"Hi. {self.identity(ctx)}{self.request(ctx, [target], how='label')}"

    # Verification --------------------------------------------------------------------------
    def verify(self, episode: Episode) -> Verdict:
        """The record chosen, once, and no other (module docstring); nothing else."""
        want = episode.task.meta["choice"]
        target, r = _norm(want["target"]), self.roles
        checks: list[dict[str, Any]] = []

        def add(name: str, ok: bool, detail: str) -> None:
            checks.append({"name": name, "part": "action", "ok": bool(ok), "detail": detail})

        add(
            "finished",
            episode.answer is not None and not episode.truncated,
            "answered within the step budget"
            if not episode.truncated
            else f"ran out of steps ({episode.task.max_steps})",
        )
        acts = [
            s["action"].get("arguments")
            for s in episode.calls
            if not s.get("error") and s["action"].get("name") == r.action
        ]
        given = [a.get(r.id_arg) if isinstance(a, Mapping) else None for a in acts]
        chosen = [_norm(g) for g in given]
        mine = sum(c == target for c in chosen)
        elsewhere = [g for g, c in zip(given, chosen, strict=True) if c != target]
        add(
            "chosen",
            mine >= 1,
            f"{r.action} ran on the {r.entity_noun} the user described ({want['target']})"
            if mine
            else f"{r.action} never ran on the {r.entity_noun} the user described "
            f"({want['target']}: {', '.join(want['said'].values())})",
        )
        add(
            "once",
            mine <= 1,
            f"{r.action} ran once on {want['target']}"
            if mine <= 1
            else f"{r.action} ran {mine} times on {want['target']}",
        )
        add(
            "only_chosen",
            not elsewhere,
            f"{r.action} ran on no other {r.entity_noun}"
            if not elsewhere
            else f"{r.action} also ran on {elsewhere[0]!r}, which the user did not describe",
        )
        answer = " ".join((episode.answer or "").split())
        others = [str(o) for o in want["others"] if _norm(o) in f" {_norm(answer)} "]
        named = f" {target} " in f" {_norm(answer)} "
        checks.append({"name": "answer_names", "part": "communication", "ok": named and not others,
                       "detail": f"the answer names {want['target']} and no other candidate"
                       if named and not others else f"the answer names {others[0]!r}, which was "
                       "not acted on" if others else f"the answer does not name "
                       f"{want['target']}"})  # fmt: skip
        return self._grade(checks)


__all__ = ["ChoicePlan", "Describing", "RecordChoiceEnv", "chosen_argument", "describing_fields"]
