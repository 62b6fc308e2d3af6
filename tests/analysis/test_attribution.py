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
    _context,
    _line_key,
    attribute,
    attribute_runs,
    build_turns,
    learn_profile,
    source_run_id,
    to_json_line,
)
from tracegym.analysis.detectors.base import Finding
from tracegym.analysis.runs import ROLE, Run, Step, load_runs
from tracegym.tracer import semconv as sc

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
WHOWHEN = DATA / "whowhen-algorithm-generated"
AGENTRX = DATA / "agentrx-tau-retail"
AGENTRACER = "agentracer-tracertraj-code/tracertraj-code-test.json"
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


def test_a_call_the_user_ran_is_not_the_agents_write() -> None:
    """tau2-bench's phone tools are run by the user (`tracegym.tool.requested_by`): the first
    state-changing action is the agent's own write, not the user's toggle, and a quote of a turn
    that only calls a tool shows the call, never an empty string."""
    turns = [
        ("user", "My data does not work abroad."),
        ("assistant", ("Please turn roaming on in your settings.", [])),
        ("tool", ("u1", "toggle_roaming", "Data Roaming is now ON.")),
        ("assistant", ("", [("c1", "enable_roaming", '{"line_id": "L1"}')])),
        ("tool", ("c1", "enable_roaming", "Roaming enabled")),
        ("user", "Still nothing. ###STOP###"),
    ]
    run = tool_run(turns)
    toggle = next(s for s in run.steps if s.tool == "toggle_roaming")
    toggle.attributes[sc.TOOL_REQUESTED_BY] = "user"
    result = attribute(run)
    assert (result.rule, result.step) == ("first_write", 3)
    assert "enable_roaming" in result.reason and "toggle_roaming" not in result.reason
    quiet = tool_run([("user", "Hello."), ("assistant", ("", [("c1", "get_line", "{}")]))])
    result = attribute(quiet)
    assert result.rule == "first_action" and "('')" not in result.reason
    assert "get_line" in result.reason


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


def test_a_sum_of_three_seen_numbers_is_grounded_a_count_times_one_is_not() -> None:
    seen = [
        ("Sports_Expert", TASK),
        ("Data_Expert", "Let me look.\n```python\nprint(table)\n```"),
        ("Computer_terminal", "exitcode: 0 (execution succeeded)\nCode output: 13 26 7"),
        ("Data_Expert", "The table lists 13 gold, 26 silver and 7 bronze medals."),
    ]
    run = team_run([*seen, ("Math_Expert", "So 46 medals in all.")])  # 13 + 26 + 7
    assert attribute(run).rule != "ungrounded_claim"
    # 65 is 5 x 13 (a count times a seen number), which prose does not compute: still a claim
    run = team_run([*seen, ("Math_Expert", "So Norway won 65 medals in all.")])
    result = attribute(run)
    assert result.rule == "ungrounded_claim" and "65" in result.reason


def test_a_turn_that_only_announces_a_plan_is_not_the_first_action() -> None:
    plan = (
        "I will start by retrieving the official medal table. Let's begin with the Olympic "
        "committee's archive. We need to compare it with a second source afterwards."
    )
    claim = "The archive's table lists Norway among the leaders, ahead of Germany and Russia."
    run = team_run(
        [
            ("Sports_Expert", TASK),
            ("Data_Expert", plan),
            ("History_Expert", claim),
            ("Verification_Expert", "Agreed."),
        ]
    )
    # the first substantive turn (what first_action picked before) is the plan at step 1
    assert _context(run).substantive()[0].step == 1
    result = attribute(run)
    assert (result.agent, result.step, result.rule) == ("History_Expert", 2, "first_action")
    # a turn that runs code is an action however it is worded; a plan alone is still the start
    coded = team_run([("Sports_Expert", TASK), ("Data_Expert", plan + "\n```python\nx()\n```"),
                      ("History_Expert", claim)])  # fmt: skip
    assert attribute(coded).step == 1
    assert attribute(team_run([("Sports_Expert", TASK), ("Data_Expert", plan)])).step == 1


