"""OTLP -> spool records: value mapping, validation, OpenInference / OpenLLMetry attribute mapping
onto the promoted columns, and the `otlp-json` importer."""

from __future__ import annotations

import base64
import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from tracegym.store import otlp
from tracegym.store.importers import ImportFormatError, import_path, otlp_json
from tracegym.store.otlp import OTLPFormatError, normalize_attributes
from tracegym.store.records import write_spool_file
from tracegym.tracer import semconv as sc

TRACE = "5b8efff798038103d269b633813fc60c"
T0 = 1_700_000_000_000_000_000


# ------------------------------------------------------------------------------------------
# helpers: OTLP/JSON and protobuf requests built by hand


def jv(value: Any) -> dict[str, Any]:
    """A Python value as an OTLP/JSON AnyValue."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [jv(v) for v in value]}}
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": jv(v)} for k, v in value.items()]}}
    return {"stringValue": value}


def jattrs(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": jv(v)} for k, v in attrs.items()]


def jspan(span_id: str, name: str, attrs: dict[str, Any], parent: str | None = None, **extra):
    span = {
        "traceId": TRACE,
        "spanId": span_id,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(T0),
        "endTimeUnixNano": str(T0 + 5_000_000),
        "attributes": jattrs(attrs),
        "status": {},
    }
    if parent:
        span["parentSpanId"] = parent
    span.update(extra)
    return span


def jrequest(*spans: dict[str, Any], service: str = "oi-agent") -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": jattrs({"service.name": service})},
                "scopeSpans": [{"scope": {"name": "openinference.test"}, "spans": list(spans)}],
            }
        ]
    }


def only(request: dict[str, Any]) -> dict[str, Any]:
    (record,) = otlp.records_from_json_object(request)
    return record


# ------------------------------------------------------------------------------------------
# normalize_attributes


def test_openinference_tool_span_maps_to_tool_columns():
    attrs = {
        "openinference.span.kind": "TOOL",
        "tool.name": "search_orders",
        "tool.description": "find orders",
        "tool_call.id": "call_7",
        "input.value": '{"customer": "c1"}',
        "output.value": '["o1", "o2"]',
        "session.id": "sess-1",
    }
    out = normalize_attributes(attrs)
    assert out[sc.OPERATION] == sc.OP_TOOL
    assert out[sc.TOOL_NAME] == "search_orders"
    assert out[sc.TOOL_CALL_ID] == "call_7"
    assert out[sc.TOOL_ARGUMENTS] == '{"customer": "c1"}'
    assert out[sc.TOOL_RESULT] == '["o1", "o2"]'
    assert out[sc.CONVERSATION_ID] == "sess-1"
    assert out["gen_ai.tool.description"] == "find orders"
    assert sc.INPUT not in out and sc.OUTPUT not in out  # input went to the tool keys only
    for key, value in attrs.items():  # originals kept
        assert out[key] == value
    assert attrs == {k: out[k] for k in attrs}  # and the input mapping was not mutated
    assert sc.OPERATION not in attrs


def test_openinference_llm_span_maps_model_tokens_and_messages():
    out = normalize_attributes(
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.provider": "openai",
            "llm.token_count.prompt": 120,
            "llm.token_count.completion": 30,
            "llm.input_messages.0.message.role": "system",
            "llm.input_messages.0.message.content": "be brief",
            "llm.input_messages.1.message.role": "user",
            "llm.input_messages.1.message.content": "hi",
            "output.value": "hello",
        }
    )
    assert out[sc.OPERATION] == sc.OP_CHAT
    assert out[sc.REQUEST_MODEL] == "gpt-4o-mini"
    assert out[sc.PROVIDER] == "openai"
    assert out[sc.INPUT_TOKENS] == 120
    assert out[sc.OUTPUT_TOKENS] == 30
    assert json.loads(out[sc.INPUT_MESSAGES]) == [  # the GenAI message/parts shape
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
    ]
    assert out[sc.OUTPUT_MESSAGES] == "hello"  # no flattened output messages: the value


def test_tools_offered_to_the_model_become_tool_definitions():
    schema = {"type": "function", "function": {"name": "get_order", "parameters": {}}}
    oi = normalize_attributes(
        {"openinference.span.kind": "LLM", "llm.tools.0.tool.json_schema": json.dumps(schema),
         "llm.tools.1.tool.json_schema": '{"name": "refund", "input_schema": {}}'}
    )  # fmt: skip
    assert json.loads(oi[sc.TOOL_DEFINITIONS]) == [schema, {"name": "refund", "input_schema": {}}]
    openllmetry = normalize_attributes(
        {"llm.request.type": "chat", "llm.request.functions.0.name": "get_order",
         "llm.request.functions.0.description": "find it",
         "llm.request.functions.0.parameters": '{"type": "object"}'}
    )  # fmt: skip
    assert json.loads(openllmetry[sc.TOOL_DEFINITIONS]) == [
        {"type": "function", "function": {"name": "get_order", "description": "find it",
                                          "parameters": {"type": "object"}}}
    ]  # fmt: skip
    tool_span = normalize_attributes({"openinference.span.kind": "TOOL", "tool.name": "x",
                                      "llm.tools.0.tool.json_schema": "{}"})  # fmt: skip
    assert sc.TOOL_DEFINITIONS not in tool_span  # only LLM spans offer tools


@pytest.mark.parametrize(
    ("kind", "operation", "in_key", "out_key"),
    [
        ("AGENT", sc.OP_AGENT, sc.INPUT, sc.OUTPUT),
        ("CHAIN", sc.OP_STEP, sc.INPUT, sc.OUTPUT),
        ("RETRIEVER", sc.OP_MEMORY_SEARCH, sc.MEMORY_QUERY, sc.OUTPUT),
        ("EMBEDDING", "embeddings", sc.INPUT, sc.OUTPUT),
        ("RERANKER", "rerank", sc.INPUT, sc.OUTPUT),
        ("GUARDRAIL", "guardrail", sc.INPUT, sc.OUTPUT),
        ("llm", sc.OP_CHAT, sc.INPUT_MESSAGES, sc.OUTPUT_MESSAGES),  # case-insensitive
    ],
)
def test_openinference_kinds(kind, operation, in_key, out_key):
    out = normalize_attributes(
        {"openinference.span.kind": kind, "input.value": "in", "output.value": "out"}, "my span"
    )
    assert out[sc.OPERATION] == operation
    assert out[in_key] == "in"
    assert out[out_key] == "out"


def test_openinference_agent_and_chain_names_and_retrieved_documents():
    agent = normalize_attributes({"openinference.span.kind": "AGENT"}, "planner")
    assert agent[sc.AGENT_NAME] == "planner"  # the span name when agent.name is absent
    named = normalize_attributes({"openinference.span.kind": "AGENT", "agent.name": "boss"}, "x")
    assert named[sc.AGENT_NAME] == "boss"
    chain = normalize_attributes({"openinference.span.kind": "CHAIN"}, "plan")
    assert chain[sc.STEP_NAME] == "plan"
    retriever = normalize_attributes(
        {
            "openinference.span.kind": "RETRIEVER",
            "input.value": "refund policy",
            "retrieval.documents.0.document.id": "doc-1",
            "retrieval.documents.0.document.content": "30 days",
            "retrieval.documents.1.document.id": "doc-2",
        }
    )
    assert retriever[sc.MEMORY_RESULT_IDS] == ["doc-1", "doc-2"]
    from tracegym.tracer.serialize import content_hash

    assert retriever[sc.MEMORY_RESULT_HASHES] == [content_hash("30 days"), ""]


def test_openllmetry_spans():
    workflow = normalize_attributes(
        {
            "traceloop.span.kind": "workflow",
            "traceloop.entity.name": "support_flow",
            "traceloop.workflow.name": "support_flow",
            "traceloop.entity.input": '{"args": ["refund"], "kwargs": {}}',
            "traceloop.entity.output": '"done"',
            "traceloop.association.properties.session_id": "s-9",
        }
    )
    assert workflow[sc.OPERATION] == sc.OP_AGENT
    assert workflow[sc.AGENT_NAME] == "support_flow"
    assert workflow[sc.INPUT] == '{"args": ["refund"], "kwargs": {}}'
    assert workflow[sc.OUTPUT] == '"done"'
    assert workflow[sc.CONVERSATION_ID] == "s-9"

    tool = normalize_attributes(
        {
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "lookup_order",
            "traceloop.workflow.name": "support_flow",
            "traceloop.entity.input": '{"args": [], "kwargs": {"order": "o1"}}',
            "traceloop.entity.output": '{"status": "shipped"}',
        }
    )
    assert tool[sc.OPERATION] == sc.OP_TOOL
    assert tool[sc.TOOL_NAME] == "lookup_order"
    assert tool[sc.AGENT_NAME] == "support_flow"  # the workflow, carried on every span
    assert tool[sc.TOOL_ARGUMENTS] == '{"args": [], "kwargs": {"order": "o1"}}'
    assert tool[sc.TOOL_RESULT] == '{"status": "shipped"}'

    task = normalize_attributes({"traceloop.span.kind": "task", "traceloop.entity.name": "plan"})
    assert task[sc.OPERATION] == sc.OP_STEP and task[sc.STEP_NAME] == "plan"
    agent = normalize_attributes({"traceloop.span.kind": "agent", "traceloop.entity.name": "bot"})
    assert agent[sc.OPERATION] == sc.OP_AGENT and agent[sc.AGENT_NAME] == "bot"

    llm = normalize_attributes(
        {
            "llm.request.type": "chat",
            "gen_ai.system": "OpenAI",
            "gen_ai.request.model": "gpt-4o",
            "llm.response.model": "gpt-4o-2024-08-06",
            "gen_ai.usage.prompt_tokens": 11,
            "gen_ai.usage.completion_tokens": 7,
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "where is my order?",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "on its way",
        }
    )
    assert llm[sc.OPERATION] == sc.OP_CHAT
    assert llm[sc.PROVIDER] == "OpenAI"
    assert llm[sc.REQUEST_MODEL] == "gpt-4o"
    assert llm[sc.RESPONSE_MODEL] == "gpt-4o-2024-08-06"
    assert (llm[sc.INPUT_TOKENS], llm[sc.OUTPUT_TOKENS]) == (11, 7)
    assert json.loads(llm[sc.INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "where is my order?"}]}
    ]
    assert json.loads(llm[sc.OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "on its way"}],
         "finish_reason": "stop"}
    ]  # fmt: skip


def test_existing_genai_values_are_never_overwritten():
    attrs = {
        sc.OPERATION: "execute_tool",
        sc.TOOL_NAME: "native_name",
        sc.TOOL_ARGUMENTS: "native args",
        sc.INPUT_TOKENS: 5,
        "openinference.span.kind": "LLM",
        "tool.name": "oi_name",
        "input.value": "oi input",
        "output.value": "oi output",
        "llm.token_count.prompt": 99,
    }
    out = normalize_attributes(attrs)
    assert out[sc.OPERATION] == "execute_tool"
    assert out[sc.TOOL_NAME] == "native_name"
    assert out[sc.TOOL_ARGUMENTS] == "native args"
    assert out[sc.INPUT_TOKENS] == 5
    # The existing operation decides where the other ecosystem's output goes.
    assert out[sc.TOOL_RESULT] == "oi output"
    assert sc.INPUT_MESSAGES not in out


def test_plain_attributes_pass_through_untouched():
    attrs = {"http.method": "GET", sc.OPERATION: "chat"}
    assert normalize_attributes(attrs) is attrs
    assert normalize_attributes({}) == {}


# ------------------------------------------------------------------------------------------
# Mapped spans land in the promoted columns and views


def test_openinference_and_openllmetry_spans_fill_the_views(tmp_path: Path):
    from tracegym.store.store import Store

    root = "a000000000000001"
    request = jrequest(
        jspan(root, "agent", {"openinference.span.kind": "AGENT", "agent.name": "shopper"}),
        jspan(
            "a000000000000002",
            "search_orders",
            {
                "openinference.span.kind": "TOOL",
                "tool.name": "search_orders",
                "input.value": '{"q": "shoes"}',
                "output.value": "3 results",
            },
            root,
        ),
        jspan(
            "a000000000000003",
            "ChatOpenAI",
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4o-mini",
                "llm.token_count.prompt": 100,
                "llm.token_count.completion": 20,
                "input.value": '[{"role": "user", "content": "hi"}]',
                "output.value": "hello",
            },
            root,
        ),
        jspan(
            "a000000000000004",
            "lookup.tool",
            {
                "traceloop.span.kind": "tool",
                "traceloop.entity.name": "lookup",
                "traceloop.entity.input": '{"id": 1}',
                "traceloop.entity.output": '"found"',
            },
            root,
            status={"code": 2, "message": "boom"},
            events=[
                {
                    "name": "exception",
                    "timeUnixNano": str(T0 + 1),
                    "attributes": jattrs({"exception.type": "KeyError"}),
                }
            ],
        ),
        jspan(
            "a000000000000005",
            "openai.chat",
            {
                "llm.request.type": "chat",
                "llm.request.model": "claude-x",
                "gen_ai.usage.prompt_tokens": 7,
                "gen_ai.usage.completion_tokens": 3,
            },
            root,
        ),
    )
    records = otlp.records_from_json_object(request)
    write_spool_file(tmp_path, records, "otlp-test")
    with Store(tmp_path) as store:
        tools = store.sql(
            "SELECT tool, arguments, result, status, error_type FROM tool_calls ORDER BY tool"
        ).fetchall()
        assert tools == [
            ("lookup", '{"id": 1}', '"found"', "ERROR", "KeyError"),
            ("search_orders", '{"q": "shoes"}', "3 results", "UNSET", None),
        ]
        llms = store.sql(
            "SELECT model, input_tokens, output_tokens, input_messages, output_messages "
            "FROM llm_calls ORDER BY model"
        ).fetchall()
        assert llms == [
            ("claude-x", 7, 3, None, None),
            ("gpt-4o-mini", 100, 20, '[{"role": "user", "content": "hi"}]', "hello"),
        ]
        trace = store.sql(
            "SELECT agent, service, spans, tool_calls, llm_calls, errors, tokens FROM traces"
        ).fetchall()
        assert trace == [("shopper", "oi-agent", 5, 2, 2, 1, 130)]
        # The original attributes stay queryable.
        kinds = store.sql(
            "SELECT attributes->>'openinference.span.kind' FROM spans WHERE tool = 'search_orders'"
        ).fetchall()
        assert kinds == [("TOOL",)]


# ------------------------------------------------------------------------------------------
# Value mapping and the two encodings


def _pb_request() -> ExportTraceServiceRequest:
    def kv(key: str, **value: Any) -> common_pb2.KeyValue:
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**value))

    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.append(kv("service.name", string_value="svc"))
    ss = rs.scope_spans.add()
    ss.scope.name = "scope.a"
    span = ss.spans.add(
        trace_id=bytes.fromhex(TRACE),
        span_id=bytes.fromhex("00f067aa0ba902b7"),
        parent_span_id=bytes.fromhex("1111111111111111"),
        name="op",
        kind=trace_pb2.Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=T0,
        end_time_unix_nano=T0 + 10,
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR, message="bad"),
    )
    span.attributes.extend(
        [
            kv("s", string_value="x"),
            kv("i", int_value=-(2**62)),
            kv("d", double_value=2.5),
            kv("nan", double_value=float("nan")),
            kv("b", bool_value=True),
            kv("raw", bytes_value=b"\x00\xff"),
            kv("empty"),
            kv(
                "arr",
                array_value=common_pb2.ArrayValue(
                    values=[common_pb2.AnyValue(int_value=1), common_pb2.AnyValue(string_value="2")]
                ),
            ),
            kv(
                "kv",
                kvlist_value=common_pb2.KeyValueList(
                    values=[kv("inner", bool_value=False), kv("n", double_value=1.0)]
                ),
            ),
        ]
    )
    span.events.add(name="exception", time_unix_nano=T0 + 5).attributes.append(
        kv("exception.type", string_value="ValueError")
    )
    span.links.add(
        trace_id=bytes.fromhex("ab" * 16), span_id=bytes.fromhex("cd" * 8)
    ).attributes.append(kv("why", string_value="caller"))
    ss.spans.add(  # a root span with SPAN_KIND_UNSPECIFIED and an all-zero parent
        trace_id=bytes.fromhex(TRACE),
        span_id=bytes.fromhex("2222222222222222"),
        parent_span_id=b"\0" * 8,
        name="root",
        start_time_unix_nano=T0,
        end_time_unix_nano=T0 + 20,
    )
    return request


def _to_otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """The proto3 JSON mapping with OTLP's hex ids (what OTLP/HTTP JSON clients send)."""
    data = json_format.MessageToDict(request)

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in node:
                    node[key] = base64.b64decode(node[key]).hex()
            for value in node.values():
                fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)

    fix(data)
    return data


