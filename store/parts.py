"""Lake parts that cannot be read: found cheaply, moved aside, never deleted.

One corrupt Parquet part must not make the whole store unreadable. Each time the views are made,
the parts they would read are checked cheaply: both magic numbers and the footer (the metadata
DuckDB parses anyway), in one DuckDB call for all, once per (path, size, mtime): in a process,
and across processes through CHECKED_FILE in the lake (written when the disk lets it).
A corrupt data page passes that check: a query that then fails with a read error has every part
read whole once (`check(..., deep=True)`), and the bad ones go the same way.

A bad part is moved to `<lake>/quarantine/<table>/day=D/` (nothing is lost; `tracegym doctor`
lists them), under the compaction lock so no compaction is renaming or replacing parts at that
moment. Where it cannot be moved (a read-only or full disk, or a compaction holds the lock) the
views leave it out by name. Each bad part is named once per process: one line on stderr, through
the `tracegym.store` logger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import duckdb
from tracegym.store.home import read_json, write_json
from tracegym.store.lake import _stem_of_part, compaction_lock, lake_dir

TABLES = ("spans", "outcomes", "nightly")  # the lake's folders the views read
QUARANTINE_DIR = "quarantine"
CHECKED_FILE = ".parts-checked.json"  # [[path under the lake, size, mtime_ns], ...]: good footers
MAGIC = b"PAR1"

log = logging.getLogger("tracegym.store")


@dataclass(frozen=True)
class BadPart:
    """A lake part that cannot be read, and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class _Verdict:
    size: int
    mtime_ns: int
    deep: bool  # every row was read, not only the footer
    reason: str | None


_verdicts: dict[Path, _Verdict] = {}
_named: set[Path] = set()
_lock = threading.Lock()


def quarantine_dir(home: Path) -> Path:
    return lake_dir(home) / QUARANTINE_DIR


def lake_parts(home: Path, table: str | None = None) -> list[Path]:
    """The Parquet files the views read (all tables, or `table`'s), in name order."""
    found: list[Path] = []
    for name in TABLES if table is None else (table,):
        directory = lake_dir(home) / name
        if directory.is_dir():
            found.extend(sorted(directory.rglob("*.parquet")))
    return found


def quarantined(home: Path) -> list[Path]:
    """Every file moved aside so far."""
    directory = quarantine_dir(home)
    return sorted(p for p in directory.rglob("*") if p.is_file()) if directory.is_dir() else []


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _magic_problem(path: Path) -> str | None:
    with open(path, "rb") as handle:
        head = handle.read(4)
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        if size < 12:
            return f"{size} bytes: too short for a Parquet file"
        handle.seek(-4, os.SEEK_END)
        tail = handle.read(4)
    if head != MAGIC:
        return "no Parquet magic number at the start"
    if tail != MAGIC:
        return "no Parquet magic number at the end (cut short?)"
    return None


def _footer_problems(con: duckdb.DuckDBPyConnection, paths: list[Path]) -> dict[Path, str]:
    """Parts whose footer DuckDB cannot parse: all in one call, one by one only on a failure."""
    if not paths:
        return {}
    query = "SELECT count(*) FROM parquet_file_metadata($p)"
    try:
        con.execute(query, {"p": [str(p) for p in paths]}).fetchall()
        return {}
    except duckdb.Error:
        pass
    problems = {}
    for path in paths:
        try:
            con.execute(query, {"p": str(path)}).fetchall()
        except duckdb.Error as exc:
            if path.exists():
                problems[path] = _first_line(exc)
    return problems


def _data_problem(con: duckdb.DuckDBPyConnection, path: Path) -> str | None:
    """Read every value of every column (hashed, nothing kept): a corrupt page fails here."""
    try:
        con.execute("SELECT bit_xor(hash(COLUMNS(*))) FROM read_parquet($p)", {"p": str(path)})
        con.fetchall()
    except duckdb.Error as exc:
        return _first_line(exc) if path.exists() else None
    return None


def _known_good(home: Path) -> dict[Path, tuple[int, int]]:
    """Footers an earlier process found good: {path: (size, mtime_ns)} from CHECKED_FILE."""
    try:
        entries = read_json(lake_dir(home) / CHECKED_FILE)
        return {lake_dir(home) / name: (int(size), int(mtime)) for name, size, mtime in entries}
    except (OSError, ValueError, TypeError):
        return {}


def _remember_good(home: Path, good: dict[Path, os.stat_result]) -> None:
    """Write CHECKED_FILE (whole, renamed into place) when the disk lets us; never required."""
    lake = lake_dir(home)
    entries = [[str(p.relative_to(lake)), st.st_size, st.st_mtime_ns] for p, st in good.items()]
    with contextlib.suppress(OSError):
        write_json(lake / CHECKED_FILE, entries, indent=None)


