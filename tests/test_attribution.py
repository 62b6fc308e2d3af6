"""Failure attribution: the output contract, determinism, labels never read, hand-built runs
where the answer is known, and the shared benchmark data end to end (skipped where absent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracegym.analysis.attribution import (
    Attribution,
    attribute,
    attribute_runs,
    build_turns,
    source_run_id,
    to_json_line,
)
from tracegym.analysis.detectors.base import Finding
from tracegym.analysis.runs import ROLE, Run, Step
from tracegym.tracer import semconv as sc

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
WHOWHEN = DATA / "whowhen-algorithm-generated"
AGENTRX = DATA / "agentrx-tau-retail"
KEYS = {"run", "trace_id", "agent", "step", "reason", "confidence"}

QUESTION = "How many gold medals did Norway win at the 1994 Winter Olympics in Lillehammer?"
TASK = (
    "You are given a general task and a plan from your manager.\n# General Task\n"
    f"{QUESTION}\n## Plan\n1. Find the official medal table of the Lillehammer games.\n"
    "2. Count Norway's gold medals.\n3. Verify the count against a second source."
)


# Building runs by hand -------------------------------------------------------------------------


def _step(position: int, trace: str, **fields: Any) -> Step:
    attributes = dict(fields.pop("attributes", {}) or {})
    role = fields.pop("role", None)
    if role is not None:
        attributes[ROLE] = role
    values: dict[str, Any] = {
        "position": position, "trace_id": trace, "span_id": f"s{position}",
        "parent_span_id": "s0", "name": "span", "operation": sc.OP_AGENT, "agent": None,
        "step_index": position - 1, "tool": None, "call_id": None, "input": None,
        "output": None, "status": "UNSET", "error_type": None, "start_ns": position,
        "end_ns": position + 1, "duration_ms": 0.0, "input_tokens": None,
        "output_tokens": None, "memory_store": None, "memory_record": None,
        "memory_content_hash": None, "memory_result_hashes": [], "subtask": None,
        "attributes": attributes,
    }  # fmt: skip
    values.update(fields)
    return Step(**values)


def team_run(
    messages: list[tuple[str, str]],
    *,
    question: str = QUESTION,
    trace: str = "t-team",
    success: bool | None = False,
    labels: dict[str, Any] | None = None,
) -> Run:
    """A Who&When-style group chat: one `invoke_agent {name}` span per message."""
    root = _step(
        0, trace, parent_span_id=None, agent="CaptainAgent", step_index=None, input=question,
        attributes={sc.RUN_ID: f"whowhen/q-{trace}/abcdef12", "tracegym.source.format": "whowhen",
                    "tracegym.source.question_id": f"q-{trace}"},
    )  # fmt: skip
    steps = [root]
    for j, (name, content) in enumerate(messages):
        steps.append(_step(j + 1, trace, agent=name, output=content, role="user"))
    return Run(
        trace_id=trace, run_id=f"whowhen/q-{trace}/abcdef12", agent="CaptainAgent",
        success=success, reward=None, labels=labels or {}, source="whowhen", steps=steps,
    )  # fmt: skip


def tool_run(
    turns: list[tuple[str, Any]], *, trace: str = "t-tool", success: bool | None = False
) -> Run:
    """A tau-bench-style run: system/user `step` spans, assistant `chat` spans whose output
    messages hold tool calls, and `execute_tool` spans for the results."""
    root = _step(
        0, trace, parent_span_id=None, agent="tau-bench", step_index=None,
        input="You are Mia; you want to return a lamp.",
        attributes={"tracegym.source.task_id": 7, "tracegym.source.trial": 2},
    )  # fmt: skip
    steps = [root]
    for j, (role, payload) in enumerate(turns):
        position = j + 1
        if role == "assistant":
            text, calls = payload if isinstance(payload, tuple) else (payload, [])
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [
                    {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                    for cid, n, a in calls
                ]
            steps.append(_step(
                position, trace, operation=sc.OP_CHAT, agent="tau-bench", role="assistant",
                output=json.dumps([message]),
                attributes={sc.OUTPUT_MESSAGES: json.dumps([message])},
            ))  # fmt: skip
        elif role == "tool":
            call_id, name, result = payload
            failed = result.startswith("Error")
            steps.append(_step(
                position, trace, operation=sc.OP_TOOL, agent="tau-bench", role="tool", tool=name,
                call_id=call_id, output=result, status="ERROR" if failed else "UNSET",
                error_type="ToolError" if failed else None,
            ))  # fmt: skip
        else:
            steps.append(_step(
                position, trace, operation=sc.OP_STEP, agent="tau-bench", role=role, input=payload
            ))  # fmt: skip
    return Run(
        trace_id=trace, run_id=f"tau-bench/7-2/{trace}", agent="tau-bench", success=success,
        reward=0.0, labels={}, source="tau-bench", steps=steps,
    )  # fmt: skip


def failed_code_run(**kwargs: Any) -> Run:
    return team_run(
        [
            ("Sports_Expert", TASK),
            ("Data_Expert", "Let me load the medal table.\n```python\nimport medals\n```"),
            ("Computer_terminal", "exitcode: 1 (execution failed)\nCode output: Traceback "
             "(most recent call last):\nModuleNotFoundError: No module named 'medals'"),
            ("Verification_Expert", "The code failed; the count is unknown."),
            ("Computer_terminal", "There is no code from the last 1 message for me to execute."),
        ],
        **kwargs,
    )  # fmt: skip


# The output contract ---------------------------------------------------------------------------


def test_json_line_has_exactly_the_contract_keys_and_types() -> None:
    result = attribute(failed_code_run())
    line = to_json_line(result)
    assert "\n" not in line
    record = json.loads(line)
    assert set(record) == KEYS
    assert isinstance(record["run"], str) and record["run"]
    assert isinstance(record["trace_id"], str)
    assert isinstance(record["agent"], str)
    assert isinstance(record["step"], int) and not isinstance(record["step"], bool)
    assert isinstance(record["reason"], str) and record["reason"]
    assert isinstance(record["confidence"], float) and 0.0 <= record["confidence"] <= 1.0
    assert record == result.to_dict()


def test_empty_run_still_yields_a_contract_line() -> None:
    run = team_run([], trace="t-empty")
    run.steps = []
    record = json.loads(to_json_line(attribute(run)))
    assert set(record) == KEYS
    assert record["step"] is None and record["agent"] is None and record["confidence"] == 0.0


def test_attribute_runs_covers_failed_runs_only() -> None:
    runs = [
        failed_code_run(trace="t-failed"),
        failed_code_run(trace="t-ok", success=True),
        failed_code_run(trace="t-unknown", success=None),
    ]
    results = attribute_runs(runs)
    assert [a.trace_id for a in results] == ["t-failed"]
    assert all(isinstance(a, Attribution) for a in results)


# Determinism and labels ------------------------------------------------------------------------


def test_deterministic() -> None:
    runs = [failed_code_run(trace=f"t-{i}") for i in range(3)]
    first = [to_json_line(a) for a in attribute_runs(runs)]
    assert first == [to_json_line(a) for a in attribute_runs(runs)]


def test_same_output_whatever_the_hash_seed() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_attribution import failed_code_run, tool_run, team_run, QUESTION\n"
        "from tracegym.analysis.attribution import attribute, to_json_line\n"
        "runs = [failed_code_run(), tool_run([('user', 'Return order 1234 please'), "
        "('assistant', 'Your refund is 18.50 and shipping 4.25, 22.75 in all.')]), "
        "team_run([('A_Expert', 'x'), ('B_Expert', 'Norway won 10 golds and 11 silvers.')])]\n"
        "print('\\n'.join(to_json_line(attribute(r)) for r in runs))\n"
    )
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1


class _Untouchable(dict):
    """Labels that fail the test when read."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("attribution read the gold labels")

    __getitem__ = get = keys = values = items = __iter__ = __contains__ = __len__ = _refuse


