"""Building a world: the records of one task, planted where the traces say values come from."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tracegym.synthesis.spec import (
    ArgSchema,
    Catalog,
    ToolSchema,
    is_wordlike,
)
from tracegym.synthesis.world.errors import (
    FALLBACK_LABELS,
    LABEL_NAMES,
    NotSynthesizable,
)
from tracegym.synthesis.world.json_paths import (
    _fan,
    get_all,
    path_tokens,
    set_at,
    shape_at,
)
from tracegym.synthesis.world.roles import (
    Roles,
)
from tracegym.synthesis.world.values import (
    _ID_MAKERS,
    Gen,
    _string_maker,
    agree,
    key_kinds,
)


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
        action = catalog.tools.get(roles.action)
        self.lookup_shape = (
            record_shape(lookup.result, action.result if action else None)
            if lookup
            else {"type": "object", "properties": {}}
        )
        self.lookup_echo = echo_field(lookup, roles.lookup_arg) if lookup else None
        owner = catalog.tools.get(roles.owner) if roles.owner else None
        self.owner_echo = echo_field(owner, roles.owner_arg) if owner else None
        observed = label_pool(self.lookup_shape, roles.label_path)
        # the recorded names; the fallback names only where the traces recorded none
        self.observed = observed or list(FALLBACK_LABELS)
        pool = list(self.observed)
        rng.shuffle(pool)
        self.labels = pool
        self.naming: set[str] = set()  # labels that name an entity: never given to another
        self.used: set[str] = set()  # labels of the other items
        self.reserve = 10  # names kept for entities still to come (world_ctx sets it)

    def new_id(self, arg: ArgSchema | None, *also: ArgSchema | None) -> str:
        """A fresh id in the inferred format of `arg`; where other schemas take the same id
        (`get_order_details.order_id`), in a format they all share when there is one."""
        if arg is None or not (arg.formats or arg.examples):
            arg = next((a for a in also if a is not None and (a.formats or a.examples)), None)
        if arg is None:  # the traces recorded no value of it: the one invented format
            return self.gen.unique(lambda: f"ID-{self.rng.randrange(10**6, 10**7)}", self.taken)
        key = (id(arg), *(id(a) for a in also))
        cached = _ID_MAKERS.get(key)  # type: ignore[call-overload]
        if cached is None or cached[0] is not arg:
            formats = shared_formats(arg, also)
            facts = {"formats": formats, "examples": arg.examples}
            cached = _ID_MAKERS[key] = (arg, _string_maker(facts))  # type: ignore[index]
        maker = cached[1]
        return self.gen.unique(lambda: maker(self.rng.random), self.taken)

    def label(self, naming: bool = False) -> str:
        """A recorded name for an entity's item. The name that names an entity (its first item's)
        is one no other item of the task has; the other items take names from the other end
        of the pool and, once it runs out, reuse those (never an entity's name)."""
        if naming and self.labels:
            word = self.labels.pop()
        elif not naming and (len(self.labels) > self.reserve or (self.labels and not self.used)):
            word = self.labels.pop(0)
        elif naming:
            raise NotSynthesizable(
                f"the traces recorded {len(self.observed)} distinct names, too few to tell "
                "this task's records apart"
            )
        else:
            spare = sorted(self.used) or [w for w in self.observed if w not in self.naming]
            spare = spare or list(self.observed)
            word = spare[int(self.rng.random() * len(spare))]
        (self.naming if naming else self.used).add(word)
        return word

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
        for name in {r.lookup_arg, r.id_arg, self.lookup_echo} - {None}:
            if name in self.lookup_shape.get("properties", {}):
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
                record = set_at(record, tokens, self.label(naming=True))
            else:
                container = get_all(record, tokens[:fan])
                items = container[0] if container and isinstance(container[0], list) else []
                first = True
                for item in items:
                    if isinstance(item, dict):
                        set_at(item, tokens[fan + 1 :], self.label(naming=first))
                        first = False
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
        kinds = key_kinds(shape_at(shape, tokens[:fan]))
        for value in values:
            item = self.gen.value(element)
            if rest:
                item = set_at(item if isinstance(item, dict) else {}, rest, value)
            elif isinstance(item, dict):
                for name in ("id", "item_id"):
                    if name in item:
                        item[name] = value
            if isinstance(item, dict) and isinstance(value, str):
                agree(item, value, kinds)
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
        for name in {r.owner_arg, self.owner_echo} - {None}:
            if name in shape.get("properties", {}):
                record[name] = oid
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


def echo_field(tool: ToolSchema | None, arg: str | None) -> str | None:
    """The result field that holds the value of argument `arg` (the record asked for): the one
    the traces showed echoing it (`booking_id` -> `id`), else a field of the same name, else an
    `id` field in the argument's format."""
    if tool is None or arg is None:
        return None
    echoes = getattr(tool, "echoes", None) or {}
    if arg in echoes:
        return echoes[arg]
    props = tool.result.get("properties", {}) if tool.result.get("type") == "object" else {}
    if arg in props:
        return arg
    schema = tool.arguments.get(arg)
    sub = props.get("id", {})
    same = bool(schema and schema.formats and sub.get("formats"))
    if same and sub["formats"][0]["regex"] == schema.formats[0]["regex"]:  # type: ignore[union-attr]
        return "id"
    return None


def shared_formats(arg: ArgSchema, also: Sequence[ArgSchema | None]) -> list[dict[str, Any]]:
    """`arg`'s formats that every other schema with formats accepts too (all of them if none
    is shared: the action's own schema decides)."""
    others = [
        {f["regex"] for f in a.formats}
        for a in also
        if a is not None and a is not arg and a.formats
    ]
    shared = [f for f in arg.formats if all(f["regex"] in o for o in others)]
    return shared or list(arg.formats)


_MERGED: dict[tuple[int, int], tuple[Any, Any, dict[str, Any]]] = {}


def record_shape(lookup: Mapping[str, Any], written: Mapping[str, Any] | None) -> dict[str, Any]:
    """The shape of the records a world holds: the lookup's result shape, requiring too the
    nested fields the action's recorded results (the same record, after the write) nearly
    always had, where the lookup showed them at all (a record both tools return satisfies both
    shapes). The lookup's shape itself where the action returns something else. Cached."""
    if not written or written.get("type") != "object" or lookup.get("type") != "object":
        return lookup  # type: ignore[return-value]
    props, other = lookup.get("properties") or {}, written.get("properties") or {}
    if len(set(props) & set(other)) * 2 < max(len(other), 1):
        return lookup  # type: ignore[return-value]
    key = (id(lookup), id(written))
    cached = _MERGED.get(key)
    if cached is not None and cached[0] is lookup and cached[1] is written:
        return cached[2]
    merged = _merge(lookup, written)
    if len(_MERGED) > 1000:
        _MERGED.clear()
    _MERGED[key] = (lookup, written, merged)
    return merged


def _merge(shape: Mapping[str, Any], other: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    out = dict(shape)
    if depth > 6 or shape.get("type") != other.get("type"):
        return out
    kind = shape.get("type")
    if kind == "object":
        props, theirs = shape.get("properties") or {}, other.get("properties") or {}
        out["properties"] = {
            k: _merge(v, theirs[k], depth + 1) if k in theirs else v for k, v in props.items()
        }
        required = list(shape.get("required", props))
        if depth:  # top-level fields keep the lookup's: they are what the write changes
            required += [k for k in other.get("required", ()) if k in props and k not in required]
        out["required"] = required
    elif kind == "array" and shape.get("items") and other.get("items"):
        out["items"] = _merge(shape["items"], other["items"], depth + 1)
    elif kind == "map" and shape.get("values") and other.get("values"):
        out["values"] = _merge(shape["values"], other["values"], depth + 1)
        out["keys"] = _narrow(shape.get("keys") or {}, other.get("keys") or {})
    elif kind == "string" and depth:
        out = _narrow(out, other)
    return out


def _narrow(facts: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """String facts both shapes accept: the shared enum values, the shared formats (and the
    examples in them), where the two share any; else the first shape's."""
    out = dict(facts)
    enum = [v for v in facts.get("enum") or () if v in set(other.get("enum") or ())]
    if enum:
        out["enum"] = enum
    theirs = {f["regex"] for f in other.get("formats") or ()}
    formats = [f for f in facts.get("formats") or () if f["regex"] in theirs]
    if formats and not enum:
        out["formats"] = formats
        out["examples"] = [
            e
            for e in facts.get("examples") or ()
            if isinstance(e, str) and any(re.match(f["regex"], e) for f in formats)
        ]
    return out


_LABELS: dict[tuple[int, str], tuple[Any, list[str]]] = {}


def label_pool(shape: Mapping[str, Any], path: str | None) -> list[str]:
    """The distinct recorded values at the label path (`items[*].name`), cached per shape."""
    if not path:
        return []
    cached = _LABELS.get((id(shape), path))
    if cached is not None and cached[0] is shape:
        return cached[1]
    facts = shape_at(shape, path_tokens(path))
    values = facts.get("enum") or facts.get("examples") or []
    pool = sorted({v for v in values if isinstance(v, str) and v})
    if len(_LABELS) > 10_000:
        _LABELS.clear()
    _LABELS[(id(shape), path)] = (shape, pool)
    return pool


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
        if key == name and sub.get("type") in ("string", "integer", "number", "null"):
            out.append(path)  # (a field only ever seen empty is one a write may fill)
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
