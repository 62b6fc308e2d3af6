"""Coroutines, asyncio tasks, generators and async generators: the span tree and attributes."""

from __future__ import annotations

import asyncio
import json

import pytest
import tracegym as tg
from opentelemetry.trace import StatusCode
from tracegym.tracer import semconv as sc

pytestmark = pytest.mark.timeout(60)


def a(span) -> dict:
    return dict(span.attributes or {})


def by_start(spans):
    return sorted(spans, key=lambda s: s.start_time)


@tg.tool
async def fetch(url: str) -> str:
    await asyncio.sleep(0.001)
    return f"<html>{url}</html>"


@tg.llm(model="async-model")
async def think(prompt):
    await asyncio.sleep(0)
    return {"usage": {"input_tokens": 2, "output_tokens": 3}}


@tg.memory_write(store="async-notes")
async def save(key, value):
    await asyncio.sleep(0)


@tg.agent(name="crawler")
async def crawler(urls):
    pages = [await fetch(u) for u in urls[:1]]
    await think("summarise")
    await save("summary", pages[0])
    pages += await asyncio.gather(*(fetch(u) for u in urls[1:]))
    return len(pages)


# Coroutines and tasks -----------------------------------------------------------------------


def test_async_nesting(cap):
    assert asyncio.run(crawler(["a", "b", "c", "d", "e"])) == 5
    root = cap.one("invoke_agent crawler")
    children = cap.children(root)
    assert len(children) == 7
    assert sorted(c.name for c in children) == sorted(
        ["execute_tool fetch"] * 5 + ["chat async-model", "update_memory async-notes"]
    )
    assert {s.context.trace_id for s in cap.spans} == {root.context.trace_id}
    assert sorted(a(c)[sc.STEP_INDEX] for c in children) == list(range(7))
    assert a(root)[sc.USED_TOKENS] == 5
    assert a(root)[sc.OUTPUT] == "5"
    first = by_start(cap.by_operation("execute_tool"))[0]
    assert json.loads(a(first)[sc.TOOL_ARGUMENTS]) == {"url": "a"}
    assert a(first)[sc.TOOL_RESULT] == "<html>a</html>"


def test_gather_of_tools_under_one_agent(cap):
    @tg.agent(name="fanout")
    async def fanout():
        return await asyncio.gather(*(fetch(str(i)) for i in range(8)))

    assert asyncio.run(fanout()) == [f"<html>{i}</html>" for i in range(8)]
    root = cap.one("invoke_agent fanout")
    tools = cap.by_operation("execute_tool")
    assert len(tools) == 8
    for t in tools:
        assert t.parent is not None
        assert t.parent.span_id == root.context.span_id
        assert t.context.trace_id == root.context.trace_id
        assert a(t)[sc.AGENT_NAME] == "fanout"
    assert sorted(a(t)[sc.STEP_INDEX] for t in tools) == list(range(8))
    assert len({a(t)[sc.TOOL_CALL_ID] for t in tools}) == 8
    assert sorted(json.loads(a(t)[sc.TOOL_ARGUMENTS])["url"] for t in tools) == sorted(
        str(i) for i in range(8)
    )


def test_create_task_inherits_the_agent(cap):
    @tg.agent(name="spawner")
    async def spawner():
        task = asyncio.create_task(fetch("bg"))
        await asyncio.sleep(0)
        return await task

    asyncio.run(spawner())
    root = cap.one("invoke_agent spawner")
    assert cap.one("execute_tool fetch").parent.span_id == root.context.span_id


def test_concurrent_runs_stay_apart(cap):
    @tg.agent(name="worker")
    async def worker(n):
        for i in range(n):
            await fetch(f"{n}-{i}")
            await asyncio.sleep(0.001)
        return tg.current_run_id()

    async def main():
        return await asyncio.gather(worker(3), worker(4), worker(5))

    run_ids = asyncio.run(main())
    assert len(set(run_ids)) == 3
    roots = cap.by_operation("invoke_agent")
    assert len(roots) == 3
    assert len({r.context.trace_id for r in roots}) == 3
    for root in roots:
        children = cap.children(root)
        n = len(children)
        assert n in (3, 4, 5)
        prefixes = {json.loads(a(c)[sc.TOOL_ARGUMENTS])["url"].split("-")[0] for c in children}
        assert prefixes == {str(n)}
        assert sorted(a(c)[sc.STEP_INDEX] for c in children) == list(range(n))
        assert a(root)[sc.USED_STEPS] == n
        assert a(root)[sc.RUN_ID] in run_ids


def test_async_with_forms(cap):
    async def main():
        async with tg.agent("async-cm") as run:
            async with tg.tool("lookup", arguments={"k": 1}) as call:
                await asyncio.sleep(0)
                call.set_result({"v": 2})
            async with tg.subtask("part", budget_steps=0), tg.step("inner"):
                await asyncio.sleep(0)
            run.set_result("ok")

    asyncio.run(main())
    assert cap.tree() == [
        (
            "invoke_agent async-cm",
            [("execute_tool lookup", []), ("subtask part", [("step inner", [])])],
        )
    ]
    assert json.loads(a(cap.one("execute_tool lookup"))[sc.TOOL_RESULT]) == {"v": 2}
    assert a(cap.one("subtask part"))[sc.BUDGET_EXCEEDED] is True
    assert a(cap.one("invoke_agent async-cm"))[sc.OUTPUT] == "ok"