class _GuardedAttributes(dict):
    """Span attributes that refuse `tracegym.label.*` keys and wholesale reads."""

    def get(self, key: Any, default: Any = None) -> Any:
        if str(key).startswith("tracegym.label."):
            raise AssertionError(f"attribution read {key}")
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        if str(key).startswith("tracegym.label."):
            raise AssertionError(f"attribution read {key}")
        return super().__getitem__(key)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("attribution iterated over span attributes")

    keys = values = items = __iter__ = _refuse


def _labelled(run: Run, agent: str, step: int) -> Run:
    run.labels = {"mistake_agent": agent, "mistake_step": str(step), "mistake_step_index": step}
    for s in run.steps:
        if s.step_index == step:
            s.attributes["tracegym.label.failed_agent"] = agent
            s.attributes["tracegym.label.root_cause"] = True
    return run


def test_labels_change_nothing() -> None:
    plain = to_json_line(attribute(failed_code_run()))
    for agent, step in (("Sports_Expert", 0), ("Verification_Expert", 3), ("Nobody", 4)):
        assert to_json_line(attribute(_labelled(failed_code_run(), agent, step))) == plain


def test_labels_are_never_read() -> None:
    for run in (failed_code_run(), _labelled(failed_code_run(), "Verification_Expert", 3)):
        run.labels = _Untouchable(run.labels)
        for s in run.steps:
            s.attributes = _GuardedAttributes(s.attributes)
        attribute(run)  # raises if it touches a label


# Hand-built runs where the answer is known -----------------------------------------------------