def check(home: Path, paths: Iterable[Path], *, deep: bool = False) -> list[BadPart]:
    """The parts of `paths` (under `home`'s lake) that cannot be read: footers only, or every
    row when `deep`.

    A verdict is kept per (path, size, mtime) for this process, and good footers in the lake's
    CHECKED_FILE for the next one (a fresh `tracegym` command skips what an earlier one checked);
    parts that vanished meanwhile (moved aside or replaced by another process) are not bad."""
    todo: list[tuple[Path, os.stat_result]] = []
    bad: list[BadPart] = []
    good: dict[Path, os.stat_result] = {}
    earlier: dict[Path, tuple[int, int]] | None = None
    for path in paths:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        with _lock:
            known = _verdicts.get(path)
        same = known and (known.size, known.mtime_ns) == (stat.st_size, stat.st_mtime_ns)
        if known and same and (known.reason or known.deep or not deep):
            if known.reason:  # bad stays bad; a good verdict holds at its depth or less
                bad.append(BadPart(path, known.reason))
            else:
                good[path] = stat
            continue
        if not deep:
            earlier = _known_good(home) if earlier is None else earlier
            if earlier.get(path) == (stat.st_size, stat.st_mtime_ns):
                with _lock:
                    _verdicts[path] = _Verdict(stat.st_size, stat.st_mtime_ns, False, None)
                good[path] = stat
                continue
        todo.append((path, stat))
    if not todo:
        return bad
    reasons: dict[Path, str | None] = {}
    for path, _ in todo:
        try:
            reasons[path] = _magic_problem(path)
        except FileNotFoundError:
            reasons[path] = None
        except OSError as exc:
            reasons[path] = f"cannot read it: {exc.strerror or exc}"
    con = duckdb.connect()
    try:
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        reasons.update(_footer_problems(con, [p for p, _ in todo if reasons[p] is None]))
        if deep:
            for path, _ in todo:
                if reasons[path] is None:
                    reasons[path] = _data_problem(con, path)
    finally:
        con.close()
    with _lock:
        for path, stat in todo:
            _verdicts[path] = _Verdict(stat.st_size, stat.st_mtime_ns, deep, reasons[path])
    bad.extend(BadPart(path, reason) for path, _ in todo if (reason := reasons[path]))
    if not deep:  # the doctor writes nothing unless asked to repair
        good.update((p, stat) for p, stat in todo if reasons[p] is None and p.exists())
        _remember_good(home, good)
    return bad


def _destination(home: Path, part: Path) -> Path:
    """Where `part` goes in the quarantine: the same relative path, never over an earlier one."""
    target = quarantine_dir(home) / part.relative_to(lake_dir(home))
    n = 0
    while target.exists():
        n += 1
        target = target.with_name(f"{part.stem}.{n}{part.suffix}")
    return target


def move_aside(home: Path, bad: list[BadPart], *, wait: bool = False) -> dict[Path, Path]:
    """Move `bad` parts into the quarantine under the compaction lock; {part: new path}.

    Moves nothing (and raises nothing) when the lock is busy and `wait` is off, or when the disk
    refuses: the caller then leaves those parts out of its views by name."""
    moved: dict[Path, Path] = {}
    if not bad:
        return moved
    try:
        with compaction_lock(home, wait=wait) as held:
            if not held:
                return moved
            for part in bad:
                if not part.path.exists():
                    continue
                target = _destination(home, part.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.rename(part.path, target)
                moved[part.path] = target
    except OSError:
        pass  # read-only, full, or not ours to move: left out by name instead
    return moved


def name_once(bad: BadPart, moved_to: Path | None) -> None:
    """The one-line warning for `bad`, the first time this process meets it."""
    with _lock:
        if bad.path in _named:
            return
        _named.add(bad.path)
    where = f"moved to {moved_to}" if moved_to else "left out of queries (it could not be moved)"
    log.warning("corrupt lake part %s (%s): %s", bad.path, bad.reason, where)


@dataclass(frozen=True)
class Screened:
    """What `screen` found: every bad part, and those of them still in place (not moved)."""

    found: list[BadPart]
    in_place: set[Path]


def screen(home: Path, skip_stems: Iterable[str] = (), *, deep: bool = False) -> Screened:
    """Check the parts the views would read (less those of spool files `skip_stems`, which they
    leave out anyway) and move the bad ones aside, naming each once."""
    skip = set(skip_stems)
    parts = [p for p in lake_parts(home) if _stem_of_part(p.name) not in skip]
    bad = check(home, parts, deep=deep)
    moved = move_aside(home, bad)
    for part in bad:
        name_once(part, moved.get(part.path))
    return Screened(bad, {part.path for part in bad if part.path not in moved})


def may_be_corrupt(exc: BaseException, home: Path) -> bool:
    """Whether a query's error could come from a damaged part (not from the query's text, nor
    from a file outside the lake that the query named)."""
    if type(exc) not in (
        duckdb.Error,  # "Out of buffer", "don't know what type" ...
        duckdb.IOException,
        duckdb.InvalidInputException,
        duckdb.InternalException,
        duckdb.SerializationException,
    ):
        return False
    named = re.findall(r"[\"'](/[^\"']+)[\"']", str(exc))
    return not named or any(Path(path).is_relative_to(lake_dir(home)) for path in named)
