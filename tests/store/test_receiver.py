"""The OTLP/HTTP receiver, end to end: the real `opentelemetry-exporter-otlp-proto-http`
client (protobuf, plain and gzip), OTLP/JSON posts, bad requests, the bearer token."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Status, StatusCode
from tracegym.store.receiver import Receiver
from tracegym.tracer import semconv as sc
from tracegym.tracer.spool import iter_spool, span_record

TRACE = "0af7651916cd43dd8448eb211c80319c"
T0 = 1_700_000_000_000_000_000


def spool(home: Path) -> list[dict[str, Any]]:
    return list(iter_spool(home))


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    with Receiver(tmp_path / "home", port=0) as rec:
        yield rec


def post(
    url: str,
    body: bytes,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of one request; HTTP errors are returned, not raised."""
    request = urllib.request.Request(
        url,
        data=body if method == "POST" else None,
        method=method,
        headers={"Content-Type": content_type, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def json_request(*span_ids: str, tool: str = "lookup") -> bytes:
    spans = [
        {
            "traceId": TRACE,
            "spanId": span_id,
            "name": f"execute_tool {tool}",
            "kind": "SPAN_KIND_INTERNAL",
            "startTimeUnixNano": str(T0 + i),
            "endTimeUnixNano": T0 + i + 1000,
            "attributes": [
                {"key": "openinference.span.kind", "value": {"stringValue": "TOOL"}},
                {"key": "tool.name", "value": {"stringValue": tool}},
                {"key": "input.value", "value": {"stringValue": '{"id": 3}'}},
                {"key": "attempt", "value": {"intValue": "2"}},
            ],
            "status": {"code": 1},
        }
        for i, span_id in enumerate(span_ids)
    ]
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {
                        "attributes": [{"key": "service.name", "value": {"stringValue": "js"}}]
                    },
                    "scopeSpans": [{"scope": {"name": "manual"}, "spans": spans}],
                }
            ]
        }
    ).encode()


