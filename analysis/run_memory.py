"""What is worked out from a run, remembered for a while: several detectors (or one detector
once per rule) ask for the same thing of one run. Remembered only inside `scope()`, per thread,
so memory does not grow with the runs analysed and a changed run is read again afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from tracegym.analysis.runs import Run

T = TypeVar("T")


class PerRunMemory(Generic[T]):
    """`get(run)` works `work(run)` out, once per run inside `scope()` (scopes nest: the
    outermost one's memory is used). The runs must not change inside a scope."""

    def __init__(self, work: Callable[[Run], T]) -> None:
        self._work = work
        self._local = threading.local()

    @contextmanager
    def scope(self) -> Iterator[None]:
        outer = getattr(self._local, "memo", None)
        self._local.memo = {} if outer is None else outer
        try:
            yield
        finally:
            self._local.memo = outer

    def get(self, run: Run) -> T:
        memo: dict[int, tuple[Run, T]] | None = getattr(self._local, "memo", None)
        if memo is not None and (known := memo.get(id(run))) is not None and known[0] is run:
            return known[1]
        value = self._work(run)
        if memo is not None:
            memo[id(run)] = (run, value)  # (the run is held, so its id is not reused meanwhile)
        return value
