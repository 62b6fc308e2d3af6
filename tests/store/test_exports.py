"""`tracegym export`: OTLP/JSON that round-trips through `import otlp-json` (ids, names,
parents, kinds, times, status, attributes, events, links, resource, scope, outcomes), the run
selection (ids, prefixes, --where with bound parameters), and OpenAI fine-tuning JSONL from
passing runs (each message shape the store holds) and from oracle demonstrations, every line
checked by the format validator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

from tracegym.cli import app
from tracegym.store.exporters import SelectionError, select_runs
from tracegym.store.exporters.chat_messages import to_openai, tool_schemas
from tracegym.store.exporters.ft_format import validate_example
from tracegym.store.exporters.openai_ft import merge_calls
from tracegym.store.exporters.otlp_json import any_value
from tracegym.store.records import outcome_record, span_record, stable_id, write_spool_file
from tracegym.store.store import Store
from tracegym.tracer import semconv as sc
from typer.testing import CliRunner

BASE_NS = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z
COLUMNS = (
    "trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status, status_message, "
    "attributes, events, links, resource, scope"
)


def cli(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    return result


class RunBuilder:
    """Spool records of one agent run: a root agent span with children, and an outcome."""

    def __init__(self, tag: str, agent: str = "shop", *, start: int = 0) -> None:
        self.tag, self.agent = tag, agent
        self.trace_id = stable_id("trace", tag)
        self.run_id = f"run-{tag}"
        self.root = stable_id("root", tag, width=16)
        self.t = BASE_NS + start * 10**9
        self.records: list[dict[str, Any]] = []
        self.n = 0

    def _span(self, name: str, attributes: dict[str, Any], **kw: Any) -> dict[str, Any]:
        self.n += 1
        start = self.t + self.n * 1_000_000
        record = span_record(
            trace_id=self.trace_id,
            span_id=stable_id("span", self.tag, self.n, width=16),
            parent_span_id=kw.pop("parent", self.root),
            name=name,
            start_ns=start,
            end_ns=start + 500_000,
            attributes={sc.AGENT_NAME: self.agent, **attributes},
            resource={"service.name": "shop-svc", "deployment.environment": "test"},
            scope="tracegym",
            **kw,
        )
        self.records.append(record)
        return record

    def llm(self, inputs: Any, outputs: Any, **attributes: Any) -> None:
        attrs = {sc.OPERATION: sc.OP_CHAT, sc.REQUEST_MODEL: "gpt-test", **attributes}
        if inputs is not None:
            attrs[sc.INPUT_MESSAGES] = inputs if isinstance(inputs, str) else json.dumps(inputs)
        if outputs is not None:
            attrs[sc.OUTPUT_MESSAGES] = outputs if isinstance(outputs, str) else json.dumps(outputs)
        self._span("chat gpt-test", attrs, kind="CLIENT")

    def tool(self, name: str, arguments: dict[str, Any], result: Any, call_id: str | None = None):
        attrs = {
            sc.OPERATION: sc.OP_TOOL,
            sc.TOOL_NAME: name,
            sc.TOOL_ARGUMENTS: json.dumps(arguments),
            sc.TOOL_RESULT: json.dumps(result),
        }
        if call_id:
            attrs[sc.TOOL_CALL_ID] = call_id
        self._span(f"execute_tool {name}", attrs)

    def finish(self, question: str, answer: str, success: bool | None) -> list[dict[str, Any]]:
        root = span_record(
            trace_id=self.trace_id,
            span_id=self.root,
            name=f"invoke_agent {self.agent}",
            start_ns=self.t,
            end_ns=self.t + (self.n + 2) * 1_000_000,
            status="OK",
            attributes={
                sc.OPERATION: sc.OP_AGENT,
                sc.AGENT_NAME: self.agent,
                sc.RUN_ID: self.run_id,
                sc.INPUT: json.dumps({"question": question}),
                sc.OUTPUT: json.dumps(answer),
            },
            resource={"service.name": "shop-svc", "deployment.environment": "test"},
            scope="tracegym",
        )
        out = [root, *self.records]
        if success is not None:
            out.append(
                outcome_record(
                    self.run_id,
                    time_ns=self.t + 10**9,
                    success=success,
                    reward=1.0 if success else 0.0,
                    source="verifier",
                    labels={"why": "test"},
                )
            )
        return out


def rich_store(home: Path) -> list[RunBuilder]:
    """Three runs with every kind of span content the store keeps."""
    a = RunBuilder("a", start=0)
    a.llm([{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "hello"}])
    a.tool("lookup", {"id": 7, "deep": {"x": [1, 2.5, True, None, "s"]}}, {"ok": True}, "c-1")
    error = a._span(
        "execute_tool flaky",
        {sc.OPERATION: sc.OP_TOOL, sc.TOOL_NAME: "flaky", sc.ERROR_TYPE: "TimeoutError"},
        status="ERROR",
        status_message="timed out after 3 s",
        events=[
            {
                "name": "exception",
                "time_ns": BASE_NS + 5,
                "attributes": {"exception.type": "TimeoutError", "exception.escaped": False},
            },
            {"name": "retry", "time_ns": BASE_NS + 6, "attributes": {"attempt": 2, "ratio": 0.5}},
        ],
        links=[
            {
                "trace_id": stable_id("other"),
                "span_id": stable_id("o", width=16),
                "attributes": {"why": "follows"},
            }
        ],
    )
    assert error["status"] == "ERROR"
    a._span("step", {sc.OPERATION: "step", "app.empty": None, "app.list": ["x", "y"]})
    b = RunBuilder("b", agent="billing", start=10)
    b.tool("refund", {"order": "#1"}, "done")
    c = RunBuilder("c", start=20)
    c.llm("plain text prompt", "plain text reply")
    write_spool_file(home, a.finish("q-a", "answer a", True), "run-a")
    write_spool_file(home, b.finish("q-b", "answer b", False), "run-b")
    write_spool_file(home, c.finish("q-c", "answer c", None), "run-c")
    return [a, b, c]


def spans_of(home: Path) -> dict[str, dict[str, Any]]:
    """Every span and outcome record in the store, by span id, JSON columns decoded."""
    with Store(home) as store:
        rows = list(store.rows(f"SELECT {COLUMNS} FROM spans"))
        rows += list(store.rows(f"SELECT {COLUMNS} FROM _outcome_spans"))
    out = {}
    for row in rows:
        for column in ("attributes", "events", "links", "resource"):
            row[column] = json.loads(row[column]) if row[column] is not None else None
        out[row["span_id"]] = row
    return out


# OTLP/JSON -----------------------------------------------------------------------------------
def test_otlp_json_round_trips_through_import(tmp_path: Path):
    home, fresh = tmp_path / "home", tmp_path / "fresh"
    rich_store(home)
    out = tmp_path / "runs.jsonl"
    result = cli("export", "otlp-json", "--home", str(home), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "exported 3 runs (9 spans, 2 outcomes)" in result.output
    assert len(out.read_text().splitlines()) == 3  # one request per run
    result = cli("import", "otlp-json", str(out), "--home", str(fresh))
    assert result.exit_code == 0, result.output
    before, after = spans_of(home), spans_of(fresh)
    assert len(before) == 11 and before.keys() == after.keys()
    for span_id, row in before.items():
        assert after[span_id] == row, row["name"]
    with Store(home) as one, Store(fresh) as two:
        query = "SELECT trace_id, run_id, success, reward, outcome_labels FROM traces ORDER BY 1"
        assert one.sql(query).fetchall() == two.sql(query).fetchall()
        assert {r[2] for r in one.sql(query).fetchall()} == {True, False, None}


def test_otlp_json_is_the_otlp_encoding(tmp_path: Path):
    json_format = pytest.importorskip("google.protobuf.json_format")
    trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
    rich_store(tmp_path)
    result = cli("export", "otlp-json", "--home", str(tmp_path), "run-a")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1
    request = json.loads(lines[0])
    # Field names and value types are the proto's (unknown fields would be refused).
    json_format.ParseDict(request, trace_service.ExportTraceServiceRequest())
    (resource,) = [r for r in request["resourceSpans"] if r["resource"]["attributes"]]
    spans = [s for scope in resource["scopeSpans"] for s in scope["spans"]]
    for span in spans:
        assert len(span["traceId"]) == 32 and int(span["traceId"], 16)  # hex, not base64
        assert len(span["spanId"]) == 16 and int(span["spanId"], 16)
        assert isinstance(span["startTimeUnixNano"], str) and span["startTimeUnixNano"].isdigit()
        assert isinstance(span["kind"], int)
    flaky = next(s for s in spans if s["name"] == "execute_tool flaky")
    assert flaky["status"] == {"code": 2, "message": "timed out after 3 s"}
    assert flaky["events"][1]["attributes"] == [
        {"key": "attempt", "value": {"intValue": "2"}},
        {"key": "ratio", "value": {"doubleValue": 0.5}},
    ]
    assert flaky["links"][0]["traceId"] == stable_id("other")
    chat = next(s for s in spans if s["name"] == "chat gpt-test")
    assert chat["kind"] == 3  # CLIENT
    outcome = [s for r in request["resourceSpans"] for sc_ in r["scopeSpans"] for s in sc_["spans"]]
    assert any(s["name"] == sc.OUTCOME_SPAN_NAME for s in outcome)


def test_any_value_types():
    assert any_value(None) == {}
    assert any_value(True) == {"boolValue": True}
    assert any_value(3) == {"intValue": "3"}
    assert any_value(2**70) == {"stringValue": str(2**70)}  # OTLP has no integer that big
    assert any_value(1.5) == {"doubleValue": 1.5}
    assert any_value({"a": [1]}) == {
        "kvlistValue": {
            "values": [{"key": "a", "value": {"arrayValue": {"values": [{"intValue": "1"}]}}}]
        }
    }


def test_selection_by_ids_prefix_and_where(tmp_path: Path):
    a, b, c = rich_store(tmp_path)
    with Store(tmp_path) as store:
        assert [r.trace_id for r in select_runs(store)] == [a.trace_id, b.trace_id, c.trace_id]
        assert [r.run_id for r in select_runs(store, ["run-b"])] == ["run-b"]
        assert [r.trace_id for r in select_runs(store, [c.trace_id[:10].upper()])] == [c.trace_id]
        where = select_runs(store, where="agent = $agent", params={"agent": "shop"})
        assert [r.run_id for r in where] == ["run-a", "run-c"]
        both = select_runs(store, ["run-a", "run-b"], where="success = $ok", params={"ok": False})
        assert [r.run_id for r in both] == ["run-b"]
        # A value is only ever a bound parameter: quotes in it are data, not SQL.
        assert select_runs(store, where="agent = $a", params={"a": "x' OR '1'='1"}) == []
        with pytest.raises(SelectionError, match="no run"):
            select_runs(store, ["run-zzz"])
        with pytest.raises(SelectionError, match=r"refused 3 statements"):
            select_runs(store, where="true); DROP TABLE x; (SELECT 1")
        with pytest.raises(SelectionError, match="--where"):
            select_runs(store, where="no_such_column = 1")


def test_export_cli_where_params_and_errors(tmp_path: Path):
    rich_store(tmp_path)
    home = ["--home", str(tmp_path)]
    result = cli("export", "otlp-json", *home, "--where", "agent = $a", "-p", "a=billing")
    assert result.exit_code == 0, result.output
    assert "exported 1 run (2 spans, 1 outcome)" in result.output
    result = cli("export", "otlp-json", *home, "--where", "spans > $n", "-p", "n=3")
    assert "exported 1 run (" in result.output  # `3` is bound as a number
    result = cli("export", "otlp-json", *home, "nope")
    assert result.exit_code == 2 and "no run" in result.output
    result = cli("export", "otlp-json", *home, "-p", "a=1")
    assert result.exit_code == 2 and "--where" in result.output
    result = cli("export", "otlp-json", *home, "--no-outcomes", "-o", str(tmp_path / "x.jsonl"))
    assert "3 runs (9 spans, 0 outcomes)" in result.output


def test_otlp_round_trip_of_a_traced_demo(tmp_path: Path):
    """Spans the tracer itself wrote (the scripted demo agent) come back the same."""
    home, fresh = tmp_path / "home", tmp_path / "fresh"
    result = cli("demo", "--scripted", "--quick", "--home", str(home))
    assert result.exit_code == 0, result.output
    out = tmp_path / "demo.jsonl"
    assert cli("export", "otlp-json", "--home", str(home), "-o", str(out)).exit_code == 0
    assert cli("import", "otlp-json", str(out), "--home", str(fresh)).exit_code == 0
    before, after = spans_of(home), spans_of(fresh)
    assert len(before) > 100 and before == after


# OpenAI fine-tuning ----------------------------------------------------------------------------
GOOD = {
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "refund #1"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "refund", "arguments": '{"order": "#1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "assistant", "content": "Refunded."},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "refund",
                "parameters": {"type": "object", "properties": {"order": {"type": "string"}}},
            },
        }
    ],
}


def _broken(change: Any) -> dict[str, Any]:
    line = json.loads(json.dumps(GOOD))
    change(line)
    return line


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda x: x["messages"].pop(), "last message is not the assistant"),
        (lambda x: x["messages"].pop(3), "before the results of tool calls"),
        (lambda x: x.update(messages=x["messages"][:3]), "have no tool result"),
        (lambda x: x["messages"][3].update(tool_call_id="zz"), "answers no pending tool call"),
        (
            lambda x: x["messages"][2]["tool_calls"][0]["function"].update(arguments="{bad"),
            "do not parse as JSON",
        ),
        (
            lambda x: x["messages"][2]["tool_calls"][0]["function"].update(arguments={"a": 1}),
            "not a JSON string",
        ),
        (lambda x: x["messages"][2]["tool_calls"][0].update(type="code"), "type is not"),
        (lambda x: x["messages"][1].update(role="function"), "role"),
        (lambda x: x["messages"][1].update(content=None), "has no content"),
        (lambda x: x["messages"][1].update(extra=1), "unknown keys"),
        (lambda x: x["tools"][0].update(type="web_search"), "not a function tool"),
        (lambda x: x["tools"][0]["function"].update(name="other"), "not in tools"),
        (lambda x: x.update(parallel_tool_calls="yes"), "parallel_tool_calls"),
        (lambda x: x.update(metadata={}), "unknown key"),
        (lambda x: x.update(messages=[]), "non-empty list"),
    ],
)
def test_validator_refuses_what_fine_tuning_refuses(change: Any, reason: str):
    assert validate_example(GOOD) == []
    problems = validate_example(_broken(change))
    assert problems and any(reason in p for p in problems), problems


def test_message_shapes_become_openai_messages():
    genai = [
        {"role": "system", "parts": [{"type": "text", "content": "sys"}]},
        {"role": "user", "parts": [{"type": "text", "content": "q"}]},
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "thinking"},
                {"type": "tool_call", "id": "t1", "name": "f", "arguments": {"x": 1}},
            ],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "t1", "response": [1]}]},
    ]
    assert to_openai(genai) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "[1]"},
    ]
    response = {"choices": [{"message": {"role": "assistant", "content": "hi"}}], "usage": {}}
    assert to_openai(json.dumps(response), "assistant") == [{"role": "assistant", "content": "hi"}]
    anthropic = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "let me look"},
            {"type": "tool_use", "id": "tu", "name": "g", "input": {}},
        ],
    }
    (message,) = to_openai(anthropic)
    assert message["content"] == "let me look" and message["tool_calls"][0]["id"] == "tu"
    assert to_openai("just text", "assistant") == [{"role": "assistant", "content": "just text"}]
    flat = {
        "role": "assistant",
        "tool_calls.0.tool_call.function.name": "h",
        "tool_calls.0.tool_call.id": "x",
        "tool_calls.0.tool_call.function.arguments": "{}",
    }
    assert to_openai([flat])[0]["tool_calls"][0]["function"]["name"] == "h"
    assert tool_schemas(
        [
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
            {"name": "g", "input_schema": {"type": "object"}},
            {"type": "web_search"},
        ]
    ) == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}},
    ]


def test_merge_full_history_and_delta_calls():
    sys_, q = {"role": "system", "content": "s"}, {"role": "user", "content": "q"}
    a1, t1 = {"role": "assistant", "content": "a1"}, {"role": "user", "content": "more"}
    a2 = {"role": "assistant", "content": "a2"}
    full = merge_calls([([sys_, q], [a1]), ([sys_, q, a1, t1], [a2])])
    delta = merge_calls([([sys_, q], [a1]), ([t1], [a2])])
    assert full == delta == [sys_, q, a1, t1, a2]


def ft_store(home: Path) -> dict[str, RunBuilder]:
    """Passing runs in each recorded shape, and a failing one that must not be exported."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"id": 7}'},
    }
    old = RunBuilder("old")  # OpenAI messages, the whole history resent each call
    history = [{"role": "system", "content": "You help."}, {"role": "user", "content": "find 7"}]
    first = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    old.llm(history, first)
    old.tool("lookup", {"id": 7}, {"name": "seven"}, "call_1")
    history2 = [
        *history,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"name": "seven"}'},
    ]
    old.llm(history2, {"choices": [{"message": {"role": "assistant", "content": "It is seven."}}]})
    genai = RunBuilder("genai", start=5)  # GenAI parts, only what is new each call
    genai.llm(
        [{"role": "user", "parts": [{"type": "text", "content": "refund #1"}]}],
        [
            {
                "role": "assistant",
                "parts": [
                    {"type": "tool_call", "id": "r1", "name": "refund", "arguments": {"o": "#1"}},
                    {"type": "tool_call", "id": "r2", "name": "notify", "arguments": {}},
                ],
            }
        ],
        **{
            sc.SYSTEM_INSTRUCTIONS: json.dumps([{"type": "text", "content": "Refund politely."}]),
            sc.TOOL_DEFINITIONS: json.dumps(
                [
                    {"type": "function", "name": "refund", "parameters": {"type": "object"}},
                    {"type": "function", "name": "notify", "description": "tell the user"},
                ]
            ),
        },
    )
    genai.llm(
        [
            {
                "role": "tool",
                "parts": [{"type": "tool_call_response", "id": "r1", "response": "ok"}],
            },
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "r2", "response": 1}]},
        ],
        [{"role": "assistant", "parts": [{"type": "text", "content": "Done."}]}],
    )
    bare = RunBuilder("bare", start=10)  # message capture off: tool calls only
    bare.llm(None, None)
    bare.tool("lookup", {"id": 9}, {"name": "nine"})
    bare.tool("reply", {"text": "nine"}, None, "cid-2")
    failed = RunBuilder("failed", start=15)
    failed.llm([{"role": "user", "content": "x"}], [{"role": "assistant", "content": "y"}])
    cut = RunBuilder("cut", start=20)  # passes, but its messages end on an unanswered call
    cut.llm([{"role": "user", "content": "go"}], {"role": "assistant", "tool_calls": [call]})
    write_spool_file(home, old.finish("find 7", "It is seven.", True), "old")
    write_spool_file(home, genai.finish("refund #1", "Done.", True), "genai")
    write_spool_file(home, bare.finish("what is 9?", "nine", True), "bare")
    write_spool_file(home, failed.finish("x", "y", False), "failed")
    write_spool_file(home, cut.finish("go", "", True), "cut")
    return {"old": old, "genai": genai, "bare": bare, "failed": failed, "cut": cut}


