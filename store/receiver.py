"""The OTLP/HTTP trace receiver behind `tracegym collect`: any OpenTelemetry exporter -> spool.

    receiver = Receiver(home, port=4318, token="s3cret").start()   # background thread
    ...                                                             # agents export to
    receiver.stop()                                                 # receiver.url

`POST /v1/traces` takes an `ExportTraceServiceRequest` as `application/x-protobuf` (or
`application/protobuf`) or `application/json` (OTLP/JSON), optionally `Content-Encoding: gzip`
(or `deflate`), and answers with an `ExportTraceServiceResponse` in the request's encoding.
Errors follow OTLP/HTTP: the body is a `google.rpc.Status` in the request's encoding (plain
text when the encoding itself is unsupported), with

| status | when |
|--------|------|
| 400 | the body does not decode, or a span is invalid (the message says which and why); bad
  framing (a Content-Length or chunk size that is not plain digits / hex digits, over-long
  chunk or trailer lines, more than 10,000 gzip members) |
| 401 | a token is set and the `Authorization: Bearer` header is missing or wrong |
| 404 | any other path |
| 405 | any other method on /v1/traces |
| 408 | the body did not arrive whole within `body_deadline_s`, or stalled for `body_timeout_s` |
| 411 | no Content-Length (and not chunked) |
| 413 | the body, however framed, compressed or not, exceeds `max_body_bytes` |
| 415 | another Content-Type or Content-Encoding |
| 501 | a Transfer-Encoding other than `chunked` |
| 503 | busy (see below), or the spool could not be written: the exporter retries |

`GET /healthz` answers 200 `{"status":"ok"}` without the token (it tells nothing else).

A request is all or nothing: it is converted whole (`tracegym.store.otlp`) before anything is
written, then its records go to the spool through one `SpoolAppender.append`, a single
O_APPEND write. The receiver binds 127.0.0.1 unless told otherwise, stays quiet unless
`log_requests=True`, and survives any input (a handler error answers 500 and is counted).

Bounded: bodies are read without holding a request slot (two clients trickling a byte at a
time once held both, and everyone else got 503), each charged as it arrives to one budget of
`max_buffered_bytes` (default 2 x `max_body_bytes`), so a slow client holds only what it sent.
Then at most `max_requests` requests (default 2) are converted at once. Each holds its body (at
most `max_body_bytes`), the decompressed copy and the converted records, about six times the
body for small spans (a 19 MiB request of 32,000 spans: ~120 MB), so memory stays near
`max_buffered_bytes + max_requests x 5 x max_body_bytes`. Measured, 8 concurrent 19 MiB
requests: 974 MB peak with all 8 converted at once (before slots), 337 MB with 2. With reading
outside the slots (a shared 2-core machine, 8 concurrent 19 MB OTLP/JSON requests, the peak RSS
of a receiver process idling at 135 MB): 415-464 MB, 2 served (427 MB, 2 served, before);
`max_buffered_bytes` at 4 x: 516-527 MB, 5-6 served. A body that finds the budget full, or a
read body that finds every slot busy, waits up to `busy_wait_s` (default 5 s), then gets 503
with `Retry-After: 1`, which OTLP/HTTP exporters retry; when every body holding part of the
budget waits for more, the last to arrive gets its 503 at once, so the others can finish. A
body must keep arriving (`body_timeout_s`, 10 s between reads) and arrive whole within
`body_deadline_s` (30 s from the request line; OTLP exporters give up after 10 s), or it gets
408 and the connection is closed. Connections beyond `max_connections` (default 1024, one
thread each) get a 503 at once. Gzip and deflate output stops at `max_body_bytes`; gzip members
cost time linear in the body (`store/receiver_body.py`).

Secrets are redacted before anything is written (on by default; `redact=False` turns it off),
with the tracer's `Redactor`: span, event, link and resource attributes at any depth, and status
messages. `stats()["redacted_spans"]` counts the spans that had one.
"""

from __future__ import annotations

import hmac
import json
import socket
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tracegym.store.otlp import (
    OTLPFormatError,
    count_spans_json,
    count_spans_protobuf,
    parse_json_body,
    parse_protobuf,
    records_from_json_object,
    records_from_request,
    redact_records,
)
from tracegym.store.receiver_body import MAX_GZIP_MEMBERS as MAX_GZIP_MEMBERS
from tracegym.store.receiver_body import BodyReader, ByteBudget, inflate, parse_content_length
from tracegym.store.receiver_body import HTTPError as _HTTPError
from tracegym.store.records import SpoolAppender
from tracegym.tracer.config import resolve_home
from tracegym.tracer.redact import Redactor

