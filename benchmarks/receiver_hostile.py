"""The OTLP receiver against hostile bodies (bad framing, many gzip members, a gzip bomb): time
and peak memory, each beside a valid body of about the same size measured in the same run.

Server rows: every case gets a fresh receiver process (its peak RSS is a high-water mark), one
request over loopback; time is from the first byte sent to the answer's last, memory the
server's peak RSS and its growth over the idle process. Cases:

- `valid json` (the baseline): an OTLP/JSON request of `--mb` MB, Content-Length.
- `valid json gzip`: the same request gzip-compressed.
- `chunk -1 stream`: a chunk size of `-1`, then up to `--stream-mb` MB offered in 1 MiB writes
  until the server answers (what it buffered before answering shows in its memory).
- `empty gzip members N MB`: `N` MB of empty gzip members (20 bytes each), at 3 sizes.
- `gzip bomb`: `--bomb-mb` MB of zeros, gzip-compressed (~1/1000 of that on the wire).

Inflate rows (in process, cap on members lifted): the receiver's gunzip of many empty members
at the same 3 sizes, beside a valid gzip body of the same size (random bytes, one member), to
show the time per MB does not grow with the size.

    .venv/bin/python benchmarks/receiver_hostile.py [--mb 4] [--stream-mb 400] [--bomb-mb 1024]
    .venv/bin/python benchmarks/receiver_hostile.py --receiver-root /tmp/old  # another tree's
        receiver (a directory holding a `tracegym` package) for the server rows; inflate rows
        need this tree's
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import zlib
from dataclasses import dataclass
from pathlib import Path

HEADERS = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
T0 = 1_700_000_000_000_000_000
MB = 1_000_000


# -- the server process ------------------------------------------------------------------------


def serve(home: str) -> None:
    """Child: start a receiver, print its port, answer "rss" with the peak RSS in KiB."""
    from tracegym.store.receiver import Receiver

    with Receiver(home, port=0) as receiver:
        print(receiver.port, flush=True)
        for line in sys.stdin:
            if line.strip() == "rss":
                print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)


@dataclass
class Result:
    status: str
    seconds: float
    peak_mb: float
    growth_mb: float
    sent_mb: float


class Server:
    def __init__(self, home: Path, root: str | None) -> None:
        env = dict(os.environ)
        if root:
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(home)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.idle_kib = self.rss_kib()

    def rss_kib(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("rss\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def exchange(
    port: int, head: bytes, parts: list[bytes] | None, stream: bytes | None, stream_n: int
):
    """Send `head` and `parts` (or `stream` up to `stream_n` times, stopping once answered);
    returns (status line, seconds, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=600)
    answered = threading.Event()
    sent = [0]

    def send() -> None:
        try:
            sock.sendall(head)
            sent[0] += len(head)
            if parts is not None:
                for part in parts:
                    sock.sendall(part)
                    sent[0] += len(part)
            else:
                assert stream is not None
                for _ in range(stream_n):
                    if answered.is_set():
                        break
                    sock.sendall(stream)
                    sent[0] += len(stream)
        except OSError:
            pass  # the server answered and closed

    start = time.perf_counter()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
            if b"\r\n\r\n" in reply:
                head_end = reply.index(b"\r\n\r\n") + 4
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in reply[:head_end].split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                if len(reply) >= head_end + length:
                    break
    except OSError:
        pass
    seconds = time.perf_counter() - start
    answered.set()
    sock.close()
    sender.join(60)
    return reply.split(b"\r\n", 1)[0].decode(errors="replace"), seconds, sent[0]


def run_case(home: Path, root: str | None, head: bytes, parts=None, stream=None, n=0) -> Result:
    server = Server(home, root)
    try:
        status, seconds, sent = exchange(server.port, head, parts, stream, n)
        peak = server.rss_kib()
        return Result(status, seconds, peak / 1024, (peak - server.idle_kib) / 1024, sent / MB)
    finally:
        server.close()


def valid_json(size: int) -> bytes:
    """An OTLP/JSON request of about `size` bytes (spans of ~300 bytes)."""
    spans = []
    total = 0
    i = 0
    while total < size:
        span = {
            "traceId": f"{i // 20 + 1:032x}",
            "spanId": f"{i + 1:016x}",
            "name": "execute_tool lookup",
            "startTimeUnixNano": str(T0 + i),
            "endTimeUnixNano": str(T0 + i + 1000),
            "attributes": [
                {"key": "tool.name", "value": {"stringValue": "lookup"}},
                {"key": "input.value", "value": {"stringValue": f'{{"order": "W{i:08d}"}}'}},
            ],
        }
        spans.append(span)
        total += len(json.dumps(span)) + 2
        i += 1
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


