"""The export thread's batch fast paths (walked in C, distinct values scanned once) still catch
every secret shape of the corpus wherever a span carries it, and fall back to the careful path
for spans that are not the SDK's own; the message filter's batch check passes only batches it
would not change."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode
from tracegym.tracer import semconv as sc
from tracegym.tracer.export_filter import MessageFilteringExporter, carries_no_messages
from tracegym.tracer.redact import RedactingSpanExporter, Redactor
from tracegym.tracer.third_party import attribute_maps, replace_span

from tests.chaos.secret_corpus import INNOCENT, SECRETS

CLEAN = {
    sc.OPERATION: sc.OP_TOOL,
    sc.TOOL_NAME: "get_order",
    sc.STEP_INDEX: 3,
    "tracegym.budget.seconds_used": 0.25,
    "flag": True,
    sc.TOOL_ARGUMENTS: '{"order_id":"W000001"}',
}


def _batch(secret_at: dict, n: int = 40, scope: str = sc.INSTRUMENTATION_SCOPE) -> list:
    """`n` clean spans of one provider; span 7 also gets what `secret_at` says."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(scope)
    for i in range(n):
        span = tracer.start_span(f"s{i}", attributes={**CLEAN, sc.TOOL_CALL_ID: f"call_{i}"})
        if i == 7:
            if "attributes" in secret_at:
                span.set_attributes(secret_at["attributes"])
            if "event" in secret_at:
                span.add_event("note", secret_at["event"])
            if "status" in secret_at:
                span.set_status(Status(StatusCode.ERROR, secret_at["status"]))
        span.end()
    return list(memory.get_finished_spans())


def _exported(spans: list) -> list:
    out = InMemorySpanExporter()
    RedactingSpanExporter(out).export(spans)
    return list(out.get_finished_spans())


def _where(text: str) -> dict[str, dict]:
    return {
        "string": {"attributes": {sc.TOOL_RESULT: text}},
        "tuple": {"attributes": {"tags": ("x", text, "y")}},
        "event": {"event": {"message": text}},
        "status": {"status": text},
    }


@pytest.mark.parametrize("name,text,secret", SECRETS, ids=[s[0] for s in SECRETS])
def test_every_secret_shape_makes_its_batch_dirty_wherever_it_sits(name, text, secret):
    for where, secret_at in _where(text).items():
        spans = _batch(secret_at)
        assert not Redactor().batch_is_clean(spans), (name, where)
        exported = _exported(spans)
        span = exported[7]
        seen = [str(v) for v in span.attributes.values()]
        seen += [str(v) for e in span.events for v in e.attributes.values()]
        seen.append(span.status.description or "")
        assert not any(secret in s for s in seen), (name, where)
        assert all(exported[i] is spans[i] for i in range(len(spans)) if i != 7), (name, where)


@pytest.mark.parametrize("name,text,secret", SECRETS[:12], ids=[s[0] for s in SECRETS[:12]])
def test_a_secret_repeated_in_every_span_is_redacted_in_each(name, text, secret):
    """Distinct values are scanned once: the same secret in every span is still each span's."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(sc.INSTRUMENTATION_SCOPE)
    for i in range(20):
        tracer.start_span(f"s{i}", attributes={**CLEAN, sc.TOOL_RESULT: text}).end()
    spans = list(memory.get_finished_spans())
    assert not Redactor().batch_is_clean(spans)
    for span in _exported(spans):
        assert secret not in span.attributes[sc.TOOL_RESULT]


def test_secret_named_key_is_caught_after_innocent_keys_were_learnt():
    redactor = Redactor()
    assert redactor.batch_is_clean(_batch({}))  # learns the clean keys
    assert redactor.batch_is_clean(_batch({}))
    assert not redactor.batch_is_clean(_batch({"attributes": {"db.password": "hunter2"}}))
    assert not redactor.batch_is_clean(_batch({"event": {"api_key": "x"}}))


@pytest.mark.parametrize("text", INNOCENT)
def test_innocent_text_is_judged_as_the_string_check_judges_it_and_left_unchanged(text):
    spans = _batch({"attributes": {sc.TOOL_RESULT: text}})
    redactor = Redactor()
    assert redactor.batch_is_clean(spans) is not redactor.might_hold_secret(text)
    assert _exported(spans)[7].attributes[sc.TOOL_RESULT] == text
    clean = _batch({})
    assert redactor.batch_is_clean(clean)
    assert all(a is b for a, b in zip(_exported(clean), clean, strict=True))


def test_spans_not_made_by_the_sdk_take_the_span_by_span_walk():
    """A copy from `replace_span` holds a mapping proxy, not the SDK's dict: still checked."""
    text, secret = SECRETS[0][1], SECRETS[0][2]
    spans = _batch({"attributes": {sc.TOOL_RESULT: text}})
    copies = [replace_span(span) for span in spans]
    assert [dict(m) for m in attribute_maps(copies)] == [dict(s.attributes) for s in spans]
    assert not Redactor().batch_is_clean(copies)
    assert secret not in _exported(copies)[7].attributes[sc.TOOL_RESULT]
    assert Redactor().batch_is_clean([replace_span(s) for s in _batch({})])


def test_message_filter_batch_check():
    clean = _batch({})
    assert carries_no_messages(clean)
    out = InMemorySpanExporter()
    MessageFilteringExporter(out).export(clean)
    assert all(a is b for a, b in zip(out.get_finished_spans(), clean, strict=True))

    messages = '[{"role":"user","parts":[{"type":"text","content":"hi"}]}]'
    chat = _batch({"attributes": {sc.OPERATION: sc.OP_CHAT, sc.INPUT_MESSAGES: messages}})
    assert not carries_no_messages(chat)
    out = InMemorySpanExporter()
    MessageFilteringExporter(out).export(chat)
    assert sc.INPUT_MESSAGES not in out.get_finished_spans()[7].attributes
    assert out.get_finished_spans()[0] is chat[0]

    foreign = _batch({"attributes": {"llm.input_messages.0.message.content": "hi"}}, scope="oi")
    assert not carries_no_messages(foreign)
    out = InMemorySpanExporter()
    MessageFilteringExporter(out).export(foreign)
    assert "llm.input_messages.0.message.content" not in out.get_finished_spans()[7].attributes


