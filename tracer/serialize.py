"""Turn any Python value into a bounded JSON string for a span attribute, without ever raising,
without slowing the agent and without changing its values.

Agents pass whatever they like to tools: dataclasses, pydantic models, bytes, sockets, cyclic
graphs, 50 MB strings, generators, mappings that can be read only once. `to_json` walks the
value with limits on depth, items, nodes and time (so the work is bounded too, not only the
output), replaces what JSON cannot hold with a short description, and caps the final text at
`max_length` characters with a visible marker.

The walk runs none of the value's own code that could be slow, consume it or differ from what
the user sees (a value may be hostile or fragile):

- Types are read with `type(x)`, never `x.__class__` (which `isinstance` looks up, and which a
  value may define as a slow property).
- Containers are read through the builtin types' own C methods: exact dicts, lists, tuples,
  sets, frozensets and deques and their subclasses (whose overrides are bypassed). Any other
  Mapping or iterable (a generator, an iterator, a mapping readable once) is never iterated: it
  is recorded as a placeholder.
- `repr` is called only where it is known to be safe: the default `object.__repr__`
  (`<mod.Type object at 0x...>`) and a fixed list of leaf types (complex, range, Decimal, UUID,
  paths, dates, IP addresses, functions, generators ...). A value with a `__repr__` of its own is
  recorded as `<TypeName>`. Dataclasses (their fields), pydantic models (`model_dump`), enums
  (their name) and exceptions (their type and scalar arguments) still render in full.
- Each capture has a budget of MAX_NODES values and, once the value's own code ran (a slow
  property or `model_dump`), TIME_BUDGET_S seconds; once spent, the walk stops there and the
  value says so (BUDGET_MARKER, counted in `values_truncated.capture_budget`).

Every look at a user value that remains (a dataclass field, `model_dump`) is guarded against
anything it may raise, BaseException included (see `internal.swallow`): a value that cannot be
inspected becomes a `<TypeName>` placeholder, and the user's function runs as undecorated.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import hashlib
import ipaddress
import json
import math
import pathlib
import re
import time
import types
import uuid
from collections.abc import Callable
from typing import Any

from tracegym.tracer import internal

TRUNCATION_MARKER = "…[truncated {} chars]"
BUDGET_MARKER = "…[truncated: capture budget spent]"
MAX_DEPTH = 8
MAX_ITEMS = 100
MAX_NODES = 10_000  # values walked per capture (a 100-wide tree 8 deep is 10^16 of them)
TIME_BUDGET_S = 0.1  # seconds one capture may spend in the value's own code (properties ...)

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_encode_sorted = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False
).encode

# Read straight from the type object: a metaclass cannot put its own code in between.
_qualname = type.__dict__["__qualname__"].__get__
_mro = type.__dict__["__mro__"].__get__
_own_dict = type.__dict__["__dict__"].__get__
_exception_args = BaseException.__dict__["args"].__get__


def truncate(text: str, max_length: int) -> str:
    """Cap `text` at `max_length` characters, saying how much was cut."""
    if len(text) <= max_length:
        return text
    cut = len(text) - max_length
    return text[:max_length] + TRUNCATION_MARKER.format(cut)


def _type_name(kind: type) -> str:
    try:
        name = _qualname(kind)
        return name if type(name) is str else "unrepresentable"
    except BaseException as exc:  # pragma: no cover - a C getter on a real type
        internal.swallow("inspect", exc)
        return "unrepresentable"


def _describe(value: Any) -> str:
    """The placeholder for a value the walk does not look into: `<TypeName>`."""
    return f"<{_type_name(type(value))}>"


def _unrepresentable(value: Any, exc: BaseException) -> str:
    """The placeholder for a value that raised while inspected; the failure is counted."""
    internal.swallow("inspect", exc)
    return _describe(value)


class _Walk:
    """One capture's limits and bookkeeping: the containers being walked (cycles), how many
    values were walked and until when the value's own code may run.

    The clock counts only once the value's own code ran (a dataclass field, `model_dump`): a
    walk of plain data is cut by its count of values alone, so the same data is cut at the same
    place on a loaded machine too (a memory write and its read hash alike)."""

    __slots__ = ("cut", "deadline", "max_length", "nodes", "seen", "timed")

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self.seen: set[int] = set()
        self.nodes = 0
        self.deadline = time.perf_counter() + TIME_BUDGET_S
        self.cut = False
        self.timed = False  # set before the value's own code runs

    def spent(self) -> bool:
        """True (from then on) once the capture used up its values or its time."""
        if self.cut:
            return True
        if self.nodes > MAX_NODES or (self.timed and time.perf_counter() > self.deadline):
            self.cut = True
            internal.add("values_truncated.capture_budget")
        return self.cut


# Leaf types whose repr runs no user code and is cheap: shown as their repr.
_SAFE_REPR: frozenset[type] = frozenset(
    {
        complex,
        range,
        type(Ellipsis),
        type(NotImplemented),
        types.FunctionType,
        types.BuiltinFunctionType,
        types.GeneratorType,
        types.CoroutineType,
        types.AsyncGeneratorType,
        decimal.Decimal,
        fractions.Fraction,
        uuid.UUID,
        datetime.date,
        datetime.timedelta,
        datetime.timezone,
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
        pathlib.PosixPath,
        pathlib.WindowsPath,
        ipaddress.IPv4Address,
        ipaddress.IPv6Address,
        ipaddress.IPv4Network,
        ipaddress.IPv6Network,
        ipaddress.IPv4Interface,
        ipaddress.IPv6Interface,
        re.Pattern,
    }
)
# Compared by identity: `in` on types would call a metaclass's own __hash__ or __eq__.
_SAFE_REPR_IDS = frozenset(map(id, _SAFE_REPR))
_NONE_TYPE = type(None)
_default_repr_cache: dict[int, tuple[type, bool]] = {}


def _is_scalar_type(kind: type) -> bool:
    return kind is str or kind is int or kind is float or kind is bool or kind is _NONE_TYPE


def _zoned_safely(value: Any, kind: type) -> bool:
    """A datetime or time whose repr calls no user tzinfo's repr."""
    if kind is not datetime.datetime and kind is not datetime.time:
        return False
    zone = type(value.tzinfo)
    return zone is _NONE_TYPE or zone is datetime.timezone


