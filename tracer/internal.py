"""The one place tracegym's own failures go.

The tracer runs inside other people's agents, so no exception of ours may reach their code. Every
internal failure is caught at the boundary, counted here, and logged once per site through the
`tracegym` logger (with its traceback), so a bug is visible without flooding the agent's logs.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

logger = logging.getLogger("tracegym")


@dataclass
class _Counters:
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)


_state = _Counters()


def report_error(where: str, exc: BaseException) -> None:
    """Count an internal error; log it the first time it happens at `where`. Never raises."""
    try:
        with _state.lock:
            _state.errors[where] += 1
            first = _state.errors[where] == 1
        if first:
            logger.warning(
                "tracegym internal error in %s (further ones here are counted, not logged): %r",
                where,
                exc,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
    except Exception:  # pragma: no cover - logging itself failed; nothing left to do
        pass


def _own_code_dirs() -> tuple[str, ...]:
    """Where tracegym's tracer and the OpenTelemetry packages live (for `swallow`)."""
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    try:
        import opentelemetry

        dirs.extend(os.path.abspath(p) for p in opentelemetry.__path__)
    except Exception:  # pragma: no cover - opentelemetry is a dependency
        pass
    return tuple(d + os.sep for d in dirs)


_OWN_CODE = _own_code_dirs()


def _landed_in_own_code(exc: BaseException) -> bool:
    """True when the innermost frame of `exc` is tracegym's or OpenTelemetry's code."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_OWN_CODE)


def swallow(where: str, exc: BaseException) -> None:
    """Count what a user value raised while tracegym inspected it (`__repr__`, `__len__`, a
    property, a `records=` callback), so that the user's function still runs as undecorated.

    Anything the value raised is swallowed, SystemExit and KeyboardInterrupt included: a value
    is no reason to skip the user's call. The exception: a non-Exception (in practice a Ctrl-C)
    whose innermost frame is tracegym's or OpenTelemetry's own code was delivered by a signal
    while tracegym ran, not raised by the value; it is re-raised, as it would have reached the
    agent without tracegym. Ordinary exceptions only count in `values_unrepresentable` (a
    hostile value is not a tracegym bug); the others are reported as internal errors at `where`.
    """
    if isinstance(exc, Exception):
        add("values_unrepresentable")
        return
    if _landed_in_own_code(exc):
        raise exc
    report_error(where, exc)


def add(counter: str, n: int = 1) -> None:
    """Add to a named counter (spans dropped, redactions, ...). Never raises."""
    try:
        with _state.lock:
            _state.counts[counter] += n
    except Exception:  # pragma: no cover
        pass


@dataclass
class BatchLedger:
    """The spans of one export that a layer of the pipeline gave up on (see `span_failed`)."""

    failed: int = 0


_batch = threading.local()  # the ledger of the export running on this thread, if any


@contextmanager
def counted_batch() -> Iterator[BatchLedger]:
    """Collect, for the export run inside, the spans its layers give up on.

    `CountingExporter` opens one around each export, so that a span the spool could not encode
    (or redaction or the message filter failed on) is counted once, as failed under the
    pipeline's name, instead of failed by the layer and exported again by the batch's success.
    An export runs on one thread, so the ledger is the thread's."""
    ledger = BatchLedger()
    outer = getattr(_batch, "ledger", None)
    _batch.ledger = ledger
    try:
        yield ledger
    finally:
        _batch.ledger = outer


def span_failed(where: str, n: int = 1) -> None:
    """A layer of an export dropped `n` spans of its batch: they go to the batch's ledger when
    a counted pipeline runs the export, else (an exporter used on its own) are counted under
    `spans_failed.<where>`. Never raises."""
    ledger = getattr(_batch, "ledger", None)
    if ledger is not None:
        ledger.failed += n
    else:
        add(f"spans_failed.{where}", n)


def snapshot() -> tuple[dict[str, int], dict[str, int]]:
    """Copies of (counters, internal errors by site)."""
    with _state.lock:
        return dict(_state.counts), dict(_state.errors)


def reset() -> None:
    """Forget all counts (tests, and `tracegym.init` in a fresh configuration)."""
    with _state.lock:
        _state.errors.clear()
        _state.counts.clear()
