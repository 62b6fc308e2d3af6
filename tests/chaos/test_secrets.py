"""Secrets must not reach disk.

Before the fix `export DB_PASSWORD=...`, `AWS_SECRET_ACCESS_KEY=...`, a bare AWS secret key,
the JSON keys `token`, `secret_key` and `passphrase`, and a PEM private key cut by the
8,192-character truncation were written to the spool verbatim (truncation runs on the agent's
thread, redaction later on already-truncated text). Every shape of the corpus goes through the
real pipeline (`tracegym.init`, batch processor, redacting exporter, spool) and the raw spool
bytes are searched for it.

Span names (`tg.step(f"clone https://x:{token}@host")`), event names, link
attributes and resource attributes (OTEL_RESOURCE_ATTRIBUTES) reached the spool verbatim; they
now go through the same `redact_parts` as everything else (the importers' side of it is in
tests/store/test_importers.py, the receiver's in test_receiver_chaos.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, Status, StatusCode
from tracegym.tracer import semconv as sc
from tracegym.tracer.redact import REDACTED, Redactor
from tracegym.tracer.serialize import TRUNCATION_MARKER
from tracegym.tracer.spool import iter_spool

from tests.chaos.secret_corpus import (
    AWS_SECRETS,
    INNOCENT,
    PASSWORDS,
    PEM_PGP,
    PEM_RSA,
    SECRETS,
    SK_ANT,
)

LIMIT = 8192  # the default max_value_length


@tg.tool
def echo(text):
    return text


@tg.tool
def fail_with(text):
    raise RuntimeError(text)


@tg.agent(name="leaky")
def leaky(texts):
    for text in texts:
        echo(text)
        with contextlib.suppress(RuntimeError):
            fail_with(text)
        with tg.tool("custom") as call:
            call.set_attribute("app.note", text)


def spool_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((home / "spool").glob("*.jsonl")))


def _body_chunks(pem: str, visible: int) -> list[str]:
    """16-character pieces of the key body within the first `visible` characters of `pem`."""
    body = pem.split("-----", 2)[2][:visible].replace("\n", "")
    return [body[i : i + 16] for i in range(0, max(len(body) - 16, 0), 16)]


@pytest.mark.parametrize(("name", "text", "secret"), SECRETS, ids=[s[0] for s in SECRETS])
def test_redactor_catches_every_shape(name, text, secret):
    redactor = Redactor()
    assert redactor.might_hold_secret(text), f"{name}: no trigger, the regexes never run"
    out = redactor.redact(text)
    assert secret not in out, out
    assert REDACTED in out


@pytest.mark.parametrize("text", INNOCENT)
def test_innocent_text_is_left_alone(text):
    assert Redactor().redact(text) == text


def test_usual_tool_traffic_needs_no_regex():
    """The cheap pre-check stays cheap: ordinary arguments and results trigger nothing."""
    redactor = Redactor()
    for text in (
        '{"order_id":"W000012"}',
        '{"id":"W000012","total":18.0,"status":"delivered"}',
        "execute_tool get_order",
        "call_26c9678d35d1cb95",
        "gen_ai.usage.input_tokens",
        '{"role":"user","content":"where is my order W000012?"}',
    ):
        assert not redactor.might_hold_secret(text), text


def test_corpus_never_reaches_the_spool(tracer_setup, tmp_path):
    tracer_setup(home=tmp_path)
    leaky([text for _, text, _ in SECRETS])
    assert tg.flush(10)
    raw = spool_bytes(tmp_path)
    assert raw.count(b"\n") == 1 + 3 * len(SECRETS)  # every span arrived
    leaked = [name for name, _, secret in SECRETS if secret.encode() in raw]
    assert leaked == []
    assert tg.stats().spans_redacted >= 3 * len(SECRETS)


def _cut_cases() -> list[tuple[str, object, list[str]]]:
    """Values whose truncation at LIMIT characters cuts a secret, and the secret's pieces that
    would be visible before the cut."""
    pem_at = LIMIT - 900  # the cut falls in the middle of the key body
    aws_at = LIMIT - len("aws secret ") - 30  # 30 of the 40 characters before the cut
    password = PASSWORDS[0] * 8
    pw_at = LIMIT - len('password="') - 40
    sk_at = LIMIT - 18  # "sk-ant-api03-" and 5 random characters before the cut
    return [
        ("pem-in-a-string", "x" * pem_at + PEM_RSA, _body_chunks(PEM_RSA, 900)),
        ("pem-in-a-dict", {"blob": "y" * pem_at + PEM_RSA}, _body_chunks(PEM_RSA, 880)),
        (
            "pem-cut-by-the-outer-cap",
            {"a": "a" * 4000, "b": "b" * (pem_at - 4020), "key": PEM_PGP},
            _body_chunks(PEM_PGP, 800),
        ),
        ("aws-secret", "x" * aws_at + "aws secret " + AWS_SECRETS[0], [AWS_SECRETS[0][:30]]),
        ("quoted-password", "x" * pw_at + f'password="{password}"', [password[:40]]),
        ("token", "x" * (sk_at - 1) + " " + SK_ANT, [SK_ANT[:18]]),
    ]


@pytest.mark.parametrize("case", _cut_cases(), ids=[c[0] for c in _cut_cases()])
def test_secret_cut_by_truncation_never_reaches_the_spool(tracer_setup, tmp_path, case):
    _, value, pieces = case
    assert all(pieces)
    tracer_setup(home=tmp_path)
    echo(value)
    assert tg.flush(10)
    raw = spool_bytes(tmp_path)
    (record,) = list(iter_spool(tmp_path))
    result = record["attributes"][sc.TOOL_RESULT]
    assert TRUNCATION_MARKER.split("{")[0] in result  # it was cut
    assert REDACTED in result
    assert [p for p in pieces if p.encode() in raw] == []


def test_innocent_corpus_reaches_the_spool_intact(tracer_setup, tmp_path):
    tracer_setup(home=tmp_path)
    for text in INNOCENT:
        echo(text)
    assert tg.flush(10)
    results = [r["attributes"][sc.TOOL_RESULT] for r in iter_spool(tmp_path)]
    assert sorted(results) == sorted(INNOCENT)
    raw = spool_bytes(tmp_path)
    assert REDACTED.encode() not in raw
    for text in INNOCENT:  # as the spool encodes it
        assert json.dumps(text, ensure_ascii=False)[1:-1].encode() in raw
    assert tg.stats().spans_redacted == 0


def test_hostile_text_costs_the_redactor_linear_time():
    """Runs of token prefixes with no truncation marker made a forward-scanning rule quadratic
    (about 100 ms per 8 KB value, 4x that at 16 KB); the cut-token rule now walks back from
    each marker instead."""
    redactor = Redactor()
    hostile = [p * (16384 // len(p)) for p in ("hf_.", "sk-.", "eyJ.", "AKIA.", "aws ", "secret")]
    start = time.perf_counter()
    for text in hostile:
        redactor.redact(text)
    assert time.perf_counter() - start < 0.5


@tg.agent(name="named")
def named(texts):
    for text in texts:
        with tg.step(f"clone {text}"):
            tg.current_span().add_event(f"note {text}", {"detail": "fine"})


def _foreign_spans(provider: TracerProvider, texts: list[str]) -> None:
    """Another instrumentation's spans: the text as span name, event name, link attribute and
    status message."""
    tracer = provider.get_tracer("someone.else")
    with tracer.start_as_current_span("anchor") as anchor:
        context = anchor.get_span_context()
    for text in texts:
        span = tracer.start_span(text, links=[Link(context, {"why": text})])
        span.add_event(text)
        span.set_status(Status(StatusCode.ERROR, text))
        span.end()


def test_corpus_in_span_event_and_link_never_reaches_the_spool(tracer_setup, tmp_path):
    """Before the fix every secret in a step's name, an event's name or a link's attributes
    was written as it was."""
    provider = tracer_setup(home=tmp_path)
    texts = [text for _, text, _ in SECRETS]
    named(texts)
    _foreign_spans(provider, texts)
    assert tg.flush(10)
    raw = spool_bytes(tmp_path)
    assert raw.count(b"\n") == 2 + 2 * len(SECRETS)  # every span arrived
    assert [name for name, _, secret in SECRETS if secret.encode() in raw] == []
    records = list(iter_spool(tmp_path))
    steps = [r for r in records if r["name"].startswith("step clone ")]
    assert len(steps) == len(SECRETS) and all(REDACTED in r["name"] for r in steps)


def test_innocent_corpus_in_names_arrives_intact(tracer_setup, tmp_path):
    provider = tracer_setup(home=tmp_path)
    named(INNOCENT)
    _foreign_spans(provider, INNOCENT)
    assert tg.flush(10)
    records = list(iter_spool(tmp_path))
    names = {r["name"] for r in records}
    assert {f"step clone {text}" for text in INNOCENT} <= names
    assert set(INNOCENT) <= names
    events = {e["name"] for r in records for e in r["events"]}
    assert {f"note {text}" for text in INNOCENT} <= events
    links = [link["attributes"]["why"] for r in records for link in r["links"]]
    assert sorted(links) == sorted(INNOCENT)
    assert REDACTED.encode() not in spool_bytes(tmp_path)
    assert tg.stats().spans_redacted == 0


def _resource_env(texts: list[str]) -> str:
    """OTEL_RESOURCE_ATTRIBUTES with one attribute per text (values are percent-encoded)."""
    return ",".join(f"deployment.note{i}={quote(text, safe='')}" for i, text in enumerate(texts))


def test_corpus_in_resource_attributes_of_the_apps_provider_never_reaches_the_spool(
    tracer_setup, tmp_path, monkeypatch
):
    """`OTEL_RESOURCE_ATTRIBUTES=deployment.db_url=postgres://svc:pw@db/x` was stored as it
    was, on every span."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", _resource_env([t for _, t, _ in SECRETS]))
    provider = TracerProvider()  # reads the variable, as the application's own would
    tracer_setup(home=tmp_path, provider=provider)
    leaky(["nothing secret"])
    assert tg.flush(10)
    raw = spool_bytes(tmp_path)
    assert [name for name, _, secret in SECRETS if secret.encode() in raw] == []
    (record, *_) = list(iter_spool(tmp_path))
    assert len(record["resource"]) >= len(SECRETS)


