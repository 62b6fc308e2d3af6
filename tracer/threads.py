"""Carrying the trace context into threads.

asyncio tasks copy the context by themselves; threads start with an empty one, so a tool called
on a worker thread would start a new, orphan trace. These helpers copy the caller's context
(the active span and tracegym's run scope) into the thread.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

R = TypeVar("R")


def wrap(fn: Callable[..., R]) -> Callable[..., R]:
    """`fn`, made to run in the context of the caller of `wrap` wherever it is called."""
    captured = contextvars.copy_context()

    @functools.wraps(fn)
    def in_context(*args: Any, **kwargs: Any) -> R:
        return captured.copy().run(fn, *args, **kwargs)  # a copy per call: safe to run twice

    return in_context


class ContextThreadPoolExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose tasks run in the context of the code that submitted them."""

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        return super().submit(wrap(fn), *args, **kwargs)


_originals: dict[str, Any] = {}


def instrument_threads() -> None:
    """Make every ThreadPoolExecutor and threading.Thread carry the context (idempotent)."""
    if _originals:
        return
    _originals["submit"] = ThreadPoolExecutor.submit
    _originals["start"] = threading.Thread.start
    submit, start = _originals["submit"], _originals["start"]

    def patched_submit(self: ThreadPoolExecutor, fn: Callable[..., Any], /, *a: Any, **k: Any):
        return submit(self, wrap(fn), *a, **k)

    def patched_start(self: threading.Thread) -> None:
        self.run = wrap(self.run)  # type: ignore[method-assign]
        start(self)

    ThreadPoolExecutor.submit = patched_submit  # type: ignore[method-assign]
    threading.Thread.start = patched_start  # type: ignore[method-assign]


def uninstrument_threads() -> None:
    """Undo `instrument_threads`."""
    if not _originals:
        return
    ThreadPoolExecutor.submit = _originals.pop("submit")  # type: ignore[method-assign]
    threading.Thread.start = _originals.pop("start")  # type: ignore[method-assign]
