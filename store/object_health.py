"""`tracegym doctor` on a lake on object storage (store/object_lake.py): its commit log and the
parts the commits name, and this host's local copies of them.

What it checks, without writing anything to the lake:

- every `_commits/<seq>.json` reads and parses, and no number below the last is missing (commits
  are never removed: a hole means someone deleted one, and its parts are no longer read);
- every checkpoint reads and copies the commits it covers (a damaged one is only a note:
  readers pass over it);
- every part a commit names is there, and its Parquet footer reads with the rows the commit
  says (footers only: reading every row would download the whole lake);
- this host's copies under `<home>/cache/lake/` read whole, with the rows the commit says (a
  damaged copy would fail every query here; `--repair` deletes it, the next read fetches it
  again).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from tracegym.store.home import Home
from tracegym.store.object_lake import (
    _CHECKPOINT_NAME,
    _COMMIT_NAME,
    COMMITS_DIR,
    TABLES,
    Commit,
    LakeConfig,
    ObjectLake,
    _parse_commit,
)
from tracegym.store.object_views import LAKE_CACHE_DIR
from tracegym.store.parts import _data_problem, _first_line, _magic_problem


@dataclass
class ObjectLakeHealth:
    """One look at an object lake's commits and parts (and what a repair removed)."""

    url: str
    error: str | None = None  # the lake could not be opened or its commits listed
    commits: int = 0  # commit files that read
    unreadable: list[str] = field(default_factory=list)  # "name: why"
    missing_seqs: list[int] = field(default_factory=list)  # holes below the last commit
    checkpoints: int = 0
    damaged_checkpoints: list[str] = field(default_factory=list)  # "name: why" (a note)
    parts: int = 0  # named by the commits that read
    rows: int = 0  # the rows those commits say their parts hold
    missing_parts: list[str] = field(default_factory=list)  # named, not in the lake
    bad_parts: list[str] = field(default_factory=list)  # "path: why" (footer, row count)
    copies: int = 0  # local copies under <home>/cache/lake/ checked
    bad_copies: dict[Path, str] = field(default_factory=dict)  # copy -> why
    removed_copies: list[Path] = field(default_factory=list)  # by the repair

    @property
    def failing(self) -> bool:
        """Whether readers may miss rows or fail: an exit code of 1."""
        in_place = [p for p in self.bad_copies if p not in self.removed_copies]
        return bool(
            self.error or self.unreadable or self.missing_seqs or self.missing_parts
        ) or bool(self.bad_parts or in_place)


def _listed(lake: ObjectLake) -> list[str]:
    try:
        return list(lake.fs.ls(lake.path(COMMITS_DIR), detail=False, refresh=True))
    except FileNotFoundError:
        return []


def _read_commits(lake: ObjectLake, health: ObjectLakeHealth) -> dict[int, Commit]:
    """The commits that read; the others, the holes and the checkpoints go into `health`."""
    commits: dict[int, Commit] = {}
    seqs: set[int] = set()
    checkpoints: list[str] = []
    for name in _listed(lake):
        base = name.rstrip("/").rsplit("/", 1)[-1]
        if match := _COMMIT_NAME.match(base):
            seqs.add(int(match.group(1)))
            try:
                commit = _parse_commit(name, lake.fs.cat_file(name))
                commits[commit.seq] = commit
            except (OSError, ValueError, KeyError, TypeError) as exc:
                health.unreadable.append(f"{COMMITS_DIR}/{base}: {_first_line(exc)}")
        elif _CHECKPOINT_NAME.match(base):
            checkpoints.append(name)
    health.commits = len(commits)
    health.missing_seqs = sorted(set(range(max(seqs) + 1)) - seqs) if seqs else []
    health.checkpoints = len(checkpoints)
    for name in checkpoints:
        if problem := _checkpoint_problem(lake, name, commits):
            base = name.rstrip("/").rsplit("/", 1)[-1]
            health.damaged_checkpoints.append(f"{COMMITS_DIR}/{base}: {problem}")
    return commits


