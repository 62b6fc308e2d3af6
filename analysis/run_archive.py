"""Runs kept on disk, read back one at a time: what a streamed analysis holds instead of runs.

Detectors see each run once, as it streams from the lake; describing the kept gaps afterwards
needs a few of them again (the steps their findings name). `RunArchive` appends each run as a
compressed pickle to a temporary file and keeps only its offset: a few dozen bytes a run in
memory, about 11 KB a real tau2 run on disk. It reads as a `Sequence[Run]` (in the order the
runs were added) and as a `Mapping` from trace id to run, so what takes a list of runs takes
it unchanged. The file is the process's own (created under the system's temporary directory,
removed on `close`, at exit, or when the archive is collected).
"""

from __future__ import annotations

import pickle
import tempfile
import threading
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import overload

from tracegym.analysis.runs import Run

_LEVEL = 1  # zlib level: 6x smaller than the pickle, and fast


class RunArchive(Sequence[Run]):
    """Append-only runs on disk; `by_trace` maps trace ids to them. Recent reads are cached
    (`cached` runs) since describing a gap reads its runs' findings in run order."""

    def __init__(self, cached: int = 64) -> None:
        # lives as long as the archive: closed by `close` or the finalizer
        self._file = tempfile.TemporaryFile(prefix="tracegym-runs-")  # noqa: SIM115
        self._finalizer = weakref.finalize(self, self._file.close)
        self._spans: list[tuple[int, int]] = []  # (offset, length) per run
        self._index: dict[str, int] = {}  # trace id -> position
        self._end = 0
        self._cache: OrderedDict[int, Run] = OrderedDict()
        self._cached = cached
        self._lock = threading.Lock()  # one file position for readers and the writer

    def append(self, run: Run) -> None:
        blob = zlib.compress(pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL), _LEVEL)
        with self._lock:
            self._file.seek(self._end)
            self._file.write(blob)
            self._spans.append((self._end, len(blob)))
            self._index.setdefault(run.trace_id, len(self._spans) - 1)
            self._end += len(blob)

    def __len__(self) -> int:
        return len(self._spans)

    @overload
    def __getitem__(self, i: int) -> Run: ...
    @overload
    def __getitem__(self, i: slice) -> list[Run]: ...
    def __getitem__(self, i: int | slice) -> Run | list[Run]:
        if isinstance(i, slice):
            return [self._read(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._read(i)

    def __iter__(self) -> Iterator[Run]:
        for i in range(len(self)):
            yield self._read(i, remember=False)

    def _read(self, i: int, remember: bool = True) -> Run:
        with self._lock:
            run = self._cache.get(i)
            if run is not None:
                if remember:
                    self._cache.move_to_end(i)
                return run
            offset, length = self._spans[i]
            self._file.seek(offset)
            blob = self._file.read(length)
        run = pickle.loads(zlib.decompress(blob))  # our own file: written by `append` above
        if remember and self._cached:
            with self._lock:
                self._cache[i] = run
                while len(self._cache) > self._cached:
                    self._cache.popitem(last=False)
        return run

    @property
    def by_trace(self) -> Mapping[str, Run]:
        return _ByTrace(self)

    def position(self, trace_id: str) -> int | None:
        return self._index.get(trace_id)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> RunArchive:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class _ByTrace(Mapping[str, Run]):
    """An archive's runs by trace id (the first run added with that id)."""

    def __init__(self, archive: RunArchive) -> None:
        self._archive = archive

    def __getitem__(self, trace_id: str) -> Run:
        at = self._archive.position(trace_id)
        if at is None:
            raise KeyError(trace_id)
        return self._archive[at]

    def __contains__(self, trace_id: object) -> bool:
        return isinstance(trace_id, str) and self._archive.position(trace_id) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._archive._index)

    def __len__(self) -> int:
        return len(self._archive._index)
