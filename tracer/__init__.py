"""tracegym's tracer: decorators and context managers that turn an agent's steps, tool calls,
LLM calls and memory reads/writes into OpenTelemetry spans.

Depends on the OpenTelemetry SDK and the standard library only: it runs inside production agents.
"""

from tracegym.tracer.api import (
    agent,
    current_run_id,
    current_span,
    current_trace_id,
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