TRACES_PATH = "/v1/traces"
HEALTH_PATH = "/healthz"
DEFAULT_PORT = 4318
DEFAULT_MAX_BODY_BYTES = 20 << 20  # the OpenTelemetry Collector's default limit
DEFAULT_MAX_REQUESTS = 2  # conversion holds the GIL: more at once would only cost memory
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_BODY_DEADLINE_S = 30.0  # OTLP exporters give up after 10 s by default
RETRY_AFTER_S = 1

PROTOBUF_TYPES = frozenset({"application/x-protobuf", "application/protobuf"})
JSON_TYPE = "application/json"

# google.rpc.Code values for the Status body of each HTTP error.
_RPC_CODES = {
    400: 3, 401: 16, 404: 5, 405: 12, 408: 4, 411: 3, 413: 8, 415: 3, 500: 13, 501: 12, 503: 14
}  # fmt: skip


_COUNTERS = (
    "accepted_requests",
    "accepted_spans",
    "rejected_requests",
    "rejected_spans",
    "errors",
    "busy_requests",  # answered 503: no request slot or no room in the body budget in time
    "refused_connections",  # beyond `max_connections`
    "redacted_spans",
)
_BUSY_TEXT = b"too many connections; retry\n"
_BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
    % (RETRY_AFTER_S, len(_BUSY_TEXT), _BUSY_TEXT)
)


def _no_such_path(path: str) -> str:
    return f"no such path {path[:200]!r}; POST to {TRACES_PATH}"


