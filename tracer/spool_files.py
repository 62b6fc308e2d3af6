"""The spool files themselves: per-process, append-only JSON-lines files, written and read.

Format (version 1), documented for readers in docs/spool.md:
- files live in `<home>/spool/` and are named `<UTC start>-<host>-<pid>-<random>.jsonl`;
- one span per line, a JSON object with the fields of `span_record` below;
- each export batch is one `write()` to a file opened with O_APPEND, so many processes can
  spool at once, and a process killed with SIGKILL loses only what had not been exported yet;
- a line without its final newline was cut by a crash mid-write and must be skipped;
- the writing process holds an exclusive `flock` on the file while it may still append; once a
  reader can take that lock the file is complete (closed, rotated, or its writer died).

Standard library only (no OpenTelemetry): the store and the CLI read spool files through this
module without loading the SDK; `tracer.spool` turns spans into its lines.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracegym.tracer import internal

SPOOL_VERSION = 1
SPOOL_DIR = "spool"


def spool_dir(home: Path) -> Path:
    return Path(home) / SPOOL_DIR


class SpoolWriter:
    """Appends whole lines to this process's current spool file; rotates by size and age."""

    def __init__(
        self, home: Path, max_file_bytes: int = 64 << 20, max_file_seconds: float = 300.0
    ) -> None:
        self.directory = spool_dir(home)
        self.max_file_bytes = max_file_bytes
        self.max_file_seconds = max_file_seconds
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0
        self._opened_at = 0.0
        self._size = 0
        self.path: Path | None = None
        if hasattr(os, "register_at_fork"):
            after = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (method := after()) and method())

    def _after_fork(self) -> None:
        """In a forked child: let go of the parent's file at once (the lock is shared)."""
        self._lock = threading.Lock()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        host = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname())[:32]
        name = f"{stamp}-{host}-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        # Created and locked under a name readers ignore, then renamed: no reader can ever see
        # the file unlocked (and so "complete") before its writer holds it.
        hidden = self.directory / f".{name}.new"
        fd = os.open(
            hidden, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644
        )
        path = self.directory / name
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(hidden, path)
        except BaseException:  # leave neither a descriptor nor a hidden file behind
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(hidden)
            raise
        self._fd, self._pid, self.path = fd, os.getpid(), path
        self._opened_at, self._size = time.monotonic(), 0
        internal.add("spool_files_opened")
        return fd

    def _close(self) -> None:
        if self._fd is not None:
            # In the writer this releases the flock: readers may now take the file whole. In a
            # forked child it drops the inherited copy, which would otherwise keep the parent's
            # file looking live for as long as the child runs.
            os.close(self._fd)
        self._fd = None

    def write(self, data: bytes) -> None:
        """Append `data` (whole lines) in one write; raises OSError on failure, and then
        leaves none of `data` in the file (so a failed batch is neither stored nor merged)."""
        with self._lock:
            fd = self._fd
            if fd is not None and (
                self._pid != os.getpid()  # forked: the parent owns that file
                or self._size >= self.max_file_bytes
                or time.monotonic() - self._opened_at >= self.max_file_seconds
            ):
                self._close()
                fd = None
            if fd is None:
                fd = self._open()
            try:
                view = memoryview(data)
                while view:  # os.write may write less than asked (signals, huge buffers)
                    written = os.write(fd, view)
                    view = view[written:]
            except BaseException:
                self._undo(fd)
                raise
            self._size += len(data)

    def _undo(self, fd: int) -> None:
        """After a failed or interrupted write (a full disk takes part of a batch, then
        refuses the rest): cut the file back to its last whole line, which `_size` knows (no one
        else appends to it). Should that fail too, leave the file (complete now; compaction
        drops a cut last line) so that the next batch starts a new one, not the partial line."""
        try:
            os.ftruncate(fd, self._size)
        except OSError as exc:
            internal.report_error("spool.truncate", exc)
            with contextlib.suppress(OSError):
                self._close()
            self._fd = None

    def close(self) -> None:
        with self._lock:
            self._close()


def is_locked(path: Path) -> bool | None:
    """Whether another process holds `path`'s flock (asked without writing); None if missing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock if we took it


def is_complete(path: Path) -> bool:
    """True when no live process may still append to the spool file at `path`."""
    return is_locked(path) is False


_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")


def _time_ns(value: object) -> bool:
    return type(value) is int and 0 <= value < 1 << 63


def is_span(record: object) -> bool:
    """Whether a decoded line is a span: an object with the required fields of the right
    types (docs/spool.md). The store's SQL (`store.schema`) makes the very same check."""
    if not isinstance(record, dict):
        return False
    trace_id, span_id = record.get("trace_id"), record.get("span_id")
    return (
        type(record.get("v")) is int
        and record["v"] == SPOOL_VERSION
        and isinstance(trace_id, str)
        and _TRACE_ID.fullmatch(trace_id) is not None
        and isinstance(span_id, str)
        and _SPAN_ID.fullmatch(span_id) is not None
        and isinstance(record.get("name"), str)
        and _time_ns(record.get("start_ns"))
        and _time_ns(record.get("end_ns"))
    )


def _other_version(record: object) -> bool:
    version = record.get("v") if isinstance(record, dict) else None
    return type(version) is int and version != SPOOL_VERSION


def read_spool_file(path: Path) -> Iterator[dict[str, Any]]:
    """The spans of one spool file; a crash-cut last line and lines that are no span (not
    JSON, another version, a required field missing or of the wrong type) are skipped."""
    with open(path, "rb") as handle:
        for line in handle:
            if not line.endswith(b"\n"):
                internal.add("spool_partial_lines_skipped")
                break
            try:
                record = json.loads(line)
            except ValueError:
                internal.add("spool_bad_lines_skipped")
                continue
            if is_span(record):
                yield record
            elif _other_version(record):
                internal.add("spool_unknown_version_lines_skipped")
            else:
                internal.add("spool_bad_lines_skipped")


def iter_spool(home: Path) -> Iterator[dict[str, Any]]:
    """Every complete record under `<home>/spool`, file by file in name (time) order."""
    directory = spool_dir(home)
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.jsonl")):
        yield from read_spool_file(path)