def test_a_number_made_up_after_a_failed_execution_decides() -> None:
    made_up = [
        ("Sports_Expert", TASK),
        ("Data_Expert", "Let me load the medal table.\n```python\nimport medals\n```"),
        ("Computer_terminal", "exitcode: 1 (execution failed)\nCode output: Traceback "
         "(most recent call last):\nModuleNotFoundError: No module named 'medals'"),
        ("History_Expert", "The code failed, but Norway won 10 gold medals in Lillehammer."),
        ("Verification_Expert", "Agreed."),
    ]  # fmt: skip
    result = attribute(team_run(made_up))
    assert (result.agent, result.step, result.rule) == ("History_Expert", 3, "ungrounded_claim")
    assert "10" in result.reason and "failed execution is at step 2" in result.reason
    # a claim before the failing code does not move the blame past the failure's author: the
    # rule order is unchanged there (failed_execution first)
    early = [made_up[0], ("History_Expert", "From memory it is 10."), *made_up[1:3]]
    result = attribute(team_run(early))
    assert (result.agent, result.step, result.rule) == ("Data_Expert", 2, "failed_execution")
    # without a later claim the failing code's author is blamed as before
    assert attribute(failed_code_run()).rule == "failed_execution"


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
    # as likely decisive as not is enough (0.5-0.6 findings were left out before)
    assert (attribute(run, [finding(0.5)]).step, attribute(run, [finding(0.5)]).rule) == (
        1, "finding")  # fmt: skip
    assert attribute(run, [finding(0.6)], min_finding_confidence=0.7).rule != "finding"


def _finding(run: Run, position: int, detector: str, confidence: float = 0.7) -> Finding:
    step = next(s for s in run.steps if s.position == position)
    return Finding(
        detector=detector, key=f"{detector}:x", trace_id=run.trace_id, position=position,
        step_index=step.step_index, agent=step.agent, span_ids=(step.span_id,),
        message=f"{detector} at {position}", confidence=confidence,
    )  # fmt: skip


def _lookup_then_failed_write(*, lookup: str = '{"status": "pending"}') -> Run:
    return tool_run(
        [
            ("user", "Cancel order W9."),
            ("assistant", ("", [("c1", "get_order_details", '{"order_id": "W9"}')])),
            ("tool", ("c1", "get_order_details", lookup)),
            ("assistant", ("", [("c2", "cancel_pending_order", '{"order_id": "W9"}')])),
            ("tool", ("c2", "cancel_pending_order", "Error: upstream timed out, try again")),
        ],
        trace="t-failed-write",
    )


def test_a_finding_before_the_failed_execution_decides() -> None:
    """Where the run first went wrong, not where it visibly broke: a confident finding on an
    earlier step than the failed execution's author decides over it."""
    failed = _lookup_then_failed_write()
    assert (attribute(failed).step, attribute(failed).rule) == (3, "failed_execution")
    early = _finding(failed, 3, "poisoned_memory")  # the lookup's result, made by step 1
    result = attribute(failed, [early])
    assert (result.step, result.rule, result.agent) == (1, "finding", "assistant")
    assert "poisoned_memory" in result.reason
    # a finding on the failing call itself or after it leaves the failure in charge
    for position in (5, 4):
        late = _finding(failed, position, "wrong_amount")
        assert (attribute(failed, [late]).step, attribute(failed, [late]).rule) == (
            3, "failed_execution")  # fmt: skip
    # below the confidence floor a finding changes nothing
    weak = _finding(failed, 3, "poisoned_memory", confidence=0.3)
    assert attribute(failed, [weak]).rule == "failed_execution"


