"""`tracegym.init` / `flush` / `shutdown` / `stats`: provider reuse, re-initialisation,
OTEL_SDK_DISABLED, failing exporters and the bounded queue."""

from __future__ import annotations

import json
import threading
import time

import pytest
import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracegym.tracer import semconv as sc
from tracegym.tracer.spool import iter_spool

pytestmark = pytest.mark.timeout(120)


@tg.tool
def ping(n):
    return n


@tg.agent(name="pinger")
def pinger(count):
    return [ping(i) for i in range(count)]


class Recording(SpanExporter):
    """An exporter of the application's (or a test's) own that keeps what it gets."""

    def __init__(self) -> None:
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def names(self):
        return sorted(s.name for s in self.spans)


def test_init_reuses_the_applications_provider(tmp_path, tracer_setup):
    app_exporter = InMemorySpanExporter()
    app = TracerProvider()
    app.add_span_processor(SimpleSpanProcessor(app_exporter))
    ours = Recording()
    used = tracer_setup(provider=app, home=tmp_path, exporters=[ours], flush_interval_s=0.05)
    assert used is app

    pinger(3)
    assert tg.flush()
    expected = ["execute_tool ping"] * 3 + ["invoke_agent pinger"]
    # the application's own processor still receives every span ...
    assert sorted(s.name for s in app_exporter.get_finished_spans()) == expected
    # ... and so do tracegym's pipelines on the same provider: the extra exporter and the spool
    assert ours.names() == expected
    assert sorted(r["name"] for r in iter_spool(tmp_path)) == expected
    assert tg.stats().spans_exported == 8


