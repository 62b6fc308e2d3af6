"""tracegym's tracer: decorators and context managers that turn an agent's steps, tool calls,
LLM calls and memory reads/writes into OpenTelemetry spans.

Depends on the OpenTelemetry SDK and the standard library only: it runs inside production agents.
The public names are imported on first use (PEP 562): the store and the CLI read this package's
light modules (`semconv`, `spool`, `config`) without loading the SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracegym.tracer.api import (
        agent,
        current_run_id,
        current_span,
        current_trace_id,
        last_run_id,
        llm,
        memory_delete,
        memory_read,
        memory_write,
        record_outcome,
        set_usage,
        step,
        subtask,
        tool,
    )
    from tracegym.tracer.integrations import IntegrationError, instrument, uninstrument
    from tracegym.tracer.redact import RedactingSpanExporter, RedactingSpanProcessor, Redactor
    from tracegym.tracer.setup import TracerStats, flush, init, shutdown, stats
    from tracegym.tracer.threads import (
        ContextThreadPoolExecutor,
        instrument_threads,
        uninstrument_threads,
        wrap,
    )

_MODULE_OF = {
    **dict.fromkeys(
        (
            "agent",
            "current_run_id",
            "current_span",
            "current_trace_id",
            "last_run_id",
            "llm",
            "memory_delete",
            "memory_read",
            "memory_write",
            "record_outcome",
            "set_usage",
            "step",
            "subtask",
            "tool",
        ),
        "api",
    ),
    **dict.fromkeys(("IntegrationError", "instrument", "uninstrument"), "integrations"),
    **dict.fromkeys(("RedactingSpanExporter", "RedactingSpanProcessor", "Redactor"), "redact"),
    **dict.fromkeys(("TracerStats", "flush", "init", "shutdown", "stats"), "setup"),
    **dict.fromkeys(
        ("ContextThreadPoolExecutor", "instrument_threads", "uninstrument_threads", "wrap"),
        "threads",
    ),
}

__all__ = [
    "ContextThreadPoolExecutor",
    "IntegrationError",
    "RedactingSpanExporter",
    "RedactingSpanProcessor",
    "Redactor",
    "TracerStats",
    "agent",
    "current_run_id",
    "current_span",
    "current_trace_id",
    "flush",
    "init",
    "instrument",
    "instrument_threads",
    "last_run_id",
    "llm",
    "memory_delete",
    "memory_read",
    "memory_write",
    "record_outcome",
    "set_usage",
    "shutdown",
    "stats",
    "step",
    "subtask",
    "tool",
    "uninstrument",
    "uninstrument_threads",
    "wrap",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'tracegym.tracer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tracegym.tracer.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