def test_a_finding_on_a_failed_lookup_does_not_override_the_failed_execution() -> None:
    """A failed lookup is a guess the agent can correct (`failed_execution` passes over it);
    a finding that only reports that failure does not take the decision from a later failed
    write (AgentRx: "user not found" before the write that went wrong)."""
    failed = _lookup_then_failed_write(lookup="Error: order not found")
    invalid = _finding(failed, 3, "invalid_invocation", confidence=0.8)
    result = attribute(failed, [invalid])
    assert (result.step, result.rule) == (3, "failed_execution")
    # without a failed write the same finding decides as before (rule 3)
    lookup_only = tool_run(
        [
            ("user", "Cancel order W9."),
            ("assistant", ("", [("c1", "get_order_details", '{"order_id": "W9"}')])),
            ("tool", ("c1", "get_order_details", "Error: order not found")),
            ("assistant", "Sorry, I could not find it."),
        ],
        trace="t-lookup-only",
    )
    result = attribute(lookup_only, [_finding(lookup_only, 3, "invalid_invocation", 0.8)])
    assert (result.step, result.rule) == (1, "finding")


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


# System profiles: what recurs in every run of a system is not evidence --------------------------

WARNING = (
    "/usr/lib/python3/site-packages/autogen/oai/client.py:392: UserWarning: Resolved model "
    "mismatch: gpt-4o-2024-08-06 != gpt-4o-2024-05-13. Model mapping may be incorrect."
)
QUESTIONS = [
    ("How many gold medals did Norway win at the 1994 Winter Olympics?", "medal table"),
    ("Which river flows through the capital of Hungary?", "river atlas"),
    ("Who wrote the novel that the 1939 film about Kansas was based on?", "film catalogue"),
    ("What is the tallest mountain in the Alps by prominence?", "mountain list"),
    ("Which element has the chemical symbol W?", "periodic table"),
]


def _warned_runs() -> list[Run]:
    """Team runs whose step 1 pastes the same library warning (numbers included)."""
    runs = []
    for i, (question, source) in enumerate(QUESTIONS):
        runs.append(team_run(
            [
                ("Planner_Expert", f"# Task\n{question}\n## Plan\n1. Look it up in the {source}."),
                ("Search_Expert", f"{WARNING}\nI will look it up in the {source} now."),
                ("Checker_Expert", f"Please check the {source} again before answering."),
            ],
            question=question, trace=f"t-warned-{i}",
        ))  # fmt: skip
    return runs


def test_boilerplate_lines_are_learnt_from_the_systems_runs() -> None:
    runs = _warned_runs()
    profile = learn_profile(runs)
    assert profile.runs == len(runs)
    assert profile.is_boilerplate(WARNING)
    assert not profile.is_boilerplate(WARNING.replace("05-13", "11-20"))  # another warning
    logged = "2024-12-19 12:37:12.2198 WARNING proxy at 0x7f3a2c: retrying"
    assert _line_key(logged) == _line_key(logged.replace("12:37:12.2198", "09:01:44.0031"))
    assert not profile.is_boilerplate("I will look it up in the river atlas now.")
    assert profile.orchestrator == "Planner_Expert"  # it opens every run of this team
    assert learn_profile(runs[:2]).boilerplate == frozenset()  # too few runs to tell


def test_a_pasted_warning_is_not_an_ungrounded_claim() -> None:
    runs = _warned_runs()
    alone = attribute(runs[0])  # no profile: the warning's numbers look like a claim
    assert (alone.rule, alone.step) == ("ungrounded_claim", 1)
    for result in attribute_runs(runs):
        assert result.rule != "ungrounded_claim"
        assert "2024" not in result.reason
    profile = learn_profile(runs)
    turns = build_turns(runs[0], profile)
    assert "UserWarning" not in turns[1].evidence and "look it up" in turns[1].evidence


