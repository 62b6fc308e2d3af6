"""Each span offered to a pipeline is counted once, as exported or as failed, and the
spool's `spans_exported.spool` is the number of lines on disk.

A span that a layer of the pipeline gave up on (the spool could not encode it, redaction or the
message filter failed on it) was counted failed by that layer and then exported again by
`CountingExporter`, which saw the batch succeed: exported + failed > offered."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import tracegym as tg
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracegym.tracer import export_filter, redact
from tracegym.tracer.export_filter import MessageFilteringExporter
from tracegym.tracer.processors import CountingExporter
from tracegym.tracer.redact import RedactingSpanExporter
from tracegym.tracer.spool import SpoolSpanExporter, spool_dir

pytestmark = pytest.mark.timeout(60)


class Unprintable:
    """A value the spool's JSON encoder rejects: its `str` (the encoder's fallback) raises."""

    def __str__(self) -> str:
        raise ValueError("no text for this value")


def finished_spans(n: int) -> list[ReadableSpan]:
    with tg.testing.capture() as cap:
        for i in range(n):
            with tg.tool("counted", arguments={"i": i}):
                pass
    return list(cap.spans)


def unencodable(like: ReadableSpan) -> ReadableSpan:
    """A copy of `like` carrying a value that cannot be encoded."""
    return ReadableSpan(
        name="unencodable",
        context=like.context,
        parent=like.parent,
        resource=like.resource,
        attributes={**(like.attributes or {}), "bad": Unprintable()},
        kind=like.kind,
        status=like.status,
        start_time=like.start_time,
        end_time=like.end_time,
        instrumentation_scope=like.instrumentation_scope,
    )


def delta(before: dict[str, int], name: str) -> tuple[int, int]:
    after = tg.stats().counters
    return tuple(  # type: ignore[return-value]
        after.get(f"{key}.{name}", 0) - before.get(f"{key}.{name}", 0)
        for key in ("spans_exported", "spans_failed")
    )


def totals() -> tuple[int, int]:
    stats = tg.stats()
    return stats.spans_exported, stats.spans_failed


def disk_ids(home: Path) -> list[str]:
    return [
        json.loads(line)["span_id"]
        for path in sorted(spool_dir(home).glob("*.jsonl"))
        for line in path.read_bytes().splitlines()
    ]


def ids(spans: list[ReadableSpan]) -> list[str]:
    return [format(span.context.span_id, "016x") for span in spans]


def test_an_unencodable_span_is_failed_once_and_the_rest_match_the_disk(tmp_path):
    good = finished_spans(3)
    batch = [good[0], unencodable(good[1]), good[1], good[2]]
    exporter = CountingExporter(SpoolSpanExporter(tmp_path), "spool")
    before, (exported0, failed0) = tg.stats().counters, totals()

    assert exporter.export(batch) is SpanExportResult.SUCCESS
    exporter.shutdown()

    assert disk_ids(tmp_path) == ids(good)
    assert delta(before, "spool") == (3, 1)  # lines on disk, the span that is not
    exported, failed = totals()
    assert (exported - exported0, failed - failed0) == (3, 1)  # once, under one key


def test_a_batch_of_only_unencodable_spans_exports_nothing(tmp_path):
    good = finished_spans(2)
    exporter = CountingExporter(SpoolSpanExporter(tmp_path), "spool")
    before = tg.stats().counters

    exporter.export([unencodable(span) for span in good])
    exporter.shutdown()

    assert disk_ids(tmp_path) == []
    assert delta(before, "spool") == (0, 2)


def test_a_full_disk_fails_the_whole_batch_once(tmp_path, monkeypatch):
    """ENOSPC on the write: none of the batch is on disk, each of its spans failed once (the
    unencodable one was counted by the encoder and again with the failed batch)."""
    good = finished_spans(3)
    exporter = CountingExporter(SpoolSpanExporter(tmp_path), "spool")
    assert exporter.export(good[:1]) is SpanExportResult.SUCCESS  # the file is open
    fd = exporter.exporter.writer._fd
    real_write = os.write

    def disk_full(target: int, data) -> int:
        if target == fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(target, data)

    before, (exported0, failed0) = tg.stats().counters, totals()
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", disk_full)
        result = exporter.export([unencodable(good[1]), good[1], good[2]])
    exporter.shutdown()

    assert result is SpanExportResult.FAILURE
    assert disk_ids(tmp_path) == ids(good[:1])
    assert delta(before, "spool") == (0, 3)
    exported, failed = totals()
    assert (exported - exported0, failed - failed0) == (0, 3)


def test_a_flush_over_a_dropped_span_reports_it_undelivered(tmp_path):
    """`CountingExporter.failed` (what a flush reads) sees a batch that lost a span."""
    good = finished_spans(2)
    exporter = CountingExporter(SpoolSpanExporter(tmp_path), "spool")
    exporter.export(good)
    assert exporter.failed == 0
    exporter.export([good[0], unencodable(good[1])])
    exporter.shutdown()
    assert exporter.failed == 1


def _refuse(*args, **kwargs):
    raise RuntimeError("cannot check this span")


@pytest.mark.parametrize("outcome", [SpanExportResult.SUCCESS, SpanExportResult.FAILURE])
def test_the_message_filter_drop_on_an_otlp_pipeline_is_counted_once(monkeypatch, outcome):
    """The OTLP pipeline's message filter gives up on a span: it is failed once, under the
    pipeline's name; the endpoint's answer decides the others."""
    spans = finished_spans(4)
    real = export_filter.without_messages

    def flaky(span):
        return _refuse() if span is spans[1] else real(span)

    class Endpoint(InMemorySpanExporter):
        def export(self, batch):
            super().export(batch)
            return outcome

    endpoint = Endpoint()
    exporter = CountingExporter(MessageFilteringExporter(endpoint), "otlp")
    monkeypatch.setattr(export_filter, "carries_no_messages", lambda spans: False)
    monkeypatch.setattr(export_filter, "without_messages", flaky)
    before, (exported0, failed0) = tg.stats().counters, totals()

    exporter.export(spans)

    sent = endpoint.get_finished_spans()
    assert ids(list(sent)) == ids([spans[0], *spans[2:]])
    expected = (3, 1) if outcome is SpanExportResult.SUCCESS else (0, 4)
    assert delta(before, "otlp") == expected
    exported, failed = totals()
    assert (exported - exported0, failed - failed0) == expected


def test_a_span_redaction_fails_on_is_counted_once(tmp_path, monkeypatch):
    spans = finished_spans(3)
    real = redact.redact_span

    def flaky(span, redactor):
        return _refuse() if span is spans[0] else real(span, redactor)

    exporter = CountingExporter(RedactingSpanExporter(SpoolSpanExporter(tmp_path)), "spool")
    monkeypatch.setattr(redact.Redactor, "batch_is_clean", lambda self, spans: False)
    monkeypatch.setattr(redact, "redact_span", flaky)
    before, (exported0, failed0) = tg.stats().counters, totals()

    exporter.export(spans)
    exporter.shutdown()

    assert disk_ids(tmp_path) == ids(spans[1:])
    assert delta(before, "spool") == (2, 1)
    exported, failed = totals()
    assert (exported - exported0, failed - failed0) == (2, 1)


def test_an_exporter_used_alone_still_counts_what_it_drops(tmp_path):
    """Outside a counted pipeline (a benchmark, an importer) the spool counts its own drops."""
    good = finished_spans(2)
    exporter = SpoolSpanExporter(tmp_path)
    before = tg.stats().counters
    exporter.export([good[0], unencodable(good[1])])
    exporter.shutdown()
    assert disk_ids(tmp_path) == ids(good[:1])
    assert delta(before, "spool") == (0, 1)
