"""The span tree and the attributes of each span kind (sync code; async, generators and threads
have files of their own)."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import StatusCode
from tracegym.tracer import semconv as sc
from tracegym.tracer.serialize import content_hash

pytestmark = pytest.mark.timeout(60)


def a(span) -> dict:
    return dict(span.attributes or {})


def by_start(spans):
    return sorted(spans, key=lambda s: s.start_time)


# A small agent used by several tests ---------------------------------------------------------

STORE: dict[str, object] = {}


@tg.tool
def get_order(order_id: str) -> dict:
    return {"id": order_id, "status": "shipped"}


@tg.llm(model="gpt-4o")
def call_model(messages):
    return {
        "model": "gpt-4o-2024-08-06",
        "choices": [{"message": {"role": "assistant", "content": "it shipped"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5},
    }


@tg.memory_write(store="notes")
def remember(key, value):
    STORE[key] = value


@tg.memory_read(store="notes")
def recall(key):
    return STORE.get(key)


@tg.agent(name="support", agent_id="agent-7", conversation_id="conv-9")
def support(task: str) -> str:
    order = get_order("o-1")
    call_model([{"role": "user", "content": task}])
    remember("o-1", order["status"])
    recall("o-1")
    return "done"


def test_nested_sync_tree_and_attributes(cap):
    assert support("where is my order?") == "done"

    assert cap.tree() == [
        (
            "invoke_agent support",
            [
                ("execute_tool get_order", []),
                ("chat gpt-4o", []),
                ("update_memory notes", []),
                ("search_memory notes", []),
            ],
        )
    ]
    root = cap.one("invoke_agent support")
    assert root.parent is None
    assert {s.context.trace_id for s in cap.spans} == {root.context.trace_id}
    for child in cap.children(root):
        assert a(child)[sc.AGENT_NAME] == "support"
        assert child.status.status_code is StatusCode.UNSET

    ra = a(root)
    assert ra[sc.OPERATION] == "invoke_agent"
    assert ra[sc.AGENT_NAME] == "support"
    assert ra[sc.AGENT_ID] == "agent-7"
    assert ra[sc.CONVERSATION_ID] == "conv-9"
    assert ra[sc.RUN_ID] == format(root.context.trace_id, "032x")
    assert json.loads(ra[sc.INPUT]) == {"task": "where is my order?"}
    assert ra[sc.OUTPUT] == "done"
    assert ra[sc.USED_STEPS] == 4
    assert ra[sc.USED_TOKENS] == 17
    assert ra[sc.USED_SECONDS] >= 0

    tool = a(cap.one("execute_tool get_order"))
    assert tool[sc.OPERATION] == "execute_tool"
    assert tool[sc.TOOL_NAME] == "get_order"
    assert tool[sc.TOOL_CALL_ID].startswith("call_")
    assert json.loads(tool[sc.TOOL_ARGUMENTS]) == {"order_id": "o-1"}
    assert json.loads(tool[sc.TOOL_RESULT]) == {"id": "o-1", "status": "shipped"}

    chat = a(cap.one("chat gpt-4o"))
    assert chat[sc.OPERATION] == "chat"
    assert chat[sc.REQUEST_MODEL] == "gpt-4o"
    assert chat[sc.RESPONSE_MODEL] == "gpt-4o-2024-08-06"
    assert chat[sc.INPUT_TOKENS] == 12
    assert chat[sc.OUTPUT_TOKENS] == 5
    assert json.loads(chat[sc.INPUT_MESSAGES])[0]["role"] == "user"  # captured by default

    write = a(cap.one("update_memory notes"))
    assert write[sc.OPERATION] == "update_memory"
    assert write[sc.MEMORY_STORE] == "notes"
    assert write[sc.MEMORY_RECORD] == "o-1"
    assert write[sc.MEMORY_CONTENT_HASH] == content_hash("shipped")

    read = a(cap.one("search_memory notes"))
    assert read[sc.OPERATION] == "search_memory"
    assert read[sc.MEMORY_STORE] == "notes"
    assert read[sc.MEMORY_QUERY] == "o-1"
    assert read[sc.MEMORY_RESULT_IDS] == ("o-1",)


def test_step_indices_increase_within_a_run(cap):
    @tg.step
    def plan(goal):
        return f"plan for {goal}"

    @tg.agent(name="looper")
    def looper():
        for i in range(3):
            plan(i)
            get_order(f"o-{i}")
            call_model([])
        with tg.step("reflect"):
            recall("o-1")

    looper()
    indexed = by_start(s for s in cap.spans if sc.STEP_INDEX in a(s))
    assert [a(s)[sc.STEP_INDEX] for s in indexed] == list(range(11))
    assert a(cap.one("step reflect"))[sc.STEP_NAME] == "reflect"
    assert a(cap.one("step reflect"))[sc.OPERATION] == "step"
    assert a(cap.one("invoke_agent looper"))[sc.USED_STEPS] == 11
    assert sc.STEP_INDEX not in a(cap.one("invoke_agent looper"))


def test_each_outermost_agent_call_is_a_new_run(cap):
    support("first")
    support("second")
    roots = by_start(cap.by_operation("invoke_agent"))
    assert len(roots) == 2
    first, second = roots
    assert first.context.trace_id != second.context.trace_id
    assert a(first)[sc.RUN_ID] != a(second)[sc.RUN_ID]
    for root in roots:
        children = cap.children(root)
        assert len(children) == 4
        assert {c.context.trace_id for c in children} == {root.context.trace_id}
        # the step counter starts again in every run
        assert sorted(a(c)[sc.STEP_INDEX] for c in children) == [0, 1, 2, 3]


def test_sub_agent_is_a_child_in_the_same_run(cap):
    @tg.agent(name="researcher")
    def researcher(q):
        get_order(q)
        return tg.current_run_id()

    @tg.agent(name="planner")
    def planner():
        get_order("a")
        inner_run = researcher("b")
        get_order("c")
        return tg.current_run_id(), inner_run

    outer_run, inner_run = planner()
    assert outer_run == inner_run
    outer = cap.one("invoke_agent planner")
    inner = cap.one("invoke_agent researcher")
    assert inner.parent.span_id == outer.context.span_id
    assert inner.context.trace_id == outer.context.trace_id
    assert a(inner)[sc.AGENT_NAME] == "researcher"
    tools = by_start(cap.by_operation("execute_tool"))
    assert [a(t)[sc.AGENT_NAME] for t in tools] == ["planner", "researcher", "planner"]
    assert [a(t)[sc.STEP_INDEX] for t in tools] == [0, 1, 2]
    assert tools[1].parent.span_id == inner.context.span_id
    assert a(outer)[sc.USED_STEPS] == 3
    assert a(inner)[sc.USED_STEPS] == 1


def test_run_id_option_and_current_ids(cap):
    seen = {}

    @tg.agent(name="fixed", run_id="run-42")
    def fixed():
        seen["run"] = tg.current_run_id()
        seen["trace"] = tg.current_trace_id()

    @tg.agent(name="derived", run_id=lambda task, attempt: f"{task}#{attempt}")
    def derived(task, attempt=0):
        return tg.current_run_id()

    assert tg.current_run_id() is None
    assert tg.current_trace_id() is None
    fixed()
    span = cap.one("invoke_agent fixed")
    assert a(span)[sc.RUN_ID] == "run-42"
    assert seen["run"] == "run-42"
    assert seen["trace"] == format(span.context.trace_id, "032x")
    assert derived("book-flight", attempt=3) == "book-flight#3"
    assert a(cap.one("invoke_agent derived"))[sc.RUN_ID] == "book-flight#3"
    assert tg.current_run_id() is None


def test_outermost_agent_links_to_the_callers_span(cap):
    app_tracer = TracerProvider().get_tracer("app")
    with app_tracer.start_as_current_span("http request") as outer:
        support("linked")
    root = cap.one("invoke_agent support")
    assert root.parent is None
    assert root.context.trace_id != outer.get_span_context().trace_id
    assert [link.context.span_id for link in root.links] == [outer.get_span_context().span_id]


# Methods ------------------------------------------------------------------------------------


class Toolbox:
    def __init__(self, prefix):
        self.prefix = prefix

    @tg.tool
    def lookup(self, query, limit=3):
        return f"{self.prefix}:{query}:{limit}"

    @tg.tool
    @staticmethod
    def static_outer(x):
        return x + 1

    @staticmethod
    @tg.tool
    def static_inner(x):
        return x + 2

    @tg.tool(name="cls_outer")
    @classmethod
    def class_outer(cls, x):
        return (cls.__name__, x)

    @classmethod
    @tg.tool
    def class_inner(cls, x):
        return (cls.__name__, x * 2)


def test_methods_static_and_class_methods(cap):
    box = Toolbox("kb")
    assert box.lookup("refunds", limit=5) == "kb:refunds:5"
    assert Toolbox.static_outer(1) == 2
    assert box.static_inner(1) == 3
    assert Toolbox.class_outer(4) == ("Toolbox", 4)
    assert box.class_inner(4) == ("Toolbox", 8)

    lookup = a(cap.one("execute_tool lookup"))
    assert json.loads(lookup[sc.TOOL_ARGUMENTS]) == {"query": "refunds", "limit": 5}
    assert lookup[sc.TOOL_RESULT] == "kb:refunds:5"  # strings are recorded as they are
    assert json.loads(a(cap.one("execute_tool static_outer"))[sc.TOOL_ARGUMENTS]) == {"x": 1}
    assert json.loads(a(cap.one("execute_tool static_inner"))[sc.TOOL_ARGUMENTS]) == {"x": 1}
    assert json.loads(a(cap.one("execute_tool cls_outer"))[sc.TOOL_ARGUMENTS]) == {"x": 4}
    assert json.loads(a(cap.one("execute_tool class_inner"))[sc.TOOL_ARGUMENTS]) == {"x": 4}


def test_bare_decorator_over_classmethod(cap):
    class Box:
        @tg.tool
        @classmethod
        def make(cls, x):
            return (cls.__name__, x)

    assert Box.make(1) == ("Box", 1)
    assert cap.names() == ["execute_tool make"]


# Context-manager forms ----------------------------------------------------------------------


def test_context_manager_forms(cap):
    with tg.agent("concierge", input="book a table") as run:
        with tg.tool("search", arguments={"q": "sushi"}) as call:
            call.set_result(["Sushi Dai"])
            call.set_attribute("app.rank", 1)
        with tg.llm("planner", model="claude-x", messages=[{"role": "user"}]) as chat:
            chat.set_usage(input_tokens=30, output_tokens=7)
            chat.set_result({"text": "ok"})
        with tg.memory_write("prefs", record_id="u1", content={"food": "sushi"}):
            pass
        with tg.memory_read("prefs", query="u1") as read:
            read.set_result({"food": "sushi"})
        with tg.memory_delete("prefs", record_id="u1"):
            pass
        with tg.step("confirm", input={"n": 2}) as st:
            st.set_result("confirmed")
        run.set_result("booked")

    root = cap.one("invoke_agent concierge")
    assert [name for name, _ in cap.tree()[0][1]] == [
        "execute_tool search",
        "chat claude-x",
        "update_memory prefs",
        "search_memory prefs",
        "delete_memory prefs",
        "step confirm",
    ]
    assert a(root)[sc.INPUT] == "book a table"
    assert a(root)[sc.OUTPUT] == "booked"
    assert a(root)[sc.USED_TOKENS] == 37
    search = a(cap.one("execute_tool search"))
    assert json.loads(search[sc.TOOL_ARGUMENTS]) == {"q": "sushi"}
    assert json.loads(search[sc.TOOL_RESULT]) == ["Sushi Dai"]
    assert search["app.rank"] == 1
    chat = a(cap.one("chat claude-x"))
    assert (chat[sc.REQUEST_MODEL], chat[sc.INPUT_TOKENS], chat[sc.OUTPUT_TOKENS]) == (
        "claude-x",
        30,
        7,
    )
    write = a(cap.one("update_memory prefs"))
    read = a(cap.one("search_memory prefs"))
    assert write[sc.MEMORY_RECORD] == "u1"
    assert read[sc.MEMORY_RESULT_IDS] == ("u1",)
    assert read[sc.MEMORY_RESULT_HASHES] == (write[sc.MEMORY_CONTENT_HASH],)
    assert a(cap.one("delete_memory prefs"))[sc.MEMORY_RECORD] == "u1"
    assert a(cap.one("delete_memory prefs"))[sc.OPERATION] == "delete_memory"
    step = a(cap.one("step confirm"))
    assert json.loads(step[sc.INPUT]) == {"n": 2}
    assert step[sc.OUTPUT] == "confirmed"
    indexed = by_start(s for s in cap.spans if sc.STEP_INDEX in a(s))
    assert [a(s)[sc.STEP_INDEX] for s in indexed] == list(range(6))


def test_reentrant_context_manager_object_nests(cap):
    op = tg.step("retry")
    with op, op:
        pass
    outer, inner = by_start(cap.spans)
    assert inner.parent.span_id == outer.context.span_id
    assert inner.end_time <= outer.end_time


def test_shared_context_manager_object_across_threads(cap):
    op = tg.tool("shared")
    barrier = threading.Barrier(2)

    def worker(i):
        with op as call:
            barrier.wait()
            time.sleep(0.05 * (i + 1))
            call.set_result(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = sorted(a(s).get(sc.TOOL_RESULT) for s in cap.spans)
    assert results == ["0", "1"]
    for s in cap.spans:
        i = int(a(s)[sc.TOOL_RESULT])
        assert (s.end_time - s.start_time) / 1e9 >= 0.05 * (i + 1)


# Memory provenance --------------------------------------------------------------------------


def test_memory_read_links_to_the_write(cap):
    db: dict[str, object] = {}

    @tg.memory_write(store="kb", id_from="key", content_from="body")
    def put(body, key):
        db[key] = body

    @tg.memory_read(store="kb", query_from="text")
    def search(limit, text):
        return [{"id": k, "content": v} for k, v in db.items() if text in k][:limit]

    @tg.memory_read(store="kb", records=lambda result: result.items())
    def dump():
        return dict(db)

    @tg.agent(name="mem")
    def mem():
        put({"b": 1, "a": [1, 2]}, key="policy:refund")
        put("ship in 3 days", key="policy:shipping")
        put("poisoned", key="other")
        search(10, "policy")
        dump()

    mem()
    writes = {
        a(s)[sc.MEMORY_RECORD]: a(s)[sc.MEMORY_CONTENT_HASH]
        for s in cap.by_operation("update_memory")
    }
    assert len(set(writes.values())) == 3
    # a dict read back (keys in another order) hashes like the dict written
    assert writes["policy:refund"] == content_hash({"a": [1, 2], "b": 1})

    reads = [a(s) for s in cap.spans if s.name == "search_memory kb"]
    assert len(reads) == 2
    search_span = next(r for r in reads if sc.MEMORY_QUERY in r)
    # query_from picks the parameter named, not the first one
    assert search_span[sc.MEMORY_QUERY] == "policy"
    ids = search_span[sc.MEMORY_RESULT_IDS]
    hashes = search_span[sc.MEMORY_RESULT_HASHES]
    assert ids == ("policy:refund", "policy:shipping")
    assert hashes == tuple(writes[i] for i in ids)

    dump_attrs = next(r for r in reads if sc.MEMORY_QUERY not in r)
    assert (
        dict(
            zip(dump_attrs[sc.MEMORY_RESULT_IDS], dump_attrs[sc.MEMORY_RESULT_HASHES], strict=True)
        )
        == writes
    )


def test_memory_read_of_other_content_does_not_match(cap):
    remember("k", "original")
    STORE["k"] = "tampered"
    recall("k")
    write_hash = a(cap.one("update_memory notes"))[sc.MEMORY_CONTENT_HASH]
    read_hashes = a(cap.one("search_memory notes"))[sc.MEMORY_RESULT_HASHES]
    assert read_hashes == (content_hash("tampered"),)
    assert write_hash not in read_hashes


def test_memory_write_hashes_the_return_value_when_no_content_argument(cap):
    @tg.memory_write(store="docs")
    def ingest(doc_id):
        return f"content of {doc_id}"

    @tg.memory_read(store="docs")
    def fetch(doc_id):
        return [(doc_id, f"content of {doc_id}")]

    ingest("d1")
    fetch("d1")
    write = a(cap.one("update_memory docs"))
    read = a(cap.one("search_memory docs"))
    assert write[sc.MEMORY_RECORD] == "d1"
    assert write[sc.MEMORY_CONTENT_HASH] == content_hash("content of d1")
    assert read[sc.MEMORY_RESULT_HASHES] == (write[sc.MEMORY_CONTENT_HASH],)
    assert read[sc.MEMORY_RESULT_IDS] == ("d1",)


def test_memory_read_nothing_found(cap):
    recall("missing-key")
    read = a(cap.one("search_memory notes"))
    assert read[sc.MEMORY_RESULT_IDS] == ()
    assert read[sc.MEMORY_RESULT_HASHES] == ()


# Subtasks, budgets and token usage ----------------------------------------------------------


def test_subtask_budgets_used_and_exceeded(cap):
    @tg.agent(name="budgeted")
    def budgeted():
        with tg.subtask("over steps", budget_steps=2):
            for i in range(3):
                get_order(str(i))
        with tg.subtask("within", budget_steps=5, budget_tokens=100):
            get_order("x")
            call_model([])
        with tg.subtask("over tokens", budget_tokens=10):
            call_model([])
        with tg.subtask("over time", budget_seconds=0.001):
            time.sleep(0.01)
        with tg.subtask("unbounded"):
            get_order("y")

    budgeted()
    over = a(cap.one("subtask over steps"))
    assert over[sc.OPERATION] == "subtask"
    assert over[sc.SUBTASK_NAME] == "over steps"
    assert over[sc.AGENT_NAME] == "budgeted"
    assert over[sc.BUDGET_STEPS] == 2
    assert over[sc.USED_STEPS] == 3
    assert over[sc.BUDGET_EXCEEDED] is True

    within = a(cap.one("subtask within"))
    assert (within[sc.USED_STEPS], within[sc.USED_TOKENS]) == (2, 17)
    assert within[sc.BUDGET_EXCEEDED] is False

    tokens = a(cap.one("subtask over tokens"))
    assert tokens[sc.BUDGET_TOKENS] == 10
    assert tokens[sc.USED_TOKENS] == 17
    assert tokens[sc.BUDGET_EXCEEDED] is True

    slow = a(cap.one("subtask over time"))
    assert slow[sc.BUDGET_SECONDS] == 0.001
    assert slow[sc.USED_SECONDS] >= 0.01
    assert slow[sc.BUDGET_EXCEEDED] is True

    free = a(cap.one("subtask unbounded"))
    assert free[sc.USED_STEPS] == 1
    assert sc.BUDGET_EXCEEDED not in free

    root = cap.one("invoke_agent budgeted")
    assert a(root)[sc.USED_STEPS] == 7
    assert a(root)[sc.USED_TOKENS] == 34
    # a subtask does not take a step itself; its calls do, in the run's one counter
    assert sc.STEP_INDEX not in over
    tools = by_start(cap.by_operation("execute_tool"))
    for t in tools[:3]:
        assert t.parent.span_id == cap.one("subtask over steps").context.span_id


def test_nested_subtasks_charge_every_open_budget(cap):
    @tg.subtask(budget_steps=1)
    def inner():
        get_order("i")
        call_model([])

    @tg.agent(name="nest")
    def nest():
        with tg.subtask("outer", budget_steps=10):
            get_order("o")
            inner()

    nest()
    assert a(cap.one("subtask inner"))[sc.USED_STEPS] == 2
    assert a(cap.one("subtask inner"))[sc.BUDGET_EXCEEDED] is True
    assert a(cap.one("subtask outer"))[sc.USED_STEPS] == 3
    assert a(cap.one("subtask outer"))[sc.USED_TOKENS] == 17
    assert a(cap.one("subtask outer"))[sc.BUDGET_EXCEEDED] is False
    assert a(cap.one("invoke_agent nest"))[sc.USED_TOKENS] == 17


def test_token_usage_shapes_are_charged_to_the_agent(cap):
    @tg.llm(model="claude")
    def anthropic_style():
        return SimpleNamespace(usage=SimpleNamespace(input_tokens=100, output_tokens=20))

    @tg.llm(model="custom", usage=lambda r: (r["in"], r["out"]))
    def custom():
        return {"in": 3, "out": 4}

    @tg.llm(model="manual")
    def manual():
        tg.set_usage(input_tokens=1000, output_tokens=1)
        return "text without usage"

    @tg.agent(name="spender")
    def spender():
        anthropic_style()
        custom()
        manual()
        call_model([])  # OpenAI shape: 12 + 5

    spender()
    claude = a(cap.one("chat claude"))
    assert (claude[sc.INPUT_TOKENS], claude[sc.OUTPUT_TOKENS]) == (100, 20)
    assert a(cap.one("chat custom"))[sc.INPUT_TOKENS] == 3
    assert a(cap.one("chat manual"))[sc.INPUT_TOKENS] == 1000
    assert a(cap.one("chat manual"))[sc.OUTPUT_TOKENS] == 1
    assert a(cap.one("invoke_agent spender"))[sc.USED_TOKENS] == 120 + 7 + 1001 + 17


def test_llm_messages_are_captured_by_default_and_can_be_switched_off(cap):
    @tg.llm(model="m1", capture_messages=False)
    def plain(messages):
        return {"content": "answer"}

    @tg.llm(model="m2")
    def with_messages(messages):
        return {"content": "answer"}

    msgs = [{"role": "user", "content": "hi"}]
    plain(msgs)
    with_messages(msgs)
    assert sc.INPUT_MESSAGES not in a(cap.one("chat m1"))
    assert sc.OUTPUT_MESSAGES not in a(cap.one("chat m1"))
    chat = a(cap.one("chat m2"))  # the GenAI convention's message/parts shape
    assert json.loads(chat[sc.INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]}
    ]
    assert json.loads(chat[sc.OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "answer"}],
         "finish_reason": "stop"}
    ]  # fmt: skip


def test_llm_messages_global_switch():
    with tg.testing.capture(capture_messages=True) as cap:
        call_model([{"role": "user", "content": "hello"}])
    chat = a(cap.one("chat gpt-4o"))
    assert json.loads(chat[sc.INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "hello"}]}
    ]
    assert sc.OUTPUT_MESSAGES in chat
    with tg.testing.capture(capture_messages=False) as cap:
        call_model([{"role": "user", "content": "hello"}])
    chat = a(cap.one("chat gpt-4o"))
    assert sc.INPUT_MESSAGES not in chat and sc.OUTPUT_MESSAGES not in chat


def test_llm_model_argument_overrides_request_model(cap):
    @tg.llm(model="default-model")
    def complete(prompt, model="default-model"):
        return "x"

    complete("hi", model="gpt-4.1-mini")
    assert a(cap.one("chat default-model"))[sc.REQUEST_MODEL] == "gpt-4.1-mini"


# Outcomes -----------------------------------------------------------------------------------


def test_record_outcome_is_a_root_span_of_its_own_trace(cap):
    @tg.agent(name="judge", run_id="run-7")
    def judged():
        get_order("o")
        tg.record_outcome(
            tg.current_run_id(),
            success=False,
            reward=0,
            source="benchmark",
            labels={"failure": "wrong tool order", "gap": ["tool-use"]},
        )

    judged()
    tg.record_outcome("0123456789abcdef0123456789abcdef", success=True, labels=["a", "b"])

    outcomes = cap.by_operation("record_outcome")
    assert [s.name for s in outcomes] == ["tracegym.outcome", "tracegym.outcome"]
    first, second = outcomes
    root = cap.one("invoke_agent judge")
    assert first.parent is None
    assert first.context.trace_id != root.context.trace_id
    assert first.context.trace_id != second.context.trace_id
    fa = a(first)
    assert fa[sc.OUTCOME_TARGET] == "run-7"
    assert fa[sc.OUTCOME_SUCCESS] is False
    assert fa[sc.OUTCOME_REWARD] == 0.0
    assert isinstance(fa[sc.OUTCOME_REWARD], float)
    assert fa[sc.OUTCOME_SOURCE] == "benchmark"
    assert json.loads(fa[sc.OUTCOME_LABELS]) == {"failure": "wrong tool order", "gap": ["tool-use"]}
    sa = a(second)
    assert sa[sc.OUTCOME_TARGET] == "0123456789abcdef0123456789abcdef"
    assert sa[sc.OUTCOME_SUCCESS] is True
    assert sc.OUTCOME_REWARD not in sa
    assert sa[sc.OUTCOME_SOURCE] == "user"
    assert json.loads(sa[sc.OUTCOME_LABELS]) == ["a", "b"]
    # the agent span is not the outcome's parent, and the outcome took no step
    assert sc.STEP_INDEX not in fa
    assert len(cap.children(root)) == 1


def test_tool_outside_any_agent_is_a_root_without_step(cap):
    get_order("lonely")
    span = cap.one("execute_tool get_order")
    assert span.parent is None
    assert sc.STEP_INDEX not in a(span)
    assert sc.AGENT_NAME not in a(span)


def test_explicit_call_id_and_name(cap):
    @tg.tool(name="refund", call_id="call-123")
    def do_refund(order):
        return True

    assert do_refund("o") is True
    span = a(cap.one("execute_tool refund"))
    assert span[sc.TOOL_CALL_ID] == "call-123"
    assert span[sc.TOOL_NAME] == "refund"
    assert do_refund.__name__ == "do_refund"  # functools.wraps keeps the function's identity


def test_memory_delete_provider_and_current_span(cap):
    @tg.memory_delete(store="notes", id_from="key")
    def forget(reason, key):
        tg.current_span().set_attribute("app.reason", reason)

    @tg.llm(model="mistral-small", provider="mistral")
    def ask():
        return "ok"

    forget("stale", key="k9")
    ask()
    delete = a(cap.one("delete_memory notes"))
    assert delete[sc.MEMORY_RECORD] == "k9"
    assert delete[sc.MEMORY_STORE] == "notes"
    assert delete["app.reason"] == "stale"
    assert a(cap.one("chat mistral-small"))[sc.PROVIDER] == "mistral"
