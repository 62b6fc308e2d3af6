"""Query-string values the pages read, checked before any query runs.

A number typed into a URL reaches SQL (the runs list's OFFSET is `(page - 1) * 50`, a BIGINT):
`?page=99999999999999999999` once overflowed there and answered 500. Every numeric parameter
is read here instead: ASCII digits only (not "1e3", "-1", "+2" or "２", which `int()` takes),
inside a stated range, else `BadParameter`, which the app answers with 400 and the message.
An absent or empty value means the default, as a form sends it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_DIGITS = re.compile(r"[0-9]{1,19}")
MAX_PAGE = 1_000_000_000  # 5e10 runs at 50 a page: far past any store, far from INT64


class BadParameter(ValueError):
    """A query-string value out of its range or malformed (HTTP 400)."""


def integer(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """`query[name]` as an int in [low, high]; `default` when absent or empty."""
    raw = query.get(name, "")
    if raw == "":
        return default
    if not _DIGITS.fullmatch(raw):
        raise BadParameter(f"{name} must be a whole number from {low} to {high}, not {raw[:40]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise BadParameter(f"{name} must be from {low} to {high}, not {raw[:40]}")
    return value