def _metagpt_run(i: int, question: str, code: str) -> Run:
    """A MetaGPT-shaped team: the Team Leader's prompt template, plan and message, then the
    Engineer's prompt template (boilerplate) before each reply."""
    template = (
        "{who} thinking: \n# Past Experience\n<experience>\n\n# Tool State\n\n# Current Plan\n"
        "[GOAL] {goal}\nNo Plan\n\n# Current Task\n\n# Response Language\nyou must respond in "
        "English.\nPay close attention to the Example provided, you can reuse the example.\n"
        "In your response, include at least one command. If you want to stop, use end.\n"
        "Output should adhere to the following format.\n```json\n[\n    {{\n        "
        '"command_name": "ClassName.method_name",\n        "args": {{"arg_name": arg_value}}\n'
        "    }}\n]\n```\nNotice: your output JSON data section must start with **```json [**"
    )
    message = f"Please implement the solution: {question}"
    return team_run(
        [
            ("Team Leader", template.format(who="Team Leader", goal=question)),
            ("Team Leader", f"Team Leader thinking: I will assign the task to Alex.\n```json\n"
             f'[{{"command_name": "TeamLeader.publish_message", "args": {{"content": '
             f'"{message}", "send_to": "Alex"}}}}]\n```'),
            ("Team Leader", f"Team Leader sends to Alex: {message}"),
            ("Engineer", template.format(who="Engineer", goal=message)),
            ("Engineer", f"Engineer thinking: I will write the function.\n```json\n"
             f'[{{"command_name": "Editor.write", "args": {{"path": "solution.py", '
             f'"content": "{code}"}}}}]\n```'),
            ("Engineer", template.format(who="Engineer", goal=message)),
            ("Engineer", f"Engineer thinking: `{code[4:code.index('(')]}` is written in "
             "solution.py; I mark the task finished."
             '\n```json\n[{"command_name": "Plan.finish_current_task", "args": {}}]\n```'),
            ("Team Leader", f"Team Leader thinking: Alex has completed: {question}\n```json\n"
             '[{"command_name": "end"}]\n```'),
        ],
        question=question, trace=f"t-metagpt-{i}",
    )  # fmt: skip


def _metagpt_runs() -> list[Run]:
    codes = [
        "def area(w, h):\\n    return w + h",
        "def is_even(n):\\n    return n % 2 == 1",
        "def first(xs):\\n    return xs[1]",
        "def total(xs):\\n    return sum(xs) + 1",
        "def square(x):\\n    return x * 3",
    ]
    questions = [
        "Write a function that returns the area of a rectangle of width w and height h.",
        "Write a function that tells whether an integer n is even.",
        "Write a function that returns the first item of a non-empty list.",
        "Write a function that returns the sum of a list of numbers.",
        "Write a function that returns the square of a number.",
    ]
    return [_metagpt_run(i, q, c) for i, (q, c) in enumerate(zip(questions, codes, strict=True))]


def test_prompt_templates_and_the_orchestrator_are_learnt() -> None:
    runs = _metagpt_runs()
    profile = learn_profile(runs)
    assert profile.orchestrator == "Team Leader"
    turns = build_turns(runs[0], profile)
    assert [t.step for t in turns if t.template] == [0, 3, 5]  # the logged prompts
    assert not any(t.template for t in build_turns(runs[0]))  # nothing learnt, no templates


def test_handover_blames_the_first_worker_at_the_start_of_its_action() -> None:
    runs = _metagpt_runs()
    for result in attribute_runs(runs):
        # the Engineer's first action: its prompt template (step 3) and reply (step 4)
        assert (result.agent, result.step, result.rule) == ("Engineer", 3, "handover")
        assert "Team Leader" in result.reason
    # a single run gives no profile: no orchestrator to hand over from
    assert attribute(runs[0]).rule != "handover"
    assert attribute(runs[0], profile=learn_profile(runs)).rule == "handover"


def test_backticks_inside_a_json_string_do_not_open_a_fence() -> None:
    prd = (
        'Product Manager thinking: I will write the PRD.\n```json\n[{"command_name": '
        '"Editor.write", "args": {"content": "## Chart\\n```mermaid\\nquadrantChart\\n'
        '\\"Product A\\": [0.35, 0.62]\\n```\\n## Open questions"}}]\n```'
    )
    run = team_run([("Sports_Expert", TASK), ("Product_Expert", prd)])
    result = attribute(run)
    assert result.rule != "ungrounded_claim"
    turn = build_turns(run)[1]
    assert "0.35" not in turn.prose and turn.writes_code


