"""Secret scrubbing, as a span processor that sits in front of tracegym's exporters.

Spans are immutable once ended, so `RedactingSpanProcessor` (like Logfire's scrubber) hands the
processors it wraps a copy of the span with secrets replaced, and the original when nothing
matched (the common case costs one regex search per string attribute).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor
from tracegym.tracer import internal

REDACTED = "[REDACTED]"
_DEFAULT: Any = object()

# Secrets with a recognisable shape of their own.
_TOKEN_PATTERNS = [
    r"sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic API keys
    r"(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{20,}",  # GitHub tokens
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack tokens
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"AIza[0-9A-Za-z_\-]{35}",  # Google API keys
    r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    r"(?<=[Bb]earer )[A-Za-z0-9_\-\.=+/]{8,}",  # Authorization: Bearer <token>
    r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)",  # user:password@ in URLs
]
# Secrets named by a key: password=..., "api_key": "...", token: ...
_KEYED = (
    r"(?i)(?P<key>[\"']?\b(?:password|passwd|pwd|secret|client_secret|api[_-]?key|"
    r"access[_-]?token|auth[_-]?token|refresh[_-]?token|private[_-]?key|authorization)[\"']?"
    r"\s*[:=]\s*[\"']?)(?P<value>[^\"'\s,;&}\]]{3,})"
)
# Every secret above contains one of these (lower-cased): clean text costs a few substring tests.
_TRIGGERS = (
    "sk-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox", "akia", "aiza", "eyj",
    "private key", "bearer", "://", "password", "passwd", "pwd", "secret", "api_key", "api-key",
    "apikey", "_token", "-token", "accesstoken", "authtoken", "refreshtoken", "privatekey",
    "private_key", "private-key",
    "authorization",
)  # fmt: skip
# Attribute keys whose whole value is a secret.
_SECRET_KEY = re.compile(
    r"(?i)(password|passwd|secret|api[_-]?key|authorization|auth[_-]?token|access[_-]?token)"
)


class Redactor:
    """Replaces secrets in strings; extra patterns add to (never replace) the built-in ones."""

    def __init__(self, extra_patterns: Iterable[str] = ()) -> None:
        extra_patterns = list(extra_patterns)
        tokens = [*_TOKEN_PATTERNS, *extra_patterns]
        self._tokens = re.compile("|".join(f"(?:{p})" for p in tokens))
        self._keyed = re.compile(_KEYED)
        # Extra patterns have no known trigger, so they disable the cheap pre-check.
        self._always = bool(extra_patterns)

    def redact(self, text: str) -> str:
        """`text` with every secret replaced by [REDACTED]."""
        if not self._always:
            lowered = text.lower()
            if not any(trigger in lowered for trigger in _TRIGGERS):
                return text
        text = self._tokens.sub(REDACTED, text)
        return self._keyed.sub(lambda m: m.group("key") + REDACTED, text)

    def redact_attributes(self, attributes: Any) -> dict[str, Any] | None:
        """A redacted copy of `attributes`, or None when there was nothing to redact."""
        if not attributes:
            return None
        out: dict[str, Any] | None = None
        for key, value in attributes.items():
            new = value
            if _SECRET_KEY.search(key) and not key.startswith(("gen_ai.", "tracegym.")):
                new = REDACTED
            elif type(value) is str:
                new = self.redact(value)
            elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
                items = [self.redact(v) if type(v) is str else v for v in value]
                if items != list(value):
                    new = tuple(items)
            if new is not value:
                if out is None:
                    out = dict(attributes)
                out[key] = new
        return out


class RedactingSpanProcessor(SpanProcessor):
    """Passes each ended span, secrets removed, to the processors it wraps.

    Wrap every processor whose exporter must never see a secret: tracegym wraps its own spool and
    OTLP pipelines. Processors an application added to its provider itself are not affected.
    """

    def __init__(
        self, processors: Sequence[SpanProcessor], redactor: Redactor | None = _DEFAULT
    ) -> None:
        self._processors = tuple(processors)
        self.redactor = Redactor() if redactor is _DEFAULT else redactor  # None: pass through

    def replace(self, processors: Sequence[SpanProcessor], redactor: Redactor | None) -> None:
        """Swap the wrapped processors (what `tracegym.init` does on a second call)."""
        self._processors, self.redactor = tuple(processors), redactor

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        for processor in self._processors:
            processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        processors = self._processors
        if not processors:
            return
        try:
            if self.redactor is not None:
                span = self._redacted(span, self.redactor)
        except Exception as exc:  # never export a span we failed to check
            internal.report_error("redact", exc)
            internal.add("spans_dropped_redaction_failed")
            return
        for processor in processors:
            processor.on_end(span)

    def _redacted(self, span: ReadableSpan, redactor: Redactor) -> ReadableSpan:
        attributes = redactor.redact_attributes(span.attributes)
        events = None
        for i, event in enumerate(span.events):
            new = redactor.redact_attributes(event.attributes)
            if new is not None:
                if events is None:
                    events = list(span.events)
                events[i] = Event(event.name, new, event.timestamp)
        if attributes is None and events is None:
            return span
        internal.add("spans_redacted")
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=attributes if attributes is not None else span.attributes,
            events=events if events is not None else span.events,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    def shutdown(self) -> None:
        for processor in self._processors:
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self._processors)
