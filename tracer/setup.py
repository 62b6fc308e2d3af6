"""`init`, `flush`, `shutdown` and `stats`: wiring tracegym's pipelines into OpenTelemetry.

tracegym adds one processor to the application's TracerProvider (or to one of its own when the
application has none): a batch processor per exporter (the spool, i.e. the embedded store, by
default; OTLP when configured), each redacting secrets on its export thread before exporting.
Calling `init` again swaps the pipelines inside that processor rather than stacking new ones.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from tracegym.tracer import internal
from tracegym.tracer import semconv as sc
from tracegym.tracer.config import Settings, _env_bool, _env_float, resolve_home
from tracegym.tracer.export_filter import MessageFilteringExporter
from tracegym.tracer.operations import state
from tracegym.tracer.processors import (
    CountingBatchSpanProcessor,
    FanOutSpanProcessor,
    shutdown_all,
)
from tracegym.tracer.redact import RedactingSpanExporter, Redactor
from tracegym.tracer.spool import SpoolSpanExporter

try:
    __version__ = version("tracegym")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"


@dataclass(frozen=True)
class TracerStats:
    """What happened to the spans of this process. Nothing is lost without showing up here."""

    spans_exported: int
    spans_dropped: int  # a full queue, spans ended after shutdown, or unexported at its deadline
    spans_failed: int  # handed to an exporter that failed (dead endpoint, disk full)
    spans_redacted: int
    spans_queued: int
    internal_errors: int
    spans_exporting: int = 0  # inside an export right now (a hanging endpoint holds them)
    counters: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


class _Installation:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.processor: FanOutSpanProcessor | None = None
        self.provider: Any = None
        self.batches: list[CountingBatchSpanProcessor] = []
        self.atexit_registered = False
        # `tracegym.testing.capture()`'s provider while a capture runs: where
        # `installed_provider()` (so `tracegym.instrument`'s instrumentors) points meanwhile.
        self.capturing: Any = None


_installed = _Installation()


def _otlp_exporter(endpoint: str | None, headers: dict[str, str] | None) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    # Seconds per export, retries included (as the OTLP exporter reads these variables). A flush
    # or an exit never waits for it longer than its own deadline.
    timeout = _env_float(
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", _env_float("OTEL_EXPORTER_OTLP_TIMEOUT", 5.0)
    )
    return OTLPSpanExporter(endpoint=endpoint, headers=headers, timeout=timeout)


def _wants_otlp(endpoint: str | None) -> bool:
    if endpoint:
        return True
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        return True
    return "otlp" in os.environ.get("OTEL_TRACES_EXPORTER", "").lower()


def _resource(service: str | None, redactor: Redactor | None) -> Resource:
    """The resource of a provider tracegym creates (OTEL_RESOURCE_ATTRIBUTES included), with
    secrets redacted (`deployment.db_url=postgres://svc:pw@db/x`): it rides on every span, to
    every exporter, including ones the application adds later."""
    resource = Resource.create({SERVICE_NAME: service} if service else {})
    if redactor is None:
        return resource
    try:
        clean = redactor.redact_mapping(resource.attributes)
    except Exception as exc:  # the exporters' redaction still sees every span's resource
        internal.report_error("redact.resource", exc)
        return resource
    return resource if clean is None else Resource(clean, resource.schema_url)


def _provider_for(service: str | None, provider: Any, redactor: Redactor | None = None) -> Any:
    if provider is not None:
        return provider
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # the application's own: add to it
        return current
    created = TracerProvider(resource=_resource(service, redactor))
    trace.set_tracer_provider(created)
    if trace.get_tracer_provider() is not created:  # someone else won the one-time set
        internal.logger.info("tracegym: a global TracerProvider exists; using a private one")
    return created


def init(
    service: str | None = None,
    *,
    home: str | os.PathLike[str] | None = None,
    spool: bool | None = None,
    otlp_endpoint: str | None = None,
    otlp_headers: dict[str, str] | None = None,
    exporters: Iterable[SpanExporter] = (),
    capture_content: bool | None = None,
    capture_messages: bool | None = None,
    max_value_length: int | None = None,
    redact: bool = True,
    redact_patterns: Iterable[str] = (),
    flush_interval_s: float | None = None,
    max_queue_size: int | None = None,
    shutdown_timeout_s: float | None = None,
    provider: Any = None,
) -> Path | None:
    """Start tracing this process. Returns the data directory spans are spooled to (or None).

    LLM messages (prompts, completions, system instructions) are captured by default for the
    local store (the spool), redacted and truncated like every value, and left out of what goes
    to OTLP or `exporters`, as the GenAI convention keeps their export opt-in;
    `capture_messages=True` captures and exports them, `capture_messages=False` captures them
    nowhere.

    Defaults come from the environment: TRACEGYM_HOME (else ./.tracegym), TRACEGYM_SPOOL,
    TRACEGYM_CAPTURE_CONTENT, TRACEGYM_CAPTURE_MESSAGES (or the GenAI convention's
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT; true: as `capture_messages=True`,
    false: as `capture_messages=False`), TRACEGYM_MAX_VALUE_LENGTH,
    TRACEGYM_FLUSH_INTERVAL_S, TRACEGYM_MAX_QUEUE_SIZE, TRACEGYM_SHUTDOWN_TIMEOUT_S (how long exit
    waits for the last exports, default 3 s), and the usual OTEL_* variables
    (service name, resource attributes, OTLP endpoint and headers, OTEL_SDK_DISABLED).
    Never raises: a failure is logged once and tracing stays off.
    """
    try:
        return _init(**{k: v for k, v in locals().items()})
    except Exception as exc:
        internal.report_error("init", exc)
        return None


def _init(
    service: str | None,
    home: str | os.PathLike[str] | None,
    spool: bool | None,
    otlp_endpoint: str | None,
    otlp_headers: dict[str, str] | None,
    exporters: Iterable[SpanExporter],
    capture_content: bool | None,
    capture_messages: bool | None,
    max_value_length: int | None,
    redact: bool,
    redact_patterns: Iterable[str],
    flush_interval_s: float | None,
    max_queue_size: int | None,
    shutdown_timeout_s: float | None,
    provider: Any,
) -> Path | None:
    settings = Settings.from_env()
    settings.home = resolve_home(home)
    if capture_content is not None:
        settings.capture_content = capture_content
    if capture_messages is not None:  # explicit: everywhere, or nowhere
        settings.capture_messages = settings.export_messages = bool(capture_messages)
    if max_value_length is not None:
        settings.max_value_length = max(64, int(max_value_length))
    if flush_interval_s is not None:
        settings.flush_interval_s = max(0.01, float(flush_interval_s))
    if max_queue_size is not None:
        settings.max_queue_size = max(16, int(max_queue_size))
    if shutdown_timeout_s is not None:
        settings.shutdown_timeout_s = max(0.0, float(shutdown_timeout_s))
    state.settings = settings
    if _env_bool("OTEL_SDK_DISABLED", False):
        state.tracer = trace.NoOpTracer()
        return None

    named: list[tuple[str, SpanExporter]] = []
    use_spool = _env_bool("TRACEGYM_SPOOL", True) if spool is None else spool
    if use_spool:
        named.append(("spool", SpoolSpanExporter(settings.home)))
    if _wants_otlp(otlp_endpoint):
        named.append(("otlp", _otlp_exporter(otlp_endpoint, otlp_headers)))
    named.extend((type(e).__name__, e) for e in exporters)
    redactor = Redactor(redact_patterns) if redact else None
    # Messages are kept in the local store; other destinations get them only when asked for.
    # (also when message capture is off: `tg.llm(capture_messages=True)` keeps them local)
    local_only = settings.capture_content and not settings.export_messages

    def pipeline(exporter: SpanExporter) -> SpanExporter:
        wrapped = RedactingSpanExporter(exporter, redactor) if redactor else exporter
        if local_only and not isinstance(exporter, SpoolSpanExporter):
            wrapped = MessageFilteringExporter(wrapped)
        return wrapped

    batches = [
        CountingBatchSpanProcessor(
            pipeline(exporter),
            name,
            max_queue_size=settings.max_queue_size,
            schedule_delay_millis=settings.flush_interval_s * 1000,
        )
        for name, exporter in named
    ]

    with _installed.lock:
        target = _provider_for(service, provider, redactor)
        old = _installed.batches
        if _installed.processor is not None and _installed.provider is target:
            _installed.processor.replace(batches)
            _installed.processor.shutdown_timeout_s = settings.shutdown_timeout_s
        else:
            if _installed.processor is not None:  # a different provider: retire the old one
                _installed.processor.replace([])
            _installed.processor = FanOutSpanProcessor(
                batches, shutdown_timeout_s=settings.shutdown_timeout_s
            )
            _installed.provider = target
            target.add_span_processor(_installed.processor)
        _installed.batches = batches
        state.tracer = target.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__)
        if not _installed.atexit_registered:
            atexit.register(shutdown)
            _register_child_exit_flush()
            _installed.atexit_registered = True
    shutdown_all(old, settings.shutdown_timeout_s)
    return settings.home if use_spool else None


def _shutdown_at_child_exit() -> None:
    """`shutdown` for a multiprocessing child on its way out; never raises into its exit."""
    try:
        shutdown()
    except BaseException as exc:
        internal.swallow("child_exit", exc)


def _arm_child_exit(installation: _Installation) -> None:
    """In a multiprocessing child, after the registry of exit finalizers was cleared: flush
    and stop the pipelines when the child ends. Its normal end is `os._exit` after
    multiprocessing's `util._exit_function()`, so atexit (and its `shutdown`) never runs there
    and whatever the batch processors still held was lost. The lowest priority: after the
    finalizers of the child's queues and pools, whose work may still end spans."""
    try:
        from multiprocessing import util

        util.Finalize(None, _shutdown_at_child_exit, exitpriority=-100)
    except Exception as exc:
        internal.report_error("child_exit", exc)