def test_the_note_written_after_the_run_is_never_decisive() -> None:
    conversation = [
        ("user", "Where is my order W123?"),
        ("assistant", "Your order W123 is on its way."),
    ]

    def native(run: Run) -> Run:  # traced by tracegym itself: no source step indexes
        for s in run.steps:
            s.step_index = None
        return run

    run = native(tool_run(conversation, trace="t-note"))
    note = _step(
        len(run.steps), run.trace_id, operation=sc.OP_MEMORY_UPDATE, agent="tau-bench",
        step_index=None, name="update_memory customer-notes",
        output="Customer asked about W123; promised a refund of 48.75 by Friday.",
    )  # fmt: skip
    run.steps.append(note)
    turns = build_turns(run)
    assert turns[-1].after_end and not any(t.after_end for t in turns[:-1])
    result = attribute(run)
    assert result.position != note.position and "48.75" not in result.reason
    without = attribute(native(tool_run(conversation, trace="t-note")))
    assert (result.step, result.agent, result.rule) == (without.step, without.agent, without.rule)
    # nor does a detector's finding on it make it so
    on_note = Finding(
        detector="poisoned_memory", key="poisoned_memory:x", trace_id=run.trace_id,
        position=note.position, step_index=None, agent="tau-bench", span_ids=(note.span_id,),
        message="a note contradicts the policy", confidence=0.9,
    )  # fmt: skip
    with_finding = attribute(run, [on_note])
    assert with_finding.position != note.position and with_finding.rule != "finding"


def test_failed_execution_quotes_the_error_line() -> None:
    result = attribute(failed_code_run())
    assert "ModuleNotFoundError: No module named 'medals'" in result.reason
    empty = tool_run(
        [
            ("user", "Cancel order W9."),
            ("assistant", ("", [("c1", "cancel_pending_order", '{"order_id": "W9"}')])),
            ("tool", ("c1", "cancel_pending_order", "Error: order W9 is already delivered")),
        ],
        trace="t-quote",
    )
    assert "Error: order W9 is already delivered" in attribute(empty).reason


def test_profiles_never_read_labels_or_ids() -> None:
    runs = _metagpt_runs()
    plain = [to_json_line(a) for a in attribute_runs(runs)]
    for run in runs:
        run.labels = _Untouchable({"mistake_agent": "Engineer"})
        for s in run.steps:
            s.attributes = _GuardedAttributes(s.attributes)
    guarded = [to_json_line(a) for a in attribute_runs(runs)]
    assert [json.loads(g)["step"] for g in guarded] == [json.loads(p)["step"] for p in plain]


# The AgenTracer importer ------------------------------------------------------------------------


def _agentracer_document() -> list[dict[str, Any]]:
    history = [
        {"step": 0, "name": "Team Leader", "role": "assistant",
         "content": "Team Leader thinking: I will ask Alex to write q_attacked_solution.py."},
        {"step": 1, "name": "Team Leader", "role": "assistant",
         "content": "Team Leader sends to Alex: please implement add(a, b)."},
        {"step": 2, "name": "Engineer", "role": "assistant",
         "content": "Engineer thinking: writing def add(a, b): return a - b"},
    ]  # fmt: skip
    return [
        {
            "question_ID": "Demo_1_I", "question": "Implement add(a, b).",
            "ground_truth": "def add(a, b): return a + b", "history": history,
            "mistake_agent": "Engineer", "mistake_step": "2",
            "mistake_reason": "subtracts instead of adding",
        },
        {
            "question_ID": "Demo_2_I", "question": "Implement neg(x).",
            "ground_truth": "def neg(x): return -x", "history": repr(history[:2]),
            "mistake_agent": "Team Leader", "mistake_step": "1", "mistake_reason": "vague",
        },
    ]  # fmt: skip


