"""Numbers a run could have computed: identity or simple arithmetic on numbers it saw.

Shared by the detectors (amounts an agent passes to a tool) and attribution (numbers an agent
states): a value is *derived* from known numbers when it equals one of them, or the sum,
difference, product or ratio of two, a small count times one ("3 x 12.50") or one split in a
small number of parts, or the sum of three -- each compared at the value's own precision
("33.33" matches 100 / 3). Formatting is not a difference: "1,000.00", "$1000" and 1000 are
the same number (`parse_number`).

`Relation` is the same arithmetic over one *record* (a parsed tool result) instead of a bag of
numbers: which fields an amount is made of ("total - service_fee", "the sum of
items[].price"). `relations_holding` lists those a value satisfies; `Relation.value` computes
one on any record (what `wrong_amount` mines from successful runs, and what an environment
enforcing the mined relation computes on its own records).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tracegym.analysis.runs import flatten

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


def close_to(target: float, value: float | None, decimals: int = 2) -> bool:
    """`value` equals `target` within half a unit of the target's last decimal."""
    return value is not None and abs(value - target) <= 0.5 * 10**-decimals + 1e-9


# Relations over one record -------------------------------------------------------------------
# Forms, simplest first: a field; a field split in n parts; two fields added or subtracted; a
# list's numbers summed; the numbers of the list elements a call names summed.
FORMS = ("field", "share", "sum", "difference", "sum_over", "sum_over_named")
MAX_FIELDS = 80  # pairs are tried over at most this many scalar fields of a record


def amount_of(value: Any) -> float | None:
    """A JSON number, or a string written as a decimal or money ("12.50", "$1,000"); not a
    boolean, nor a digit string (an id, a zip code)."""
    if isinstance(value, str) and not any(c in value for c in ".$€£¥"):
        return None
    return parse_number(value)


def record_numbers(record: Any) -> tuple[dict[str, float], dict[str, list[float]]]:
    """A record's numbers: scalar paths ("total", "refund.fee") with their one number, and
    paths inside lists ("items[].price") with theirs, in record order."""
    scalars: dict[str, list[float]] = {}
    lists: dict[str, list[float]] = {}
    for path, value in flatten(record, root=""):
        number = amount_of(value)
        if number is not None:
            (lists if "[]" in path else scalars).setdefault(path, []).append(number)
    return {p: v[0] for p, v in scalars.items() if len(v) == 1}, lists


def _at(value: Any, tokens: Sequence[str]) -> list[Any]:
    if not tokens:
        return [value]
    head, rest = tokens[0], tokens[1:]
    if head == "[]":
        items = value if isinstance(value, list) else []
        return [found for item in items for found in _at(item, rest)]
    if isinstance(value, dict) and head in value:
        return _at(value[head], rest)
    return []


def path_parts(path: str) -> list[str]:
    """`items[].price` -> ["items", "[]", "price"]."""
    return [t for t in re.split(r"(\[\])|\.", path) if t]


def _texts(value: Any) -> set[str]:
    return {str(v).strip().casefold() for _, v in flatten(value) if isinstance(v, str)}


@dataclass(frozen=True)
class Relation:
    """How an amount follows from one record: `form` (one of FORMS) over record `paths`
    ("total", "items[].price"), with `divisor` for a share."""

    form: str
    paths: tuple[str, ...]
    divisor: int | None = None

    @property
    def complexity(self) -> int:
        return FORMS.index(self.form)

    def value(self, record: Any, named: Iterable[str] = ()) -> float | None:
        """The relation's amount on `record` (None where its fields are missing); `named`: the
        texts a call names (`sum_over_named` sums the list elements holding one of them)."""
        found = [[amount_of(v) for v in _at(record, path_parts(p))] for p in self.paths]
        values = [[x for x in f if x is not None] for f in found]
        if any(not v or len(v) != len(f) for v, f in zip(values, found, strict=True)):
            return None
        if self.form in ("field", "share", "sum", "difference"):
            if any(len(v) != 1 for v in values):
                return None
            a = values[0][0]
            if self.form == "field":
                return a
            if self.form == "share":
                return a / self.divisor if self.divisor else None
            return a + values[1][0] if self.form == "sum" else a - values[1][0]
        if self.form == "sum_over":
            return sum(values[0])
        tokens = path_parts(self.paths[0])
        fan = tokens.index("[]")
        wanted = {str(n).strip().casefold() for n in named}
        chosen = [e for e in _at(record, tokens[: fan + 1]) if _texts(e) & wanted]
        numbers = [amount_of(v) for e in chosen for v in _at(e, tokens[fan + 1 :])]
        picked = [x for x in numbers if x is not None]
        return sum(picked) if chosen and len(picked) == len(numbers) else None

    def text(self, where: str = "") -> str:
        """The relation as a formula over `where`'s fields ("get_order.total - ...")."""
        p = [f"{where}.{x}" if where else x for x in self.paths]
        return {
            "field": lambda: p[0],
            "share": lambda: f"{p[0]} / {self.divisor}",
            "sum": lambda: f"{p[0]} + {p[1]}",
            "difference": lambda: f"{p[0]} - {p[1]}",
            "sum_over": lambda: f"the sum of {p[0]}",
            "sum_over_named": lambda: f"the sum of {p[0]} over the elements the call names",
        }[self.form]()


def relations_holding(
    target: float, record: Any, *, decimals: int = 2, named: Iterable[str] = ()
) -> list[Relation]:
    """Every relation over `record`'s fields that gives `target` (at `decimals`)."""
    scalars, lists = record_numbers(record)
    fields = list(scalars.items())[:MAX_FIELDS]
    out: list[Relation] = []
    for path, a in fields:
        if close_to(target, a, decimals):
            out.append(Relation("field", (path,)))
        for n in SMALL_COUNTS:
            if close_to(target, a / n, decimals):
                out.append(Relation("share", (path,), n))
    for (p, a), (q, b) in itertools.permutations(fields, 2):
        if p < q and close_to(target, a + b, decimals):
            out.append(Relation("sum", (p, q)))
        if close_to(target, a - b, decimals):
            out.append(Relation("difference", (p, q)))
    named = list(named)
    for path, numbers in lists.items():
        if len(numbers) >= 2 and close_to(target, sum(numbers), decimals):
            out.append(Relation("sum_over", (path,)))
        if named:
            relation = Relation("sum_over_named", (path,))
            if close_to(target, relation.value(record, named), decimals):
                out.append(relation)
    return out


__all__ = [
    "FORMS",
    "SMALL_COUNTS",
    "Relation",
    "amount_of",
    "close_to",
    "decimals_of",
    "derived",
    "numbers_in",
    "parse_number",
    "path_parts",
    "record_numbers",
    "relations_holding",
]