def sdk_spans(exporter: OTLPSpanExporter) -> list[Any]:
    """Record a small agent run with the OpenTelemetry SDK, exporting span by span through
    `exporter` (SimpleSpanProcessor) and into memory; returns the finished SDK spans."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("my.agent", "1.0")
    try:
        with tracer.start_as_current_span(
            "invoke_agent support",
            attributes={sc.OPERATION: sc.OP_AGENT, sc.AGENT_NAME: "support"},
        ) as root:
            for i, tool in enumerate(["search_orders", "refund", "search_orders"]):
                with tracer.start_as_current_span(
                    f"execute_tool {tool}",
                    attributes={
                        sc.OPERATION: sc.OP_TOOL,
                        sc.TOOL_NAME: tool,
                        sc.TOOL_ARGUMENTS: json.dumps({"i": i}),
                        sc.STEP_INDEX: i,
                        "scores": [0.5, 1.5],
                    },
                    links=[Link(root.get_span_context(), {"why": "test"})],
                ) as span:
                    span.add_event("retry", {"attempt": 1})
                    if tool == "refund":
                        span.set_status(Status(StatusCode.ERROR, "refund failed"))
                        span.set_attribute(sc.ERROR_TYPE, "PermissionError")
            with tracer.start_as_current_span(
                "chat",
                attributes={
                    "openinference.span.kind": "LLM",
                    "llm.model_name": "gpt-4o-mini",
                    "llm.token_count.prompt": 40,
                    "llm.token_count.completion": 9,
                },
            ):
                pass
    finally:
        provider.shutdown()
    return list(memory.get_finished_spans())


# ------------------------------------------------------------------------------------------
# The real exporter


@pytest.mark.parametrize(
    "compression", [Compression.NoCompression, Compression.Gzip, Compression.Deflate]
)
def test_real_exporter_spans_land_in_the_spool(receiver: Receiver, compression: Compression):
    exporter = OTLPSpanExporter(endpoint=receiver.url, compression=compression, timeout=5)
    spans = sdk_spans(exporter)
    assert receiver.stats()["accepted_spans"] == len(spans) == 5

    records = {r["span_id"]: r for r in spool(receiver.home)}
    assert len(records) == 5
    for span in spans:
        # what the tracer spools for the same span in process: one mapping, either way
        expected = json.loads(json.dumps(span_record(span)))
        got = records[expected["span_id"]]
        assert got == expected
        if span.name == "chat":
            keys = (sc.OPERATION, sc.REQUEST_MODEL, sc.INPUT_TOKENS, sc.OUTPUT_TOKENS)
            mapped = {k: got["attributes"].get(k) for k in keys}
            assert mapped == {
                sc.OPERATION: sc.OP_CHAT,
                sc.REQUEST_MODEL: "gpt-4o-mini",
                sc.INPUT_TOKENS: 40,
                sc.OUTPUT_TOKENS: 9,
            }
            assert not set(mapped) & set(dict(span.attributes or {}))  # added, not sent

    receiver.stop()  # closes the spool file: compaction takes it into the lake
    from tracegym.store.store import Store

    with Store(receiver.home) as store:
        assert store.last_compaction is not None and store.last_compaction.spans == 5
        rows = store.sql(
            "SELECT tool, count(*), count(*) FILTER (WHERE status = 'ERROR') "
            "FROM tool_calls GROUP BY tool ORDER BY tool"
        ).fetchall()
        assert rows == [("refund", 1, 1), ("search_orders", 2, 0)]
        traces = store.sql(
            "SELECT agent, service, spans, tool_calls, llm_calls, errors, tokens FROM traces"
        ).fetchall()
        assert traces == [("support", "sdk-agent", 5, 3, 1, 1, 49)]
        llm = store.sql("SELECT model, input_tokens, output_tokens FROM llm_calls").fetchall()
        assert llm == [("gpt-4o-mini", 40, 9)]


def test_exporter_with_bearer_token(tmp_path: Path):
    with Receiver(tmp_path / "home", port=0, token="s3cret") as receiver:
        good = OTLPSpanExporter(
            endpoint=receiver.url, headers={"Authorization": "Bearer s3cret"}, timeout=5
        )
        sdk_spans(good)
        assert len(spool(receiver.home)) == 5

        bad = OTLPSpanExporter(
            endpoint=receiver.url, headers={"Authorization": "Bearer nope"}, timeout=5
        )
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        provider.get_tracer("t").start_span("x").end()
        assert bad.export(memory.get_finished_spans()) == SpanExportResult.FAILURE
        bad.shutdown()
        provider.shutdown()
        assert len(spool(receiver.home)) == 5
        stats = receiver.stats()
        assert stats["accepted_spans"] == 5 and stats["rejected_requests"] == 1


# ------------------------------------------------------------------------------------------
# OTLP/JSON


def test_json_post_plain_and_gzip(receiver: Receiver):
    status, body, headers = post(receiver.url, json_request("00f067aa0ba902b7", "00f067aa0ba902b8"))
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {}  # an ExportTraceServiceResponse with nothing to report

    packed = gzip.compress(json_request("00f067aa0ba902b9", tool="refund"))
    status, _, _ = post(receiver.url, packed, headers={"Content-Encoding": "gzip"})
    assert status == 200

    records = spool(receiver.home)
    assert [r["span_id"] for r in records] == [
        "00f067aa0ba902b7",
        "00f067aa0ba902b8",
        "00f067aa0ba902b9",
    ]
    first = records[0]
    assert first["trace_id"] == TRACE and first["status"] == "OK"
    assert first["resource"] == {"service.name": "js"} and first["scope"] == "manual"
    assert first["attributes"]["attempt"] == 2
    assert first["attributes"][sc.OPERATION] == sc.OP_TOOL
    assert first["attributes"][sc.TOOL_NAME] == "lookup"
    assert first["attributes"][sc.TOOL_ARGUMENTS] == '{"id": 3}'
    assert records[2]["attributes"][sc.TOOL_NAME] == "refund"
    assert receiver.stats()["accepted_spans"] == 3

    from tracegym.store.store import Store

    with Store(receiver.home) as store:  # the live spool file is read in place
        rows = store.sql("SELECT tool, arguments FROM tool_calls ORDER BY span_id").fetchall()
        assert rows == [("lookup", '{"id": 3}'), ("lookup", '{"id": 3}'), ("refund", '{"id": 3}')]


def test_protobuf_post_with_urllib(receiver: Receiver):
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id = bytes.fromhex(TRACE)
    span.span_id = bytes.fromhex("1234567890abcdef")
    span.name = "hello"
    span.start_time_unix_nano, span.end_time_unix_nano = T0, T0 + 1
    status, body, headers = post(
        receiver.url, request.SerializeToString(), "application/x-protobuf"
    )
    assert (status, body, headers["Content-Type"]) == (200, b"", "application/x-protobuf")
    assert [r["name"] for r in spool(receiver.home)] == ["hello"]


# ------------------------------------------------------------------------------------------
# Bad requests: the right 4xx, nothing written, the receiver keeps serving


def assert_still_serving(receiver: Receiver, before: int) -> None:
    assert len(spool(receiver.home)) == before  # nothing written by the bad request
    span_id = f"{before + 1:016x}"
    status, _, _ = post(receiver.url, json_request(span_id))
    assert status == 200
    assert len(spool(receiver.home)) == before + 1


BAD_REQUESTS = [
    # (name, path, body, content type, headers, method, status, text in the body)
    ("garbage protobuf", "/v1/traces", b"\xff\xfe garbage", "application/x-protobuf", {}, "POST",
     400, b"invalid protobuf"),
    ("garbage json", "/v1/traces", b"{not json", "application/json", {}, "POST", 400,
     b"invalid JSON at line 1"),
    ("invalid span", "/v1/traces", json_request("abc"), "application/json", {}, "POST", 400,
     b"spanId must be 16 hex characters"),
    ("half valid", "/v1/traces", json_request("00000000000000aa", "0000000000000"),
     "application/json", {}, "POST", 400, b"spans[1]"),
    ("bad gzip", "/v1/traces", b"not gzip", "application/json", {"Content-Encoding": "gzip"},
     "POST", 400, b"invalid gzip body"),
    ("wrong type", "/v1/traces", b"{}", "text/plain", {}, "POST", 415,
     b"unsupported Content-Type 'text/plain'"),
    ("wrong encoding", "/v1/traces", b"{}", "application/json", {"Content-Encoding": "br"},
     "POST", 415, b"unsupported Content-Encoding"),
    ("wrong path", "/v1/metrics", json_request("00000000000000ab"), "application/json", {},
     "POST", 404, b"no such path"),
    ("get", "/v1/traces", b"", "application/json", {}, "GET", 405, b"GET not allowed"),
    ("put", "/v1/traces", json_request("00000000000000ac"), "application/json", {}, "PUT", 405,
     b"PUT not allowed"),
    ("get elsewhere", "/", b"", "application/json", {}, "GET", 404, b"no such path"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "path", "body", "content_type", "headers", "method", "status", "text"),
    BAD_REQUESTS,
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_requests(
    receiver: Receiver, name, path, body, content_type, headers, method, status, text
):
    post(receiver.url, json_request("0000000000000001"))  # something there already
    before = len(spool(receiver.home))
    url = f"http://127.0.0.1:{receiver.port}{path}"
    if method == "PUT":
        request = urllib.request.Request(
            url, data=body, method="PUT", headers={"Content-Type": content_type}
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        got_status, got_body = info.value.code, info.value.read()
    else:
        got_status, got_body, _ = post(url, body, content_type, headers, method)
    assert got_status == status, got_body
    assert text in got_body
    assert receiver.stats()["rejected_requests"] == 1
    assert_still_serving(receiver, before)


def test_error_bodies_use_the_request_encoding(receiver: Receiver):
    from google.rpc import status_pb2

    status, body, headers = post(receiver.url, b"\xff\xfe", "application/x-protobuf")
    assert status == 400 and headers["Content-Type"] == "application/x-protobuf"
    decoded = status_pb2.Status.FromString(body)
    assert decoded.code == 3 and "invalid protobuf" in decoded.message
    status, body, headers = post(receiver.url, b"[1]", "application/json")
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert "must be a JSON object" in json.loads(body)["message"]


def test_too_large(tmp_path: Path):
    with Receiver(tmp_path / "home", port=0, max_body_bytes=2048) as receiver:
        big = json_request(*(f"{i + 1:016x}" for i in range(20)))
        assert len(big) > 2048
        status, body, _ = post(receiver.url, big)
        assert status == 413 and b"exceeds the limit of 2048 bytes" in body
        # A small gzip body that inflates beyond the limit is refused too.
        bomb = gzip.compress(b" " * 100_000 + b"{}")
        assert len(bomb) < 2048
        status, body, _ = post(receiver.url, bomb, headers={"Content-Encoding": "gzip"})
        assert status == 413 and b"decompressed body exceeds 2048 bytes" in body
        assert receiver.stats()["rejected_requests"] == 2
        assert_still_serving(receiver, 0)


def test_token(tmp_path: Path):
    with Receiver(tmp_path / "home", port=0, token="s3cret") as receiver:
        body = json_request("0000000000000001")
        status, text, headers = post(receiver.url, body)
        assert status == 401 and b"bearer token required" in text
        assert headers["WWW-Authenticate"].startswith("Bearer")
        status, text, _ = post(receiver.url, body, headers={"Authorization": "Bearer wrong"})
        assert status == 401 and b"wrong bearer token" in text
        status, _, _ = post(receiver.url, body, headers={"Authorization": "Basic czNjcmV0"})
        assert status == 401
        assert spool(receiver.home) == []
        status, _, _ = post(receiver.url, body, headers={"Authorization": "Bearer s3cret"})
        assert status == 200
        assert len(spool(receiver.home)) == 1
        assert receiver.stats()["rejected_requests"] == 3


def test_client_hanging_up_mid_body_does_not_hurt(receiver: Receiver):
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 5000\r\n\r\n{"resourceSpans": ['
        )
    status, _, _ = post(receiver.url, json_request("0000000000000001"))
    assert status == 200
    assert len(spool(receiver.home)) == 1


def test_keep_alive_chunked_and_missing_length(receiver: Receiver):
    connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=5)
    for i in range(3):  # one connection, several requests
        connection.request(
            "POST",
            "/v1/traces",
            body=json_request(f"{i + 1:016x}"),
            headers={"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b"{}"
    # A chunked body (no Content-Length).
    chunks = iter([json_request("0000000000000004")[:50], json_request("0000000000000004")[50:]])
    connection.request(
        "POST",
        "/v1/traces",
        body=chunks,
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 200, response.read()
    response.read()
    connection.close()
    assert len(spool(receiver.home)) == 4
    with socket.create_connection(("127.0.0.1", receiver.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n"
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 411")
    assert_still_serving(receiver, 4)


def test_serve_forever_and_stop(tmp_path: Path):
    receiver = Receiver(tmp_path / "home", port=0)
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        for _ in range(200):  # bound once serve_forever has started
            if receiver.port:
                break
            threading.Event().wait(0.01)
        status, _, _ = post(receiver.url, json_request("0000000000000001"))
        assert status == 200
    finally:
        receiver.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert receiver.host == "127.0.0.1"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", receiver.port), timeout=1).close()
    assert len(spool(receiver.home)) == 1


def test_quiet_by_default(receiver: Receiver, capfd: pytest.CaptureFixture[str]):
    post(receiver.url, json_request("0000000000000001"))
    post(receiver.url, b"garbage", "application/x-protobuf")
    post(receiver.url.replace("/v1/traces", "/nope"), b"", method="GET")
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_concurrent_clients_write_whole_requests(receiver: Receiver):
    errors: list[Any] = []

    def client(worker: int) -> None:
        for i in range(10):
            ids = [f"{worker:04x}{i:04x}{j:08x}" for j in range(1, 6)]
            status, body, _ = post(receiver.url, json_request(*ids))
            if status != 200:
                errors.append((status, body))

    threads = [threading.Thread(target=client, args=(w + 1,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    records = spool(receiver.home)
    assert len(records) == len({r["span_id"] for r in records}) == 4 * 10 * 5
    # Each request's five spans are contiguous: one append per request.
    for k in range(0, len(records), 5):
        assert len({r["span_id"][:8] for r in records[k : k + 5]}) == 1
    assert receiver.stats()["accepted_requests"] == 40
