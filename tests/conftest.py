"""Shared fixtures for the tracer tests.

Most tests record spans in memory with `tracegym.testing.capture()`, which never touches the
global OpenTelemetry provider. Tests that need `tracegym.init` use the `tracer_setup` fixture,
which always passes a private `TracerProvider` and restores tracegym's state afterwards, or they
run in a subprocess (`run_python`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# The tests' models are tiny: one thread per op beats two fighting over two cores (about 10x on a
# busy machine). Set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import tracegym
from tracegym.tracer import internal, setup
from tracegym.tracer.operations import state


@pytest.fixture(autouse=True)
def _instrumentations_restored() -> Any:
    """Instrumentations a test installed (an agent calling `tg.instrument("openai")`) are
    removed after it: another test's client must not be wrapped twice."""
    from tracegym.tracer import integrations

    before = set(integrations.instrumented())
    yield
    added = set(integrations.instrumented()) - before
    if added:
        integrations.uninstrument(*sorted(added))


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """Fresh counters, no stray spool under the repo, no tracer settings leaking out of a test."""
    monkeypatch.setenv("TRACEGYM_HOME", str(tmp_path_factory.mktemp("home")))
    for name in (
        "TRACEGYM_CAPTURE_CONTENT",
        "TRACEGYM_CAPTURE_MESSAGES",
        "TRACEGYM_MAX_VALUE_LENGTH",
        "TRACEGYM_SPOOL",
        "OTEL_SDK_DISABLED",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_TRACES_EXPORTER",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
    ):
        monkeypatch.delenv(name, raising=False)
    saved = state.tracer, state.settings
    internal.reset()
    yield
    state.tracer, state.settings = saved
    internal.reset()


@pytest.fixture
def cap():
    """Spans of the test, in memory (through the same redaction processor as production)."""
    with tracegym.testing.capture() as captured:
        yield captured


@pytest.fixture
def tracer_setup():
    """Call `init(**kwargs)` on a private TracerProvider; shut it down after the test."""
    from opentelemetry.sdk.trace import TracerProvider

    providers: list[Any] = []

    def start(**kwargs: Any) -> Any:
        provider = kwargs.setdefault("provider", TracerProvider())
        providers.append(provider)
        tracegym.init(**kwargs)
        return provider

    yield start
    tracegym.shutdown()
    for provider in providers:
        provider.shutdown()
    # forget the installation so that the next test starts clean
    installed = getattr(setup, "_installed", None)
    if installed is not None:
        installed.processor = None
        installed.provider = None
        installed.batches = []


@pytest.fixture
def run_python(tmp_path: Path):
    """Run a snippet in a fresh interpreter (cwd = tmp_path); returns the CompletedProcess."""

    def run(code: str, *, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
        full_env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=tmp_path,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run
