"""The one place tracegym's own failures go.

The tracer runs inside other people's agents, so no exception of ours may reach their code. Every
internal failure is caught at the boundary, counted here, and logged once per site through the
`tracegym` logger (with its traceback), so a bug is visible without flooding the agent's logs.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
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


def add(counter: str, n: int = 1) -> None:
    """Add to a named counter (spans dropped, redactions, ...). Never raises."""
    try:
        with _state.lock:
            _state.counts[counter] += n
    except Exception:  # pragma: no cover
        pass


def snapshot() -> tuple[dict[str, int], dict[str, int]]:
    """Copies of (counters, internal errors by site)."""
    with _state.lock:
        return dict(_state.counts), dict(_state.errors)


def reset() -> None:
    """Forget all counts (tests, and `tracegym.init` in a fresh configuration)."""
    with _state.lock:
        _state.errors.clear()
        _state.counts.clear()
