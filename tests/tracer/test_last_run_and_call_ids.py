"""`tg.last_run_id()` after the agent returns (per thread, per asyncio task), and `@tg.tool`
spans carrying the call ids of the model reply that asked for them."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import tracegym as tg
from tracegym.tracer import semconv as sc

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_last_run():
    """Each test starts in a thread that finished no run (the variable is the thread's)."""
    from tracegym.tracer import context

    token = context.last_run.set(None)
    yield
    context.last_run.reset(token)


@tg.agent(name="verifier-run")
def named(task: str) -> str:
    return task


@tg.agent(name="inner")
def inner(task: str) -> str:
    return task


@tg.agent(name="outer", run_id=lambda task: f"outer-{task}")
def outer(task: str) -> str:
    inner(task)  # a sub-agent ends inside the run: the run has not ended yet
    assert tg.last_run_id() != f"outer-{task}"
    return task


@tg.agent(name="failing", run_id="failing-run")
def failing() -> None:
    raise ValueError("boom")


def test_last_run_id_is_the_run_the_agent_finished(cap):
    assert tg.last_run_id() is None
    outer("a")
    assert tg.last_run_id() == "outer-a"
    root = cap.one("invoke_agent outer")
    assert root.attributes[sc.RUN_ID] == "outer-a"
    named("b")  # no run id given: the trace id is the run id
    assert tg.last_run_id() == cap.one("invoke_agent verifier-run").attributes[sc.RUN_ID]
    with pytest.raises(ValueError):
        failing()
    assert tg.last_run_id() == "failing-run"  # a run that raised has ended too


def test_last_run_id_is_per_thread(cap):
    outer("main")
    seen: dict[str, str | None] = {}
    started, proceed = threading.Event(), threading.Event()

    def worker() -> None:
        seen["before"] = tg.last_run_id()
        outer("thread")
        seen["after"] = tg.last_run_id()
        started.set()
        proceed.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(10)
    assert tg.last_run_id() == "outer-main"  # the worker's run is the worker's
    proceed.set()
    thread.join(10)
    assert seen == {"before": None, "after": "outer-thread"}


def test_last_run_id_is_per_asyncio_task(cap):
    @tg.agent(name="async-agent", run_id=lambda task: f"async-{task}")
    async def agent(task: str) -> str:
        await asyncio.sleep(0)
        return task

    async def verify(task: str) -> str | None:
        await agent(task)
        return tg.last_run_id()

    async def main() -> tuple[list[str | None], str | None]:
        got = await asyncio.gather(verify("x"), verify("y"))  # each in a task of its own
        return got, tg.last_run_id()

    got, in_main = asyncio.run(main())
    assert got == ["async-x", "async-y"]
    assert in_main is None  # the tasks' runs are theirs, not the caller's


def _reply(*calls: tuple[str, str, dict]) -> dict:
    """An OpenAI chat completion asking for tool calls (arguments as JSON text)."""
    tool_calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in calls
    ]
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {"model": "m", "choices": [{"message": message, "finish_reason": "tool_calls"}]}


@tg.tool
def get_order(order_id: str) -> dict:
    return {"id": order_id}


@tg.tool
def cancel_order(order_id: str, reason: str = "asked") -> str:
    return "cancelled"


def test_tool_spans_carry_the_model_call_ids(cap):
    replies = iter(
        [
            _reply(
                ("call_A", "get_order", {"order_id": "O-1"}),
                ("call_B", "get_order", {"order_id": "O-2"}),
            ),
            _reply(("call_C", "cancel_order", {"order_id": "O-2"})),
        ]
    )

    @tg.llm(model="m")
    def model(messages: list) -> dict:
        return next(replies)

    @tg.agent(name="support")
    def support() -> None:
        model([{"role": "user", "content": "cancel O-2"}])
        get_order("O-2")  # the model's second call, run first
        get_order("O-1")
        get_order("O-1")  # asked for once only: an id of its own
        model([{"role": "user", "content": "go on"}])
        cancel_order("O-2", reason="user")  # not what the model asked (reason): its own id
        get_order("O-3")  # nobody asked

    support()
    ids = [
        (s.name, dict(s.attributes)[sc.TOOL_CALL_ID])
        for s in sorted(cap.spans, key=lambda s: s.start_time)
        if s.name.startswith("execute_tool")
    ]
    assert ids[:2] == [("execute_tool get_order", "call_B"), ("execute_tool get_order", "call_A")]
    own = [i for _, i in ids[2:]]
    assert all(i.startswith("call_") and i not in {"call_A", "call_B", "call_C"} for i in own)
    assert len(set(own)) == len(own)


def test_the_model_call_id_links_when_the_arguments_match(cap):
    @tg.llm(model="m")
    def model(messages: list) -> dict:
        return _reply(("call_Z", "cancel_order", {"order_id": "O-9", "reason": "late"}))

    @tg.agent(name="support")
    def support() -> None:
        model([])
        cancel_order(order_id="O-9", reason="late")

    support()
    span = cap.one("execute_tool cancel_order")
    assert span.attributes[sc.TOOL_CALL_ID] == "call_Z"
    # the model's reply names the same id: the two are one call in the stored run
    reply = json.loads(cap.one("chat m").attributes[sc.OUTPUT_MESSAGES])
    assert reply[0]["parts"][0]["id"] == "call_Z"


def test_linking_never_raises_into_user_code(cap, monkeypatch: pytest.MonkeyPatch):
    from tracegym.tracer import context

    def broken(*_: object) -> None:
        raise RuntimeError("tracegym bug")

    monkeypatch.setattr("tracegym.tracer.kinds.claim_call", broken)
    monkeypatch.setattr("tracegym.tracer.kinds.expect_calls", broken)

    @tg.llm(model="m")
    def model(messages: list) -> dict:
        return _reply(("call_Q", "get_order", {"order_id": "O-1"}))

    @tg.agent(name="support", run_id="broken-run")
    def support() -> dict:
        model([])
        return get_order("O-1")

    assert support() == {"id": "O-1"}  # the agent's own result, whatever tracegym did
    assert context.last_run_id() == "broken-run"
