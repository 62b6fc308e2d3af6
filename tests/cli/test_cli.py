"""The `tracegym` command, the spool summary and the bundled demo agent.

`tracegym.init` sets the global OpenTelemetry provider once per process, so commands that trace
(`demo`, a successful `outcome`) run in a subprocess; `summary`, `version` and every error path
run in-process through Typer's CliRunner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import tracegym as tg
from tracegym.cli import app
from tracegym.examples.support_agent import FLAWS, run_demo
from tracegym.summary import spool_files, summarize
from tracegym.tracer import semconv as sc
from typer.testing import CliRunner

runner = CliRunner()


def _cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m tracegym.cli ARGS` in a fresh interpreter, away from any OTLP endpoint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEGYM_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "tracegym.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _summary_json(home: Path, *extra: str) -> dict[str, Any]:
    result = runner.invoke(app, ["--home", str(home), "summary", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _without_run_ids(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "run_id"} for row in rows]


# summarize (pure) --------------------------------------------------------------------------------
def _span(trace: str, span: str, parent: str | None, op: str | None, end: int = 10, **attrs: Any):
    attributes = dict(attrs)
    if op is not None:
        attributes[sc.OPERATION] = op
    return {
        "v": 1,
        "trace_id": trace,
        "span_id": span,
        "parent_span_id": parent,
        "name": f"{op} x",
        "kind": "INTERNAL",
        "start_ns": end - 5,
        "end_ns": end,
        "status": "UNSET",
        "status_message": None,
        "attributes": attributes,
        "events": [],
        "links": [],
        "resource": {"service.name": "svc"},
        "scope": "tracegym",
    }


def _outcome(target: str, end: int, success: bool | None, reward: float | None, source="v"):
    attrs: dict[str, Any] = {sc.OUTCOME_TARGET: target, sc.OUTCOME_SOURCE: source}
    if success is not None:
        attrs[sc.OUTCOME_SUCCESS] = success
    if reward is not None:
        attrs[sc.OUTCOME_REWARD] = reward
    return _span("f" * 32, "e" * 16, None, sc.OP_OUTCOME, end, **attrs)


def test_summarize_counts_runs_tools_tokens_and_latest_outcomes():
    ta, tb, tc = "a" * 32, "b" * 32, "c" * 32
    tool_error = _span(ta, "03", "01", sc.OP_TOOL, **{sc.TOOL_NAME: "get_order"})
    tool_error["status"] = "ERROR"
    records = [
        _span(ta, "01", None, sc.OP_AGENT, **{sc.RUN_ID: "run-a"}),
        _span(ta, "02", "01", sc.OP_TOOL, **{sc.TOOL_NAME: "get_order"}),
        tool_error,
        _span(ta, "04", "01", sc.OP_TOOL, **{sc.TOOL_NAME: "refund", sc.ERROR_TYPE: "KeyError"}),
        _span(ta, "05", "01", sc.OP_CHAT, **{sc.INPUT_TOKENS: 10, sc.OUTPUT_TOKENS: 3}),
        _span(ta, "06", "01", sc.OP_AGENT, **{sc.AGENT_NAME: "sub"}),  # a sub-agent: no new run
        _span(tb, "11", None, sc.OP_AGENT),  # run id = trace id
        _span(tb, "12", "11", sc.OP_CHAT, **{sc.REQUEST_MODEL: "m1", sc.INPUT_TOKENS: 5}),
        _span(tc, "21", None, sc.OP_AGENT, **{sc.RUN_ID: "run-c"}),  # never judged
        _span(tc, "22", "21", None),  # a span of the application's own
        _outcome("run-a", 100, True, 1.0),
        _outcome("run-a", 200, False, 0.0, source="human"),  # later: this one counts
        _outcome(tb, 150, True, 0.5),  # by trace id
        _outcome("elsewhere", 150, None, None),  # a run this spool does not hold
    ]
    result = summarize(records)
    assert result["spans"] == len(records)
    assert sum(result["operations"].values()) == len(records)
    assert result["operations"][sc.OP_TOOL] == 3
    assert result["operations"]["(none)"] == 1
    assert result["operations"][sc.OP_OUTCOME] == 4
    assert result["traces"] == 3  # outcome spans are traces of their own and do not count
    assert result["runs"] == 3
    assert result["errors"] == 2
    assert result["tools"] == {
        "get_order": {"calls": 2, "errors": 1},
        "refund": {"calls": 1, "errors": 1},
    }
    assert result["llm"] == {
        "calls": 2,
        "input_tokens": 15,
        "output_tokens": 3,
        "models": {"m1": 1, "?": 1},
    }
    outcomes = result["outcomes"]
    assert outcomes["recorded"] == 4
    assert (outcomes["success"], outcomes["failure"], outcomes["unknown"]) == (1, 1, 1)
    assert outcomes["mean_reward"] == pytest.approx(0.25)
    assert outcomes["runs_without_outcome"] == 1
    assert outcomes["unmatched"] == 1
    assert outcomes["sources"] == {"v": 3, "human": 1}
    assert result["services"] == {"svc": len(records)}
    assert result["time"] == {"first_start_ns": 5, "last_end_ns": 200}


def test_summarize_nothing():
    result = summarize([])
    assert result["spans"] == result["runs"] == result["traces"] == 0
    assert result["outcomes"]["mean_reward"] is None
    assert result["time"] == {"first_start_ns": None, "last_end_ns": None}


def test_spool_files_counts_files_and_bytes(tmp_path: Path):
    assert spool_files(tmp_path) == {"files": 0, "bytes": 0}
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "a.jsonl").write_text("{}\n")
    (spool / "b.jsonl").write_text("{}\n{}\n")
    (spool / "notes.txt").write_text("not a spool file")
    assert spool_files(tmp_path) == {"files": 2, "bytes": 9}


# The demo agent -----------------------------------------------------------------------------------
def test_run_demo_is_deterministic_and_fails_for_the_scripted_reasons():
    with tg.testing.capture(capture_messages=True) as captured:
        first = run_demo(n_tasks=40, seed=7)
    second_seed = run_demo(n_tasks=40, seed=7)  # outside capture: tracing is a no-op here
    assert _without_run_ids(first) == _without_run_ids(second_seed)
    assert [row["task_id"] for row in first] == [f"T{i:03d}" for i in range(1, 41)]
    assert 0 < sum(row["success"] for row in first) < 40
    failed = Counter(row["flaw"] for row in first if not row["success"])
    assert set(failed) == set(FLAWS)  # every failure has a scripted cause, each one occurs

    spans = captured.spans
    by_trace: dict[int, list[Any]] = {}
    for span in spans:
        by_trace.setdefault(span.context.trace_id, []).append(span)
    runs = {
        span.attributes[sc.RUN_ID]: span.context.trace_id
        for span in spans
        if span.attributes.get(sc.OPERATION) == sc.OP_AGENT
    }
    assert set(runs) == {row["run_id"] for row in first}
    outcomes = captured.by_operation(sc.OP_OUTCOME)
    assert {o.attributes[sc.OUTCOME_TARGET] for o in outcomes} == set(runs)
    assert {o.attributes[sc.OUTCOME_SOURCE] for o in outcomes} == {"verifier"}

    def tools_in_order(run_id: str) -> list[tuple[str, str]]:
        tool_spans = [
            s for s in by_trace[runs[run_id]] if s.attributes.get(sc.OPERATION) == sc.OP_TOOL
        ]
        tool_spans.sort(key=lambda s: s.attributes[sc.STEP_INDEX])
        return [(s.attributes[sc.TOOL_NAME], s.attributes[sc.TOOL_ARGUMENTS]) for s in tool_spans]

    for row in first:
        names = [name for name, _ in tools_in_order(row["run_id"])]
        if row["flaw"] == "wrong_tool_order":
            assert names.index("refund_order") == 0 and "get_order" not in names
        if row["flaw"] == "ungrounded_argument":
            (arguments,) = [a for name, a in tools_in_order(row["run_id"]) if name == "get_order"]
            order_id = json.loads(arguments)["order_id"]
            chats = sorted(
                (
                    s
                    for s in by_trace[runs[row["run_id"]]]
                    if s.attributes.get(sc.OPERATION) == sc.OP_CHAT
                ),
                key=lambda s: s.attributes[sc.STEP_INDEX],
            )
            # the first model output that names the order id had not seen it in its input
            first = next(c for c in chats if order_id in c.attributes[sc.OUTPUT_MESSAGES])
            assert order_id not in first.attributes[sc.INPUT_MESSAGES]


def test_poisoned_note_is_read_back_by_a_later_run():
    with tg.testing.capture() as captured:
        rows = run_demo(n_tasks=40, seed=0)
    writes = captured.by_operation(sc.OP_MEMORY_UPDATE)
    reads = captured.by_operation(sc.OP_MEMORY_SEARCH)
    hashes = {w.attributes[sc.MEMORY_CONTENT_HASH]: w.attributes[sc.MEMORY_CONTENT] for w in writes}
    assert set(hashes.values()) == {"30", "90"}  # the right window, and the misread one
    poisoned = next(h for h, content in hashes.items() if content == "90")
    poisoned_reads = [r for r in reads if poisoned in r.attributes[sc.MEMORY_RESULT_HASHES]]
    assert poisoned_reads, "some run must read the poisoned note back"
    failed_runs = {row["run_id"] for row in rows if not row["success"]}
    run_of_trace = {
        s.context.trace_id: s.attributes[sc.RUN_ID] for s in captured.by_operation(sc.OP_AGENT)
    }
    assert any(run_of_trace[r.context.trace_id] in failed_runs for r in poisoned_reads)


# The command --------------------------------------------------------------------------------------
def test_demo_then_summary_counts_match(tmp_path: Path):
    home = tmp_path / "home"
    done = _cli(
        "--home", str(home), "demo", "--scripted", "--tasks", "6", "--seed", "3", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "6 support tickets" in done.stdout
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".tracegym").exists()  # --home honoured, nothing in the cwd

    with tg.testing.capture():
        expected = run_demo(n_tasks=6, seed=3)
    result = _summary_json(home)
    assert result["runs"] == 6
    assert result["operations"][sc.OP_AGENT] == 6
    assert result["operations"][sc.OP_OUTCOME] == 6
    assert result["outcomes"]["recorded"] == 6
    assert result["outcomes"]["success"] == sum(row["success"] for row in expected)
    assert result["outcomes"]["failure"] == sum(not row["success"] for row in expected)
    assert result["outcomes"]["runs_without_outcome"] == 0
    tools = result["tools"]
    assert tools["send_reply"]["calls"] == 6
    agent_tools = sum(v["calls"] for k, v in tools.items() if k != "send_reply")
    assert agent_tools == sum(row["tool_calls"] for row in expected)
    assert sum(v["errors"] for v in tools.values()) == sum(row["tool_errors"] for row in expected)
    assert result["llm"]["calls"] == sum(row["turns"] for row in expected)
    assert result["services"] == {"tracegym-demo": result["spans"]}
    assert result["files"] >= 1 and result["bytes"] > 0
    assert sum(result["operations"].values()) == result["spans"]
    assert result["spans"] == sum(1 for _ in _store_records(home))

    table = runner.invoke(app, ["summary", "--home", str(home)])  # --home after the command
    assert table.exit_code == 0, table.output
    for text in ("spans by operation", "tool calls", "send_reply", "outcomes", str(home)):
        assert text in table.stdout


def test_outcome_recorded_by_another_process_shows_up(tmp_path: Path):
    home = tmp_path / "home"
    assert (
        _cli("--home", str(home), "demo", "--scripted", "--tasks", "6", cwd=tmp_path).returncode
        == 0
    )
    before = _summary_json(home)
    run_id = _a_successful_run(home)
    done = _cli(
        "outcome", run_id, "--failure", "--reward", "0.25", "--source", "human",
        "--label", "reviewer=ann", "--label", "reason=rude", "--home", str(home),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert run_id in done.stdout

    after = _summary_json(home)
    assert after["outcomes"]["recorded"] == before["outcomes"]["recorded"] + 1
    assert after["outcomes"]["sources"]["human"] == 1
    assert after["outcomes"]["success"] == before["outcomes"]["success"] - 1  # overridden
    assert after["outcomes"]["failure"] == before["outcomes"]["failure"] + 1
    assert after["runs"] == before["runs"] == 6
    (record,) = [
        r for r in _store_records(home) if r["attributes"].get(sc.OUTCOME_SOURCE) == "human"
    ]
    attributes = record["attributes"]
    assert attributes[sc.OUTCOME_TARGET] == run_id
    assert attributes[sc.OUTCOME_SUCCESS] is False
    assert attributes[sc.OUTCOME_REWARD] == 0.25
    assert json.loads(attributes[sc.OUTCOME_LABELS]) == {"reviewer": "ann", "reason": "rude"}
    assert record["resource"]["service.name"] == "tracegym-cli"


def _store_records(home: Path) -> list[dict]:
    """Every record of the store (lake and spool): the CLI compacts the spool as it reads."""
    from tracegym.store.store import Store

    with Store(home) as store:
        return list(store.records())


def _a_successful_run(home: Path) -> str:
    from tracegym.store.store import Store

    with Store(home) as store:  # the spool has been compacted into the lake by now
        return next(
            r["attributes"][sc.OUTCOME_TARGET]
            for r in store.records()
            if r["attributes"].get(sc.OUTCOME_SUCCESS) is True
        )


@pytest.mark.parametrize(
    "args",
    [
        ["--home", "{missing}", "summary"],
        ["summary", "--home", "{missing}"],
        ["--home", "{missing}", "outcome", "run-1", "--success"],
        ["--home", "{file}", "summary"],
        ["--home", "{file}", "demo", "--scripted", "--tasks", "1"],
    ],
)
def test_bad_home_exits_2_with_a_message(tmp_path: Path, args: list[str]):
    (tmp_path / "a-file").write_text("not a directory")
    paths = {"missing": str(tmp_path / "missing"), "file": str(tmp_path / "a-file")}
    result = runner.invoke(app, [a.format(**paths) for a in args])
    assert result.exit_code == 2
    assert "error:" in result.output and "home" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "missing").exists()


def test_home_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRACEGYM_HOME", str(tmp_path / "nowhere"))
    result = runner.invoke(app, ["summary"])
    assert result.exit_code == 2
    assert str(tmp_path / "nowhere") in result.output.replace("\n", "")
    monkeypatch.setenv("TRACEGYM_HOME", str(tmp_path))
    result = runner.invoke(app, ["summary", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["spans"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["outcome", "run-1"], "--success or --failure"),
        (["outcome", "run-1", "--success", "--label", "novalue"], "key=value"),
        (["outcome", "run-1", "--reward", "nan"], "finite"),
        (["outcome", "  ", "--success"], "RUN_ID"),
    ],
)
def test_outcome_rejects_bad_input(tmp_path: Path, args: list[str], message: str):
    result = runner.invoke(app, ["--home", str(tmp_path), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "spool").exists()  # nothing recorded


def test_usage_errors_exit_2(tmp_path: Path):
    assert (
        runner.invoke(
            app, ["--home", str(tmp_path), "demo", "--scripted", "--tasks", "0"]
        ).exit_code
        == 2
    )
    assert runner.invoke(app, ["outcome", "r", "--reward", "high"]).exit_code == 2
    assert runner.invoke(app, ["no-such-command"]).exit_code == 2


def test_version():
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"tracegym {tg.__version__}"
