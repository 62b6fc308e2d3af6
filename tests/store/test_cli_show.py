"""`tracegym show` tells a run's story; `traces` lists run ids, requests and first errors;
`tool_calls.error_message`; trace content never renders as Rich markup or emoji; flags show no
`<bool>` in help; the light commands import none of the heavy stages."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

import typer
from tracegym.cli import LAZY_COMMANDS, app
from tracegym.store.records import outcome_record, span_record, write_spool_file
from typer.testing import CliRunner

runner = CliRunner()
BASE = 1_764_460_800_000_000_000
TRACE = "cd" * 16
HOSTILE = "[red]x[/red] :x: \x1b[2J"  # markup, an emoji code, a terminal escape
LONG_RESULT = "slot " * 100 + "END-OF-RESULT"
STACK = "Traceback (most recent call last):\n  File \"agent.py\", line 3\nKeyError: 'booking-9'"


def _run(home: Path, *args: str):
    return runner.invoke(app, ["--home", str(home), *args])


def _genai(role: str, *parts: dict) -> dict:
    return {"role": role, "parts": list(parts)}


def _text(content: str) -> dict:
    return {"type": "text", "content": content}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """One failed run: a request with hostile content, two LLM calls (GenAI parts and the old
    shape), a tool call with a long result, a failing tool call, a memory read."""
    root, chat1, ok, bad, chat2, memory = (f"{i:02x}" * 8 for i in range(1, 7))
    op = "gen_ai.operation.name"
    records = [
        span_record(trace_id=TRACE, span_id=root, name="invoke_agent booking", start_ns=BASE,
                    end_ns=BASE + 9_000_000,
                    attributes={op: "invoke_agent", "gen_ai.agent.name": "booking",
                                "tracegym.run.id": "task-9",
                                "tracegym.input": json.dumps(
                                    {"user": 7, "message": f"move my booking {HOSTILE}"})}),
        span_record(trace_id=TRACE, span_id=chat1, parent_span_id=root, name="chat m",
                    start_ns=BASE + 1, end_ns=BASE + 1_000_000,
                    attributes={op: "chat", "tracegym.step.index": 0,
                                "gen_ai.usage.input_tokens": 12,
                                "gen_ai.input.messages": json.dumps([
                                    _genai("system", _text("You book rooms.")),
                                    _genai("user", _text(f"move my booking {HOSTILE}")),
                                ]),
                                "gen_ai.output.messages": json.dumps([_genai(
                                    "assistant", {"type": "tool_call", "id": "c1",
                                                  "name": "find_slots",
                                                  "arguments": {"day": "mon"}})])}),
        span_record(trace_id=TRACE, span_id=ok, parent_span_id=root,
                    name="execute_tool find_slots", start_ns=BASE + 2_000_000,
                    end_ns=BASE + 3_000_000,
                    attributes={op: "execute_tool", "gen_ai.tool.name": "find_slots",
                                "tracegym.step.index": 1,
                                "gen_ai.tool.call.arguments": '{"day": "mon"}',
                                "gen_ai.tool.call.result": LONG_RESULT}),
        span_record(trace_id=TRACE, span_id=bad, parent_span_id=root,
                    name="execute_tool get_booking", start_ns=BASE + 4_000_000,
                    end_ns=BASE + 5_000_000, status="ERROR",
                    status_message="KeyError: 'booking-9'",
                    events=[{"name": "exception", "time_ns": BASE + 5_000_000,
                             "attributes": {"exception.type": "KeyError",
                                            "exception.message": "'booking-9'",
                                            "exception.stacktrace": STACK}}],
                    attributes={op: "execute_tool", "gen_ai.tool.name": "get_booking",
                                "tracegym.step.index": 2, "error.type": "KeyError",
                                "gen_ai.tool.call.arguments": '{"booking_id": "booking-9"}'}),
        span_record(trace_id=TRACE, span_id=chat2, parent_span_id=root, name="chat m",
                    start_ns=BASE + 6_000_000, end_ns=BASE + 7_000_000,
                    attributes={op: "chat", "tracegym.step.index": 3,
                                "gen_ai.input.messages": json.dumps([
                                    {"role": "user", "content": "move my booking"},
                                    {"role": "assistant", "content": "looking"},
                                    {"role": "tool", "content": "no such booking"},
                                ]),
                                "gen_ai.output.messages": json.dumps(
                                    [{"role": "assistant", "content": "Sorry, I failed."}])}),
        span_record(trace_id=TRACE, span_id=memory, parent_span_id=root,
                    name="search_memory notes", start_ns=BASE + 7_500_000,
                    end_ns=BASE + 8_000_000,
                    attributes={op: "search_memory", "gen_ai.memory.store.id": "notes",
                                "gen_ai.memory.query.text": "booking-9",
                                "tracegym.memory.result.record_ids": ["n1", "n2"]}),
        outcome_record("task-9", time_ns=BASE + 10_000_000, success=False, reward=0.0,
                       source="test"),
    ]  # fmt: skip
    write_spool_file(tmp_path, records, "story")
    return tmp_path


def _gaps(home: Path, span_id: str = "04" * 8) -> None:
    member = {"trace_id": TRACE, "run_id": "task-9", "step": 2, "position": 3,
              "agent": "booking", "span_ids": [span_id, "02" * 8],
              "evidence": f"get_booking was called with an id nobody gave {HOSTILE}"}  # fmt: skip
    gap = {"id": "gap-1", "rank": 1, "name": "ungrounded_booking_id", "kind": "finding",
           "detector": "ungrounded_argument", "members": [member]}  # fmt: skip
    document = {"version": 1, "generated_at": "2026-11-30T05:13:20Z", "gaps": [gap]}
    (home / "gaps.json").write_text(json.dumps(document))


def _line(output: str, needle: str) -> str:
    return next(line for line in output.splitlines() if needle in line)


def test_show_tells_the_story(home: Path):
    _gaps(home)
    shown = _run(home, "show", "task-9")
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    lines = out.splitlines()
    assert "run task-9" in lines[0] and "failure" in lines[0] and "source test" in lines[0]
    assert "request: move my booking" in out
    # steps in order, each with its arguments and result or error message
    spans = out[out.index("#0 chat m") :]  # below the findings (which name a step too)
    order = [spans.index(s) for s in ("#0 chat m", "#1 execute_tool find_slots",
                                      "#2 execute_tool get_booking", "#3 chat m",
                                      "search_memory notes")]  # fmt: skip
    assert order == sorted(order)
    assert 'args: {"day": "mon"}' in out
    assert "result: slot slot" in out and "END-OF-RESULT" not in out and "chars)" in out
    error_at = lines.index(_line(spans, "#2 execute_tool get_booking"))
    assert "ERROR KeyError" in lines[error_at]
    assert 'args: {"booking_id": "booking-9"}' in lines[error_at + 1]
    assert "error: KeyError: 'booking-9'" in lines[error_at + 2]
    assert "Traceback" not in out  # the stack only with --full
    # LLM calls as chat lines, both message shapes
    assert "→ system: You book rooms." in out
    assert "← assistant: call find_slots(" in out and '"day": "mon"' in out
    second = out[out.index("#3 chat m") :]
    assert "→ tool: no such booking" in second and "← assistant: Sorry, I failed." in second
    assert "→ user: move my booking" not in second  # only what is new since the last reply
    # memory
    assert "query: booking-9" in out and "returned: n1, n2" in out
    # findings, with the decisive step marked on its span
    assert "findings of the last analysis (2026-11-30T05:13:20Z)" in out
    finding = _line(out, "gap 1 ungrounded_booking_id")
    assert "at step #2 execute_tool get_booking:" in finding  # no model call asked for it
    assert "decisive step of gap 1" in lines[error_at]
    assert "evidence for gap 1" in _line(out, "#0 chat m")


def test_show_full_prints_everything(home: Path):
    out = _run(home, "show", TRACE, "--full").stdout
    assert "END-OF-RESULT" in out and "chars)" not in out
    assert "Traceback (most recent call last):" in out and 'File "agent.py", line 3' in out
    second = out[out.index("#3 chat m") :]
    assert "→ user: move my booking" in second  # every message of the call


def test_show_without_analysis_and_by_prefix(home: Path):
    shown = _run(home, "show", TRACE[:10])
    assert shown.exit_code == 0, shown.output
    assert "no analysis yet" in shown.stdout
    _gaps(home)
    (home / "gaps.json").write_text(
        json.dumps({"version": 1, "generated_at": "2026-12-01T00:00:00Z", "gaps": []})
    )
    assert "puts this run in no gap" in _run(home, "show", "task-9").stdout
    assert _run(home, "show", "nope").exit_code == 2


def test_hostile_content_is_printed_as_text(home: Path):
    _gaps(home)
    query = "SELECT input ->> 'message' FROM spans WHERE operation = 'invoke_agent'"
    for args in (["show", "task-9"], ["show", "task-9", "--full"], ["traces"], ["sql", query]):
        result = _run(home, *args)
        assert result.exit_code == 0, result.output
        out = result.stdout
        assert "[red]x[/red] :x:" in out, args  # neither markup nor an emoji code rendered
        assert "❌" not in out and "\x1b" not in out, args
        assert "\\x1b[2J" in out, args  # the escape sequence shown, not sent to the terminal
    # a hostile run id given on the command line comes back as text in the error too
    missing = _run(home, "show", "[bold]zz[/bold] :x:")
    assert missing.exit_code == 2 and "[bold]zz[/bold] :x:" in missing.output


def test_traces_lists_run_ids_requests_and_first_errors(home: Path, tmp_path: Path):
    ok_trace = "ef" * 16
    write_spool_file(home, [
        span_record(trace_id=ok_trace, span_id="0a" * 8, name="invoke_agent booking",
                    start_ns=BASE - 10_000_000, end_ns=BASE - 9_000_000,
                    attributes={"gen_ai.operation.name": "invoke_agent",
                                "tracegym.run.id": "task-ok",
                                "tracegym.input": '"what is free on monday?"'}),
        outcome_record("task-ok", time_ns=BASE, success=True, reward=1.0, source="test"),
        # an imported run: the request is its first user message span, not the root's JSON
        span_record(trace_id="12" * 16, span_id="0b" * 8, name="invoke_agent imported",
                    start_ns=BASE - 20_000_000, end_ns=BASE - 19_000_000,
                    attributes={"gen_ai.operation.name": "invoke_agent",
                                "tracegym.run.id": "task-imported",
                                "tracegym.input": '{"domain": "retail", "turns": 3}'}),
        span_record(trace_id="12" * 16, span_id="0c" * 8, parent_span_id="0b" * 8,
                    name="message user", start_ns=BASE - 19_500_000, end_ns=BASE - 19_400_000,
                    attributes={"tracegym.message.role": "user",
                                "tracegym.input": "I want to exchange my keyboard"}),
    ], "second")  # fmt: skip
    listed = _run(home, "traces")
    assert listed.exit_code == 0, listed.output
    header = _line(listed.stdout, "run")
    for column in ("run", "trace", "request", "first error", "outcome"):
        assert column in header
    failed = _line(listed.stdout, "task-9")
    assert "cdcdcdcdcdcd" in failed and "failure" in failed
    assert "move my booking" in failed
    assert "get_booking: KeyError: 'booking-9'" in failed
    assert "what is free on monday?" in _line(listed.stdout, "task-ok")
    assert "I want to exchange my keyboard" in _line(listed.stdout, "task-imported")
    assert "request: I want to exchange my keyboard" in _run(home, "show", "task-imported").stdout
    only_failed = _run(home, "traces", "--failed").stdout
    assert "task-9" in only_failed and "task-ok" not in only_failed


def test_traces_prints_no_id_twice(tmp_path: Path):
    """A run whose id is its trace id shows it once: the trace column lists only trace ids
    that differ from the run id, and is left out when none does."""
    own, plain = "ab" * 16, "5e1c7a9b3d2f40e6a8b1c9d7e3f20a41"

    def root(trace_id: str, span_id: str, **attributes: str) -> dict:
        return span_record(trace_id=trace_id, span_id=span_id, name="invoke_agent a",
                           start_ns=BASE, end_ns=BASE + 1_000_000,
                           attributes={"gen_ai.operation.name": "invoke_agent",
                                       **attributes})  # fmt: skip

    write_spool_file(tmp_path, [root(plain, "01" * 8, **{"tracegym.run.id": plain})], "a")
    alone = _run(tmp_path, "traces").stdout
    assert alone.count("5e1c7a9b3d2f") == 1 and plain in alone
    assert " trace " not in _line(alone, "run")  # no column of ids the run column holds
    write_spool_file(tmp_path, [root(own, "02" * 8, **{"tracegym.run.id": "task-1"})], "b")
    both = _run(tmp_path, "traces").stdout
    assert "trace" in _line(both, "run")
    assert "abababababab" in _line(both, "task-1")
    assert _line(both, plain).count("5e1c7a9b3d2f") == 1


def test_error_message_columns(home: Path):
    rows = _run(home, "sql", "SELECT tool, error_message FROM tool_calls ORDER BY tool", "-f",
                "json").stdout  # fmt: skip
    assert json.loads(rows) == [
        {"tool": "find_slots", "error_message": None},
        {"tool": "get_booking", "error_message": "'booking-9'"},
    ]
    first = _run(home, "sql", "SELECT first_error FROM traces", "-f", "csv").stdout.split("\n")
    assert first[1] == "get_booking: KeyError: 'booking-9'"


def test_error_message_falls_back_to_the_status_message(tmp_path: Path):
    write_spool_file(tmp_path, [
        span_record(trace_id="aa" * 16, span_id="01" * 8, name="execute_tool pay",
                    start_ns=BASE, end_ns=BASE + 1, status="ERROR",
                    status_message="card declined", events=[{"name": "retry"}],
                    attributes={"gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": "pay"}),
    ], "s")  # fmt: skip
    out = _run(tmp_path, "sql", "SELECT error_message FROM tool_calls", "-f", "csv").stdout
    assert out.split("\n")[1] == "card declined"
    shown = _run(tmp_path, "show", "aa" * 16).stdout
    assert "error: error: card declined" not in shown and "error: card declined" in shown


def test_help_lists_every_command_and_no_bool_types():
    listed = runner.invoke(app, ["--help"])
    assert listed.exit_code == 0
    for names in LAZY_COMMANDS.values():
        for name in names:
            assert f" {name} " in listed.stdout, name
    for args in (["--help"], ["traces", "--help"], ["outcome", "--help"],
                 ["show", "--help"], ["envs", "list", "--help"]):  # fmt: skip
        out = runner.invoke(app, args).stdout
        assert "<bool>" not in out and "--help" in out, args
    assert "--full" in runner.invoke(app, ["show", "--help"]).stdout


@pytest.mark.parametrize("module", sorted(LAZY_COMMANDS))
def test_lazy_commands_name_what_each_module_registers(module: str):
    stage = typer.Typer()
    importlib.import_module(module).register(stage, lambda ctx, home: home, print)
    assert set(typer.main.get_group(stage).commands) == set(LAZY_COMMANDS[module])


def test_light_commands_import_no_heavy_stage(home: Path):
    """`traces`, `show` and `sql` leave analysis, synthesis, training, Polars and torch out."""
    heavy = ["polars", "torch", "transformers", "sentence_transformers", "sklearn",
             "tracegym.synthesis", "tracegym.training", "tracegym.analysis.pipeline"]  # fmt: skip
    for args in (["traces"], ["show", "task-9"], ["sql", "SELECT 1"]):
        code = (
            "import sys\nfrom tracegym.cli import app\n"
            "try:\n    app(prog_name='tracegym')\nexcept SystemExit:\n    pass\n"
            f"print('LOADED', [m for m in {heavy!r} if m in sys.modules])"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, "--home", str(home), *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "LOADED []" in done.stdout, (args, done.stdout[-300:])


def test_show_says_which_tool_calls_the_user_ran(tmp_path: Path):
    """tau2-bench's user-side tools (the user's phone) are marked as the user's, the agent's
    own calls are not."""
    root, mine, theirs = ("a1" * 8, "a2" * 8, "a3" * 8)
    op = "gen_ai.operation.name"

    def tool(span_id: str, name: str, start: int, **extra: str) -> dict:
        attributes = {op: "execute_tool", "gen_ai.tool.name": name, **extra}
        return span_record(
            trace_id=TRACE, span_id=span_id, parent_span_id=root, name=f"execute_tool {name}",
            start_ns=BASE + start, end_ns=BASE + start + 1, attributes=attributes,
        )  # fmt: skip

    agent = {op: "invoke_agent", "tracegym.run.id": "task-1"}
    records = [
        span_record(
            trace_id=TRACE,
            span_id=root,
            name="invoke_agent phone",
            start_ns=BASE,
            end_ns=BASE + 10,
            attributes=agent,
        ),
        tool(mine, "enable_roaming", 1),
        tool(theirs, "toggle_roaming", 3, **{"tracegym.tool.requested_by": "user"}),
    ]
    write_spool_file(tmp_path, records, "user-side")
    shown = _run(tmp_path, "show", "task-1")
    assert shown.exit_code == 0, shown.output
    assert "run by the user" in _line(shown.output, "toggle_roaming")
    assert "run by" not in _line(shown.output, "enable_roaming")


def test_dashboard_names_who_ran_a_tool_call():
    from tracegym.dashboards.pages import requested_by

    key = "tracegym.tool.requested_by"
    span = {"operation": "execute_tool", "attributes": json.dumps({key: "user"})}
    assert requested_by(span) == "user"
    assert requested_by({**span, "attributes": "{}"}) is None
    assert requested_by({**span, "attributes": json.dumps({key: "assistant"})}) is None
    assert requested_by({**span, "operation": "chat"}) is None
