"""The store's views over a lake on object storage (store/object_lake.py) plus the local spool.

The same views as store/views.py (the derived ones are its very SQL), with the lake half read
from the parts the commits name rather than from a glob: a part no commit names is never read,
so a reader never meets a half-uploaded or uncommitted part. Unless the lake's `cache` is off,
DuckDB reads local copies of the committed parts (`<home>/cache/lake/`, fetched once each: a
committed part never changes), at local-disk speed once the copies are there.

Exactly once around a compaction, as on a local disk: the spool files are listed when the views
are made, read in place, and the parts committed from them are left out; once a listed file is
gone (compacted away) a query fails with an IO error, and `ObjectViews` makes the views again
over a fresh listing.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
from tracegym.store.home import Home
from tracegym.store.object_lake import ObjectLake
from tracegym.store.schema import empty_source, lake_read_select, row_select
from tracegym.store.views import LiveViews, _literal, _live_sql, register_views

LAKE_CACHE_DIR = "lake"  # <home>/cache/lake/: copies of committed parts (they never change)
BASE_VIEWS = (("spans", "spans"), ("_outcome_spans", "outcomes"), ("_nightly_spans", "nightly"))


def _table_sql(urls: list[str], live: str | None, table: str) -> str:
    """One lake table: its committed parts (`urls`) plus its rows from the live spool."""
    halves = []
    if urls:
        files = "[" + ", ".join(_literal(u) for u in urls) + "]"
        halves.append(lake_read_select(f"read_parquet({files}, hive_partitioning=true)"))
    if live:
        halves.append(f"SELECT * EXCLUDE (_table) FROM ({live}) WHERE _table = '{table}'")
    if not halves:  # an empty store still has typed, queryable views
        halves.append(f"SELECT * EXCLUDE (_table) FROM ({row_select(empty_source())})")
    return "\nUNION ALL BY NAME\n".join(f"({h})" for h in halves)


def register_object_views(
    con: duckdb.DuckDBPyConnection, home: Path, lake: ObjectLake
) -> tuple[list[Path], list[str]]:
    """(Re)create the views over `lake` and `home`'s spool on `con` (the lake's filesystem
    registered on it); returns (spool files read, part URLs read).

    Every view is made as store/views.py makes it, then the three it reads the lake through
    are replaced (the others name them, and DuckDB binds a view's names when it is queried)."""
    pending = register_views(con, home)
    listed = {p.stem for p in pending}
    snapshot = lake.snapshot()  # after the listing: a file gone since is committed in it
    live = _live_sql(pending)
    read: list[str] = []
    cache = Home.at(home).cache / LAKE_CACHE_DIR
    for view, table in BASE_VIEWS:
        parts = [p for p in snapshot.parts(table) if p.stem not in listed]
        if lake.config.cache and not lake.local:
            urls = lake.local_copies(parts, cache)
        else:
            urls = [lake.read_url(p.path) for p in parts]
        read.extend(urls)
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS {_table_sql(urls, live, table)}")
    return pending, read


class ObjectViews(LiveViews):
    """`LiveViews` over an object lake: made again when a listed spool file vanishes.

    Committed parts are immutable and never deleted, so a changed listing is the one reason to
    retry; a damaged part is not moved aside here (there is no quarantine on object storage)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, home: Path, lake: ObjectLake) -> None:
        self.lake = lake
        super().__init__(con, home)

    def _register(self) -> None:
        self.listed, self.parts = register_object_views(self.con, self.home, self.lake)

    def recover(self, exc: duckdb.Error) -> bool:
        if not isinstance(exc, duckdb.IOException):
            return False
        before = (self.listed, self.parts)
        self.refresh()
        return (self.listed, self.parts) != before
