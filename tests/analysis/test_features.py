"""Per-run features: every column on hand-built runs, the shared step helpers, speed."""

from __future__ import annotations

import json
import time
from typing import Any

import polars as pl
from tracegym.analysis.features import (
    SCHEMA,
    action_label,
    canonical_arguments,
    final_action_step,
    quantile,
    run_features,
    subtask_kind,
)
from tracegym.analysis.runs import ROLE, Run, Step
from tracegym.tracer import semconv as sc


def _step(trace: str, position: int, operation: str | None, **fields: Any) -> Step:
    return Step(
        position=position, trace_id=trace, span_id=f"{trace}.{position}",
        parent_span_id=None if position == 0 else f"{trace}.0", name=fields.pop("name", "s"),
        operation=operation, agent="bot", step_index=position - 1 if position else None,
        tool=fields.get("tool"), call_id=None, input=fields.get("input"),
        output=fields.get("output"), status="ERROR" if fields.get("error") else "UNSET",
        error_type=fields.get("error"), start_ns=position, end_ns=position, duration_ms=0.0,
        input_tokens=fields.get("input_tokens"), output_tokens=fields.get("output_tokens"),
        memory_store=None, memory_record=None, memory_content_hash=None,
        memory_result_hashes=[], subtask=fields.get("subtask"),
        attributes=fields.get("attributes", {}),
        source_write_span_ids=fields.get("sources", []),
    )  # fmt: skip


def _run(trace: str, specs: list[tuple[str | None, dict[str, Any]]], success=True) -> Run:
    steps = [_step(trace, 0, sc.OP_AGENT, name="invoke_agent bot", input="task")]
    steps += [_step(trace, i, op, **fields) for i, (op, fields) in enumerate(specs, 1)]
    return Run(trace, trace, "bot", success, None, {}, "test", steps)


def tool(name: str, args: dict[str, Any] | None = None, error: str | None = None, **kw: Any):
    return (sc.OP_TOOL, {"tool": name, "input": json.dumps(args or {}), "error": error, **kw})


def example_run() -> Run:
    side = {sc.SUBTASK_NAME: "side task: browse 3", sc.BUDGET_EXCEEDED: True}
    return _run("r1", [
        (sc.OP_CHAT, {"input_tokens": 10, "output_tokens": 5, "subtask": "main"}),
        tool("find", {"q": "a"}, error="Timeout", subtask="main"),
        tool("find", {"q": "a"}, subtask="main"),  # a retry, and a repeat of the same call
        tool("find", {"q": "a"}, subtask="main"),
        (sc.OP_SUBTASK, {"name": "subtask side", "attributes": side, "subtask": "main"}),
        tool("search", {"q": "x"}, subtask="side task: browse 3"),
        (sc.OP_CHAT, {"input_tokens": 20, "output_tokens": 1, "subtask": "side task: browse 3"}),
        (sc.OP_MEMORY_UPDATE, {"subtask": "main"}),
        (sc.OP_MEMORY_SEARCH, {"sources": ["r1.8"]}),
        (sc.OP_MEMORY_SEARCH, {"sources": []}),
        tool("reply", {"text": "hi"}, error=None),
        (sc.OP_STEP, {"attributes": {ROLE: "user"}, "input": "thanks"}),
    ], success=False)  # fmt: skip