def test_innocent_resource_attributes_arrive_intact(tracer_setup, tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", _resource_env(INNOCENT))
    tracer_setup(home=tmp_path, provider=TracerProvider())
    leaky(["nothing secret"])
    assert tg.flush(10)
    for record in iter_spool(tmp_path):
        values = [record["resource"][f"deployment.note{i}"] for i in range(len(INNOCENT))]
        assert values == [text.strip() for text in INNOCENT]
    assert tg.stats().spans_redacted == 0


def test_the_resource_tracegym_creates_holds_no_secret(run_python, tmp_path):
    """With no provider of the application's, `init` makes one: its resource (what every
    exporter, the application's own included, sees) is redacted when it is made."""
    password = PASSWORDS[3]
    result = run_python(
        """
        import json
        from opentelemetry import trace
        import tracegym as tg
        tg.init("svc")
        with tg.step("one"):
            pass
        assert tg.flush(10)
        print(json.dumps(dict(trace.get_tracer_provider().resource.attributes)))
        """,
        env={
            "TRACEGYM_HOME": str(tmp_path / "home"),
            "OTEL_RESOURCE_ATTRIBUTES": f"deployment.db_url=postgres://svc:{password}@db/x",
        },
    )
    assert result.returncode == 0, result.stderr
    resource = json.loads(result.stdout.strip().splitlines()[-1])
    assert resource["deployment.db_url"] == f"postgres://{REDACTED}@db/x"
    assert resource["service.name"] == "svc"
    assert password.encode() not in spool_bytes(tmp_path / "home")


@pytest.mark.parametrize(("name", "text", "secret"), SECRETS, ids=[s[0] for s in SECRETS])
def test_every_shape_is_caught_on_a_line_of_json_escaped_text(name, text, secret):
    """Text encoded as JSON inside a value (an importer's labels, a tool's JSON result) puts a
    literal backslash-n before each line: `SECRET_KEY_BASE=...` on such a line was kept."""
    encoded = json.dumps(f"first line\n{text}")
    assert json.dumps(secret)[1:-1] not in Redactor().redact(encoded)


@pytest.mark.parametrize("text", INNOCENT)
def test_innocent_json_escaped_lines_are_left_alone(text):
    encoded = json.dumps(f"first line\n{text}")
    assert Redactor().redact(encoded) == encoded


def _corpus_body(texts: list[str]) -> bytes:
    """One OTLP/JSON request with each text in every place a span carries text: span and
    event names, attribute values (nested too), event and link attributes, status message,
    resource."""

    def kv(key: str, text: str) -> dict:
        return {"key": key, "value": {"stringValue": text}}

    spans = []
    for i, text in enumerate(texts):
        nested = {"kvlistValue": {"values": [kv("inner", text)]}}
        spans.append({
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": f"{i + 1:016x}",
            "name": text,
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000",
            "attributes": [kv("note", text), {"key": "map", "value": nested}],
            "events": [{"name": text, "timeUnixNano": "1700000000000000001",
                        "attributes": [kv("detail", text)]}],
            "links": [{"traceId": "5b8efff798038103d269b633813fc60d", "spanId": f"{i + 1:016x}",
                       "attributes": [kv("why", text)]}],
            "status": {"code": 2, "message": text},
        })  # fmt: skip
    resource = {"attributes": [kv(f"deployment.note{i}", t) for i, t in enumerate(texts)]}
    request = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}
    return json.dumps(request).encode()