def test_agentracer_importer_converts_each_run(tmp_path: Path) -> None:
    from tracegym.store.importers import agentracer
    from tracegym.tracer.semconv import OUTCOME_SPAN_NAME

    path = tmp_path / "tracertraj.json"
    path.write_text(json.dumps(_agentracer_document()))
    records = agentracer.convert(path, path.read_bytes())
    outcomes = [r for r in records if r["name"] == OUTCOME_SPAN_NAME]
    spans = [r for r in records if r["name"] != OUTCOME_SPAN_NAME]
    assert len(outcomes) == 2 and len({r["trace_id"] for r in spans}) == 2
    assert all(o["attributes"]["tracegym.outcome.success"] is False for o in outcomes)
    steps = [r for r in spans if r["attributes"].get(sc.STEP_INDEX) is not None]
    assert len(steps) == 5  # 3 entries, then 2 from the literal string
    first = [r for r in steps if r["trace_id"] == spans[0]["trace_id"]]
    assert [r["attributes"][sc.AGENT_NAME] for r in first] == ["Team Leader"] * 2 + ["Engineer"]
    labelled = [r for r in first if r["attributes"].get("tracegym.label.root_cause")]
    assert [r["attributes"][sc.STEP_INDEX] for r in labelled] == [2]
    assert records == agentracer.convert(path, path.read_bytes())  # stable ids


def test_agentracer_importer_end_to_end_and_ids_unread(tmp_path: Path) -> None:
    from tracegym.store.importers import FORMATS

    FORMATS.setdefault("agentracer", ("tracegym.store.importers.agentracer", (".json",)))
    document = _agentracer_document()
    document[0]["is_corrected"] = False
    path = tmp_path / "tracertraj.json"
    path.write_text(json.dumps(document))
    runs = _import("agentracer", path, tmp_path / "home")
    assert len(runs) == 2 and all(r.failed for r in runs)
    by_id = {source_run_id(r): r for r in runs}
    assert set(by_id) == {"Demo_1_I", "Demo_2_I"}
    assert by_id["Demo_1_I"].labels["mistake_step_index"] == 2
    results = attribute_runs(runs)
    scrubbed = json.loads(json.dumps(document).replace("attacked", "plain"))
    scrubbed[0]["question_ID"] = scrubbed[1]["question_ID"] = "renamed"
    path.write_text(json.dumps(scrubbed))
    again = attribute_runs(_import("agentracer", path, tmp_path / "home2"))
    assert [(a.agent, a.step, a.rule) for a in results] == [
        (a.agent, a.step, a.rule) for a in again
    ]


def test_agentracer_importer_rejects_malformed_input(tmp_path: Path) -> None:
    from tracegym.store.importers import ImportFormatError, agentracer

    path = tmp_path / "bad.json"
    for document, message in (
        ({"history": []}, "question"),
        ([{"question": "q", "history": "[{'content': "}], "Python literal"),
        ([{"question": "q", "history": [{"name": "A"}]}], "content"),
        ([{"question": "q", "history": [], "is_correct": "no"}], "true or false"),
        ("runs", "list"),
    ):
        path.write_text(json.dumps(document))
        with pytest.raises(ImportFormatError, match=message):
            agentracer.convert(path, path.read_bytes())
    corrected = [{"question": "q", "history": [{"content": "x"}], "is_corrected": True}]
    path.write_text(json.dumps(corrected))
    records = agentracer.convert(path, path.read_bytes())
    assert records[-1]["attributes"]["tracegym.outcome.success"] is True


