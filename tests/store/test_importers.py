"""Importers: real benchmark runs from ../shared/data and small hand-built fixtures.

The shared-data tests skip (with the reason) where `../shared/data/` is absent; the fixture
tests (tau2-bench, SWE-agent, openai-chat, bad input) always run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracegym.store.importers import (
    MAX_BYTES_ENV,
    ImportFormatError,
    converter,
    gunzip,
    import_path,
    openai_chat,
    otlp_json,
    swe_agent,
    tau,
    whowhen,
)
from tracegym.store.importers import chat as chat_mod
from tracegym.store.store import Store
from tracegym.tracer import semconv as sc

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AGENTRX = DATA / "agentrx-tau-retail"
FULL = AGENTRX / "tau_dataset_full.json"
FAILED = AGENTRX / "tau_dataset_failed.json"
TRUTH = AGENTRX / "tau_ground_truth.json"
WHOWHEN = DATA / "whowhen-algorithm-generated"

needs_agentrx = pytest.mark.skipif(
    not FULL.is_file(), reason=f"AgentRx tau-bench data not found at {AGENTRX}"
)
needs_whowhen = pytest.mark.skipif(
    not WHOWHEN.is_dir(), reason=f"Who&When data not found at {WHOWHEN}"
)


def _attr(name: str) -> str:
    """SQL for one attribute of the `attributes` JSON column."""
    return f"json_extract_string(attributes, '$.\"{name}\"')"


def _spans(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["name"] != sc.OUTCOME_SPAN_NAME]


def _outcomes(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["name"] == sc.OUTCOME_SPAN_NAME]


def _spool_files(home: Path) -> list[Path]:
    spool = home / "spool"
    return sorted(spool.iterdir()) if spool.is_dir() else []


# AgentRx tau-bench retail ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    if not FULL.is_file():
        pytest.skip(f"AgentRx tau-bench data not found at {AGENTRX}")
    home = tmp_path_factory.mktemp("tau-full")
    report = import_path("tau-bench", FULL, home)
    assert (report.files, report.runs) == (1, 100)
    return Store(home)


@needs_agentrx
def test_agentrx_full_file_runs_and_successes(full_store: Store) -> None:
    total, successes = full_store.sql(
        "select count(*), count(*) filter (where success) from traces"
    ).fetchall()[0]
    assert (total, successes) == (100, 73)
    source = json.loads(FULL.read_bytes())
    messages = sum(len(run["traj"]) for run in source)
    tool_messages = sum(m["role"] == "tool" for run in source for m in run["traj"])
    assistant = sum(m["role"] == "assistant" for run in source for m in run["traj"])
    spans, tools, llm = full_store.sql(
        "select sum(spans), sum(tool_calls), sum(llm_calls) from traces"
    ).fetchall()[0]
    assert spans == messages + 100  # one span per message, plus each run's root
    assert (tools, llm) == (tool_messages, assistant)
    rewards = full_store.sql("select count(*) from traces where reward = 1.0").fetchall()[0][0]
    assert rewards == 73
    agents = full_store.sql("select distinct agent, root_name from traces").fetchall()
    assert agents == [("tau-bench", "invoke_agent tau-bench")]


@needs_agentrx
def test_agentrx_step_indices_are_traj_positions(full_store: Store) -> None:
    """Every message j of a run is the one span with step_index j, and its source `index`."""
    source = {(r["task_id"], r["trial"]): r for r in json.loads(FULL.read_bytes())}
    roots = dict(
        full_store.sql(
            f"""select trace_id, {_attr("tracegym.source.task_id")} || '-' ||
                       {_attr("tracegym.source.trial")}
                from spans where parent_span_id is null"""
        ).fetchall()
    )
    steps = full_store.sql(
        f"""select trace_id, list(step_index order by step_index),
                   list({_attr("tracegym.message.index")}::int order by step_index),
                   list({_attr("tracegym.message.role")} order by step_index)
            from spans where step_index is not null group by trace_id"""
    ).fetchall()
    assert len(steps) == 100
    for trace_id, indices, own, roles in steps:
        task, trial = map(int, roots[trace_id].split("-"))
        traj = source[(task, trial)]["traj"]
        assert indices == list(range(len(traj)))
        assert own == [m["index"] for m in traj] == [j + 1 for j in range(len(traj))]
        assert roles == [m["role"] for m in traj]


@needs_agentrx
def test_agentrx_tool_calls_carry_arguments_results_and_errors(full_store: Store) -> None:
    rows = full_store.sql(
        "select tool, call_id, arguments, result, status, error_type from tool_calls"
    ).fetchall()
    assert all(r[1] and r[1].startswith("call_") for r in rows)
    assert all(r[2] is not None and r[3] is not None for r in rows)
    errors = [r for r in rows if r[4] == "ERROR"]
    assert errors and all(r[3].startswith("Error") and r[5] == "ToolError" for r in errors)
    assert all(not r[3].startswith("Error") for r in rows if r[4] != "ERROR")
    one = full_store.sql(
        """select arguments, result from tool_calls
           where tool = 'find_user_id_by_name_zip' and result = 'yusuf_rossi_9620' limit 1"""
    ).fetchall()
    assert json.loads(one[0][0]) == {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}


@needs_agentrx
def test_agentrx_labels_attach_to_outcomes_and_steps(tmp_path: Path) -> None:
    report = import_path("tau-bench", FAILED, tmp_path, labels=TRUTH)
    assert report.runs == 29
    store = Store(tmp_path)
    total, failures, labelled = store.sql(
        "select count(*), count(*) filter (where not success), count(outcome_labels) from traces"
    ).fetchall()[0]
    assert (total, failures, labelled) == (29, 29, 29)
    truth = {str(t["trajectory_id"]): t for t in json.loads(TRUTH.read_bytes())}
    runs = store.sql(
        f"""select t.trace_id, {_attr("tracegym.source.task_id")}, t.outcome_labels
            from traces t join spans s on s.span_id = t.root_span_id"""
    ).fetchall()
    checked = 0
    mismatched_roles = []
    for trace_id, task_id, labels_json in runs:
        labels = json.loads(labels_json)
        expected = truth[task_id]
        assert labels["summary"] == expected["failure_summary"]
        assert labels["root_cause"] == expected["root_cause"]
        assert [f["failure_id"] for f in labels["failures"]] == [
            f["failure_id"] for f in expected["failures"]
        ]
        for failure in labels["failures"]:
            assert failure["step_index"] == failure["step_number"] - 1
            span = store.sql(
                f"""select {_attr("tracegym.message.role")},
                           {_attr("tracegym.message.index")}, {_attr("tracegym.label.failures")}
                    from spans where trace_id = ? and step_index = ?""",
                params=[trace_id, failure["step_index"]],
            ).fetchall()
            assert len(span) == 1, (task_id, failure["step_number"])  # the span exists, once
            role, own_index, marked = span[0]
            assert int(own_index) == failure["step_number"]  # AgentRx's number = the `index` field
            ids = [f["failure_id"] for f in json.loads(marked)]
            assert failure["failure_id"] in ids
            if role != failure["failed_agent"].lower():
                mismatched_roles.append((int(task_id), failure["step_number"]))
            checked += 1
    assert checked == sum(len(t["failures"]) for t in truth.values()) == 39
    # Evidence for the 1-based indexing: the message at step_number - 1 is spoken by the labelled
    # agent in 38 of 39 failures; the exception is a "system failure" label on the last message.
    assert mismatched_roles == [(80, 26)]
    roots = store.sql(
        f"select count(*) from spans where {_attr('tracegym.label.root_cause')} = 'true'"
    ).fetchall()[0][0]
    assert roots == sum(
        any(f["failure_id"] == t["root_cause"]["failure_id"] for f in t["failures"])
        for t in truth.values()
    )


@needs_agentrx
def test_agentrx_same_run_same_ids_in_either_file() -> None:
    full = tau.convert(FULL, FULL.read_bytes())
    failed = tau.convert(FAILED, FAILED.read_bytes())
    again = tau.convert(FULL, FULL.read_bytes())
    assert full == again
    full_traces = {r["trace_id"] for r in _spans(full)}
    failed_traces = {r["trace_id"] for r in _spans(failed)}
    assert len(full_traces) == 100 and len(failed_traces) == 29
    assert len(full_traces & failed_traces) == 27  # the 27 failures both files hold, verbatim
    assert {r["span_id"] for r in full} & {r["span_id"] for r in failed}


@needs_agentrx
def test_importing_twice_adds_nothing(tmp_path: Path) -> None:
    first = import_path("tau-bench", FULL, tmp_path)
    second = import_path("tau-bench", FULL, tmp_path)
    assert first.runs == 100
    assert (second.files, second.runs, second.already_imported) == (0, 0, [FULL])
    store = Store(tmp_path)
    assert store.sql("select count(*), sum(spans) from traces").fetchall()[0][0] == 100
    assert store.sql("select count(*) from outcomes").fetchall()[0][0] == 100


@needs_agentrx
def test_truncated_json_names_the_file_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "src" / "truncated.json"
    bad.parent.mkdir()
    data = FULL.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    home = tmp_path / "home"
    with pytest.raises(ImportFormatError, match=r"truncated\.json.*invalid JSON") as caught:
        import_path("tau-bench", bad, home)
    assert caught.value.path == bad
    assert _spool_files(home) == []
    # A folder with one good and one truncated file: all or nothing.
    (bad.parent / "good.json").write_bytes(FAILED.read_bytes())
    with pytest.raises(ImportFormatError, match="truncated"):
        import_path("tau-bench", bad.parent, home)
    assert _spool_files(home) == []
    assert not (home / "imports").exists() or not any((home / "imports").iterdir())


@needs_whowhen
@needs_agentrx
def test_wrong_format_is_a_clear_error(tmp_path: Path) -> None:
    who = WHOWHEN / "1.json"
    with pytest.raises(ImportFormatError, match=r"1\.json.*tau-bench.*looks like whowhen"):
        import_path("tau-bench", who, tmp_path)
    with pytest.raises(ImportFormatError, match=r"tau_dataset_full\.json.*looks like tau-bench"):
        import_path("whowhen", FULL, tmp_path)
    with pytest.raises(ImportFormatError, match=r"simulations"):
        import_path("tau2-bench", FULL, tmp_path)
    with pytest.raises(ImportFormatError, match=r"trajectory"):
        import_path("swe-agent", FULL, tmp_path)
    assert _spool_files(tmp_path) == []


# Who&When ------------------------------------------------------------------------------------


@needs_whowhen
def test_whowhen_folder(tmp_path: Path) -> None:
    report = import_path("whowhen", WHOWHEN, tmp_path)
    assert (report.files, report.runs) == (126, 126)  # LICENSE is not a .json file
    store = Store(tmp_path)
    total, successes, failures, labelled = store.sql(
        """select count(*), count(*) filter (where success), count(*) filter (where not success),
                  count(*) filter (where json_extract_string(outcome_labels, '$.mistake_agent')
                                   is not null)
           from traces"""
    ).fetchall()[0]
    assert (total, successes, failures, labelled) == (126, 0, 126, 126)
    assert store.sql("select distinct agent from traces").fetchall() == [("CaptainAgent",)]

    sources = [json.loads(p.read_bytes()) for p in sorted(WHOWHEN.glob("*.json"))]
    names = {h["name"] for s in sources for h in s["history"]}
    kept = {
        r[0]
        for r in store.sql(
            "select distinct agent from spans where step_index is not null"
        ).fetchall()
    }
    assert kept == names and "Computer_terminal" in kept
    steps = store.sql("select count(*) from spans where step_index is not null").fetchall()[0][0]
    assert steps == sum(len(s["history"]) for s in sources)

    # The mistake step (0-based in the source) is the span with that step index.
    rows = store.sql(
        f"""select s.step_index, s.agent, {_attr("tracegym.label.failed_agent")},
                   json_extract_string(t.outcome_labels, '$.mistake_step')
            from spans s join traces t using (trace_id)
            where {_attr("tracegym.label.root_cause")} = 'true'"""
    ).fetchall()
    assert len(rows) == 126
    assert all(step == int(label) for step, _, _, label in rows)
    same_agent = sum(agent == mistake for _, agent, mistake, _ in rows)
    assert same_agent == 123  # 3 files (14, 15, 59) name an agent other than the step's speaker


@needs_whowhen
def test_whowhen_rejects_labels_file(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="--labels is not supported"):
        import_path("whowhen", WHOWHEN / "1.json", tmp_path, labels=WHOWHEN / "2.json")


# tau2-bench (fixture in the results format of sierra-research/tau2-bench) ----------------------


def _tau2_results() -> dict[str, Any]:
    def msg(role: str, turn: int, second: int, **extra: Any) -> dict[str, Any]:
        return {
            "role": role,
            "turn_idx": turn,
            "timestamp": f"2025-06-10T12:00:{second:02d}.000000",
            **extra,
        }

    solved = [
        msg("assistant", 0, 0, content="Hi! How can I help you today?", tool_calls=None),
        msg("user", 1, 2, content="Cancel my reservation ABC123, user mia_li_3668."),
        msg(
            "assistant",
            2,
            3,
            content=None,
            tool_calls=[
                {
                    "id": "call_1",
                    "name": "get_reservation_details",
                    "arguments": {"reservation_id": "ABC123"},
                    "requestor": "assistant",
                }
            ],
            usage={"prompt_tokens": 900, "completion_tokens": 20},
        ),
        msg(
            "tool",
            3,
            4,
            id="call_1",
            content='{"reservation_id": "ABC123", "status": "booked"}',
            requestor="assistant",
            error=False,
        ),
        msg(
            "assistant",
            4,
            6,
            content=None,
            tool_calls=[
                {
                    "id": "call_2",
                    "name": "cancel_reservation",
                    "arguments": {"reservation_id": "ABC123"},
                    "requestor": "assistant",
                }
            ],
        ),
        msg("tool", 5, 7, id="call_2", content="ok", requestor="assistant", error=False),
        msg("assistant", 6, 8, content="Your reservation ABC123 is cancelled."),
        msg("user", 7, 9, content="Thanks! ###STOP###"),
    ]
    failed = [
        msg("assistant", 0, 0, content="Hi! How can I help you today?"),
        msg("user", 1, 1, content="Cancel reservation XYZ999."),
        msg(
            "assistant",
            2,
            2,
            content=None,
            tool_calls=[
                {
                    "id": "call_9",
                    "name": "cancel_reservation",
                    "arguments": {"reservation_id": "XYZ999"},
                    "requestor": "assistant",
                }
            ],
        ),
        msg("tool", 3, 3, id="call_9", content="Reservation not found", error=True),
        msg("assistant", 4, 4, content="Sorry, I could not find it."),
    ]
    return {
        "timestamp": "2025-06-10T12:00:00",
        "info": {
            "num_trials": 1,
            "agent_info": {"implementation": "llm_agent", "llm": "gpt-4.1"},
            "user_info": {"implementation": "user_simulator", "llm": "gpt-4.1"},
            "environment_info": {"domain_name": "airline"},
        },
        "tasks": [
            {
                "id": "0",
                "user_scenario": {
                    "instructions": {
                        "domain": "airline",
                        "reason_for_call": "cancel a reservation",
                        "task_instructions": "Cancel ABC123.",
                    }
                },
            },
            {"id": "1", "user_scenario": {"instructions": "Cancel XYZ999."}},
        ],
        "simulations": [
            {
                "id": "sim-a",
                "task_id": "0",
                "trial": 0,
                "start_time": "2025-06-10T12:00:00.000000",
                "end_time": "2025-06-10T12:00:10.000000",
                "termination_reason": "user_stop",
                "reward_info": {"reward": 1.0, "reward_basis": ["DB"]},
                "messages": solved,
            },
            {
                "id": "sim-b",
                "task_id": "1",
                "trial": 0,
                "start_time": "2025-06-10T12:00:00.000000",
                "end_time": "2025-06-10T12:00:05.000000",
                "termination_reason": "agent_stop",
                "reward_info": {"reward": 0.0},
                "messages": failed,
            },
        ],
    }


def test_tau2_bench_results(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_tau2_results()))
    labels = tmp_path / "labels.json"
    labels.write_text(
        json.dumps(
            [
                {
                    "trajectory_id": "sim-b",
                    "failures": [
                        {
                            "failure_id": 1,
                            "step_number": 3,
                            "failure_category": "Invention of New Information",
                            "failed_agent": "Assistant",
                        }
                    ],
                    "root_cause": {"failure_id": 1},
                    "failure_summary": "cancelled without looking the reservation up",
                }
            ]
        )
    )
    records = converter("tau2-bench")(path, path.read_bytes(), labels=labels)
    spans = _spans(records)
    roots = [s for s in spans if s["parent_span_id"] is None]
    assert [r["name"] for r in roots] == ["invoke_agent llm_agent"] * 2
    solved = [s for s in spans if s["trace_id"] == roots[0]["trace_id"]]
    assert [s["attributes"].get(sc.STEP_INDEX) for s in solved] == [None, *range(8)]
    by_step = {s["attributes"].get(sc.STEP_INDEX): s for s in solved}
    assert by_step[2]["name"] == "chat gpt-4.1"
    assert by_step[2]["attributes"][sc.INPUT_TOKENS] == 900
    tool = by_step[3]
    assert tool["name"] == "execute_tool get_reservation_details"
    assert tool["attributes"][sc.TOOL_CALL_ID] == "call_1"
    assert json.loads(tool["attributes"][sc.TOOL_ARGUMENTS]) == {"reservation_id": "ABC123"}
    assert tool["attributes"][chat_mod.MESSAGE_INDEX] == 3  # tau2's own turn_idx
    # Real timestamps: the run starts at start_time, message 7 at its own timestamp.
    assert roots[0]["start_ns"] == chat_mod.parse_time_ns("2025-06-10T12:00:00")
    assert by_step[7]["start_ns"] == chat_mod.parse_time_ns("2025-06-10T12:00:09")
    assert roots[0]["end_ns"] == chat_mod.parse_time_ns("2025-06-10T12:00:10")
    assert json.loads(roots[0]["attributes"][sc.INPUT])["task_instructions"] == "Cancel ABC123."
    failed_tool = next(
        s for s in spans if s["trace_id"] == roots[1]["trace_id"] and s["name"].startswith("exec")
    )
    assert failed_tool["status"] == "ERROR"  # tau2's error flag, not the text
    assert failed_tool["attributes"][sc.ERROR_TYPE] == "ToolError"
    outcomes = {o["attributes"][sc.OUTCOME_TARGET]: o["attributes"] for o in _outcomes(records)}
    assert len(outcomes) == 2
    assert sorted(a[sc.OUTCOME_SUCCESS] for a in outcomes.values()) == [False, True]
    labelled = [a for a in outcomes.values() if sc.OUTCOME_LABELS in a]
    assert len(labelled) == 1 and labelled[0][sc.OUTCOME_SUCCESS] is False
    marked = [s for s in spans if chat_mod.LABEL_CATEGORY in s["attributes"]]
    assert [(s["name"], s["attributes"][sc.STEP_INDEX]) for s in marked] == [("chat gpt-4.1", 2)]

    import_path("tau2-bench", path, tmp_path / "home")
    store = Store(tmp_path / "home")
    assert store.sql(
        "select count(*), count(*) filter (where success), sum(tool_calls), sum(errors) from traces"
    ).fetchall() == [(2, 1, 3, 1)]


# SWE-agent (fixture in the .traj format of SWE-agent 1.x) ----------------------------------------


def _swe_traj(resolved: bool | None = None) -> dict[str, Any]:
    steps = [
        (
            "I'll start by finding the file that defines the separability matrix.",
            'find_file "separable.py"',
            'Found 1 matches for "separable.py" in /astropy__astropy:\n'
            "/astropy__astropy/astropy/modeling/separable.py",
            0.31,
        ),
        (
            "Let me open it and look at _cstack.",
            "open astropy/modeling/separable.py 240",
            "[File: /astropy__astropy/astropy/modeling/separable.py (317 lines total)]\n"
            "242:        cright[-right.shape[0]:, -right.shape[1]:] = 1",
            0.12,
        ),
        (
            "The right matrix should be copied, not set to 1. Fixing it.",
            "edit 245:245\n        cright[-right.shape[0]:, -right.shape[1]:] = right\nend_of_edit",
            "File updated. Please review the changes.",
            0.54,
        ),
        ("The fix is in place; submitting.", "submit", "", 1.2),
    ]
    info: dict[str, Any] = {
        "exit_status": "submitted",
        "submission": "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py",
        "model_stats": {"instance_cost": 0.42, "tokens_sent": 51234, "api_calls": 4},
        "swe_agent_version": "1.0.1",
    }
    if resolved is not None:
        info["resolved"] = resolved
    return {
        "environment": "main",
        "trajectory": [
            {
                "response": f"{thought}\n\n```\n{action}\n```",
                "thought": thought,
                "action": action,
                "observation": observation,
                "execution_time": seconds,
                "state": {"open_file": "n/a", "working_dir": "/astropy__astropy"},
                "query": [{"role": "system", "content": "SETTING: ..."}],
                "extra_info": {},
            }
            for thought, action, observation, seconds in steps
        ],
        "history": [
            {
                "role": "system",
                "content": "SETTING: You are an autonomous programmer.",
                "agent": "main",
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<issue>separability_matrix is wrong</issue>"}
                ],
                "agent": "main",
            },
        ],
        "info": info,
        "replay_config": json.dumps({"agent": {"model": {"name": "gpt-4o"}}}),
    }


def test_swe_agent_traj(tmp_path: Path) -> None:
    path = tmp_path / "astropy__astropy-12907.traj"
    path.write_text(json.dumps(_swe_traj()))
    records = swe_agent.convert(path, path.read_bytes())
    assert _outcomes(records) == []  # SWE-agent does not know whether it resolved the issue
    spans = _spans(records)
    root = spans[0]
    assert root["parent_span_id"] is None and root["name"] == "invoke_agent swe-agent"
    assert root["attributes"][sc.INPUT] == "<issue>separability_matrix is wrong</issue>"
    assert root["attributes"]["tracegym.source.instance_id"] == "astropy__astropy-12907"
    steps = [s for s in spans if s["attributes"].get(sc.OPERATION) == sc.OP_STEP]
    assert [s["attributes"][sc.STEP_INDEX] for s in steps] == [0, 1, 2, 3]
    assert [s["name"] for s in steps] == ["step find_file", "step open", "step edit", "step submit"]
    for step in steps:
        children = [s for s in spans if s["parent_span_id"] == step["span_id"]]
        ops = sorted(c["attributes"][sc.OPERATION] for c in children)
        assert ops == [sc.OP_CHAT, sc.OP_TOOL]
        assert {c["attributes"][sc.STEP_INDEX] for c in children} == {
            step["attributes"][sc.STEP_INDEX]
        }
        assert all(
            step["start_ns"] <= c["start_ns"] <= c["end_ns"] <= step["end_ns"] for c in children
        )
    edit = next(s for s in spans if s["name"] == "execute_tool edit")
    assert edit["attributes"][sc.TOOL_ARGUMENTS].startswith("edit 245:245\n")
    assert edit["attributes"][sc.TOOL_RESULT] == "File updated. Please review the changes."
    assert edit["end_ns"] - edit["start_ns"] == 540_000_000  # execution_time
    chat = next(s for s in spans if s["name"] == "chat gpt-4o")
    assert chat["attributes"][sc.REQUEST_MODEL] == "gpt-4o"

    resolved = tmp_path / "resolved" / "astropy__astropy-12907.traj"
    resolved.parent.mkdir()
    resolved.write_text(json.dumps(_swe_traj(resolved=True)))
    outcome = _outcomes(swe_agent.convert(resolved, resolved.read_bytes()))
    assert [o["attributes"][sc.OUTCOME_SUCCESS] for o in outcome] == [True]

    report = tmp_path / "report.json"
    report.write_text(
        json.dumps({"resolved_ids": [], "unresolved_ids": ["astropy__astropy-12907"]})
    )
    outcome = _outcomes(swe_agent.convert(path, path.read_bytes(), labels=report))
    assert [o["attributes"][sc.OUTCOME_SUCCESS] for o in outcome] == [False]

    home = tmp_path / "home"
    import_path("swe-agent", path, home)
    store = Store(home)
    assert store.sql(
        "select count(*), sum(tool_calls), sum(llm_calls), any_value(success) from traces"
    ).fetchall() == [(1, 4, 4, None)]
    tools = store.sql("select tool from tool_calls order by step_index").fetchall()
    assert [t[0] for t in tools] == ["find_file", "open", "edit", "submit"]


def test_swe_agent_missing_action(tmp_path: Path) -> None:
    doc = _swe_traj()
    del doc["trajectory"][2]["action"]
    path = tmp_path / "x.traj"
    path.write_text(json.dumps(doc))
    with pytest.raises(ImportFormatError, match=r"x\.traj \(record trajectory 2\): missing field"):
        swe_agent.convert(path, path.read_bytes())


def test_swe_agent_folder_skips_a_demonstration_and_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "trajs"
    folder.mkdir()
    (folder / "a__a-1.traj").write_text(json.dumps(_swe_traj()))
    (folder / "b__b-2.traj").write_text(json.dumps(_swe_traj(resolved=False)))
    demo = _swe_traj()
    del demo["trajectory"]  # a demonstration: the chat history only
    (folder / "demo.traj").write_text(json.dumps(demo))
    home = tmp_path / "home"
    report = import_path("swe-agent", folder, home)
    assert report.files == 2 and report.runs == 2
    assert [(p.name, "'trajectory'" in why) for p, why in report.skipped] == [("demo.traj", True)]
    assert Store(home).sql("select count(*) from traces").fetchall() == [(2,)]
    # a real format error still imports nothing
    broken = _swe_traj()
    del broken["trajectory"][0]["action"]
    (folder / "c__c-3.traj").write_text(json.dumps(broken))
    with pytest.raises(ImportFormatError, match="c__c-3"):
        import_path("swe-agent", folder, tmp_path / "other")
    assert not (tmp_path / "other" / "imports").exists()


def test_swe_agent_cli_names_the_skipped_file(tmp_path: Path) -> None:
    from tracegym.cli import app
    from typer.testing import CliRunner

    demo = _swe_traj()
    del demo["trajectory"]
    (tmp_path / "demo.traj").write_text(json.dumps(demo))
    (tmp_path / "x__x-1.traj").write_text(json.dumps(_swe_traj()))
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "import", "swe-agent",
                                      str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "imported 1 run (" in result.output
    assert f"skipped {tmp_path / 'demo.traj'}: a demonstration" in result.output


@pytest.mark.parametrize(
    ("observation", "error"),
    [
        ('Traceback (most recent call last):\n  File "x.py", line 1\nNameError: name', True),
        ("Your proposed edit has introduced new syntax error(s). Please read this", True),
        ("E999 IndentationError\nThis is how your edit would have looked: syntax errors", True),
        ("make: *** [all] Error 2\ncommand exited with code 2", True),
        ("Exit code: 1", True),
        ("Exit code: 0", False),
        ("File updated. Please review the changes.", False),
        ("242:    raise ValueError('no traceback here')", False),
    ],
)
def test_swe_agent_error_observations_fail_their_span(
    tmp_path: Path, observation: str, error: bool
) -> None:
    doc = _swe_traj()
    doc["trajectory"][2]["observation"] = observation
    path = tmp_path / "x.traj"
    path.write_text(json.dumps(doc))
    spans = _spans(swe_agent.convert(path, path.read_bytes()))
    edit = next(s for s in spans if s["name"] == "execute_tool edit")
    assert (edit["status"] == "ERROR") is error
    assert (edit["attributes"].get(sc.ERROR_TYPE) is not None) is error
    others = [s for s in spans if s["name"].startswith("execute_tool ") and s is not edit]
    assert all(s["status"] != "ERROR" for s in others)
    if error:
        assert edit["status_message"] and edit["status_message"] in observation


# openai-chat ---------------------------------------------------------------------------------


def _chat_run(**extra: Any) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "You are a weather bot."},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
                    },
                    {
                        "id": "c3",
                        "type": "function",
                        "function": {"name": "clock", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c2", "content": "Error: Rome is unavailable"},
            {"role": "tool", "tool_call_id": "c1", "content": "18C, cloudy"},
            {"role": "assistant", "content": [{"type": "text", "text": "Paris: 18C, cloudy."}]},
        ],
        **extra,
    }


def test_openai_chat_json_and_jsonl(tmp_path: Path) -> None:
    runs = [
        _chat_run(
            id="r1",
            outcome={
                "success": False,
                "reward": 0.5,
                "labels": {
                    "failures": [
                        {
                            "step_index": 3,
                            "failure_category": "Tool failure",
                            "failed_agent": "tool",
                        }
                    ]
                },
            },
        ),
        _chat_run(agent="weather-bot", model="gpt-4o-mini"),
    ]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    records = openai_chat.convert(path, path.read_bytes())
    spans = _spans(records)
    first = [s for s in spans if s["trace_id"] == spans[0]["trace_id"]]
    by_step = {s["attributes"].get(sc.STEP_INDEX): s for s in first}
    assert first[0]["attributes"][sc.RUN_ID] == "r1"
    assert first[0]["attributes"][sc.INPUT] == "Weather in Paris and Rome?"
    assert first[0]["attributes"][sc.OUTPUT] == "Paris: 18C, cloudy."
    assert [by_step[j]["name"] for j in range(6)] == [
        "step system",
        "step user",
        "chat",
        "execute_tool weather",
        "execute_tool weather",
        "chat",
    ]
    # Parallel calls match their results by id, whatever the order of the answers.
    assert json.loads(by_step[3]["attributes"][sc.TOOL_ARGUMENTS]) == {"city": "Rome"}
    assert by_step[3]["status"] == "ERROR"
    assert by_step[3]["attributes"][chat_mod.LABEL_CATEGORY] == "Tool failure"
    assert json.loads(by_step[4]["attributes"][sc.TOOL_ARGUMENTS]) == {"city": "Paris"}
    assert by_step[4]["status"] == "UNSET"
    # A call nobody answered: a tool span without a step index or result.
    orphans = [s for s in first if s["name"] == "execute_tool clock"]
    assert len(orphans) == 1 and sc.STEP_INDEX not in orphans[0]["attributes"]
    assert sc.TOOL_RESULT not in orphans[0]["attributes"]
    second = [s for s in spans if s["trace_id"] != spans[0]["trace_id"]]
    assert second[0]["name"] == "invoke_agent weather-bot"
    assert any(s["name"] == "chat gpt-4o-mini" for s in second)
    outcomes = _outcomes(records)
    assert len(outcomes) == 1 and outcomes[0]["attributes"][sc.OUTCOME_REWARD] == 0.5

    lines = tmp_path / "runs.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in runs) + "\n\n")
    assert openai_chat.convert(lines, lines.read_bytes()) == records

    lines.write_text(json.dumps(runs[0]) + "\n" + '{"messages": [}\n')
    with pytest.raises(ImportFormatError, match=r"runs\.jsonl \(record line 2\)"):
        openai_chat.convert(lines, lines.read_bytes())


def test_openai_chat_bad_runs(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    cases = [
        ([{"messages": []}, {"msgs": []}], r"record run 1\): missing field 'messages'"),
        ([{"messages": [{"content": "hi"}]}], r"record run 0\): message 0 has no role"),
        ([{"role": "user", "content": "hi"}], r"wrap the message list"),
        ([{"messages": [], "outcome": {"success": "yes"}}], r"outcome.success"),
        (
            [{"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}],
            r"message 0: tool call 0 has no function name",
        ),
        ({"simulations": []}, r"looks like tau2-bench"),
    ]
    for doc, message in cases:
        path.write_text(json.dumps(doc))
        with pytest.raises(ImportFormatError, match=message):
            openai_chat.convert(path, path.read_bytes())


# Bad input, any format -----------------------------------------------------------------------


def test_bad_tau_bench_runs_name_the_record(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    good = {"task_id": 1, "trial": 0, "reward": 1.0, "traj": [{"role": "user", "content": "x"}]}
    cases = [
        (
            [good, {"task_id": 2, "reward": 0.0}],
            r"runs\.json \(record run 1\): missing field 'traj'",
        ),
        ([good, {"traj": [], "reward": 0.0}], r"record run 1\): missing field 'task_id'"),
        ([{"task_id": 1, "traj": []}], r"record run 0\): missing field 'reward'"),
        ([{"task_id": 1, "traj": [], "reward": "high"}], r"'reward' should be a number"),
        ([{**good, "traj": [{"role": "user"}, "hello"]}], r"message 1 should be an object"),
        ([{**good, "traj": [{"role": "assistant", "tool_calls": "x"}]}], r"tool_calls should be"),
        ("nope", r"expected a JSON list of tau-bench runs"),
    ]
    for doc, message in cases:
        path.write_text(json.dumps(doc))
        with pytest.raises(ImportFormatError, match=message):
            tau.convert(path, path.read_bytes())
    path.write_bytes(b"\xff\xfe[")
    with pytest.raises(ImportFormatError, match="not UTF-8"):
        tau.convert(path, path.read_bytes())


def test_bad_labels_file(tmp_path: Path) -> None:
    runs = tmp_path / "runs.json"
    runs.write_text(
        json.dumps(
            [
                {
                    "task_id": 1,
                    "trial": t,
                    "reward": 0.0,
                    "traj": [{"role": "user", "content": "x"}],
                }
                for t in (0, 1)
            ]
        )
    )
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps([{"failures": []}]))
    with pytest.raises(ImportFormatError, match=r"labels\.json \(record label 0\)"):
        tau.convert(runs, runs.read_bytes(), labels=labels)
    labels.write_text(json.dumps([{"trajectory_id": 1, "failures": [{"step_number": 1}]}]))
    with pytest.raises(ImportFormatError, match="names 2 runs"):
        tau.convert(runs, runs.read_bytes(), labels=labels)
    labels.write_text(json.dumps([{"trajectory_id": "1-1", "failures": [{"step_number": 1}]}]))
    records = tau.convert(runs, runs.read_bytes(), labels=labels)
    labelled = [o for o in _outcomes(records) if sc.OUTCOME_LABELS in o["attributes"]]
    assert [o["attributes"][sc.OUTCOME_TARGET].split("/")[1] for o in labelled] == ["1-1"]


def test_whowhen_fixture_and_missing_fields(tmp_path: Path) -> None:
    doc = {
        "is_correct": False,
        "question": "How many?",
        "question_ID": "q-1",
        "level": "1",
        "ground_truth": "8",
        "history": [
            {"content": "plan", "role": "assistant", "name": "Planner_Expert"},
            {"content": "exitcode: 0\nCode output: 4", "role": "user", "name": "Computer_terminal"},
            {"content": "TERMINATE", "role": "user", "name": "Verifier_Expert"},
        ],
        "mistake_agent": "Planner_Expert",
        "mistake_step": "0",
        "mistake_reason": "wrong plan",
        "system_prompt": {"Planner_Expert": "You plan."},
    }
    path = tmp_path / "1.json"
    path.write_text(json.dumps(doc))
    records = whowhen.convert(path, path.read_bytes())
    spans = _spans(records)
    assert [s["name"] for s in spans] == [
        "invoke_agent CaptainAgent",
        "invoke_agent Planner_Expert",
        "invoke_agent Computer_terminal",
        "invoke_agent Verifier_Expert",
    ]
    assert spans[1]["attributes"][chat_mod.LABEL_AGENT] == "Planner_Expert"
    assert chat_mod.LABEL_AGENT not in spans[2]["attributes"]
    (outcome,) = _outcomes(records)
    labels = json.loads(outcome["attributes"][sc.OUTCOME_LABELS])
    assert labels["mistake_step_index"] == 0 and labels["ground_truth"] == "8"
    assert outcome["attributes"][sc.OUTCOME_SUCCESS] is False
    for broken, message in (
        ({k: v for k, v in doc.items() if k != "history"}, "missing field 'history'"),
        ({**doc, "history": [{"role": "user"}]}, r"record history 0\): missing field 'content'"),
        ({**doc, "is_correct": "no"}, "is_correct should be"),
    ):
        path.write_text(json.dumps(broken))
        with pytest.raises(ImportFormatError, match=message):
            whowhen.convert(path, path.read_bytes())


def test_whowhen_hand_crafted_half_reads_is_corrected_and_is_a_failure_by_default(
    tmp_path: Path,
) -> None:
    """The Magentic-One half spells the outcome `is_corrected`; a log saying neither fails."""
    history = [
        {"content": "Plan: look it up.", "role": "Orchestrator (thought)"},
        {"content": "I found 3.", "role": "WebSurfer"},
    ]
    base = {
        "question": "How many?",
        "history": history,
        "mistake_agent": "WebSurfer",
        "mistake_step": "1",
    }
    for extra, success in (({"is_corrected": True}, True), ({}, False)):
        path = tmp_path / "1.json"
        path.write_text(json.dumps({**base, **extra}))
        records = whowhen.convert(path, path.read_bytes())
        (outcome,) = _outcomes(records)
        assert outcome["attributes"][sc.OUTCOME_SUCCESS] is success
        assert _spans(records)[0]["name"] == "invoke_agent Magentic-One"
    path.write_text(json.dumps({**base, "is_corrected": "yes"}))
    with pytest.raises(ImportFormatError, match="is_corrected should be"):
        whowhen.convert(path, path.read_bytes())


def test_agentracer_is_a_registered_format(tmp_path: Path) -> None:
    step = {"step": 0, "name": "Engineer", "role": "assistant", "content": "def f(): return 1"}
    run = {
        "question_ID": "q1",
        "question": "Write f.",
        "ground_truth": "def f(): ...",
        "history": repr([step]),  # a Python literal, as the source writes it
        "mistake_agent": "Engineer",
        "mistake_step": "0",
        "mistake_reason": "wrong",
    }
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([run]))
    report = import_path("agentracer", path, tmp_path / "home")
    assert (report.runs, report.files) == (1, 1)


# Any JSON at all: an ImportFormatError or records, never another exception -------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "tool_calls",
                    "traj",
                    "task_id",
                    "reward",
                    "messages",
                    "id",
                    "function",
                    "name",
                    "arguments",
                    "tool_call_id",
                    "history",
                    "trajectory",
                    "action",
                    "simulations",
                    "question",
                    "trial",
                    "info",
                    "outcome",
                    "success",
                    "mistake_step",
                ]
            ),
            children,
            max_size=6,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=_json_values,
    fmt=st.sampled_from(["tau-bench", "tau2-bench", "whowhen", "swe-agent", "openai-chat"]),
)
def test_any_json_gives_records_or_a_format_error(doc: Any, fmt: str) -> None:
    path = Path(f"/nonexistent/fuzz.{'traj' if fmt == 'swe-agent' else 'json'}")
    try:
        records = converter(fmt)(path, json.dumps(doc).encode())
    except ImportFormatError as exc:
        assert str(path) in str(exc)
    else:
        assert all(r["trace_id"] and r["span_id"] for r in records)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _mutated(doc: Any, path: tuple, replacement: Any, delete: bool) -> Any:
    doc = json.loads(json.dumps(doc))
    if not path:
        return replacement
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    return doc


_VALID = {
    "tau-bench": lambda: [
        {
            "task_id": 3,
            "trial": 0,
            "reward": 0.0,
            "info": {"task": {"instruction": "do it", "user_id": "u"}},
            "traj": _chat_run()["messages"],
        }
    ],
    "tau2-bench": _tau2_results,
    "swe-agent": _swe_traj,
    "openai-chat": lambda: [_chat_run(id="r", outcome={"success": True})],
}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fmt=st.sampled_from(sorted(_VALID)))
def test_mutated_valid_input_gives_records_or_a_format_error(data: Any, fmt: str) -> None:
    doc = _VALID[fmt]()
    path = data.draw(st.sampled_from(_paths(doc)))
    delete = bool(path) and data.draw(st.booleans())
    doc = _mutated(doc, path, data.draw(_json_values), delete)
    source = Path(f"/nonexistent/fuzz.{'traj' if fmt == 'swe-agent' else 'json'}")
    try:
        records = converter(fmt)(source, json.dumps(doc).encode())
    except ImportFormatError as exc:
        assert str(source) in str(exc)
    else:
        assert all(r["trace_id"] and r["span_id"] for r in records)


# Secrets: every importer goes through the one redaction path -------------------------------
#
# `tracegym import otlp-json` stored every secret shape that `tracegym collect` of the same body
# redacted, and so did the other importers. Each test below puts the whole corpus into every
# text field of a valid file of its format where the file still converts (one file per field),
# imports the folder with redaction off (proving those fields reach the spool) and on.

from tracegym.tracer.redact import REDACTED  # noqa: E402

from tests.chaos.secret_corpus import INNOCENT, SECRETS  # noqa: E402
from tests.store.test_medagentbench import _doc as _medagentbench_doc  # noqa: E402

_SECRET_TEXT = "\n\n".join(text for _, text, _ in SECRETS)
_INNOCENT_TEXT = "\n\n".join(INNOCENT)


def _otlp_request() -> dict[str, Any]:
    def value(text: str) -> dict[str, Any]:
        return {"stringValue": text}

    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "deployment.note", "value": value("r")}]},
                "scopeSpans": [
                    {
                        "scope": {"name": "app"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "n",
                                "kind": 1,
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000001000000000",
                                "attributes": [
                                    {"key": "note", "value": value("a")},
                                    {"key": "list", "value": {"arrayValue": {"values": [
                                        value("b"),
                                    ]}}},
                                    {"key": "map", "value": {"kvlistValue": {"values": [
                                        {"key": "inner", "value": value("c")},
                                    ]}}},
                                ],
                                "events": [
                                    {
                                        "name": "e",
                                        "timeUnixNano": "1700000000500000000",
                                        "attributes": [{"key": "detail", "value": value("d")}],
                                    }
                                ],
                                "links": [
                                    {
                                        "traceId": "5b8efff798038103d269b633813fc60d",
                                        "spanId": "eee19b7ec3c1b175",
                                        "attributes": [{"key": "why", "value": value("f")}],
                                    }
                                ],
                                "status": {"code": 2, "message": "m"},
                            }
                        ],
                    }
                ],
            }
        ]
    }  # fmt: skip


_WHOWHEN = {
    "is_correct": False,
    "question": "How many?",
    "question_ID": "q-1",
    "ground_truth": "8",
    "history": [
        {"content": "plan", "role": "assistant", "name": "Planner_Expert"},
        {"content": "exitcode: 0\nCode output: 4", "role": "user", "name": "Computer_terminal"},
    ],
    "mistake_agent": "Planner_Expert",
    "mistake_step": "0",
    "mistake_reason": "wrong plan",
}
_AGENTRACER = [
    {
        "question_ID": "q1",
        "question": "Write f.",
        "ground_truth": "def f(): ...",
        "history": repr([{"step": 0, "name": "Engineer", "role": "assistant", "content": "x"}]),
        "mistake_agent": "Engineer",
        "mistake_step": "0",
        "mistake_reason": "wrong",
    }
]
# format -> (a valid document, where a file of it goes under its variant's folder)
_FORMAT_DOCS: dict[str, tuple[Any, str]] = {
    "otlp-json": (_otlp_request, "trace.json"),
    "openai-chat": (_VALID["openai-chat"], "runs.json"),
    "tau-bench": (_VALID["tau-bench"], "results.json"),
    "tau2-bench": (_tau2_results, "results.json"),
    "swe-agent": (_swe_traj, "run.traj"),
    "whowhen": (lambda: _WHOWHEN, "1.json"),
    "agentracer": (lambda: _AGENTRACER, "runs.json"),
    "medagentbench": (_medagentbench_doc, "gpt-x/medagentbench-std/overall.json"),
}


def _text_variants(fmt: str, folder: Path, text: str) -> int:
    """Write, under `folder`, one file of `fmt` per string field of its valid document with
    `text` in place of that field, keeping only the files that still convert; returns how many
    were written."""
    make, name = _FORMAT_DOCS[fmt]
    doc = make()
    written = 0
    for i, path in enumerate(p for p in _paths(doc) if _is_text(doc, p)):
        target = folder / f"v{i}" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(_mutated(doc, path, text, delete=False)))
        try:
            converter(fmt)(target, target.read_bytes())
        except ImportFormatError:
            target.unlink()
            continue
        written += 1
    return written


def _is_text(doc: Any, path: tuple) -> bool:
    """A string field (an OTLP attribute's key is a name, not text: a key naming a password
    has its whole value redacted)."""
    if path and path[-1] == "key":
        return False
    value = doc
    for step in path:
        value = value[step]
    return isinstance(value, str)


def _spool_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in _spool_files(home))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(_FORMAT_DOCS))
def test_secret_corpus_never_reaches_the_spool_through_any_importer(
    tmp_path: Path, fmt: str
) -> None:
    folder = tmp_path / "in"
    assert _text_variants(fmt, folder, _SECRET_TEXT) > 0
    bare = import_path(fmt, folder, tmp_path / "bare", redact=False)
    raw = _spool_bytes(tmp_path / "bare")
    secrets = [(name, json.dumps(secret)[1:-1].encode()) for name, _, secret in SECRETS]
    carried = [name for name, secret in secrets if secret in raw]
    assert carried == [name for name, _, _ in SECRETS]  # the fields reach the spool
    report = import_path(fmt, folder, tmp_path / "home")
    assert (report.files, report.spans) == (bare.files, bare.spans)
    raw = _spool_bytes(tmp_path / "home")
    assert [name for name, secret in secrets if secret in raw] == []
    assert REDACTED.encode() in raw


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(_FORMAT_DOCS))
def test_innocent_corpus_arrives_intact_through_every_importer(tmp_path: Path, fmt: str) -> None:
    folder = tmp_path / "in"
    assert _text_variants(fmt, folder, _INNOCENT_TEXT) > 0
    import_path(fmt, folder, tmp_path / "home")
    raw = _spool_bytes(tmp_path / "home")
    assert REDACTED.encode() not in raw
    for text in INNOCENT:
        assert json.dumps(text, ensure_ascii=False)[1:-1].encode() in raw, text


# Bounded memory: a limit on input size, gzip unpacked under it, JSON lines a line at a time ---
#
# A 45 MB JSON file took 3 GB of memory and a 2 MB gzip 4.1 GB (a bomb: it
# was unpacked whole). Small limits stand in for the default here.


def _otlp_lines(count: int, trace: int = 1) -> bytes:
    lines = []
    for i in range(count):
        request = _otlp_request()
        span = request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        span["traceId"], span["spanId"] = f"{trace:032x}", f"{i + 1:016x}"
        lines.append(json.dumps(request))
    return ("\n".join(lines) + "\n").encode()


def _cli_import(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    from tracegym.cli import app
    from typer.testing import CliRunner

    home = str(tmp_path / "home")
    return CliRunner().invoke(app, ["--home", home, "import", *args], env=env)


def _nothing_written(home: Path) -> bool:
    imports = home / "imports"
    return not _spool_files(home) and (not imports.exists() or not any(imports.iterdir()))


def _gzip_bomb(unpacked: int) -> bytes:
    """An OTLP/JSON request whose span name unpacks to `unpacked` bytes, gzip-compressed."""
    import gzip

    request = _otlp_request()
    request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["name"] = "a" * unpacked
    return gzip.compress(json.dumps(request).encode(), compresslevel=9)


def test_a_file_over_the_limit_is_refused_in_one_line_and_nothing_is_imported(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(_otlp_lines(2))  # small: under the limit
    (folder / "b.jsonl").write_bytes(_otlp_lines(40, trace=2))
    limit = str(len(_otlp_lines(2)) * 4)
    result = _cli_import(tmp_path, "otlp-json", str(folder), env={MAX_BYTES_ENV: limit})
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
    assert "b.jsonl" in result.output and f"limit of {limit} bytes" in result.output
    assert _nothing_written(tmp_path / "home")
    flag = _cli_import(tmp_path, "otlp-json", str(folder), "--max-bytes", limit)
    assert flag.exit_code == 2 and "b.jsonl" in flag.output
    assert _nothing_written(tmp_path / "home")
    result = _cli_import(tmp_path, "otlp-json", str(folder))  # the default limit takes both
    assert result.exit_code == 0, result.output
    assert "imported 2 runs (42 spans) from 2 files" in result.output


def test_a_gzip_bomb_is_refused_without_unpacking_it_whole(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(_gzip_bomb(4 << 20))  # 4 MB unpacked from a few KB
    assert bomb.stat().st_size < 64 << 10
    result = _cli_import(tmp_path, "otlp-json", str(bomb), env={MAX_BYTES_ENV: str(1 << 20)})
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output
    assert "unpacks to over the import limit" in result.output
    assert _nothing_written(tmp_path / "home")
    with pytest.raises(ImportFormatError, match="unpacks to over"):
        gunzip(bomb, bomb.read_bytes(), 1 << 20)
    assert len(gunzip(bomb, bomb.read_bytes(), 5 << 20)) > 4 << 20  # under the limit: unpacked
    report = import_path("otlp-json", bomb, tmp_path / "home2", max_bytes=5 << 20)
    assert report.spans == 1


def test_json_lines_are_converted_as_they_are_read(tmp_path: Path) -> None:
    """The records of the first line come out before a later line is parsed: a broken third
    line is met only after them (the whole file used to be parsed first)."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(_otlp_lines(2) + b'{"resourceSpans": [\n')
    stream = otlp_json.iter_records(path, path.read_bytes())
    assert next(stream)["span_id"] == f"{1:016x}"
    assert next(stream)["span_id"] == f"{2:016x}"
    with pytest.raises(ImportFormatError, match="line 3"):
        next(stream)
    chat = tmp_path / "c.jsonl"
    chat.write_text(json.dumps(_chat_run(id="r1")) + "\n" + "{broken\n")
    records = openai_chat.iter_records(chat, chat.read_bytes())
    assert next(records)["trace_id"]
    with pytest.raises(ImportFormatError, match="line 2"):
        list(records)
