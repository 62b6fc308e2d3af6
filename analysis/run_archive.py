"""Runs kept on disk, read back one at a time: what a streamed analysis holds instead of runs.

Detectors see each run once, as it streams from the lake; describing the kept gaps afterwards
needs a few of them again (the steps their findings name). `RunArchive` appends each run as a
compressed pickle to a temporary file and keeps only its offset: a few dozen bytes a run in
memory, about 8 KB a real tau2 run on disk (zstd through pyarrow: a fifth of zlib's time). It
reads as a `Sequence[Run]` (in the order the runs were added) and as a `Mapping` from trace id
to run, so what takes a list of runs takes it unchanged. Worker processes write parts of their
own (`ArchivePart`), which one archive then reads in the order given (`RunArchive.joined`).
Files are the archive's own and go with it (`close`, or when it is collected); a part's file
is unlinked as soon as it is opened.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, overload

import pyarrow as pa
from tracegym.analysis.runs import Run

_CODEC = "zstd"  # 8x smaller than the pickle, at 0.07 ms a tau2 run


def packed(run: Run) -> bytes:
    """A run as the bytes an archive keeps: its pickle's length (8 bytes), then the pickle
    compressed."""
    blob = pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL)
    return len(blob).to_bytes(8, "little") + pa.compress(blob, codec=_CODEC, asbytes=True)


def unpacked(data: bytes) -> Run:
    """The run `packed` gave these bytes for (the archive's own files only: a pickle)."""
    size = int.from_bytes(data[:8], "little")
    blob = pa.decompress(data[8:], decompressed_size=size, codec=_CODEC, asbytes=True)
    return pickle.loads(blob)


@dataclass
class ArchivePart:
    """Runs a worker wrote to `path`: (trace id, offset, length) each, in the order written."""

    path: str
    index: list[tuple[str, int, int]] = field(default_factory=list)

    def writer(self) -> _PartWriter:
        return _PartWriter(self)


class _PartWriter:
    def __init__(self, part: ArchivePart) -> None:
        self.part, self._end = part, 0
        self._file = open(part.path, "wb")  # noqa: SIM115 - closed by __exit__

    def append(self, run: Run) -> None:
        blob = packed(run)
        self._file.write(blob)
        self.part.index.append((run.trace_id, self._end, len(blob)))
        self._end += len(blob)

    def __enter__(self) -> _PartWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._file.close()


class RunArchive(Sequence[Run]):
    """Runs on disk; `by_trace` maps trace ids to them. Recent reads are cached (`cached`
    runs) since describing a gap reads its runs' findings run by run."""

    def __init__(self, cached: int = 64) -> None:
        # lives as long as the archive: closed by `close` or the finalizer
        self._files: list[BinaryIO] = [tempfile.TemporaryFile(prefix="tracegym-runs-")]  # noqa: SIM115
        self._finalizer = weakref.finalize(self, _close_all, self._files)
        self._spans: list[tuple[int, int, int]] = []  # (file, offset, length) per run
        self._index: dict[str, int] = {}  # trace id -> position
        self._end = 0  # of the first file, the one `append` writes
        self._cache: OrderedDict[int, Run] = OrderedDict()
        self._cached = cached
        self._lock = threading.Lock()  # one file position for readers and the writer

    @classmethod
    def joined(cls, parts: Sequence[ArchivePart], order: Sequence[str] | None = None,
               cached: int = 64) -> RunArchive:  # fmt: skip
        """One archive over workers' parts: runs in `order` (trace ids; those of no part are
        left out), else part after part."""
        archive = cls(cached)
        where: dict[str, tuple[int, int, int]] = {}
        for part in parts:
            archive._files.append(open(part.path, "rb"))  # noqa: SIM115 - the archive's now
            os.unlink(part.path)  # readable while open; gone when closed, whatever happens
            number = len(archive._files) - 1
            for trace_id, offset, length in part.index:
                where.setdefault(trace_id, (number, offset, length))
        for trace_id in order if order is not None else list(where):
            span = where.get(trace_id)
            if span is not None:
                archive._index.setdefault(trace_id, len(archive._spans))
                archive._spans.append(span)
        return archive

    def append(self, run: Run) -> None:
        blob = packed(run)
        with self._lock:
            self._files[0].seek(self._end)
            self._files[0].write(blob)
            self._spans.append((0, self._end, len(blob)))
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
            number, offset, length = self._spans[i]
            self._files[number].seek(offset)
            blob = self._files[number].read(length)
        run = unpacked(blob)
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

    def trace_ids(self) -> Iterator[str]:
        return iter(self._index)

    def trace_count(self) -> int:
        return len(self._index)

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> RunArchive:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _close_all(files: list[BinaryIO]) -> None:
    for f in files:
        f.close()


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
        return self._archive.trace_ids()

    def __len__(self) -> int:
        return self._archive.trace_count()
