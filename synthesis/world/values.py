"""Value generation: recorded result shapes compiled into fast record makers."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from tracegym.synthesis.spec import (
    ArgSchema,
)
from tracegym.synthesis.world.errors import (
    NotSynthesizable,
)
from tracegym.synthesis.world.json_paths import (
    canonical,
)

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
