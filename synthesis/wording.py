"""How the agent's users word a request, learnt from recorded requests of the same kind.

Requests of one kind share their wording and differ in a few values:

    Hi, my email is ben94@mail.com. Please change my address to 53 Hill Ln.
    Hi, my email is ana75@mail.com. Please change my address to 88 Pine Rd.

Each request's identity (the value its run passed to its first call, here the email) becomes the
`identity` slot; the words that differ between requests (`53 Hill Ln`, `88 Pine Rd`) become value
slots, each with the values seen. A synthesized task then asks in the users' own words, with a
new identity and a recorded value:

    wording = learn_wording([(text, identity_value), ...])
    wording.fill(identity="kai89@mail.com", values=["12 Oak St"])

Words are compared token by token (words and single punctuation marks), so a value never swallows
the full stop after it.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

IDENTITY = "\x00identity\x00"
_TOKEN = re.compile(r"\x00identity\x00|\w+|[^\w\s]")
MIN_REQUESTS = 2
MIN_FIXED_WORDS = 3  # a wording is more than a slot: this many shared words at least,
MIN_FIXED_SHARE = 0.4  # and this share of the request's tokens


class WordingError(ValueError):
    """The requests do not share a wording with the slots asked for."""


@dataclass
class Wording:
    """A request template: fixed text around an identity slot and value slots."""

    parts: list[str]  # fixed text; slots sit between consecutive parts
    slots: list[str]  # "identity" or "value"
    values: list[list[str]] = field(default_factory=list)  # per value slot: the values seen

    def fill(self, identity: str = "", values: Sequence[str] = ()) -> str:
        out, pending = [self.parts[0]], list(values)
        for slot, part in zip(self.slots, self.parts[1:], strict=True):
            out.append(identity if slot == "identity" else pending.pop(0))
            out.append(part)
        return "".join(out)

    @property
    def value_slots(self) -> int:
        return sum(1 for s in self.slots if s == "value")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Wording:
        return cls(list(data["parts"]), list(data["slots"]), [list(v) for v in data["values"]])


def _tokens(text: str) -> list[re.Match[str]]:
    return list(_TOKEN.finditer(text))


def learn_wording(requests: Sequence[tuple[str, str | None]]) -> Wording:
    """The shared wording of `requests`: (text, the identity value its run used, if any)."""
    texts = []
    for text, identity in requests:
        text = " ".join(str(text).split())
        if identity and identity in text:
            text = text.replace(identity, IDENTITY, 1)
        if text not in texts:
            texts.append(text)
    if len(texts) < MIN_REQUESTS:
        raise WordingError(f"needs at least {MIN_REQUESTS} different recorded requests")
    first = _tokens(texts[0])
    words = [m.group() for m in first]
    variable = [False] * len(words)
    for other in texts[1:]:
        matcher = difflib.SequenceMatcher(None, words, [m.group() for m in _tokens(other)], False)
        kept = [False] * len(words)
        for block in matcher.get_matching_blocks():
            for i in range(block.a, block.a + block.size):
                kept[i] = True
        variable = [v or not k for v, k in zip(variable, kept, strict=True)]
    fixed = sum(1 for w, v in zip(words, variable, strict=True) if not v and w[0].isalnum())
    if fixed < MIN_FIXED_WORDS or fixed < MIN_FIXED_SHARE * len(words):
        raise WordingError("the requests do not share one wording")
    parts, slots, cursor, i = [], [], 0, 0
    text = texts[0]
    while i < len(first):
        if words[i] == IDENTITY or variable[i]:
            j = i
            if words[i] != IDENTITY:
                while j + 1 < len(first) and variable[j + 1] and words[j + 1] != IDENTITY:
                    j += 1
            parts.append(text[cursor : first[i].start()])
            slots.append("identity" if words[i] == IDENTITY else "value")
            cursor = first[j].end()
            i = j + 1
        else:
            i += 1
    parts.append(text[cursor:])
    if slots.count("identity") > 1:
        raise WordingError("the identity appears more than once in a request")
    wording = Wording(parts, slots, [[] for _ in range(slots.count("value"))])
    pattern = re.compile(
        "^"
        + "".join(
            re.escape(part) + ("(.+?)" if k < len(slots) else "") for k, part in enumerate(parts)
        )
        + "$",
        re.S,
    )
    for text in texts:
        found = pattern.match(text)
        if found is None:
            continue  # a request worded otherwise
        groups = [g for g, slot in zip(found.groups(), slots, strict=True) if slot == "value"]
        for k, value in enumerate(groups):
            if value not in wording.values[k]:
                wording.values[k].append(value)
    if any(len(v) < MIN_REQUESTS for v in wording.values):
        raise WordingError("the requests do not share one wording")
    # sorted: the same requests give the same wording, in whatever order the runs came
    wording.values = [sorted(v) for v in wording.values]
    return wording


__all__ = ["IDENTITY", "Wording", "WordingError", "learn_wording"]


# Requests about records -----------------------------------------------------------------------
RECORD, CUSTOMER = "\x00record\x00", "\x00customer\x00"  # slots of a learnt request template


def learn_record_template(
    requests: Sequence[Any], id_regex: str, owner_regex: str | None, left_over: str = r"\d"
) -> str:
    """The users' most common wording of a request about one record (`Gap.requests`), with the
    record's id (and the customer's) as slots: recorded texts naming exactly one record, with
    nothing matching `left_over` left in them (another value a task could not fill); "" when
    fewer than `MIN_REQUESTS` requests share one."""
    ids = re.compile(id_regex.strip("^$"))
    owners = re.compile(owner_regex.strip("^$")) if owner_regex else None
    counts: Counter[str] = Counter()
    for request in requests:
        text = " ".join(request.text.split())
        if len(ids.findall(text)) != 1:
            continue
        text = ids.sub(RECORD, text)
        text = owners.sub(CUSTOMER, text) if owners is not None else text
        if re.search(left_over, text.replace(RECORD, "").replace(CUSTOMER, "")):
            continue
        counts[text] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))
    return ranked[0][0] if ranked and ranked[0][1] >= MIN_REQUESTS else ""


def fill_record_template(template: str, records: str, customer: str, said: Sequence[str]) -> str:
    """A learnt template with its slots filled, and what else the user states after it."""
    text = template.replace(RECORD, records).replace(CUSTOMER, customer)
    return text + (f" ({'; '.join(said)})" if said else "")