def test_agentracer_end_to_end() -> None:
    if not (DATA / AGENTRACER).is_file():
        pytest.skip(f"shared data absent: {DATA / AGENTRACER} (AgenTracer TracerTraj-code)")
    import tempfile

    with tempfile.TemporaryDirectory() as home:
        from tracegym.store.importers import FORMATS

        FORMATS.setdefault("agentracer", ("tracegym.store.importers.agentracer", (".json",)))
        runs = _import("agentracer", DATA / AGENTRACER, Path(home))
    results = attribute_runs(runs)
    assert len(results) == len(runs) == 127
    lengths = {r.trace_id: sum(1 for s in r.steps if s.step_index is not None) for r in runs}
    gold = {r.trace_id: r.labels for r in runs}
    agents = steps = 0
    for result in results:
        assert set(json.loads(to_json_line(result))) == KEYS
        assert 0 <= result.step < lengths[result.trace_id]
        agents += gold[result.trace_id]["mistake_agent"] in (result.agent or "")
        steps += result.step == gold[result.trace_id]["mistake_step_index"]
    # a regression guard on the whole set (the untuned half alone is in the benchmark)
    assert agents / 127 > 0.7 and steps / 127 > 0.3


def test_an_overspent_subtask_is_blamed_where_the_overspend_began() -> None:
    """budget_waste on a subtask over its budget points at the first call successful runs do
    not make (the second search), not at the step where the budget was crossed; attribution
    then blames the turn that made that call."""
    from tracegym.analysis.detectors.budget import BudgetWaste
    from tracegym.tests.analysis.test_detectors import RunBuilder

    def run(searches: int, success: bool) -> tuple[Run, list[Step]]:
        b = RunBuilder("a task, and recommend a class", success=success)
        if searches:  # the runs whose user asks for a recommendation: one search succeeds
            b.start_subtask("side task: recommend a class",
                            **{sc.BUDGET_STEPS: 6, sc.BUDGET_EXCEEDED: searches > 3})  # fmt: skip
        calls = []
        for i in range(searches):
            b.llm(f"searching, attempt {i}")
            calls.append(b.tool("search_classes", {"q": f"class {i}"}, {"results": []}))
        return b.build(), calls

    population = [run(n, True)[0] for n in (0, 0, 0, 0, 1, 1)]  # search limit: 1 call
    failed, calls = run(6, False)
    findings = BudgetWaste().fit([*population, failed]).detect(failed)
    [subtask] = [f for f in findings if f.key == "budget_waste:subtask:side task"]
    assert subtask.position == calls[1].position  # the second search, not the crossing
    assert "budget_exceeded" in subtask.details["reasons"] and subtask.confidence == 0.8
    result = attribute(failed, [subtask])
    assert (result.position, result.rule) == (calls[1].position - 1, "finding")


@pytest.mark.slow
def test_detectors_on_do_not_lose_the_decisive_step_on_a_planted_agent(tmp_path: Path) -> None:
    """Planted seed 6 (side-task budget, poisoned memory; a tuning seed): with the detectors'
    findings, as `tracegym attribute` runs, every planted run is blamed at its decisive span,
    and never worse than without findings (before: the budget finding's crossing step and
    transient tool errors after the poisoned read won; 11 of 20)."""
    from tracegym.analysis.pipeline import default_detector_set, run_detectors
    from tracegym.store.store import Store
    from tracegym.tests.fixtures.planted import generate

    planted = generate(tmp_path / "home", 6)
    with Store(tmp_path / "home") as store:
        runs = load_runs(store)
    findings, errors = run_detectors(default_detector_set(), runs)
    assert not errors
    with_findings = {a.trace_id: a for a in attribute_runs(runs, findings)}
    bare = {a.trace_id: a for a in attribute_runs(runs)}
    by_trace = {r.trace_id: r for r in runs}
    scored = [t for t in planted.runs if t.decisive_span_id is not None]
    assert len({t.cause for t in scored}) == 2 and len(scored) >= 10
    hits = bare_hits = 0
    for truth in scored:
        gold = by_trace[truth.trace_id].by_span()[truth.decisive_span_id].step_index
        hits += with_findings[truth.trace_id].step == gold
        bare_hits += bare[truth.trace_id].step == gold
    assert hits == len(scored) and hits >= bare_hits
    # the chat turns the tracer writes are read (a reader that misses the message shape
    # leaves no substantive turn, and every run falls back to its last turn)
    assert not any(a.rule == "last_turn" for a in [*bare.values(), *with_findings.values()])