def _has_default_repr(kind: type) -> bool:
    """True when `kind` takes `object.__repr__` (type name and address: cheap, no user code)."""
    cached = _default_repr_cache.get(id(kind))
    if cached is not None and cached[0] is kind:
        return cached[1]
    owner = next(k for k in _mro(kind) if "__repr__" in _own_dict(k))
    if len(_default_repr_cache) >= 1024:  # classes made on the fly: stay bounded
        _default_repr_cache.clear()
    _default_repr_cache[id(kind)] = (kind, owner is object)
    return owner is object


def _key(key: Any, walk: _Walk, depth: int) -> str:
    """A mapping key as JSON object key text, with the same care as any value."""
    kind = type(key)
    if kind is str:
        return key
    if _is_scalar_type(kind) or (
        kind is tuple and len(key) <= MAX_ITEMS and all(_is_scalar_type(type(k)) for k in key)
    ):
        return truncate(repr(key), 200)
    plain = _plain(key, walk, depth)
    return truncate(plain if type(plain) is str else _encode(plain), 200)


def _plain(value: Any, walk: _Walk, depth: int) -> Any:
    """A JSON-safe copy of `value`, bounded in depth, items, nodes and time."""
    walk.nodes += 1
    kind = type(value)
    if kind is str:
        return truncate(value, walk.max_length)
    if kind is bool or kind is int or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else str(value)
    if depth >= MAX_DEPTH:
        return _describe(value)
    if walk.spent():
        return BUDGET_MARKER
    try:
        return _plain_object(value, kind, walk, depth)
    except BaseException as exc:  # the value's own code raised: a placeholder for it
        return _unrepresentable(value, exc)


def _items(
    iterator: Any, size: int, walk: _Walk, depth: int, convert: Callable[[Any], Any]
) -> list[Any]:
    """The converted first MAX_ITEMS items; the rest summarised; the walk stops if cut."""
    out = []
    for i, item in enumerate(iterator):
        if i >= MAX_ITEMS:  # stops the walk: a million items cost a hundred
            out.append(f"…+{size - MAX_ITEMS} more items")
            break
        if walk.cut:
            break
        out.append(convert(item))
    return out


