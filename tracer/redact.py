"""Secret scrubbing: one path for every way a span comes in.

Every text a span carries can hold a secret: its name, attribute values (at any depth), event
names and attributes, link attributes, status message and resource attributes. `redact_parts`
is the one function that knows that list; `redact_span` (the tracer's spans, before any
exporter) and `redact_record` / `redact_records` (spool records: the OTLP receiver and every
importer) only carry a span into it and back.

Spans are immutable once ended, so redaction (like Logfire's scrubber) hands on a copy of the
span with secrets replaced, and the original when nothing matched. tracegym's own pipelines run
it on the export thread (`RedactingSpanExporter`), a batch at a time: a clean batch costs a walk
done in C and one set of trigger scans over its distinct text; `RedactingSpanProcessor` does the
same span by span, synchronously, for processors an application adds itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from operator import attrgetter
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status
from tracegym.tracer import internal
from tracegym.tracer.processors import FanOutSpanProcessor
from tracegym.tracer.serialize import TRUNCATION_MARKER
from tracegym.tracer.third_party import attribute_maps
from tracegym.tracer.third_party import attributes_of as _attributes_of

REDACTED = "[REDACTED]"

# Where `serialize.truncate` cut a value. Truncation runs on the agent's thread, redaction later
# on the export thread; so every rule below that recognises a secret by its start also treats a
# secret that runs into this marker as a secret up to the marker, rather than leaving the part
# before the cut on disk (a PEM block without its END line, an unclosed quoted password).
_CUT = r"\d+".join(re.escape(part) for part in TRUNCATION_MARKER.split("{}"))
_CUT_AHEAD = f"(?={_CUT})"

# Prefixes of tokens with a recognisable shape: a run of token characters from one of them
# into the truncation marker is redacted whatever its length (`_redact_cut_tokens`).
_TOKEN_PREFIXES = (
    "sk-", "sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_", "ghp_", "gho_", "ghu_",
    "ghs_", "ghr_", "github_pat_", "glpat-", "gldt-", "glrt-", "glptt-", "xoxa-", "xoxb-",
    "xoxp-", "xoxo-", "xoxs-", "xoxr-", "xoxe-", "xapp-", "AKIA", "ASIA", "ABIA", "ACCA", "AIza",
    "GOCSPX-", "ya29.", "SG.", "npm_", "pypi-", "hf_", "api_org_", "gsk_", "lsv2_", "hvs.",
    "PMAK-", "dop_v1_", "doo_v1_", "dor_v1_", "xai-", "eyJ",
)  # fmt: skip

# Secrets with a recognisable shape of their own (gitleaks / detect-secrets rule shapes).
_TOKEN_PATTERNS = [
    r"(?<![A-Za-z0-9])sk-(?:ant-|proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}",  # OpenAI/Anthropic
    r"(?<![A-Za-z0-9])[sr]k_(?:live|test)_[A-Za-z0-9]{10,}",  # Stripe secret / restricted keys
    r"whsec_[A-Za-z0-9]{20,}",  # Stripe webhook secrets
    r"(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{20,}",  # GitHub tokens
    r"gl(?:pat|dt|rt|ptt)-[A-Za-z0-9_\-]{20,}",  # GitLab tokens
    r"xox[abposre]-[A-Za-z0-9\-]{10,}",  # Slack tokens
    r"xapp-\d-[A-Za-z0-9\-]{10,}",  # Slack app-level tokens
    r"(?<=hooks\.slack\.com/services/)[A-Za-z0-9_/\-]{20,}",  # Slack webhooks
    r"(?<![A-Z0-9])(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])",  # AWS key ids
    r"AIza[0-9A-Za-z_\-]{35}",  # Google API keys
    r"GOCSPX-[A-Za-z0-9_\-]{20,}",  # Google OAuth client secrets
    r"ya29\.[0-9A-Za-z_\-]{20,}",  # Google OAuth access tokens
    r"(?<![A-Za-z0-9_~.\-])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}",  # Azure AD secrets
    r"(?<=[?&]sig=)[A-Za-z0-9%+/=]{16,}",  # Azure SAS signatures
    r"(?<![A-Za-z0-9])SK[0-9a-fA-F]{32}(?![A-Za-z0-9])",  # Twilio API keys
    r"SG\.[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}",  # SendGrid API keys
    r"npm_[A-Za-z0-9]{36}",  # npm tokens
    r"pypi-AgE[A-Za-z0-9_\-]{50,}",  # PyPI upload tokens
    r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}",  # Hugging Face tokens
    r"api_org_[A-Za-z0-9]{30,}",  # Hugging Face organisation tokens
    r"gsk_[A-Za-z0-9]{40,}",  # Groq
    r"lsv2_(?:pt|sk)_[A-Za-z0-9_]{30,}",  # LangSmith
    r"hvs\.[A-Za-z0-9_\-]{24,}",  # HashiCorp Vault
    r"PMAK-[A-Za-z0-9\-]{40,}",  # Postman
    r"do[opr]_v1_[a-f0-9]{64}",  # DigitalOcean
    r"xai-[A-Za-z0-9]{40,}",  # xAI
    r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    # PEM private keys (RSA, EC, DSA, OPENSSH, ENCRYPTED, PGP ... BLOCK), also when cut short
    r"-----BEGIN[ A-Z0-9_\-]{0,100}PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
    rf"(?:-----END[ A-Z0-9_\-]{{0,100}}PRIVATE KEY(?: BLOCK)?-----|{_CUT_AHEAD}|\Z)",
    rf"PuTTY-User-Key-File-\d[\s\S]*?(?:Private-MAC: [0-9a-fA-F]+|{_CUT_AHEAD}|\Z)",  # PuTTY
    # Authorization: Bearer <token> (with a digit, or long: not "Bearer authentication")
    r"(?:(?<=[Bb]earer )|(?<=BEARER ))"
    r"(?:(?=[A-Za-z0-9_\-.=+/]*\d)[A-Za-z0-9_\-.=+/]{8,}|[A-Za-z0-9_\-.=+/]{20,})",
    r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)",  # user:password@ in URLs
    rf"(?<=://)[^/\s:@]+:[^/\s@]*{_CUT_AHEAD}",  # ... cut before the @
]

# The value of a secret-named key: quoted (its quotes may be escaped: JSON text inside a JSON
# attribute, \"password\": \"x\"; it may hold spaces), quoted but unclosed (cut by truncation:
# redacted to the cut or the end of the line), or bare (optionally after an auth scheme word).
_VALUE = (
    r"(?:(?P<quote>\\*[\"'])(?P<quoted>(?:\\.|[^\\\n]){0,16384}?)(?P=quote)"
    rf"|(?P<open>\\*[\"'])[^\n]*?(?={_CUT}|\n|\Z)"
    r"|(?!(?i:null|true|false|none)\b)(?:(?i:bearer|basic|token|bot|digest)\s+)?"
    r"(?:\[REDACTED\]|[^\"'\s,;&}\]\\]{3,}))"
)
# Keys that name a secret, as JSON/YAML keys, kwargs, headers, query parameters or env
# variables: the name ends in one of these words (so `"token"`, `db_password`,
# `AWS_SECRET_ACCESS_KEY`, `X-Api-Key`; not `input_tokens`, `token_count`, `"key"`).
_SECRET_NAMES = (
    r"password|passwd|pwd|passphrase|secret|token|credentials?|authorization|apikey|"
    r"(?:api|secret|private|access|auth|account|client|encryption|signing|master|session|"
    r"service|db|database)[_\-]?key|key[_\-]?pass(?:word)?"
)
_KEYED = (
    rf"(?i)(?P<key>(?<![\w.\-])[\w.\-]*?(?:{_SECRET_NAMES})"
    r"\\*[\"']?\s*(?:=>|:=|[:=])\s*)" + _VALUE
)
# Environment assignments (`export DB_PASSWORD=...`, `.env` files) whose upper-case name holds
# one of these words anywhere: SECRET_KEY_BASE=..., DB_PASSWORD_PROD=... (also at the start of
# a line of JSON-escaped text, after a literal \n: an .env file inside a JSON attribute)
_ENV = (
    r"(?P<key>(?:(?<![\w.\-])|(?<=\\[nrt]))(?:[A-Z0-9]+_)*"
    r"(?:PASSWORDS?|PASSWD|PASSPHRASE|SECRETS?|TOKEN|CREDENTIALS?|KEY|APIKEY)"
    r"(?:_[A-Z0-9]+)*\s*=\s*)" + _VALUE
)
# A bare AWS secret access key (40 base64 characters) after "aws" or "secret" on the same line:
# with an upper-case letter and a digit or / or +, so git commit hashes never match.
_CONTEXT = (
    r"(?P<context>(?i:aws|secret)[^\n]{0,100}?)(?<![A-Za-z0-9/+=])"
    r"(?:(?=[A-Za-z0-9/+]*[A-Z])(?=[A-Za-z0-9/+]*[0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
    rf"|[A-Za-z0-9/+]{{8,39}}{_CUT_AHEAD})"
)
# Every secret above contains a match of one of these: clean text costs no redaction regex at
# all. Each trigger is filed under a character that every match of it holds (one that is rare in
# JSON and prose where it can): `char in text` is a memchr, tens of times cheaper than the regex
# scan, so a trigger's scan runs only on text that holds its character. Each starts with a
# literal, which the regex engine finds faster than `in` finds a longer string; one alternation
# of them all would cost ten times more. The lower-case ones run on the lower-cased text, the
# cased ones on the text as it is.
_TRIGGERS: dict[str, tuple[str, ...]] = {
    "k": (
        "sk-", r"k_(?:live|test)_", r"hooks\.slack\.com", "gsk_", "pmak-", "private key",
        "putty-user-key-file", r"token[\"'=:\\ \t]", r"key[\"'=:\\ \t]",
    ),
    "x": ("xox", "xapp-", "xai-"),
    "w": ("whsec_", "pwd", "aws"),
    "g": (r"gh[pousr]_", "api_org_"),
    "b": ("github_pat_", "bearer"),
    "-": (r"gl(?:pat|dt|rt|ptt)-",),
    "y": (r"ya29\.",),
    "~": ("q~",),
    "=": ("sig=",),
    "m": ("npm_",),
    "f": ("hf_",),
    "v": ("lsv2_", r"hvs\.", "_v1_"),
    "j": ("eyj",),
    "/": ("://",),
    "p": (r"pass(?:word|wd|phrase)",),
    "c": ("secret", "credential"),
    "z": ("authorization",),
}  # fmt: skip
_CASED_TRIGGERS: dict[str, tuple[str, ...]] = {
    "A": (r"A(?:KIA|SIA|BIA|CCA|3T|Iza)",),
    "X": ("GOCSPX-",),
    "K": (r"SK[0-9a-fA-F]{32}",),
    "G": (r"SG\.",),
    "y": ("pypi-",),
}


def _searches(triggers: dict[str, tuple[str, ...]]) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    return tuple((c, tuple(re.compile(p).search for p in ps)) for c, ps in triggers.items())


_TRIGGER_SEARCHES = _searches(_TRIGGERS)
_CASED_SEARCHES = _searches(_CASED_TRIGGERS)
# Attribute keys whose whole value is a secret.
_SECRET_KEY = re.compile(
    r"(?i)(password|passwd|passphrase|secret|api[_-]?key|authorization|credential|"
    r"auth[_-]?token|access[_-]?token|private[_-]?key|(?:^|[._-])token$)"
)


# The batch walk's pieces, all called from C.
_SDK_EVENTS = attrgetter("_events._dq")  # the SDK's deque: `events` copies it into a tuple
_EVENTS = attrgetter("events")
_DESCRIPTION = attrgetter("_status._description")
_SDK_NAME = attrgetter("_name")
_NAME = attrgetter("name")
_SDK_LINKS = attrgetter("_links")
_LINKS = attrgetter("links")
_SDK_RESOURCE = attrgetter("_resource")
_RESOURCE = attrgetter("resource")
_SCALARS = frozenset({str, int, float, bool})

_CUT_RE = re.compile(_CUT)
_CUT_START = TRUNCATION_MARKER.split("{}")[0]
_CUT_PREFIX = re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, _TOKEN_PREFIXES)) + ")")
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./+=~")
_CUT_WINDOW = 512  # characters before a marker searched for the start of a cut token


def _redact_cut_tokens(text: str) -> str:
    """Redact a token that runs into a truncation marker, however little of it is left.

    Anchored at each marker and walking back over at most _CUT_WINDOW token characters, so
    the work is linear in the text (a regex run forward from every prefix would be quadratic
    on hostile text)."""
    if _CUT_START not in text:
        return text
    pieces: list[str] = []
    last = 0
    for marker in _CUT_RE.finditer(text):
        end = start = marker.start()
        floor = max(last, end - _CUT_WINDOW)
        while start > floor and text[start - 1] in _TOKEN_CHARS:
            start -= 1
        found = _CUT_PREFIX.search(text, start, end)
        if found is not None:
            pieces += (text[last : found.start()], REDACTED)
            last = end
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


def _keyed_replacement(match: re.Match[str]) -> str:
    """Keep the key and the quotes, replace the value."""
    quote = match.group("quote") or ""
    if quote:
        return f"{match.group('key')}{quote}{REDACTED}{quote}"
    return f"{match.group('key')}{match.group('open') or ''}{REDACTED}"


def _context_replacement(match: re.Match[str]) -> str:
    return f"{match.group('context')}{REDACTED}"


class Redactor:
    """Replaces secrets in strings; extra patterns add to (never replace) the built-in ones."""

    def __init__(self, extra_patterns: Iterable[str] = ()) -> None:
        extra_patterns = list(extra_patterns)
        tokens = [*_TOKEN_PATTERNS, *extra_patterns]
        self._tokens = re.compile("|".join(f"(?:{p})" for p in tokens))
        self._keyed = re.compile(_KEYED)
        self._env = re.compile(_ENV)
        self._context = re.compile(_CONTEXT)
        # Extra patterns have no known trigger, so they disable the cheap pre-check.
        self._always = bool(extra_patterns)
        self._key_cache: dict[str, bool] = {}
        self._innocent_keys: set[str] = set()  # keys `_secret_key` found innocent
        # The last resource checked and its redacted copy (None: clean). Spans of one process,
        # or of one OTLP request, share one resource: it is checked once, not per span.
        self._last_resource: tuple[Mapping[str, Any], dict[str, Any] | None] | None = None
        self._last_resource_copy: tuple[Resource, Resource] | None = None

    def might_hold_secret(self, text: str) -> bool:
        """Cheap pre-check: False means `text` certainly holds no built-in secret shape."""
        if self._always:
            return True
        lowered = text.lower()
        for char, searches in _TRIGGER_SEARCHES:
            if char in lowered:
                for search in searches:
                    if search(lowered):
                        return True
        for char, searches in _CASED_SEARCHES:
            if char in text:
                for search in searches:
                    if search(text):
                        return True
        return False

    def redact(self, text: str) -> str:
        """`text` with every secret replaced by [REDACTED]."""
        if not self.might_hold_secret(text):
            return text
        text = _redact_cut_tokens(self._tokens.sub(REDACTED, text))
        text = self._keyed.sub(_keyed_replacement, text)
        text = self._env.sub(_keyed_replacement, text)
        return self._context.sub(_context_replacement, text)

    def _secret_key(self, key: str) -> bool:
        known = self._key_cache.get(key)
        if known is None:
            known = bool(_SECRET_KEY.search(key)) and not key.startswith(("gen_ai.", "tracegym."))
            if len(self._key_cache) < 4096:
                self._key_cache[key] = known
        return known

    def batch_is_clean(self, spans: Sequence[ReadableSpan]) -> bool:
        """True when no span of the batch can hold a secret: every attribute key is innocent
        and one scan over all their distinct text (events and status messages too) finds no
        trigger. The batch is walked in C (map, chain, set) where it can be: this runs on the
        export thread, which holds the GIL beside the agent."""
        if self._always:
            return False
        maps = attribute_maps(spans)
        try:
            descriptions = list(filter(None, map(_DESCRIPTION, spans)))
        except AttributeError:  # not the SDK's spans: the public property
            descriptions = [s.status.description for s in spans if s.status.description]
        try:
            with_events = any(map(_SDK_EVENTS, spans))
        except AttributeError:
            with_events = any(map(_EVENTS, spans))
        try:
            names = set(map(_SDK_NAME, spans))
            with_links = any(map(_SDK_LINKS, spans))
            resources = list(map(_SDK_RESOURCE, spans))
        except AttributeError:
            names = set(map(_NAME, spans))
            with_links = any(map(_LINKS, spans))
            resources = list(map(_RESOURCE, spans))
        if with_events:
            events = [e for span in spans for e in span.events]
            maps += [dict(e.attributes or {}) for e in events]
            names.update(e.name for e in events)
        if with_links:
            maps += [dict(link.attributes or {}) for span in spans for link in span.links]
        # The spans of a process share one resource (`count` compares by identity first).
        if resources and resources.count(resources[0]) != len(resources):
            resources = list({id(r): r for r in resources}.values())
        elif resources:
            resources = resources[:1]
        for resource in resources:
            if resource is not None and self.redact_resource(resource.attributes) is not None:
                return False
        innocent = self._innocent_keys
        keys = chain.from_iterable(map(dict.keys, maps))
        if not innocent.issuperset(keys):
            for key in set(chain.from_iterable(map(dict.keys, maps))) - innocent:
                if self._secret_key(key):
                    return False
                if len(innocent) < 4096:
                    innocent.add(key)
        values: Iterable[Any] = chain.from_iterable(map(dict.values, maps))
        try:
            values = set(values)  # the same text twice (names, operations) is scanned once
        except TypeError:  # an unhashable value (a list, in a span not made by the SDK)
            values = list(chain.from_iterable(map(dict.values, maps)))
        kinds = set(map(type, values))
        if kinds.issubset(_SCALARS):
            texts = list(filter(str.__instancecheck__, values))  # no subclass among them
        else:
            texts = []
            for value in values:  # str subclasses (a StrEnum) are text too
                if isinstance(value, str):
                    texts.append(value)
                elif isinstance(value, (tuple, list)):
                    texts.extend(v for v in value if isinstance(v, str))
        texts += descriptions
        texts += filter(str.__instancecheck__, names)
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
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, (tuple, list)):
                texts.extend(v for v in value if isinstance(v, str))
        else:
            if not self.might_hold_secret("\n".join(texts)):
                return None
        out: dict[str, Any] | None = None
        for key, value in attributes.items():
            new = value
            if self._secret_key(key):
                new = REDACTED
            elif isinstance(value, str):
                new = self.redact(value)
            elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
                items = [self.redact(v) if isinstance(v, str) else v for v in value]
                if items != list(value):
                    new = tuple(items)
            if new is not value and new != value:
                if out is None:
                    out = dict(attributes)
                out[key] = new
        return out

    def redact_value(self, value: Any) -> Any:
        """`value` with secrets replaced at any depth (received and imported values nest:
        arrays, key-value lists); `value` itself when it held none. RecursionError when it
        nests deeper than Python can walk (never store what could not be checked)."""
        kind = type(value)
        if kind is str:
            return self.redact(value)
        if kind is dict:
            clean = self.redact_mapping(value)
            return value if clean is None else clean
        if kind is list or kind is tuple:
            items = [self.redact_value(v) for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return value

    def redact_mapping(self, attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """A redacted copy of `attributes`, nested values included, or None when nothing
        changed. `redact_attributes` handles the top level (secret-named keys, text, lists of
        text); values nested below it are walked here."""
        if not attributes:
            return None
        out = self.redact_attributes(attributes)
        for key, value in (out if out is not None else attributes).items():
            kind = type(value)
            if kind is dict or ((kind is list or kind is tuple) and any(map(_nests, value))):
                clean = self.redact_value(value)
                if clean is not value:
                    if out is None:
                        out = dict(attributes)
                    out[key] = clean
        return out

    def redact_resource(self, resource: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """`redact_mapping` for a resource, remembering the last one: the spans of a process
        (or of one received request) share one."""
        if not resource:
            return None
        last = self._last_resource
        if last is not None and (last[0] is resource or last[0] == resource):
            return last[1]
        clean = self.redact_mapping(resource)
        self._last_resource = (resource, clean)
        return clean

    def resource_copy(self, resource: Resource, attributes: Mapping[str, Any]) -> Resource:
        """A Resource with `attributes` in place of `resource`'s, made once per resource."""
        last = self._last_resource_copy
        if last is not None and last[0] is resource:
            return last[1]
        copy = Resource(dict(attributes), resource.schema_url)
        self._last_resource_copy = (resource, copy)
        return copy