def test_protobuf_values_kinds_status_events_links():
    records = otlp.records_from_protobuf(_pb_request().SerializeToString())
    assert len(records) == 2
    span, root = records
    assert span["trace_id"] == TRACE and span["span_id"] == "00f067aa0ba902b7"
    assert span["parent_span_id"] == "1111111111111111"
    assert (span["kind"], span["status"], span["status_message"]) == ("CLIENT", "ERROR", "bad")
    assert (span["start_ns"], span["end_ns"]) == (T0, T0 + 10)
    assert span["resource"] == {"service.name": "svc"}
    assert span["scope"] == "scope.a"
    attrs = span["attributes"]
    assert attrs["s"] == "x" and attrs["i"] == -(2**62) and attrs["d"] == 2.5
    assert attrs["nan"] == "NaN"  # spool lines stay valid JSON
    assert attrs["b"] is True and attrs["raw"] == "AP8=" and attrs["empty"] is None
    assert attrs["arr"] == [1, "2"]
    assert attrs["kv"] == {"inner": False, "n": 1.0}
    assert attrs[sc.ERROR_TYPE] == "ValueError"  # from the exception event
    assert span["events"] == [
        {"name": "exception", "time_ns": T0 + 5, "attributes": {"exception.type": "ValueError"}}
    ]
    assert span["links"] == [
        {"trace_id": "ab" * 16, "span_id": "cd" * 8, "attributes": {"why": "caller"}}
    ]
    assert root["parent_span_id"] is None and root["kind"] == "INTERNAL"
    assert (root["status"], root["status_message"]) == ("UNSET", None)
    assert list(span) == [
        "v", "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns",
        "status", "status_message", "attributes", "events", "links", "resource", "scope",
    ]  # fmt: skip
    json.loads(json.dumps(records, allow_nan=False))  # encodable as strict JSON


