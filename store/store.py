"""`Store`: the Python entry point to the embedded store (SQL, Polars, compaction)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
from tracegym.store.lake import CompactionReport, compact
from tracegym.store.views import VIEWS, LiveViews
from tracegym.tracer.config import resolve_home

# Statement types a read-only entry point accepts.
_READ_ONLY = {"SELECT", "EXPLAIN", "PRAGMA"}


class ReadOnlyError(ValueError):
    """A statement that would write, drop, attach, copy or configure was refused."""


def check_read_only(query: str) -> None:
    """Raise ReadOnlyError unless every statement in `query` only reads."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ValueError(f"cannot parse SQL: {exc}") from None
    if not statements:
        raise ValueError("empty SQL statement")
    for statement in statements:
        kind = statement.type.name
        if kind not in _READ_ONLY or (kind == "PRAGMA" and "=" in statement.query):
            raise ReadOnlyError(
                f"refused {kind} statement: the SQL entry points are read-only "
                f"(SELECT over the views {', '.join(VIEWS)})"
            )


class Store:
    """The trace store under `home`: compacts the spool on open, then serves the views.

    Compacting on open skips when another process is compacting (the views read the lake plus
    the spool exactly once either way); `compact()` waits for it. A query whose spool files
    another process compacted away meanwhile runs again over fresh views (when it fails at bind
    time, see `LiveViews`).

    store = Store()                                  # $TRACEGYM_HOME or ./.tracegym
    store.sql("SELECT tool, count(*) FROM tool_calls GROUP BY tool").show()
    df = store.pl("SELECT * FROM traces")              # a Polars DataFrame
    """

    def __init__(self, home: str | Path | None = None, *, compact_on_open: bool = True) -> None:
        self.home = resolve_home(home)
        self.con = duckdb.connect()
        self.last_compaction: CompactionReport | None = (
            compact(self.home, self.con, wait=False)  # never queue behind the nightly's
            if compact_on_open
            else None
        )
        self._views = LiveViews(self.con, self.home)

    def compact(self, *, wait: bool = True) -> CompactionReport:
        """Move complete spool files into the lake, then refresh the views. `wait`: queue
        behind another process's compaction, else skip it (`last_compaction.busy`)."""
        self.last_compaction = compact(self.home, self.con, wait=wait)
        self._views.refresh()
        return self.last_compaction

    def sql(self, query: str, params: Any = None) -> duckdb.DuckDBPyRelation:
        """A DuckDB relation for a read-only query (`.fetchall()`, `.pl()`, `.df()` ...)."""
        check_read_only(query)
        return self._views.run(lambda: self.con.sql(query, params=params))

    def pl(self, query: str, params: Any = None) -> Any:
        """The query's result as a Polars DataFrame."""
        return self.sql(query, params).pl()

    def records(self) -> Iterator[dict[str, Any]]:
        """Every span and outcome record, shaped like spool lines (attributes as dicts)."""
        columns = (
            "trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status, "
            "status_message, attributes, resource"
        )
        query = f"SELECT {columns} FROM spans UNION ALL SELECT {columns} FROM _outcome_spans"
        # The temp views live on this connection only.
        cursor = self._views.run(lambda: self.con.execute(query))
        names = [d[0] for d in cursor.description]
        while batch := cursor.fetchmany(4096):
            for row in batch:
                record = dict(zip(names, row, strict=True))
                record["attributes"] = json.loads(record["attributes"] or "{}")
                record["resource"] = json.loads(record["resource"] or "{}")
                yield record

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