def _nests(value: Any) -> bool:
    kind = type(value)
    return kind is dict or kind is list or kind is tuple


@dataclass(frozen=True)
class SpanParts:
    """What a span carries that came from its maker, so where a secret can hide, whatever
    brought the span in (the tracer, the OTLP receiver, an importer)."""

    name: Any
    status_message: str | None
    attributes: Mapping[str, Any]
    events: tuple[tuple[Any, Mapping[str, Any]], ...]  # (name, attributes) per event
    links: tuple[Mapping[str, Any], ...]  # attributes per link
    resource: Mapping[str, Any]


def _redact_text(redactor: Redactor, text: Any) -> Any:
    return redactor.redact(text) if isinstance(text, str) and text else text


def redact_parts(parts: SpanParts, redactor: Redactor) -> SpanParts | None:
    """`parts` with every secret replaced, or None when there was none: the one redaction
    path. A part that did not change is the same object as before."""
    changes: dict[str, Any] = {}
    name = _redact_text(redactor, parts.name)
    if name != parts.name:
        changes["name"] = name
    message = _redact_text(redactor, parts.status_message)
    if message != parts.status_message:
        changes["status_message"] = message
    attributes = redactor.redact_mapping(parts.attributes)
    if attributes is not None:
        changes["attributes"] = attributes
    events: list[tuple[Any, Mapping[str, Any]]] | None = None
    for i, (event_name, event_attributes) in enumerate(parts.events):
        new_name = _redact_text(redactor, event_name)
        new_attributes = redactor.redact_mapping(event_attributes)
        if new_name != event_name or new_attributes is not None:
            if events is None:
                events = list(parts.events)
            kept = event_attributes if new_attributes is None else new_attributes
            events[i] = (new_name if new_name != event_name else event_name, kept)
    if events is not None:
        changes["events"] = tuple(events)
    links: list[Mapping[str, Any]] | None = None
    for i, link_attributes in enumerate(parts.links):
        new_link = redactor.redact_mapping(link_attributes)
        if new_link is not None:
            if links is None:
                links = list(parts.links)
            links[i] = new_link
    if links is not None:
        changes["links"] = tuple(links)
    resource = redactor.redact_resource(parts.resource)
    if resource is not None:
        changes["resource"] = resource
    return replace(parts, **changes) if changes else None


