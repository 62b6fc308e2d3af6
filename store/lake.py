"""Compaction of the spool into a Parquet lake partitioned by day, exactly once.

Each complete spool file becomes Parquet parts named after it (`spans/day=D/part-<stem>-N`;
outcome records go to `outcomes/` alike), many files per DuckDB pass,
written to a staging folder by DuckDB, fsynced, then renamed into the lake; only then is the
spool file removed. A crash anywhere leaves the spool file in place, and the rerun rewrites
the very same part names: every span ends up in the lake exactly once. Files still held by a
live writer (see `tracegym.tracer.spool.is_complete`) are left alone and read live instead.

One compaction at a time per home: an exclusive `flock` on `lake/.compact.lock` is held while
the spool is listed and moved, so two processes (the nightly and a query that compacts first)
never move the same file twice. A second compactor waits for it (`wait=True`, the batch job and
`Store.compact()`) or skips (`wait=False`, what `Store` does on open: the views read the lake
plus the spool in place, exactly once, whatever the compaction in flight has done so far).
Staging folders are unique to each run (defence in depth), and the lock's holder clears what
crashed runs left there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from tracegym.store.home import LAKE_DIR as LAKE_DIR
from tracegym.store.home import Home
from tracegym.store.schema import (
    BAD_TABLE,
    FAST_LINE_BYTES,
    MAX_LINE_BYTES,
    compaction_source,
    row_select,
)
from tracegym.tracer.spool_files import is_complete

SPANS_DIR = "spans"
OUTCOMES_DIR = "outcomes"  # outcome records, kept apart so `spans` needs no filter
STAGING_DIR = "_staging"
LOCK_FILE = ".compact.lock"


def lake_dir(home: Path | Home) -> Path:
    return Home.at(home).lake


def spans_dir(home: Path | Home) -> Path:
    return lake_dir(home) / SPANS_DIR


def outcomes_dir(home: Path | Home) -> Path:
    return lake_dir(home) / OUTCOMES_DIR


@dataclass
class CompactionReport:
    """What one compaction did."""

    files: int = 0
    spans: int = 0
    parts: int = 0
    truncated_lines: int = 0  # a last line cut by a crash (no newline), cut off the file
    bad_lines: int = 0  # whole lines that are not a span (garbage, a cut line, a wrong type)
    skipped_live: list[Path] = field(default_factory=list)
    busy: bool = False  # skipped: another process was compacting (wait=False)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_partial_tail(path: Path) -> int:
    """Cut a crash-cut last line off a spool file nobody writes any more; 1 if cut, else 0."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return 0
        # Walk back to the last newline in blocks.
        end = size
        while end > 0:
            start = max(0, end - 65536)
            handle.seek(start)
            block = handle.read(end - start)
            cut = block.rfind(b"\n")
            if cut != -1:
                handle.truncate(start + cut + 1)
                return 1
            end = start
        handle.truncate(0)
        return 1


def complete_spool_files(home: Path) -> tuple[list[Path], list[Path]]:
    """(files ready to compact, files a live writer still holds), in name order."""
    directory = Home.at(home).spool
    if not directory.is_dir():
        return [], []
    ready, live = [], []
    for path in sorted(directory.glob("*.jsonl")):
        (ready if is_complete(path) else live).append(path)
    return ready, live


def _stem_of_part(name: str) -> str:
    """`part-<stem>-<i>.parquet` -> `<stem>`."""
    return name[len("part-") :].rsplit("-", 1)[0]