def test_json_and_protobuf_give_the_same_records():
    request = _pb_request()
    from_pb = otlp.records_from_protobuf(request.SerializeToString())
    body = _to_otlp_json(request)
    assert body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["kind"] == "SPAN_KIND_CLIENT"
    assert otlp.records_from_json(json.dumps(body)) == from_pb
    # Enums as integers and 64-bit integers as numbers are accepted too.
    for span in body["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["kind"] = {"SPAN_KIND_CLIENT": 3}.get(span.get("kind"), 0)
        span["startTimeUnixNano"] = int(span["startTimeUnixNano"])
        if "status" in span and "code" in span["status"]:
            span["status"]["code"] = 2
    assert otlp.records_from_json(json.dumps(body).encode()) == from_pb


def _bad(**changes: Any) -> dict[str, Any]:
    span = jspan("b000000000000001", "s", {"k": "v"})
    for key, value in changes.items():
        if value is None:
            span.pop(key, None)
        else:
            span[key] = value
    return jrequest(span)


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        (_bad(traceId=None), "spans[0]: missing traceId"),
        (_bad(traceId="abc"), "traceId must be 32 hex characters"),
        (_bad(traceId="ab" * 15), "traceId must be 16 bytes (32 hex characters), got 15"),
        (_bad(traceId="W46P95gDgQPSabYzgT/GDA=="), "ids are hex, not base64"),
        (_bad(traceId="0" * 32), "traceId is all zeros"),
        (_bad(spanId="ab" * 7), "spanId must be 8 bytes (16 hex characters), got 7"),
        (_bad(parentSpanId="xyz"), "parentSpanId must be 16 hex characters"),
        (_bad(startTimeUnixNano=None), "missing startTimeUnixNano"),
        (_bad(endTimeUnixNano="soon"), "endTimeUnixNano must be an integer"),
        (_bad(kind=9), "unknown kind 9"),
        (_bad(kind="SPAN_KIND_WEIRD"), "unknown kind 'SPAN_KIND_WEIRD'"),
        (_bad(status={"code": 7}), "unknown status code 7"),
        (_bad(attributes=[{"key": "n", "value": {"intValue": "1.5"}}]), "attribute 'n': intValue"),
        (
            _bad(attributes=[{"key": "b", "value": {"boolValue": "yes"}}]),
            "attribute 'b': boolValue",
        ),
        (_bad(attributes=[{"value": {"stringValue": "x"}}]), "attribute without a string key"),
        (_bad(attributes={"k": "v"}), "attributes must be an array"),
        (_bad(links=[{"traceId": TRACE, "spanId": "12"}]), "links[0]: spanId must be 8 bytes"),
        (_bad(name=5), "name must be a string"),
        ({"resourceSpans": {}}, "resourceSpans must be an array"),
        ({"resourceSpans": [{"scopeSpans": [{"spans": [7]}]}]}, "span must be an object"),
    ],
)
def test_json_validation_errors_name_the_place(request_body, message):
    with pytest.raises(OTLPFormatError) as info:
        otlp.records_from_json_object(request_body)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_json_errors_name_the_span_and_hint_at_snake_case():
    good = jspan("c000000000000001", "ok", {})
    bad = {"trace_id": TRACE, "span_id": "c000000000000002", "name": "snake"}
    with pytest.raises(OTLPFormatError, match=r"^resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[1\]"):
        otlp.records_from_json_object(jrequest(good, bad))
    with pytest.raises(OTLPFormatError, match="lowerCamelCase"):
        otlp.records_from_json_object(jrequest(bad))
    with pytest.raises(OTLPFormatError, match="must be a JSON object"):
        otlp.records_from_json("[]")
    with pytest.raises(OTLPFormatError, match="invalid JSON at line 1"):
        otlp.records_from_json(b'{"resourceSpans": [')
    assert otlp.records_from_json("{}") == []  # an empty request is valid