def test_openai_ft_from_passing_runs(tmp_path: Path):
    ft_store(tmp_path)
    out = tmp_path / "ft.jsonl"
    result = cli("export", "openai-ft", "--home", str(tmp_path), "--from", "runs", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "wrote 3 examples (3 from runs, 0 from demonstrations)" in result.output
    assert "skipped 1" in result.output and "no tool result" in result.output  # the cut run
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(validate_example(line) == [] for line in lines)
    old, genai, bare = lines  # oldest first
    assert [m["role"] for m in old["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert old["messages"][-1]["content"] == "It is seven."
    assert old["tools"][0]["function"]["name"] == "lookup"  # inferred from the calls
    assert old["tools"][0]["function"]["parameters"]["properties"] == {"id": {"type": "integer"}}
    assert genai["messages"][0] == {"role": "system", "content": "Refund politely."}
    assert [c["id"] for c in genai["messages"][2]["tool_calls"]] == ["r1", "r2"]
    assert genai["parallel_tool_calls"] is True
    assert [t["function"]["name"] for t in genai["tools"]] == ["refund", "notify"]  # recorded
    assert bare["messages"][0] == {"role": "user", "content": "what is 9?"}
    calls = [m["tool_calls"][0] for m in bare["messages"] if m.get("tool_calls")]
    assert [c["function"]["name"] for c in calls] == ["lookup", "reply"]
    assert calls[1]["id"] == "cid-2" and json.loads(calls[0]["function"]["arguments"]) == {"id": 9}
    assert bare["messages"][-1] == {"role": "assistant", "content": "nine"}
    assert not any(m.get("content") == "x" for line in lines for m in line["messages"])


def test_openai_ft_from_oracle_demonstrations(tmp_path: Path):
    from tracegym.synthesis import registry
    from tracegym.synthesis.registry import demonstration
    from tracegym.training.toy import press_env

    env = press_env()
    registry.register(tmp_path, env, n_train=6, n_heldout=4, validity_seeds=10)
    out = tmp_path / "demos.jsonl"
    result = cli("export", "openai-ft", "--home", str(tmp_path), "--from", "demos", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "wrote 6 examples (0 from runs, 6 from demonstrations)" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    start = env.spec.train_seeds[0]
    for seed, line in zip(range(start, start + 6), lines, strict=True):
        assert validate_example(line) == []
        demo = demonstration(env, seed)
        assert line["messages"][1]["content"] == demo["messages"][1]["content"]
        assert line["tools"] == env.tool_schemas()
    held_out = {env.make_task(s).instruction for s in range(*env.spec.heldout_seeds)}
    assert not held_out & {line["messages"][1]["content"] for line in lines}
    result = cli("export", "openai-ft", "--home", str(tmp_path), "--env", "nope")
    assert result.exit_code == 2 and "no environment 'nope'" in result.output
    result = cli(
        "export", "openai-ft", "--home", str(tmp_path), "--from", "demos", "--per-env", "2"
    )
    assert "wrote 2 examples" in result.output


def test_openai_ft_demos_and_runs_together(tmp_path: Path):
    from tracegym.synthesis import registry
    from tracegym.training.toy import press_env

    ft_store(tmp_path)
    registry.register(tmp_path, press_env(), n_train=3, n_heldout=2, validity_seeds=10)
    result = cli("export", "openai-ft", "--home", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "wrote 6 examples (3 from runs, 3 from demonstrations)" in result.output
    lines = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 6 and all(validate_example(line) == [] for line in lines)


@pytest.fixture
def traced_agent_home(tmp_path: Path):
    """A tool-calling agent traced in process (OpenAI-shaped calls and responses, message
    capture on), one run passing and one failing."""
    import tracegym as tg
    from opentelemetry.sdk.trace import TracerProvider
    from tracegym.tracer.operations import state

    saved = state.tracer, state.settings
    provider = TracerProvider()
    tg.init(home=tmp_path, provider=provider, capture_messages=True, flush_interval_s=0.05)
    schema = {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "Look an order up.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }

    @tg.tool
    def get_order(order_id: str) -> dict:
        return {"order_id": order_id, "status": "shipped"}

    @tg.llm(model="gpt-test", tool_definitions=[schema])
    def chat(messages: list) -> dict:
        if messages[-1]["role"] == "tool":
            message = {"role": "assistant", "content": "It has shipped."}
        else:
            arguments = '{"order_id": "W1"}'
            call = {"id": f"call_{len(messages)}", "type": "function",
                    "function": {"name": "get_order", "arguments": arguments}}  # fmt: skip
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"choices": [{"message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 4}}  # fmt: skip

    @tg.agent(name="support", run_id=lambda task: task)
    def run(task: str) -> str:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task}]
        while True:
            message = chat(messages)["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return message["content"]
            for call in message["tool_calls"]:
                result = get_order(**json.loads(call["function"]["arguments"]))
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
                )

    run("where is W1?")
    run("where is W2?")
    tg.record_outcome("where is W1?", success=True, source="verifier")
    tg.record_outcome("where is W2?", success=False, source="verifier")
    tg.shutdown()
    provider.shutdown()
    yield tmp_path
    state.tracer, state.settings = saved


def test_openai_ft_of_a_run_the_tracer_recorded(traced_agent_home: Path):
    result = cli("export", "openai-ft", "--home", str(traced_agent_home), "--from", "runs")
    assert result.exit_code == 0, result.output
    (line,) = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    assert validate_example(line) == []
    messages = line["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[1]["content"] == "where is W1?"
    (call,) = messages[2]["tool_calls"]
    assert call["function"]["name"] == "get_order"
    assert json.loads(call["function"]["arguments"]) == {"order_id": "W1"}
    assert messages[3]["tool_call_id"] == call["id"]
    assert json.loads(messages[3]["content"]) == {"order_id": "W1", "status": "shipped"}
    assert messages[4] == {"role": "assistant", "content": "It has shipped."}
    assert line["tools"][0]["function"]["description"] == "Look an order up."  # as recorded


def test_otlp_round_trip_of_a_traced_agent(traced_agent_home: Path, tmp_path: Path):
    out, fresh = tmp_path / "out.jsonl", tmp_path / "fresh"
    assert (
        cli("export", "otlp-json", "--home", str(traced_agent_home), "-o", str(out)).exit_code == 0
    )
    assert cli("import", "otlp-json", str(out), "--home", str(fresh)).exit_code == 0
    before, after = spans_of(traced_agent_home), spans_of(fresh)
    assert len(before) == 10 and before == after  # 2 x (agent, 2 chats, a tool) + 2 outcomes