@contextlib.contextmanager
def compaction_lock(home: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold `lake/.compact.lock` (an exclusive flock); yields False, holding nothing, when
    `wait` is off and another compactor has it. The kernel drops the lock of a killed process."""
    lake_dir(home).mkdir(parents=True, exist_ok=True)
    fd = os.open(lake_dir(home) / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # closing the descriptor below releases the lock
    finally:
        os.close(fd)


def _new_staging(home: Path, stem: str) -> Path:
    """A staging folder no other run shares (pid and random suffix)."""
    staging = lake_dir(home) / STAGING_DIR / f"{stem}-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir(parents=True)
    return staging


@dataclass(frozen=True)
class StagedPart:
    """One Parquet part DuckDB wrote into a staging folder: its table, day, source file's
    stem and index (`data_<i>`) come from the folder names of PARTITION_BY; `rows` from the
    COPY's statistics."""

    path: Path
    table: str
    day: str  # `day=YYYY-MM-DD`, the folder name
    stem: str
    index: str
    rows: int

    @property
    def name(self) -> str:
        """The part's name in the lake, after the spool file it came from."""
        return f"part-{self.stem}-{self.index}.parquet"


@dataclass(frozen=True)
class StagedBatch:
    """What one pass over spool files wrote: its parts, and the spans and the lines that are
    no span (garbage, a cut line, a wrong type: counted, not kept) it read."""

    parts: list[StagedPart]
    bad_lines: int

    @property
    def spans(self) -> int:
        return sum(p.rows for p in self.parts)


def stage_batch(con: duckdb.DuckDBPyConnection, staging: Path, paths: list[Path]) -> StagedBatch:
    """Write the spans of `paths` as Parquet parts into `staging` in one DuckDB pass, reading
    the spool once: lines that are no span go to a part of their own (BAD_TABLE), counted from
    the COPY's statistics and deleted. Used by this lake and the object lake."""
    nonempty = [str(p) for p in paths if p.stat().st_size]
    if not nonempty:
        return StagedBatch([], 0)
    try:
        written = _copy(con, staging, nonempty, FAST_LINE_BYTES)
    except duckdb.InvalidInputException as exc:
        if "maximum_object_size" not in str(exc):
            raise
        shutil.rmtree(staging)  # a longer line: read again, with larger buffers
        staging.mkdir()
        written = _copy(con, staging, nonempty, MAX_LINE_BYTES)
    rows = {Path(name).resolve(): int(count) for name, count, *_ in written}
    parts, bad_lines = [], 0
    for part in sorted(staging.rglob("*.parquet")):
        table, day, source = part.relative_to(staging).parts[:3]  # _table=, day=, _src=
        count = rows.get(part.resolve())
        if count is None:  # never seen: fail loudly, the spool files stay where they are
            raise RuntimeError(f"compaction: DuckDB gave no statistics for the part {part}")
        if table == f"_table={BAD_TABLE}":
            bad_lines += count
            part.unlink()
            continue
        index = part.stem.rsplit("_", 1)[-1]  # data_<i>
        parts.append(StagedPart(part, table.split("=", 1)[1], day, source.split("=", 1)[1],
                                index, count))  # fmt: skip
    return StagedBatch(parts, bad_lines)


def _copy(
    con: duckdb.DuckDBPyConnection, staging: Path, paths: list[str], max_line_bytes: int
) -> list[tuple]:
    """The COPY of `paths` into `staging`, partitioned; its statistics, a row per part."""
    select = row_select(compaction_source("$paths", max_line_bytes), with_source=True,
                        route_bad=True)  # fmt: skip
    return con.execute(
        f"COPY ({select}) TO '{_sql_path(staging)}' "
        "(FORMAT parquet, PARTITION_BY (_table, day, _src), OVERWRITE_OR_IGNORE true, "
        "COMPRESSION zstd, RETURN_STATS true)",
        {"paths": paths},
    ).fetchall()


def compact_batch(
    con: duckdb.DuckDBPyConnection, home: Path, paths: list[Path]
) -> tuple[StagedBatch, int]:
    """Move complete spool files into the lake in one DuckDB pass; returns what the pass read
    and the number of parts now in the lake.

    Parts are named after their source file, so a rerun after a crash rewrites the same names;
    parts a previous attempt left under a source's name and this one did not write are removed.
    """
    staging = _new_staging(home, paths[0].stem)
    batch = stage_batch(con, staging, paths)
    stems = {p.stem for p in paths}
    previous = [p for p in lake_dir(home).glob("*/day=*/part-*.parquet")
                if _stem_of_part(p.name) in stems]  # fmt: skip
    written: set[Path] = set()
    for part in batch.parts:
        target = lake_dir(home) / part.table / part.day / part.name
        target.parent.mkdir(parents=True, exist_ok=True)
        _fsync(part.path)
        os.replace(part.path, target)
        _fsync(target.parent)
        written.add(target)
    for stale in previous:
        if stale not in written:
            stale.unlink()
    for path in paths:
        path.unlink()  # only now: its spans are durable in the lake
    shutil.rmtree(staging, ignore_errors=True)
    return batch, len(written)


def _sql_path(path: Path) -> str:
    """A path as a SQL string literal body (COPY ... TO takes no parameters)."""
    return str(path).replace("'", "''")


BATCH_BYTES = 256 << 20  # spool bytes one DuckDB pass reads: its memory grows with them


def batches(
    paths: list[Path], batch_files: int, batch_bytes: int | None = None
) -> list[list[Path]]:
    """`paths` in order, cut into batches of at most `batch_files` files and `batch_bytes`
    bytes (a file larger than that is a batch of its own). One pass over 3.7M spans of spool
    (5 GB of JSON lines) held 10.5 GB; bounded, compaction's memory does not grow with the
    spool. `batch_bytes` defaults to BATCH_BYTES."""
    limit = BATCH_BYTES if batch_bytes is None else batch_bytes
    out: list[list[Path]] = []
    size = 0
    for path in paths:
        bytes_ = path.stat().st_size
        if not out or len(out[-1]) >= batch_files or size + bytes_ > limit:
            out.append([])
            size = 0
        out[-1].append(path)
        size += bytes_
    return out


def compact(
    home: Path,
    con: duckdb.DuckDBPyConnection | None = None,
    *,
    batch_files: int = 64,
    wait: bool = True,
) -> CompactionReport:
    """Compact every complete spool file under `home` into the lake, `batch_files` at a time.

    Holds the home's compaction lock throughout; with `wait` off, returns at once (`busy`)
    when another process holds it."""
    home = Path(home)
    report = CompactionReport()
    ready, report.skipped_live = complete_spool_files(home)
    if not ready:  # nothing to do: take no lock, create no lake
        return report
    with compaction_lock(home, wait=wait) as held:
        if not held:
            report.busy = True
            return report
        shutil.rmtree(lake_dir(home) / STAGING_DIR, ignore_errors=True)  # crashed runs' leftovers
        ready, report.skipped_live = complete_spool_files(home)  # again: now nobody else moves
        _compact_locked(home, con, ready, batch_files, report)
    return report


def _compact_locked(
    home: Path,
    con: duckdb.DuckDBPyConnection | None,
    ready: list[Path],
    batch_files: int,
    report: CompactionReport,
) -> None:
    """The compaction proper, under the lock: `ready` in batches, counts into `report`."""
    if not ready:
        return
    own = con is None
    con = con or duckdb.connect()
    try:
        for batch in batches(ready, batch_files):
            for path in batch:
                report.truncated_lines += _drop_partial_tail(path)
            staged, parts = compact_batch(con, home, batch)
            report.bad_lines += staged.bad_lines  # skipped, not a row of NULLs
            report.files += len(batch)
            report.spans += staged.spans
            report.parts += parts
    finally:
        if own:
            con.close()
