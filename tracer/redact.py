"""Secret scrubbing in front of every exporter.

Spans are immutable once ended, so redaction (like Logfire's scrubber) hands on a copy of the
span with secrets replaced, and the original when nothing matched; a clean span costs one
substring scan of its text. tracegym's own pipelines run it on the export thread
(`RedactingSpanExporter`); `RedactingSpanProcessor` does the same synchronously for processors
an application adds itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status
from tracegym.tracer import internal
from tracegym.tracer.processors import FanOutSpanProcessor

REDACTED = "[REDACTED]"

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
# Secrets named by a key: password=..., "api_key": "...", token: ... A quoted value may hold
# spaces and its quotes may be escaped (JSON text inside a JSON attribute: \"password\": \"x\").
_KEYED = (
    r"(?i)(?P<key>\b(?:password|passwd|pwd|secret|client_secret|api[_-]?key|"
    r"access[_-]?token|auth[_-]?token|refresh[_-]?token|private[_-]?key|authorization)"
    r"\\?[\"']?\s*[:=]\s*)"
    r"(?:(?P<quote>\\?[\"'])(?P<quoted>.{1,2000}?)(?P=quote)|(?P<bare>[^\"'\s,;&}\]\\]{3,}))"
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


def _keyed_replacement(match: re.Match[str]) -> str:
    quote = match.group("quote") or ""
    return f"{match.group('key')}{quote}{REDACTED}{quote}"


class Redactor:
    """Replaces secrets in strings; extra patterns add to (never replace) the built-in ones."""

    def __init__(self, extra_patterns: Iterable[str] = ()) -> None:
        extra_patterns = list(extra_patterns)
        tokens = [*_TOKEN_PATTERNS, *extra_patterns]
        self._tokens = re.compile("|".join(f"(?:{p})" for p in tokens))
        self._keyed = re.compile(_KEYED)
        # Extra patterns have no known trigger, so they disable the cheap pre-check.
        self._always = bool(extra_patterns)
        self._key_cache: dict[str, bool] = {}

    def might_hold_secret(self, text: str) -> bool:
        """Cheap pre-check: False means `text` certainly holds no built-in secret shape."""
        if self._always:
            return True
        return any(map(text.lower().__contains__, _TRIGGERS))

    def redact(self, text: str) -> str:
        """`text` with every secret replaced by [REDACTED]."""
        if not self.might_hold_secret(text):
            return text
        text = self._tokens.sub(REDACTED, text)
        return self._keyed.sub(_keyed_replacement, text)

    def _secret_key(self, key: str) -> bool:
        known = self._key_cache.get(key)
        if known is None:
            known = bool(_SECRET_KEY.search(key)) and not key.startswith(("gen_ai.", "tracegym."))
            if len(self._key_cache) < 4096:
                self._key_cache[key] = known
        return known

    def batch_is_clean(self, spans: Sequence[ReadableSpan]) -> bool:
        """True when no span of the batch can hold a secret: every attribute key is innocent
        and one scan over all their text (events and status messages too) finds no trigger."""
        if self._always:
            return False
        cache = self._key_cache
        texts: list[str] = []
        append = texts.append
        for span in spans:
            for attributes in (_attributes_of(span), *(e.attributes for e in span.events)):
                for key, value in (attributes or {}).items():
                    secret_key = cache.get(key)
                    if secret_key is None:
                        secret_key = self._secret_key(key)
                    if secret_key:
                        return False
                    kind = type(value)
                    if kind is str:
                        append(value)
                    elif kind is tuple or kind is list:
                        texts.extend(v for v in value if type(v) is str)
            description = span.status.description
            if description:
                append(description)
        return not self.might_hold_secret("\n".join(texts))

    def redact_attributes(self, attributes: Any) -> dict[str, Any] | None:
        """A redacted copy of `attributes`, or None when there was nothing to redact."""
        if not attributes:
            return None
        # One pre-check over all string values together: a clean span costs one scan.
        cache = self._key_cache
        texts = []
        for key, value in attributes.items():
            secret_key = cache.get(key)
            if secret_key is None:
                secret_key = self._secret_key(key)
            if secret_key:
                break
            kind = type(value)
            if kind is str:
                texts.append(value)
            elif kind is tuple or kind is list:
                texts.extend(v for v in value if type(v) is str)
        else:
            if not self.might_hold_secret("\n".join(texts)):
                return None
        out: dict[str, Any] | None = None
        for key, value in attributes.items():
            new = value
            if self._secret_key(key):
                new = REDACTED
            elif type(value) is str:
                new = self.redact(value)
            elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
                items = [self.redact(v) if type(v) is str else v for v in value]
                if items != list(value):
                    new = tuple(items)
            if new is not value and new != value:
                if out is None:
                    out = dict(attributes)
                out[key] = new
        return out


def _attributes_of(span: ReadableSpan) -> Any:
    """The span's attributes; the SDK's own dict when reachable (4x cheaper to walk than the
    read-only proxy `span.attributes`, and this runs for every span on the agent's thread)."""
    inner = getattr(getattr(span, "_attributes", None), "_dict", None)
    return inner if isinstance(inner, dict) else span.attributes


def redact_span(span: ReadableSpan, redactor: Redactor) -> ReadableSpan:
    """`span` itself when it holds no secret, else a copy with every secret replaced."""
    attributes = redactor.redact_attributes(_attributes_of(span))
    status = span.status
    if status.description:
        clean = redactor.redact(status.description)
        if clean != status.description:
            status = Status(status.status_code, clean)
    events = None
    for i, event in enumerate(span.events):
        new = redactor.redact_attributes(event.attributes)
        if new is not None:
            if events is None:
                events = list(span.events)
            events[i] = Event(event.name, new, event.timestamp)
    if attributes is None and events is None and status is span.status:
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
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class RedactingSpanExporter(SpanExporter):
    """Redacts each span, then hands the batch to the exporter it wraps.

    tracegym puts this behind each of its batch processors, so the scrubbing runs on the export
    thread, never on the agent's, and still before anything is written or sent.
    """

    def __init__(self, exporter: SpanExporter, redactor: Redactor | None = None) -> None:
        self.exporter = exporter
        self.redactor = redactor or Redactor()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            clean_batch = self.redactor.batch_is_clean(spans)  # the common case: one scan
        except Exception as exc:  # fall through to the careful span-by-span path
            internal.report_error("redact.batch", exc)
            clean_batch = False
        if clean_batch:
            return self.exporter.export(spans)
        clean = []
        for span in spans:
            try:
                clean.append(redact_span(span, self.redactor))
            except Exception as exc:  # never export a span we failed to check
                internal.report_error("redact", exc)
                internal.add("spans_failed.redaction")
        return self.exporter.export(clean) if clean else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class RedactingSpanProcessor(FanOutSpanProcessor):
    """Passes each ended span, secrets removed, to the processors it wraps, synchronously.

    For processors an application added to its own provider (tracegym's pipelines already
    redact on their export thread): `RedactingSpanProcessor([BatchSpanProcessor(exporter)])`.
    """

    def __init__(self, processors: Sequence[SpanProcessor], redactor: Redactor | None = None):
        super().__init__(processors)
        self.redactor = redactor or Redactor()

    def on_end(self, span: ReadableSpan) -> None:
        try:
            span = redact_span(span, self.redactor)
        except Exception as exc:  # never pass on a span we failed to check
            internal.report_error("redact", exc)
            internal.add("spans_dropped.redaction")
            return
        super().on_end(span)
