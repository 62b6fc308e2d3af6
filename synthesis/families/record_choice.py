"""The `record_choice` family: act on the one record, among several looked up, that the user's
words describe.

Built from a `wrong_choice` gap (key ``wrong_choice:<tool>.<arg>``: `tool`'s `arg` picked one of
several records the run looked up while the user's words described another). Two cases:

- `arg` names the record the action acts on (its id argument, `Roles.id_arg`) and a recorded
  read lists the user's records (`Roles.owner`: ``find_user -> orders[*]``): per seed the owner
  holds `candidates` records generated from the recorded shapes;
- `arg` is taken from the options of a looked-up record (`Roles.extras` with a recorded path:
  ``get_user_details -> payment_methods{*}``): per seed that record holds `candidates` options
  generated from the recorded element shape (in an id-keyed map whose keys name a kind,
  ``paypal_...``, the key agrees with the kind field).

The candidates differ in their *describing fields*: short word-like texts with 2+ recorded values
(a colour, a product name, a payment source), never an id or a code in a recorded format, the
status the rules read, or a field the action writes; those whose values the gap's evidence quotes
come first. The user states the values of `fields` of them, never the id, and they fit exactly
one candidate; with `shared` > 0 (and two fields or more) that many others share all but one of
them. The candidates' order is drawn, so no position is the answer.

The verifier checks that the action's `arg` named that candidate (compared as `wrong_choice`
compares it: `analysis.detectors.choice.words`), that it ran on it exactly once and with no other
value of `arg`, and that the final answer names the record acted on and no other candidate's id
(a breadth-first policy that dumps everything it saw fails); nothing else the agent already does
(the reads before it, its other arguments, the answer's wording) is checked. The request follows
the users' recorded words where the gap keeps requests that share them (`Gap.requests`, via
`learn_wording`: `wrong_choice` keeps none today), else the chain's phrasing. The system prompt
is the agent's own recorded instructions.

Refused (`NotSynthesizable`, with the reason) when the gap's key names no recorded tool and
argument, when the argument is given by the user (no recorded record lists its candidates: a
product variant read from a product the roles do not look up), when no recorded read lists the
candidates, or when they have no describing field.
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
from tracegym.synthesis.spec import ArgSchema, Catalog, EnvironmentSpec
from tracegym.synthesis.wording import IDENTITY, Wording, WordingError, learn_wording
from tracegym.synthesis.world import (
    LABEL_NAMES,
    NotSynthesizable,
    Roles,
    WorldBuilder,
    echo_field,
    get_all,
    infer_roles,
    key_kinds,
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
    """A field users describe a record by and the values it was seen to hold: a top-level field
    of what the lookup returns (`record`), of the owner's list element naming the record
    (`listed`; a field in both is kept as one), or of an option's element (neither)."""

    name: str
    values: tuple[str, ...]
    record: bool = False
    listed: bool = False


@dataclass(frozen=True)
class ChoicePlan:
    """The argument chosen, the owner's list of candidates, and their describing fields."""

    argument: str
    list_path: str  # `orders[*]` in the owner's record; an option's: its container path
    fields: tuple[Describing, ...] = field(default_factory=tuple)
    source: str = "entity"  # the record itself; else where its options live: owner | lookup
    path: str = ""  # an option's recorded source path (`payment_methods{*}`, `x[*].id`)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChoicePlan:
        described = tuple(
            Describing(str(f["name"]), tuple(str(v) for v in f.get("values") or ()),
                       bool(f.get("record")), bool(f.get("listed")))
            for f in data.get("fields") or () if isinstance(f, Mapping)
        )  # fmt: skip
        return cls(str(data.get("argument") or ""), str(data.get("list_path") or ""), described,
                   str(data.get("source") or "entity"), str(data.get("path") or ""))  # fmt: skip


def chosen_argument(gap: Gap) -> tuple[str, str | None]:
    """(tool, argument) from the gap's key ``wrong_choice:<tool>.<arg>``; a key naming the tool
    only (``wrong_choice:<tool>``) leaves the argument to the roles (the record's id)."""
    prefix, _, rest = gap.key.partition(":")
    tool, _, arg = rest.partition(".")
    if prefix != dn.WRONG_CHOICE or not tool:
        raise NotSynthesizable(
            f"the gap's key {gap.key!r} names no write argument ({dn.WRONG_CHOICE}:<tool>.<arg>)"
        )
    return tool, arg or None