def redact_record(record: dict[str, Any], redactor: Redactor) -> bool:
    """Replace secrets in one spool record (the receiver's and importers' spans) in place;
    True when it had one. RecursionError for values nested too deeply to check."""
    events = record.get("events") or []
    links = record.get("links") or []
    parts = SpanParts(
        name=record.get("name"),
        status_message=record.get("status_message"),
        attributes=record.get("attributes") or {},
        events=tuple((e.get("name"), e.get("attributes") or {}) for e in events),
        links=tuple(link.get("attributes") or {} for link in links),
        resource=record.get("resource") or {},
    )
    clean = redact_parts(parts, redactor)
    if clean is None:
        return False
    if clean.name is not parts.name:
        record["name"] = clean.name
    if clean.status_message is not parts.status_message:
        record["status_message"] = clean.status_message
    if clean.attributes is not parts.attributes:
        record["attributes"] = clean.attributes
    if clean.events is not parts.events:
        for event, (name, attributes), (old_name, old_attributes) in zip(
            events, clean.events, parts.events, strict=True
        ):
            if name is not old_name:
                event["name"] = name
            if attributes is not old_attributes:
                event["attributes"] = attributes
    if clean.links is not parts.links:
        for link, attributes, old in zip(links, clean.links, parts.links, strict=True):
            if attributes is not old:
                link["attributes"] = attributes
    if clean.resource is not parts.resource:
        record["resource"] = dict(clean.resource)  # records do not share a resource dict
    return True


