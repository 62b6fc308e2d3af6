"""Capturing a value must not slow the agent, nor consume what it gets back.

Before the fix, a tool call under an agent called the argument's `__repr__` 4 times (a repr
sleeping 5 s cost 20 s), looked up its `__class__` 48 times (a slow one cost minutes), and
iterated a Mapping readable once, which then came back to the caller empty. Now the walk never
calls a value's own `__repr__`, `__class__` or iteration (serialize.py): such values become
placeholders, and each capture has a budget of values and time. The tests count calls; none
measures time.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import json
import pathlib
import types
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import tracegym as tg
from pydantic import BaseModel
from tracegym.tracer import semconv as sc
from tracegym.tracer import serialize
from tracegym.tracer.serialize import BUDGET_MARKER, content_hash, to_json


class Looks:
    """Counts of the hooks the tracer must not call."""

    repr = 0
    cls = 0
    iters = 0


@pytest.fixture(autouse=True)
def _reset_looks():
    Looks.repr = Looks.cls = Looks.iters = 0


class SlowRepr:
    """Stands for a repr that sleeps 5 s: each call would cost the agent that much."""

    def __repr__(self) -> str:
        Looks.repr += 1
        return "slow"

    __str__ = __repr__


class SlowClass:
    """Stands for a slow `__class__` property (isinstance looks it up on every miss)."""

    @property  # type: ignore[misc]
    def __class__(self):  # type: ignore[override]
        Looks.cls += 1
        return SlowClass


class Once(Mapping):
    """A Mapping whose items can be read only once (a stream, a cursor)."""

    def __init__(self) -> None:
        self._data = {"a": 1, "b": 2}
        self._used = False

    def __getitem__(self, key: str) -> int:
        return self._data[key]

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[str]:
        Looks.iters += 1
        if self._used:
            return iter(())
        self._used = True
        return iter(list(self._data))


def _traced() -> dict[str, Any]:
    @tg.tool
    def echo(value):
        return value

    @tg.agent(name="agent")
    def agent(value):
        return echo(value)

    @tg.step
    def step(value):
        return value

    @tg.memory_write(store="notes")
    def write(key, value):
        return value

    @tg.memory_read(store="notes")
    def read(query):
        return [query, ("id", query)]

    return {
        "agent": agent,
        "step": step,
        "write": lambda v: write(v, v),
        "read": read,
    }


@pytest.mark.parametrize("op", ["agent", "step", "write", "read"])
def test_a_value_whose_repr_is_slow_is_never_repred(cap, op):
    value = SlowRepr()
    assert _traced()[op](value) is not None
    assert Looks.repr == 0  # before: 4 calls for an agent and its tool
    for span in cap.spans:
        texts = [v for v in dict(span.attributes or {}).values() if isinstance(v, str)]
        assert not any('"slow"' in t for t in texts)
    if op == "agent":
        tool = cap.one("execute_tool echo").attributes
        assert json.loads(tool[sc.TOOL_ARGUMENTS]) == {"value": "<SlowRepr>"}
        assert tool[sc.TOOL_RESULT] == '"<SlowRepr>"'


@pytest.mark.parametrize("op", ["agent", "step", "write", "read"])
def test_a_value_whose_class_is_slow_is_never_asked_for_it(cap, op):
    value = SlowClass()
    _traced()[op](value)
    assert Looks.cls == 0  # before: 48 lookups for an agent and its tool
    assert len(cap.spans) >= 1


def test_a_mapping_readable_once_reaches_the_caller_whole(cap):
    once = Once()
    got = _traced()["agent"](once)
    assert got is once
    assert Looks.iters == 0  # the tracer never iterated it
    assert dict(got.items()) == {"a": 1, "b": 2}  # before: [] (the tracer had read it)
    tool = cap.one("execute_tool echo").attributes
    assert "Once object at 0x" in json.loads(tool[sc.TOOL_ARGUMENTS])["value"]


def test_iterators_and_generators_are_recorded_not_consumed(cap):
    @tg.tool
    def echo(value):
        return value

    items = iter([1, 2, 3])
    numbers = (i for i in range(3))
    assert echo(items) is items
    assert echo(numbers) is numbers
    assert list(items) == [1, 2, 3]
    assert list(numbers) == [0, 1, 2]
    results = [s.attributes[sc.TOOL_RESULT] for s in cap.spans]
    assert "list_iterator object at 0x" in results[0]
    assert "<generator object" in results[1]


class Counted(list):
    """A list subclass whose own iteration counts: the walk reads the list itself instead."""

    def __iter__(self):
        Looks.iters += 1
        return super().__iter__()

    def __len__(self) -> int:
        Looks.iters += 1
        return super().__len__()


def test_builtin_container_subclasses_are_read_without_their_overrides():
    assert to_json({"rows": Counted([1, 2])}) == '{"rows":[1,2]}'
    assert Looks.iters == 0


class Clock:
    """A fake perf_counter, advanced by the values' own (slow) code."""

    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        return cls.now