def with_length(body: bytes, extra: bytes = b"") -> tuple[bytes, list[bytes]]:
    head = HEADERS + extra + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    return head, [body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20)]


def gzip_bomb(size_mb: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    parts = [packer.compress(zeros) for _ in range(size_mb * MB >> 20)]
    return b"".join(parts) + packer.flush()


def server_rows(args: argparse.Namespace, tmp: Path) -> None:
    body = valid_json(int(args.mb * MB))
    packed = gzip.compress(body, 6)
    member = gzip.compress(b"")
    bomb = gzip_bomb(args.bomb_mb)
    cases: list[tuple[str, dict]] = [
        ("valid json", dict(zip(("head", "parts"), with_length(body), strict=True))),
        (
            "valid json gzip",
            dict(
                zip(
                    ("head", "parts"),
                    with_length(packed, b"Content-Encoding: gzip\r\n"),
                    strict=True,
                )
            ),
        ),
        (
            "chunk -1 stream",
            {
                "head": HEADERS + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n",
                "stream": b"x" * (1 << 20),
                "n": int(args.stream_mb * MB) >> 20,
            },
        ),
    ]
    for size in args.member_mb:
        members = member * (int(size * MB) // len(member))
        head, parts = with_length(members, b"Content-Encoding: gzip\r\n")
        cases.append((f"empty gzip members {size:g} MB", {"head": head, "parts": parts}))
    head, parts = with_length(bomb, b"Content-Encoding: gzip\r\n")
    cases.append((f"gzip bomb {args.bomb_mb} MB", {"head": head, "parts": parts}))

    origin = f"receiver from {args.receiver_root}" if args.receiver_root else "this tree"
    print(f"server rows ({origin}; baseline: valid json of {len(body) / MB:.1f} MB):")
    print(
        f"  {'case':30s} {'sent':>9s} {'answer':28s} {'time':>9s} {'x base':>7s} "
        f"{'peak RSS':>9s} {'growth':>9s} {'x base':>7s}"
    )
    base: Result | None = None
    for i, (name, case) in enumerate(cases):
        result = run_case(tmp / f"home{i}", args.receiver_root, **case)
        base = base or result
        print(
            f"  {name:30s} {result.sent_mb:7.2f}MB {result.status[:28]:28s} "
            f"{result.seconds:8.3f}s {result.seconds / base.seconds:7.2f} "
            f"{result.peak_mb:7.0f}MB {result.growth_mb:7.0f}MB "
            f"{result.growth_mb / max(base.growth_mb, 1):7.2f}"
        )


# -- inflate rows ------------------------------------------------------------------------------


def measure(fn) -> tuple[float, float]:
    """(seconds, peak traced MB): timed alone (tracemalloc slows every allocation), then run
    again under tracemalloc for the peak."""
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    try:
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return seconds, peak / MB


def inflate_rows(args: argparse.Namespace) -> None:
    from tracegym.store.receiver_body import inflate

    limit = 20 << 20
    member = gzip.compress(b"")
    print("inflate rows (in process, no cap on members; baseline: one member of random bytes):")
    print(
        f"  {'size':>6s} {'members':>9s} {'time':>9s} {'per MB':>9s} {'baseline':>9s} "
        f"{'x base':>7s} {'peak':>8s} {'baseline':>8s}"
    )
    for size in args.member_mb:
        n = int(size * MB) // len(member)
        hostile = member * n
        valid = gzip.compress(os.urandom(len(hostile)), 1)
        base_s, base_peak = measure(lambda v=valid: inflate(v, "gzip", limit))

        seconds, peak = measure(lambda h=hostile, k=n: inflate(h, "gzip", limit, max_members=k))
        print(
            f"  {size:4g}MB {n:9,d} {seconds:8.3f}s {seconds / size:8.3f}s {base_s:8.3f}s "
            f"{seconds / base_s:7.1f} {peak:6.1f}MB {base_peak:6.1f}MB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--mb", type=float, default=4.0, help="size of the valid baseline body")
    parser.add_argument("--stream-mb", type=float, default=400.0)
    parser.add_argument("--bomb-mb", type=int, default=1024)
    parser.add_argument("--member-mb", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--receiver-root", default=None)
    parser.add_argument("--skip-inflate", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    with tempfile.TemporaryDirectory() as tmp:
        server_rows(args, Path(tmp))
    if not args.skip_inflate:
        inflate_rows(args)


if __name__ == "__main__":
    main()