_RECORD_CHUNK = 64  # records checked together before any is walked one by one


def _gather(value: Any, keys: set[str], texts: list[str]) -> None:
    """Every key and text in `value`, at any depth."""
    kind = type(value)
    if kind is str:
        texts.append(value)
    elif kind is dict:
        keys.update(value)
        for item in value.values():
            if type(item) is str:
                texts.append(item)
            elif item is not None and type(item) not in _SCALARS:
                _gather(item, keys, texts)
    elif kind is list or kind is tuple:
        for item in value:
            _gather(item, keys, texts)
    elif isinstance(value, str):  # a str subclass is text too
        texts.append(value)


def records_are_clean(records: Sequence[dict[str, Any]], redactor: Redactor) -> bool:
    """True when no record can hold a secret: every key (at any depth) is innocent and one
    scan of all their distinct text finds no trigger. What `redact_record` would change can
    only be found by one of these, so a clean chunk costs a walk and one scan."""
    if redactor._always:
        return False
    keys: set[str] = set()
    texts: list[str] = []
    for record in records:
        for part in ("name", "status_message"):
            text = record.get(part)
            if text:
                _gather(text, keys, texts)
        _gather(record.get("attributes"), keys, texts)
        for item in (*(record.get("events") or ()), *(record.get("links") or ())):
            _gather(item.get("name"), keys, texts)
            _gather(item.get("attributes"), keys, texts)
        resource = record.get("resource")
        if resource:
            last = redactor._last_resource
            if last is None or not (last[0] is resource or last[0] == resource):
                _gather(resource, keys, texts)
            elif last[1] is not None:
                return False
    innocent = redactor._innocent_keys
    for key in keys - innocent:
        if not isinstance(key, str) or redactor._secret_key(key):
            return False
        if len(innocent) < 4096:
            innocent.add(key)
    return not redactor.might_hold_secret("\n".join(set(texts)))


