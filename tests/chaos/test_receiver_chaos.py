"""The OTLP receiver under hostile input and load.

- Times that do not fit the store's BIGINT nanoseconds (`startTimeUnixNano = 2**70` was
  accepted and stored as NULL) or are negative: 400, naming the span; nothing written.
- One thread per connection and no cap (8 concurrent 19 MiB requests peaked at 555 MB): now at
  most `max_requests` requests are converted at once, and the bodies being read hold at most
  `max_buffered_bytes` (not request slots, which slow clients could hold); a body that
  finds no room waits `busy_wait_s`, then gets 503 + Retry-After; a stalled body gets 408 after
  `body_timeout_s`; connections beyond `max_connections` get a 503 at once. The server answers
  normally afterwards.
- Secrets in received spans reached the spool verbatim: now redacted by default (grep the raw
  spool bytes), with `redact=False` to keep them.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from tracegym.store.receiver import Receiver
from tracegym.tracer.spool import iter_spool

pytestmark = pytest.mark.timeout(60)

TRACE = "0af7651916cd43dd8448eb211c80319c"
T0 = 1_700_000_000_000_000_000
MAX_NS = 2**63 - 1


def post(
    url: str, body: bytes, content_type: str = "application/json"
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def kv(key: str, value: Any) -> dict[str, Any]:
    return {"key": key, "value": value}


def span(span_id: str = "00f067aa0ba902b7", name: str = "execute_tool lookup", **fields) -> dict:
    return {
        "traceId": TRACE,
        "spanId": span_id,
        "name": name,
        "startTimeUnixNano": str(T0),
        "endTimeUnixNano": str(T0 + 1000),
        **fields,
    }


def request_of(*spans: dict, resource: list | None = None) -> bytes:
    resource_spans = {"resource": {"attributes": resource or []}, "scopeSpans": [{"spans": spans}]}
    return json.dumps({"resourceSpans": [resource_spans]}).encode()


def spool_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((home / "spool").rglob("*")) if p.is_file())


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def receiver(home: Path) -> Iterator[Receiver]:
    with Receiver(home, port=0) as rec:
        yield rec


# -- out-of-range times -------------------------------------------------------------------------

BAD_TIMES = [
    ({"startTimeUnixNano": str(2**70)}, "startTimeUnixNano"),
    ({"startTimeUnixNano": 2**70}, "startTimeUnixNano"),
    ({"startTimeUnixNano": str(MAX_NS + 1)}, "startTimeUnixNano"),
    ({"endTimeUnixNano": str(2**64 - 1)}, "endTimeUnixNano"),
    ({"startTimeUnixNano": "-1"}, "startTimeUnixNano"),
    ({"endTimeUnixNano": -5}, "endTimeUnixNano"),
    ({"events": [{"name": "e", "timeUnixNano": str(2**70)}]}, "timeUnixNano"),
    ({"events": [{"name": "e", "timeUnixNano": "-1"}]}, "timeUnixNano"),
    ({"attributes": [kv("n", {"intValue": str(2**70)})]}, "intValue"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_TIMES)
def test_out_of_range_times_are_refused_naming_the_span(receiver, home, fields, field):
    good = span("00f067aa0ba902b7")
    bad = span("00f067aa0ba902b8", name="execute_tool clock", **fields)
    status, body, _ = post(receiver.url, request_of(good, bad))
    assert status == 400, body
    message = json.loads(body)["message"]
    assert "spans[1]" in message and field in message, message
    assert not list(iter_spool(home))  # all or nothing: the good span is not written either


@pytest.mark.parametrize("value", [2**63, 2**64 - 1])
def test_out_of_range_times_are_refused_in_protobuf(receiver, home, value):
    request = ExportTraceServiceRequest()
    pb = request.resource_spans.add().scope_spans.add().spans.add()
    pb.trace_id, pb.span_id, pb.name = bytes.fromhex(TRACE), b"\x01" * 8, "execute_tool pb"
    pb.start_time_unix_nano, pb.end_time_unix_nano = value, T0
    status, body, _ = post(receiver.url, request.SerializeToString(), "application/x-protobuf")
    assert status == 400
    assert b"spans[0]" in body and b"startTimeUnixNano" in body and b"execute_tool pb" in body
    assert not list(iter_spool(home))


def test_largest_time_and_end_before_start_are_kept(receiver, home):
    last = span("00f067aa0ba902b7", startTimeUnixNano=str(MAX_NS - 1), endTimeUnixNano=str(MAX_NS))
    skewed = span("00f067aa0ba902b8", startTimeUnixNano=str(T0 + 5), endTimeUnixNano=str(T0))
    assert post(receiver.url, request_of(last, skewed))[0] == 200
    receiver.stop()
    records = {r["span_id"]: r for r in iter_spool(home)}
    assert records["00f067aa0ba902b7"]["end_ns"] == MAX_NS
    assert records["00f067aa0ba902b8"]["end_ns"] < records["00f067aa0ba902b8"]["start_ns"]


# -- bounded concurrency ------------------------------------------------------------------------


def stall(receiver: Receiver, length: int = 100_000, sent: int = 1) -> socket.socket:
    """A client that sends its headers and the first `sent` bytes of the body, then nothing."""
    sock = socket.create_connection(("127.0.0.1", receiver.port), timeout=10)
    sock.sendall(
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n{" % length + b" " * (sent - 1)
    )
    return sock


def wait_for_buffered(receiver: Receiver, n: int) -> None:
    """Until the stalled bodies' bytes are held (counted in the receiver's body budget)."""
    deadline = time.monotonic() + 10
    while receiver._budget.used < n:
        assert time.monotonic() < deadline, "the stalled bodies were never read"
        time.sleep(0.01)


def test_the_body_beyond_the_budget_is_refused_and_the_server_recovers(home):
    """Bodies being read may hold `max_buffered_bytes` at once (no longer
    `max_requests` bodies, which two slow clients could hold); past it, 503 + Retry-After."""
    with Receiver(
        home, port=0, max_body_bytes=100_000, max_buffered_bytes=200_000, busy_wait_s=0.2
    ) as receiver:
        stalled = [stall(receiver, sent=99_999), stall(receiver, sent=99_999)]
        try:
            wait_for_buffered(receiver, 2 * 99_999)
            start = time.monotonic()
            status, _, headers = post(receiver.url, request_of(span()))
            assert status == 503
            assert headers.get("Retry-After") == "1"  # what OTLP/HTTP exporters honour
            assert time.monotonic() - start < 0.2 + 5.0  # waited briefly, did not hang
            assert receiver.stats()["busy_requests"] == 1
        finally:
            for sock in stalled:
                sock.close()
        # the hung-up bodies free their bytes: requests are accepted again
        deadline = time.monotonic() + 10
        while post(receiver.url, request_of(span()))[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while receiver._budget.used:  # given back once each answer is sent
            assert time.monotonic() < deadline, "bytes left in the budget"
            time.sleep(0.01)


def test_a_waiting_request_gets_the_freed_room(home):
    with Receiver(
        home, port=0, max_body_bytes=100_000, max_buffered_bytes=100_000, busy_wait_s=8
    ) as receiver:
        stalled = stall(receiver, sent=99_999)
        wait_for_buffered(receiver, 99_999)
        result: list[int] = []
        waiter = threading.Thread(
            target=lambda: result.append(post(receiver.url, request_of(span()))[0])
        )
        waiter.start()
        time.sleep(0.3)
        assert not result  # waiting for room ...
        stalled.close()
        waiter.join(10)
        assert result == [200]  # ... and served once there was some


def test_a_stalled_body_is_answered_408_and_gives_its_bytes_back(home):
    with Receiver(home, port=0, busy_wait_s=0.1, body_timeout_s=0.5) as receiver:
        stalled = stall(receiver, sent=5_000)  # never closed by the client
        try:
            answer = b""
            while chunk := stalled.recv(4096):  # the receiver answers, then hangs up on it
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert b"stopped arriving" in answer
            assert receiver._budget.used == 0
            assert post(receiver.url, request_of(span()))[0] == 200
        finally:
            stalled.close()


def test_connections_beyond_the_cap_are_refused_at_once(home):
    with Receiver(home, port=0, max_connections=3) as receiver:
        idle = [socket.create_connection(("127.0.0.1", receiver.port), timeout=10) for _ in "abc"]
        try:
            # accepted in order: the fourth is answered (before it says anything) and closed
            with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as fourth:
                answer = b""
                while chunk := fourth.recv(4096):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1\r\n" in answer
            assert receiver.stats()["refused_connections"] == 1
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 10  # the idle ones gone, connections are served again
        while True:
            try:
                if post(receiver.url, request_of(span()))[0] == 200:
                    break
            except urllib.error.URLError:  # refused while sending: the server's threads for
                pass  # the closed ones have not noticed yet
            assert time.monotonic() < deadline
            time.sleep(0.05)


# -- redaction -----------------------------------------------------------------------------------

SECRETS = {
    "password": "hunter2-Tr0ub4dor",
    "openai": "sk-proj-abcdefghijklmnopqrstuvwxyz012345",
    "bearer": "eW91LXNob3VsZC1ub3Qtc2VlLW1l",
    "api_key": "zq8RkW3mPx71",
}


def secret_request() -> bytes:
    nested = {
        "kvlistValue": {
            "values": [
                kv("api_key", {"stringValue": SECRETS["api_key"]}),
                kv("deeper", {"arrayValue": {"values": [{"stringValue": "ok"}]}}),
            ]
        }
    }
    attributes = [
        kv("tool.name", {"stringValue": "shell"}),
        kv("input.value", {"stringValue": f"export DB_PASSWORD={SECRETS['password']}"}),
        kv("llm.key", {"stringValue": f"using {SECRETS['openai']} now"}),
        kv("config", nested),
        kv("headers", {"arrayValue": {"values": [
            {"stringValue": f"Authorization: Bearer {SECRETS['bearer']}"},
            {"kvlistValue": {"values": [kv("note", {"stringValue": "fine"})]}},
        ]}}),
    ]  # fmt: skip
    event = {
        "name": "log",
        "timeUnixNano": str(T0 + 1),
        "attributes": [kv("message", {"stringValue": f"password={SECRETS['password']}"})],
    }
    spans = [
        span("00f067aa0ba902b7", attributes=attributes, events=[event]),
        span(
            "00f067aa0ba902b8",
            status={"code": 2, "message": f"401 for key {SECRETS['openai']}"},
        ),
        span("00f067aa0ba902b9", attributes=[kv("tool.name", {"stringValue": "clean"})]),
    ]
    resource = [kv("process.command_args", {"stringValue": f"--password={SECRETS['password']}"})]
    return request_of(*spans, resource=resource)


def test_received_secrets_never_reach_the_spool(receiver, home):
    assert post(receiver.url, secret_request())[0] == 200
    receiver.stop()  # closes the spool file
    raw = spool_bytes(home)
    assert raw  # the spans were written ...
    for name, secret in SECRETS.items():
        assert secret.encode() not in raw, name  # ... without their secrets
    assert b"[REDACTED]" in raw
    assert b"fine" in raw and b"shell" in raw  # what is not a secret stays
    assert receiver.stats()["redacted_spans"] == 3  # the clean one has the secret resource


def test_redaction_can_be_turned_off(home):
    with Receiver(home, port=0, redact=False) as receiver:
        assert post(receiver.url, secret_request())[0] == 200
    raw = spool_bytes(home)
    assert all(secret.encode() in raw for secret in SECRETS.values())
    assert receiver.stats()["redacted_spans"] == 0


def test_the_whole_secret_corpus_is_redacted_on_the_receiver_path(receiver, home):
    """The tracer's corpus (gitleaks/detect-secrets shapes) sent over OTLP: none reach disk."""
    from tests.chaos.secret_corpus import INNOCENT
    from tests.chaos.secret_corpus import SECRETS as CORPUS

    spans = [
        span(f"{i + 1:016x}", attributes=[kv("input.value", {"stringValue": text})])
        for i, (_, text, _) in enumerate(CORPUS)
    ]
    innocent = span("0fffffffffffffff", attributes=[
        kv(f"note.{i}", {"stringValue": text}) for i, text in enumerate(INNOCENT)
    ])  # fmt: skip
    assert post(receiver.url, request_of(*spans, innocent))[0] == 200
    receiver.stop()
    raw = spool_bytes(home).decode()
    leaked = [name for name, _, secret in CORPUS if secret in raw]
    assert leaked == []
    # what is not a secret arrives intact (JSON-escaped as the spool writes it)
    assert all(json.dumps(text)[1:-1] in raw for text in INNOCENT)
