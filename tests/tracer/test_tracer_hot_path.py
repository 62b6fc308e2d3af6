"""The spans of a representative agent, attribute by attribute: what the per-call fast paths
(per-function caches, fewer context switches) must keep exactly as it was.

The expected values are written out here by hand (JSON by the standard library's own encoder),
not captured from the tracer: sync, async, generator and async-generator calls, an error, a
method, *args/**kwargs, capture turned off for one tool, an LLM call, the three memory
operations, a step, a subtask with a budget, a `with` tool and a sub-agent; and the same run
under the settings the cached parts depend on (content capture off, OpenInference off/full).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import Any

import pytest
import tracegym as tg
from opentelemetry.trace import SpanKind, StatusCode
from tracegym.tracer import semconv as sc

pytestmark = pytest.mark.timeout(60)

STORE: dict[str, Any] = {}


def js(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@tg.tool
def get_order(order_id: str) -> dict:
    return {"id": order_id, "total": 1.5, "status": "shipped"}


@tg.tool(name="refund", call_id="call-fixed")
def refund(order_id, *reasons, amount=0, **extra):
    return amount


@tg.tool
def broken(order_id):
    raise ValueError(f"no order {order_id}")


@tg.tool(capture=False)
def secret_lookup(key):
    return "hidden"


class Shop:
    @tg.tool
    def cancel(self, order_id):
        return True


@tg.llm(model="m-1", provider="fake")
def chat(messages):
    return {
        "model": "m-1-2024",
        "choices": [{"message": {"role": "assistant", "content": "done"}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }


@tg.memory_write(store="notes")
def remember(key, value):
    STORE[key] = value


@tg.memory_read(store="notes")
def recall(key):
    return STORE.get(key)


@tg.memory_delete(store="notes")
def forget(key):
    STORE.pop(key, None)


@tg.step(name="plan")
def plan(goal):
    return ["a", "b"]


@tg.tool
def countdown(n):
    yield from range(n)


@tg.tool
async def fetch(url):
    await asyncio.sleep(0)
    return url.upper()


@tg.tool
async def stream(n):
    for i in range(n):
        yield i


@tg.agent(name="helper")
def helper(q):
    return get_order(q)["status"]


async def async_part() -> list[Any]:
    fetched = await fetch("u")
    return [fetched, [i async for i in stream(2)]]


@tg.agent(name="support", agent_id="a-7", conversation_id="c-9", run_id=lambda task: f"run-{task}")
def support(task):
    returned: list[Any] = [get_order("o-1"), refund("o-1", "late", "damaged", amount=5, note="vip")]
    with pytest.raises(ValueError, match="no order o-2"):
        broken("o-2")
    returned += [secret_lookup("k"), Shop().cancel("o-3")]
    returned.append(chat([{"role": "user", "content": "cancel o-3"}])["model"])
    returned += [remember("k1", "v1"), recall("k1"), forget("k1"), plan("g"), list(countdown(3))]
    with tg.subtask("checkout", budget_steps=1):
        returned += [get_order("o-4")["id"], get_order("o-5")["id"]]
    with tg.tool("lookup", arguments={"q": 1}) as call:
        call.set_result({"hits": [1, 2]})
    returned.append(helper("o-6"))
    returned += asyncio.run(async_part())
    return returned


RETURNED = [
    {"id": "o-1", "total": 1.5, "status": "shipped"},
    5,
    "hidden",
    True,
    "m-1-2024",
    None,
    "v1",
    None,
    ["a", "b"],
    [0, 1, 2],
    "o-4",
    "o-5",
    "shipped",
    "U",
    [0, 1],
]
CALL_ID = re.compile(r"call_[0-9a-f]{16}")
HASH_V1 = hashlib.sha256(b"v1").hexdigest()[:32]  # a str record hashes as its UTF-8 bytes


def tool(name: str, step: int, arguments: Any, result: Any, agent: str = "support", **more):
    attrs = {
        sc.OPERATION: sc.OP_TOOL,
        sc.TOOL_NAME: name,
        sc.STEP_INDEX: step,
        sc.AGENT_NAME: agent,
        sc.TOOL_CALL_ID: CALL_ID,
        sc.TOOL_ARGUMENTS: js(arguments),
        sc.OI_SPAN_KIND: "TOOL",
    }
    if result is not None:
        attrs[sc.TOOL_RESULT] = js(result)
    return {**attrs, **more}


SECONDS = object()  # a float >= 0: the time a scope took
ORDER = {"total": 1.5, "status": "shipped"}

# (name, parent's name, attributes), in start order
EXPECTED: list[tuple[str, str | None, dict[str, Any]]] = [
    (
        "invoke_agent support",
        None,
        {
            sc.OPERATION: sc.OP_AGENT,
            sc.AGENT_NAME: "support",
            sc.AGENT_ID: "a-7",
            sc.CONVERSATION_ID: "c-9",
            sc.INPUT: js({"task": "t1"}),
            sc.RUN_ID: "run-t1",
            sc.OI_SPAN_KIND: "AGENT",
            sc.OUTPUT: js(RETURNED),
            sc.USED_STEPS: 17,
            sc.USED_TOKENS: 10,
            sc.USED_SECONDS: SECONDS,
        },
    ),
    (
        "execute_tool get_order",
        "invoke_agent support",
        tool("get_order", 0, {"order_id": "o-1"}, {"id": "o-1", **ORDER}),
    ),
    (
        "execute_tool refund",
        "invoke_agent support",
        tool(
            "refund",
            1,
            {"order_id": "o-1", "reasons": ["late", "damaged"], "amount": 5, "note": "vip"},
            5,
            **{sc.TOOL_CALL_ID: "call-fixed"},
        ),
    ),
    (
        "execute_tool broken",
        "invoke_agent support",
        tool("broken", 2, {"order_id": "o-2"}, None, **{sc.ERROR_TYPE: "ValueError"}),
    ),
    (
        "execute_tool secret_lookup",
        "invoke_agent support",
        {
            sc.OPERATION: sc.OP_TOOL,
            sc.TOOL_NAME: "secret_lookup",
            sc.STEP_INDEX: 3,
            sc.AGENT_NAME: "support",
            sc.TOOL_CALL_ID: CALL_ID,
            sc.OI_SPAN_KIND: "TOOL",
        },
    ),
    ("execute_tool cancel", "invoke_agent support", tool("cancel", 4, {"order_id": "o-3"}, True)),
    (
        "chat m-1",
        "invoke_agent support",
        {
            sc.OPERATION: sc.OP_CHAT,
            sc.REQUEST_MODEL: "m-1",
            sc.PROVIDER: "fake",
            sc.STEP_INDEX: 5,
            sc.AGENT_NAME: "support",
            sc.INPUT_MESSAGES: js(
                [{"role": "user", "parts": [{"type": "text", "content": "cancel o-3"}]}]
            ),
            sc.OI_SPAN_KIND: "LLM",
            sc.INPUT_TOKENS: 7,
            sc.OUTPUT_TOKENS: 3,
            sc.RESPONSE_MODEL: "m-1-2024",
            sc.OUTPUT_MESSAGES: js(
                [
                    {
                        "role": "assistant",
                        "parts": [{"type": "text", "content": "done"}],
                        "finish_reason": "stop",
                    }
                ]
            ),
        },
    ),
    (
        "update_memory notes",
        "invoke_agent support",
        {
            sc.OPERATION: sc.OP_MEMORY_UPDATE,
            sc.MEMORY_STORE: "notes",
            sc.STEP_INDEX: 6,
            sc.AGENT_NAME: "support",
            sc.MEMORY_RECORD: "k1",
            sc.MEMORY_CONTENT_HASH: HASH_V1,
            sc.MEMORY_CONTENT: "v1",
            sc.OI_SPAN_KIND: "CHAIN",
        },
    ),
    (
        "search_memory notes",
        "invoke_agent support",
        {
            sc.OPERATION: sc.OP_MEMORY_SEARCH,
            sc.MEMORY_STORE: "notes",
            sc.STEP_INDEX: 7,
            sc.AGENT_NAME: "support",
            sc.MEMORY_QUERY: "k1",
            sc.OI_SPAN_KIND: "RETRIEVER",
            sc.MEMORY_RESULT_IDS: ("k1",),
            sc.MEMORY_RESULT_HASHES: (HASH_V1,),
            sc.OUTPUT: "v1",
        },
    ),
    (
        "delete_memory notes",
        "invoke_agent support",
        {
            sc.OPERATION: sc.OP_MEMORY_DELETE,
            sc.MEMORY_STORE: "notes",
            sc.STEP_INDEX: 8,
            sc.AGENT_NAME: "support",
            sc.MEMORY_RECORD: "k1",
            sc.OI_SPAN_KIND: "CHAIN",
        },
    ),
    (
        "step plan",
        "invoke_agent support",
        {
            sc.OPERATION: sc.OP_STEP,
            sc.STEP_NAME: "plan",
            sc.STEP_INDEX: 9,
            sc.AGENT_NAME: "support",
            sc.INPUT: js({"goal": "g"}),
            sc.OI_SPAN_KIND: "CHAIN",
            sc.OUTPUT: js(["a", "b"]),
        },
    ),
    (
        "execute_tool countdown",
        "invoke_agent support",
        tool("countdown", 10, {"n": 3}, [0, 1, 2], **{sc.GENERATOR_ITEMS: 3}),
    ),
    (
        "subtask checkout",
        "invoke_agent support",
        {
            sc.OPERATION: sc.OP_SUBTASK,
            sc.SUBTASK_NAME: "checkout",
            sc.BUDGET_STEPS: 1,
            sc.AGENT_NAME: "support",
            sc.OI_SPAN_KIND: "CHAIN",
            sc.USED_STEPS: 2,
            sc.USED_TOKENS: 0,
            sc.USED_SECONDS: SECONDS,
            sc.BUDGET_EXCEEDED: True,
        },
    ),
    (
        "execute_tool get_order",
        "subtask checkout",
        tool("get_order", 11, {"order_id": "o-4"}, {"id": "o-4", **ORDER}),
    ),
    (
        "execute_tool get_order",
        "subtask checkout",
        tool("get_order", 12, {"order_id": "o-5"}, {"id": "o-5", **ORDER}),
    ),
    ("execute_tool lookup", "invoke_agent support", tool("lookup", 13, {"q": 1}, {"hits": [1, 2]})),
    (
        "invoke_agent helper",
        "invoke_agent support",
        {
            sc.OPERATION: sc.OP_AGENT,
            sc.AGENT_NAME: "helper",
            sc.INPUT: js({"q": "o-6"}),
            sc.OI_SPAN_KIND: "AGENT",
            sc.OUTPUT: "shipped",
            sc.USED_STEPS: 1,
            sc.USED_TOKENS: 0,
            sc.USED_SECONDS: SECONDS,
        },
    ),
    (
        "execute_tool get_order",
        "invoke_agent helper",
        tool("get_order", 14, {"order_id": "o-6"}, {"id": "o-6", **ORDER}, agent="helper"),
    ),
    ("execute_tool fetch", "invoke_agent support", tool("fetch", 15, {"url": "u"}, "U")),
    (
        "execute_tool stream",
        "invoke_agent support",
        tool("stream", 16, {"n": 2}, [0, 1], **{sc.GENERATOR_ITEMS: 2}),
    ),
]
# `js("U")` quotes it; a string result is recorded as the text itself
EXPECTED[-2][2][sc.TOOL_RESULT] = "U"


def _settle(expected: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any]:
    """`expected` with its patterns (call ids, durations) replaced by the actual values they
    match, so that one equality compares everything else exactly."""
    out = dict(expected)
    for key, want in expected.items():
        got = actual.get(key)
        if want is SECONDS:
            assert isinstance(got, float) and got >= 0, (key, got)
            out[key] = got
        elif isinstance(want, re.Pattern):
            assert isinstance(got, str) and want.fullmatch(got), (key, got)
            out[key] = got
    return out


def _check(captured, expected: list[tuple[str, str | None, dict[str, Any]]]) -> None:
    spans = sorted(captured.spans, key=lambda s: s.start_time)
    by_id = {s.context.span_id: s for s in spans}
    assert [s.name for s in spans] == [name for name, _, _ in expected]
    root = spans[0]
    for span, (name, parent, attrs) in zip(spans, expected, strict=True):
        actual = dict(span.attributes or {})
        assert actual == _settle(attrs, actual), name
        assert span.kind is SpanKind.INTERNAL
        assert span.context.trace_id == root.context.trace_id  # one run, one trace
        got_parent = by_id[span.parent.span_id].name if span.parent is not None else None
        assert got_parent == parent, name
        if name == "execute_tool broken":
            assert span.status.status_code is StatusCode.ERROR
            assert span.status.description == "ValueError: no order o-2"
            [event] = span.events
            assert event.name == "exception"
            assert event.attributes["exception.type"] == "ValueError"
            assert event.attributes["exception.message"] == "no order o-2"
            assert event.attributes["exception.escaped"] == "True"
            assert "ValueError: no order o-2" in event.attributes["exception.stacktrace"]
        else:
            assert span.status.status_code is StatusCode.UNSET, name
            assert span.status.description is None and not span.events, name
    call_ids = [s.attributes.get(sc.TOOL_CALL_ID) for s in spans]
    drawn = [c for c in call_ids if c is not None and c != "call-fixed"]
    assert len(set(drawn)) == len(drawn)  # a fresh id per call


def _without(expected, keys: frozenset[str] | set[str]):
    return [(n, p, {k: v for k, v in a.items() if k not in keys}) for n, p, a in expected]


def test_spans_of_a_representative_run_are_exactly_as_specified():
    STORE.clear()
    with tg.testing.capture() as captured:
        assert support("t1") == RETURNED  # what the user's code returns is untouched
    _check(captured, EXPECTED)
    assert tg.stats().internal_errors == 0


def test_the_same_run_twice_in_a_row_records_the_same():
    """Whatever is cached on the first call must give the second call the same spans."""
    STORE.clear()
    with tg.testing.capture() as first:
        support("t1")
    _check(first, EXPECTED)
    with tg.testing.capture() as second:
        support("t1")
    _check(second, EXPECTED)


def test_content_capture_off_leaves_out_exactly_the_content():
    STORE.clear()
    with tg.testing.capture(capture_content=False) as captured:
        assert support("t1") == RETURNED
    _check(captured, _without(EXPECTED, sc.CONTENT_ATTRIBUTES))


def test_openinference_off_then_kinds_again():
    """The span kind follows the setting of the moment, also after a call under another."""
    STORE.clear()
    with tg.testing.capture(openinference="off") as off:
        support("t1")
    _check(off, _without(EXPECTED, {sc.OI_SPAN_KIND}))
    with tg.testing.capture() as kinds:
        support("t1")
    _check(kinds, EXPECTED)


def test_openinference_full_adds_the_derived_values():
    STORE.clear()
    with tg.testing.capture(openinference="full") as captured:
        support("t1")
    spans = {s.name: s for s in captured.spans}
    expected = {name: attrs for name, _, attrs in EXPECTED}
    cancel = dict(spans["execute_tool cancel"].attributes)
    assert cancel == _settle(
        {
            **expected["execute_tool cancel"],
            sc.OI_INPUT_VALUE: js({"order_id": "o-3"}),
            sc.OI_INPUT_MIME: "application/json",
            sc.OI_OUTPUT_VALUE: "true",
            sc.OI_OUTPUT_MIME: "text/plain",
        },
        cancel,
    )
    assert dict(spans["chat m-1"].attributes) == {
        **expected["chat m-1"],
        sc.OI_INPUT_VALUE: "cancel o-3",
        sc.OI_INPUT_MIME: "text/plain",
        sc.OI_OUTPUT_VALUE: "done",
        sc.OI_OUTPUT_MIME: "text/plain",
        sc.OI_MODEL_NAME: "m-1-2024",  # the response's model before the request's
        sc.OI_PROMPT_TOKENS: 7,
        sc.OI_COMPLETION_TOKENS: 3,
        sc.OI_TOTAL_TOKENS: 10,
    }


def test_call_ids_stay_unique_across_threads_and_a_fork():
    """Call ids are drawn in batches: threads drawing at once, and a child forked with part of
    a batch left, must still never repeat one."""
    import os
    import threading

    from tracegym.tracer import kinds

    with tg.testing.capture() as captured:

        def work() -> None:
            for _ in range(300):
                get_order("o-1")

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    ids = [s.attributes[sc.TOOL_CALL_ID] for s in captured.spans]
    assert len(ids) == 1200 and len(set(ids)) == 1200
    assert all(CALL_ID.fullmatch(i) for i in ids)

    if not hasattr(os, "fork"):
        return
    kept = list(kinds._call_ids)
    assert kept  # the parent holds drawn ids a child could otherwise reuse
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            with tg.testing.capture() as child:
                for _ in range(5):
                    get_order("o-1")
            os.write(write, " ".join(s.attributes[sc.TOOL_CALL_ID] for s in child.spans).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_ids = pipe.read().split()
    os.waitpid(pid, 0)
    assert len(child_ids) == 5 and all(CALL_ID.fullmatch(i) for i in child_ids)
    assert not set(child_ids) & set(kept) and not set(child_ids) & set(ids)


def test_a_subclass_overriding_the_hooks_still_gets_them_called():
    """The hooks a kind leaves at their defaults are skipped per class: a subclass of one's
    own that overrides them (on_end, open_scope, start_span) must see every call."""
    from tracegym.tracer.context import ActiveRun, Budget, Scope
    from tracegym.tracer.kinds import Tool

    seen: list[str] = []

    class Audited(Tool):
        def start_span(self, attrs, parent):
            seen.append("start_span")
            return super().start_span(attrs, parent)

        def open_scope(self, span, parent, arguments):
            seen.append("open_scope")
            return Scope(ActiveRun("audit"), "auditor", (Budget(),))

        def on_end(self, handle):
            seen.append("on_end")
            handle.span.set_attribute("audit.done", True)

    @Audited(name="audited")
    def audited(x):
        return tg.current_run_id()

    with tg.testing.capture() as captured:
        assert audited(1) == "audit"  # the scope it opened is the one its body sees
    assert seen == ["start_span", "open_scope", "on_end"]
    assert captured.one("execute_tool audited").attributes["audit.done"] is True
