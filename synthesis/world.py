"""A simulated backend for the agent's own tools: roles, generated records, tool semantics.

Every environment family works on the same small world, built from the `Catalog` inferred from
the traces:

    finder (user-facing attributes -> owner id)        find_user_id_by_name_zip(first_name, ...)
      -> owner lookup (owner id -> record listing ids)  get_user_details(user_id) .orders[*]
        -> lookup (entity id -> entity record)          get_order_details(order_id)
          -> action (a write on the entity)             cancel_pending_order(order_id, reason)

`infer_roles` finds these roles from the mined data flows (names only as a fallback); any of
finder / owner lookup may be missing. Records are generated from the recorded result shapes, with
ids, owner links, labels (`items[*].name`) and the values the action's other arguments need
planted where the traces say they come from (`payment_history[*].payment_method_id`). Every
other recorded tool stays callable: reads answer from their result shape, deterministically per
arguments; writes land in the state (and so break the state hash: side effects count).
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tracegym.analysis.tool_kinds import is_answer_tool
from tracegym.synthesis.spec import (
    ArgSchema,
    Catalog,
    ToolSchema,
    formats_of,
    is_id_name,
    is_id_value,
    is_wordlike,
    json_type,
    matches_format,
)

MEMORY_SEARCH = "search_memory"
MEMORY_UPDATE = "update_memory"
FALLBACK_LABELS = (
    "Headphones",
    "Keyboard",
    "Monitor",
    "Desk Lamp",
    "Webcam",
    "Charger",
    "Backpack",
    "Kettle",
    "Blender",
    "Tablet",
    "Smart Watch",
    "Speaker",
    "Printer",
    "Router",
    "Camera",
    "Jacket",
    "Sneakers",
    "Water Bottle",
    "Notebook",
    "Office Chair",
    "Air Purifier",
    "Coffee Maker",
    "Hiking Boots",
    "Sunglasses",
    "Yoga Mat",
    "Toaster",
    "Microphone",
    "Power Bank",
    "Drone",
    "Bookshelf",
    "Tent",
    "Skateboard",
    "Wall Clock",
    "Fan",
    "Electric Toothbrush",
    "Gaming Mouse",
)
LABEL_NAMES = ("name", "item", "title", "product", "product_name", "label", "description")


class NotSynthesizable(ValueError):
    """The gap's tools cannot be turned into this family's environment (the message says why)."""


class ToolError(Exception):
    """A tool call that fails; `invalid` marks invalid invocations (schema violations)."""

    def __init__(self, message: str, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid


# JSON helpers -----------------------------------------------------------------------------------
def canonical_value(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        number = round(float(value), 6)
        return int(number) if number.is_integer() else number
    if isinstance(value, Mapping):
        return {str(k): canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical_value(v) for v in value]
    return str(value)


def canonical(value: Any) -> str:
    return json.dumps(
        canonical_value(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def clone(value: Any) -> Any:
    return json.loads(json.dumps(value))


def digest(value: Any) -> str:
    """A short hash of JSON-like data (key order does not matter)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# Paths: `$`, `a.b`, `items[*].name`, `payment_methods{*}`, `variants{*}.item_id` -----------------
_PATH = re.compile(r"\[\*\]|\{\*\}|[^.\[\{]+")


def path_tokens(path: str | None) -> list[str]:
    if not path or path == "$":
        return []
    return _PATH.findall(path)


def get_all(value: Any, tokens: Sequence[str]) -> list[Any]:
    """Every value at the path (fanning out over `[*]` and `{*}`)."""
    if not tokens:
        return [value]
    head, rest = tokens[0], tokens[1:]
    if head == "[*]":
        items = value if isinstance(value, list) else []
        return [x for item in items for x in get_all(item, rest)]
    if head == "{*}":
        if not isinstance(value, Mapping):
            return []
        if not rest:
            return list(value)
        return [x for item in value.values() for x in get_all(item, rest)]
    if isinstance(value, Mapping) and head in value:
        return get_all(value[head], rest)
    return []


_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def shape_at(shape: Mapping[str, Any], tokens: Sequence[str]) -> Mapping[str, Any]:
    for token in tokens:
        if token == "[*]":
            shape = shape.get("items") or {}
        elif token == "{*}":
            shape = shape.get("values") or {}
        else:
            shape = (shape.get("properties") or {}).get(token) or {}
    return shape if shape else _EMPTY_OBJECT  # the shape itself: compiled makers are cached


