"""A memory read that returns a million records must cost the agent's thread a
bounded amount of work.

Before the fix every record was hashed for `tracegym.memory.result.content_hashes` (+9.5 s for
1,000,000 records). Now the first MEMORY_RESULT_LIMIT records get ids and hashes and the rest
are counted in `tracegym.memory.result.omitted`. The work is measured by counting calls into the
records (their `__repr__`, their iteration), not by wall time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import tracegym as tg
from tracegym.tracer import semconv as sc
from tracegym.tracer.kinds import MEMORY_RESULT_LIMIT
from tracegym.tracer.serialize import MAX_ITEMS, content_hash, to_json, to_plain

N = 1_000_000


class Counted:
    """A record's content that counts how often the tracer looks at it."""

    looks = 0

    def __repr__(self) -> str:
        Counted.looks += 1
        return "note"


class CountingList(list):
    """A list that counts the items handed out by its iteration."""

    yielded = 0

    def __iter__(self) -> Iterator[Any]:
        for item in list.__iter__(self):
            CountingList.yielded += 1
            yield item


class CountingDict(dict):
    yielded = 0

    def items(self):  # type: ignore[override]
        for pair in dict.items(self):
            CountingDict.yielded += 1
            yield pair


@pytest.fixture(autouse=True)
def _reset_counts():
    Counted.looks = CountingList.yielded = CountingDict.yielded = 0


def a(span) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.mark.parametrize("shape", ["anonymous", "pairs"])
def test_a_million_records_cost_a_bounded_number_of_looks(cap, shape):
    content = Counted()
    records = [content] * N if shape == "anonymous" else [("rec", content)] * N

    @tg.memory_read(store="notes")
    def search(query):
        return records

    assert search("q") is records
    span = a(cap.one("search_memory notes"))
    assert len(span[sc.MEMORY_RESULT_HASHES]) == MEMORY_RESULT_LIMIT
    assert len(span[sc.MEMORY_RESULT_IDS]) == MEMORY_RESULT_LIMIT
    assert span[sc.MEMORY_RESULT_OMITTED] == N - MEMORY_RESULT_LIMIT
    # one look per hashed record, plus the summary of the captured output
    assert Counted.looks <= MEMORY_RESULT_LIMIT + MAX_ITEMS


def test_records_callback_returning_a_list_or_an_iterator(cap):
    content = Counted()
    rows = [content] * N

    @tg.memory_read(store="a", records=lambda result: [(i, c) for i, c in enumerate(result)])
    def listed(query):
        return rows

    @tg.memory_read(store="b", records=lambda result: ((i, c) for i, c in enumerate(result)))
    def lazy(query):
        return rows

    listed("q")
    lazy("q")
    for name in ("search_memory a", "search_memory b"):
        span = a(cap.one(name))
        assert span[sc.MEMORY_RESULT_IDS][:3] == ("0", "1", "2")
        assert len(span[sc.MEMORY_RESULT_HASHES]) == MEMORY_RESULT_LIMIT
        assert span[sc.MEMORY_RESULT_OMITTED] == N - MEMORY_RESULT_LIMIT
    assert Counted.looks <= 2 * (MEMORY_RESULT_LIMIT + MAX_ITEMS)


def test_a_small_read_is_recorded_whole(cap):
    @tg.memory_read(store="notes")
    def search(query):
        return [("a", "x"), ("b", "y")]

    search("q")
    span = a(cap.one("search_memory notes"))
    assert span[sc.MEMORY_RESULT_IDS] == ("a", "b")
    assert span[sc.MEMORY_RESULT_HASHES] == (content_hash("x"), content_hash("y"))
    assert sc.MEMORY_RESULT_OMITTED not in span


def test_serialising_huge_containers_walks_only_what_it_keeps():
    rows = CountingList(range(N))
    mapping = CountingDict((i, i) for i in range(N))
    for serialise in (lambda v: to_json(v), lambda v: to_plain(v, 8192), content_hash):
        CountingList.yielded = CountingDict.yielded = 0
        serialise(rows)
        serialise(mapping)
        serialise({"rows": rows, "mapping": mapping})
        assert CountingList.yielded <= 2 * (MAX_ITEMS + 1)
        assert CountingDict.yielded <= 2 * (MAX_ITEMS + 1)
    assert to_plain(rows, 8192)[-1] == f"…+{N - MAX_ITEMS} more items"


def test_memory_write_of_a_huge_container_is_bounded(cap):
    rows = CountingList([Counted()] * N)

    @tg.memory_write(store="notes")
    def remember(key, value):
        return None

    remember("k", rows)
    span = a(cap.one("update_memory notes"))
    assert span[sc.MEMORY_CONTENT_HASH] == content_hash(rows)
    assert CountingList.yielded <= 3 * (MAX_ITEMS + 1)  # hash, content, and the check above
