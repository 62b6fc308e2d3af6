"""DuckDB connections for the dashboard: read-only, sandboxed to the store's own files.

The dashboard never compacts (compaction moves files: that is the batch job's business); it
opens the views over the lake and the live spool the way `Store(compact_on_open=False)` does.
Each connection may only read files under `<home>/lake` and `<home>/spool`, and its
configuration is locked, so even a SELECT typed into the SQL box cannot read `/etc/passwd`,
load an extension or turn the sandbox off. One lock per connection: DuckDB connections are not
safe to share between threads, and every query already uses all cores.

Another process may compact the spool at any time: a query whose spool files vanished under it
(an IO error) runs again over freshly listed views, and the views never count a spool file
and its parts both (see store/views.py). The SQL box has a connection of its own, with half the
cores, one query running and a few waiting: the rest are refused at once (`SqlBoxBusy`, HTTP
503), and its time limit counts from when its query starts, so it can neither starve the pages
nor hold more than a few of the server's threads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from tracegym.store.home import Home
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


class SqlBoxBusy(RuntimeError):
    """The SQL box's queue is full (or its turn did not come in time): try again later."""


def _sandboxed(
    home: Path, memory_limit: str | None, threads: int | None
) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    paths = Home.at(home)
    allowed = [str(paths.lake) + "/", str(paths.spool) + "/"]
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
        self._con = _sandboxed(self.home, memory_limit, threads)
        self._views = LiveViews(self._con, self.home)
        self._refreshed = time.monotonic()

    def _refresh(self) -> None:
        """Re-read the spool's file list now and then (the lake glob sees new parts itself)."""
        if time.monotonic() - self._refreshed > REFRESH_S:
            self._views.refresh()
            self._refreshed = time.monotonic()

    def refresh(self) -> None:
        """Re-read the spool's file list now (after this process wrote to the spool)."""
        with self._lock:
            self._views.refresh()
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
