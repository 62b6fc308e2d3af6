"""`tracegym doctor`: what state the store's files are in, and the one repair it may make.

It reads every row of every lake part (queries check footers only, see store/parts.py), and
looks at what crashes leave behind: spool files cut mid-line, staging folders of compactions
that died, parts already moved aside. It writes nothing unless asked to repair: then corrupt
parts go to the quarantine (never deleted) and dead compactions' staging folders are removed
(their spool files are still in place: the next compaction redoes them).

A home whose lake is on object storage has its commits and committed parts checked too
(store/object_health.py); the repair there only deletes damaged local copies of parts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tracegym.store import object_lake
from tracegym.store.lake import LOCK_FILE, STAGING_DIR, compaction_lock, lake_dir
from tracegym.store.object_health import ObjectLakeHealth, examine_object_lake, remove_bad_copies
from tracegym.store.parts import BadPart, check, lake_parts, move_aside, quarantined
from tracegym.tracer.spool_files import is_complete, is_locked, spool_dir


@dataclass
class Health:
    """One look at a store's files (and what a repair did)."""

    home: Path
    parts: int = 0
    corrupt: list[BadPart] = field(default_factory=list)
    spool_files: int = 0
    live_files: int = 0  # held by a writer right now
    cut_tails: list[Path] = field(default_factory=list)  # complete files whose last line is cut
    staging: list[Path] = field(default_factory=list)  # left by compactions that died
    compacting: bool = False  # a compaction holds the lock: its staging folder is not stale
    quarantine: list[Path] = field(default_factory=list)
    moved: dict[Path, Path] = field(default_factory=dict)  # by the repair
    staging_removed: bool = False
    object_lake: ObjectLakeHealth | None = None  # the home's lake on object storage, if any

    @property
    def corrupt_in_place(self) -> list[BadPart]:
        return [bad for bad in self.corrupt if bad.path not in self.moved]

    @property
    def problems(self) -> list[str]:
        """What makes `doctor` exit with 1; empty when the store is fine."""
        found = ["corrupt parts in the lake"] if self.corrupt_in_place else []
        if self.object_lake is not None and self.object_lake.failing:
            found.append("the object lake has problems (listed above)")
        return found


def _compacting(home: Path) -> bool:
    """Whether a compaction holds the lake's lock (asked without creating or writing a file)."""
    try:
        return bool(is_locked(lake_dir(home) / LOCK_FILE))
    except OSError:
        return False


def _cut(path: Path) -> bool:
    """Whether the file's last line has no newline (a crash-cut line compaction will drop)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except OSError:
        return False


def examine(home: Path) -> Health:
    """Look at every file of the store under `home`; reads every lake part whole."""
    home = Path(home)
    health = Health(home)
    parts = lake_parts(home)
    health.parts = len(parts)
    health.corrupt = check(home, parts, deep=True)
    directory = spool_dir(home)
    files = sorted(directory.glob("*.jsonl")) if directory.is_dir() else []
    health.spool_files = len(files)
    for path in files:
        if not is_complete(path):
            health.live_files += 1
        elif _cut(path):
            health.cut_tails.append(path)
    health.compacting = _compacting(home)
    staging = lake_dir(home) / STAGING_DIR
    if staging.is_dir() and not health.compacting:
        health.staging = sorted(staging.iterdir())
    health.quarantine = quarantined(home)
    try:
        config = object_lake.configured(home)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        health.object_lake = ObjectLakeHealth("lake.json", error=f"unreadable: {exc}")
    else:
        if config is not None:
            health.object_lake = examine_object_lake(home, config)
    return health


def repair(health: Health) -> Health:
    """Move the corrupt parts aside and clear dead compactions' staging, under the lock."""
    health.moved = move_aside(health.home, health.corrupt, wait=True)
    if health.staging:
        with contextlib.suppress(OSError), compaction_lock(health.home, wait=True):
            shutil.rmtree(lake_dir(health.home) / STAGING_DIR)
            health.staging_removed = True
    health.quarantine = quarantined(health.home)
    if health.object_lake is not None:
        remove_bad_copies(health.object_lake)
    return health