def _container(root: dict[str, Any], tokens: Sequence[str]) -> dict[str, Any]:
    node = root
    for token in tokens:
        nxt = node.get(token)
        if not isinstance(nxt, dict):
            nxt = {}
            node[token] = nxt
        node = nxt
    return node


def set_at(root: Any, tokens: Sequence[str], value: Any) -> Any:
    """Set a path without fan-out, creating objects on the way; returns the (new) root."""
    if not tokens:
        return value
    if not isinstance(root, dict):
        root = {}
    _container(root, tokens[:-1])[tokens[-1]] = value
    return root


def _fan(tokens: Sequence[str]) -> int | None:
    return next((i for i, t in enumerate(tokens) if t in ("[*]", "{*}")), None)


# Value generation -------------------------------------------------------------------------------
# Result shapes are compiled once into closures over `rng.random()` (generating a task's records
# is the hot path of task generation: 1,000 tasks must take well under a second).
Maker = Callable[[Callable[[], float]], Any]
_COMPILED: dict[int, tuple[Any, Maker]] = {}


def _part_maker(part: Any) -> Maker:
    if isinstance(part, str):
        return lambda r: part
    if isinstance(part[0], int):
        lo, span = part
        return lambda r: str(lo + int(r() * span))
    words, n = part, len(part)
    return lambda r: words[int(r() * n)]


def _format_maker(fmt: Mapping[str, Any]) -> Maker:
    parts: list[Any] = []
    for kind, detail in fmt["parts"]:
        if kind == "literal":
            if parts and isinstance(parts[-1], str):
                parts[-1] += detail
            else:
                parts.append(detail)
        elif kind == "digits":
            lo, span = (10 ** (detail - 1), 9 * 10 ** (detail - 1)) if detail > 1 else (0, 10)
            parts.append((lo, span))
        else:
            parts.append(tuple(detail))
    # the common shapes (`\d{10}`, `#W\d{7}`, `word_word_\d{4}`) as single closures
    if len(parts) == 1:
        return _part_maker(parts[0])
    if len(parts) == 2 and isinstance(parts[0], str) and isinstance(parts[1][0], int):
        prefix, (lo, span) = parts[0], parts[1]
        return lambda r: prefix + str(lo + int(r() * span))
    makers = [_part_maker(part) for part in parts]
    return lambda r: "".join([m(r) for m in makers])


def _string_maker(facts: Mapping[str, Any]) -> Maker:
    formats = facts.get("formats") or []
    if formats:
        makers = [_format_maker(f) for f in formats]
        if len(makers) == 1:
            return makers[0]
        total = sum(f["share"] for f in formats)
        bounds = []
        acc = 0.0
        for f in formats:
            acc += f["share"] / total
            bounds.append(acc)

        def pick(r: Callable[[], float]) -> str:
            x = r()
            for bound, maker in zip(bounds, makers, strict=True):
                if x < bound:
                    return maker(r)
            return makers[-1](r)

        return pick
    examples = tuple(facts.get("examples") or ("n/a",))
    return lambda r: examples[int(r() * len(examples))]


def _number_maker(facts: Mapping[str, Any], integer: bool) -> Maker:
    lo, hi = facts.get("min", facts.get("minimum")), facts.get("max", facts.get("maximum"))
    lo = 1.0 if lo is None else float(lo)
    hi = max(lo, 100.0 if hi is None else float(hi))
    if integer:
        base, span = int(lo), int(hi) - int(lo) + 1
        return lambda r: base + int(r() * span)
    decimals = facts.get("decimals")
    places = 2 if decimals is None else int(decimals)
    width = hi - lo
    return lambda r: round(lo + r() * width, places)


