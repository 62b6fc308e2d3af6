"""The `list_selection` family: pass a write the right list of elements of a looked-up record.

Built only from a list rule the `wrong_list` detector mined from the agent's successful runs
(`Gap.rules`, kind ``list``): `tool`'s list `argument` is exactly the list at `path` of what
`read_tool` returned (``equal``), or elements of that one list (``subset``). Per seed each record
the user asks about (the knob `targets`; looked up by `read_tool`) holds a list of elements
generated from the recorded element shape; the user asks for the action on all of them (equal) or
on some, named by a word-like field of theirs such as an item's name (subset). Other records
(`records`) carry elements with the same names (`similar`), so taking them from the wrong record
fails; where the agent read one record's id from another (a recorded flow), they link.

The verifier checks, per record asked about, the list argument of every successful call of the
action on it (exactly the right elements, in any order, normalised as the detector compares them:
`ungrounded.loose`), that the action ran on those records and on no other, and the final answer
naming them; nothing else the agent already does (the read before the write, the other
arguments) is checked. The request follows the users' recorded words where the gap's requests
share them (`learn_request`). The system prompt is the agent's own recorded instructions and
never says which elements. Where no list rule was mined, or its tools and path are not in the
catalog, the family refuses (`NotSynthesizable`) with the reason.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tracegym.analysis import detector_names as dn
from tracegym.analysis.detectors.ungrounded import loose
from tracegym.analysis.gap import Gap, GapRequest, MinedRule
from tracegym.synthesis.base import Action, Episode, Task, Verdict
from tracegym.synthesis.conventions import Conventions
from tracegym.synthesis.families.chain import ChainEnvironment, Ctx, human, join_and
from tracegym.synthesis.goal import Goal
from tracegym.synthesis.spec import ArgSchema, Catalog, EnvironmentSpec, ToolSchema
from tracegym.synthesis.wording import IDENTITY, MIN_REQUESTS, Wording
from tracegym.synthesis.world import (
    LABEL_NAMES,
    NotSynthesizable,
    Roles,
    WorldBuilder,
    infer_roles,
    path_tokens,
    set_at,
    shape_at,
)

NAMES = "\x00names\x00"  # the slot of a request's element names
RELATIONS = ("equal", "subset")  # "named" is the user dictating values: exact_arguments' job
MIN_LABELS = 3  # observed names a subset task needs, to name some elements and not others


@dataclass(frozen=True)
class ListPlan:
    """Where the rule's list lives in the looked-up record and how one element is read.

    `list_path` is the list (``items[*]``), `field` the path inside one element that holds the
    argument's value (``item_id``; ``item_ids[*]`` when it is a list of its own; empty when the
    element is the value), `label` a word-like field naming an element (``name``), `mirror`
    the other path the traces copy the argument's values from (`Roles.extras`), kept holding
    the same values.
    """

    argument: str
    relation: str
    list_path: str
    field: str = ""
    label: str | None = None
    mirror: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ListPlan:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__ if k in data})


def _fan(tokens: list[str]) -> int | None:
    return next((i for i, t in enumerate(tokens) if t in ("[*]", "{*}")), None)


def _regex(shape: Mapping[str, Any]) -> str | None:
    formats = shape.get("formats") or []
    return formats[0].get("regex") if formats else None


def _value_field(element: Mapping[str, Any], regex: str | None) -> str | None:
    """The field of a list element holding a value in the argument's format (a string, or a
    list of strings: ``item_ids[*]``); "" when the element is such a string itself."""
    if element.get("type") == "string":
        return "" if regex is None or _regex(element) == regex else None
    if element.get("type") != "object" or regex is None:
        return None
    for key, sub in (element.get("properties") or {}).items():
        if sub.get("type") == "string" and _regex(sub) == regex:
            return str(key)
        items = sub.get("items") or {}
        if sub.get("type") == "array" and items.get("type") == "string" and _regex(items) == regex:
            return f"{key}[*]"
    return None


def _label_field(element: Mapping[str, Any], roles: Roles, list_path: str) -> str | None:
    """A word-like string field naming an element, with enough recorded names."""
    props = element.get("properties") or {} if element.get("type") == "object" else {}
    preferred = []
    if roles.label_path and roles.label_path.startswith(list_path + "."):
        preferred.append(roles.label_path[len(list_path) + 1 :])
    preferred += [k for k in LABEL_NAMES if k in props]
    for key in preferred:
        sub = props.get(key) or {}
        if sub.get("type") == "string" and len(set(sub.get("examples") or [])) >= MIN_LABELS:
            return key
    return None


def plan_list(rule: MinedRule, catalog: Catalog, roles: Roles) -> ListPlan:
    """The plan for enforcing `rule` in a world with these roles, or NotSynthesizable."""
    if rule.relation not in RELATIONS:
        raise NotSynthesizable(
            f"the mined list rule is '{rule.relation}': the list is what the user named, not a "
            "selection from a looked-up record"
        )
    action = catalog.tools[rule.tool]
    arg = action.arguments.get(rule.argument or "")
    if arg is None or arg.type != "array":
        raise NotSynthesizable(f"{rule.tool} has no recorded list argument {rule.argument!r}")
    if rule.read_tool != roles.lookup:
        raise NotSynthesizable(
            f"the rule's list comes from {rule.read_tool}, not from {roles.lookup}, the read that "
            f"looks up the record {rule.tool} acts on"
        )
    tokens = path_tokens(rule.path)
    fan = _fan(tokens)
    if not tokens or fan is None or tokens[fan] != "[*]":
        raise NotSynthesizable(f"the rule names no list in {rule.read_tool}'s result ({rule.path})")
    shape: ToolSchema = catalog.tools[rule.read_tool]
    list_tokens, rest = tokens[: fan + 1], tokens[fan + 1 :]
    element = shape_at(shape.result, list_tokens)
    container = shape_at(shape.result, list_tokens[:-1])
    if container.get("type") != "array" or element.get("type") not in ("object", "string"):
        raise NotSynthesizable(f"{rule.read_tool}'s result has no recorded list at {rule.path}")
    if any(t in ("[*]", "{*}") for t in rest[:-1]):
        raise NotSynthesizable(f"{rule.path} is a list inside a list's elements")
    list_path = _join(list_tokens)
    regex = arg.formats[0]["regex"] if arg.formats else None
    if rest:
        field = _join(rest)
        leaf = shape_at(element, rest)
        if leaf.get("type") != "string":
            raise NotSynthesizable(f"{rule.path} holds no recorded text values")
    else:
        found = _value_field(element, regex)
        if found is None:
            raise NotSynthesizable(
                f"no field of {rule.read_tool}'s {list_path} elements holds values in the format "
                f"of {rule.tool}'s {rule.argument}"
            )
        field = found
    label = _label_field(element, roles, list_path)
    if rule.relation == "subset" and label is None:
        raise NotSynthesizable(
            f"the elements of {rule.read_tool}'s {list_path} have no word-like field with "
            f"{MIN_LABELS}+ recorded values the user could name them by"
        )
    source = roles.extras.get(rule.argument or "") or {}
    mirror = source.get("path") if source.get("source") == "lookup" else None
    own = _join(path_tokens(f"{list_path}.{field}")) if field else list_path
    if mirror == own or mirror == rule.path:
        mirror = None
    return ListPlan(rule.argument or "", rule.relation or "", list_path, field, label, mirror)


def learn_request(
    requests: Sequence[GapRequest], id_arg: ArgSchema, relation: str, labels: Sequence[str] = ()
) -> Wording | None:
    """How the gap's users asked: their most common request once the one record id it names
    (in the action's id format) is a slot and, for a subset, the stretch naming the elements
    (from the first recorded element name to the last: "the Kettle and the Lamp") is the other.
    None unless `MIN_REQUESTS` requests share it, or when it holds another number the task
    would not know how to fill."""
    if not id_arg.formats:
        return None
    ids = re.compile(id_arg.formats[0]["regex"].strip("^$"))
    names = sorted({str(x) for x in labels if str(x).strip()}, key=lambda x: (-len(x), x))
    named = re.compile("|".join(rf"\b{re.escape(n)}\b" for n in names), re.I) if names else None
    counts: Counter[str] = Counter()
    spans: dict[str, list[str]] = defaultdict(list)
    for request in requests:
        text = " ".join(request.text.split())
        found = set(ids.findall(text))
        if len(found) != 1:
            continue
        record = found.pop()
        if text.count(record) != 1:
            continue
        text = text.replace(record, IDENTITY)
        said = ""
        if relation == "subset":
            hits = [m.span() for m in named.finditer(text)] if named else []
            if not hits:
                continue
            said = text[hits[0][0] : hits[-1][1]]
            if IDENTITY in said:
                continue
            text = text[: hits[0][0]] + NAMES + text[hits[-1][1] :]
        if re.search(r"\d{3,}", text.replace(IDENTITY, "")):
            continue
        counts[text] += 1
        if said and said not in spans[text]:
            spans[text].append(said)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))
    if not ranked or ranked[0][1] < MIN_REQUESTS:
        return None
    template = ranked[0][0]
    pieces = re.split(f"({re.escape(IDENTITY)}|{re.escape(NAMES)})", template)
    slots = ["identity" if p == IDENTITY else "value" for p in pieces[1::2]]
    return Wording(pieces[0::2], slots, [spans[template]] if NAMES in template else [])


def _join(tokens: list[str]) -> str:
    """Path tokens back to a path: ``["items", "[*]", "item_id"]`` -> ``items[*].item_id``."""
    return "".join(t if t.startswith(("[", "{")) else f".{t}" for t in tokens).lstrip(".")


def _under(path: str, list_path: str) -> bool:
    """`items[*].name` is under `items[*]` and under `items[*].item_id`'s list."""
    tokens = path_tokens(list_path)
    fan = _fan(tokens)
    head = _join(tokens[: fan + 1]) if fan is not None else list_path
    return path.startswith(head + ".")


def _norm(value: Any) -> str:
    return loose(str(value))


class ListSelectionEnv(ChainEnvironment):
    """The right elements in a write's list argument (module docstring)."""

    family = "list_selection"
    capability = (
        "Pass an action the elements of the looked-up record the user asked for: all of them "
        "or the ones named, no more, no fewer, none from another record."
    )
    detectors = (dn.WRONG_LIST,)

    def __init__(self, spec: EnvironmentSpec, **knobs: Any) -> None:
        super().__init__(spec, **knobs)
        planned = spec.extra.get("list")
        self.plan = ListPlan.from_dict(planned) if isinstance(planned, Mapping) else None
        worded = spec.extra.get("wording")
        self.wording = Wording.from_dict(worded) if isinstance(worded, dict) else None
        # the lists this family writes are named by it, not by the chain's record labels (which
        # would spend the recorded names on elements it replaces)
        self.label_path = self.roles.label_path
        if self.plan is not None and self.label_path:
            lists = [self.plan.list_path, *([self.plan.mirror] if self.plan.mirror else [])]
            if any(_under(self.label_path, p) for p in lists):
                self.roles.label_path = None

    def default_knobs(self) -> dict[str, Any]:
        return {"targets": 1, "length": 3, "asked": 2, "records": 1, "similar": 1, "slack": 6}

    def levels(self) -> list[dict[str, Any]]:
        """Easiest to hardest: records to act on, list length, elements asked for, other
        records, like-named elements in them."""
        base = dict(self.knobs)
        ladder = ((1, 2, 2, 0, 0), (1, 3, 2, 1, 0), (1, 3, 2, 1, 1), (2, 3, 2, 1, 1),
                  (2, 4, 3, 1, 1), (3, 4, 3, 2, 2), (3, 5, 3, 2, 2), (4, 6, 4, 3, 3))  # fmt: skip
        keys = ("targets", "length", "asked", "records", "similar")
        return [{**base, **dict(zip(keys, level, strict=True))} for level in ladder]

    # Spec construction ---------------------------------------------------------------------
    @classmethod
    def _rules(cls, gap: Gap) -> list[MinedRule]:
        rules = [r for r in gap.rules if r.kind == "list" and r.argument]
        if not rules:
            raise NotSynthesizable(
                "no list rule was mined from the agent's successful runs for this gap: "
                "nothing to enforce"
            )
        return rules

    @classmethod
    def _chosen(cls, gap: Gap, catalog: Catalog) -> tuple[MinedRule, Roles, ListPlan]:
        """The first mined list rule the catalog can express, with its roles and plan."""
        why = []
        for rule in cls._rules(gap):
            if rule.relation not in RELATIONS:
                why.append(
                    f"the mined list rule is '{rule.relation}': the list is what the user named, "
                    "not a selection from a looked-up record"
                )
                continue
            missing = [t for t in (rule.tool, rule.read_tool) if not t or t not in catalog.tools]
            if missing:
                why.append(f"{', '.join(str(m) for m in missing)} not in the recorded tools")
                continue
            try:
                roles = infer_roles(catalog, rule.tool, extra_tools=[str(rule.read_tool)])
                ChainEnvironment.requirements(roles, catalog, gap)
                return rule, roles, plan_list(rule, catalog, roles)
            except NotSynthesizable as exc:
                why.append(str(exc))
        raise NotSynthesizable("no mined list rule fits: " + "; ".join(why))

    @classmethod
    def choose_action(cls, gap: Gap, catalog: Catalog) -> tuple[str, list[str], str]:
        rule, _roles, _plan = cls._chosen(gap, catalog)
        return rule.tool, [str(rule.read_tool)], f"{rule.tool}: the tool of the mined list rule"

    @classmethod
    def build_spec(
        cls, gap: Gap, catalog: Catalog, conventions: Conventions | None = None
    ) -> EnvironmentSpec:
        rule, _roles, plan = cls._chosen(gap, catalog)
        spec = super().build_spec(gap, catalog, conventions)
        spec.extra["rules"] = [rule.to_dict()]
        spec.extra["list"] = plan.to_dict()
        env = cls(spec)
        id_arg = env.action_schema.arguments[env.roles.id_arg]
        wording = learn_request(gap.requests, id_arg, plan.relation, env._labels())
        spec.extra["wording"] = wording.to_dict() if wording is not None else None
        spec.description += f" Mined rule: {rule.statement}."
        spec.knobs = cls(spec).knobs
        return spec

    # World generation ----------------------------------------------------------------------
    def _sizes(self, names: int) -> tuple[int, int]:
        """The target list's length and how many of its elements the user asks for (a subset
        needs a distinct recorded name per element: at most `names` elements)."""
        assert self.plan is not None
        length = max(2, int(self.knobs.get("length", 3)))
        if self.plan.relation == "equal":
            return length, length
        asked = max(2, int(self.knobs.get("asked", 2)))
        length = min(max(length, asked + 1), names)
        return length, min(asked, length - 1)

    def _links(self) -> list[str]:
        """Fields of a looked-up record the agent read another record's id from (a recorded
        flow from the lookup's result into its own id argument): they link this task's
        records, so the other records (and their like-named elements) are there to be found."""
        r = self.roles
        if not r.lookup or not r.lookup_arg:
            return []
        flows = self.catalog.flows_into(r.lookup, r.lookup_arg)
        paths = {
            f.path for f in flows if f.source == r.lookup and _fan(path_tokens(f.path)) is None
        }
        return sorted(p for p in paths if p and p != "$" and p != r.lookup_arg)

    def _value_schema(self) -> ArgSchema:
        """The recorded format of the values in the read's list (they are what the agent
        copies), else the action argument's own."""
        assert self.plan is not None and self.roles.lookup
        shape = self.catalog.tools[self.roles.lookup].result
        tokens = path_tokens(self.plan.list_path) + path_tokens(self.plan.field)
        leaf = shape_at(shape, tokens)
        if leaf.get("type") == "string" and (leaf.get("formats") or leaf.get("examples")):
            return ArgSchema(
                self.plan.argument,
                formats=list(leaf.get("formats") or []),
                examples=list(leaf.get("examples") or []),
            )
        return self.action_schema.arguments[self.plan.argument]

    def _labels(self) -> list[str]:
        assert self.plan is not None and self.roles.lookup
        if not self.plan.label:
            return []
        shape = self.catalog.tools[self.roles.lookup].result
        element = shape_at(shape, path_tokens(self.plan.list_path))
        examples = (element.get("properties") or {}).get(self.plan.label, {}).get("examples")
        return sorted({str(e) for e in examples or []})

    def _fill(
        self,
        builder: WorldBuilder,
        record: dict[str, Any],
        list_path: str,
        field: str,
        values: list[str],
        label: str | None = None,
        names: list[str] | None = None,
    ) -> dict[str, Any]:
        """Make `list_path` in `record` hold one element per value, generated from the
        recorded element shape, with `field` set to the value (and `label` to its name)."""
        assert self.roles.lookup
        shape = self.catalog.tools[self.roles.lookup].result
        tokens = path_tokens(list_path)
        element_shape = shape_at(shape, tokens)
        elements: list[Any] = []
        for i, value in enumerate(values):
            if not field:
                elements.append(value)
                continue
            element = builder.gen.value(element_shape)
            element = element if isinstance(element, dict) else {}
            nested = field.endswith("[*]")
            element = set_at(
                element, path_tokens(field.removesuffix("[*]")), [value] if nested else value
            )
            if label and names:
                element = set_at(element, path_tokens(label), names[i])
            elements.append(element)
        return set_at(record, tokens[:-1], elements)

    def _mirror(
        self,
        builder: WorldBuilder,
        record: dict[str, Any],
        values: list[str],
        names: list[str] | None,
    ) -> dict[str, Any]:
        """The other path the traces copy the argument from holds the same values (and, where
        the record's label lives in that list, the same names)."""
        assert self.plan is not None and self.plan.mirror
        tokens = path_tokens(self.plan.mirror)
        fan = _fan(tokens)
        if fan is None or tokens[fan] != "[*]":
            return record
        head = _join(tokens[: fan + 1])
        tail = _join(tokens[fan + 1 :])
        label_path = self.label_path or ""
        label = label_path[len(head) + 1 :] if label_path.startswith(head + ".") else None
        return self._fill(builder, record, head, tail, values, label, names if label else None)

    def generate(self, seed: int) -> Task:
        plan = self.plan
        if plan is None:
            raise NotSynthesizable("the spec holds no list rule plan (build it with build_spec)")
        r = self.roles
        n_targets = max(1, int(self.knobs.get("targets", 1)))
        others = int(self.knobs.get("records", 1))
        ctx = self.world_ctx(seed, n_targets=n_targets, n_entities=n_targets + others)
        rng = random.Random(f"{self.family}:{seed}:list")
        builder = WorldBuilder(self.catalog, r, rng, None)
        builder.taken |= {str(v) for v in _strings(vars(ctx.state))}  # every field's strings
        arg = self._value_schema()
        pool = self._labels()
        rng.shuffle(pool)
        length, asked = self._sizes(len(pool))
        names_by: dict[str, list[str] | None] = {}
        values_by: dict[str, list[str]] = {}
        chosen_by: dict[str, list[int]] = {}
        for eid in ctx.entities:
            target = eid in ctx.targets
            n = length if target else rng.randint(2, max(2, length))
            names = None
            if pool and target:  # distinct names where the user names them
                start = rng.randrange(len(pool))
                names = [pool[(start + i) % len(pool)] for i in range(n)]
            elif pool:
                names = rng.sample(pool, min(n, len(pool)))
                n = len(names)
            values_by[eid] = [builder.new_id(arg) for _ in range(n)]
            names_by[eid] = names
            if target:
                chosen_by[eid] = sorted(rng.sample(range(n), asked))
        wanted = [names_by[t][i] for t in ctx.targets if names_by[t] for i in chosen_by[t]]
        self._similar(ctx.targets, wanted, names_by)
        for eid in ctx.entities:
            record = ctx.state.entities[eid]
            record = self._fill(builder, record, plan.list_path, plan.field, values_by[eid],
                                plan.label, names_by[eid])  # fmt: skip
            if plan.mirror:
                record = self._mirror(builder, record, values_by[eid], names_by[eid])
            ctx.state.entities[eid] = record
        self._link(ctx)
        expected: dict[str, list[str]] = {}
        said: dict[str, str] = {}
        for t in ctx.targets:
            every = values_by[t]
            expected[t] = (
                list(every) if plan.relation == "equal" else [every[i] for i in chosen_by[t]]
            )
            ctx.calls[t][plan.argument] = expected[t]
            said[t] = self._phrase_list(plan, names_by[t], chosen_by[t])
            index = list(r.extras).index(plan.argument) if plan.argument in r.extras else None
            phrases = ctx.phrases[t]
            if index is not None and index < len(phrases):
                phrases[index] = said[t]
            else:
                phrases.insert(0, said[t])
        instruction = self._instruction(ctx, said, names_by, chosen_by)
        oracle: list[Action] = []
        for t in ctx.targets:
            oracle += [self.lookup_call(t, ctx), self.action_call(ctx, t)]
        oracle.append({"answer": self.answer(ctx, list(ctx.targets), [])})
        goal = Goal(answer_includes=list(ctx.targets))
        task = self.build_task(seed, ctx, instruction, goal, oracle)
        task.meta["list"] = {"expected": expected, "answer": list(ctx.targets)}
        return task

    def _link(self, ctx: Ctx) -> None:
        """Each record names the next one in the fields `_links` found (a ring)."""
        links, entities = self._links(), ctx.entities
        if not links or len(entities) < 2:
            return
        for i, eid in enumerate(entities):
            for path in links:
                ctx.state.entities[eid] = set_at(
                    ctx.state.entities[eid], path_tokens(path), entities[(i + 1) % len(entities)]
                )

    def _similar(
        self, targets: list[str], wanted: list[str], names_by: dict[str, list[str] | None]
    ) -> None:
        """The knob `similar`: the other records hold elements named like the ones asked for
        (the first other record `similar` of them, the next one fewer, ...)."""
        similar = int(self.knobs.get("similar", 0))
        others = [e for e in names_by if e not in targets]
        for k, eid in enumerate(others):
            names = names_by[eid] or []
            for j, name in enumerate(wanted[: max(0, similar - k)]):
                if j < len(names) and name not in names:
                    names[j] = name

    def _instruction(
        self,
        ctx: Ctx,
        said: dict[str, str],
        names_by: dict[str, list[str] | None],
        chosen_by: dict[str, list[int]],
    ) -> str:
        """The request in the users' recorded words where they were learnt (the record in its
        slot, the names asked for in the one slot where users' requests differ), with the
        arguments those words do not cover in brackets; else (and for several records) the
        chain's phrasing."""
        wording = self.wording
        plain = f"Hi. {self.request(ctx, list(ctx.targets))}"
        if wording is None or len(ctx.targets) != 1:
            return plain
        [target] = ctx.targets
        names = names_by[target]
        values = (
            [join_and([names[i] for i in chosen_by[target]])]
            if wording.value_slots and names
            else []
        )
        if len(values) != wording.value_slots:
            return plain
        rest = [p for p in ctx.phrases[target] if not (values and p == said[target])]
        text = wording.fill(identity=target, values=values).strip()
        return text + (f" ({'; '.join(rest)})" if rest else "")

    def _phrase_list(self, plan: ListPlan, names: list[str] | None, chosen: list[int]) -> str:
        noun = human(plan.argument)
        if plan.relation == "equal":
            return f"{noun}: all of them"
        assert names is not None
        return f"{noun}: " + join_and([f"the {names[i]}" for i in chosen])

    # Verification --------------------------------------------------------------------------
    def verify(self, episode: Episode) -> Verdict:
        """The lists, the records and the answer (module docstring); nothing else."""
        task = episode.task
        want = task.meta["list"]
        expected = {t: sorted({_norm(v) for v in vs}) for t, vs in want["expected"].items()}
        r, plan = self.roles, self.plan
        assert plan is not None
        checks: list[dict[str, Any]] = []

        def add(name: str, part: str, ok: bool, detail: str) -> None:
            checks.append({"name": name, "part": part, "ok": bool(ok), "detail": detail})

        add(
            "finished",
            "action",
            episode.answer is not None and not episode.truncated,
            "answered within the step budget"
            if not episode.truncated
            else f"ran out of steps ({task.max_steps})",
        )
        acts = [
            s["action"].get("arguments")
            for s in episode.calls
            if not s.get("error") and s["action"].get("name") == r.action
        ]
        acts = [a if isinstance(a, Mapping) else {} for a in acts]
        elsewhere = [a.get(r.id_arg) for a in acts if a.get(r.id_arg) not in expected]
        add(
            "only_records",
            "action",
            not elsewhere,
            f"{r.action} ran on no other {r.entity_noun}"
            if not elsewhere
            else f"{r.action} also ran on {elsewhere[0]!r}",
        )
        for record, right in expected.items():
            mine = [a for a in acts if a.get(r.id_arg) == record]
            add(
                "record",
                "action",
                bool(mine),
                f"{r.action} {'ran' if mine else 'did not run'} on {r.entity_noun} {record}",
            )
            wrong = []
            for arguments in mine:
                given = arguments.get(plan.argument)
                got = [_norm(v) for v in given] if isinstance(given, list) else None
                if got is None or len(got) != len(set(got)) or sorted(got) != right:
                    wrong.append(given)
            ok = bool(mine) and not wrong
            where = f"for {r.entity_noun} {record}"
            detail = (
                f"{plan.argument} held exactly the {len(right)} element(s) asked for {where}"
                if ok
                else f"{plan.argument} was {wrong[0]!r}, not the {len(right)} element(s) asked "
                f"for {where}"
                if wrong
                else f"{plan.argument} was never passed {where}"
            )
            add("list", "action", ok, detail)
        answer = " ".join((episode.answer or "").split()).casefold()
        add("answered", "communication", bool(answer), "the answer is not empty")
        for text in want.get("answer", []):
            found = str(text).casefold() in answer
            add(
                "answer_includes",
                "communication",
                found,
                f"the answer {'mentions' if found else 'does not mention'} {text!r}",
            )
        return self._grade(checks)


def _strings(value: Any) -> list[str]:
    """Every string in a JSON-like value (ids already taken in the world)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


__all__ = ["ListPlan", "ListSelectionEnv", "plan_list"]