def _register_child_exit_flush() -> None:
    """Arm `_arm_child_exit` in every child multiprocessing starts by forking (the 'fork' and
    'forkserver' methods). A hook of `os.register_at_fork` would come too early: the child's
    bootstrap clears the finalizers registered before it runs `util._run_after_forkers()`."""
    try:
        from multiprocessing import parent_process, util

        util.register_after_fork(_installed, _arm_child_exit)
    except Exception as exc:
        internal.report_error("child_exit", exc)
        return
    if parent_process() is not None:  # `init` inside a child: arm it now
        _arm_child_exit(_installed)


def _reset_lock_in_child() -> None:
    """A fork while another thread held the lock (an `init`) would leave it held forever in the
    child, and the child's exit flush waiting on it."""
    _installed.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_in_child)


def flush(timeout_s: float = 30.0) -> bool:
    """Export everything queued so far, waiting at most `timeout_s` seconds.

    True when every pipeline exported all of it in time; False on a timeout or a failed export.
    What a timed-out flush leaves keeps being exported in the background (`stats().spans_queued`
    and `spans_exporting` show it). The pipelines are flushed at once, so a dead endpoint does
    not delay the spool."""
    processor = _installed.processor
    if processor is None:
        return True
    try:
        return processor.force_flush(max(0, int(float(timeout_s) * 1000)))
    except Exception as exc:
        internal.report_error("flush", exc)
        return False