def compile_shape(shape: Mapping[str, Any], depth: int = 0) -> Maker:
    """A function `make(rng.random) -> value` for a result shape (cached per shape object)."""
    cached = _COMPILED.get(id(shape))
    if cached is not None and cached[0] is shape:
        return cached[1]
    kind = shape.get("type", "string")
    maker: Maker
    if kind == "string":
        maker = _string_maker(shape)
    elif kind in ("integer", "number"):
        maker = _number_maker(shape, kind == "integer")
    elif kind == "boolean":
        maker = lambda r: r() < 0.5  # noqa: E731
    elif kind == "null" or depth > 4:
        maker = lambda r: None  # noqa: E731
    elif kind == "object":
        props = shape.get("properties", {})
        fields = [(k, compile_shape(props[k], depth + 1)) for k in shape.get("required", props)]
        maker = lambda r: {k: f(r) for k, f in fields}  # noqa: E731
    elif kind == "map":
        key = _string_maker(shape.get("keys", {}))
        item = compile_shape(shape.get("values", {}), depth + 1)

        def maker(r: Callable[[], float]) -> dict[str, Any]:
            out = {}
            for _ in range(1 + (r() < 0.5)):
                name = key(r)
                value = item(r)
                if isinstance(value, dict):
                    for field_name in ("id", "item_id"):
                        if field_name in value:
                            value[field_name] = name
                out[name] = value
            return out

    elif kind == "array":
        item = compile_shape(shape.get("items", {"type": "string"}), depth + 1)
        maker = lambda r: [item(r) for _ in range(1 + (r() < 0.5))]  # noqa: E731
    else:
        maker = lambda r: None  # noqa: E731
    if len(_COMPILED) > 50_000:
        _COMPILED.clear()
    _COMPILED[id(shape)] = (shape, maker)
    return maker


_ARG_MAKERS: dict[int, tuple[Any, Maker]] = {}
_ID_MAKERS: dict[int, tuple[Any, Maker]] = {}


def _arg_maker(arg: ArgSchema) -> Maker:
    """A value maker for one argument schema (cached per schema object)."""
    cached = _ARG_MAKERS.get(id(arg))
    if cached is not None and cached[0] is arg:
        return cached[1]
    facts = {
        "formats": arg.formats,
        "examples": arg.examples,
        "min": arg.minimum,
        "max": arg.maximum,
        "decimals": arg.decimals,
    }
    maker: Maker
    if arg.enum:
        choices = tuple(arg.enum)
        maker = lambda r: choices[int(r() * len(choices))]  # noqa: E731
    elif arg.type == "array":
        inner = (
            _number_maker(facts, arg.items == "integer")
            if arg.items in ("integer", "number")
            else _string_maker(facts)
        )
        maker = lambda r: [inner(r)]  # noqa: E731
    elif arg.type in ("integer", "number"):
        maker = _number_maker(facts, arg.type == "integer")
    elif arg.type == "boolean":
        maker = lambda r: r() < 0.5  # noqa: E731
    elif arg.type == "object":
        maker = lambda r: {}  # noqa: E731
    else:
        maker = _string_maker(facts)
    if len(_ARG_MAKERS) > 50_000:
        _ARG_MAKERS.clear()
    _ARG_MAKERS[id(arg)] = (arg, maker)
    return maker