class SlowDump:
    dumps = 0

    def model_dump(self) -> dict[str, int]:
        SlowDump.dumps += 1
        Clock.now += serialize.TIME_BUDGET_S / 2.5  # each one takes 40% of the budget
        return {"n": SlowDump.dumps}


def test_the_time_budget_stops_the_walk_and_says_so(monkeypatch):
    monkeypatch.setattr(serialize, "time", Clock)
    SlowDump.dumps = 0
    text = to_json([SlowDump() for _ in range(50)])
    assert SlowDump.dumps == 3  # the third one overran the budget: nothing after it is walked
    assert json.loads(text) == [{"n": 1}, {"n": 2}, BUDGET_MARKER]
    assert tg.stats().counters["values_truncated.capture_budget"] == 1


class Jumping:
    """A clock that jumps a second at each look: a machine as loaded as can be."""

    now = 0.0

    @classmethod
    def perf_counter(cls) -> float:
        cls.now += 1.0
        return cls.now


def test_plain_data_is_cut_by_count_alone(monkeypatch):
    """The same plain data is captured (and hashed) the same whatever the machine's load."""
    value = {"rows": [{"id": i, "tags": ["a", {"deep": [i]}]} for i in range(50)]}
    expected = to_json(value)
    digest = content_hash(value)
    monkeypatch.setattr(serialize, "time", Jumping)
    assert to_json(value) == expected
    assert content_hash(value) == digest
    assert BUDGET_MARKER not in expected


def test_the_node_budget_bounds_a_wide_deep_value():
    wide = [[[i * j for i in range(100)] for j in range(100)] for _ in range(100)]  # 1M ints
    text = to_json(wide, 1 << 20)
    assert text.endswith(json.dumps(BUDGET_MARKER, ensure_ascii=False) + "]]")
    assert text.count(",") <= serialize.MAX_NODES + 10
    assert tg.stats().counters["values_truncated.capture_budget"] == 1
    assert content_hash(wide) == content_hash(wide)  # the same cut each time


@dataclasses.dataclass
class Point:
    x: int
    label: str


class Model(BaseModel):
    name: str
    point: Point


class Color(enum.Enum):
    RED = 1


def test_common_types_still_render_well():
    ordered = collections.OrderedDict(a=1, b=2)
    ordered.move_to_end("a")
    value = {
        "ordered": ordered,
        "namespace": types.SimpleNamespace(x=1, y=[2]),
        "dataclass": Point(1, "a"),
        "pydantic": Model(name="m", point=Point(2, "b")),
        "enum": Color.RED,
        "when": datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.timezone.utc),
        "day": datetime.date(2026, 1, 2),
        "money": decimal.Decimal("1.50"),
        "id": uuid.UUID(int=1),
        "path": pathlib.PurePosixPath("/tmp/x"),
        "error": ValueError("bad input", 3),
        "class": Point,
        "number": complex(1, 2),
        "ids": {1: "one", (1, 2): "pair"},
        "blob": b"hi",
    }
    parsed = json.loads(to_json(value))
    assert parsed == {
        "ordered": {"b": 2, "a": 1},
        "namespace": {"x": 1, "y": [2]},
        "dataclass": {"x": 1, "label": "a"},
        "pydantic": {"name": "m", "point": {"x": 2, "label": "b"}},
        "enum": "Color.RED",
        "when": "datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.timezone.utc)",
        "day": "datetime.date(2026, 1, 2)",
        "money": "Decimal('1.50')",
        "id": "UUID('00000000-0000-0000-0000-000000000001')",
        "path": "PurePosixPath('/tmp/x')",
        "error": "ValueError('bad input', 3)",
        "class": f"<class '{__name__}.Point'>",
        "number": "(1+2j)",
        "ids": {"1": "one", "(1, 2)": "pair"},
        "blob": "hi",
    }
