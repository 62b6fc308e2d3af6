"""The store's commands: sql (formats, read-only refusal), traces, show, compact, import,
collect."""

from __future__ import annotations

import csv
import io
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

from tracegym.cli import app
from tracegym.store.records import outcome_record, span_record, write_spool_file
from typer.testing import CliRunner

runner = CliRunner()
BASE = 1_764_460_800_000_000_000


def _run(home: Path, *args: str):
    return runner.invoke(app, ["--home", str(home), *args])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """One failed run: agent -> tool (error) and llm, with an outcome."""
    trace = "ab" * 16
    records = [
        span_record(trace_id=trace, span_id="01" * 8, name="invoke_agent support",
                    start_ns=BASE, end_ns=BASE + 5_000_000,
                    attributes={"gen_ai.operation.name": "invoke_agent",
                                "gen_ai.agent.name": "support", "tracegym.run.id": "task-7"}),
        span_record(trace_id=trace, span_id="02" * 8, parent_span_id="01" * 8,
                    name="execute_tool refund", start_ns=BASE + 1, end_ns=BASE + 2_000_000,
                    status="ERROR",
                    attributes={"gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": "refund", "tracegym.step.index": 0,
                                "error.type": "KeyError",
                                "gen_ai.tool.call.arguments": '{"order": "<b>x</b>"}'}),
        span_record(trace_id=trace, span_id="03" * 8, parent_span_id="01" * 8,
                    name="chat m", start_ns=BASE + 3_000_000, end_ns=BASE + 4_000_000,
                    attributes={"gen_ai.operation.name": "chat", "tracegym.step.index": 1,
                                "gen_ai.usage.input_tokens": 7}),
        outcome_record("task-7", time_ns=BASE + 6_000_000, success=False, reward=0.0,
                       source="test"),
    ]  # fmt: skip
    write_spool_file(tmp_path, records, "fixture")
    return tmp_path


def test_sql_formats(home: Path, tmp_path: Path):
    query = "SELECT tool, error_type, arguments FROM tool_calls"
    table = _run(home, "sql", query)
    assert table.exit_code == 0 and "refund" in table.stdout and "1 row" in table.stdout
    as_csv = _run(home, "sql", query, "--format", "csv")
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert rows == [
        ["tool", "error_type", "arguments"],
        ["refund", "KeyError", '{"order": "<b>x</b>"}'],
    ]
    row = {"tool": "refund", "error_type": "KeyError", "arguments": '{"order": "<b>x</b>"}'}
    as_json = _run(home, "sql", query, "-f", "json")
    assert json.loads(as_json.stdout) == [row]  # one JSON array
    as_lines = _run(home, "sql", query, "-f", "jsonl")
    assert [json.loads(line) for line in as_lines.stdout.splitlines()] == [row]
    none = _run(home, "sql", "SELECT tool FROM tool_calls WHERE false", "-f", "json")
    assert json.loads(none.stdout) == []
    assert _run(home, "sql", "SELECT tool FROM tool_calls WHERE false", "-f", "jsonl").stdout == ""
    out = tmp_path / "out.parquet"
    done = _run(home, "sql", query, "--format", "parquet", "--output", str(out))
    assert done.exit_code == 0 and out.stat().st_size > 0
    import duckdb

    assert duckdb.sql(f"SELECT tool FROM '{out}'").fetchall() == [("refund",)]
    assert _run(home, "sql", query, "--format", "parquet").exit_code == 2  # needs --output


def test_sql_refuses_writes_and_reports_bad_sql(home: Path):
    refused = _run(home, "sql", "DROP VIEW spans")
    assert refused.exit_code == 2 and "read-only" in refused.output
    bad = _run(home, "sql", "SELECT nope FROM spans")
    assert bad.exit_code == 2 and "nope" in bad.output and "Traceback" not in bad.output


def test_traces_and_show(home: Path):
    listed = _run(home, "traces")
    assert listed.exit_code == 0 and "abababab" in listed.stdout and "failure" in listed.stdout
    for key in ("task-7", "abababab", "ab" * 16):
        shown = _run(home, "show", key)
        assert shown.exit_code == 0, shown.output
        lines = shown.stdout.splitlines()
        assert "failure" in lines[0] and "source test" in lines[0]
        tool_line = next(line for line in lines if "execute_tool refund" in line)
        assert "#0" in tool_line and "ERROR KeyError" in tool_line
        assert lines.index(tool_line) > next(
            i for i, line in enumerate(lines) if "invoke_agent support" in line
        )
    missing = _run(home, "show", "ffff")
    assert missing.exit_code == 2 and "no run" in missing.output


def test_compact_moves_the_spool(home: Path):
    done = _run(home, "compact")
    assert done.exit_code == 0 and "compacted 1 spool file, 4 spans" in done.stdout
    assert not list((home / "spool").glob("*.jsonl"))
    assert _run(home, "sql", "SELECT count(*) FROM spans", "-f", "csv").stdout.split() == [
        "count_star()", "3"
    ]  # fmt: skip


