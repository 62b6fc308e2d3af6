"""The shop agent written with the openai client against `tracegym serve`'s app on loopback.

An oracle upstream (a scripted OpenAI-compatible fake answering with `oracle_actions` and
`oracle_answer`) behind the real app and router: the agent passes, and the store holds each run
with its LLM spans (input messages, tool definitions), its tools, its memory and its outcome. A
failing model call ends its episode as failed, never the batch. The same loop through the local
backend: the ChatML template renders the whole conversation (scripted replies), and a random tiny
model's replies end in a failed episode, not an exception.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="needs tracegym[openai]")
pytest.importorskip("openinference.instrumentation.openai", reason="needs tracegym[openai]")
pytest.importorskip("uvicorn", reason="needs tracegym[serve]")
pytest.importorskip("duckdb", reason="the store needs tracegym[analysis]")

import tracegym as tg  # noqa: E402
from tracegym.examples.domains import SHOP  # noqa: E402
from tracegym.examples.lm_agent import CustomerNotes  # noqa: E402
from tracegym.examples.openai_agent import OpenAIAgent  # noqa: E402
from tracegym.examples.shop import (  # noqa: E402
    RULES,
    TOOL_NAMES,
    TOOL_SCHEMAS,
    ShopTask,
    make_task,
    oracle_actions,
    oracle_answer,
)
from tracegym.serving import ConversationRouter, UpstreamBackend, create_app  # noqa: E402
from tracegym.serving.server import running  # noqa: E402
from tracegym.store.store import Store  # noqa: E402
from tracegym.tracer import integrations  # noqa: E402
from tracegym.tracer import semconv as sc  # noqa: E402

from tests.serving.fakes import FakeUpstream, completion  # noqa: E402

pytestmark = pytest.mark.timeout(120)
BASE = "org/base-model"
SEEDS = (0, 3, 17, 36)  # an address change, a status, a refund and a cancellation done


# Replies that are not chat completions, by the adapter that sends them.
GARBLED: dict[str, dict[str, Any]] = {
    "no-choices": {"id": "x", "object": "chat.completion", "choices": []},
    "no-function": {"choices": [{"index": 0, "message": {"role": "assistant",
                                 "tool_calls": [{"id": "c", "function": None}]}}]},
}  # fmt: skip


def oracle(tasks: list[ShopTask]) -> Any:
    """The reply an oracle model gives: the next of the task's oracle calls (counted by the
    tool results so far), then its answer. The task is found by its request."""
    by_request = {task.request: task for task in tasks}

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        if body["model"] in GARBLED:
            return GARBLED[body["model"]]
        messages = body["messages"]
        user = next(m["content"] for m in messages if m["role"] == "user")
        task = next(t for r, t in by_request.items() if user.startswith(r))
        done = sum(m["role"] == "tool" for m in messages)
        actions = oracle_actions(task)
        if done == len(actions):
            return completion(body["model"], oracle_answer(task))
        name, arguments = actions[done]
        call = {"id": f"call_{done}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
        return completion(body["model"], None, [call])

    return reply


class Choose:
    """A router that sends each conversation to the first adapter whose text it contains."""

    def __init__(self, rules: dict[str, str], default: str) -> None:
        self.rules, self.default = rules, default

    def choose(self, text: str) -> str | None:
        return next((a for needle, a in self.rules.items() if needle in text), self.default)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """`serve(tasks, rules)`: the app over the oracle upstream, routing by `rules` (default:
    the adapter "oracle"; "broken" is one the upstream answers 404 to, GARBLED's answer what is
    not a chat completion); returns its /v1 URL."""
    import contextlib

    stack = contextlib.ExitStack()
    upstream = FakeUpstream()

    def start(tasks: list[ShopTask], rules: dict[str, str] | None = None) -> str:
        upstream.reply = oracle(tasks)
        upstream_url = stack.enter_context(running(upstream.app()))
        adapters = ["oracle", "broken", *GARBLED]
        router = ConversationRouter(Choose(rules or {}, "oracle"), adapters, BASE)
        app = create_app(UpstreamBackend(f"{upstream_url}/v1"), router)
        return f"{stack.enter_context(running(app))}/v1"

    with stack, integrations.instrumenting("openai"):
        yield start


def query(home: Path, sql: str) -> list[tuple[Any, ...]]:
    assert tg.flush(10)
    with Store(home) as store:
        return store.sql(sql).fetchall()


def test_the_oracle_passes_and_the_store_holds_the_runs(serve, tmp_path, tracer_setup):
    home = tmp_path / "home"
    tracer_setup(home=home, capture_messages=True)
    tasks = [make_task(seed) for seed in SEEDS]
    assert {t.kind for t in tasks} == {"status", "cancel", "refund", "address"}
    url = serve(tasks)
    notes = CustomerNotes()
    agent = OpenAIAgent(url, split="dev", notes=notes, max_retries=0)
    results = agent.run_many(tasks, concurrency=3)

    assert [r.task_id for r in results] == [t.task_id for t in tasks]  # the tasks' order
    for task, result in zip(tasks, results, strict=True):
        assert result.passed and result.reward == 1.0 and result.reasons == [], result
        assert result.answer == oracle_answer(task)
        assert result.adapter == "oracle"  # the x-tracegym-adapter header: routed there
        assert result.generated_tokens == 2 * (len(oracle_actions(task)) + 1)  # fake usage
        messages = result.messages
        assert messages[0] == {"role": "system", "content": RULES}
        assert messages[1] == {"role": "user", "content": task.request}
        calls = [m["tool_calls"][0] for m in messages if m.get("tool_calls")]
        tool_ids = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert [c["function"]["name"] for c in calls] == [n for n, _ in oracle_actions(task)]
        assert tool_ids == [c["id"] for c in calls]  # each result answers its call
        assert messages[-1] == {"role": "assistant", "content": oracle_answer(task)}
    assert set(notes.notes) == {t.email for t in tasks}  # one note per customer

    by_run = {r.run_id: r for r in results}
    runs = query(
        home,
        "SELECT run_id, agent, llm_calls, tool_calls, memory_ops, success, reward, "
        "outcome_labels FROM traces",
    )
    assert {row[0] for row in runs} == set(by_run)  # one trace per episode
    for run_id, agent_name, llm_calls, tool_calls, memory_ops, success, reward, labels in runs:
        result = by_run[run_id]
        assert agent_name == SHOP.agent_name
        assert (llm_calls, tool_calls, memory_ops) == (len(result.calls) + 1, len(result.calls), 2)
        assert (success, reward) == (True, 1.0)
        assert json.loads(labels) == {"task_id": result.task_id, "split": "dev",
                                      "adapter": "oracle"}  # fmt: skip

    # The LLM spans: the openai instrumentor's, with the messages sent and the tools offered.
    chats = query(
        home,
        """SELECT t.run_id, l.model, l.input_messages, s.attributes
            FROM llm_calls l JOIN traces t USING (trace_id) JOIN spans s USING (span_id)
            ORDER BY l.start_time""",
    )
    assert len(chats) == sum(len(r.calls) + 1 for r in results)
    for _run_id, model, input_messages, attributes in chats:
        assert model == "oracle"  # the response's model: the adapter that answered
        sent = json.loads(input_messages)
        assert sent[0]["role"] == "system" and RULES in json.dumps(sent[0])
        offered = json.loads(json.loads(attributes)[sc.TOOL_DEFINITIONS])
        assert [t["function"]["name"] for t in offered] == list(TOOL_NAMES)
    tools = query(
        home,
        "SELECT t.run_id, c.tool, c.arguments, c.status FROM tool_calls c "
        "JOIN traces t USING (trace_id) ORDER BY c.start_time",
    )
    for run_id, result in by_run.items():
        ran = [(tool, json.loads(args)) for r, tool, args, _ in tools if r == run_id]
        task = next(t for t in tasks if t.task_id == result.task_id)
        assert ran == oracle_actions(task)  # the calls the model asked for, as it asked
    assert {status for *_, status in tools} == {"UNSET"}  # none failed


def test_a_failing_model_call_fails_its_episode_not_the_batch(serve, tmp_path, tracer_setup):
    home = tmp_path / "home"
    tracer_setup(home=home)
    tasks = [make_task(seed) for seed in SEEDS]
    failing = {  # conversations routed to adapters that answer 404, or what cannot be read
        tasks[1].request: "broken",
        tasks[2].request: "no-choices",
        tasks[3].request: "no-function",
    }
    url = serve(tasks, failing)
    results = OpenAIAgent(url, max_retries=0).run_many(tasks, concurrency=4)

    assert [r.passed for r in results] == [True, False, False, False]
    reasons = [r.reasons[0] for r in results[1:]]
    assert reasons[0].startswith("the model call failed: NotFoundError")
    assert reasons[1].startswith("the model call failed: an unreadable reply: IndexError")
    assert reasons[2].startswith("the model call failed: an unreadable reply: AttributeError")
    for failed in results[1:]:
        assert failed.answer == "" and failed.calls == [] and failed.generated_tokens == 0
        assert failed.messages[-1]["role"] == "user"  # nothing came back
    outcomes = dict(query(home, "SELECT run_id, success FROM traces"))
    assert outcomes == {r.run_id: r.passed for r in results}


def test_no_server_at_all_gives_failed_episodes(tmp_path, tracer_setup):
    import socket

    with socket.socket() as free:  # a port nothing listens on once the socket closes
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    tracer_setup(home=tmp_path / "home")
    agent = OpenAIAgent(f"http://127.0.0.1:{port}/v1", max_retries=0, instrument=False)
    results = agent.run_many([make_task(seed) for seed in SEEDS[:2]], concurrency=2)
    assert [r.passed for r in results] == [False, False]
    for result in results:
        assert result.reasons[0].startswith("the model call failed: APIConnectionError")
    assert all(r.adapter is None and r.run_id for r in results)


def test_the_command_line_runs_demo_tasks_and_records_them(serve, run_python, tmp_path):
    """`python -m tracegym.examples.openai_agent`: its pass rate, and its runs in the home."""
    from tracegym.examples.shop import DEMO_SEEDS

    tasks = [make_task(DEMO_SEEDS[0] + i) for i in range(4)]
    url = serve(tasks)
    home = tmp_path / "cli-home"
    done = run_python(
        f"""
        from tracegym.examples.openai_agent import main
        main(["--base-url", "{url}", "--tasks", "4", "--concurrency", "2"])
        """,
        env={"TRACEGYM_HOME": str(home)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("4/4 passed;"), done.stdout
    assert query(home, "SELECT count(*), bool_and(success) FROM traces") == [(4, True)]


# ---------------------------------------------------------------------------------------------
# The local backend: the server renders the conversation through the model's chat template


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tracegym.generation.model import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="module")
def tiny(tokenizer: Any) -> Any:
    pytest.importorskip("torch")
    from tracegym.generation.model import tiny_model

    return tiny_model(0, tokenizer=tokenizer)


def local_app(policy: Any) -> Any:
    """`tracegym serve`'s app over the tiny model in ChatML with tools, no adapters."""
    from tracegym.generation.chat_format import ChatFormat, template_text
    from tracegym.serving import LocalBackend

    fmt = ChatFormat(policy.tokenizer, template_text("chatml"))
    return create_app(
        LocalBackend(policy.model, fmt), ConversationRouter(None, [], base_model=policy.name)
    )