def _spool_records(home: Path) -> list[dict]:
    records = list(iter_spool(home))
    return sorted(({k: r[k] for k in r if k != "v"} for r in records), key=lambda r: r["span_id"])


def test_collect_and_import_of_the_same_body_store_the_same_redacted_spans(tmp_path):
    """`tracegym import otlp-json` stored every shape that `tracegym collect` of the same body
    redacted; both now go through `redact_record`, the receiver's span names too."""
    import urllib.request

    from tracegym.store.importers import import_path
    from tracegym.store.receiver import Receiver

    body = _corpus_body([text for _, text, _ in SECRETS])
    received, imported = tmp_path / "received", tmp_path / "imported"
    with Receiver(received, port=0) as receiver:
        request = urllib.request.Request(
            receiver.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=20) as response:
            assert response.status == 200
    (tmp_path / "trace.json").write_bytes(body)
    assert import_path("otlp-json", tmp_path / "trace.json", imported).spans == len(SECRETS)
    for home in (received, imported):
        raw = spool_bytes(home)
        assert [
            name for name, _, secret in SECRETS if json.dumps(secret)[1:-1].encode() in raw
        ] == []
    assert _spool_records(received) == _spool_records(imported)


def test_collect_and_import_keep_the_innocent_corpus_everywhere(tmp_path):
    from tracegym.store.importers import import_path

    (tmp_path / "trace.json").write_bytes(_corpus_body(INNOCENT))
    import_path("otlp-json", tmp_path / "trace.json", tmp_path / "home")
    records = _spool_records(tmp_path / "home")
    assert [r["name"] for r in records] == INNOCENT
    assert [r["status_message"] for r in records] == INNOCENT
    assert [r["events"][0]["name"] for r in records] == INNOCENT
    assert [r["links"][0]["attributes"]["why"] for r in records] == INNOCENT
    assert [r["attributes"]["map"]["inner"] for r in records] == INNOCENT
    assert REDACTED.encode() not in spool_bytes(tmp_path / "home")


