"""Batching that never blocks the agent and never loses a span without counting it.

The SDK's BatchSpanProcessor ignores the timeout of `force_flush` (opentelemetry-python #4568)
and exports on the caller's thread, so a dead endpoint held `tracegym.flush(10)` for 50 s. Here a
flush or a shutdown runs on a daemon thread that the caller waits for until its deadline and no
longer; spans still queued or in an export when a shutdown's deadline passes are counted under
`spans_dropped.shutdown_timeout.<name>`.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from tracegym.tracer import internal
from tracegym.tracer.third_party import OWN_SCOPE, ForeignSpans


class Background:
    """One call on a daemon thread, waited for until a deadline and never longer.

    A daemon thread does not hold up the interpreter's exit; what it was doing when the caller
    stopped waiting is abandoned (and counted by whoever abandons it)."""

    def __init__(self, call: Callable[[], object], name: str) -> None:
        self._call = call
        self._name = name
        self.result: object = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self._call()
        except Exception as exc:
            internal.report_error(self._name, exc)

    def wait(self, deadline: float) -> bool:
        """True when the call finished before `deadline` (a `time.monotonic()` instant)."""
        self.thread.join(max(0.0, deadline - time.monotonic()))
        return not self.thread.is_alive()


def deadline_after(timeout_millis: float | None, default_s: float = 30.0) -> float:
    """The `time.monotonic()` instant `timeout_millis` from now (None: `default_s`)."""
    seconds = default_s if timeout_millis is None else max(0.0, timeout_millis / 1000)
    return time.monotonic() + seconds


class CountingExporter(SpanExporter):
    """Wraps an exporter to count what it delivered and what it failed to deliver.

    It also knows how many spans are inside an export right now, so that a shutdown that gives
    up on a hanging export can count them; if such an export ends later, it takes its spans back
    from the shutdown's count, so no span is counted twice."""

    def __init__(self, exporter: SpanExporter, name: str) -> None:
        self.exporter = exporter
        self.name = name
        self.failed = 0  # batches that lost a span, so a flush can tell it did not deliver
        self.abandoned_key = f"spans_dropped.shutdown_timeout.{name}"
        self._lock = threading.Lock()
        self._in_flight = 0
        self._abandoned = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Each span of the batch is counted once: exported, or failed (the whole batch when the
        export failed; else those its layers gave up on, see `internal.span_failed`)."""
        offered = len(spans)
        with self._lock:
            self._in_flight += offered
        try:
            with internal.counted_batch() as ledger:
                result = self.exporter.export(spans)
        except Exception as exc:
            internal.report_error(f"export.{self.name}", exc)
            result = SpanExportResult.FAILURE
        finally:
            with self._lock:
                self._in_flight -= offered
                late = self._abandoned
        if late:  # already counted as lost by the shutdown that gave up on us
            internal.add(self.abandoned_key, -offered)
        failed = offered
        if result is SpanExportResult.SUCCESS:
            failed = min(max(ledger.failed, 0), offered)
            if failed < offered:
                internal.add(f"spans_exported.{self.name}", offered - failed)
        if failed:
            self.failed += 1  # a flush over this batch did not deliver everything
            internal.add(f"spans_failed.{self.name}", failed)
        return result

    def in_flight(self) -> int:
        """Spans handed to the wrapped exporter whose export has not returned yet."""
        return self._in_flight

    def abandon(self, queued: int) -> int:
        """Count the `queued` spans and those in an export as lost; returns how many."""
        with self._lock:
            self._abandoned = True
            lost = queued + self._in_flight
        if lost:
            internal.add(self.abandoned_key, lost)
        return lost

    def shutdown(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception as exc:
            internal.report_error(f"shutdown.{self.name}", exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return self.exporter.force_flush(timeout_millis)
        except Exception as exc:
            internal.report_error(f"flush.{self.name}", exc)
            return False


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor, counting the spans its bounded queue drops.

    The SDK drops the oldest span when the queue is full and only logs it; we count each drop
    under `spans_dropped.<name>` so `tracegym.stats()` shows it. The queue stays bounded, so a
    dead backend costs at most `max_queue_size` spans of memory, never an agent stall.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        name: str,
        *,
        max_queue_size: int,
        schedule_delay_millis: float,
        max_export_batch_size: int = 512,
    ) -> None:
        self.counting = CountingExporter(exporter, name)
        self._flushing: Background | None = None
        self._flush_lock = threading.Lock()
        super().__init__(
            self.counting,
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_millis,
            max_export_batch_size=min(max_export_batch_size, max_queue_size),
        )
        self.name = name
        self._dropped_key = f"spans_dropped.{name}"
        # The SDK keeps its queue private; if a future release renames it we stop counting
        # drops rather than break the agent.
        self._inner = getattr(self, "_batch_processor", None)
        self._queue = getattr(self._inner, "_queue", None)
        self._capacity = max_queue_size

    def on_end(self, span: ReadableSpan) -> None:
        queue = self._queue
        if (queue is not None and len(queue) >= self._capacity) or getattr(
            self._inner, "_shutdown", False
        ):
            internal.add(self._dropped_key)
        BatchSpanProcessor.on_end(self, span)

    @property
    def done(self) -> bool:
        """True once shut down: later spans are dropped (and counted)."""
        return bool(getattr(self._inner, "_shutdown", False))

    def queued(self) -> int:
        """Spans waiting in the queue right now."""
        return len(self._queue) if self._queue is not None else 0

    def exporting(self) -> int:
        """Spans inside an export right now (a hanging endpoint holds them here)."""
        return self.counting.in_flight()

    def begin_flush(self) -> Background:
        """Start exporting what is queued on a daemon thread (or join the flush running).

        One flush at a time: an agent calling `flush` in a loop against a dead endpoint must not
        pile up threads waiting on the SDK's export lock."""
        with self._flush_lock:
            running = self._flushing
            if running is None or not running.thread.is_alive():
                failed_before = self.counting.failed

                def flush() -> bool:
                    delivered = BatchSpanProcessor.force_flush(self)
                    return bool(delivered) and self.counting.failed == failed_before

                running = self._flushing = Background(flush, f"tracegym-flush-{self.name}")
            return running

    def force_flush(self, timeout_millis: int | None = None) -> bool:
        """True when everything queued was exported before the timeout; never waits longer."""
        deadline = deadline_after(timeout_millis)
        return finish_flush(self.begin_flush(), deadline)

    def begin_shutdown(self, timeout_millis: float) -> Background:
        """Start the SDK's shutdown (a last export of the queue) on a daemon thread."""
        return Background(
            lambda: self._sdk_shutdown(timeout_millis), f"tracegym-shutdown-{self.name}"
        )

    def _sdk_shutdown(self, timeout_millis: float) -> None:
        # The public shutdown() takes no timeout (it waits up to 30 s); the SDK's inner batch
        # processor does. Without it, the public one: our caller's wait is bounded either way.
        inner = getattr(self, "_batch_processor", None)
        method = getattr(inner, "shutdown", None)
        if method is not None and "timeout_millis" in inspect.signature(method).parameters:
            method(timeout_millis=timeout_millis)
        else:
            BatchSpanProcessor.shutdown(self)

    def finish_shutdown(self, running: Background, deadline: float) -> int:
        """Wait for `running` until `deadline`; count what it did not export. Returns that.

        The SDK's shutdown gets the same timeout and may return just before the deadline with
        an export still hanging: what is queued or in an export then is lost too."""
        if running.wait(deadline) and not self.queued() and not self.exporting():
            return 0
        inner = getattr(self, "_batch_processor", None)
        if inner is not None and hasattr(inner, "_shutdown_timeout_exceeded"):
            inner._shutdown_timeout_exceeded = True  # the SDK's "stop after this batch" flag
        return self.counting.abandon(self.queued())

    def shutdown(self, timeout_millis: float = 30000) -> None:
        """The SDK's shutdown, waited for at most `timeout_millis`."""
        deadline = deadline_after(timeout_millis)
        self.finish_shutdown(self.begin_shutdown(timeout_millis), deadline)