def test_protobuf_validation_errors():
    request = _pb_request()
    request.resource_spans[0].scope_spans[0].spans[1].span_id = b"\x01" * 4
    with pytest.raises(OTLPFormatError, match=r"spans\[1\]: spanId must be 8 bytes, got 4"):
        otlp.records_from_protobuf(request.SerializeToString())
    request = _pb_request()
    request.resource_spans[0].scope_spans[0].spans[0].trace_id = b""
    with pytest.raises(OTLPFormatError, match=r"spans\[0\]: missing traceId"):
        otlp.records_from_protobuf(request.SerializeToString())
    request = _pb_request()
    request.resource_spans[0].scope_spans[0].spans[0].start_time_unix_nano = 0
    with pytest.raises(OTLPFormatError, match="missing startTimeUnixNano"):
        otlp.records_from_protobuf(request.SerializeToString())
    with pytest.raises(OTLPFormatError, match="invalid protobuf"):
        otlp.records_from_protobuf(b"\xff\xff\xff\xff garbage")


def test_corrupted_protobuf_never_raises_anything_else():
    body = bytearray(_pb_request().SerializeToString())
    rng = random.Random(7)
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(400):
        mutated = bytearray(body)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        cut = mutated[: rng.randint(0, len(mutated))] if rng.random() < 0.3 else mutated
        try:
            records = otlp.records_from_protobuf(bytes(cut))
        except OTLPFormatError:
            outcomes["rejected"] += 1
        else:
            json.dumps(records, allow_nan=False)  # whatever is accepted is storable
            outcomes["ok"] += 1
    assert outcomes["rejected"] > 0 and outcomes["ok"] > 0