def _record_with(text: str, where: str) -> dict:
    """A clean spool record with `text` put at `where`."""
    from tracegym.store.records import span_record

    record = span_record(
        trace_id="1" * 32, span_id="2" * 16, name="execute_tool get_order", start_ns=1, end_ns=2,
        attributes={"gen_ai.tool.name": "get_order", "tags": ["a", "b"], "map": {"k": [1, "x"]}},
        events=[{"name": "log", "time_ns": 1, "attributes": {"message": "fine"}}],
        links=[{"trace_id": "3" * 32, "span_id": "4" * 16, "attributes": {"why": "retry"}}],
        resource={"service.name": "svc"},
    )  # fmt: skip
    places = {
        "name": lambda r: r.update(name=text),
        "status": lambda r: r.update(status_message=text),
        "attribute": lambda r: r["attributes"].update(note=text),
        "list": lambda r: r["attributes"]["tags"].append(text),
        "nested": lambda r: r["attributes"]["map"]["k"].append({"deep": text}),
        "event-name": lambda r: r["events"][0].update(name=text),
        "event": lambda r: r["events"][0]["attributes"].update(detail=text),
        "link": lambda r: r["links"][0]["attributes"].update(note=text),
        "resource": lambda r: r["resource"].update(note=text),
    }
    places[where](record)
    return record


PLACES = [
    "name", "status", "attribute", "list", "nested", "event-name", "event", "link", "resource",
]  # fmt: skip


@pytest.mark.parametrize("where", PLACES)
def test_the_record_chunk_check_sees_every_place_a_secret_can_sit(where):
    """Received and imported records are checked a chunk at a time before any is walked: a
    secret anywhere in one record makes its chunk dirty, and only that record changes."""
    from tracegym.tracer.redact import records_are_clean, redact_records

    clean = [_record_with("fine", "attribute") for _ in range(10)]
    assert records_are_clean(clean, Redactor())
    for name, text, secret in SECRETS:
        records = [_record_with("fine", "attribute") for _ in range(10)]
        records[4] = _record_with(text, where)
        redactor = Redactor()
        assert not records_are_clean(records, redactor), name
        assert redact_records(records, redactor) == 1, name
        assert secret not in json.dumps(records, ensure_ascii=False), name
        assert records[:4] + records[5:] == clean[:9], name
    for text in INNOCENT:
        records = [_record_with(text, where)]
        before = json.dumps(records)
        assert redact_records(records, Redactor()) == 0
        assert json.dumps(records) == before