def test_failed_execution_blames_the_code_author() -> None:
    result = attribute(failed_code_run())
    assert (result.agent, result.step, result.rule) == ("Data_Expert", 1, "failed_execution")
    assert "Computer_terminal" not in result.agent
    assert "step 2" in result.reason and "Data_Expert" in result.reason


def test_off_task_opening_is_step_zero() -> None:
    off_task = (
        "You are given a task from your manager.\n# Task description\nWe have a Python script "
        "that should return the sum of the squares of the even numbers in a list; it raises an "
        "error. Debug the script, correct the indentation and the loop, test it on sample "
        "input including an empty list and negative values, and report the corrected script."
    )
    run = team_run(
        [
            ("PythonDebugging_Expert", off_task),
            ("Tester_Expert", "I ran the tests and all of them pass now."),
        ]
    )
    result = attribute(run)
    assert (result.agent, result.step, result.rule) == (
        "PythonDebugging_Expert",
        0,
        "off_task_plan",
    )
    on_task = attribute(team_run([("Sports_Expert", TASK), ("Tester_Expert", "Checking.")]))
    assert on_task.rule != "off_task_plan"


def test_ungrounded_number_is_an_unverified_claim() -> None:
    run = team_run(
        [
            ("Sports_Expert", TASK),
            ("Data_Expert", "I will look up the medal table."),
            ("History_Expert", "From memory, Norway won 10 gold medals in Lillehammer."),
            ("Verification_Expert", "Agreed, 10 gold medals."),
        ]
    )
    result = attribute(run)
    assert (result.agent, result.step, result.rule) == ("History_Expert", 2, "ungrounded_claim")
    assert "10" in result.reason


def test_numbers_seen_or_derived_are_grounded() -> None:
    run = team_run(
        [
            ("Sports_Expert", TASK),
            ("Data_Expert", "Let me count.\n```python\nprint(9 + 1)\n```"),
            ("Computer_terminal", "exitcode: 0 (execution succeeded)\nCode output: 13 26"),
            ("Data_Expert", "The table lists 13 golds and 26 medals overall."),
            ("Math_Expert", "So 39 medals across both columns, and 13 of 26 is 0.5."),
        ]
    )
    result = attribute(run)
    assert result.rule != "ungrounded_claim"
    assert (result.step, result.rule) == (1, "first_action")


def test_single_agent_tool_run() -> None:
    lookup_then_write = [
        ("system", "You are a retail agent. Follow the policy."),
        ("user", "I want to return the lamp from order W123."),
        ("assistant", ("", [("c1", "find_user_id_by_email", '{"email": "x@y.z"}')])),
        ("tool", ("c1", "find_user_id_by_email", "Error: user not found")),
        ("assistant", ("", [("c2", "get_order_details", '{"order_id": "W123"}')])),
        ("tool", ("c2", "get_order_details", '{"status": "delivered"}')),
        ("assistant", ("", [("c3", "return_delivered_order_items", '{"order_id": "W123"}')])),
        ("tool", ("c3", "return_delivered_order_items", "Error: non-delivered order")),
        ("user", "Thanks ###STOP###"),
    ]
    result = attribute(tool_run(lookup_then_write))
    # the failed lookup at step 3 is skipped; the failed return was called at step 6
    assert (result.agent, result.step, result.rule) == ("assistant", 6, "failed_execution")
    assert result.run == "7-2"
    succeeded = [
        t if t[0] != "tool" or t[1][0] != "c3" else ("tool", ("c3", t[1][1], '{"ok": true}'))
        for t in lookup_then_write
    ]
    result = attribute(tool_run(succeeded))
    assert (result.agent, result.step, result.rule) == ("assistant", 6, "first_write")
    turns = build_turns(tool_run(succeeded))
    assert [t.agent for t in turns[:3]] == ["system", "user", "assistant"]
    assert turns[3].execution and turns[3].failed and turns[3].agent == "assistant"