class Gen:
    """Values shaped like the recorded ones (formats, examples, ranges), from one Random."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def from_format(self, fmt: Mapping[str, Any]) -> str:
        return _format_maker(fmt)(self.rng.random)

    def string(self, facts: Mapping[str, Any]) -> str:
        return _string_maker(facts)(self.rng.random)

    def number(self, facts: Mapping[str, Any], integer: bool = False) -> float | int:
        return _number_maker(facts, integer)(self.rng.random)

    def value(self, shape: Mapping[str, Any]) -> Any:
        return compile_shape(shape)(self.rng.random)

    def argument(self, arg: ArgSchema) -> Any:
        return _arg_maker(arg)(self.rng.random)

    def unique(self, make: Any, taken: set[Any], tries: int = 50) -> Any:
        for _ in range(tries):
            value = make()
            key = value if isinstance(value, str) else canonical(value)
            if key not in taken:
                taken.add(key)
                return value
        raise NotSynthesizable(
            "cannot generate distinct values: the recorded formats are too narrow"
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
        if not owner.required or roles.owner == roles.lookup:
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
        if arg.enum:
            source = {"source": "user", "enum": True}
        elif local:
            best = max(local, key=lambda f: f.count)
            source = {
                "source": "lookup" if best.source == roles.lookup else "owner",
                "path": best.path,
            }
        elif flows or not roles.lookup:
            source = {"source": "user"}  # it comes from elsewhere: the user states it
        else:
            source = {"source": "record", "path": arg.name}  # no evidence: keep it on file
        roles.extras[arg.name] = source

    if roles.lookup:
        roles.label_path = _label_path(tools[roles.lookup].result)
    rule = catalog.status_rules.get(action)
    if rule and rule.lookup == roles.lookup and rule.allowed:
        roles.status = {
            "field": rule.field,
            "allowed": rule.allowed[:1],
            "refused": rule.refused or ["closed"],
            "after": rule.after or f"{action.replace('_', ' ')} done",
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


def synthetic_status(roles: Roles) -> dict[str, Any]:
    """A status field for records whose recorded shape has none."""
    return {
        "field": "status",
        "allowed": ["open"],
        "refused": ["closed", "on hold"],
        "after": f"{roles.action.replace('_', ' ')} done",
        "mined": False,
    }


# Safe arithmetic for `calculate`-like tools ------------------------------------------------------
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ValueError("only + - * / on numbers")


def calculate(expression: str) -> str:
    if len(expression) > 200:
        raise ToolError("expression too long")
    try:
        return str(round(_arith(ast.parse(expression, mode="eval")), 2))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        raise ToolError(f"cannot calculate {expression!r}: {exc}") from None


# The backend ------------------------------------------------------------------------------------
MEMORY_TOOLS = {
    MEMORY_SEARCH: ToolSchema(
        MEMORY_SEARCH,
        {"query": ArgSchema("query", "string", True)},
        {"type": "array"},
        read=True,
        description="Search your notes (shared across conversations). Returns matching notes "
        "with their key, content and the source they were written from.",
    ),
    MEMORY_UPDATE: ToolSchema(
        MEMORY_UPDATE,
        {"key": ArgSchema("key", "string", True), "content": ArgSchema("content", "string", True)},
        {"type": "string"},
        read=False,
        description="Write (or overwrite) the note under `key`.",
    ),
}


class ToolWorld:
    """Executes tool calls against a task's state (a JSON-like dict).

    Public state (what the verifier hashes): `owners`, `entities`, `memory`, `writes`. Keys that
    start with `_` are the backend's own bookkeeping (finder attributes, flaky reads, silent
    failures) and never reach the hash.
    """

    def __init__(
        self, catalog: Catalog, roles: Roles, *, memory: bool = False, strict_formats: bool = False
    ) -> None:
        self.catalog = catalog
        self.roles = roles
        self.strict_formats = strict_formats
        names = [n for n in (roles.finder, roles.owner, roles.lookup, roles.action) if n]
        names += [n for n in roles.others if n not in names]
        if roles.answer_tool:
            names.append(roles.answer_tool)
        self.schemas: dict[str, ToolSchema] = {n: catalog.tools[n] for n in names}
        if memory:
            self.schemas.update(MEMORY_TOOLS)

    def json_schemas(self) -> list[dict[str, Any]]:
        out = []
        for schema in self.schemas.values():
            item = schema.json_schema()
            if schema.name == self.roles.answer_tool:
                item["function"]["description"] = (
                    "Send the final answer to the user (ends the task)."
                )
            out.append(item)
        return out

    # validation
    def check_arguments(self, name: str, arguments: Any) -> dict[str, Any]:
        schema = self.schemas.get(name)
        if schema is None:
            raise ToolError(f"unknown tool {name!r}", invalid=True)
        if not isinstance(arguments, Mapping):
            raise ToolError(f"{name}: arguments must be an object", invalid=True)
        missing = [a for a in schema.required if a not in arguments]
        if missing:
            raise ToolError(
                f"{name}: missing required argument(s) {', '.join(missing)}", invalid=True
            )
        unknown = [a for a in arguments if a not in schema.arguments]
        if unknown:
            raise ToolError(
                f"{name}: unexpected argument(s) {', '.join(map(str, unknown))}", invalid=True
            )
        for key, value in arguments.items():
            arg = schema.arguments[key]
            kind = json_type(value)
            ok = kind == arg.type or (arg.type == "number" and kind == "integer")
            if ok and arg.type == "array":
                want = arg.items or "string"
                ok = all(
                    json_type(v) == want or (want == "number" and json_type(v) == "integer")
                    for v in value
                )
            if not ok:
                raise ToolError(
                    f"{name}: {key} must be {arg.type}"
                    + (f" of {arg.items}" if arg.type == "array" else "")
                    + f", got {kind}",
                    invalid=True,
                )
            if self.strict_formats and arg.formats and name == self.roles.action:
                values = value if isinstance(value, list) else [value]
                bad = [
                    v for v in values if isinstance(v, str) and not matches_format(v, arg.formats)
                ]
                if bad:
                    raise ToolError(
                        f"{name}: {key}={bad[0]!r} does not match {arg.formats[0]['regex']}",
                        invalid=True,
                    )
            if arg.enum and value not in arg.enum:
                raise ToolError(f"{name}: {key} must be one of {arg.enum}", invalid=True)
        return dict(arguments)

    # execution
    def call(self, state: dict[str, Any], name: str, arguments: Any) -> Any:
        args = self.check_arguments(name, arguments)
        r = self.roles
        if name == MEMORY_SEARCH:
            query = str(args.get("query", "")).casefold()
            notes = [{"key": k, **v} for k, v in sorted(state["memory"].items())]
            return [n for n in notes if query in canonical(n).casefold()] if query else notes
        if name == MEMORY_UPDATE:
            state["memory"][str(args["key"])] = {"content": str(args["content"])}
            return "saved"
        if name == r.finder:
            return self._find(state, args)
        if name == r.owner:
            oid = args.get(r.owner_arg)
            if oid not in state["owners"]:
                raise ToolError(f"{r.owner_arg} {oid!r} not found")
            return state["owners"][oid]
        if name == r.lookup:
            eid = args.get(r.lookup_arg)
            if eid not in state["entities"]:
                raise ToolError(f"{r.lookup_arg} {eid!r} not found")
            flaky = state["_flaky"]
            if flaky.get(eid, 0) > 0:
                flaky[eid] -= 1
                raise ToolError(f"{name}: upstream timeout, try again")
            return state["entities"][eid]
        if name == r.action:
            return self._act(state, args)
        schema = self.schemas[name]
        lowered = name.lower()
        if lowered.startswith("calculate") or lowered.startswith("compute"):
            expression = next((v for v in args.values() if isinstance(v, str)), "")
            return calculate(expression)
        if lowered.startswith("think"):
            return ""
        rng = random.Random(f"{state['_seed']}:{name}:{canonical(args)}")
        result = Gen(rng).value(schema.result)
        if not schema.read:
            state["writes"].append({"tool": name, "arguments": canonical_value(args)})
        return result

    def _find(self, state: dict[str, Any], args: Mapping[str, Any]) -> Any:
        wanted = {k: str(v).strip().casefold() for k, v in args.items()}
        for oid, attrs in state["_finder"].items():
            if all(str(attrs.get(k, "")).strip().casefold() == v for k, v in wanted.items()):
                tokens = path_tokens(self.roles.finder_path)
                if not tokens:
                    return oid
                return set_at({}, tokens, oid)
        raise ToolError("no matching record found")

    def _act(self, state: dict[str, Any], args: Mapping[str, Any]) -> Any:
        r = self.roles
        eid = args.get(r.id_arg)
        record = state["entities"].get(eid)
        if record is None:
            raise ToolError(f"{r.id_arg} {eid!r} not found")
        status = state.get("_status")
        silent = state["_silent"]
        if status:
            current = record.get(status["field"])
            if state.get("_guard") and current not in status["allowed"]:
                raise ToolError(f"{r.action}: not allowed while {status['field']} is {current!r}")
        if silent.get(eid, 0) > 0:
            silent[eid] -= 1
            shown = dict(record)
            if status:
                shown[status["field"]] = status["after"]
            return self._action_result(shown)
        if status:
            record[status["field"]] = status["after"]
        state["writes"].append({"tool": r.action, "arguments": canonical_value(args)})
        return self._action_result(record)

    def _action_result(self, record: dict[str, Any]) -> Any:
        if self.schemas[self.roles.action].result.get("type") == "object":
            return record
        return "ok"


def public_state(state: Mapping[str, Any], memory: bool = False) -> dict[str, Any]:
    """What the verifier's state hash covers: records and writes, without the backend's own
    bookkeeping (`_` keys) and, unless asked, without memory (free text: checked separately)."""
    out = {k: v for k, v in state.items() if not k.startswith("_") and (memory or k != "memory")}
    if "writes" in out:
        out["writes"] = sorted(out["writes"], key=canonical)
    return out


# Building a world -------------------------------------------------------------------------------
class WorldBuilder:
    """Generates owners and entities for one task, coherently linked."""

    def __init__(
        self, catalog: Catalog, roles: Roles, rng: random.Random, status: dict[str, Any] | None
    ) -> None:
        self.catalog = catalog
        self.roles = roles
        self.rng = rng
        self.gen = Gen(rng)
        self.status = status
        self.taken: set[str] = set()
        lookup = catalog.tools.get(roles.lookup) if roles.lookup else None
        self.lookup_shape = lookup.result if lookup else {"type": "object", "properties": {}}
        pool: list[str] = []
        if roles.label_path and lookup:
            pool = list(
                shape_at(self.lookup_shape, path_tokens(roles.label_path)).get("examples", [])
            )
        pool = sorted(set(pool) | set(FALLBACK_LABELS)) if len(pool) < 24 else sorted(set(pool))
        rng.shuffle(pool)
        self.labels = pool

    def new_id(self, arg: ArgSchema | None) -> str:
        if arg is None or not (arg.formats or arg.examples):
            return self.gen.unique(lambda: f"ID-{self.rng.randrange(10**6, 10**7)}", self.taken)
        cached = _ID_MAKERS.get(id(arg))
        if cached is None or cached[0] is not arg:
            facts = {"formats": arg.formats} if arg.formats else {"examples": arg.examples}
            cached = _ID_MAKERS[id(arg)] = (arg, _string_maker(facts))
        maker = cached[1]
        return self.gen.unique(lambda: maker(self.rng.random), self.taken)

    def label(self) -> str:
        if not self.labels:
            raise NotSynthesizable("ran out of distinct labels for entities")
        return self.labels.pop()

    def entity(
        self,
        eid: str,
        owner_id: str | None,
        status_value: str | None,
        plants: Sequence[tuple[str, list[Any]]] = (),
    ) -> dict[str, Any]:
        r = self.roles
        record = self.gen.value(self.lookup_shape)
        if not isinstance(record, dict):
            record = {}
        for path, values in plants:
            record = self.plant(record, path, values, self.lookup_shape)
        for name in (r.lookup_arg, r.id_arg):
            if name and name in self.lookup_shape.get("properties", {}):
                record[name] = eid
        if (
            owner_id is not None
            and r.owner_arg
            and r.owner_arg in self.lookup_shape.get("properties", {})
        ):
            record[r.owner_arg] = owner_id
        if r.label_path:
            tokens = path_tokens(r.label_path)
            fan = _fan(tokens)
            if fan is None:
                record = set_at(record, tokens, self.label())
            else:
                container = get_all(record, tokens[:fan])
                items = container[0] if container and isinstance(container[0], list) else []
                for item in items:
                    if isinstance(item, dict):
                        set_at(item, tokens[fan + 1 :], self.label())
        if self.status is not None:
            record[self.status["field"]] = status_value
        return record

    def plant(
        self, record: dict[str, Any], path: str, values: list[Any], shape: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Make the path hold exactly `values` (one per list element / map key)."""
        tokens = path_tokens(path)
        fan = _fan(tokens)
        if fan is None:
            return set_at(record, tokens, values[0])
        head, rest = tokens[:fan], tokens[fan + 1 :]
        element = shape_at(shape, tokens[: fan + 1])
        if tokens[fan] == "[*]":
            items = []
            for value in values:
                item = self.gen.value(element) if rest else value
                if rest:
                    item = set_at(item if isinstance(item, dict) else {}, rest, value)
                items.append(item)
            return set_at(record, head, items)
        mapping = {}
        for value in values:
            item = self.gen.value(element)
            if rest:
                item = set_at(item if isinstance(item, dict) else {}, rest, value)
            elif isinstance(item, dict):
                for name in ("id", "item_id"):
                    if name in item:
                        item[name] = value
            mapping[value] = item
        return set_at(record, head, mapping)

    def owner(
        self,
        oid: str,
        entity_ids: list[str],
        entities: Mapping[str, dict[str, Any]],
        attrs: Mapping[str, Any],
    ) -> dict[str, Any]:
        r = self.roles
        shape = self.catalog.tools[r.owner].result
        record = self.gen.value(shape)
        if not isinstance(record, dict):
            record = {}
        if r.owner_arg in shape.get("properties", {}):
            record[r.owner_arg] = oid
        for name, value in attrs.items():
            for path in leaf_paths_cached(shape, name):
                record = set_at(record, path_tokens(path), value)
        record = self.plant(record, r.owner_path or "", entity_ids, shape)
        # list items that are objects mirror the entity record's fields of the same name
        tokens = path_tokens(r.owner_path)
        fan = _fan(tokens)
        if fan is not None and tokens[fan] == "[*]" and tokens[fan + 1 :]:
            for item, eid in zip(get_all(record, tokens[: fan + 1]), entity_ids, strict=False):
                if isinstance(item, dict):
                    for key in list(item):
                        if key in entities[eid] and not isinstance(
                            entities[eid][key], (dict, list)
                        ):
                            item[key] = entities[eid][key]
        return record