# The triggers as they stood before they were filed by character: the filing must keep each.
_FLAT_TRIGGERS = (
    "sk-", r"k_(?:live|test)_", "whsec_", r"gh[pousr]_", "github_pat_", r"gl(?:pat|dt|rt|ptt)-",
    "xox", "xapp-", r"hooks\.slack\.com", r"ya29\.", "q~", "sig=", "npm_", "hf_", "api_org_",
    "gsk_", "lsv2_", r"hvs\.", "pmak-", "_v1_", "xai-", "eyj", "private key",
    "putty-user-key-file", "bearer", "://", r"pass(?:word|wd|phrase)", "pwd", "secret",
    "credential", "authorization", "aws", r"token[\"'=:\\ \t]", r"key[\"'=:\\ \t]",
)  # fmt: skip
_FLAT_CASED = (r"A(?:KIA|SIA|BIA|CCA|3T|Iza)", "GOCSPX-", r"SK[0-9a-fA-F]{32}", r"SG\.", "pypi-")


def _top_level_literals(pattern: str) -> set[str]:
    """Characters every match of `pattern` contains (its literals outside any branch/class)."""
    parser = pytest.importorskip("re._parser", reason="the regex parser of CPython 3.11+")
    return {chr(arg) for op, arg in parser.parse(pattern) if op == parser.LITERAL}


def test_filed_triggers_are_the_same_triggers_and_hold_their_character():
    from tracegym.tracer import redact

    for filed, flat in ((redact._TRIGGERS, _FLAT_TRIGGERS), (redact._CASED_TRIGGERS, _FLAT_CASED)):
        assert sorted(p for ps in filed.values() for p in ps) == sorted(flat)
        for char, patterns in filed.items():
            for pattern in patterns:
                assert char == "" or char in _top_level_literals(pattern), pattern


@pytest.mark.parametrize("pattern", _FLAT_TRIGGERS + _FLAT_CASED)
def test_each_trigger_alone_still_trips_the_check(pattern):
    """One example match of each trigger, in otherwise clean text, in a batch and alone."""
    import re

    examples = {
        r"k_(?:live|test)_": "k_live_", r"gh[pousr]_": "ghs_", r"gl(?:pat|dt|rt|ptt)-": "glptt-",
        r"hooks\.slack\.com": "hooks.slack.com", r"ya29\.": "ya29.", r"hvs\.": "hvs.",
        r"pass(?:word|wd|phrase)": "passphrase", r"token[\"'=:\\ \t]": "token\t",
        r"key[\"'=:\\ \t]": 'key"', r"A(?:KIA|SIA|BIA|CCA|3T|Iza)": "A3T",
        r"SK[0-9a-fA-F]{32}": "SK" + "aF09" * 8, r"SG\.": "SG.",
    }  # fmt: skip
    example = examples.get(pattern, pattern)
    assert re.search(pattern, example if pattern in _FLAT_CASED else example.lower())
    for text in (example, f"order W1 {example} shipped", example.upper()):
        if pattern in _FLAT_CASED and text != example and example not in text:
            continue
        assert Redactor().might_hold_secret(text), text
    spans = _batch({"attributes": {sc.TOOL_RESULT: f"x {example} y"}})
    assert not Redactor().batch_is_clean(spans)


@pytest.mark.parametrize("dirty", [[0], [199], [63, 64], [5, 120, 198], list(range(200))])
def test_a_dirty_batch_is_split_and_only_its_secrets_change(dirty, monkeypatch):
    from tracegym.tracer import redact

    text, secret = SECRETS[0][1], SECRETS[0][2]
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(sc.INSTRUMENTATION_SCOPE)
    for i in range(200):
        result = text if i in dirty else f'{{"order_id":"W{i:06d}"}}'
        tracer.start_span(f"s{i}", attributes={**CLEAN, sc.TOOL_RESULT: result}).end()
    spans = list(memory.get_finished_spans())
    walked = []
    real = redact.redact_span
    monkeypatch.setattr(redact, "redact_span", lambda s, r: walked.append(s) or real(s, r))
    exported = _exported(spans)
    assert [s.name for s in exported] == [f"s{i}" for i in range(200)]
    for i, (out, span) in enumerate(zip(exported, spans, strict=True)):
        if i in dirty:
            assert secret not in out.attributes[sc.TOOL_RESULT]
        else:
            assert out is span
    if len(dirty) == 1:  # one secret: only a small slice around it is walked span by span
        assert len(walked) <= 16
    assert {s.name for s in walked} >= {f"s{i}" for i in dirty}


class _Text(str):
    """A str subclass (a StrEnum member behaves the same): the SDK stores it as it is."""


@pytest.mark.parametrize("shape", ["string", "tuple"])
def test_a_secret_in_a_str_subclass_is_redacted(shape: str):
    _, text, secret = SECRETS[0]
    value = _Text(text) if shape == "string" else ("x", _Text(text))
    spans = _batch({"attributes": {sc.TOOL_RESULT: value}})
    exported = _exported(spans)[7].attributes[sc.TOOL_RESULT]
    texts = [exported] if shape == "string" else list(exported)
    assert all(secret not in t for t in texts), texts
    assert any("[REDACTED]" in t for t in texts)
