"""A dead OTLP endpoint must not hold `tg.flush(t)` past `t`, nor the agent's exit
past the shutdown bound, and the spans it swallowed are counted, not lost silently.

The endpoint is a black hole: a loopback socket that listens and never accepts, so the kernel
completes the connection and the request waits for an answer that never comes (before the fix,
`flush(1)` waited for each batch's export timeout, 5 s apiece, and returned True).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import tracegym as tg
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from tracegym.tracer.spool import iter_spool

pytestmark = pytest.mark.timeout(60)

SLACK_S = 2.0  # a loaded 2-core machine: thread start-up and joins, not exports

EMIT = """
import json, os, time
import tracegym as tg

tg.init(home="home", otlp_endpoint=os.environ["ENDPOINT"], flush_interval_s=0.05, {init_args})

@tg.tool
def ping(i):
    return i

for i in range({spans}):
    ping(i)
"""

REPORT = """
s = tg.stats()
print(json.dumps({"ok": ok, "took": took, "queued": s.spans_queued,
                  "exporting": getattr(s, "spans_exporting", 0), "counters": s.counters,
                  "t": time.time()}))
"""


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An OTLP endpoint that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _run(
    run_python, black_hole: str, body: str, *, spans: int, init_args: str = "", **env: str
) -> tuple:
    code = EMIT.format(spans=spans, init_args=init_args) + body + REPORT
    result = run_python(code, env={"ENDPOINT": black_hole, **env}, timeout=40)
    ended = time.time()
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return report, ended - report["t"], result.stderr


def _lost_at_exit(stderr: str) -> int:
    """Dropped + failed, from the one line tracegym logs at exit."""
    found = re.search(r"tracegym: (\d+) spans dropped and (\d+) failed", stderr)
    assert found, stderr[-2000:]
    return int(found[1]) + int(found[2])


def _otlp_accounted(counters: dict[str, int], *pending: int) -> int:
    keys = ("spans_exported.otlp", "spans_failed.otlp", "spans_dropped.otlp")
    return sum(counters.get(k, 0) for k in keys) + sum(pending)


def test_flush_keeps_its_timeout_and_exit_is_bounded(run_python, black_hole, tmp_path):
    body = "t0 = time.monotonic(); ok = tg.flush(1); took = time.monotonic() - t0\n"
    report, exit_s, stderr = _run(
        run_python, black_hole, body, spans=2000, TRACEGYM_SHUTDOWN_TIMEOUT_S="1"
    )
    assert report["ok"] is False  # nothing reached the endpoint: not True
    assert report["took"] < 1 + SLACK_S
    # every span is somewhere: queued, inside the hanging export, or counted
    assert _otlp_accounted(report["counters"], report["queued"], report["exporting"]) == 2000
    # the spool pipeline was flushed at the same time, not behind the dead endpoint
    assert report["counters"]["spans_exported.spool"] == 2000
    assert exit_s < 1 + SLACK_S  # the documented bound we asked for, not the export timeouts
    assert _lost_at_exit(stderr) == 2000  # reported at exit: the OTLP copies that never left
    assert sum(1 for _ in iter_spool(tmp_path / "home")) == 2000


def test_exit_waits_the_default_bound_at_most(run_python, black_hole):
    _, exit_s, stderr = _run(
        run_python, black_hole, "ok = None; took = 0\n", spans=600, init_args="spool=False"
    )
    assert exit_s < 3.0 + SLACK_S  # TRACEGYM_SHUTDOWN_TIMEOUT_S's default: 3 s
    assert _lost_at_exit(stderr) == 600


def test_shutdown_counts_what_it_could_not_export(run_python, black_hole):
    body = """
t0 = time.monotonic(); tg.shutdown(0.5); took = time.monotonic() - t0
ok = None
"""
    report, _, _ = _run(
        run_python, black_hole, body, spans=1500, init_args="spool=False, shutdown_timeout_s=30"
    )
    assert report["took"] < 0.5 + SLACK_S  # the argument wins over init's 30 s
    counters = report["counters"]
    assert counters["spans_dropped.shutdown_timeout.otlp"] > 0
    lost = counters["spans_dropped.shutdown_timeout.otlp"]
    assert _otlp_accounted(counters, lost) == 1500


class Hanging(SpanExporter):
    """An exporter stuck in its first export until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def export(self, spans):
        self.release.wait(20)
        self.returned.set()
        return SpanExportResult.SUCCESS


def test_repeated_flushes_do_not_pile_up_and_late_exports_are_not_counted_twice(tracer_setup):
    hanging = Hanging()
    tracer_setup(spool=False, exporters=[hanging], flush_interval_s=30)

    @tg.tool
    def ping(i):
        return i

    for i in range(10):
        ping(i)
    threads = threading.active_count()
    try:
        assert not any(tg.flush(0.05) for _ in range(20))  # each one answers in time ...
        assert threading.active_count() <= threads + 1  # ... and they share one flush thread
        tg.shutdown(0.1)
        assert tg.stats().counters["spans_dropped.shutdown_timeout.Hanging"] == 10
    finally:
        hanging.release.set()
    assert hanging.returned.wait(10)
    deadline = time.monotonic() + 5
    while tg.stats().spans_exported < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    counters = tg.stats().counters  # the export ended after all: exported, no longer lost
    assert counters["spans_exported.Hanging"] == 10
    assert counters["spans_dropped.shutdown_timeout.Hanging"] == 0


def test_a_shutdown_that_returns_with_an_export_still_hanging_counts_its_spans():
    """The SDK's shutdown gets our timeout too, and may give up on its worker just before our
    deadline: its thread has ended, yet an export still holds spans that will never leave."""
    from opentelemetry.sdk.trace import TracerProvider
    from tracegym.tracer import internal
    from tracegym.tracer.processors import Background, CountingBatchSpanProcessor

    hanging = Hanging()
    batch = CountingBatchSpanProcessor(hanging, "hung", max_queue_size=64, schedule_delay_millis=10)
    tracer = TracerProvider().get_tracer("t")
    for i in range(5):
        span = tracer.start_span(f"s{i}")
        span.end()
        batch.on_end(span)
    deadline = time.monotonic() + 5
    while batch.exporting() < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    before = internal.snapshot()[0].get("spans_dropped.shutdown_timeout.hung", 0)
    try:
        returned = Background(lambda: None, "sdk-shutdown-gave-up")  # ends at once
        assert batch.finish_shutdown(returned, time.monotonic() + 1) == 5
        after = internal.snapshot()[0]["spans_dropped.shutdown_timeout.hung"]
        assert after - before == 5
    finally:
        hanging.release.set()
        batch.shutdown(1000)