def test_the_chat_template_carries_the_whole_conversation(serve, tokenizer, tracer_setup, tmp_path):
    """The messages the agent sends (assistant tool calls with JSON-string arguments, tool results
    with their ids) render through the ChatML tool template as `tracegym serve`'s local backend
    renders them, and the oracle's calls written in that format parse back to the same calls."""
    from tracegym.generation.chat_format import ChatFormat, template_text

    tracer_setup(home=tmp_path / "home")
    fmt = ChatFormat(tokenizer, template_text("chatml"))
    task = make_task(SEEDS[2])  # a refund: three calls
    (result,) = OpenAIAgent(serve([task]), max_retries=0).run_many([task])
    assert result.passed
    system, turns = fmt.render(result.messages, tools=TOOL_SCHEMAS).split("<|im_end|>", 1)
    assert RULES in system and '"name": "refund_order"' in system  # the rules, the tools
    assert turns.count("<tool_call>") == turns.count("<tool_response>") == 3
    for message in result.messages[2:]:
        if message["role"] == "tool":
            assert message["content"] in turns  # each result, as the tool returned it
    for name, arguments in oracle_actions(task):
        written = json.dumps({"name": name, "arguments": arguments})
        (call,) = fmt.parse_reply(f"<tool_call>\n{written}\n</tool_call><|im_end|>").tool_calls
        assert (call.name, call.arguments) == (name, arguments)
        assert written in turns  # the call as the model would have written it


