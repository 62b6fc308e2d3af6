"""Exceptions: the user's pass through unchanged and are recorded; tracegym's own never reach
the user's code."""

from __future__ import annotations

import asyncio
import logging
import traceback

import pytest
import tracegym as tg
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.trace import StatusCode
from tracegym.tracer import context as scope_context
from tracegym.tracer import kinds, operations
from tracegym.tracer import semconv as sc
from tracegym.tracer.operations import Handle, state
from tracegym.tracer.redact import Redactor

pytestmark = pytest.mark.timeout(60)


def a(span) -> dict:
    return dict(span.attributes or {})


class PaymentDeclined(Exception):
    pass


class Abort(BaseException):
    """Not an Exception: tracegym must not swallow or alter these either."""


def frames(exc: BaseException) -> list[str]:
    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


def assert_recorded(span, exc_type: type[BaseException], message: str) -> None:
    expected = (
        exc_type.__qualname__
        if exc_type.__module__ == "builtins"
        else f"{exc_type.__module__}.{exc_type.__qualname__}"
    )
    assert a(span)[sc.ERROR_TYPE] == expected
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description.startswith(expected)
    events = [e for e in span.events if e.name == "exception"]
    assert len(events) == 1
    ev = dict(events[0].attributes)
    assert ev["exception.type"] in (exc_type.__qualname__, expected)
    assert ev["exception.message"] == message
    assert "exception.stacktrace" in ev
    assert span.end_time is not None


# The user's exceptions ----------------------------------------------------------------------

ERR = PaymentDeclined("card 4242 declined")


@tg.tool
def charge(amount):
    raise ERR


@tg.agent(name="buyer")
def buyer():
    return charge(10)


def test_sync_exception_passes_through_unchanged(cap):
    with pytest.raises(PaymentDeclined) as info:
        buyer()
    assert info.value is ERR
    assert type(info.value) is PaymentDeclined
    assert info.value.__cause__ is None
    assert info.value.__context__ is None  # tracegym raised nothing while handling it
    assert "charge" in frames(info.value)  # the original frame is in the traceback
    assert frames(info.value)[-1] == "charge"
    assert_recorded(cap.one("execute_tool charge"), PaymentDeclined, "card 4242 declined")
    # it escaped the agent too, so the agent failed as well
    assert_recorded(cap.one("invoke_agent buyer"), PaymentDeclined, "card 4242 declined")
    # nothing leaks out: no span or run still active
    assert tg.current_trace_id() is None
    assert tg.current_run_id() is None


def test_builtin_exception_type_and_caught_error(cap):
    @tg.tool
    def parse(text):
        return int(text)

    @tg.agent(name="tolerant")
    def tolerant():
        try:
            parse("nope")
        except ValueError:
            return "recovered"

    assert tolerant() == "recovered"
    tool = cap.one("execute_tool parse")
    assert a(tool)[sc.ERROR_TYPE] == "ValueError"
    assert tool.status.status_code is StatusCode.ERROR
    agent = cap.one("invoke_agent tolerant")
    assert agent.status.status_code is StatusCode.UNSET  # handled inside: the run did not fail
    assert sc.ERROR_TYPE not in a(agent)
    assert sc.TOOL_RESULT not in a(tool)


def test_async_exception(cap):
    err = KeyError("missing")

    @tg.tool
    async def lookup():
        await asyncio.sleep(0)
        raise err

    with pytest.raises(KeyError) as info:
        asyncio.run(lookup())
    assert info.value is err
    assert "lookup" in frames(info.value)
    assert_recorded(cap.one("execute_tool lookup"), KeyError, "'missing'")


def test_generator_exception_after_items(cap):
    err = RuntimeError("stream broke")

    @tg.tool
    def stream():
        yield 1
        yield 2
        raise err

    got = []
    with pytest.raises(RuntimeError) as info:
        for item in stream():
            got.append(item)
    assert got == [1, 2]
    assert info.value is err
    assert frames(info.value)[-1] == "stream"
    span = cap.one("execute_tool stream")
    assert_recorded(span, RuntimeError, "stream broke")


def test_exception_thrown_into_generator_is_recorded(cap):
    @tg.tool
    def worker():
        yield "ready"
        yield "never"

    gen = worker()
    assert next(gen) == "ready"
    err = TimeoutError("consumer gave up")
    with pytest.raises(TimeoutError) as info:
        gen.throw(err)
    assert info.value is err
    assert_recorded(cap.one("execute_tool worker"), TimeoutError, "consumer gave up")


def test_async_generator_exception(cap):
    err = ConnectionError("socket closed")

    @tg.llm(model="streamer")
    async def stream():
        yield "a"
        raise err

    async def main():
        return [x async for x in stream()]

    with pytest.raises(ConnectionError) as info:
        asyncio.run(main())
    assert info.value is err
    assert "stream" in frames(info.value)
    assert_recorded(cap.one("chat streamer"), ConnectionError, "socket closed")


def test_context_manager_exception(cap):
    err = PermissionError("denied")
    with pytest.raises(PermissionError) as info, tg.agent("cm-agent"), tg.tool("guarded"):
        raise err
    assert info.value is err
    assert_recorded(cap.one("execute_tool guarded"), PermissionError, "denied")
    assert_recorded(cap.one("invoke_agent cm-agent"), PermissionError, "denied")


def test_base_exception_passes_through(cap):
    @tg.tool
    def stop():
        raise Abort("stop now")

    with pytest.raises(Abort) as info:
        stop()
    assert info.value.args == ("stop now",)
    span = cap.one("execute_tool stop")
    assert span.status.status_code is StatusCode.ERROR
    assert a(span)[sc.ERROR_TYPE].endswith("Abort")


