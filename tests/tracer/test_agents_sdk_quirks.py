"""The OpenAI Agents SDK with its tracing switched off sends tracegym nothing: one warning
through the tracer's logger (never an exception), whether tracing was switched off before
`tg.instrument("openai-agents")` or after it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import tracegym as tg
from tracegym.tracer import agents_sdk, integrations

agents = pytest.importorskip("agents", reason="needs tracegym[openai-agents]")
pytest.importorskip("openinference.instrumentation.openai_agents")


@pytest.fixture(autouse=True)
def _sdk_tracing_restored() -> Iterator[None]:
    agents_sdk.reset()
    yield
    agents.set_tracing_disabled(False)
    agents_sdk.reset()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "tracegym" and "Agents SDK's tracing is disabled" in r.getMessage()
    ]


def test_tracing_switched_off_before_instrument_warns_once(caplog: pytest.LogCaptureFixture):
    agents.set_tracing_disabled(True)
    with caplog.at_level(logging.WARNING, "tracegym"), integrations.instrumenting("openai-agents"):
        pass
    assert len(_warnings(caplog)) == 1
    assert tg.stats().counters[agents_sdk.COUNTER] == 1


def test_tracing_switched_off_after_instrument_warns_once_and_counts_each_time(
    caplog: pytest.LogCaptureFixture,
):
    with caplog.at_level(logging.WARNING, "tracegym"), integrations.instrumenting("openai-agents"):
        assert _warnings(caplog) == []
        agents.set_tracing_disabled(True)
        agents.set_tracing_disabled(True)
        assert agents_sdk.tracing_disabled()  # the SDK's own switch still works
    assert len(_warnings(caplog)) == 1
    assert tg.stats().counters[agents_sdk.COUNTER] == 2


def test_tracing_on_is_quiet_and_uninstrument_gives_the_provider_back(
    caplog: pytest.LogCaptureFixture,
):
    from agents.tracing import get_trace_provider

    provider = get_trace_provider()
    with caplog.at_level(logging.WARNING, "tracegym"), integrations.instrumenting("openai-agents"):
        assert "set_disabled" in vars(provider)  # watched while instrumented
    assert "set_disabled" not in vars(provider)
    agents.set_tracing_disabled(True)  # not instrumented any more: nothing to say
    assert _warnings(caplog) == []
    assert agents_sdk.COUNTER not in tg.stats().counters


def test_a_broken_probe_is_an_internal_error_not_an_exception(monkeypatch: pytest.MonkeyPatch):
    def broken() -> bool:
        raise RuntimeError("the SDK changed")

    monkeypatch.setattr(agents_sdk, "tracing_disabled", broken)
    agents_sdk.check()  # no exception reaches the caller
    assert tg.stats().errors.get("openai_agents.check") == 1