def _status_protobuf(code: int, message: str) -> bytes:
    """A `google.rpc.Status` {code, message}, encoded by hand (two fields)."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            byte = n & 0x7F
            n >>= 7
            if n:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                return bytes(out)

    text = message.encode("utf-8")
    return b"\x08" + varint(code) + b"\x12" + varint(len(text)) + text


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    receiver: Receiver
    connections = 0  # handler threads alive (guarded by the receiver's lock)

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, up to `max_connections`; past that, 503 and close."""
        receiver = self.receiver
        with receiver._lock:
            full = self.connections >= receiver.max_connections
            if full:
                receiver._stats["refused_connections"] += 1
            else:
                self.connections += 1
        if not full:
            try:
                super().process_request(request, client_address)
            except BaseException:
                self._left()
                raise
            return
        try:  # never block the accept loop on this client: a best-effort answer
            request.setblocking(False)
            request.send(_BUSY_ANSWER)
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._left()

    def _left(self) -> None:
        with self.receiver._lock:
            self.connections -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-request (or any handler bug) must not print tracebacks
        # or take the server down; count it instead.
        self.receiver._count(errors=1)
        if self.receiver.log_requests:
            super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse their connection
    timeout = 60  # seconds a connection may sit idle (or stall mid-body) before it is closed
    server_version = "tracegym-otlp"
    sys_version = ""
    server: _Server

    # -- plumbing --------------------------------------------------------------------------

    _started = 0.0  # monotonic time the request line was read: the body's deadline runs from it

    def parse_request(self) -> bool:
        self._started = time.monotonic()
        return super().parse_request()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.receiver.log_requests:
            super().log_message(format, *args)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error(self, error: _HTTPError, media: str | None) -> None:
        headers = {}
        if error.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="tracegym"'
        if error.status == 405:
            headers["Allow"] = "POST"
        if error.retry_after is not None:
            headers["Retry-After"] = str(error.retry_after)
        code = _RPC_CODES.get(error.status, 2)
        if media in PROTOBUF_TYPES:
            body, content_type = _status_protobuf(code, error.message), "application/x-protobuf"
        elif media == JSON_TYPE:
            body = json.dumps({"code": code, "message": error.message}).encode()
            content_type = JSON_TYPE
        else:
            body, content_type = (error.message + "\n").encode(), "text/plain; charset=utf-8"
        self._send(error.status, body, content_type, headers, close=error.close)

    def _read_body(self, reader: BodyReader) -> bytes:
        coding = self.headers.get("Transfer-Encoding")
        if coding is not None:
            if coding.strip(" \t").lower() != "chunked":
                raise _HTTPError(
                    501, f"unsupported Transfer-Encoding {coding[:40]!r}; use chunked", close=True
                )
            return reader.read_chunked()
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise _HTTPError(411, "Content-Length required", close=True)
        length_header = lengths[0]
        if any(other != length_header for other in lengths):
            raise _HTTPError(400, "conflicting Content-Length headers", close=True)
        return reader.read_length(parse_content_length(length_header))

    # -- methods ---------------------------------------------------------------------------

    def do_POST(self) -> None:
        receiver = self.server.receiver
        media = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        try:
            self._post(receiver, media)
        except _HTTPError as error:
            receiver._count(rejected_requests=1)
            self._send_error(error, media)
        except (ConnectionError, TimeoutError):
            raise  # the client went away: nothing to answer
        except Exception as exc:  # a bug, not bad input: answer, count, keep serving
            receiver._count(rejected_requests=1, errors=1)
            if receiver.log_requests:
                import traceback

                traceback.print_exc(file=sys.stderr)
            self._send_error(
                _HTTPError(500, f"internal error: {type(exc).__name__}", close=True), media
            )

    def _post(self, receiver: Receiver, media: str) -> None:
        if self.path.split("?", 1)[0] != TRACES_PATH:
            raise _HTTPError(404, _no_such_path(self.path), close=True)
        if receiver.token is not None:
            given = self.headers.get("Authorization", "")
            scheme, _, credential = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                credential.strip().encode(), receiver.token.encode()
            ):
                raise _HTTPError(
                    401,
                    "missing or wrong bearer token" if given else "bearer token required",
                    close=True,
                )
        if media not in PROTOBUF_TYPES and media != JSON_TYPE:
            raise _HTTPError(
                415,
                f"unsupported Content-Type {media or '(none)'!r}; "
                "use application/x-protobuf or application/json",
                close=True,
            )
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip", "deflate"):
            raise _HTTPError(
                415, f"unsupported Content-Encoding {encoding!r}; use gzip or none", close=True
            )
        reader = BodyReader(
            self.rfile,
            self.connection,
            limit=receiver.max_body_bytes,
            budget=receiver._budget,
            deadline=self._started + receiver.body_deadline_s,
            stall_s=receiver.body_timeout_s,
            busy_wait_s=receiver.busy_wait_s,
            retry_after=RETRY_AFTER_S,
        )
        try:
            self._receive(receiver, media, encoding, reader)
        finally:
            reader.release()

    def _receive(self, receiver: Receiver, media: str, encoding: str, reader: BodyReader) -> None:
        """Read the body (no slot held: a slow client keeps no one else waiting), then, in
        one of `max_requests` slots, convert, redact and write it."""
        try:
            body = self._read_body(reader)
        finally:
            self.connection.settimeout(self.timeout)
            if reader.busy:
                receiver._count(busy_requests=1)
        if not receiver._slots.acquire(timeout=receiver.busy_wait_s):
            receiver._count(busy_requests=1)
            raise _HTTPError(
                503,
                f"busy: {receiver.max_requests} requests are being converted; retry",
                retry_after=RETRY_AFTER_S,
            )
        try:
            self._convert(receiver, media, encoding, body)
        finally:
            receiver._slots.release()

    def _convert(self, receiver: Receiver, media: str, encoding: str, body: bytes) -> None:
        spans = 0
        try:
            if encoding in ("gzip", "deflate"):
                body = inflate(body, encoding, receiver.max_body_bytes)
            if media == JSON_TYPE:
                request = parse_json_body(body)
                spans = count_spans_json(request) if isinstance(request, dict) else 0
                records = records_from_json_object(request)
            else:
                request = parse_protobuf(body)
                spans = count_spans_protobuf(request)
                records = records_from_request(request)
            redacted = redact_records(records, receiver.redactor) if receiver.redactor else 0
        except OTLPFormatError as exc:
            receiver._count(rejected_spans=spans)
            raise _HTTPError(400, str(exc)) from None
        if redacted:
            receiver._count(redacted_spans=redacted)
        if records:
            with receiver._write_lock:
                if receiver._stopped:
                    receiver._count(rejected_spans=len(records))
                    raise _HTTPError(503, "the receiver is shutting down", close=True)
                try:
                    receiver._appender.append(records)
                except OSError as exc:
                    receiver._count(rejected_spans=len(records))
                    message = f"could not write the spool: {exc.strerror or exc}"
                    raise _HTTPError(503, message) from None
        receiver._count(accepted_requests=1, accepted_spans=len(records))
        if media == JSON_TYPE:
            self._send(200, b"{}", JSON_TYPE)
        else:  # an empty ExportTraceServiceResponse encodes as no bytes
            self._send(200, b"", "application/x-protobuf")

    def _get(self) -> None:
        if self.path.split("?", 1)[0] != HEALTH_PATH:
            self._not_allowed()
            return
        # Liveness only: no counters, no configuration, nothing that needs the token.
        has_body = "Content-Length" in self.headers or "Transfer-Encoding" in self.headers
        self._send(200, b'{"status":"ok"}', JSON_TYPE, close=has_body)  # a body goes unread

    def _not_allowed(self) -> None:
        receiver = self.server.receiver
        receiver._count(rejected_requests=1)
        if self.path.split("?", 1)[0] == TRACES_PATH:
            error = _HTTPError(
                405, f"{self.command} not allowed; POST to {TRACES_PATH}", close=True
            )
        else:
            error = _HTTPError(404, _no_such_path(self.path), close=True)
        self._send_error(error, None)

    do_GET = do_HEAD = _get
    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed


