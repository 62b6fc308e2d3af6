"""Reading and inflating request bodies for the OTLP receiver, whatever the client sends.

Each bound here answers one way an attacker can make the receiver hurt:

- Framing: `Content-Length` is digits only, a chunk size is hex digits only (`-1` once meant
  "read to the end of the stream"), chunk-size and trailer lines are bounded, and the body,
  however framed, never passes `max_body_bytes`.
- Time: the whole body must arrive by a deadline, and each read waits at most `stall_s`; a
  client trickling one byte at a time is cut at the deadline (408) instead of holding on.
- Memory: the bytes of every body being read count against one `ByteBudget`, taken as they
  arrive, so slow clients hold only what they sent and fast clients are not made to wait for
  request slots held by them.
- Inflating: output stops at the limit (413); gzip members are walked with an offset into the
  body, feeding zlib pieces that grow while a member lasts, so many tiny members cost time
  linear in the body (each member's `unused_data` used to copy the whole rest), and there are
  at most `MAX_GZIP_MEMBERS` of them.
"""

from __future__ import annotations

import itertools
import re
import socket
import threading
import time
import zlib
from typing import BinaryIO

from tracegym.store.otlp import OTLPFormatError

MAX_GZIP_MEMBERS = 10_000  # real clients send one; concatenated files a few
MAX_LINE_BYTES = 1024  # a chunk-size line, extensions included, or one trailer line
MAX_TRAILER_BYTES = 8192
MAX_CHUNKS = 100_000  # ~200 bytes a chunk at least for a full body: bounds the per-chunk work
READ_BYTES = 64 << 10  # the most read from the socket at once

_HEX = re.compile(rb"[0-9A-Fa-f]+")
_DIGITS = re.compile(r"[0-9]+")