@pytest.mark.slow  # builds and runs a (tiny) model
def test_a_random_tiny_model_gives_failed_episodes_in_the_store(tiny, tmp_path, tracer_setup):
    """Whatever a random model writes (text, half a call), each episode ends, is failed, and its
    model calls, tokens and outcome are in the store."""
    home = tmp_path / "home"
    tracer_setup(home=home)
    tasks = [make_task(seed) for seed in SEEDS[:3]]
    with integrations.instrumenting("openai"), running(local_app(tiny)) as url:
        agent = OpenAIAgent(f"{url}/v1", max_turns=2, max_tokens=6, max_retries=0)
        results = agent.run_many(tasks, concurrency=3)
    for result in results:
        assert not result.passed and result.reasons and result.adapter is None
        replies = [m for m in result.messages if m["role"] == "assistant"]
        assert 1 <= len(replies) <= 2 and 1 <= result.generated_tokens <= 12
    rows = query(
        home,
        "SELECT t.run_id, count(*), sum(l.output_tokens), any_value(t.success), any_value(l.model)"
        " FROM llm_calls l JOIN traces t USING (trace_id) GROUP BY t.run_id",
    )
    assert {row[0]: row[1:] for row in rows} == {
        r.run_id: (
            sum(m["role"] == "assistant" for m in r.messages),
            r.generated_tokens,
            False,
            tiny.name,
        )
        for r in results
    }
