"""The OTLP receiver against an attacker's bodies, and its health check.

- 7: a chunk size of `-1` read the rest of the stream (400 MiB buffered before a 400). Every
  framing now keeps the body limit: strict chunk sizes, extensions bounded, chunked gzip bombs.
- 8: 200,000 empty gzip members took quadratic time (`unused_data` copied the rest per member).
  The bytes handed to zlib are counted here: linear in the body, not in members x body.
- 9: two bodies trickling one byte at a time held both request slots: everyone else got 503 for
  as long as they trickled. Bodies are now read outside the slots (a byte budget bounds their
  memory) and cut at a whole-body deadline with 408.
- 10: `GET /healthz` answered 404.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracegym.store import receiver as receiver_module
from tracegym.store.receiver import Receiver
from tracegym.tracer.spool import iter_spool

pytestmark = pytest.mark.timeout(60)

TRACE = "0af7651916cd43dd8448eb211c80319c"
T0 = 1_700_000_000_000_000_000
HEADERS = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def body_of(*span_ids: str) -> bytes:
    spans = [
        {
            "traceId": TRACE,
            "spanId": span_id,
            "name": "execute_tool lookup",
            "startTimeUnixNano": str(T0),
            "endTimeUnixNano": str(T0 + 1000),
        }
        for span_id in span_ids
    ]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


def connect(receiver: Receiver) -> socket.socket:
    return socket.create_connection(("127.0.0.1", receiver.port), timeout=10)


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (10 s hang guard per read)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def post(receiver: Receiver, body: bytes, extra: bytes = b"") -> bytes:
    with connect(receiver) as sock:
        sock.sendall(
            HEADERS + extra + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
        )
        return answer(sock)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def receiver(home: Path) -> Iterator[Receiver]:
    with Receiver(home, port=0, max_body_bytes=4096) as rec:
        yield rec


def assert_serving(receiver: Receiver, span_id: str = "00f067aa0ba902b7") -> None:
    reply = post(receiver, body_of(span_id))
    assert reply.startswith(b"HTTP/1.1 200 "), reply
    assert span_id in {r["span_id"] for r in iter_spool(receiver.home)}


# -- 7: chunked framing -------------------------------------------------------------------------


BAD_CHUNK_SIZES = [
    (b"-1", b"400"),  # int(..., 16) took it: read(-1) is "read to the end of the stream"
    (b"-10", b"400"),
    (b"+10", b"400"),
    (b"0x10", b"400"),
    (b"1_0", b"400"),
    (b"10 20", b"400"),
    (b"zz", b"400"),
    (b"", b"400"),
    (b"f" * 40, b"413"),  # a 160-bit size
    (b"1001", b"413"),  # 4097 > max_body_bytes
    (b"10;" + b"e" * 5000, b"400"),  # an extension longer than a chunk-size line may be
]


CHUNK_IDS = [size[:12].decode() or "empty" for size, _ in BAD_CHUNK_SIZES]


@pytest.mark.parametrize(("size", "status"), BAD_CHUNK_SIZES, ids=CHUNK_IDS)
def test_bad_chunk_sizes_are_refused_without_reading_on(receiver, home, size, status):
    """The answer comes while the client is still sending: nothing reads to the stream's end."""
    with connect(receiver) as sock:
        sock.sendall(HEADERS + b"Transfer-Encoding: chunked\r\n\r\n" + size + b"\r\n" + b"x" * 8192)
        reply = answer(sock)  # the client never shut its side: only the server can end this
    assert reply.startswith(b"HTTP/1.1 " + status), reply
    assert not list(iter_spool(home))
    assert_serving(receiver)


def test_chunk_extensions_and_trailers_are_accepted(receiver, home):
    body = body_of("00f067aa0ba902b7")
    framed = (
        b"%x;name=value;other\r\n%s\r\n" % (10, body[:10])
        + b"%X ; ext\r\n%s\r\n" % (len(body) - 10, body[10:])
        + b"0\r\nX-Trailer: 1\r\n\r\n"
    )
    with connect(receiver) as sock:
        sock.sendall(HEADERS + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + framed)
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 200 "), reply
    assert [r["span_id"] for r in iter_spool(home)] == ["00f067aa0ba902b7"]


