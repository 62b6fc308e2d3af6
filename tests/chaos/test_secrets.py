"""Issue 13 item 10: secrets must not reach disk.

Before the fix `export DB_PASSWORD=...`, `AWS_SECRET_ACCESS_KEY=...`, a bare AWS secret key,
the JSON keys `token`, `secret_key` and `passphrase`, and a PEM private key cut by the
8,192-character truncation were written to the spool verbatim (truncation runs on the agent's
thread, redaction later on already-truncated text). Every shape of the corpus goes through the
real pipeline (`tracegym.init`, batch processor, redacting exporter, spool) and the raw spool
bytes are searched for it.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest
import tracegym as tg
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