def test_subtask_records_budget_even_when_it_fails(cap):
    @tg.tool
    def flaky():
        raise OSError("io")

    with pytest.raises(OSError), tg.subtask("doomed", budget_steps=0):
        flaky()
    sub = cap.one("subtask doomed")
    assert sub.status.status_code is StatusCode.ERROR
    assert a(sub)[sc.USED_STEPS] == 1
    assert a(sub)[sc.BUDGET_EXCEEDED] is True


# tracegym's own failures --------------------------------------------------------------------


def boom(*args, **kwargs):
    raise RuntimeError("tracegym bug")


def test_internal_error_at_span_start_never_reaches_user(cap, monkeypatch):
    calls = []

    @tg.tool
    def compute(x):
        calls.append(x)
        return {"x": x}

    monkeypatch.setattr(kinds.Tool, "call_attributes", boom)
    result = compute(3)
    assert result == {"x": 3}
    assert calls == [3]  # the function ran exactly once
    stats = tg.stats()
    assert stats.internal_errors == 1
    assert stats.errors == {"begin.execute_tool": 1}
    assert cap.spans == []  # that one span is lost, and counted


def test_internal_error_at_span_end_keeps_the_span(cap, monkeypatch):
    @tg.tool
    def compute():
        return 42

    monkeypatch.setattr(kinds.Tool, "on_result", boom)
    assert compute() == 42
    assert tg.stats().errors == {"finish.execute_tool": 1}
    span = cap.one("execute_tool compute")
    assert span.end_time is not None


def test_internal_error_while_recording_a_user_exception(cap, monkeypatch):
    err = PaymentDeclined("still the user's")

    @tg.tool
    def pay():
        raise err

    monkeypatch.setattr(operations, "_error_type", boom)
    with pytest.raises(PaymentDeclined) as info:
        pay()
    assert info.value is err
    assert info.value.__context__ is None
    assert tg.stats().errors == {"fail.execute_tool": 1}
    assert cap.one("execute_tool pay").end_time is not None


class BrokenTracer:
    def start_span(self, *args, **kwargs):
        raise RuntimeError("tracer exploded")

    start_as_current_span = start_span


def test_broken_tracer_everywhere(monkeypatch):
    monkeypatch.setattr(state, "tracer", BrokenTracer())

    @tg.tool
    def sync_tool(x):
        return x + 1

    @tg.tool
    async def async_tool(x):
        return x + 2

    @tg.tool
    def gen_tool(n):
        yield from range(n)

    @tg.tool
    async def agen_tool(n):
        for i in range(n):
            yield i

    @tg.agent(name="broken")
    def agent():
        return sync_tool(1)

    async def consume():
        return [i async for i in agen_tool(3)]

    assert agent() == 2
    assert asyncio.run(async_tool(1)) == 3
    assert list(gen_tool(3)) == [0, 1, 2]
    assert asyncio.run(consume()) == [0, 1, 2]
    with tg.tool("cm") as call:
        call.set_result("ignored")
        call.set_attribute("k", "v")
        call.set_usage(1, 2)
    tg.record_outcome("run", success=True)
    tg.set_usage(1, 2)
    stats = tg.stats()
    assert stats.internal_errors >= 7
    assert stats.errors["record_outcome"] == 1
    assert stats.errors["begin.execute_tool"] >= 5


def test_internal_error_in_step_counter(cap, monkeypatch):
    @tg.tool
    def inner():
        return "inner"

    @tg.agent(name="counter")
    def agent():
        return inner()

    monkeypatch.setattr(scope_context, "next_step", boom)
    assert agent() == "inner"
    assert tg.stats().internal_errors == 1
    assert cap.names() == ["invoke_agent counter"]


def test_internal_errors_in_context_detach_and_span_end(cap, monkeypatch):
    @tg.tool
    def compute():
        return "value"

    original_deactivate = Handle.deactivate

    def deactivate_then_fail(self):
        original_deactivate(self)  # detach for real, so the test leaves no context behind
        raise RuntimeError("detach bug")

    monkeypatch.setattr(Handle, "deactivate", deactivate_then_fail)
    assert compute() == "value"
    monkeypatch.undo()
    assert tg.stats().errors == {"detach": 1}
    assert cap.one("execute_tool compute").end_time is not None

    monkeypatch.setattr(SdkSpan, "end", boom)
    assert compute() == "value"
    monkeypatch.undo()
    assert tg.stats().errors == {"detach": 1, "end": 1}
    assert tg.current_trace_id() is None


def test_internal_error_in_redaction_drops_and_counts(cap, monkeypatch):
    @tg.tool
    def compute():
        return "value"

    monkeypatch.setattr(Redactor, "redact_attributes", boom)
    assert compute() == "value"
    stats = tg.stats()
    assert stats.errors == {"redact": 1}
    assert stats.spans_dropped == 1  # never exported unchecked, never lost silently
    assert cap.spans == []


def test_internal_errors_are_logged_once_per_site(cap, monkeypatch, caplog):
    @tg.tool
    def compute(i):
        return i

    monkeypatch.setattr(kinds.Tool, "call_attributes", boom)
    with caplog.at_level(logging.WARNING, logger="tracegym"):
        assert [compute(i) for i in range(5)] == list(range(5))
    records = [r for r in caplog.records if r.name == "tracegym"]
    assert len(records) == 1
    assert "begin.execute_tool" in records[0].getMessage()
    assert records[0].exc_info is not None
    assert tg.stats().errors == {"begin.execute_tool": 5}


def test_hostile_run_id_callable_never_reaches_user(cap):
    @tg.agent(name="bad-run-id", run_id=lambda **kw: 1 / 0)
    def agent(task):
        return task.upper()

    assert agent("ok") == "OK"
    assert tg.stats().internal_errors == 1