def test_chunks_adding_up_past_the_limit_are_refused(receiver, home):
    with connect(receiver) as sock:
        sock.sendall(HEADERS + b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(5):  # 5 x 1000 > 4096
            sock.sendall(b"3e8\r\n" + b" " * 1000 + b"\r\n")
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 413 "), reply
    assert_serving(receiver)


@pytest.mark.parametrize("length", [b"-1", b"+5", b"1_0", b"5, 5", b"0x10"])
def test_bad_content_lengths_are_refused(receiver, length):
    with connect(receiver) as sock:
        sock.sendall(HEADERS + b"Content-Length: " + length + b"\r\n\r\n{}" + b" " * 20)
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 400 "), reply
    assert_serving(receiver)


def test_an_unknown_transfer_coding_is_refused(receiver):
    """`chunked` only: anything else (a substring of it, or another coding) is not guessed at."""
    for coding in (b"notchunked", b"gzip"):
        body = b"{}"
        with connect(receiver) as sock:
            sock.sendall(
                HEADERS + b"Transfer-Encoding: " + coding + b"\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            reply = answer(sock)
        assert reply.startswith(b"HTTP/1.1 501 "), (coding, reply)
    assert_serving(receiver)


def test_a_chunked_gzip_bomb_is_refused(receiver, home):
    bomb = gzip.compress(b" " * 1_000_000)
    assert len(bomb) < 4096
    with connect(receiver) as sock:
        sock.sendall(
            HEADERS + b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n"
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(bomb), bomb)
        )
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 413 ") and b"decompressed body exceeds" in reply, reply
    assert not list(iter_spool(home))


# -- 8: gzip members ----------------------------------------------------------------------------


class CountingInflater:
    """zlib's decompressor, counting the input bytes it is handed and hands back."""

    fed = 0

    def __init__(self, wbits: int) -> None:
        self._inner = zlib.decompressobj(wbits)

    def decompress(self, data: Any, max_length: int = 0) -> bytes:
        CountingInflater.fed += len(data)
        return self._inner.decompress(data, max_length)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name in ("unused_data", "unconsumed_tail"):
            CountingInflater.fed += len(value)
        return value


@pytest.fixture
def counting_zlib(monkeypatch: pytest.MonkeyPatch) -> type[CountingInflater]:
    import types

    fake = types.SimpleNamespace(decompressobj=CountingInflater, error=zlib.error)
    for module in {receiver_module, *_body_modules()}:
        if getattr(module, "zlib", None) is zlib:
            monkeypatch.setattr(module, "zlib", fake)
    CountingInflater.fed = 0
    return CountingInflater


def _body_modules() -> list[Any]:
    try:
        from tracegym.store import receiver_body
    except ImportError:
        return []
    return [receiver_body]


def test_many_gzip_members_cost_linear_work(counting_zlib, home):
    """5,000 empty members (100 KB): the old loop handed zlib ~250 MB (each member's
    `unused_data` is a copy of the rest); now a small multiple of the body (1.6 MB at most)."""
    members = 5_000
    body = gzip.compress(b"") * members
    with Receiver(home, port=0) as receiver:
        reply = post(receiver, body, b"Content-Encoding: gzip\r\n")
    assert reply.startswith(b"HTTP/1.1 400 "), reply  # empty JSON after inflating: invalid
    assert b"invalid JSON" in reply
    assert counting_zlib.fed <= 16 * len(body), counting_zlib.fed


def test_members_after_content_are_kept_and_capped(home):
    part1, part2 = body_of("00f067aa0ba902b7")[:30], body_of("00f067aa0ba902b7")[30:]
    with Receiver(home, port=0) as receiver:
        reply = post(
            receiver, gzip.compress(part1) + gzip.compress(part2), b"Content-Encoding: gzip\r\n"
        )
        assert reply.startswith(b"HTTP/1.1 200 "), reply
        cap = receiver_module.MAX_GZIP_MEMBERS
        reply = post(receiver, gzip.compress(b"") * (cap + 1), b"Content-Encoding: gzip\r\n")
        assert reply.startswith(b"HTTP/1.1 400 ") and b"gzip members" in reply, reply
        reply = post(receiver, gzip.compress(b"{}") + b"\0\0garbage", b"Content-Encoding: gzip\r\n")
        assert reply.startswith(b"HTTP/1.1 400 ") and b"invalid gzip body" in reply, reply
        reply = post(receiver, gzip.compress(b"{}")[:-3], b"Content-Encoding: gzip\r\n")
        assert reply.startswith(b"HTTP/1.1 400 ") and b"truncated gzip body" in reply, reply
    assert len(list(iter_spool(home))) == 1


# -- 9: slow bodies -----------------------------------------------------------------------------


class Trickle:
    """A client sending its body one byte at a time, every `every_s`, until answered."""

    def __init__(self, receiver: Receiver, length: int = 10_000, every_s: float = 0.05) -> None:
        self.sock = connect(receiver)
        self.sock.sendall(HEADERS + b"Content-Length: %d\r\n\r\n" % length)
        self.reply = b""
        self._stop = threading.Event()
        self._every_s = every_s
        self._length = length
        self._thread = threading.Thread(target=self._send, daemon=True)
        self._thread.start()

    def _send(self) -> None:
        try:
            for _ in range(self._length - 1):  # never the last byte
                self.sock.sendall(b" ")
                if self._stop.wait(self._every_s):
                    return
        except OSError:  # the server hung up: it answered
            pass

    def read_answer(self) -> bytes:
        self.reply = answer(self.sock)
        return self.reply

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close()


def test_trickling_bodies_hold_no_request_slot(home):
    """Two trickling bodies, two slots, no waiting for one: requests are served meanwhile."""
    with Receiver(home, port=0, max_requests=2, busy_wait_s=0) as receiver:
        slow = [Trickle(receiver), Trickle(receiver)]
        try:
            deadline = time.monotonic() + 10
            while receiver._server.connections < 2:  # both are being served
                assert time.monotonic() < deadline
                time.sleep(0.01)
            for i in range(3):
                assert_serving(receiver, f"{i + 1:016x}")
            assert receiver.stats()["busy_requests"] == 0
        finally:
            for client in slow:
                client.close()


def test_a_body_past_its_deadline_is_cut_with_408(home):
    """Bytes keep coming (the per-read timeout never fires), but the whole body is late."""
    with Receiver(home, port=0, max_requests=2, body_deadline_s=0.5, body_timeout_s=20) as receiver:
        slow = [Trickle(receiver), Trickle(receiver)]
        try:
            for client in slow:
                assert client.read_answer().startswith(b"HTTP/1.1 408 "), client.reply
        finally:
            for client in slow:
                client.close()
        assert_serving(receiver)
        assert receiver.stats()["rejected_requests"] == 2


def test_a_trickled_chunk_size_line_is_cut_at_the_deadline_too(home):
    """A line is read piece by piece, each read timed against the deadline: a chunk-size line
    sent a byte every 50 ms (1 KiB would take 51 s) is cut at 0.5 s."""
    with Receiver(home, port=0, body_deadline_s=0.5, body_timeout_s=20) as receiver:
        with connect(receiver) as sock:
            sock.sendall(HEADERS + b"Transfer-Encoding: chunked\r\n\r\n")
            stop = threading.Event()

            def trickle() -> None:
                try:
                    while not stop.wait(0.05):
                        sock.sendall(b"1")
                except OSError:
                    pass

            sender = threading.Thread(target=trickle, daemon=True)
            sender.start()
            try:
                reply = answer(sock)
            finally:
                stop.set()
                sender.join(10)
        assert reply.startswith(b"HTTP/1.1 408 "), reply
        assert_serving(receiver)


def test_bodies_beyond_the_byte_budget_wait_then_get_503(home):
    """Memory for bodies being read is bounded by `max_buffered_bytes`: one that does not fit
    waits `busy_wait_s` for room, then gets 503 + Retry-After; room freed, it is served."""
    with Receiver(
        home, port=0, max_body_bytes=4096, max_buffered_bytes=4096, busy_wait_s=0.2
    ) as receiver:
        holder = connect(receiver)
        holder.sendall(HEADERS + b"Content-Length: 4096\r\n\r\n" + b" " * 4000)
        try:
            deadline = time.monotonic() + 10
            while True:  # until the holder's 4000 bytes are counted
                reply = post(receiver, body_of("00f067aa0ba902b7"))
                if not reply.startswith(b"HTTP/1.1 200 "):
                    break
                assert time.monotonic() < deadline, "the budget never filled"
            assert reply.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1\r\n" in reply, reply
            assert receiver.stats()["busy_requests"] >= 1
        finally:
            holder.close()
        deadline = time.monotonic() + 10
        while not post(receiver, body_of("00f067aa0ba902b8")).startswith(b"HTTP/1.1 200 "):
            assert time.monotonic() < deadline, "the budget was not given back"
            time.sleep(0.05)


class Taker:
    """`budget.take` on its own thread, its result kept. It would wait an hour: only the
    budget's own rules end a wait here (join's 30 s is a hang guard)."""

    def __init__(self, budget: Any, ticket: int, n: int) -> None:
        self.result: bool | None = None
        self._thread = threading.Thread(
            target=lambda: setattr(self, "result", budget.take(ticket, n, time.monotonic() + 3600)),
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while ticket not in budget._waiting and self._thread.is_alive():  # waiting, or done
            assert time.monotonic() < deadline
            time.sleep(0.005)

    def join(self) -> bool | None:
        self._thread.join(30)
        return self.result


def test_bodies_that_all_wait_for_room_do_not_wait_forever():
    """Three bodies hold the whole budget and each needs more: none would finish and give any
    back. The last to arrive gives up at once (503), then the next, until the first fits."""
    from tracegym.store.receiver_body import ByteBudget

    budget = ByteBudget(100)
    a, b, c = budget.ticket(), budget.ticket(), budget.ticket()
    for ticket, n in ((a, 40), (b, 40), (c, 20)):
        assert budget.take(ticket, n, time.monotonic())
    first = Taker(budget, a, 30)  # waits: the others may still finish
    second = Taker(budget, b, 30)  # waits too
    assert first.result is None and second.result is None
    assert budget.take(c, 10, time.monotonic() + 3600) is False  # all stuck: the last gives up
    budget.give(c)  # (the reader gives back what it held once answered)
    assert second.join() is False  # 80 + 30 > 100, still stuck: now b is the last
    budget.give(b)
    assert first.join() is True
    assert budget.used == 70


def test_room_goes_to_the_body_that_came_first():
    from tracegym.store.receiver_body import ByteBudget

    budget = ByteBudget(10)
    holder, early, late = budget.ticket(), budget.ticket(), budget.ticket()
    assert budget.take(holder, 10, time.monotonic())
    waiting_early = Taker(budget, early, 8)
    waiting_late = Taker(budget, late, 5)
    budget.give(holder)
    assert waiting_early.join() is True  # first come, first served ...
    assert waiting_late.result is None and late in budget._waiting  # ... 8 + 5 > 10: it waits
    budget.give(early)
    assert waiting_late.join() is True
    assert budget.used == 5


# -- 10: health --------------------------------------------------------------------------------


def test_healthz_answers_without_a_token_and_shows_none(home):
    with Receiver(home, port=0, token="s3cret-token") as receiver:
        for method in (b"GET", b"HEAD"):
            with connect(receiver) as sock:
                sock.sendall(method + b" /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                reply = answer(sock)
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), reply
            assert b"Content-Type: application/json" in head
            assert b"s3cret" not in reply
            if method == b"GET":
                assert json.loads(body) == {"status": "ok"}
            else:
                assert body == b""
        with connect(receiver) as sock:  # a POST there is still not a thing
            sock.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            assert answer(sock).startswith(b"HTTP/1.1 404 ")