_LEAF_PATHS: dict[tuple[int, str], tuple[Any, list[str]]] = {}


def leaf_paths_cached(shape: Mapping[str, Any], name: str) -> list[str]:
    cached = _LEAF_PATHS.get((id(shape), name))
    if cached is not None and cached[0] is shape:
        return cached[1]
    paths = leaf_paths(shape, name)
    if len(_LEAF_PATHS) > 50_000:
        _LEAF_PATHS.clear()
    _LEAF_PATHS[(id(shape), name)] = (shape, paths)
    return paths


def leaf_paths(shape: Mapping[str, Any], name: str, prefix: str = "", depth: int = 0) -> list[str]:
    """Paths (without fan-out) to properties called `name`."""
    if depth > 3 or shape.get("type") != "object":
        return []
    out = []
    for key, sub in shape.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if key == name and sub.get("type") in ("string", "integer", "number"):
            out.append(path)
        elif sub.get("type") == "object":
            out.extend(leaf_paths(sub, name, path, depth + 1))
    return out


def sibling_descriptor(record: Any, path: str, value: Any) -> str | None:
    """A phrase that singles out `value` among its siblings at `path` (e.g. "the Headphones"),
    or None when nothing word-like tells them apart."""
    tokens = path_tokens(path)
    fan = _fan(tokens)
    if fan is None:
        return None
    siblings = get_all(record, tokens[: fan + 1])
    rest = tokens[fan + 1 :]
    if tokens[fan] == "{*}":
        container = get_all(record, tokens[:fan])
        mapping = container[0] if container and isinstance(container[0], Mapping) else {}
        pairs = (
            [(mapping.get(k), k) for k in mapping]
            if not rest
            else [
                (item, get_all(item, rest)[0] if get_all(item, rest) else None)
                for item in mapping.values()
            ]
        )
    else:
        pairs = [
            (item, get_all(item, rest)[0] if rest and get_all(item, rest) else item)
            for item in siblings
        ]
    mine = [item for item, v in pairs if v == value]
    if not mine or not isinstance(mine[0], Mapping):
        return None
    for key in sorted(mine[0], key=lambda k: (k not in LABEL_NAMES, k)):
        word = mine[0][key]
        if not is_wordlike(word):
            continue
        if sum(1 for item, _ in pairs if isinstance(item, Mapping) and item.get(key) == word) == 1:
            return f"the {word}" if key in LABEL_NAMES else f"the one whose {key} is {word}"
    return None


