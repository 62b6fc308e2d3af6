"""One step numbering (store/steps.py): `tracegym show`, `tracegym attribute` and the
dashboard's run page name the same decisive step, by the same number and span, on one run
whose gap evidence is a tool call and whose attribution is the model call that asked for it."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

from tracegym.cli import app
from tracegym.store.records import outcome_record, span_record, write_spool_file
from tracegym.store.steps import decisions, describe, step_numbers
from typer.testing import CliRunner

from tests.fixtures.asgi import asgi_get

runner = CliRunner()
BASE = 1_764_460_800_000_000_000
TRACE = "5e1c7a9b3d2f40e6a8b1c9d7e3f20a41"
ROOT, CHAT, TOOL, REPLY = (f"{i:02x}" * 8 for i in range(1, 5))
OP = "gen_ai.operation.name"
DECISIVE = "#0 chat gpt-4o (carried out by #1 execute_tool cancel_order)"


def _reply(call_id: str | None, name: str) -> str:
    part = {"type": "tool_call", "id": call_id, "name": name, "arguments": {"order_id": "O-7"}}
    return json.dumps([{"role": "assistant", "parts": [part]}])


def _spans(indexed: bool = True, call_id: str | None = "call_1") -> list[dict[str, Any]]:
    """A natively traced failed run: the model asks to cancel the order (step 0), the tool
    call carries it out (step 1), the model answers (step 2). `indexed=False`: the same run
    with no step indexes (an importer that records none)."""

    def step(index: int) -> dict[str, Any]:
        return {"tracegym.step.index": index} if indexed else {}

    return [
        span_record(trace_id=TRACE, span_id=ROOT, name="invoke_agent support", start_ns=BASE,
                    end_ns=BASE + 9_000_000,
                    attributes={OP: "invoke_agent", "gen_ai.agent.name": "support",
                                "tracegym.run.id": "ticket-7",
                                "tracegym.input": '"where is my order O-7?"'}),
        span_record(trace_id=TRACE, span_id=CHAT, parent_span_id=ROOT, name="chat gpt-4o",
                    start_ns=BASE + 1_000, end_ns=BASE + 1_000_000,
                    attributes={OP: "chat", **step(0), "gen_ai.agent.name": "support",
                                "gen_ai.input.messages": json.dumps(
                                    [{"role": "user", "content": "where is my order O-7?"}]),
                                "gen_ai.output.messages": _reply(call_id, "cancel_order")}),
        span_record(trace_id=TRACE, span_id=TOOL, parent_span_id=ROOT,
                    name="execute_tool cancel_order", start_ns=BASE + 2_000_000,
                    end_ns=BASE + 3_000_000,
                    attributes={OP: "execute_tool", **step(1), "gen_ai.agent.name": "support",
                                "gen_ai.tool.name": "cancel_order",
                                "gen_ai.tool.call.id": call_id or "call_own",
                                "gen_ai.tool.call.arguments": '{"order_id": "O-7"}',
                                "gen_ai.tool.call.result": '"cancelled"'}),
        span_record(trace_id=TRACE, span_id=REPLY, parent_span_id=ROOT, name="chat gpt-4o",
                    start_ns=BASE + 4_000_000, end_ns=BASE + 5_000_000,
                    attributes={OP: "chat", **step(2), "gen_ai.agent.name": "support",
                                "gen_ai.output.messages": json.dumps([{
                                    "role": "assistant",
                                    "parts": [{"type": "text", "content": "Cancelled."}]}])}),
        outcome_record("ticket-7", time_ns=BASE + 10_000_000, success=False, source="test"),
    ]  # fmt: skip


def _gaps(home: Path) -> None:
    """The last analysis' evidence names the tool call (its finding is on it), at its index."""
    member = {"trace_id": TRACE, "run_id": "ticket-7", "step": 1, "position": 2,
              "agent": "support", "span_ids": [TOOL],
              "evidence": "cancelled an order asked about"}  # fmt: skip
    gap = {"id": "gap-1", "rank": 1, "name": "cancels_when_asked_status", "kind": "finding",
           "detector": "missed_action", "members": [member]}  # fmt: skip
    document = {"version": 1, "generated_at": "2026-12-06T03:00:00Z", "gaps": [gap]}
    (home / "gaps.json").write_text(json.dumps(document))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    write_spool_file(tmp_path, _spans(), "run")
    _gaps(tmp_path)
    return tmp_path


def _line(text: str, needle: str) -> str:
    return next(line for line in text.splitlines() if needle in line)