class Receiver:
    """An OTLP/HTTP trace receiver writing into the spool of `home`.

    `start()` serves on a background thread (port 0 picks a free port; read `.port` after),
    `serve_forever()` serves on the calling thread until `stop()` (or Ctrl-C). Counters:
    `stats()`. Usable as a context manager (start / stop). `redact` (default True) scrubs
    secrets from what is received, with `redact_patterns` added to the built-in rules;
    `max_requests`, `max_buffered_bytes` (default 2 x `max_body_bytes`), `busy_wait_s`,
    `body_timeout_s`, `body_deadline_s` and `max_connections` bound memory, time and threads
    (see the module's docstring).
    """

    def __init__(
        self,
        home: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        token: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        *,
        log_requests: bool = False,
        redact: bool = True,
        redact_patterns: Iterable[str] = (),
        max_requests: int = DEFAULT_MAX_REQUESTS,
        busy_wait_s: float = 5.0,
        body_timeout_s: float = 10.0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        body_deadline_s: float = DEFAULT_BODY_DEADLINE_S,
        max_buffered_bytes: int | None = None,
    ) -> None:
        self.home = resolve_home(home)
        self.host = host
        self.port = port
        self.token = token or None
        self.max_body_bytes = int(max_body_bytes)
        self.log_requests = log_requests
        self.redactor = Redactor(redact_patterns) if redact else None
        self.max_requests = max(1, int(max_requests))
        self.busy_wait_s = max(0.0, float(busy_wait_s))
        self.body_timeout_s = max(0.1, float(body_timeout_s))
        self.max_connections = max(1, int(max_connections))
        self.body_deadline_s = max(0.1, float(body_deadline_s))
        buffered = 2 * self.max_body_bytes if max_buffered_bytes is None else max_buffered_bytes
        self.max_buffered_bytes = max(self.max_body_bytes, int(buffered))  # one body always fits
        self._budget = ByteBudget(self.max_buffered_bytes)
        self._slots = threading.BoundedSemaphore(self.max_requests)
        self._appender = SpoolAppender(self.home)
        self._server: _Server | None = None
        self._serving = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # appends vs. closing the spool file on stop
        self._stopped = False
        self._stats = dict.fromkeys(_COUNTERS, 0)

    # -- counters ------------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._stats[key] += delta

    def stats(self) -> dict[str, int]:
        """accepted/rejected requests and spans, handler errors, busy (503) requests, refused
        connections and redacted spans, since start."""
        with self._lock:
            return dict(self._stats)

    @property
    def accepted_spans(self) -> int:
        return self.stats()["accepted_spans"]

    @property
    def rejected_spans(self) -> int:
        return self.stats()["rejected_spans"]

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{TRACES_PATH}"

    def _bind(self) -> _Server:
        if self._server is None:
            self._stopped = False
            cls = _Server6 if ":" in self.host else _Server
            server = cls((self.host, self.port), _Handler)
            server.receiver = self
            self.port = server.server_address[1]
            self._server = server
        return self._server

    def start(self) -> Receiver:
        """Bind and serve on a daemon thread; returns self."""
        server = self._bind()
        if self._thread is None:
            self._serving = True
            self._thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"tracegym-otlp-{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on this thread until `stop()` is called from another (or KeyboardInterrupt)."""
        server = self._bind()
        self._serving = True
        try:
            server.serve_forever(poll_interval=0.05)
        finally:
            self._serving = False
            self._close()

    def stop(self) -> None:
        """Stop serving, close the socket and the spool file (compaction may then take it)."""
        server = self._server
        if server is not None and self._serving:
            server.shutdown()  # returns once serve_forever has left its loop
            self._serving = False
            if self._thread is not None:
                self._thread.join(timeout=5)
                self._thread = None
        self._close()

    def _close(self) -> None:
        if self._server is not None:
            self._server.server_close()
            self._server = None
        with self._write_lock:  # requests still in flight on open connections get a 503
            self._stopped = True
            self._appender.close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
