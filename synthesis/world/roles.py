"""Roles: which recorded tool finds the owner, looks records up and acts on them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tracegym.analysis.tool_kinds import is_answer_tool
from tracegym.synthesis.spec import (
    ArgSchema,
    Catalog,
    ToolSchema,
    is_id_name,
)
from tracegym.synthesis.world.errors import (
    LABEL_NAMES,
    NotSynthesizable,
)


# Roles ------------------------------------------------------------------------------------------
@dataclass
class Roles:
    """Which recorded tool plays which part, and where values live in their results."""

    action: str
    id_arg: str
    entity_noun: str
    lookup: str | None = None
    lookup_arg: str | None = None
    owner: str | None = None
    owner_arg: str | None = None
    owner_path: str | None = None  # entity ids in the owner record: `orders[*]`
    finder: str | None = None
    finder_path: str | None = None  # the owner id in the finder's result: `$`
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)  # the action's other args
    label_path: str | None = None  # a word-like field naming the entity: `items[*].name`
    status: dict[str, Any] | None = None  # {"field", "allowed", "refused", "after", "mined"}
    answer_tool: str | None = None
    answer_arg: str | None = None
    others: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Roles:
        return cls(**data)


def _noun(arg: str) -> str:
    base = re.sub(r"(_ids?|Ids?|ID)$", "", arg).replace("_", " ").strip()
    return base or "record"


def _id_argument(tool: ToolSchema, catalog: Catalog) -> str | None:
    candidates = [a for a in tool.arguments.values() if a.required and a.type == "string"]

    def looked_up(name: str) -> bool:
        return any(
            t.read and name in t.required and t.result.get("type") == "object"
            for t in catalog.tools.values()
        )

    def score(a: ArgSchema) -> tuple:
        fed = sum(f.count for f in catalog.flows_into(tool.name, a.name))
        id_formats = any(any(k == "digits" for k, _ in f["parts"]) for f in a.formats)
        # an id some read tool looks records up by, then any id, then the earliest argument
        return (
            is_id_name(a.name),
            looked_up(a.name),
            id_formats,
            -list(tool.arguments).index(a.name),
            fed,
        )

    ranked = sorted(candidates, key=score, reverse=True)
    if ranked and (is_id_name(ranked[0].name) or score(ranked[0])[1]):
        return ranked[0].name
    return None


def _same_format(a: ArgSchema | None, b: ArgSchema | None) -> bool:
    if a is None or b is None or not a.formats or not b.formats:
        return False
    return a.formats[0]["regex"] == b.formats[0]["regex"]


def _label_path(shape: Mapping[str, Any], prefix: str = "", depth: int = 0) -> str | None:
    """The best word-like string leaf (product name, item) in a result shape."""
    if depth > 3 or shape.get("type") != "object":
        if shape.get("type") == "array" and depth <= 3:
            return _label_path(shape.get("items", {}), f"{prefix}[*]", depth + 1)
        return None
    props = shape.get("properties", {})
    ranked = sorted(
        props, key=lambda k: (k not in LABEL_NAMES, LABEL_NAMES.index(k) if k in LABEL_NAMES else 0)
    )
    for key in ranked:
        sub = props[key]
        if (
            key in LABEL_NAMES
            and sub.get("type") == "string"
            and sub.get("wordlike")
            and len(sub.get("examples", [])) >= 2
        ):
            return f"{prefix}.{key}" if prefix else key
    for key in ranked:
        sub = props[key]
        if sub.get("type") in ("object", "array"):
            found = _label_path(sub, f"{prefix}.{key}" if prefix else key, depth + 1)
            if found:
                return found
    return None


def _leaves_named(shape: Mapping[str, Any], name: str, prefix: str = "", depth: int = 0) -> list:
    """Fan-free paths to the leaves called `name` (the fields a write's argument of that name
    sets: copying its value from the same record would change nothing)."""
    if depth > 3 or shape.get("type") != "object":
        return []
    out: list[str] = []
    for key, sub in (shape.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if key == name and sub.get("type") in ("string", "integer", "number"):
            out.append(path)
        elif sub.get("type") == "object":
            out.extend(_leaves_named(sub, name, path, depth + 1))
    return out


def infer_roles(catalog: Catalog, action: str, *, extra_tools: Sequence[str] = ()) -> Roles:
    """The roles around the write `action`; raises NotSynthesizable when it has no id argument."""
    tools = catalog.tools
    if action not in tools:
        raise NotSynthesizable(f"no recorded calls of {action}: its schema is unknown")
    schema = tools[action]
    if schema.read:
        raise NotSynthesizable(f"{action} only reads: there is no action to get right")
    id_arg = _id_argument(schema, catalog)
    if id_arg is None:
        raise NotSynthesizable(f"{action} has no argument that identifies a record")
    roles = Roles(action=action, id_arg=id_arg, entity_noun=_noun(id_arg))
    id_schema = schema.arguments[id_arg]

    reads = [t for t in tools.values() if t.read and t.name != action]
    lookups = [t for t in reads if id_arg in t.required and t.result.get("type") == "object"]
    if not lookups:
        lookups = [
            t
            for t in reads
            if len(t.required) == 1
            and t.result.get("type") == "object"
            and _same_format(t.arguments[t.required[0]], id_schema)
        ]
    if lookups:
        lookup = max(lookups, key=lambda t: (t.calls, t.name))
        roles.lookup = lookup.name
        roles.lookup_arg = id_arg if id_arg in lookup.required else lookup.required[0]

    # the owner: a read whose result lists the entity ids
    sinks = [(roles.lookup, roles.lookup_arg), (action, id_arg)]
    owner_flows = [
        f
        for t, a in sinks
        if t
        for f in catalog.flows_into(t, a)
        if ("[*]" in f.path or "{*}" in f.path)
        and f.source in tools
        and tools[f.source].read
        and f.source != roles.lookup
    ]
    if owner_flows:
        best = max(owner_flows, key=lambda f: f.count)
        roles.owner, roles.owner_path = best.source, best.path
    else:
        for t in reads:
            for key, sub in t.result.get("properties", {}).items():
                items = sub.get("items", {}) if sub.get("type") == "array" else {}
                if items.get("type") == "string" and _same_format(
                    ArgSchema("x", formats=items.get("formats", [])), id_schema
                ):
                    roles.owner, roles.owner_path = t.name, f"{key}[*]"
                elif items.get("type") == "object" and id_arg in items.get("properties", {}):
                    roles.owner, roles.owner_path = t.name, f"{key}[*].{id_arg}"
            if roles.owner:
                break
    if roles.owner:
        owner = tools[roles.owner]
        # an owner is a record (not a list) found by its own id, not by the entity's
        if (
            not owner.required
            or roles.owner == roles.lookup
            or owner.result.get("type") != "object"
            or id_arg in owner.required
        ):
            roles.owner = roles.owner_path = None
        else:
            roles.owner_arg = owner.required[0]
            finder_flows = [
                f
                for f in catalog.flows_into(roles.owner, roles.owner_arg)
                if f.source in tools
                and tools[f.source].read
                and f.source not in (roles.owner, roles.lookup)
                and "[*]" not in f.path
                and "{*}" not in f.path
            ]
            if finder_flows:
                best = max(finder_flows, key=lambda f: f.count)
                roles.finder, roles.finder_path = best.source, best.path
            if roles.finder and not tools[roles.finder].required:
                roles.finder = roles.finder_path = None

    # the action's other arguments: where the traces say their values come from
    for arg in schema.arguments.values():
        if arg.name == id_arg or not arg.required:
            continue
        source: dict[str, Any]
        flows = catalog.flows_into(action, arg.name)
        top = max((f.count for f in flows), default=0)
        taken = {e.get("path") for e in roles.extras.values()}
        local = [
            f
            for f in flows
            if f.source in (roles.lookup, roles.owner)
            and f.source
            and f.count * 2 >= top  # the usual source, not a coincidence
            and f.path not in taken
        ]
        lookup_shape = tools[roles.lookup].result if roles.lookup else {}
        own = [p for p in _leaves_named(lookup_shape, arg.name)]
        local = [f for f in local if not (f.source == roles.lookup and [f.path] == own)]
        if arg.enum:
            source = {"source": "user", "enum": True}
        elif local:
            best = max(local, key=lambda f: f.count)
            source = {
                "source": "lookup" if best.source == roles.lookup else "owner",
                "path": best.path,
            }
        else:
            # no earlier result held the value: it came from the user's message
            source = {"source": "user"}
        roles.extras[arg.name] = source

    if roles.lookup:
        roles.label_path = _label_path(tools[roles.lookup].result)
    rule = catalog.status_rules.get(action)
    if rule and rule.lookup == roles.lookup and rule.allowed:
        roles.status = {
            "field": rule.field,
            "allowed": rule.allowed[:1],
            "refused": list(rule.refused),  # empty: the runs showed no status it is refused in
            "after": rule.after,  # None: the runs never showed the status after the write
            "mined": True,
        }
    for t in tools.values():
        if is_answer_tool(t.name) and any(a.type == "string" for a in t.arguments.values()):
            roles.answer_tool = t.name
            roles.answer_arg = next(a.name for a in t.arguments.values() if a.type == "string")
            break
    core = {action, roles.lookup, roles.owner, roles.finder, roles.answer_tool}
    wanted = [t for t in extra_tools if t in tools and t not in core]
    rest = sorted(
        (t for t in tools.values() if t.name not in core and t.name not in wanted),
        key=lambda t: (-t.calls, t.name),
    )
    roles.others = (wanted + [t.name for t in rest])[:8]
    return roles


STATUS_FIELD = "status"  # the record field status rules and `synthetic_status` read


def observed_statuses(catalog: Catalog | None, lookup: str | None) -> list[str]:
    """The string values the lookup's recorded results showed in their status field, sorted."""
    tool = catalog.tools.get(lookup or "") if catalog is not None else None
    if tool is None or tool.result.get("type") != "object":
        return []
    facts = (tool.result.get("properties") or {}).get(STATUS_FIELD) or {}
    if facts.get("type") != "string":
        return []
    return sorted(
        {v for v in facts.get("enum") or facts.get("examples") or () if isinstance(v, str)}
    )


def synthetic_status(roles: Roles, catalog: Catalog | None = None) -> dict[str, Any] | None:
    """The looked-up record's status field with its observed values, and no rule: every observed
    value allows the action, nothing is refused, the write's effect on it is unknown. None when
    the recorded records have no status field with at least two observed values (then there is
    no status to speak of, and none is invented)."""
    values = observed_statuses(catalog, roles.lookup)
    if len(values) < 2:
        return None
    return {"field": STATUS_FIELD, "allowed": values, "refused": [], "after": None,
            "mined": False}  # fmt: skip
