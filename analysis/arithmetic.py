"""Numbers a run could have computed: identity or simple arithmetic on numbers it saw.

Shared by the detectors (amounts an agent passes to a tool) and attribution (numbers an agent
states): a value is *derived* from known numbers when it equals one of them, or the sum,
difference, product or ratio of two, a small count times one ("3 x 12.50") or one split in a
small number of parts, or the sum of three -- each compared at the value's own precision
("33.33" matches 100 / 3). Formatting is not a difference: "1,000.00", "$1000" and 1000 are
the same number (`parse_number`).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence

_NUMBER_TEXT = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d])")
_STRIP = re.compile(r"^[\s$€£¥%]+|[\s$€£¥%]+$")
SMALL_COUNTS = range(2, 11)  # how many items, parts or months a total is commonly made of
MAX_TRIPLES = 40  # sums of three are tried over at most this many known numbers (40^3/6 ~ 10^4)
MAX_PAIRS = 400  # pairs are tried over at most this many (the latest) known numbers


def parse_number(value: object) -> float | None:
    """A number from a JSON number or a numeric string ("1,000.00", "$12.5", "7%"), else None.
    Booleans are not numbers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = _STRIP.sub("", value)
    if not _NUMBER_TEXT.fullmatch(text):
        return None
    return float(text.replace(",", ""))


def decimals_of(value: object) -> int:
    """Decimal places the value is written with (2 for "12.50", 0 for 12)."""
    text = value if isinstance(value, str) else repr(value)
    if isinstance(value, float) and value.is_integer():
        return 0
    return len(text.rsplit(".", 1)[1]) if "." in text else 0


def numbers_in(texts: Iterable[str]) -> list[float]:
    """Every number written in some texts (thousands separators understood), in order; signs
    are not read (the '-' of a date or an id is no minus)."""
    found = []
    for text in texts:
        for match in _NUMBER_IN_TEXT.finditer(text):
            found.append(float(match.group().replace(",", "")))
    return found


def derived(
    target: float,
    known: Sequence[float],
    *,
    decimals: int = 2,
    counts: Iterable[int] = SMALL_COUNTS,
    triples: bool = True,
) -> str | None:
    """How `target` follows from `known` ("identity", "a+b", "a-b", "a*b", "a/b", "n*a", "a/n",
    "a+b+c"), or None. Compared within half a unit of the target's last decimal (`decimals`)."""
    tolerance = 0.5 * 10**-decimals + 1e-9
    values = list(dict.fromkeys(known))

    def close(x: float) -> bool:
        return abs(x - target) <= tolerance

    if any(close(a) for a in values):
        return "identity"
    scalable = [a for a in values if abs(a) > 1]  # n x 1 would make every count derived
    for n in counts:
        if any(close(a * n) for a in scalable):
            return "n*a"
        if any(close(a / n) for a in values):
            return "a/n"
    recent = values[-MAX_PAIRS:]
    for i, a in enumerate(recent):
        for b in recent[i + 1 :]:
            if close(a + b):
                return "a+b"
            if close(abs(a - b)):
                return "a-b"
            if close(a * b):
                return "a*b"
            if (b and close(a / b)) or (a and close(b / a)):
                return "a/b"
    if triples and len(values) >= 3:
        for a, b, c in itertools.combinations(values[-MAX_TRIPLES:], 3):
            if close(a + b + c):
                return "a+b+c"
    return None


__all__ = ["SMALL_COUNTS", "decimals_of", "derived", "numbers_in", "parse_number"]