def finish_flush(running: Background, deadline: float) -> bool:
    """A flush's answer: it ended in time and delivered everything."""
    return running.wait(deadline) and running.result is True


def flush_all(processors: Sequence[SpanProcessor], timeout_millis: float | None) -> bool:
    """Flush every pipeline at once against one deadline: a dead one does not delay the rest."""
    deadline = deadline_after(timeout_millis)
    running = [
        p.begin_flush()
        if isinstance(p, CountingBatchSpanProcessor)
        else Background(lambda p=p: p.force_flush(int(timeout_millis or 30000)), "tracegym-flush")
        for p in processors
    ]
    return all([finish_flush(r, deadline) for r in running])


def shutdown_all(processors: Sequence[SpanProcessor], timeout_s: float) -> int:
    """Shut every pipeline down at once within `timeout_s`; returns the spans left unexported."""
    deadline = time.monotonic() + timeout_s
    batches = [p for p in processors if isinstance(p, CountingBatchSpanProcessor)]
    running = [(b, b.begin_shutdown(timeout_s * 1000)) for b in batches]
    others = [
        Background(p.shutdown, "tracegym-shutdown")
        for p in processors
        if not isinstance(p, CountingBatchSpanProcessor)
    ]
    lost = sum(b.finish_shutdown(r, deadline) for b, r in running)
    for other in others:
        other.wait(deadline)
    return lost