def test_every_column_on_a_hand_built_run() -> None:
    run = example_run()
    main = _step("r1", 99, sc.OP_SUBTASK, name="subtask main",
                 attributes={sc.SUBTASK_NAME: "main"})  # fmt: skip
    run.steps.append(main)  # a subtask span listed last still describes its steps
    row = run_features([run]).row(0, named=True)
    assert row["trace_id"] == "r1" and row["success"] is False and row["agent"] == "bot"
    assert row["steps"] == 14 and row["llm_calls"] == 2 and row["tool_calls"] == 5
    assert row["tool_sequence"] == ["find", "find", "find", "search", "reply"]
    assert row["tool_bigrams"] == ["find>find", "find>find", "find>search", "search>reply"]
    assert row["tool_trigrams"] == ["find>find>find", "find>find>search", "find>search>reply"]
    assert (row["errors"], row["tool_errors"], row["retries"], row["loops"]) == (1, 1, 1, 3)
    assert row["tokens"] == 36
    assert row["subtasks"] == [
        {"name": "side task: browse 3", "kind": "side task", "steps": 2, "tokens": 21,
         "budget_exceeded": True},
        {"name": "main", "kind": "main", "steps": 6, "tokens": 15, "budget_exceeded": False},
    ]  # fmt: skip
    assert (row["memory_writes"], row["memory_reads"], row["memory_reads_linked"]) == (1, 2, 1)
    assert (row["first_error_tool"], row["first_error_position"]) == ("find", 2)
    assert row["first_error_step_index"] == 1
    assert row["final_action"] == "reply"  # the user's last message is not the agent's action
    assert row["final_role"] == "user"


def test_runs_without_tools_and_empty_populations() -> None:
    chat = _run("r2", [
        (sc.OP_STEP, {"attributes": {ROLE: "user"}, "input": "hi"}),
        (sc.OP_STEP, {"attributes": {ROLE: "assistant"}, "input": "hello"}),
    ])  # fmt: skip
    row = run_features([chat]).row(0, named=True)
    assert row["final_action"] == "message:assistant" and row["final_role"] == "assistant"
    assert (row["tool_calls"], row["loops"], row["tokens"]) == (0, 0, 0)
    assert row["tool_sequence"] == [] and row["first_error_tool"] is None
    empty = run_features([])
    assert empty.height == 0 and empty.schema == pl.Schema(SCHEMA)


def test_step_helpers() -> None:
    a = _step("t", 1, sc.OP_TOOL, tool="x", input='{"b": 1, "a": [1, 2]}')
    b = _step("t", 2, sc.OP_TOOL, tool="x", input='{ "a": [1,2], "b": 1 }')
    assert canonical_arguments(a) == canonical_arguments(b) == '{"a":[1,2],"b":1}'
    assert canonical_arguments(_step("t", 3, sc.OP_TOOL, input=" plain ")) == "plain"
    assert subtask_kind("side task: recommend a webcam") == "side task"
    assert subtask_kind("page 12") == "page #" and subtask_kind(None) is None
    assert quantile([1, 2, 3, 4], 0.5) == 2.5 and quantile([5], 0.9) == 5
    run = example_run()
    assert final_action_step(run) is run.steps[11]
    assert action_label(run.steps[1]) == "message:assistant"
    assert final_action_step(_run("r3", [])) is None


def test_thousand_runs_of_thirty_steps_in_under_a_second() -> None:
    def spec(i: int) -> tuple[str | None, dict[str, Any]]:
        if i % 3 == 0:
            return sc.OP_CHAT, {"input_tokens": 100, "output_tokens": 20, "subtask": "main"}
        if i % 3 == 1:
            return tool(f"tool{i % 5}", {"id": f"A-{i}", "n": i}, subtask="main",
                        output=json.dumps({"ok": True, "id": f"A-{i}"}))  # fmt: skip
        return sc.OP_STEP, {"subtask": "main"}

    runs = [_run(f"r{n}", [spec(i) for i in range(29)], success=n % 2 == 0) for n in range(1000)]
    started = time.perf_counter()
    frame = run_features(runs)
    elapsed = time.perf_counter() - started
    assert frame.height == 1000 and frame["steps"].to_list() == [30] * 1000
    assert elapsed < 1.0, f"{elapsed:.2f} s"


def test_browsing_and_checking_tools_are_reads_not_writes() -> None:
    from tracegym.analysis.tool_kinds import is_read_tool

    # a side task's browse counted as a write made a hand-off look like acting beside a write
    reads = ["browse_products", "scanInventory", "explore_catalog", "verify_identity",
             "validate_address", "get_order"]  # fmt: skip
    assert all(is_read_tool(n) for n in reads)
    assert not any(is_read_tool(n) for n in ["cancel_order", "transfer_to_human_agents"])
