"""OTLP/HTTP export to a receiver on 127.0.0.1 inside the test, and to a dead endpoint."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import tracegym as tg
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from tracegym.tracer import semconv as sc

pytestmark = pytest.mark.timeout(120)

SECRET = "sk-proj-Ab3dEfGhIjKlMnOpQrStUvWx1234567890"


class Receiver:
    """A minimal OTLP/HTTP trace receiver: POST /v1/traces with a protobuf body."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes, ExportTraceServiceRequest]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.requests.append((self.path, headers, body, request))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list:
        return [
            span
            for _, _, _, request in self.requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(value_of(v) for v in any_value.array_value.values)
    return getattr(any_value, kind)


def attributes(span) -> dict:
    return {kv.key: value_of(kv.value) for kv in span.attributes}


@tg.tool
def search(query):
    return ["result for " + query]


@tg.llm(model="gpt-4o")
def complete(prompt):
    return {"usage": {"prompt_tokens": 9, "completion_tokens": 4}}


@tg.agent(name="exported", conversation_id="conv-1")
def exported(task):
    search(task)
    complete(f"answer {task} with key {SECRET}")
    return "ok"


def test_export_to_a_local_receiver(receiver, tracer_setup):
    tracer_setup(
        spool=False,
        otlp_endpoint=receiver.url,
        otlp_headers={"x-tenant": "acme"},
        flush_interval_s=0.05,
    )
    exported("refund policy")
    tg.record_outcome("run-x", success=False, reward=0.25)
    assert tg.flush()

    assert receiver.requests
    for path, headers, body, _ in receiver.requests:
        assert path == "/v1/traces"
        assert headers["content-type"] == "application/x-protobuf"
        assert headers["x-tenant"] == "acme"
        assert SECRET.encode() not in body  # redacted before it left the process

    spans = {span.name: span for span in receiver.spans()}
    assert sorted(spans) == [
        "chat gpt-4o",
        "execute_tool search",
        "invoke_agent exported",
        "tracegym.outcome",
    ]
    agent, tool, chat = (
        spans["invoke_agent exported"],
        spans["execute_tool search"],
        spans["chat gpt-4o"],
    )
    assert agent.parent_span_id == b""
    assert tool.parent_span_id == agent.span_id
    assert chat.parent_span_id == agent.span_id
    assert tool.trace_id == agent.trace_id == chat.trace_id
    assert len(agent.trace_id) == 16

    agent_attrs = attributes(agent)
    assert agent_attrs[sc.OPERATION] == "invoke_agent"
    assert agent_attrs[sc.AGENT_NAME] == "exported"
    assert agent_attrs[sc.CONVERSATION_ID] == "conv-1"
    assert agent_attrs[sc.RUN_ID] == agent.trace_id.hex()
    assert agent_attrs[sc.USED_TOKENS] == 13
    tool_attrs = attributes(tool)
    assert tool_attrs[sc.TOOL_NAME] == "search"
    assert tool_attrs[sc.TOOL_ARGUMENTS] == '{"query":"refund policy"}'
    assert tool_attrs[sc.STEP_INDEX] == 0
    chat_attrs = attributes(chat)
    assert chat_attrs[sc.REQUEST_MODEL] == "gpt-4o"
    assert (chat_attrs[sc.INPUT_TOKENS], chat_attrs[sc.OUTPUT_TOKENS]) == (9, 4)
    assert attributes(spans["chat gpt-4o"])[sc.STEP_INDEX] == 1

    outcome = spans["tracegym.outcome"]
    assert outcome.parent_span_id == b""
    assert outcome.trace_id != agent.trace_id
    outcome_attrs = attributes(outcome)
    assert outcome_attrs[sc.OUTCOME_TARGET] == "run-x"
    assert outcome_attrs[sc.OUTCOME_SUCCESS] is False
    assert outcome_attrs[sc.OUTCOME_REWARD] == 0.25

    scopes = {
        scope_spans.scope.name
        for _, _, _, request in receiver.requests
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
    }
    assert scopes == {sc.INSTRUMENTATION_SCOPE}
    stats = tg.stats()
    assert stats.counters["spans_exported.otlp"] == 4
    assert stats.spans_failed == 0


def test_errors_are_exported_with_status_and_event(receiver, tracer_setup):
    tracer_setup(spool=False, otlp_endpoint=receiver.url + "/v1/traces")

    @tg.tool
    def broken():
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        broken()
    assert tg.flush()
    (span,) = receiver.spans()
    assert span.status.code == 2  # STATUS_CODE_ERROR
    assert attributes(span)[sc.ERROR_TYPE] == "ValueError"
    assert [e.name for e in span.events] == ["exception"]
    assert attributes(span.events[0])["exception.message"] == "bad input"


def test_endpoint_from_the_environment(receiver, tracer_setup, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    tracer_setup(spool=False)
    search("env")
    assert tg.flush()
    assert [path for path, *_ in receiver.requests] == ["/v1/traces"]
    assert [s.name for s in receiver.spans()] == ["execute_tool search"]


def test_lone_surrogates_survive_otlp(receiver, tracer_setup):
    tracer_setup(spool=False, otlp_endpoint=receiver.url)
    search("bad \ud800 text")
    assert tg.flush()
    (span,) = receiver.spans()
    assert sc.TOOL_ARGUMENTS in attributes(span)


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_endpoint_never_blocks_or_raises(tracer_setup, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    tracer_setup(
        spool=False, otlp_endpoint=f"http://127.0.0.1:{closed_port()}", flush_interval_s=0.05
    )
    start = time.perf_counter()
    for _ in range(20):
        assert exported("nobody listens") == "ok"
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0  # 60 spans: the agent never waits for the network

    start = time.perf_counter()
    tg.flush(timeout_s=10)
    assert time.perf_counter() - start < 8.0
    deadline = time.time() + 10
    while tg.stats().spans_failed < 60 and time.time() < deadline:
        time.sleep(0.05)
    stats = tg.stats()
    assert stats.spans_failed == 60
    assert stats.counters["spans_failed.otlp"] == 60
    assert stats.spans_exported == 0
    assert stats.spans_queued == 0