def _plain_object(value: Any, kind: type, walk: _Walk, depth: int) -> Any:
    """`_plain` for everything but exact scalars; may raise whatever the value raises."""
    max_length = walk.max_length
    if issubclass(kind, (bytes, bytearray, memoryview)):
        if kind is memoryview:
            size, head = len(value), bytes(value[: max_length // 2 + 1])
        else:  # the buffer itself, not a subclass's __len__/__getitem__
            view = memoryview(value)
            size, head = view.nbytes, bytes(view[: max_length // 2 + 1])
        if size > max_length // 2:
            return f"<bytes {size}>"
        return truncate(head.decode("utf-8", "backslashreplace"), max_length)
    if issubclass(kind, str):  # str subclasses and str-valued enums: the underlying text
        return truncate(str.__str__(value), max_length)
    if issubclass(kind, int):  # int subclasses (IntEnum, ...)
        return int.__index__(value)
    if issubclass(kind, float):
        return _plain(float.__float__(value), walk, depth)
    ident = id(value)
    if ident in walk.seen:
        return "<cycle>"
    walk.seen.add(ident)
    try:
        return _container(value, kind, walk, depth)
    finally:
        walk.seen.discard(ident)


def _container(value: Any, kind: type, walk: _Walk, depth: int) -> Any:
    inner = depth + 1
    if kind is types.SimpleNamespace:  # its repr would repr each attribute: walk them instead
        value, kind = object.__getattribute__(value, "__dict__"), dict
    if issubclass(kind, dict):
        out: dict[str, Any] = {}
        size = dict.__len__(value)
        # an exact OrderedDict keeps its own order (move_to_end), in C; a subclass's
        # overrides never run: the dict's own items
        pairs = value.items() if kind is collections.OrderedDict else dict.items(value)
        for i, (key, item) in enumerate(pairs):
            if i >= MAX_ITEMS:
                out["…"] = f"+{size - MAX_ITEMS} more items"
                break
            if walk.cut:
                break
            out[_key(key, walk, inner)] = _plain(item, walk, inner)
        return out
    for base in (list, tuple, set, frozenset, collections.deque):
        if issubclass(kind, base):
            return _items(
                base.__iter__(value),
                base.__len__(value),
                walk,
                depth,
                lambda item: _plain(item, walk, inner),
            )
    if dataclasses.is_dataclass(kind):  # the class: no look at the instance's __class__
        walk.timed = True  # a field may be a property
        fields = {}
        for f in dataclasses.fields(kind):
            if walk.spent():
                fields["…"] = BUDGET_MARKER
                break
            try:
                fields[f.name] = object.__getattribute__(value, f.name)
            except AttributeError:
                fields[f.name] = None
        return _plain(fields, walk, depth)
    dump = getattr(kind, "model_dump", None)  # pydantic v2 models
    if callable(dump):
        walk.timed = True
        return _plain(dump(value), walk, depth)
    return _leaf(value, kind, walk)


def _leaf(value: Any, kind: type, walk: _Walk) -> str:
    """Text for a value the walk does not go into: its repr where that is known to be safe,
    else a placeholder (never the value's own `__repr__`, nor its iteration)."""
    if issubclass(kind, enum.Enum):
        name = object.__getattribute__(value, "_name_")
        return f"{_type_name(kind)}.{name}" if type(name) is str else _describe(value)
    if issubclass(kind, BaseException):
        args = _exception_args(value)
        if type(args) is tuple and all(_is_scalar_type(type(a)) for a in args[:MAX_ITEMS]):
            shown = ", ".join(repr(a) for a in args[:MAX_ITEMS])
            return truncate(f"{_type_name(kind)}({shown})", walk.max_length)
        return _describe(value)
    if issubclass(kind, type):  # a class: `<class 'mod.Name'>`, whatever its metaclass says
        return truncate(type.__repr__(value), walk.max_length)
    if id(kind) in _SAFE_REPR_IDS or _zoned_safely(value, kind):
        return truncate(repr(value), walk.max_length)
    if _has_default_repr(kind):
        return object.__repr__(value)
    return _describe(value)


def to_plain(value: Any, max_length: int) -> Any:
    """A JSON-safe, bounded copy of `value`; never raises."""
    try:
        return _plain(value, _Walk(max_length), 0)
    except BaseException as exc:
        return _unrepresentable(value, exc)


def _default(value: Any) -> Any:
    """The fast path's hook for what JSON lacks; anything unusual goes to the careful walk."""
    if (type(value) is set or type(value) is frozenset) and len(value) <= MAX_ITEMS:
        return list(value)
    raise _Unusual


class _Unusual(Exception):
    pass


def _make_fast_encoder() -> Callable[[Any], str]:
    """One shared C encoder without cycle markers (only `_small` values reach it, and those
    cannot hold a cycle): a third of the cost of json.dumps."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pure-Python json: take the standard route
        return json.JSONEncoder(
            ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_default
        ).encode
    encoder = make(None, _default, json.encoder.encode_basestring, None, ":", ",", False, False,
                   False)  # fmt: skip

    def encode(value: Any) -> str:
        return "".join(encoder(value, 0))

    return encode


_encode_fast = _make_fast_encoder()


def to_json(value: Any, max_length: int = 8192) -> str:
    """`value` as JSON text of at most `max_length` characters (plus marker); never raises.

    Small plain values (the usual tool arguments and results) go straight through the C
    encoder; cycles, NaN, bytes, odd keys, objects and big containers take the bounded walk.
    """
    kind = type(value)
    if kind is str:  # the common case: already text; keep it readable, not quoted
        text = value
    else:
        try:
            text = None
            if (kind is dict or kind is list or kind is tuple) and _small(value, max_length):
                try:
                    text = _encode_fast(value)
                except (_Unusual, ValueError, TypeError, RecursionError):
                    text = None  # NaN, an odd key ...: the careful walk below
            if text is None:
                text = _encode(_plain(value, _Walk(max_length), 0))
        except BaseException as exc:
            return _unrepresentable(value, exc)
    # truncate() and _encodable() with their common case inline (twice per tool call)
    if len(text) > max_length:
        text = truncate(text, max_length)
    return text if text.isascii() else _encodable(text)


_SMALL_ITEMS = 64  # items a container may hold and still take the fast path


def _small_scalar(value: Any, max_length: int) -> bool:
    kind = type(value)
    if kind is str:
        return len(value) <= max_length
    return kind is int or kind is float or kind is bool or value is None


def _small(value: Any, max_length: int) -> bool:
    """True for values the C encoder may take whole: at most two levels of small containers of
    scalars and short strings (the usual tool arguments and results).

    Anything bigger or deeper takes the bounded walk, so a 3-million-row argument costs a
    summary, not a full encode on the agent's thread; and with no third level there can be no
    cycle, so the encoder needs no cycle bookkeeping. (`_small_scalar` is inlined: this runs
    on the agent's thread for every argument and result.)
    """
    items = value.values() if type(value) is dict else value
    if len(items) > _SMALL_ITEMS:
        return False
    for item in items:
        kind = type(item)
        if kind is str:
            if len(item) > max_length:
                return False
        elif kind is dict or kind is list or kind is tuple:
            inner = item.values() if kind is dict else item
            if len(inner) > _SMALL_ITEMS:
                return False
            for leaf in inner:
                leaf_kind = type(leaf)
                if leaf_kind is str:
                    if len(leaf) > max_length:
                        return False
                elif not (
                    leaf_kind is int or leaf_kind is float or leaf_kind is bool or leaf is None
                ):
                    return False
        elif not (kind is int or kind is float or kind is bool or item is None):
            return False
    return True


def _encodable(text: str) -> str:
    """`text` with lone surrogates replaced, so every exporter can encode it as UTF-8."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def content_hash(value: Any) -> str:
    """A stable hash of a memory record's content, the same for a write and a later read of it.

    Strings hash as their UTF-8 bytes, bytes as themselves; anything else as canonical JSON
    (sorted keys), so that a dict written and the equal dict read back hash alike. Never raises.
    """
    try:
        kind = type(value)
        if kind is str:
            data = value.encode("utf-8", "surrogatepass")
        elif kind is bytes or kind is bytearray:
            data = bytes(value)
        else:
            plain = _plain(value, _Walk(1 << 20), 0)
            data = _encode_sorted(plain).encode("utf-8", "surrogatepass")
        return hashlib.sha256(data).hexdigest()[:32]
    except BaseException as exc:
        return hashlib.sha256(_unrepresentable(value, exc).encode()).hexdigest()[:32]