# Generators ---------------------------------------------------------------------------------


def test_generator_span_covers_the_iteration(cap):
    @tg.tool
    def inner_lookup(i):
        return i * 10

    @tg.tool
    def stream(n):
        for i in range(n):
            yield inner_lookup(i)  # called while the generator runs: a child of `stream`

    @tg.agent(name="consumer")
    def consumer():
        out = []
        for item in stream(3):
            out.append(item)
            inner_lookup(-1)  # the consumer's own call: a sibling, not a child of `stream`
        return out

    assert consumer() == [0, 10, 20]
    root = cap.one("invoke_agent consumer")
    gen = cap.one("execute_tool stream")
    assert gen.parent.span_id == root.context.span_id
    lookups = by_start(s for s in cap.spans if s.name == "execute_tool inner_lookup")
    args = [json.loads(a(s)[sc.TOOL_ARGUMENTS])["i"] for s in lookups]
    assert args == [0, -1, 1, -1, 2, -1]
    for s, i in zip(lookups, args, strict=True):
        expected_parent = root if i == -1 else gen
        assert s.parent.span_id == expected_parent.context.span_id, i
    # the generator's span lasts until it is exhausted
    assert gen.end_time >= max(s.end_time for s in lookups)
    ga = a(gen)
    assert ga[sc.GENERATOR_ITEMS] == 3
    assert json.loads(ga[sc.TOOL_RESULT]) == [0, 10, 20]
    assert json.loads(ga[sc.TOOL_ARGUMENTS]) == {"n": 3}
    assert gen.status.status_code is StatusCode.UNSET
    # step indices: the generator claims one when called, then each lookup in call order
    assert a(gen)[sc.STEP_INDEX] == 0
    assert [a(s)[sc.STEP_INDEX] for s in lookups] == [1, 2, 3, 4, 5, 6]


def test_generator_send_throw_and_return_value(cap):
    @tg.tool
    def accumulator():
        total = 0
        while True:
            try:
                value = yield total
            except ValueError:
                value = 100
            if value is None:
                return f"final {total}"
            total += value

    def driver():
        result = yield from accumulator()
        return result

    gen = driver()
    assert next(gen) == 0
    assert gen.send(5) == 5
    assert gen.throw(ValueError("recover")) == 105
    with pytest.raises(StopIteration) as stop:
        gen.send(None)
    assert stop.value.value == "final 105"
    span = a(cap.one("execute_tool accumulator"))
    assert span[sc.GENERATOR_ITEMS] == 3
    assert span[sc.TOOL_RESULT] == "final 105"  # the return value wins over the items


def test_generator_closed_early_is_not_an_error(cap):
    cleaned = []

    @tg.tool
    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            cleaned.append(True)

    for item in endless():
        if item == 4:
            break
    # CPython closes the abandoned generator right away
    assert cleaned == [True]
    span = cap.one("execute_tool endless")
    assert span.end_time is not None
    assert span.status.status_code is StatusCode.UNSET
    assert a(span)[sc.GENERATOR_ITEMS] == 5
    assert json.loads(a(span)[sc.TOOL_RESULT]) == [0, 1, 2, 3, 4]
    assert not span.events


def test_generator_keeps_only_the_first_items_but_counts_all(cap):
    @tg.tool
    def many():
        yield from range(1000)

    assert sum(many()) == sum(range(1000))
    span = a(cap.one("execute_tool many"))
    assert span[sc.GENERATOR_ITEMS] == 1000
    assert json.loads(span[sc.TOOL_RESULT]) == list(range(100))


def test_generator_not_started_until_iterated(cap):
    calls = []

    @tg.step
    def lazy():
        calls.append("started")
        yield 1

    gen = lazy()
    assert calls == []
    assert list(gen) == [1]
    assert calls == ["started"]
    assert cap.names() == ["step lazy"]


# Async generators ---------------------------------------------------------------------------


def test_async_generator_tree_and_items(cap):
    @tg.tool
    async def token_stream(prompt):
        for word in prompt.split():
            await fetch(word)  # inside the stream: a child of it
            yield word

    @tg.agent(name="streamer")
    async def streamer():
        words = []
        async for word in token_stream("one two three"):
            words.append(word)
            await fetch("consumer")  # the consumer's call: a child of the agent
        return words

    assert asyncio.run(streamer()) == ["one", "two", "three"]
    root = cap.one("invoke_agent streamer")
    stream = cap.one("execute_tool token_stream")
    assert stream.parent.span_id == root.context.span_id
    fetches = by_start(s for s in cap.spans if s.name == "execute_tool fetch")
    urls = [json.loads(a(s)[sc.TOOL_ARGUMENTS])["url"] for s in fetches]
    assert urls == ["one", "consumer", "two", "consumer", "three", "consumer"]
    for s, url in zip(fetches, urls, strict=True):
        parent = root if url == "consumer" else stream
        assert s.parent.span_id == parent.context.span_id, url
    sa = a(stream)
    assert sa[sc.GENERATOR_ITEMS] == 3
    assert json.loads(sa[sc.TOOL_RESULT]) == ["one", "two", "three"]
    assert stream.end_time >= max(s.end_time for s in fetches)
    assert stream.status.status_code is StatusCode.UNSET