def _checkpoint_problem(lake: ObjectLake, name: str, commits: dict[int, Commit]) -> str | None:
    try:
        data = json.loads(lake.fs.cat_file(name))
        copied = [Commit.from_dict(c) for c in data["commits"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"does not read ({_first_line(exc)}); readers pass over it"
    if [c.seq for c in copied] != list(range(int(data["seq"]) + 1)):
        return "its commits are not 0 to its seq; readers pass over it"
    if any(c.seq in commits and c != commits[c.seq] for c in copied):
        return "differs from the commits it copies"
    return None


def _present(lake: ObjectLake) -> set[str]:
    """Every object under the tables' folders, as paths without a leading slash."""
    found: set[str] = set()
    for table in TABLES:
        with contextlib.suppress(FileNotFoundError):
            found.update(p.lstrip("/") for p in lake.fs.find(lake.path(table)))
    return found


def _rows(con: duckdb.DuckDBPyConnection, url: str) -> int:
    row = con.execute("SELECT count(*) FROM read_parquet($p)", {"p": url}).fetchone()
    return int(row[0]) if row else 0


def _check_parts(lake: ObjectLake, commits: dict[int, Commit], health: ObjectLakeHealth) -> None:
    parts = [p for seq in sorted(commits) for p in commits[seq].parts]
    health.parts, health.rows = len(parts), sum(p.rows for p in parts)
    present = _present(lake)
    con = duckdb.connect()
    try:
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        lake.register(con)
        for part in parts:
            if lake.path(part.path).lstrip("/") not in present:
                health.missing_parts.append(part.path)
                continue
            try:
                rows = _rows(con, lake.read_url(part.path))
            except duckdb.Error as exc:
                health.bad_parts.append(f"{part.path}: {_first_line(exc)}")
                continue
            if rows != part.rows:
                health.bad_parts.append(f"{part.path}: {rows} rows, its commit says {part.rows}")
    finally:
        con.close()


def _check_copies(home: Path, commits: dict[int, Commit], health: ObjectLakeHealth) -> None:
    """This host's local copies of committed parts, read whole."""
    cache = Home.at(home).cache / LAKE_CACHE_DIR
    copies = [(cache / p.path, p.rows) for c in commits.values() for p in c.parts]
    copies = [(path, rows) for path, rows in copies if path.is_file()]
    health.copies = len(copies)
    con = duckdb.connect()
    try:
        for path, expected in copies:
            problem = _magic_problem(path) or _data_problem(con, path)
            if problem is None:
                try:
                    rows = _rows(con, str(path))
                    if rows != expected:
                        problem = f"{rows} rows, its commit says {expected}"
                except duckdb.Error as exc:
                    problem = _first_line(exc)
            if problem:
                health.bad_copies[path] = problem
    finally:
        con.close()


def examine_object_lake(home: Path, config: LakeConfig) -> ObjectLakeHealth:
    """Check the object lake `config` names, and `home`'s copies of its parts."""
    health = ObjectLakeHealth(config.url)
    try:
        lake = ObjectLake(config)
        commits = _read_commits(lake, health)
        _check_parts(lake, commits, health)
    except Exception as exc:  # no fsspec, an unknown protocol, the store unreachable
        health.error = _first_line(exc)
        return health
    _check_copies(home, commits, health)
    return health


def remove_bad_copies(health: ObjectLakeHealth) -> ObjectLakeHealth:
    """Delete the damaged local copies: a copy is a cache, fetched again when next read."""
    for path in health.bad_copies:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        health.removed_copies.append(path)
    return health


def object_lake_lines(health: ObjectLakeHealth) -> list[str]:
    """What `tracegym doctor` prints about the object lake: what it checked, what it found."""
    lines = [f"object lake: {health.url}"]
    if health.error:
        return [*lines, f"  not checked: {health.error}"]
    holes = f", {len(health.missing_seqs)} missing" if health.missing_seqs else ""
    lines.append(
        f"commits: {health.commits} read{holes}, {len(health.unreadable)} unreadable; "
        f"checkpoints: {health.checkpoints}, {len(health.damaged_checkpoints)} damaged"
    )
    lines.extend(f"  unreadable: {item}" for item in health.unreadable)
    if health.missing_seqs:
        shown = ", ".join(str(s) for s in health.missing_seqs[:10])
        more = " ..." if len(health.missing_seqs) > 10 else ""
        lines.append(f"  missing commit numbers: {shown}{more} (commits are never removed)")
    lines.extend(f"  damaged checkpoint: {item}" for item in health.damaged_checkpoints)
    lines.append(
        f"committed parts: {health.parts} ({health.rows} rows), footers read: "
        f"{len(health.missing_parts)} missing, {len(health.bad_parts)} unreadable or short"
    )
    lines.extend(f"  missing: {path}" for path in health.missing_parts)
    lines.extend(f"  bad: {item}" for item in health.bad_parts)
    lines.append(
        f"local copies (cache/lake): {health.copies} read whole, {len(health.bad_copies)} damaged"
    )
    for path, why in health.bad_copies.items():
        fate = "removed" if path in health.removed_copies else "--repair removes it"
        lines.append(f"  damaged copy: {path}: {why}; {fate}")
    return lines