def test_confident_findings_decide_and_map_to_the_caller() -> None:
    run = tool_run(
        [
            ("user", "Cancel order W9."),
            ("assistant", ("", [("c1", "cancel_pending_order", '{"order_id": "W8"}')])),
            ("tool", ("c1", "cancel_pending_order", '{"status": "cancelled"}')),
        ]
    )
    tool_step = run.steps[3]

    def finding(confidence: float) -> Finding:
        return Finding(
            detector="ungrounded_argument", key="ungrounded_argument:order_id",
            trace_id=run.trace_id, position=tool_step.position, step_index=tool_step.step_index,
            agent="tau-bench", span_ids=(tool_step.span_id,),
            message="order_id W8 appears in no earlier message", confidence=confidence,
        )  # fmt: skip

    result = attribute(run, [finding(0.9)])
    assert (result.step, result.rule, result.agent) == (1, "finding", "assistant")
    assert result.confidence == 0.9 and "W8" in result.reason
    assert attribute(run, [finding(0.2)]).rule != "finding"
    assert attribute_runs([run], {run.trace_id: [finding(0.9)]})[0].rule == "finding"
    # the run's own hard evidence (a failed state-changing call) comes before findings
    failed = tool_run(
        [
            ("user", "Cancel order W9."),
            ("assistant", ("", [("c1", "get_order_details", '{"order_id": "W9"}')])),
            ("tool", ("c1", "get_order_details", '{"status": "pending"}')),
            ("assistant", ("", [("c2", "cancel_pending_order", '{"order_id": "W9"}')])),
            ("tool", ("c2", "cancel_pending_order", "Error: missing reason")),
        ],
        trace="t-failed-write",
    )
    early = Finding(
        detector="wrong_tool_order", key="wrong_tool_order:x", trace_id=failed.trace_id,
        position=2, step_index=1, agent="tau-bench", span_ids=("s2",), message="order",
        confidence=0.95,
    )  # fmt: skip
    result = attribute(failed, [early])
    assert (result.step, result.rule) == (3, "failed_execution")


def test_native_runs_without_step_indexes_use_positions() -> None:
    run = failed_code_run(trace="t-native")
    for s in run.steps:
        s.step_index = None
    run.steps[0].attributes = {}
    run.run_id = "my-run-42"
    result = attribute(run)
    assert (result.step, result.agent) == (2, "Data_Expert")  # position 2 = history index 1
    assert result.run == "my-run-42"


def test_source_run_ids() -> None:
    assert source_run_id(failed_code_run(trace="abc")) == "q-abc"
    assert source_run_id(tool_run([("user", "hi")])) == "7-2"
    run = failed_code_run(trace="xyz")
    run.steps[0].attributes = {"tracegym.source.format": "whowhen"}
    assert source_run_id(run) == "q-xyz"  # the middle of the importer's format/id/hash id
    run.steps[0].attributes = {}
    assert source_run_id(run) == "whowhen/q-xyz/abcdef12"  # not an import: the run id as is
    run.run_id = None
    assert source_run_id(run) == "xyz"


# The shared data end to end --------------------------------------------------------------------


def _import(fmt: str, path: Path, home: Path, **kwargs: Any) -> list[Run]:
    from tracegym.analysis.runs import load_runs
    from tracegym.store.importers import import_path
    from tracegym.store.store import Store

    import_path(fmt, path, home, **kwargs)
    with Store(home) as store:
        return load_runs(store)


@pytest.fixture(scope="module")
def whowhen_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Run]]:
    if not WHOWHEN.is_dir():
        pytest.skip(f"shared data absent: {WHOWHEN} (Who&When Algorithm-Generated)")
    yield _import("whowhen", WHOWHEN, tmp_path_factory.mktemp("whowhen"))


def test_whowhen_end_to_end(whowhen_runs: list[Run]) -> None:
    files = {f.stem: f for f in WHOWHEN.glob("*.json")}  # the benchmark names runs by file
    results = attribute_runs(whowhen_runs)
    assert len(results) == len(files) == 126
    agent_hits = step_hits = 0
    for result in results:
        record = json.loads(to_json_line(result))
        assert set(record) == KEYS and record["run"] in files
        doc = json.loads(files[record["run"]].read_text())
        assert 0 <= record["step"] < len(doc["history"])
        assert record["agent"] != "Computer_terminal"
        agent_hits += doc["mistake_agent"] in record["agent"]
        step_hits += record["step"] == int(doc["mistake_step"])
    # well above the published GPT-4o numbers (54.33 agent, 25.51 step at best); a regression
    # guard, not a target
    assert agent_hits / 126 > 0.55 and step_hits / 126 > 0.35
    assert [to_json_line(a) for a in attribute_runs(whowhen_runs)] == [
        to_json_line(a) for a in results
    ]


def test_agentrx_end_to_end(tmp_path: Path) -> None:
    if not (AGENTRX / "tau_dataset_failed.json").is_file():
        pytest.skip(f"shared data absent: {AGENTRX} (AgentRx tau-retail)")
    runs = _import(
        "tau-bench", AGENTRX / "tau_dataset_failed.json", tmp_path,
        labels=AGENTRX / "tau_ground_truth.json",
    )  # fmt: skip
    trajectories = json.loads((AGENTRX / "tau_dataset_failed.json").read_text())
    expected = {f"{t['task_id']}-{t['trial']}": len(t["traj"]) for t in trajectories}
    results = attribute_runs(runs)
    assert len(results) == len(expected) == 29
    for result in results:
        record = json.loads(to_json_line(result))
        assert set(record) == KEYS
        assert 0 <= record["step"] < expected[record["run"]]
        assert record["agent"] in {"assistant", "user"}