def test_async_generator_asend_athrow_and_early_close(cap):
    closed = []

    @tg.step
    async def echo():
        value = None
        try:
            while True:
                try:
                    value = yield value
                except KeyError:
                    value = "recovered"
        finally:
            closed.append(True)

    async def main():
        agen = echo()
        assert await agen.asend(None) is None
        assert await agen.asend("x") == "x"
        assert await agen.athrow(KeyError("k")) == "recovered"
        await agen.aclose()

    asyncio.run(main())
    assert closed == [True]
    span = cap.one("step echo")
    assert span.status.status_code is StatusCode.UNSET
    assert a(span)[sc.GENERATOR_ITEMS] == 3
    assert json.loads(a(span)[sc.OUTPUT]) == [None, "x", "recovered"]


def test_async_generator_break_ends_the_span(cap):
    @tg.tool
    async def numbers():
        i = 0
        while True:
            yield i
            i += 1

    async def main():
        agen = numbers()
        async for n in agen:
            if n == 2:
                break
        await agen.aclose()

    asyncio.run(main())
    span = cap.one("execute_tool numbers")
    assert span.end_time is not None
    assert a(span)[sc.GENERATOR_ITEMS] == 3
    assert span.status.status_code is StatusCode.UNSET


def test_async_generator_llm_usage_charged(cap):
    @tg.llm(model="streaming", usage=lambda chunks: (len(chunks), 2 * len(chunks)))
    async def stream_completion():
        for chunk in ("a", "b", "c"):
            yield chunk

    @tg.agent(name="stream-agent")
    async def agent():
        return [c async for c in stream_completion()]

    assert asyncio.run(agent()) == ["a", "b", "c"]
    chat = a(cap.one("chat streaming"))
    assert (chat[sc.INPUT_TOKENS], chat[sc.OUTPUT_TOKENS]) == (3, 6)
    assert a(cap.one("invoke_agent stream-agent"))[sc.USED_TOKENS] == 9


# A generator left with `break` is closed, not failed -------------------------


def test_generators_left_with_break_under_asyncio_run_are_not_errors(cap):
    """Before the fix the async generator's span was ERROR `CancelledError` with an exception
    event: `asyncio.run` cancels the finalizer task that would close the abandoned generator,
    which throws the CancelledError in at its yield."""
    cleaned = []

    @tg.tool
    async def numbers():
        i = 0
        try:
            while True:
                yield i
                i += 1
        finally:
            cleaned.append("async")

    @tg.tool
    def counting():
        i = 0
        try:
            while True:
                yield i
                i += 1
        finally:
            cleaned.append("sync")

    async def main():
        seen = []
        async for n in numbers():  # no aclose(): left to asyncio's finalizer
            seen.append(n)
            if n == 2:
                break
        for n in counting():
            seen.append(n)
            if n == 1:
                break
        return seen

    assert asyncio.run(main()) == [0, 1, 2, 0, 1]
    assert sorted(cleaned) == ["async", "sync"]  # both generators' own cleanup ran
    for name, items in (("execute_tool numbers", 3), ("execute_tool counting", 2)):
        span = cap.one(name)
        assert span.end_time is not None
        assert span.status.status_code is StatusCode.UNSET, (name, span.status.description)
        assert not span.events, name
        assert sc.ERROR_TYPE not in a(span)
        assert a(span)[sc.GENERATOR_ITEMS] == items
    assert tg.stats().internal_errors == 0


def test_generators_that_really_raise_are_still_errors(cap):
    @tg.tool
    async def broken_async():
        yield 1
        raise ValueError("async boom")

    @tg.tool
    def broken_sync():
        yield 1
        raise KeyError("sync boom")

    @tg.tool
    async def refuses():
        yield 1  # a ValueError thrown in at this yield is not handled: it fails the generator
        yield 2

    async def main():
        with pytest.raises(ValueError, match="async boom"):
            async for _ in broken_async():
                pass
        with pytest.raises(KeyError):
            for _ in broken_sync():
                await asyncio.sleep(0)
        agen = refuses()
        assert await agen.__anext__() == 1
        with pytest.raises(ValueError, match="thrown"):
            await agen.athrow(ValueError("thrown"))

    asyncio.run(main())
    for name, error in (
        ("execute_tool broken_async", "ValueError"),
        ("execute_tool broken_sync", "KeyError"),
        ("execute_tool refuses", "ValueError"),
    ):
        span = cap.one(name)
        assert span.status.status_code is StatusCode.ERROR, name
        assert a(span)[sc.ERROR_TYPE] == error
        assert [e.name for e in span.events] == ["exception"], name
