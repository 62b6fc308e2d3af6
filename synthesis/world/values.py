"""Value generation: recorded result shapes compiled into fast record makers.

Every generated value is one the traces could have shown: ids in their inferred formats (digit
runs and the recorded words of each slot), enum-like strings only from their observed values
(never recombined: `round_trip` and `one_way` do not make `round_way`), dates as real calendar
dates inside the observed range (and in the observed order between a record's date fields),
numbers inside the observed range at the observed precision.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
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
_FALLBACK_TEXT = ("n/a",)  # a string the traces never showed a value of (said where used)


def _part_maker(part: Any) -> Maker:
    if isinstance(part, str):
        return lambda r: part
    if isinstance(part[0], int):
        lo, span = part
        return lambda r: str(lo + int(r() * span))
    words, n = part, len(part)
    return lambda r: words[int(r() * n)]


def _digit_ranges(fmt: Mapping[str, Any], examples: Sequence[Any]) -> dict[int, tuple[int, int]]:
    """Per short digit run (at most 2 digits: a seat row, a day, a size) the range the recorded
    values took: `12A` .. `39F` give rows 12..39, not 10..99. Longer runs are ids: any value."""
    short = [i for i, (kind, width) in enumerate(fmt["parts"]) if kind == "digits" and width <= 2]
    if not short:
        return {}
    seen: dict[int, list[int]] = {i: [] for i in short}
    for example in examples:
        if not isinstance(example, str) or not re.match(fmt["regex"], example):
            continue
        runs = re.findall(r"\d+", example)
        digit_parts = [i for i, (kind, _) in enumerate(fmt["parts"]) if kind == "digits"]
        if len(runs) != len(digit_parts):
            continue
        for i, run in zip(digit_parts, runs, strict=True):
            if i in seen:
                seen[i].append(int(run))
    return {i: (min(v), max(v)) for i, v in seen.items() if v}


def _format_maker(
    fmt: Mapping[str, Any], ranges: Mapping[int, tuple[int, int]] | None = None
) -> Maker:
    ranges = ranges or {}
    parts: list[Any] = []
    for index, (kind, detail) in enumerate(fmt["parts"]):
        if kind == "literal":
            if parts and isinstance(parts[-1], str):
                parts[-1] += detail
            else:
                parts.append(detail)
        elif kind == "digits" and index in ranges:
            lo, hi = ranges[index]
            parts.append(tuple(str(n).zfill(detail) for n in range(lo, hi + 1)))
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


def _choice(values: Sequence[Any]) -> Maker:
    values = tuple(values)
    n = len(values)
    if n == 1:
        only = values[0]
        return lambda r: only
    return lambda r: values[int(r() * n)]


def _is_closed(fmt: Mapping[str, Any]) -> bool:
    """A format with no digit run and more than one word slot describes a closed set of words
    (`round_trip`, `one_way`): recombining its slots would invent values."""
    kinds = [kind for kind, _ in fmt["parts"]]
    return "digits" not in kinds and kinds.count("word") > 1


# Dates ------------------------------------------------------------------------------------------
_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2})([T ])(\d{2}:\d{2})(:\d{2})?(\.\d+)?(Z|[+-]\d{2}:?\d{2})?$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_US = re.compile(r"^\d{1,2}/\d{1,2}/\d{4}$")


def _parse(value: Any) -> tuple[str, datetime] | None:
    """(layout kind, moment) of a recorded date string, or None when it is no calendar date."""
    if not isinstance(value, str) or not 8 <= len(value) <= 35 or not value[:1].isdigit():
        return None
    try:
        if _DATE.match(value):
            return "date", datetime.strptime(value, "%Y-%m-%d")
        if _US.match(value):
            return "us_date", datetime.strptime(value, "%m/%d/%Y")
        if _ISO.match(value):
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
            return "datetime", moment.replace(tzinfo=None)
    except ValueError:
        return None
    return None


def _renderer(kind: str, template: str | None) -> Callable[[datetime], str]:
    """Writes a moment the way the recorded values are written."""
    if kind == "date":
        return lambda m: m.strftime("%Y-%m-%d")
    if kind == "us_date":
        padded = template is None or bool(re.match(r"^\d{2}/\d{2}/", template))
        if padded:
            return lambda m: m.strftime("%m/%d/%Y")
        return lambda m: f"{m.month}/{m.day}/{m.year}"
    found = _ISO.match(template or "")
    sep, seconds, fraction, zone = (
        (found.group(2), found.group(4), found.group(5), found.group(6) or "")
        if found
        else ("T", ":00", None, "")
    )
    layout = "%Y-%m-%d" + sep + "%H:%M" + (":%S" if seconds else "")
    digits = len(fraction) - 1 if fraction else 0

    def render(m: datetime) -> str:
        text = m.strftime(layout)
        if digits:
            text += "." + f"{m.microsecond:06d}"[:digits].ljust(digits, "0")
        return text + zone

    return render


class _DateMaker:
    """A date string maker that exposes its moments, so a record can keep its fields in order."""

    __slots__ = ("lo", "render", "span", "step")

    def __init__(self, lo: datetime, hi: datetime, kind: str, template: str | None) -> None:
        self.lo = lo
        self.step = 86_400 if kind in ("date", "us_date") else 60
        self.span = max(0, int((hi - lo).total_seconds()) // self.step)
        self.render = _renderer(kind, template)

    def moment(self, r: Callable[[], float]) -> datetime:
        return self.lo + timedelta(seconds=self.step * int(r() * (self.span + 1)))

    def __call__(self, r: Callable[[], float]) -> str:
        return self.render(self.moment(r))

    def within(self, moment: datetime) -> bool:
        return self.lo <= moment <= self.lo + timedelta(seconds=self.step * self.span)


def _date_maker(facts: Mapping[str, Any]) -> _DateMaker | None:
    """A maker for date strings: from the recorded range (`dates`) when the catalog has it, else
    from the examples when every one is a calendar date in one layout."""
    examples = [e for e in facts.get("examples") or () if isinstance(e, str)]
    dates = facts.get("dates")
    if isinstance(dates, Mapping) and dates.get("min") and dates.get("max"):
        kind = str(dates.get("kind", "date"))
        lo = datetime.fromisoformat(str(dates["min"]))
        hi = datetime.fromisoformat(str(dates["max"]))
        return _DateMaker(lo, max(lo, hi), kind, examples[0] if examples else None)
    if not examples:
        return None
    parsed = [_parse(e) for e in examples]
    if any(p is None for p in parsed) or len({p[0] for p in parsed if p}) != 1:
        return None
    moments = [p[1] for p in parsed if p]
    return _DateMaker(min(moments), max(moments), parsed[0][0], examples[0])  # type: ignore[index]


def _string_maker(facts: Mapping[str, Any]) -> Maker:
    enum = facts.get("enum")
    if enum:
        return _choice(enum)
    dated = _date_maker(facts)
    if dated is not None:
        return dated
    formats = facts.get("formats") or []
    examples = tuple(facts.get("examples") or ())
    if formats:
        makers = []
        for fmt in formats:
            seen = [e for e in examples if isinstance(e, str) and re.match(fmt["regex"], e)]
            dated = _date_maker({"examples": seen}) if seen else None
            if dated is not None:  # a date layout among other values: still real dates
                makers.append(dated)
            elif _is_closed(fmt) and seen:
                makers.append(_choice(seen))
            else:
                makers.append(_format_maker(fmt, _digit_ranges(fmt, seen)))
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
    return _choice(examples or _FALLBACK_TEXT)


def _decimals(values: Sequence[Any]) -> int:
    """The most decimal places the recorded numbers were written with (at most 2)."""
    places = 0
    for value in values[:200]:
        if isinstance(value, float) and not value.is_integer():
            text = repr(value)
            places = max(places, len(text.split(".")[1]) if "." in text else 0)
    return min(places, 2)


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
    return lambda r: min(hi, max(lo, round(lo + r() * width, places)))


def _ordered(
    fields: list[tuple[str, Maker]], order: Sequence[Sequence[str]]
) -> Callable[[dict[str, Any], Callable[[], float]], None] | None:
    """A fix-up that keeps date fields in their recorded order (`created_at <= updated_at`),
    drawing the later field inside its own range and after the earlier one."""
    makers = {k: f for k, f in fields if isinstance(f, _DateMaker)}
    pairs = [(a, b) for a, b in order if a in makers and b in makers]
    if not pairs:
        return None

    def fix(out: dict[str, Any], r: Callable[[], float]) -> None:
        moments = {k: m.moment(r) for k, m in makers.items()}
        for _ in range(len(pairs)):
            changed = False
            for a, b in pairs:
                if moments[a] > moments[b]:
                    if makers[a].within(moments[b]) and makers[b].within(moments[a]):
                        moments[a], moments[b] = moments[b], moments[a]
                    elif makers[b].within(moments[a]):
                        moments[b] = moments[a]
                    else:
                        moments[a] = moments[b]
                    changed = True
            if not changed:
                break
        for k, m in makers.items():
            out[k] = m.render(moments[k])

    return fix


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
        fix = _ordered(fields, shape.get("date_order") or ())
        if fix is None:
            maker = lambda r: {k: f(r) for k, f in fields}  # noqa: E731
        else:

            def maker(r: Callable[[], float]) -> dict[str, Any]:
                out = {k: f(r) for k, f in fields}
                fix(out, r)
                return out

    elif kind == "map":
        key = _string_maker(shape.get("keys", {}))
        item = compile_shape(shape.get("values", {}), depth + 1)
        kinds = key_kinds(shape)

        def maker(r: Callable[[], float]) -> dict[str, Any]:
            out = {}
            for _ in range(1 + (r() < 0.5)):
                name = key(r)
                value = item(r)
                if isinstance(value, dict):
                    for field_name in ("id", "item_id"):
                        if field_name in value:
                            value[field_name] = name
                    agree(value, name, kinds)
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


Kinds = list[tuple[str, list[str]]]
_KINDS: dict[int, tuple[Any, Kinds]] = {}


def key_kinds(shape: Mapping[str, Any]) -> Kinds:
    """The fields of an id-keyed map's values that name the kind the key starts with
    (`payment_methods{*}.source`: `paypal` for `paypal_3024827`, `credit_card` for
    `credit_card_3124723`): every observed value begins some recorded key, every recorded key
    begins with one. Cached per map shape."""
    cached = _KINDS.get(id(shape))
    if cached is not None and cached[0] is shape:
        return cached[1]
    keys = [k for k in (shape.get("keys") or {}).get("examples") or () if isinstance(k, str)]
    values = shape.get("values") or {}
    out: Kinds = []
    for name, sub in (values.get("properties") or {}).items():
        enum = [v for v in sub.get("enum") or () if isinstance(v, str) and v]
        if (
            keys
            and len(enum) > 1
            and all(any(k.startswith(v) for k in keys) for v in enum)
            and all(any(k.startswith(v) for v in enum) for k in keys)
        ):
            out.append((name, sorted(enum, key=len, reverse=True)))
    _KINDS[id(shape)] = (shape, out)
    return out


def agree(item: dict[str, Any], key: str, kinds: Kinds) -> None:
    """Make `item`'s kind fields name the kind its key starts with (see `key_kinds`)."""
    for name, values in kinds:
        found = next((v for v in values if key.startswith(v)), None)
        if found is not None:
            item[name] = found