# ------------------------------------------------------------------------------------------
# The otlp-json importer


def _collector_file(tmp_path: Path) -> Path:
    """Two export requests as the Collector's file exporter writes them, plus a logs line."""
    first = jrequest(
        jspan("d000000000000001", "agent", {"openinference.span.kind": "AGENT"}),
        jspan(
            "d000000000000002",
            "get_weather",
            {"openinference.span.kind": "TOOL", "tool.name": "get_weather"},
            "d000000000000001",
        ),
    )
    second = jrequest(
        jspan(
            "d000000000000003",
            "get_time",
            {"traceloop.span.kind": "tool", "traceloop.entity.name": "get_time"},
            "d000000000000001",
        )
    )
    logs = {"resourceLogs": [{"scopeLogs": []}]}
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (first, logs, second)) + "\n")
    return path


def test_otlp_json_importer_reads_collector_file(tmp_path: Path):
    path = _collector_file(tmp_path)
    records = otlp_json.convert(path, path.read_bytes())
    assert [r["name"] for r in records] == ["agent", "get_weather", "get_time"]
    assert [r["attributes"].get(sc.TOOL_NAME) for r in records] == [
        None,
        "get_weather",
        "get_time",
    ]
    assert records[0]["attributes"][sc.AGENT_NAME] == "agent"

    # A single pretty-printed object, a gzip file and a JSON array are accepted too.
    single = tmp_path / "single.json"
    single.write_text(json.dumps(jrequest(jspan("d000000000000009", "x", {})), indent=2))
    assert len(otlp_json.convert(single, single.read_bytes())) == 1
    packed = gzip.compress(path.read_bytes())
    assert otlp_json.convert(path, packed) == records
    array = json.dumps([jrequest(jspan("d00000000000000a", "y", {}))]).encode()
    assert len(otlp_json.convert(single, array)) == 1


