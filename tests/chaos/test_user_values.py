"""The tracer's look at user values must never change what the user's code does.

Before the fix, an argument whose `__repr__` raised SystemExit, KeyboardInterrupt or another
BaseException escaped from the decorator and the decorated function never ran (the undecorated
call returned normally). Now every inspection of a user value is guarded against anything it
raises: the value becomes a `<TypeName>` placeholder, the failure is counted once, the function
runs once and returns (or raises) exactly what it would undecorated.

The tracer no longer calls a value's own `__repr__`, `__str__`,
`__len__`, `__iter__` or `__class__` at all (see serialize.py): the hostile values here also
raise from `model_dump`, which it still calls, and their `__repr__` counts that it never ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import tracegym as tg
from opentelemetry import trace
from tracegym.tracer import semconv as sc
from tracegym.tracer import serialize
from tracegym.tracer.serialize import content_hash, to_json


class CustomBase(BaseException):
    pass


RAISED = [
    SystemExit,
    KeyboardInterrupt,
    GeneratorExit,
    CustomBase,
    asyncio.CancelledError,
    ValueError,
]


class BadRepr:
    """A value whose repr, str and model_dump raise `kind`."""

    reprs = 0  # calls of __repr__/__str__: the tracer makes none

    def __init__(self, kind: type[BaseException]) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        BadRepr.reprs += 1
        raise self.kind("from __repr__")

    __str__ = __repr__

    def model_dump(self) -> Any:
        raise self.kind("from model_dump")


@pytest.fixture(autouse=True)
def _count_reprs_per_test():
    BadRepr.reprs = 0


def a(span) -> dict[str, Any]:
    return dict(span.attributes or {})


def assert_counted(kind: type[BaseException]) -> None:
    """Once per failure: an internal error for a BaseException, a plain count for the rest."""
    stats = tg.stats()
    if issubclass(kind, Exception):
        assert stats.internal_errors == 0
        assert stats.counters.get("values_unrepresentable", 0) >= 1
    else:
        assert stats.errors.get("inspect", 0) >= 1
        assert set(stats.errors) == {"inspect"}, stats.errors


def _kinds() -> dict[str, tuple[Any, str, str]]:
    """Decorated functions that return their argument, with the span and attribute that
    records the argument."""
    calls: list[Any] = []

    @tg.tool
    def tool(x):
        calls.append(x)
        return x

    @tg.agent(name="agent")
    def agent(x):
        calls.append(x)
        return x

    @tg.llm(model="m", capture_messages=True)
    def llm(messages):
        calls.append(messages)
        return messages

    @tg.memory_write(store="notes")
    def write(key, value):
        calls.append(value)
        return value

    @tg.memory_read(store="notes")
    def read(query):
        calls.append(query)
        return query

    @tg.step
    def step(x):
        calls.append(x)
        return x

    return {
        "tool": (tool, "execute_tool tool", sc.TOOL_ARGUMENTS),
        "agent": (agent, "invoke_agent agent", sc.INPUT),
        "llm": (llm, "chat m", sc.INPUT_MESSAGES),
        "memory_write": (lambda v: write("k", v), "update_memory notes", sc.MEMORY_CONTENT),
        "memory_read": (read, "search_memory notes", sc.MEMORY_QUERY),
        "step": (step, "step step", sc.INPUT),
    }, calls


@pytest.mark.parametrize("kind", RAISED, ids=lambda k: k.__name__)
@pytest.mark.parametrize("op", ["tool", "agent", "llm", "memory_write", "memory_read", "step"])
def test_argument_whose_repr_raises_still_runs_the_function(cap, op, kind):
    functions, calls = _kinds()
    fn, span_name, attribute = functions[op]
    bad = BadRepr(kind)
    assert fn(bad) is bad
    assert calls == [bad]  # ran exactly once
    span = a(cap.one(span_name))
    assert "<BadRepr>" in span[attribute]
    assert_counted(kind)
    assert BadRepr.reprs == 0


@pytest.mark.parametrize("kind", RAISED, ids=lambda k: k.__name__)
def test_result_whose_repr_raises_is_returned_unchanged(cap, kind):
    bad = BadRepr(kind)

    @tg.tool
    def make():
        return bad

    assert make() is bad
    assert a(cap.one("execute_tool make"))[sc.TOOL_RESULT] == '"<BadRepr>"'
    assert_counted(kind)


class BadContainer(list):
    """A list whose __len__ and __iter__ raise a BaseException."""

    def __len__(self) -> int:
        raise SystemExit("from __len__")

    def __iter__(self):
        raise KeyboardInterrupt("from __iter__")


class BadMapping(Mapping):
    def __getitem__(self, key):
        raise GeneratorExit("from __getitem__")

    def __iter__(self):
        raise CustomBase("from __iter__")

    def __len__(self) -> int:
        raise SystemExit("from __len__")


class BadClass:
    @property
    def __class__(self):  # type: ignore[override]
        raise KeyboardInterrupt("from __class__")


class BadDump:
    def model_dump(self):
        raise SystemExit("from model_dump")


@dataclass
class BadField:
    x: int

    def __getattribute__(self, name: str) -> Any:
        if name == "x":
            raise KeyboardInterrupt("from a field")
        return object.__getattribute__(self, name)


class BadBytes(bytes):
    def __getitem__(self, key):
        raise SystemExit("from bytes.__getitem__")


# Factories, not values: pytest itself would choke on repr() of these in a report.
HOSTILE = {
    "BadContainer": lambda: BadContainer([1, 2]),
    "BadMapping": BadMapping,
    "BadClass": BadClass,
    "BadDump": BadDump,
    "BadField": lambda: BadField(1),
    "BadBytes": lambda: BadBytes(b"x"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_containers_and_objects(cap, name):
    value = HOSTILE[name]()
    calls = []

    @tg.tool
    def echo(v):
        calls.append(v)
        return v

    @tg.memory_write(store="s")
    def put(key, v):
        return v

    @tg.memory_read(store="s")
    def get(query):
        return value

    assert echo(value) is value
    assert put(value, value) is value
    assert get(value) is value
    assert len(calls) == 1
    assert calls[0] is value
    assert isinstance(a(cap.one("execute_tool echo"))[sc.TOOL_ARGUMENTS], str)
    assert a(cap.one("update_memory s"))[sc.MEMORY_CONTENT_HASH]
    assert sc.MEMORY_RESULT_HASHES in a(cap.one("search_memory s"))
    # what still looks at the value (a memory read's records) counts what it raised; the
    # serialiser itself no longer calls these methods at all
    assert set(tg.stats().errors) <= {"inspect"}


def test_serialisers_never_raise_a_base_exception():
    for kind in RAISED:
        bad = BadRepr(kind)
        assert to_json(bad) == '"<BadRepr>"'
        assert to_json({"k": bad, "ok": 1}) == '{"k":"<BadRepr>","ok":1}'  # only the bad leaf
        assert serialize.to_plain([bad], 100) == ["<BadRepr>"]
        assert len(content_hash(bad)) == 32
        assert to_json({bad: 1}) == '{"<BadRepr>":1}'  # a key
    for make in HOSTILE.values():
        value = make()
        assert isinstance(to_json(value), str)
        assert len(content_hash(value)) == 32


class Usage:
    @property
    def usage(self):
        raise KeyboardInterrupt("from .usage")

    @property
    def model(self):
        raise SystemExit("from .model")


def test_llm_result_whose_properties_raise(cap):
    result = Usage()

    @tg.llm(model="m")
    def chat(messages):
        return result

    assert chat([{"role": "user", "content": "hi"}]) is result
    span = a(cap.one("chat m"))
    assert sc.INPUT_TOKENS not in span
    assert tg.stats().errors == {"inspect": 2}


def test_llm_model_argument_whose_class_raises(cap):
    @tg.llm
    def chat(model, messages):
        return "ok"

    assert chat(BadClass(), []) == "ok"
    assert cap.one("chat chat").end_time is not None


def test_callbacks_raising_a_base_exception(cap):
    @tg.agent(name="a", run_id=lambda task: (_ for _ in ()).throw(SystemExit("from run_id")))
    def agent(task):
        return task

    @tg.agent(name="b", run_id=lambda task: BadRepr(KeyboardInterrupt))
    def agent_b(task):
        return task

    @tg.memory_read(store="s", records=lambda result: (_ for _ in ()).throw(CustomBase("cb")))
    def read(query):
        return ["x"]

    assert agent("t") == "t"
    assert agent_b("t") == "t"
    assert read("q") == ["x"]
    for name in ("invoke_agent a", "invoke_agent b"):
        assert a(cap.one(name))[sc.RUN_ID]  # a run id of its own
    assert a(cap.one("search_memory s"))[sc.MEMORY_RESULT_IDS] == ()
    assert sum(tg.stats().errors.values()) == 3


class Unprintable(RuntimeError):
    def __str__(self) -> str:
        raise SystemExit("from the exception's __str__")


def test_user_exception_whose_str_raises_still_propagates(cap):
    err = Unprintable()

    @tg.tool
    def broken():
        raise err

    with pytest.raises(Unprintable) as info:
        broken()
    assert info.value is err
    span = cap.one("execute_tool broken")
    assert span.status.description.endswith("Unprintable: <unprintable Unprintable>")
    assert a(span)[sc.ERROR_TYPE].endswith("Unprintable")
    (event,) = span.events
    assert event.name == "exception"


def _run(awaitable: Any) -> Any:
    """Drive a coroutine by hand: asyncio itself cannot hold a value whose repr raises
    SystemExit (its task repr fails with it, decorated or not)."""
    try:
        awaitable.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")


def test_generators_and_coroutines_with_hostile_items(cap):
    bad = BadRepr(SystemExit)

    @tg.tool
    def gen(x):
        yield x
        return x

    @tg.tool
    async def coro(x):
        return x

    @tg.tool
    async def agen(x):
        yield x

    g = gen(bad)
    assert next(g) is bad
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value is bad
    assert _run(coro(bad)) is bad
    items = agen(bad)
    assert _run(items.__anext__()) is bad
    with pytest.raises(StopAsyncIteration):
        _run(items.__anext__())
    assert len(cap.spans) == 3
    for span in cap.spans:
        assert "<BadRepr>" in a(span)[sc.TOOL_ARGUMENTS]
        assert "<BadRepr>" in a(span)[sc.TOOL_RESULT]
    assert tg.stats().errors.get("inspect", 0) >= 6


def test_keyboard_interrupt_raised_by_the_function_still_propagates(cap):
    @tg.tool
    def interrupted():
        raise KeyboardInterrupt

    @tg.tool
    async def interrupted_async():
        raise KeyboardInterrupt

    @tg.tool
    def interrupted_gen():
        yield 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(interrupted_async())
    with pytest.raises(KeyboardInterrupt):
        list(interrupted_gen())
    assert len(cap.spans) == 3
    assert {a(s)[sc.ERROR_TYPE] for s in cap.spans} == {"KeyboardInterrupt"}
    assert tg.stats().internal_errors == 0


def _raise_from_tracegym_code() -> Any:
    """A function whose frame looks like serialize.py's: a Ctrl-C landing in tracegym's own
    code (a signal), not one raised by a user value."""
    namespace: dict[str, Any] = {}
    source = (
        "def encode(value):\n"
        "    if 'boom' in value:\n"
        "        raise KeyboardInterrupt\n"
        "    return '{}'\n"
    )
    exec(compile(source, serialize.__file__, "exec"), namespace)
    return namespace["encode"]


def test_ctrl_c_landing_in_tracegym_code_still_interrupts(cap, monkeypatch):
    monkeypatch.setattr(serialize, "_encode_fast", _raise_from_tracegym_code())
    calls = []

    @tg.tool
    def work(boom=None, **kw):
        calls.append(boom)
        return {"boom": 1}

    with pytest.raises(KeyboardInterrupt):  # while the arguments were serialised
        work(boom=1)
    assert calls == []
    with pytest.raises(KeyboardInterrupt):  # while the result was: the span still ends
        work(fine=1)
    assert calls == [None]
    assert cap.one("execute_tool work").end_time is not None
    assert not trace.get_current_span().get_span_context().is_valid  # context restored
    assert tg.stats().internal_errors == 0


def test_record_outcome_and_set_usage_with_hostile_values(cap):
    tg.record_outcome(BadRepr(SystemExit), success=True)  # never raises
    tg.record_outcome("run-1", labels=[BadRepr(KeyboardInterrupt)])
    with tg.llm("m"):
        tg.set_usage(BadClass(), 3)
    outcome = a(cap.one("tracegym.outcome"))
    assert outcome[sc.OUTCOME_LABELS] == '["<BadRepr>"]'
    assert tg.stats().errors.get("record_outcome") == 1