_ARG_MAKERS: dict[int, tuple[Any, Maker]] = {}
_ID_MAKERS: dict[Any, tuple[Any, Maker]] = {}
_EMPTY = {"object": dict, "array": list}


def _arg_maker(arg: ArgSchema) -> Maker:
    """A value maker for one argument schema (cached per schema object): from the recorded
    values' shape when the catalog has it (lists of objects included), else from the schema."""
    cached = _ARG_MAKERS.get(id(arg))
    if cached is not None and cached[0] is arg:
        return cached[1]
    facts = {
        "formats": arg.formats,
        "examples": arg.examples,
        "min": arg.minimum,
        "max": arg.maximum,
        "decimals": _decimals(arg.examples) if arg.type == "number" else arg.decimals,
    }
    shape = getattr(arg, "shape", None)
    maker: Maker
    if arg.enum:
        maker = _choice(arg.enum)
    elif isinstance(shape, Mapping) and shape.get("type") == arg.type:
        maker = compile_shape(shape)
    elif arg.type == "array":
        if arg.items in ("integer", "number"):
            inner = _number_maker(facts, arg.items == "integer")
        elif arg.items in _EMPTY:  # no recorded element shape: a value of the right type
            empty = _EMPTY[arg.items]
            inner = lambda r: empty()  # noqa: E731
        else:
            inner = _string_maker(facts)
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


def fits(value: Any, facts: Mapping[str, Any]) -> bool:
    """Whether `value` is one a field with these recorded facts could hold: an observed value of
    an enum, a string in one of its formats, a number in its range. (For a value the user gives
    that lands in a record: it must suit both the argument and the record's field.)"""
    if isinstance(value, str):
        if facts.get("type", "string") != "string":
            return False
        if facts.get("enum"):
            return value in facts["enum"]
        formats = facts.get("formats") or ()
        return not formats or any(re.match(f["regex"], value) for f in formats)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi = facts.get("min"), facts.get("max")
        return (lo is None or value >= lo) and (hi is None or value <= hi)
    return True


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