def loosen(value: str, rng: random.Random) -> str:
    """A human way of writing an exact value: `#W2378156` -> `W2378156` / `w-237-8156`."""
    core = value.lstrip("#@$")
    choice = rng.randrange(3)
    if choice == 0 and core != value:
        return core
    digits = re.search(r"\d{6,}", core)
    if choice == 1 and digits:
        run = digits.group()
        spaced = f"{run[:3]} {run[3:]}"
        return core.replace(run, spaced).lower()
    if core != value:
        return core.lower()
    if digits:
        run = digits.group()
        return core.replace(run, f"{run[:3]}-{run[3:]}")
    return value.upper() if value.upper() != value else value.lower()


def money(value: float, rng: random.Random) -> str:
    """An amount as a person writes it."""
    whole, cents = divmod(round(value * 100), 100)
    text = f"{whole:,}" if rng.random() < 0.5 else str(whole)
    return f"${text}.{cents:02d}" if rng.random() < 0.7 else f"{text}.{cents:02d} dollars"


__all__ = [
    "MEMORY_SEARCH",
    "MEMORY_UPDATE",
    "Gen",
    "NotSynthesizable",
    "Roles",
    "ToolError",
    "ToolWorld",
    "WorldBuilder",
    "canonical",
    "canonical_value",
    "clone",
    "digest",
    "formats_of",
    "get_all",
    "infer_roles",
    "is_id_value",
    "path_tokens",
    "public_state",
    "sibling_descriptor",
]