def test_show_attribute_and_the_run_page_name_the_same_step(home: Path):
    pytest.importorskip("sklearn")
    pytest.importorskip("starlette")
    from tracegym.dashboards.app import create_app

    # show: the model call is the decisive step, the tool call carried it out
    shown = runner.invoke(app, ["--home", str(home), "show", "ticket-7"])
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    assert f"at step {DECISIVE}" in _line(out, "gap 1 cancels_when_asked_status")
    spans = out[out.index("#0 chat gpt-4o  ") :]
    assert "decisive step of gap 1" in _line(spans, "#0 chat gpt-4o")
    assert "carried out the decisive step of gap 1" in _line(spans, "#1 execute_tool cancel_order")
    assert "decisive" not in _line(spans, "#2 chat gpt-4o")

    # attribute: the same step number
    blamed = runner.invoke(app, ["--home", str(home), "attribute"])
    assert blamed.exit_code == 0, blamed.output
    record = json.loads(blamed.stdout.splitlines()[0])
    assert record["trace_id"] == TRACE and record["step"] == 0
    assert "at step 0" in record["reason"]

    # the dashboard's run page: attribution, the gap bullet and the marked span agree
    asgi = create_app(home)
    assert asgi.app.state.ctx.findings.wait(120)  # the detectors fitted: a settled page
    for path in (f"/run/{TRACE}", f"/runs/{TRACE}"):  # the page answers under both
        status, body = asgi_get(asgi, path)
        assert status == 200, body[:300]
        text = html.unescape(re.sub(r"\s+", " ", body))
        assert f"Decisive step {DECISIVE}" in text
        assert f"(missed_action), step {DECISIVE}: cancelled an order" in text
        marked = re.findall(r'id="span-([0-9a-f]+)"[^>]*class="node[^"]*decisive', body)
        assert marked == [CHAT]
        nodes = re.findall(r'data-span="([0-9a-f]+)" class="node[^"]*"[^>]*>\s*'
                           r'<span class="label"[^>]*>\s*(?:<span class="muted">#(\d+)</span>)?',
                           body)  # fmt: skip
        assert dict(nodes) == {ROOT: "", CHAT: "0", TOOL: "1", REPLY: "2"}


def test_a_run_without_step_indexes_is_numbered_in_run_order(tmp_path: Path):
    """No step indexes: every surface counts the run order, the root #0 (attribution's
    `Step.position`), so `show`'s `#N` and `attribute`'s step are one number."""
    write_spool_file(tmp_path, _spans(indexed=False), "run")
    shown = runner.invoke(app, ["--home", str(tmp_path), "show", "ticket-7"]).stdout
    for line in ("#0 invoke_agent support", "#1 chat gpt-4o", "#2 execute_tool cancel_order",
                 "#3 chat gpt-4o"):  # fmt: skip
        assert line in shown
    pytest.importorskip("sklearn")
    blamed = runner.invoke(app, ["--home", str(tmp_path), "attribute"])
    assert blamed.exit_code == 0, blamed.output
    assert json.loads(blamed.stdout.splitlines()[0])["step"] == 1  # the model call, #1


def _rows(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spool records as the duck-typed rows the numbering reads."""
    rows = []
    for s in spans:
        if "span_id" not in s:
            continue
        attributes = s.get("attributes") or {}
        rows.append({
            "span_id": s["span_id"], "parent_span_id": s.get("parent_span_id"),
            "name": s["name"], "start_ns": s["start_ns"],
            "operation": attributes.get(OP), "step_index": attributes.get("tracegym.step.index"),
            "tool": attributes.get("gen_ai.tool.name"), "attributes": attributes,
        })  # fmt: skip
    return rows


def test_the_model_call_that_asked_is_found_by_call_id_else_by_tool_name():
    rows = _rows(_spans())
    assert step_numbers(rows) == {CHAT: 0, TOOL: 1, REPLY: 2}
    assert decisions(rows) == {TOOL: CHAT}  # by the call id
    assert str(describe(rows, TOOL)) == DECISIVE
    assert str(describe(rows, CHAT)) == DECISIVE  # the model call names its tool call
    assert str(describe(rows, REPLY)) == "#2 chat gpt-4o"
    assert describe(rows, "ff" * 8) is None
    # no call id in the reply: the latest model call before it asked for this tool
    assert decisions(_rows(_spans(call_id=None))) == {TOOL: CHAT}
    # a tool call no model call asked for is its own decisive step
    unasked = _rows(_spans())
    unasked[2]["tool"], unasked[2]["attributes"] = "refund", {"gen_ai.tool.call.id": "call_9"}
    assert decisions(unasked) == {}
    assert str(describe(unasked, TOOL)) == "#1 execute_tool cancel_order"
