"""JSON helpers and record paths (`$`, `a.b`, `items[*].name`, `payment_methods{*}`)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any


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