def test_import_command(tmp_path: Path):
    runs = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
         "outcome": {"success": True}},
    ]  # fmt: skip
    source = tmp_path / "chats.json"
    source.write_text(json.dumps(runs))
    home = tmp_path / "home"
    done = _run(home, "import", "openai-chat", str(source))
    assert done.exit_code == 0, done.output
    assert "imported 1 run (" in done.stdout
    again = _run(home, "import", "openai-chat", str(source))
    assert "already imported" in again.stdout
    assert _run(home, "import", "nonsense", str(source)).exit_code == 2
    assert _run(home, "import", "openai-chat", str(tmp_path / "missing.json")).exit_code == 2
    broken = tmp_path / "broken.json"
    broken.write_text('[{"messages": [')
    failed = _run(home, "import", "openai-chat", str(broken))
    assert failed.exit_code == 2 and "broken.json" in failed.output


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_collect_receives_otlp_json(tmp_path: Path):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracegym.cli", "--home", str(tmp_path), "collect",
         "--port", str(port), "--token", "s3cret"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": "cd" * 16, "spanId": "ef" * 8, "name": "execute_tool lookup",
            "startTimeUnixNano": str(BASE), "endTimeUnixNano": str(BASE + 1000),
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}},
            ],
        }]}]}]}).encode()  # fmt: skip
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/traces", data=body,
            headers={"Content-Type": "application/json", "Authorization": "Bearer s3cret"},
        )  # fmt: skip
        for _ in range(100):  # wait for the receiver to listen
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    assert response.status == 200
                break
            except urllib.error.URLError:
                time.sleep(0.1)
        else:
            pytest.fail(f"receiver never answered: {proc.stderr.read() if proc.poll() else ''}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    done = _run(tmp_path, "sql", "SELECT tool FROM tool_calls", "-f", "csv")
    assert done.stdout.split() == ["tool", "lookup"]


def _send(port: int, content_length: int, data: bytes) -> socket.socket:
    """A POST to /v1/traces announcing `content_length` bytes, of which only `data` is sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)  # a hang guard
    sock.sendall(
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {content_length}\r\n\r\n".encode()
        + data
    )
    return sock


def _status(sock: socket.socket) -> int:
    with sock:
        return int(sock.recv(64).split(b" ")[1])


def _wait_listening(port: int, proc: subprocess.Popen) -> None:
    for _ in range(200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                return
        except urllib.error.URLError:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
    pytest.fail("the receiver never listened")


def test_collect_limits_reach_the_receiver(tmp_path: Path):
    """--max-body-bytes and --body-deadline are the running server's limits: each answer below
    would differ under the defaults (20 MiB, 30 s). The byte budget's waits and 503s are
    tested on the receiver itself (tests/chaos/test_receiver_hostile.py); that the flag reaches
    it is the next test's."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracegym.cli", "--home", str(tmp_path), "collect",
         "--port", str(port), "--max-body-bytes", "100", "--max-buffered-bytes", "100",
         "--body-deadline", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_listening(port, proc)
        assert _status(_send(port, 101, b"")) == 413  # refused before any byte is read

        # A body trickled a byte every 0.1 s never stalls (10 s): only the deadline can cut it
        # while it still flows (80 bytes of 100 at most, then the test gives up).
        with _send(port, 100, b"{") as trickle:
            trickle.settimeout(0.1)
            for _ in range(80):
                try:
                    answer = trickle.recv(64)
                    break
                except TimeoutError:
                    trickle.sendall(b" ")
            else:
                pytest.fail("no answer to a body still arriving: the deadline did not cut it")
        assert answer.startswith(b"HTTP/1.1 408"), answer

    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_collect_passes_its_limits_to_the_receiver(tmp_path: Path, monkeypatch):
    """Every limit flag reaches the `Receiver` the command builds (parsed sizes, seconds)."""
    from tracegym.store import receiver as receiver_module

    built: dict[str, Any] = {}

    class Recorded:
        def __init__(self, home: Any, **options: Any) -> None:
            built.update(options, home=home)

        def serve_forever(self) -> None:
            raise KeyboardInterrupt

        def stop(self) -> None:
            built["stopped"] = True

    monkeypatch.setattr(receiver_module, "Receiver", Recorded)
    done = runner.invoke(app, ["--home", str(tmp_path), "collect", "--port", "0",
                               "--max-body-bytes", "100", "--max-buffered-bytes", "1KiB",
                               "--body-deadline", "1.5"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert built["max_body_bytes"] == 100
    assert built["max_buffered_bytes"] == 1024
    assert built["body_deadline_s"] == 1.5
    assert built["stopped"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-body-bytes", "0"], "--max-body-bytes '0': expected a positive number"),
        (["--max-body-bytes", "-5"], "--max-body-bytes '-5': expected a positive number"),
        (["--max-body-bytes", "lots"], "--max-body-bytes 'lots': expected a positive number"),
        (["--max-buffered-bytes", "0"], "--max-buffered-bytes '0': expected a positive number"),
        (["--max-body-bytes", "1MiB", "--max-buffered-bytes", "1000"],
         "--max-buffered-bytes '1000' is smaller than --max-body-bytes '1MiB'"),
        (["--max-buffered-bytes", "10MiB"],  # the default body limit is 20 MiB
         "--max-buffered-bytes '10MiB' is smaller than --max-body-bytes '20MiB'"),
        (["--body-deadline", "0"], "--body-deadline '0': expected a number of seconds"),
        (["--body-deadline", "-1"], "--body-deadline '-1': expected a number of seconds"),
        (["--body-deadline", "0.05"], "--body-deadline '0.05': expected a number of seconds"),
        (["--body-deadline", "nan"], "--body-deadline 'nan': expected a number of seconds"),
        (["--body-deadline", "inf"], "--body-deadline 'inf': expected a number of seconds"),
        (["--body-deadline", "soon"], "--body-deadline 'soon': expected a number of seconds"),
    ],
)  # fmt: skip
def test_collect_refuses_bad_limits_in_one_line(tmp_path: Path, args: list[str], message: str):
    home = tmp_path / "home"
    done = runner.invoke(app, ["--home", str(home), "collect", "--port", "0", *args])
    lines = done.output.strip().splitlines()
    assert done.exit_code == 2 and len(lines) == 1, done.output
    assert lines[0].startswith(f"error: {message}")
    assert not home.exists()  # refused before anything is created or bound