def redact_records(records: Sequence[dict[str, Any]], redactor: Redactor) -> int:
    """`redact_record` for each of `records`, in place; how many had a secret removed. Checked
    a chunk at a time first (`records_are_clean`): most received or imported spans hold none."""
    redacted = 0
    for start in range(0, len(records), _RECORD_CHUNK):
        chunk = records[start : start + _RECORD_CHUNK]
        if not records_are_clean(chunk, redactor):
            redacted += sum(redact_record(record, redactor) for record in chunk)
    return redacted


def redact_span(span: ReadableSpan, redactor: Redactor) -> ReadableSpan:
    """`span` itself when it holds no secret, else a copy with every secret replaced."""
    status = span.status
    resource = span.resource
    parts = SpanParts(
        name=span.name,
        status_message=status.description,
        attributes=_attributes_of(span) or {},
        events=tuple((e.name, e.attributes or {}) for e in span.events),
        links=tuple(link.attributes or {} for link in span.links),
        resource=resource.attributes if resource is not None else {},
    )
    clean = redact_parts(parts, redactor)
    if clean is None:
        return span
    internal.add("spans_redacted")
    if clean.status_message is not parts.status_message:
        status = Status(status.status_code, clean.status_message)
    events: Sequence[Event] = span.events
    if clean.events is not parts.events:
        events = [
            Event(name, attributes, event.timestamp)
            for (name, attributes), event in zip(clean.events, span.events, strict=True)
        ]
    links: Sequence[Link] = span.links
    if clean.links is not parts.links:
        links = [
            Link(link.context, attributes)
            for attributes, link in zip(clean.links, span.links, strict=True)
        ]
    if resource is not None and clean.resource is not parts.resource:
        resource = redactor.resource_copy(resource, clean.resource)
    attributes = span.attributes if clean.attributes is parts.attributes else clean.attributes
    return ReadableSpan(
        name=clean.name,
        context=span.context,
        parent=span.parent,
        resource=resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


_SPLIT_MIN = 16  # a dirty batch this small is redacted span by span


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
        clean: list[ReadableSpan] = []
        self._redact_dirty(list(spans), clean)
        return self.exporter.export(clean) if clean else SpanExportResult.SUCCESS

    def _redact_dirty(self, spans: list[ReadableSpan], clean: list[ReadableSpan]) -> None:
        """Append `spans` (a batch found dirty), redacted, to `clean`, in order. While only one
        half of it is dirty the clean half passes as it is and the dirty one is split again, so
        one secret in a large batch costs about two more batch scans, not a walk of every span;
        once both halves are dirty, span by span."""
        while len(spans) > _SPLIT_MIN:
            mid = len(spans) // 2
            left, right = spans[:mid], spans[mid:]
            try:
                left_clean = self.redactor.batch_is_clean(left)
                right_clean = not left_clean and self.redactor.batch_is_clean(right)
            except Exception as exc:  # the careful path for all of it
                internal.report_error("redact.batch", exc)
                break
            if left_clean:
                clean += left
                spans = right
            elif right_clean:
                self._redact_dirty(left, clean)
                clean += right
                return
            else:
                break
        for span in spans:
            try:
                clean.append(redact_span(span, self.redactor))
            except Exception as exc:  # never export a span we failed to check
                internal.report_error("redact", exc)
                internal.span_failed("redaction")

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
        super().__init__(processors, foreign=False)  # redaction only; tracegym's does the rest
        self.redactor = redactor or Redactor()

    def on_end(self, span: ReadableSpan) -> None:
        try:
            span = redact_span(span, self.redactor)
        except Exception as exc:  # never pass on a span we failed to check
            internal.report_error("redact", exc)
            internal.add("spans_dropped.redaction")
            return
        super().on_end(span)