def _texts(shape: Mapping[str, Any]) -> tuple[str, ...]:
    """The distinct recorded values of a string field that `wrong_choice` could score."""
    if shape.get("type") != "string" or (shape.get("formats") and not shape.get("enum")):
        return ()  # a code in a recorded format (an id, a zip) is not what users describe
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
    for name, sub in record.items():  # one of the record's list elements: "the one with the X"
        items = sub.get("items") or {} if sub.get("type") == "array" else {}
        if name in skip or name in written or items.get("type") != "object":
            continue
        for key, leaf in (items.get("properties") or {}).items():
            naming = key in LABEL_NAMES or roles.label_path == f"{name}[*].{key}"
            texts = _texts(leaf) if naming else ()  # an element's name, not its type or kind
            if texts and key not in skip:
                found[f"{name}[*].{key}"] = Describing(f"{name}[*].{key}", texts, True, False)
    if not found:
        raise NotSynthesizable(
            f"the {roles.entity_noun}s {roles.owner} lists have no field users describe them by "
            f"(a short text with {MIN_VALUES}+ recorded values, on the listed element or on what "
            f"{roles.lookup} returns): nothing tells one candidate from another"
        )
    said = " " + " ".join(words(e) for e in evidence) + " "
    ranked = sorted(
        found.values(),
        key=lambda d: (
            -sum(f" {words(v)} " in said for v in d.values),
            -d.listed,
            "[*]" in d.name,
            d.name,
        ),
    )
    return list_path, ranked[:MAX_FIELDS]


def option_fields(
    roles: Roles, catalog: Catalog, arg: str, evidence: Sequence[str] = ()
) -> tuple[str, str, str, list[Describing]]:
    """For an argument the action takes from a looked-up record's options (`Roles.extras`:
    ``payment_methods{*}`` of the owner): (source, path, container path, describing fields of
    an option), or NotSynthesizable."""
    src = roles.extras.get(arg) or {}
    where, path = src.get("source"), src.get("path")
    if where not in ("owner", "lookup", "record") or not path:
        raise NotSynthesizable(
            f"{roles.action}'s {arg} is not read from a recorded record's options (the traces "
            f"show it {'given by the user' if where == 'user' else 'from nowhere they recorded'}"
            "): no candidates to choose among"
        )
    tool = roles.owner if where == "owner" else roles.lookup
    shape = catalog.tools[tool].result if tool in catalog.tools else {}
    tokens = path_tokens(path)
    fan = next((i for i, t in enumerate(tokens) if t in ("[*]", "{*}")), None)
    if fan is None or any(t in ("[*]", "{*}") for t in tokens[fan + 1 :]):
        raise NotSynthesizable(f"{tool}'s {path} is not one list or map of options")
    element = shape_at(shape, tokens[: fan + 1])
    props = (element.get("properties") or {}) if element.get("type") == "object" else {}
    regexes = {f.get("regex") for f in catalog.tools[roles.action].arguments[arg].formats or []}
    skip = {*tokens[fan + 1 :][:1]} | ({"id", "item_id"} if fan == len(tokens) - 1 else set())
    found = [
        Describing(str(name), texts)
        for name, sub in props.items()
        if name not in skip
        and not {f.get("regex") for f in sub.get("formats") or []} & regexes
        and (texts := _texts(sub))
    ]
    if not found:
        raise NotSynthesizable(
            f"the options at {tool}'s {path} have no field users describe them by (a short text "
            f"with {MIN_VALUES}+ recorded values): nothing tells one from another"
        )
    said = " " + " ".join(words(e) for e in evidence) + " "
    found.sort(key=lambda d: (-sum(f" {words(v)} " in said for v in d.values), d.name))
    container = "".join(t if t.startswith(("[", "{")) else f".{t}" for t in tokens[: fan + 1])
    return str(where), path, container.lstrip("."), found[:MAX_FIELDS]


