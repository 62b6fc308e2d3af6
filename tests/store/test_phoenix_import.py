"""`tracegym import otlp-json` of Phoenix's span export (`GET /v1/projects/{p}/spans/otlpv1`:
`{"data": [OTLP spans in snake_case, unset fields null], "next_cursor": ...}`), from a fixture
written after arize-phoenix 20.26's response model (`OtlpSpan`, `OtlpSpansResponseBody`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.store.exporters.chat_messages import to_openai
from tracegym.store.importers import ImportFormatError, import_path, otlp_json
from tracegym.store.store import Store

FIXTURE = Path(__file__).parent.parent / "fixtures" / "phoenix_otlpv1_spans.json"
TRACE = "5b8efff798038103d269b633813fc60c"


def test_phoenix_page_imports_as_one_run(tmp_path: Path):
    report = import_path("otlp-json", FIXTURE, tmp_path)
    assert (report.files, report.runs, report.spans) == (1, 1, 4)
    with Store(tmp_path) as store:
        (trace,) = store.sql(
            "SELECT trace_id, agent, spans, tool_calls, llm_calls, errors, tokens, root_name "
            "FROM traces"
        ).fetchall()
        assert trace == (TRACE, "support-agent", 4, 2, 1, 1, 43, "support-agent")
        (llm,) = store.sql(
            "SELECT model, input_tokens, output_tokens, input_messages, parent_span_id "
            "FROM llm_calls"
        ).fetchall()
        assert llm[:3] == ("gpt-4o-mini-2024-07-18", 31, 12)
        assert to_openai(llm[3])[1] == {"role": "user", "content": "Where is order ORD-1021?"}
        assert llm[4] == "eee19b7ec3c1b170"
        calls = store.sql(
            "SELECT tool, arguments, result, status, error_type FROM tool_calls ORDER BY start_time"
        ).fetchall()
        assert calls == [
            ("get_order", '{"order_id": "ORD-1021"}', '{"status": "shipped"}', "OK", None),
            ("get_order", '{"order_id": "ORD-9"}', None, "ERROR", "KeyError"),
        ]
        rows = store.sql(
            "SELECT name, kind, start_ns, end_ns, status_message, "
            "json_extract(attributes, '$.\"llm.score\"'), "
            "json_extract(attributes, '$.\"tag.tags\"'), "
            "json_array_length(events) FROM spans ORDER BY start_ns"
        ).fetchall()
    assert [r[0] for r in rows] == ["support-agent", "ChatCompletion", "get_order", "get_order"]
    assert {r[1] for r in rows} == {"INTERNAL"}
    assert rows[0][2:4] == (1764547200000000000, 1764547200050000000)  # integers, not strings
    assert json.loads(rows[1][5]) == 0.75 and json.loads(rows[0][6]) == ["support", "demo"]
    assert rows[3][4] == "KeyError: 'ORD-9'" and rows[3][7] == 1


def test_pages_as_json_lines_and_bare_spans(tmp_path: Path):
    page = json.loads(FIXTURE.read_text())
    first = {"data": page["data"][:2], "next_cursor": "U3BhbjoyMA=="}
    last = {"data": page["data"][2:], "next_cursor": None}
    lines = tmp_path / "pages.jsonl"
    lines.write_text(json.dumps(first) + "\n" + json.dumps(last) + "\n")
    by_pages = otlp_json.convert(lines, lines.read_bytes())
    whole = otlp_json.convert(FIXTURE, FIXTURE.read_bytes())
    assert by_pages == whole and len(whole) == 4
    bare = tmp_path / "spans.json"  # just the `data` list
    bare.write_text(json.dumps(page["data"]))
    assert otlp_json.convert(bare, bare.read_bytes()) == whole
    empty = tmp_path / "empty.json"  # the page after the last one
    empty.write_text('{"data": [], "next_cursor": null}')
    assert otlp_json.convert(empty, empty.read_bytes()) == []


def test_phoenix_shape_errors_say_where(tmp_path: Path):
    page = json.loads(FIXTURE.read_text())
    page["data"][1]["span_id"] = "abc"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(page))
    with pytest.raises(ImportFormatError, match=r"spans\[1\]: spanId must be"):
        otlp_json.convert(bad, bad.read_bytes())
    other = tmp_path / "other.json"
    other.write_text('{"data": [{"id": 1}]}')
    with pytest.raises(ImportFormatError, match="no resourceSpans, and not Phoenix"):
        otlp_json.convert(other, other.read_bytes())


def test_snake_case_request_is_read(tmp_path: Path):
    """The protobuf JSON mapping's original field names (`resource_spans`) are OTLP too."""
    page = json.loads(FIXTURE.read_text())
    request = {
        "resource_spans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"string_value": "s"}}]
                },
                "scope_spans": [{"scope": {"name": "openinference"}, "spans": page["data"]}],
            }
        ]
    }
    path = tmp_path / "snake.json"
    path.write_text(json.dumps(request))
    records = otlp_json.convert(path, path.read_bytes())
    assert len(records) == 4
    assert {r["scope"] for r in records} == {"openinference"}
    assert {r["resource"]["service.name"] for r in records} == {"s"}


def test_a_passing_phoenix_run_exports_for_fine_tuning(tmp_path: Path):
    """Phoenix's spans (OpenInference, flattened messages) as a fine-tuning line: the recorded
    system and user messages, the tool calls in order, the agent's output as the answer."""
    from tracegym.cli import app
    from tracegym.store.exporters.ft_format import validate_example
    from tracegym.store.records import outcome_record, write_spool_file
    from typer.testing import CliRunner

    import_path("otlp-json", FIXTURE, tmp_path)
    write_spool_file(tmp_path, [outcome_record(TRACE, time_ns=1, success=True)], "verdict")
    result = CliRunner().invoke(
        app, ["export", "openai-ft", "--home", str(tmp_path), "--from", "runs"]
    )
    assert result.exit_code == 0, result.output
    (line,) = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    assert validate_example(line) == []
    messages = line["messages"]
    assert messages[:2] == [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Where is order ORD-1021?"},
    ]
    calls = [m["tool_calls"][0]["function"] for m in messages if m.get("tool_calls")]
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"order_id": "ORD-1021"},
        {"order_id": "ORD-9"},
    ]
    assert messages[-1] == {"role": "assistant", "content": "It has shipped."}
    assert [t["function"]["name"] for t in line["tools"]] == ["get_order"]