def test_otlp_json_import_driver_is_idempotent(tmp_path: Path):
    from tracegym.store.store import Store

    path = _collector_file(tmp_path)
    home = tmp_path / "home"
    report = import_path("otlp-json", path, home)
    assert (report.files, report.spans, report.runs) == (1, 3, 1)
    again = import_path("otlp-json", path, home)
    assert again.files == 0 and again.already_imported == [path]
    with Store(home) as store:
        rows = store.sql("SELECT tool, count(*) FROM tool_calls GROUP BY tool ORDER BY 1")
        assert rows.fetchall() == [("get_time", 1), ("get_weather", 1)]


def test_otlp_json_importer_errors_name_file_and_line(tmp_path: Path):
    path = _collector_file(tmp_path)
    data = path.read_bytes()
    truncated = data[: data.rindex(b"{") + 25]  # the third line cut mid-object
    with pytest.raises(ImportFormatError) as info:
        otlp_json.convert(path, truncated)
    assert str(path) in str(info.value) and "line 3" in str(info.value)
    assert info.value.record == "line 3"

    bad_span = data.replace(b'"d000000000000003"', b'"d0000000003"')
    with pytest.raises(ImportFormatError, match=r"line 3\): resourceSpans\[0\]\.scopeSpans\[0\]"):
        otlp_json.convert(path, bad_span)

    with pytest.raises(ImportFormatError, match="no resourceSpans"):
        otlp_json.convert(path, b'{"spans": []}\n{"spans": []}\n')
    with pytest.raises(ImportFormatError, match="only logs/metrics"):
        otlp_json.convert(path, b'{"resourceMetrics": []}\n')
    with pytest.raises(ImportFormatError, match="empty file"):
        otlp_json.convert(path, b"\n")
    with pytest.raises(ImportFormatError, match="invalid JSON at line 1"):
        otlp_json.convert(path, b'{"resourceSpans": [{"scopeSpans": [')
    # Nothing half-imported: the driver writes nothing when a file fails.
    home = tmp_path / "home"
    path.write_bytes(truncated)
    with pytest.raises(ImportFormatError):
        import_path("otlp-json", path, home)
    assert not (home / "spool").exists() or not list((home / "spool").iterdir())