def shutdown(timeout_s: float | None = None) -> None:
    """Flush and stop tracegym's pipelines (runs at exit), within `timeout_s` seconds (default:
    `init(shutdown_timeout_s=)`, TRACEGYM_SHUTDOWN_TIMEOUT_S, 3 s), so a dead endpoint cannot
    hold the agent's exit. Spans not exported by then are counted under
    `spans_dropped.shutdown_timeout.<pipeline>`; lost spans are reported once."""
    if timeout_s is None:
        timeout_s = state.settings.shutdown_timeout_s
    with _installed.lock:
        batches, _installed.batches = _installed.batches, []
        if _installed.processor is not None:
            _installed.processor.close()
    try:
        shutdown_all(batches, max(0.0, float(timeout_s)))
    except Exception as exc:
        internal.report_error("shutdown", exc)
    current = stats()
    if current.spans_dropped or current.spans_failed:
        internal.logger.warning(
            "tracegym: %d spans dropped and %d failed to export in this process (see "
            "tracegym.stats())",
            current.spans_dropped,
            current.spans_failed,
        )


def stats() -> TracerStats:
    """Counts of exported, dropped, failed and redacted spans, and of internal errors."""
    counters, errors = internal.snapshot()

    def total(prefix: str) -> int:
        return sum(v for k, v in counters.items() if k.startswith(prefix))

    return TracerStats(
        spans_exported=total("spans_exported."),
        spans_dropped=total("spans_dropped"),
        spans_failed=total("spans_failed."),
        spans_redacted=counters.get("spans_redacted", 0),
        spans_queued=sum(b.queued() for b in list(_installed.batches)),
        internal_errors=sum(errors.values()),
        spans_exporting=sum(b.exporting() for b in list(_installed.batches)),
        counters=counters,
        errors=errors,
    )


def installed_provider() -> Any:
    """The TracerProvider tracegym's processor is on; None before `init` or with tracing
    disabled (OTEL_SDK_DISABLED). `tracegym.instrument`'s tracers start their spans on it.
    Inside `tracegym.testing.capture()`: the capture's provider."""
    if _installed.capturing is not None:
        return _installed.capturing
    if isinstance(state.tracer, trace.NoOpTracer):
        return None
    return _installed.provider


@contextmanager
def capturing_on(provider: Any) -> Iterator[None]:
    """Point `installed_provider()` at `provider` for the block (`tracegym.testing.capture`)."""
    saved, _installed.capturing = _installed.capturing, provider
    try:
        yield
    finally:
        _installed.capturing = saved


def processors() -> list[SpanProcessor]:
    """tracegym's batch processors currently installed (for inspection and tests)."""
    return list(_installed.batches)