class HTTPError(Exception):
    """An answer to send instead of going on with the request."""

    def __init__(
        self, status: int, message: str, *, close: bool = False, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close  # the body was not (fully) read: the connection cannot be reused
        self.retry_after = retry_after


class ByteBudget:
    """At most `total` bytes of request bodies held at once, across all connections.

    Bodies take bytes as they arrive, so a slow client holds only what it sent. Waiters are
    served first come, first served. When every holder is waiting (each holds part of a body
    and needs more, none will finish to give some back), the last to arrive gives up
    (`take` returns False: a 503 the exporter retries) so the earlier ones can go on.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._held: dict[int, int] = {}  # ticket -> bytes held
        self._waiting: dict[int, int] = {}  # ticket -> bytes it waits for

    def ticket(self) -> int:
        """One per request, in arrival order."""
        return next(self._tickets)

    def take(self, ticket: int, n: int, wait_until: float) -> bool:
        """Reserve `n` bytes for `ticket`, waiting for room until the monotonic `wait_until`."""
        with self._cond:
            self._waiting[ticket] = n
            self._cond.notify_all()  # one more waiter: the others look again for a deadlock
            try:
                while not (self.used + n <= self.total and ticket == min(self._waiting)):
                    if self._stuck() and ticket == self._last_holder_waiting():
                        return False
                    left = wait_until - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                del self._waiting[ticket]
                self._cond.notify_all()
            self.used += n
            self._held[ticket] = self._held.get(ticket, 0) + n
            return True

    def give(self, ticket: int) -> None:
        """Give back everything `ticket` holds."""
        with self._cond:
            self.used -= self._held.pop(ticket, 0)
            self._cond.notify_all()

    def _stuck(self) -> bool:
        first = min(self._waiting)
        return self.used + self._waiting[first] > self.total and all(
            ticket in self._waiting for ticket in self._held
        )

    def _last_holder_waiting(self) -> int | None:
        return max((t for t in self._waiting if t in self._held), default=None)


def parse_content_length(value: str) -> int:
    """Digits only: `int()` would also take "+5", "1_0" and " 5 ", which other parsers read
    differently (a request smuggled past a proxy)."""
    value = value.strip(" \t")
    if not _DIGITS.fullmatch(value):
        raise HTTPError(400, f"invalid Content-Length {value[:40]!r}", close=True)
    return int(value)


class BodyReader:
    """Reads one body from `rfile` within the limits, charging `budget` for what it holds.

    What it takes from the budget is held until `release()`.
    """

    def __init__(
        self,
        rfile: BinaryIO,
        sock: socket.socket,
        *,
        limit: int,
        budget: ByteBudget,
        deadline: float,
        stall_s: float,
        busy_wait_s: float,
        retry_after: int,
    ) -> None:
        self._rfile = rfile
        self._sock = sock
        self._limit = limit
        self._budget = budget
        self._deadline = deadline
        self._stall_s = stall_s
        self._busy_wait_s = busy_wait_s
        self._retry_after = retry_after
        self._ticket = budget.ticket()
        self.busy = False  # refused for want of budget (a 503)

    def release(self) -> None:
        """Give back the bytes this body held: once it is answered, whatever happened."""
        self._budget.give(self._ticket)

    # -- bodies ------------------------------------------------------------------------------

    def read_length(self, length: int) -> bytes:
        if length > self._limit:
            raise HTTPError(
                413, f"body of {length} bytes exceeds the limit of {self._limit} bytes", close=True
            )
        body = bytearray()
        while len(body) < length:
            piece = self._recv(min(length - len(body), READ_BYTES))
            if not piece:
                raise HTTPError(400, "body shorter than its Content-Length", close=True)
            self._charge(len(piece))
            body += piece
        return bytes(body)

    def read_chunked(self) -> bytes:
        body = bytearray()
        for _ in range(MAX_CHUNKS):
            line = self._line("chunk size")
            size_text = line.split(b";", 1)[0].strip(b" \t")
            if not _HEX.fullmatch(size_text):
                raise HTTPError(400, f"invalid chunk size {size_text[:40]!r}", close=True)
            size = int(size_text, 16)  # at most ~1,000 digits: the line is bounded
            if size == 0:
                self._trailers()
                return bytes(body)
            if len(body) + size > self._limit:
                raise HTTPError(413, f"body exceeds the limit of {self._limit} bytes", close=True)
            end = len(body) + size
            while len(body) < end:
                piece = self._recv(min(end - len(body), READ_BYTES))
                if not piece:
                    raise HTTPError(400, "truncated chunked body", close=True)
                self._charge(len(piece))
                body += piece
            if self._line("chunk end"):
                raise HTTPError(400, "chunk data longer than its size", close=True)
        raise HTTPError(400, f"more than {MAX_CHUNKS} chunks", close=True)

    # -- plumbing ----------------------------------------------------------------------------

    def _charge(self, n: int) -> None:
        wait_until = min(time.monotonic() + self._busy_wait_s, self._deadline)
        if not self._budget.take(self._ticket, n, wait_until):
            self.busy = True
            raise HTTPError(
                503,
                "busy: the bodies being received fill the receiver's memory budget; retry",
                close=True,
                retry_after=self._retry_after,
            )

    def _arm(self) -> None:
        """Time the next socket read: at most `stall_s`, and never past the deadline."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise HTTPError(408, "the body did not arrive in time", close=True)
        self._sock.settimeout(min(self._stall_s, left))

    def _recv(self, n: int) -> bytes:
        self._arm()
        try:
            return self._rfile.read1(n)  # type: ignore[attr-defined]  # one socket read at most
        except TimeoutError:
            raise HTTPError(408, "the body stopped arriving", close=True) from None

    def _line(self, what: str) -> bytes:
        """One line (without its CRLF or LF) of at most MAX_LINE_BYTES; each read re-armed, so a
        slowly sent line is cut at the deadline too."""
        line = bytearray()
        while True:
            self._arm()
            try:
                buffered = self._rfile.peek(1)  # type: ignore[attr-defined]  # reads once if empty
            except TimeoutError:
                raise HTTPError(408, "the body stopped arriving", close=True) from None
            if not buffered:
                raise HTTPError(400, f"truncated chunked body (in a {what} line)", close=True)
            end = buffered.find(b"\n")
            take = len(buffered) if end < 0 else end + 1
            take = min(take, MAX_LINE_BYTES + 1 - len(line))
            line += self._rfile.read(take)  # already buffered: no socket read
            if line.endswith(b"\n"):
                return bytes(line[:-2] if line.endswith(b"\r\n") else line[:-1])
            if len(line) > MAX_LINE_BYTES:
                raise HTTPError(400, f"{what} line longer than {MAX_LINE_BYTES} bytes", close=True)

    def _trailers(self) -> None:
        total = 0
        while line := self._line("trailer"):
            total += len(line)
            if total > MAX_TRAILER_BYTES:
                raise HTTPError(400, f"trailers longer than {MAX_TRAILER_BYTES} bytes", close=True)


# -- inflating ---------------------------------------------------------------------------------


def _too_big(limit: int) -> HTTPError:
    return HTTPError(413, f"decompressed body exceeds {limit} bytes")


def _gunzip(data: bytes, limit: int, max_members: int) -> bytes:
    view = memoryview(data)
    out = bytearray()
    offset = 0
    members = 0
    while offset < len(view):
        members += 1
        if members > max_members:
            raise OTLPFormatError(f"more than {max_members} gzip members")
        inflater = zlib.decompressobj(31)
        step = 64  # an empty member is 20 bytes: small first pieces keep tiny members cheap
        while not inflater.eof:
            if offset >= len(view):
                raise OTLPFormatError("truncated gzip body")
            piece = view[offset : offset + step]
            offset += len(piece)
            out += inflater.decompress(piece, limit + 1 - len(out))  # max_length >= 1
            if len(out) > limit or inflater.unconsumed_tail:
                raise _too_big(limit)
            step = min(step * 2, 1 << 20)
        offset -= len(inflater.unused_data)  # a copy of at most one piece
    return bytes(out)


def inflate(data: bytes, encoding: str, limit: int, max_members: int = MAX_GZIP_MEMBERS) -> bytes:
    """Undo gzip/deflate, refusing (413) output beyond `limit` bytes."""
    if encoding == "gzip":
        try:
            return _gunzip(data, limit, max_members)
        except zlib.error as exc:
            raise OTLPFormatError(f"invalid gzip body: {exc}") from None
    last_error: Exception | None = None
    for wbits in (15, -15):  # zlib-wrapped per RFC 9110, though some clients send it raw
        try:
            inflater = zlib.decompressobj(wbits)
            out = inflater.decompress(data, limit + 1)
            if len(out) > limit or inflater.unconsumed_tail:
                raise _too_big(limit)
            if not inflater.eof:
                raise OTLPFormatError(f"truncated {encoding} body")
            return out
        except zlib.error as exc:
            last_error = exc
    raise OTLPFormatError(f"invalid {encoding} body: {last_error}")
