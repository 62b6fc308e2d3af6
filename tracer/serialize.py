"""Turn any Python value into a bounded JSON string for a span attribute, without ever raising.

Agents pass whatever they like to tools: dataclasses, pydantic models, bytes, sockets, cyclic
graphs, 50 MB strings. `to_json` walks the value with limits on depth, items and string length
(so the work is bounded too, not only the output), replaces what JSON cannot hold with a short
description, and caps the final text at `max_length` characters with a visible marker.

Every look at a user value (repr, len, iteration, properties, `__class__`) is guarded against
anything it may raise, BaseException included (see `internal.swallow`): a value that cannot be
inspected becomes a `<TypeName>` placeholder, and the user's function runs as undecorated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from tracegym.tracer import internal

TRUNCATION_MARKER = "…[truncated {} chars]"
MAX_DEPTH = 8
MAX_ITEMS = 100

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_encode_sorted = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False
).encode


def truncate(text: str, max_length: int) -> str:
    """Cap `text` at `max_length` characters, saying how much was cut."""
    if len(text) <= max_length:
        return text
    cut = len(text) - max_length
    return text[:max_length] + TRUNCATION_MARKER.format(cut)


def _describe(value: Any) -> str:
    try:
        return f"<{type(value).__qualname__}>"
    except BaseException as exc:  # a metaclass with a hostile __qualname__
        internal.swallow("inspect", exc)
        return "<unrepresentable>"


def _unrepresentable(value: Any, exc: BaseException) -> str:
    """The placeholder for a value that raised while inspected; the failure is counted."""
    internal.swallow("inspect", exc)
    return _describe(value)


def _repr(value: Any, max_length: int) -> str:
    try:
        text = repr(value)
    except BaseException as exc:
        return _unrepresentable(value, exc)
    # repr() returns a str or a str subclass; the exact copy cannot lie about its length.
    return truncate(str.__str__(text), max_length)


def _more(value: Any) -> str:
    """What a container summary says about the items left out."""
    try:
        return f"+{len(value) - MAX_ITEMS} more items"
    except BaseException as exc:
        internal.swallow("inspect", exc)
        return "+more items"


def _plain(value: Any, max_length: int, depth: int, seen: set[int]) -> Any:
    """A JSON-safe copy of `value`, bounded in depth, items and string length."""
    kind = type(value)
    if kind is str:
        return truncate(value, max_length)
    if kind is bool or kind is int or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else str(value)
    if depth >= MAX_DEPTH:
        return _describe(value)
    try:
        return _plain_object(value, max_length, depth, seen)
    except BaseException as exc:  # the value's own methods raised: a placeholder for it
        return _unrepresentable(value, exc)


def _plain_object(value: Any, max_length: int, depth: int, seen: set[int]) -> Any:
    """`_plain` for everything but exact scalars; may raise whatever the value raises."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value[: max_length // 2 + 1])
        text = data.decode("utf-8", "backslashreplace")
        return (
            truncate(text, max_length) if len(value) <= max_length // 2 else f"<bytes {len(value)}>"
        )
    if isinstance(value, str):  # str subclasses and str-valued enums: the underlying text
        return truncate(str.__str__(value), max_length)
    if isinstance(value, int):  # bool and int subclasses (IntEnum, ...)
        return bool(value) if isinstance(value, bool) else int.__index__(value)
    if isinstance(value, float):
        return _plain(float.__float__(value), max_length, depth, seen)
    ident = id(value)
    if ident in seen:
        return "<cycle>"
    seen.add(ident)
    try:
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for i, (key, item) in enumerate(value.items()):
                if i >= MAX_ITEMS:  # stops the walk: a million items cost a hundred
                    out["…"] = _more(value)
                    break
                name = key if type(key) is str else _repr(key, 200)
                out[name] = _plain(item, max_length, depth + 1, seen)
            return out
        if isinstance(value, (list, tuple, set, frozenset)):
            items = []
            for i, item in enumerate(value):
                if i >= MAX_ITEMS:
                    items.append(f"…{_more(value)}")
                    break
                items.append(_plain(item, max_length, depth + 1, seen))
            return items
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
            return _plain(fields, max_length, depth, seen)
        dump = getattr(type(value), "model_dump", None)  # pydantic v2 models
        if callable(dump):
            return _plain(dump(value), max_length, depth, seen)
        return _repr(value, max_length)
    finally:
        seen.discard(ident)


def to_plain(value: Any, max_length: int) -> Any:
    """A JSON-safe, bounded copy of `value`; never raises."""
    try:
        return _plain(value, max_length, 0, set())
    except BaseException as exc:
        return _unrepresentable(value, exc)


def _default(value: Any) -> Any:
    """The fast path's hook for what JSON lacks; anything unusual goes to the careful walk."""
    if isinstance(value, (set, frozenset)) and len(value) <= MAX_ITEMS:
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
                text = _encode(_plain(value, max_length, 0, set()))
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

    Strings hash as their UTF-8 bytes; anything else as canonical JSON (sorted keys), so that a
    dict written and the equal dict read back hash alike. Never raises.
    """
    try:
        if type(value) is str:
            data = value.encode("utf-8", "surrogatepass")
        elif isinstance(value, (bytes, bytearray)):
            data = bytes(value)
        else:
            data = _encode_sorted(_plain(value, 1 << 20, 0, set())).encode("utf-8", "surrogatepass")
        return hashlib.sha256(data).hexdigest()[:32]
    except BaseException as exc:
        return hashlib.sha256(_unrepresentable(value, exc).encode()).hexdigest()[:32]