_NO_OP_STARTS = (SpanProcessor.on_start, BatchSpanProcessor.on_start)


def _starts_nothing(processor: SpanProcessor) -> bool:
    """True when `processor.on_start` is one of the SDK's no-ops (the batch processor's)."""
    return getattr(type(processor), "on_start", None) in _NO_OP_STARTS


class FanOutSpanProcessor(SpanProcessor):
    """tracegym's one processor on a provider: hands spans to its pipelines, which a second
    `tracegym.init` swaps in place instead of stacking new processors on the provider. Spans of
    other instrumentations get tracegym's run bookkeeping and content policy on the way
    (`tracer/third_party.py`)."""

    def __init__(
        self,
        processors: Sequence[SpanProcessor] = (),
        *,
        shutdown_timeout_s: float = 3.0,
        foreign: bool = True,
    ) -> None:
        self._processors: tuple[SpanProcessor, ...] = ()
        self._starting: tuple[SpanProcessor, ...] = ()
        self.replace(processors)
        self.shutdown_timeout_s = shutdown_timeout_s
        # Other instrumentations' spans get the run bookkeeping and content policy here (in
        # tracegym's own processor only: a span must claim its step once).
        self._foreign = ForeignSpans() if foreign else None

    def replace(self, processors: Sequence[SpanProcessor]) -> None:
        self._processors = tuple(processors)
        # Only those with an on_start of their own are called as a span starts (the batch
        # processors' is the SDK's no-op: a call per processor per span saved).
        self._starting = tuple(p for p in self._processors if not _starts_nothing(p))
        self._closed = False

    def close(self) -> None:
        """After `tracegym.shutdown`: spans still ending are dropped, and counted."""
        self._processors = self._starting = ()
        self._closed = True

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self._foreign is not None:
            scope = span.instrumentation_scope  # `foreign.is_foreign`, inlined: runs per span
            if scope is None or scope.name != OWN_SCOPE:
                try:
                    self._foreign.on_start(span, parent_context)
                except Exception as exc:  # the span goes on without the bookkeeping
                    internal.report_error("foreign.start", exc)
        for processor in self._starting:
            processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self._closed:
            internal.add("spans_dropped.after_shutdown")
            return
        if self._foreign is not None:
            scope = span.instrumentation_scope
            if scope is None or scope.name != OWN_SCOPE:
                try:
                    span = self._foreign.on_end(span)
                except Exception as exc:  # never pass on a span the policy did not check
                    internal.report_error("foreign.end", exc)
                    internal.add("spans_dropped.content_policy")
                    return
        for processor in self._processors:
            processor.on_end(span)

    def shutdown(self) -> None:
        """The provider's shutdown: bounded by `shutdown_timeout_s`, like tracegym's own."""
        shutdown_all(self._processors, self.shutdown_timeout_s)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return flush_all(self._processors, timeout_millis)
