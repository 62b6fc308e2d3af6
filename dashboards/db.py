"""DuckDB connections for the dashboard: read-only, sandboxed to the store's own files.

The dashboard never compacts (compaction moves files: that is the batch job's business); it
opens the views over the lake and the live spool the way `Store(compact_on_open=False)` does.
Each connection may only read files under `<home>/lake` and `<home>/spool`, and its
configuration is locked, so even a SELECT typed into the SQL box cannot read `/etc/passwd`,
load an extension or turn the sandbox off.

A home whose lake is on object storage (store/object_lake.py) is read through the readers' own
part cache: the committed parts are copied to `<home>/cache/lake/` (Python fetches them, not
DuckDB) and the sandbox allows that folder too, whatever `cache` says in lake.json, since the
sandbox reads no URL. A lake on a local path is read in place, its root allowed. When the object
lake cannot be opened, the pages show the spool alone and every page says so (`LakeSource`).

One lock per connection: DuckDB connections are not safe to share between threads, and every
query already uses all cores.

Another process may compact the spool at any time: a query whose spool files vanished under it
(an IO error) runs again over freshly listed views, and the views never count a spool file
and its parts both (see store/views.py). The SQL box has a connection of its own, with half the
cores, one query running and a few waiting: the rest are refused at once (`SqlBoxBusy`, HTTP
503), and its time limit counts from when its query starts, so it can neither starve the pages
nor hold more than a few of the server's threads.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from tracegym.store import object_lake
from tracegym.store.home import Home
from tracegym.store.object_views import LAKE_CACHE_DIR, ObjectViews
from tracegym.store.store import ReadOnlyError
from tracegym.store.views import LiveViews

REFRESH_S = 10.0  # how often the views are rebuilt to pick up new spool files


@dataclass
class Result:
    """Rows of one query, with the column names and whether rows were cut at the cap."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass(frozen=True)
class LakeSource:
    """Which lake the pages read: the local one (`url` None) or an object lake, and when that
    could not be opened, why (the pages then show the spool alone, and say so)."""

    url: str | None = None
    error: str | None = None

    @property
    def remote(self) -> bool:
        return self.url is not None

    def note(self) -> str | None:
        """The line every page shows about the lake; None for the local lake."""
        if self.url is None:
            return None
        if self.error:
            return (
                f"The lake at {self.url} is not shown ({self.error}): these pages show the "
                "spool's runs only (not yet compacted)."
            )
        return f"Lake on object storage: {self.url} (committed parts, read from local copies)."


def _open_lake(home: Path) -> tuple[LakeSource, object_lake.ObjectLake | None]:
    """The home's object lake, read through the part cache, or None for the local lake."""
    try:
        config = object_lake.configured(home)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return LakeSource("lake.json", f"unreadable: {_first_line(exc)}"), None
    if config is None:
        return LakeSource(), None
    try:
        return LakeSource(config.url), object_lake.ObjectLake(
            dataclasses.replace(config, cache=True)
        )
    except Exception as exc:  # no fsspec, an unknown protocol, a bad storage option
        return LakeSource(config.url, _first_line(exc)), None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _lake_dirs(home: Path, lake: object_lake.ObjectLake | None) -> list[str]:
    """The folders besides the spool the sandbox lets DuckDB read for the lake: the local one
    always (the views list it, empty on an object lake's home), and the object lake's root on a
    local path or else the part cache."""
    local = [str(Home.at(home).lake) + "/"]
    if lake is None:
        return local
    return [
        *local,
        lake.root + "/" if lake.local else str(Home.at(home).cache / LAKE_CACHE_DIR) + "/",
    ]


class SqlBoxBusy(RuntimeError):
    """The SQL box's queue is full (or its turn did not come in time): try again later."""


def _sandboxed(
    home: Path, memory_limit: str | None, threads: int | None, lake_dirs: list[str]
) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    paths = Home.at(home)
    allowed = [*lake_dirs, str(paths.spool) + "/"]
    con.execute("SET allowed_directories = $dirs", {"dirs": allowed})
    # the gap_runs view reads gaps.json (that one file, not the rest of the home)
    con.execute("SET allowed_paths = $paths", {"paths": [str(paths.gaps)]})
    if memory_limit:
        con.execute("SET memory_limit = $limit", {"limit": memory_limit})
    if threads:
        con.execute("SET threads = $n", {"n": threads})
    con.execute("SET parquet_metadata_cache = true")  # re-read when a file changes
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")
    return con