def test_init_returns_the_data_directory(tmp_path, tracer_setup, monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider as TP

    assert tg.init(provider=TP(), home=tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.setenv("TRACEGYM_HOME", str(tmp_path / "from-env"))
    assert tg.init(provider=TP()) == tmp_path / "from-env"
    assert tg.init(provider=TP(), spool=False) is None
    monkeypatch.setenv("TRACEGYM_SPOOL", "0")
    assert tg.init(provider=TP()) is None
    tracer_setup(spool=False)  # leaves the clean-up to the fixture


def test_init_twice_does_not_duplicate_spans(tracer_setup):
    app_exporter = InMemorySpanExporter()
    app = TracerProvider()
    app.add_span_processor(SimpleSpanProcessor(app_exporter))
    first, second = Recording(), Recording()
    tracer_setup(provider=app, spool=False, exporters=[first])
    pinger(1)
    assert tg.flush()
    tracer_setup(provider=app, spool=False, exporters=[second])
    tracer_setup(provider=app, spool=False, exporters=[second])  # and a third time
    pinger(2)
    assert tg.flush()

    assert first.names() == ["execute_tool ping", "invoke_agent pinger"]
    # after re-init: each span once, to the latest pipelines only
    assert second.names() == ["execute_tool ping"] * 2 + ["invoke_agent pinger"]
    assert len(app_exporter.get_finished_spans()) == 5
    assert len({s.context.span_id for s in second.spans}) == 3


def test_init_on_another_provider_retires_the_old_pipelines(tracer_setup):
    old, new = Recording(), Recording()
    old_provider = tracer_setup(spool=False, exporters=[old])
    tracer_setup(spool=False, exporters=[new])
    pinger(1)
    # a span from the old provider no longer reaches tracegym's pipelines
    old_provider.get_tracer("app").start_span("straggler").end()
    assert tg.flush()
    assert old.names() == []
    assert new.names() == ["execute_tool ping", "invoke_agent pinger"]


def test_init_settings_reach_the_spans(tracer_setup):
    out = Recording()
    tracer_setup(spool=False, exporters=[out], capture_content=False, max_value_length=10)
    ping("x" * 100)
    assert tg.flush()
    (span,) = out.spans
    assert sc.TOOL_ARGUMENTS not in span.attributes
    tracer_setup(spool=False, exporters=[out], max_value_length=10)  # clamped to 64
    ping("y" * 100)
    assert tg.flush()
    args = out.spans[-1].attributes[sc.TOOL_ARGUMENTS]
    assert args.startswith('{"n":"' + "y" * 58)
    assert "…[truncated" in args


def test_init_redacts_in_every_pipeline(tracer_setup, tmp_path):
    out = Recording()
    tracer_setup(home=tmp_path, exporters=[out], redact_patterns=[r"ACME-\d{6}"])
    ping("order ACME-123456 with key sk-proj-Ab3dEfGhIjKlMnOpQrStUvWx1234567890")
    assert tg.flush()
    exported = out.spans[0].attributes[sc.TOOL_ARGUMENTS]
    spooled = next(iter_spool(tmp_path))["attributes"][sc.TOOL_ARGUMENTS]
    for text in (exported, spooled):
        assert "ACME-123456" not in text
        assert "sk-proj-" not in text
        assert "[REDACTED]" in text
    assert tg.stats().spans_redacted >= 2


def test_otel_sdk_disabled(monkeypatch, tracer_setup):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    app_exporter = InMemorySpanExporter()
    app = TracerProvider()
    app.add_span_processor(SimpleSpanProcessor(app_exporter))
    out = Recording()
    assert tg.init(provider=app, exporters=[out]) is None
    assert pinger(2) == [0, 1]
    tg.record_outcome("r", success=True)
    assert tg.flush()
    assert app_exporter.get_finished_spans() == ()
    assert out.spans == []
    assert tg.current_trace_id() is None
    stats = tg.stats()
    assert stats.spans_exported == 0
    assert stats.internal_errors == 0
    tracer_setup(spool=False)


class Exploding(SpanExporter):
    def export(self, spans):
        raise OSError("disk on fire")


class Refusing(SpanExporter):
    def export(self, spans):
        return SpanExportResult.FAILURE


def test_failing_exporters_are_counted_not_raised(tracer_setup):
    tracer_setup(spool=False, exporters=[Exploding(), Refusing()], flush_interval_s=0.05)
    assert pinger(4) == [0, 1, 2, 3]
    tg.flush()
    stats = tg.stats()
    assert stats.counters["spans_failed.Exploding"] == 5
    assert stats.counters["spans_failed.Refusing"] == 5
    assert stats.spans_failed == 10
    assert stats.spans_exported == 0
    assert stats.errors == {"export.Exploding": 1}


def test_spans_after_shutdown_are_counted(tracer_setup):
    tracer_setup(spool=False, exporters=[Recording()])
    tg.shutdown()
    assert ping(1) == 1
    assert tg.stats().spans_dropped == 1


class Blocking(SpanExporter):
    """Blocks the export thread until released: a backend that hangs."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans):
        self.entered.set()
        self.release.wait(30)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def test_full_queue_drops_and_counts_without_blocking(tracer_setup):
    blocking = Blocking()
    # a long interval: the export thread wakes only when a whole batch (16) is queued
    tracer_setup(spool=False, exporters=[blocking], max_queue_size=16, flush_interval_s=30)
    try:
        for i in range(16):  # one batch: the export thread takes it and hangs
            ping(i)
        assert blocking.entered.wait(10)
        start = time.perf_counter()
        assert pinger(299) == list(range(299))  # 300 spans while the exporter hangs
        elapsed = time.perf_counter() - start
        stats = tg.stats()
        assert stats.spans_queued == 16  # the queue stays bounded
        assert stats.spans_dropped == 300 - 16
        assert stats.counters["spans_dropped.Blocking"] == 300 - 16
    finally:
        blocking.release.set()
    assert elapsed < 3.0  # the agent never waited for the exporter
    assert tg.flush()
    stats = tg.stats()
    assert stats.spans_exported == blocking.exported == 32
    # nothing lost without being counted
    assert stats.spans_exported + stats.spans_dropped == 316
    assert stats.spans_queued == 0


def test_stats_shape(tracer_setup):
    out = Recording()
    tracer_setup(spool=False, exporters=[out])
    pinger(1)
    tg.flush()
    stats = tg.stats()
    assert isinstance(stats, tg.TracerStats)
    assert stats.spans_exported == 2
    assert stats.counters["spans_exported.Recording"] == 2
    assert (stats.spans_dropped, stats.spans_failed, stats.internal_errors) == (0, 0, 0)


GLOBAL_PROVIDER = """
import json, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import tracegym as tg
from tracegym.tracer.spool import iter_spool

app_exporter = InMemorySpanExporter()
app = TracerProvider()
app.add_span_processor(SimpleSpanProcessor(app_exporter))
trace.set_tracer_provider(app)           # the application's own, set before tracegym
home = tg.init(service="ignored", home="spool-home", flush_interval_s=0.05)
tg.init(home="spool-home", flush_interval_s=0.05)     # twice: no duplicates

@tg.tool
def t(x):
    return x

with trace.get_tracer("app").start_as_current_span("request"):
    t(1)
tg.flush()
print(json.dumps({
    "same_provider": trace.get_tracer_provider() is app,
    "app_spans": sorted(s.name for s in app_exporter.get_finished_spans()),
    "spooled": sorted(r["name"] for r in iter_spool(home)),
}))
"""


def test_init_adds_to_a_global_provider_set_by_the_application(run_python):
    result = run_python(GLOBAL_PROVIDER)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["same_provider"] is True
    assert out["app_spans"] == ["execute_tool t", "request"]
    # tracegym's pipeline sees every span of the provider, the application's own included
    assert out["spooled"] == ["execute_tool t", "request"]