def learn_request(gap: Gap, fields: Sequence[Describing]) -> Wording | None:
    """The users' wording of the request, with the description in a value slot, from the gap's
    recorded requests (identity: the value of the run's first call); None unless they share one
    whose only value slot held recorded values of the first describing field (the one a task
    with one stated field states)."""
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
    known = {words(v) for v in fields[0].values} if fields else set()
    if wording.value_slots != 1 or not all(words(v) in known for v in wording.values[0]):
        return None
    return wording


def _strings(value: Any) -> list[str]:
    """Every string in a JSON-like value (ids already taken in the world)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _spoken(path: str) -> str:
    """How a user names a describing field: `colour`, `item name` for `items[*].name`."""
    head, _, leaf = path.partition("[*].")
    if not leaf:
        return human(path)
    return f"{human(head).removesuffix('s')} {human(leaf)}"


def _placed(items: list[Any], index: int, rng: random.Random) -> list[Any]:
    """`items` with the one at `index` at a uniformly drawn place and the others shuffled."""
    rest = items[:index] + items[index + 1 :]
    rng.shuffle(rest)
    at = rng.randrange(len(items)) if items else 0
    return rest[:at] + items[index : index + 1] + rest[at:]


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
        if arg is not None and arg not in catalog.tools[tool].arguments:
            raise NotSynthesizable(f"{tool} has no recorded argument {arg!r}")
        extra = [t for t in gap.tools if t != tool and t in catalog.tools]
        roles = infer_roles(catalog, tool, extra_tools=extra)
        arg = arg or roles.id_arg
        ChainEnvironment.requirements(roles, catalog, gap)
        evidence = [m.evidence for m in gap.members]
        if arg != roles.id_arg:  # an option inside a looked-up record (a payment method)
            where, path, container, fields = option_fields(roles, catalog, arg, evidence)
            return roles, ChoicePlan(arg, container, tuple(fields), where, path)
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
        self,
        rng: random.Random,
        n: int,
        fields: Sequence[Describing],
        stated: Sequence[Describing],
    ) -> list[dict[str, str]]:
        """One value per field for each of `n` records, the first (the target) told apart from
        every other by its `stated` values: `shared` of the others (with two stated fields or
        more) share all of them but one."""
        shared = min(int(self.knobs.get("shared", 0)), n - 1) if len(stated) > 1 else 0
        target = {d.name: rng.choice(d.values) for d in fields}
        out = [target]
        for k in range(1, n):
            for _ in range(50):
                other = {d.name: rng.choice(d.values) for d in fields}
                if k <= shared:  # differs from the target in exactly one stated field
                    differ = rng.choice(list(stated))
                    other = {**other, **{d.name: target[d.name] for d in stated}}
                    other[differ.name] = rng.choice(
                        [v for v in differ.values if words(v) != words(target[differ.name])]
                    )
                if any(words(other[d.name]) != words(target[d.name]) for d in stated):
                    break
            else:  # pragma: no cover - `_texts` keeps 2+ distinct values per field
                raise NotSynthesizable("the describing fields cannot tell the records apart")
            out.append(other)
        return out

    def _in_list(
        self,
        builder: WorldBuilder,
        record: dict[str, Any],
        d: Describing,
        value: str,
        avoid: str,
    ) -> dict[str, Any]:
        """One element of the record's list (`items[*].name`) holds `value`; where `avoid` is
        another value (the target's, on a rival that does not share it), no element holds it."""
        tokens = path_tokens(d.name)
        fan = tokens.index("[*]")
        head, leaf = tokens[:fan], tokens[fan + 1 :]
        found = get_all(record, head)
        elements = [e for e in (found[0] if found and isinstance(found[0], list) else [])
                    if isinstance(e, dict)]  # fmt: skip
        if not elements:
            shape = shape_at(builder.lookup_shape, tokens[: fan + 1])
            made = builder.gen.value(shape)
            elements = [made if isinstance(made, dict) else {}]
        others = [v for v in d.values if words(v) not in (words(value), words(avoid))]
        for element in elements:
            held = get_all(element, leaf)
            if avoid and held and words(str(held[0])) == words(avoid):
                set_at(element, leaf, builder.rng.choice(others or [value]))
        set_at(elements[builder.rng.randrange(len(elements))], leaf, value)
        return set_at(record, head, elements)

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
        if plan.source != "entity":
            return self._generate_option(seed)
        n = max(2, int(self.knobs.get("candidates", 3)))
        stated = plan.fields[: max(1, min(int(self.knobs.get("fields", 1)), len(plan.fields)))]
        ctx = self.world_ctx(seed, n_targets=1, n_entities=n)
        rng = random.Random(f"{self.family}:{seed}:choice")
        self._recorded_owner(ctx, rng)
        [target] = ctx.targets
        described = self._descriptions(rng, n, plan.fields, stated)
        listed = self._listed(ctx)
        by_id = {}
        for item in listed:
            key = item if not isinstance(item, dict) else item.get(r.id_arg)
            by_id[str(key)] = item
        builder = WorldBuilder(self.catalog, r, rng, None)
        for eid, values in zip(ctx.entities, described, strict=True):
            record = ctx.state.entities[eid]
            for d in plan.fields:
                if "[*]" in d.name:
                    avoid = "" if eid == target else described[0][d.name]
                    record = self._in_list(builder, record, d, values[d.name], avoid)
                elif d.record:
                    record = set_at(record, [d.name], values[d.name])
                item = by_id.get(str(eid))
                if d.listed and isinstance(item, dict):
                    item[d.name] = values[d.name]
            ctx.state.entities[eid] = record
        ids = [str(x.get(r.id_arg) if isinstance(x, dict) else x) for x in listed]
        mine = ids.index(str(target)) if str(target) in ids else 0
        listed[:] = _placed(listed, mine, rng)  # no position is the answer
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

    def _generate_option(self, seed: int) -> Task:
        """One record whose options (`plan.path`) are `candidates` elements generated from the
        recorded element shape, differing in the describing fields; the user describes one."""
        plan, r = self.plan, self.roles
        assert plan is not None
        n = max(2, int(self.knobs.get("candidates", 3)))
        stated = plan.fields[: max(1, min(int(self.knobs.get("fields", 1)), len(plan.fields)))]
        ctx = self.world_ctx(seed, n_targets=1, n_entities=1)
        rng = random.Random(f"{self.family}:{seed}:option")
        self._recorded_owner(ctx, rng)
        [target] = ctx.targets
        tool = (r.owner if plan.source == "owner" else r.lookup) or ""
        shape = self.catalog.tools[tool].result
        tokens = path_tokens(plan.path)
        fan = next(i for i, t in enumerate(tokens) if t in ("[*]", "{*}"))
        kinds = dict(key_kinds(shape_at(shape, tokens[:fan]))) if tokens[fan] == "{*}" else {}
        arg = self.action_schema.arguments[plan.argument]
        builder = WorldBuilder(self.catalog, r, rng, None)
        builder.taken |= set(_strings([ctx.state.owners, ctx.state.entities]))
        owner = plan.source == "owner" and ctx.owner_id is not None
        holder = ctx.state.owners[ctx.owner_id] if owner else ctx.state.entities[target]
        for _ in range(20):
            described = self._descriptions(rng, n, plan.fields, stated)
            ids = [self._option_id(builder, arg, values, kinds) for values in described]
            holder = builder.plant(holder, plan.path, ids, shape)
            options = [self._option(holder, tokens, fan, v) for v in ids]
            for element, values in zip(options, described, strict=True):
                for d in plan.fields:
                    if d.name not in kinds:
                        element[d.name] = values[d.name]
            said = {d.name: str(options[0].get(d.name)) for d in stated}
            alike = [o for o in options if all(words(str(o.get(k))) == words(v)
                                               for k, v in said.items())]  # fmt: skip
            if len(alike) == 1:
                break
        else:
            raise NotSynthesizable("the options' describing fields cannot tell one apart")
        holder = self._shuffled(holder, tokens, fan, rng)
        if owner:
            ctx.state.owners[ctx.owner_id] = holder
        else:
            ctx.state.entities[target] = holder
        chosen = ids[0]
        ctx.calls[target][plan.argument] = [chosen] if arg.type == "array" else chosen
        phrase = f"{human(plan.argument)}: the {self._describe(stated, said)}"
        names = list(r.extras)
        phrases = ctx.phrases[target]
        index = names.index(plan.argument) if plan.argument in names else len(phrases)
        phrases[index : index + 1] = [phrase]
        instruction = f"Hi. {self.identity(ctx)}{self.request(ctx, [target])}"
        oracle = [
            *self.owner_chain(ctx),
            self.lookup_call(target, ctx),
            self.action_call(ctx, target),
            {"answer": self.answer(ctx, [target], [])},
        ]
        task = self.build_task(seed, ctx, instruction, Goal(), oracle)
        task.meta["choice"] = {"target": chosen, "others": ids[1:], "said": said,
                               "record": target}  # fmt: skip
        return task

    def _option_id(
        self,
        builder: WorldBuilder,
        arg: ArgSchema,
        values: Mapping[str, str],
        kinds: Mapping[str, list[str]],
    ) -> str:
        """A fresh option id; in an id-keyed map whose key names a kind field (`paypal_...`),
        one that starts with the kind wanted."""
        wanted = [values[k] for k in kinds if k in values]
        value = builder.new_id(arg)
        for _ in range(50):
            if all(value.startswith(w) for w in wanted):
                break
            value = builder.new_id(arg)
        return value

    @staticmethod
    def _option(holder: Any, tokens: list[str], fan: int, value: str) -> dict[str, Any]:
        """The element of the options container that `value` names."""
        found = get_all(holder, tokens[:fan])
        container = found[0] if found else None
        if isinstance(container, dict):
            element = container.get(value)
            return element if isinstance(element, dict) else {}
        rest = tokens[fan + 1 :]
        for element in container or []:
            if isinstance(element, dict) and rest and get_all(element, rest)[:1] == [value]:
                return element
        return {}

    @staticmethod
    def _shuffled(holder: Any, tokens: list[str], fan: int, rng: random.Random) -> Any:
        """The options in a drawn order (no position is the answer)."""
        found = get_all(holder, tokens[:fan])
        container = found[0] if found else None
        if isinstance(container, dict):  # the chosen option is the first planted
            keys = _placed(list(container), 0, rng)
            return set_at(holder, tokens[:fan], {k: container[k] for k in keys})
        if isinstance(container, list):
            return set_at(holder, tokens[:fan], _placed(list(container), 0, rng))
        return holder

    @staticmethod
    def _describe(stated: Sequence[Describing], said: Mapping[str, str]) -> str:
        """`laptop` for one field; `colour black and size large` for several."""
        if len(stated) == 1:
            return said[stated[0].name]
        return join_and([f"{_spoken(d.name)} {said[d.name]}" for d in stated])

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
        argument = self.plan.argument if self.plan is not None else r.id_arg
        noun = r.entity_noun if argument == r.id_arg else human(argument)
        given: list[Any] = []
        for a in acts:
            value = a.get(argument) if isinstance(a, Mapping) else None
            given += value if isinstance(value, list) else [value]
        mine = sum(_norm(g) == target for g in given)
        elsewhere = [g for g in given if _norm(g) != target]
        add(
            "chosen",
            mine >= 1,
            f"{r.action} ran on the {noun} the user described ({want['target']})"
            if mine
            else f"{r.action} never ran on the {noun} the user described "
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
            f"{r.action} ran on no other {noun}"
            if not elsewhere
            else f"{r.action} also ran on {elsewhere[0]!r}, which the user did not describe",
        )
        answer = f" {_norm(' '.join((episode.answer or '').split()))} "
        others = [str(o) for o in want["others"] if f" {_norm(o)} " in answer]
        handled = str(want.get("record") or want["target"])  # the record acted on
        named = f" {_norm(handled)} " in answer
        detail = (
            f"the answer names {handled} and no other candidate"
            if named and not others
            else f"the answer names {others[0]!r}, which was not chosen"
            if others
            else f"the answer does not name {handled}"
        )
        checks.append(
            {
                "name": "answer",
                "part": "communication",
                "ok": named and not others,
                "detail": detail,
            }
        )
        return self._grade(checks)


__all__ = ["ChoicePlan", "Describing", "RecordChoiceEnv", "chosen_argument", "describing_fields"]