class Database:
    """A locked, sandboxed connection over the store's views; `query` takes parameters only."""

    def __init__(
        self, home: Path, memory_limit: str | None = None, threads: int | None = None
    ) -> None:
        self.home = Path(home)
        self._lock = threading.Lock()
        self.lake, lake = _open_lake(self.home)
        self._con = _sandboxed(self.home, memory_limit, threads, _lake_dirs(self.home, lake))
        self._views = self._open_views(lake)
        self._refreshed = time.monotonic()

    def _open_views(self, lake: object_lake.ObjectLake | None) -> LiveViews:
        """The views over the lake and the spool; over the spool alone (the local lake, empty
        on such a home) when the object lake cannot be listed or its parts fetched."""
        if lake is not None:
            try:
                return ObjectViews(self._con, self.home, lake)
            except (OSError, ValueError, KeyError, duckdb.Error) as exc:
                self.lake = LakeSource(lake.url, _first_line(exc))
        return LiveViews(self._con, self.home)

    def _refresh(self) -> None:
        """Re-read the spool's file list (and an object lake's commits) now and then: the
        local lake's glob sees new parts itself."""
        if time.monotonic() - self._refreshed > REFRESH_S:
            self._views_refresh()
            self._refreshed = time.monotonic()

    def _views_refresh(self) -> None:
        """Refresh the views; an object lake that cannot be reached now keeps the last ones."""
        if not isinstance(self._views, ObjectViews):
            self._views.refresh()
            return
        try:
            self._views.refresh()
        except (OSError, ValueError, KeyError) as exc:
            self.lake = LakeSource(self._views.lake.url, _first_line(exc))
        else:
            self.lake = LakeSource(self._views.lake.url)

    def refresh(self) -> None:
        """Re-read the spool's file list now (after this process wrote to the spool)."""
        with self._lock:
            self._views_refresh()
            self._refreshed = time.monotonic()

    def query(
        self,
        sql: str,
        params: dict[str, Any] | Sequence[Any] | None = None,
        cap: int | None = None,
        *,
        timeout_s: float | None = None,
        wait_s: float | None = None,
    ) -> Result:
        """Run one parameterised query; trace content only ever travels as a parameter.

        `timeout_s` interrupts the query that long after it starts (not after it queued);
        `wait_s` bounds the wait for the connection (SqlBoxBusy when it runs out)."""
        if not self._lock.acquire(timeout=-1 if wait_s is None else wait_s):
            raise SqlBoxBusy(f"busy: no turn within {wait_s:g} s, try again")
        timer = threading.Timer(timeout_s, self._con.interrupt) if timeout_s else None
        try:
            self._refresh()
            if timer:
                timer.start()
            # Spool files compacted away by another process: list them again, run it again.
            return self._views.run(lambda: self._fetch(sql, params, cap))
        finally:
            if timer:
                timer.cancel()
            self._lock.release()

    def _fetch(
        self, sql: str, params: dict[str, Any] | Sequence[Any] | None, cap: int | None
    ) -> Result:
        cursor = self._con.execute(sql, params or {})
        columns = [d[0] for d in cursor.description or []]
        if cap is None:
            return Result(columns, cursor.fetchall())
        rows = cursor.fetchmany(cap + 1)
        return Result(columns, rows[:cap], truncated=len(rows) > cap)

    def interrupt(self) -> None:
        self._con.interrupt()

    def close(self) -> None:
        with self._lock:
            self._con.close()


def check_single_select(sql: str) -> None:
    """Raise ReadOnlyError unless `sql` is exactly one SELECT (or WITH ... SELECT) statement."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ValueError(f"cannot parse SQL: {str(exc).strip().splitlines()[0]}") from None
    if not statements:
        raise ValueError("empty SQL statement")
    if len(statements) > 1:
        raise ReadOnlyError("refused: one statement at a time (a single SELECT or WITH query)")
    kind = statements[0].type.name
    if kind != "SELECT":
        raise ReadOnlyError(
            f"refused {kind} statement: the SQL box is read-only (a single SELECT or WITH query "
            "over spans, traces, tool_calls, llm_calls, memory_ops, outcomes, nightly)"
        )


class SqlBox:
    """The SQL box's own connection: one SELECT at a time, capped rows, a time limit from the
    query's start, and at most `waiting` more queued (each for a bounded time)."""

    def __init__(
        self,
        home: Path,
        max_rows: int = 500,
        timeout_s: float = 20.0,
        waiting: int = 3,
        threads: int | None = None,
    ) -> None:
        threads = threads or max(1, (os.cpu_count() or 2) // 2)  # the other half: the pages
        self.db = Database(home, memory_limit="2GB", threads=threads)
        self.max_rows = max_rows
        self.timeout_s = timeout_s
        self.waiting = waiting
        self._slots = threading.BoundedSemaphore(1 + waiting)

    def run(self, sql: str) -> Result:
        """Raises ReadOnlyError for anything but one SELECT, ValueError for bad SQL, SqlBoxBusy
        when one query runs and `waiting` more wait already (or its turn does not come)."""
        check_single_select(sql)
        if not self._slots.acquire(blocking=False):
            raise SqlBoxBusy(
                f"the SQL box is busy (1 query running, {self.waiting} waiting): try again"
            )
        try:
            # Fair turns would take at most `waiting` limits; the lock is not fair, so bound it.
            wait_s = self.timeout_s * (self.waiting + 1)
            return self.db.query(sql, cap=self.max_rows, timeout_s=self.timeout_s, wait_s=wait_s)
        except duckdb.InterruptException:
            raise ValueError(f"query stopped after {self.timeout_s:g} s") from None
        except duckdb.Error as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise ValueError(message) from None
        finally:
            self._slots.release()

    def close(self) -> None:
        self.db.close()
