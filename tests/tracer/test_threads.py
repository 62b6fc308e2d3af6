"""The trace context (active span and tracegym's run scope) crossing into threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import tracegym as tg
from tracegym.tracer import semconv as sc

pytestmark = pytest.mark.timeout(60)


def a(span) -> dict:
    return dict(span.attributes or {})


@tg.tool
def work(i):
    return i * i


@pytest.fixture
def instrumented():
    tg.instrument_threads()
    try:
        yield
    finally:
        tg.uninstrument_threads()


def assert_children_of_agent(cap, name, n):
    root = cap.one(f"invoke_agent {name}")
    tools = cap.by_operation("execute_tool")
    assert len(tools) == n
    for t in tools:
        assert t.parent is not None, "tool started an orphan trace"
        assert t.parent.span_id == root.context.span_id
        assert t.context.trace_id == root.context.trace_id
        assert a(t)[sc.AGENT_NAME] == name
    # one step counter per run, shared by every thread: no index twice
    assert sorted(a(t)[sc.STEP_INDEX] for t in tools) == list(range(n))
    assert a(root)[sc.USED_STEPS] == n


def test_plain_threads_lose_the_context(cap):
    """The control: without help, a worker thread's tool starts a trace of its own."""

    @tg.agent(name="plain")
    def plain():
        t = threading.Thread(target=work, args=(1,))
        t.start()
        t.join()

    plain()
    tool = cap.one("execute_tool work")
    assert tool.parent is None
    assert tool.context.trace_id != cap.one("invoke_agent plain").context.trace_id
    assert sc.STEP_INDEX not in a(tool)


def test_wrap(cap):
    @tg.agent(name="wrapped")
    def wrapped():
        fn = tg.wrap(work)
        threads = [threading.Thread(target=fn, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with ThreadPoolExecutor(3) as pool:
            assert list(pool.map(tg.wrap(work), range(4))) == [0, 1, 4, 9]

    wrapped()
    assert_children_of_agent(cap, "wrapped", 10)


def test_wrap_keeps_function_identity_and_can_run_twice(cap):
    @tg.agent(name="twice")
    def twice():
        return tg.wrap(work)

    fn = twice()
    assert fn.__name__ == "work"
    assert fn(3) == 9
    assert fn(4) == 16
    root = cap.one("invoke_agent twice")
    tools = cap.by_operation("execute_tool")
    assert len(tools) == 2
    assert all(t.parent.span_id == root.context.span_id for t in tools)


def test_context_thread_pool_executor(cap):
    @tg.agent(name="pooled")
    def pooled():
        with tg.ContextThreadPoolExecutor(max_workers=4) as pool:
            futures = [pool.submit(work, i) for i in range(12)]
            results = [f.result() for f in futures]
            results += list(pool.map(work, range(3)))
        return results

    assert pooled() == [i * i for i in range(12)] + [0, 1, 4]
    assert_children_of_agent(cap, "pooled", 15)


def test_instrument_threads(cap, instrumented):
    @tg.agent(name="patched")
    def patched():
        threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with ThreadPoolExecutor(2) as pool:
            return [f.result() for f in [pool.submit(work, i) for i in range(5)]]

    assert patched() == [0, 1, 4, 9, 16]
    assert_children_of_agent(cap, "patched", 8)


def test_instrument_threads_is_idempotent_and_undone(cap):
    original_submit = ThreadPoolExecutor.submit
    original_start = threading.Thread.start
    tg.instrument_threads()
    tg.instrument_threads()
    try:
        assert ThreadPoolExecutor.submit is not original_submit
        assert threading.Thread.start is not original_start
    finally:
        tg.uninstrument_threads()
    assert ThreadPoolExecutor.submit is original_submit
    assert threading.Thread.start is original_start
    tg.uninstrument_threads()  # a second undo is harmless
    assert ThreadPoolExecutor.submit is original_submit


def test_subtask_budget_counts_steps_taken_on_worker_threads(cap):
    @tg.agent(name="budget-threads")
    def agent():
        with tg.subtask("parallel", budget_steps=3), tg.ContextThreadPoolExecutor(4) as pool:
            list(pool.map(work, range(5)))

    agent()
    sub = a(cap.one("subtask parallel"))
    assert sub[sc.USED_STEPS] == 5
    assert sub[sc.BUDGET_EXCEEDED] is True
    subtask_span = cap.one("subtask parallel")
    for t in cap.by_operation("execute_tool"):
        assert t.parent.span_id == subtask_span.context.span_id


def test_many_threads_share_one_step_counter(cap):
    """Step indices are claimed from several threads at once: each exactly once."""

    @tg.agent(name="crowd")
    def crowd():
        with tg.ContextThreadPoolExecutor(8) as pool:
            list(pool.map(work, range(400)))

    crowd()
    tools = cap.by_operation("execute_tool")
    assert len(tools) == 400
    assert sorted(a(t)[sc.STEP_INDEX] for t in tools) == list(range(400))
    assert a(cap.one("invoke_agent crowd"))[sc.USED_STEPS] == 400