def test_another_instrumentations_spans_in_process_fill_the_same_columns(tmp_path):
    """An OpenInference instrumentor in the same process as `tg.init()` writes its spans to the
    spool: they land in `llm_calls` and `tool_calls` as they do through `tracegym collect`, and
    tracegym's own spans are written as they are."""
    import tracegym as tg
    from opentelemetry.sdk.trace import TracerProvider
    from tracegym.store.store import Store
    from tracegym.tracer.operations import state

    saved = state.tracer, state.settings
    provider = TracerProvider()
    tg.init(home=tmp_path, provider=provider)
    try:
        other = provider.get_tracer("openinference.instrumentation.openai")
        with other.start_as_current_span("ChatCompletion") as span:
            span.set_attributes({"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o",
                                 "llm.token_count.prompt": 12,
                                 "llm.token_count.completion": 3})  # fmt: skip
        with other.start_as_current_span("search_orders") as span:
            span.set_attributes({"openinference.span.kind": "TOOL", "tool.name": "search_orders",
                                 "input.value": '{"customer": "c1"}'})  # fmt: skip
    finally:
        tg.shutdown()
        state.tracer, state.settings = saved
    with Store(tmp_path) as store:
        llm = store.sql("SELECT model, input_tokens, output_tokens FROM llm_calls").fetchall()
        tools = store.sql("SELECT tool, arguments FROM tool_calls").fetchall()
    assert llm == [("gpt-4o", 12, 3)]
    assert tools == [("search_orders", '{"customer": "c1"}')]
