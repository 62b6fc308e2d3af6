"""The OpenAI Agents SDK with its own tracing switched off: a warning, once, never an error.

`tracegym.instrument("openai-agents")` receives the SDK's runs through the SDK's tracing: with
`set_tracing_disabled(True)` (common when pointing the SDK at a server other than OpenAI's, to
stop its upload) or OPENAI_AGENTS_DISABLE_TRACING, the store keeps only the user's own
`@tg.agent` spans, no LLM or tool calls. That is checked when the integration is installed, and
again whenever the SDK's tracing is switched off later (the trace provider's `set_disabled` is
wrapped while the integration is active). The instrumentor replaces the SDK's OpenAI exporter,
so with tracing on nothing goes to OpenAI: the fix is to leave tracing on.
"""

from __future__ import annotations

import threading
from typing import Any

from tracegym.tracer import internal

COUNTER = "warnings.openai_agents_tracing_disabled"
MESSAGE = (
    "tracegym: the OpenAI Agents SDK's tracing is disabled (set_tracing_disabled(True) or "
    "OPENAI_AGENTS_DISABLE_TRACING), so tracegym records none of its agents, LLM calls or tool "
    "calls, only your own @tg spans. tg.instrument('openai-agents') already replaces the SDK's "
    "upload to OpenAI: leave its tracing on."
)


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.warned = False
        self.wrapped: tuple[Any, Any] | None = None  # (provider, its own set_disabled)


_state = _State()


def tracing_disabled() -> bool:
    """Whether the SDK would trace a run started now. A trace is created (never started, so
    no processor hears of it): the SDK's own answer, whatever switched it off."""
    from agents.tracing import get_trace_provider
    from agents.tracing.traces import NoOpTrace

    return isinstance(get_trace_provider().create_trace("tracegym-probe"), NoOpTrace)


def warn_once() -> None:
    """Log MESSAGE the first time (later times are only counted)."""
    internal.add(COUNTER)
    with _state.lock:
        first, _state.warned = not _state.warned, True
    if first:
        internal.logger.warning("%s", MESSAGE)


def check() -> None:
    """Warn if the SDK's tracing is off now. Never raises."""
    try:
        if tracing_disabled():
            warn_once()
    except Exception as exc:
        internal.report_error("openai_agents.check", exc)


def watch() -> None:
    """Check now, and wrap the trace provider's `set_disabled` so that switching tracing off
    later warns too. Never raises."""
    check()
    try:
        from agents.tracing import get_trace_provider

        provider = get_trace_provider()
        original = provider.set_disabled

        def set_disabled(disabled: bool) -> None:
            original(disabled)
            if disabled:
                warn_once()

        with _state.lock:
            if _state.wrapped is None:
                provider.set_disabled = set_disabled
                _state.wrapped = (provider, original)
    except Exception as exc:
        internal.report_error("openai_agents.watch", exc)


def unwatch() -> None:
    """Undo `watch` (the provider's own method back). Never raises."""
    with _state.lock:
        wrapped, _state.wrapped = _state.wrapped, None
    if wrapped is None:
        return
    provider, _ = wrapped
    try:
        if "set_disabled" in vars(provider):
            del provider.set_disabled  # the class's method shows through again
    except Exception as exc:
        internal.report_error("openai_agents.unwatch", exc)


def reset() -> None:
    """Forget that the warning was given (tests)."""
    with _state.lock:
        _state.warned = False
