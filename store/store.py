"""`Store`: the Python entry point to the embedded store (SQL, Polars, compaction)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
from tracegym.store import object_lake
from tracegym.store.lake import CompactionReport, compact
from tracegym.store.object_views import ObjectViews
from tracegym.store.views import VIEWS, LiveViews
from tracegym.tracer.config import resolve_home

# PRAGMAs that only read (the catalog, the version); every other one sets or runs something.
_READ_PRAGMAS = {"show_tables", "show_tables_expanded", "table_info", "database_list", "version"}
_ANALYZE = {"ANALYZE", "ANALYSE"}


log = logging.getLogger("tracegym.store")
T = TypeVar("T")


@dataclass
class Rows:
    """A query's column names and rows, fetched."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


class ReadOnlyError(ValueError):
    """A statement that would write, drop, attach, copy or configure was refused."""


MISSING_FRAMES = "{package} is needed for {what}: pip install 'tracegym[analysis]'"


def require(package: str, what: str) -> None:
    """Import `package` or raise ImportError naming the extra that brings it (the bare
    install has no data frame library; `[analysis]` has pandas and Polars)."""
    try:
        __import__(package)
    except ImportError:
        raise ImportError(MISSING_FRAMES.format(package=package, what=what), name=package) from None


class Relation(duckdb.DuckDBPyRelation):
    """DuckDB's relation, whose data frame methods say which extra to install when pandas or
    Polars is missing (DuckDB's own error names the package only)."""

    __slots__ = ()

    def df(self, *args: Any, **kwargs: Any) -> Any:
        require("pandas", "Store.sql(...).df()")
        return super().df(*args, **kwargs)

    fetchdf = to_df = df

    def pl(self, *args: Any, **kwargs: Any) -> Any:
        require("polars", "Store.sql(...).pl()")
        return super().pl(*args, **kwargs)


def _as_relation(relation: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """`relation` as a `Relation` where DuckDB's class allows it (a Python class with slots,
    as in DuckDB 2); left as it is otherwise, its data frame methods then work the same."""
    with contextlib.suppress(TypeError):
        relation.__class__ = Relation
    return relation


def _refused(kind: str) -> ReadOnlyError:
    return ReadOnlyError(
        f"refused {kind} statement: the SQL entry points are read-only "
        f"(one SELECT over the views {', '.join(VIEWS)})"
    )


def _parse(query: str) -> list[duckdb.Statement]:
    """DuckDB's own parse of `query` into statements; ValueError when it does not parse."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise ValueError(f"cannot parse SQL: {str(exc).strip().splitlines()[0]}") from None
    if not statements:
        raise ValueError("empty SQL statement")
    return statements


def _tokens(text: str) -> list[tuple[int, str]]:
    """(offset, text) of each of DuckDB's tokens of `text`."""
    starts = [start for start, _ in duckdb.tokenize(text)]
    ends = [*starts[1:], len(text)]
    return [(s, text[s:e].strip()) for s, e in zip(starts, ends, strict=True)]


def _single(text: str) -> duckdb.Statement | None:
    """`text` as exactly one statement, else None."""
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error:
        return None
    return statements[0] if len(statements) == 1 else None


def explained(query: str) -> duckdb.Statement | None:
    """The statement an EXPLAIN runs: after EXPLAIN, an optional ANALYZE and an optional
    option list `(FORMAT json)`; None when it cannot be told (the caller refuses)."""
    tokens = _tokens(query)
    i = 2 if len(tokens) > 1 and tokens[1][1].upper() in _ANALYZE else 1
    if i >= len(tokens):
        return None
    inner = _single(query[tokens[i][0] :])
    if inner is not None or tokens[i][1] != "(":
        return inner
    depth = 0
    for j in range(i, len(tokens) - 1):  # skip the option list, then parse what follows
        depth += tokens[j][1].count("(") - tokens[j][1].count(")")
        if depth == 0:
            return _single(query[tokens[j + 1][0] :])
    return None


def _check_pragma(query: str) -> None:
    """Only a read-only PRAGMA, and never an assignment (`PRAGMA x = y` sets a setting)."""
    tokens = [text for _, text in _tokens(query)]
    name = tokens[1].lower() if len(tokens) > 1 else ""
    if name not in _READ_PRAGMAS or "=" in tokens:
        raise _refused(f"PRAGMA {name}".strip())


def check_read_only(query: str) -> None:
    """Raise ReadOnlyError unless `query` is one statement that only reads: a SELECT (SHOW,
    DESCRIBE, SUMMARIZE, FROM ... included), an EXPLAIN [ANALYZE] of one, or a catalog PRAGMA.
    EXPLAIN ANALYZE runs its statement, so that statement is what is checked."""
    statements = _parse(query)
    if len(statements) > 1:
        raise ReadOnlyError(
            f"refused {len(statements)} statements: one statement at a time "
            "(the SQL entry points are read-only)"
        )
    statement = statements[0]
    kind = statement.type.name
    if kind == "PRAGMA":
        _check_pragma(statement.query)
    elif kind == "EXPLAIN":
        inner = explained(statement.query)
        if inner is None or inner.type.name != "SELECT":
            raise _refused(f"EXPLAIN {inner.type.name if inner else '?'}")
    elif kind != "SELECT":
        raise _refused(kind)


class Store:
    """The trace store under `home`: compacts the spool on open, then serves the views.

    Compacting on open skips when another process is compacting (the views read the lake plus
    the spool exactly once either way); `compact()` waits for it. The connection's configuration
    is locked once the views exist, and a query whose spool files another process compacted
    away meanwhile runs again over fresh views (when it fails at bind time, see `LiveViews`).

    The lake is `<home>/lake`, or the object lake `lake_url` names, else $TRACEGYM_LAKE_URL,
    else the home's lake.json (store/object_lake.py); the spool is always the home's.

    store = Store()                                  # $TRACEGYM_HOME or ./.tracegym
    store.sql("SELECT tool, count(*) FROM tool_calls GROUP BY tool").show()
    df = store.pl("SELECT * FROM traces")              # a Polars DataFrame
    df = store.df("SELECT * FROM traces")              # a pandas DataFrame
    """

    def __init__(
        self,
        home: str | Path | None = None,
        *,
        compact_on_open: bool = True,
        lake_url: str | None = None,
    ) -> None:
        self.home = resolve_home(home)
        self.lake = object_lake.open_lake(self.home, lake_url)  # None: the local lake
        self.con = duckdb.connect()
        # Never fetch or load an extension a query names (sqlite_scan ...): no download, no
        # ~/.duckdb written, a plain error instead.
        self.con.execute("SET autoinstall_known_extensions = false")
        self.con.execute("SET autoload_known_extensions = false")
        # No progress bar on stderr from a library (a streamed analysis's workers ran long
        # partition scans and drew them into whatever ran the analysis).
        self.con.execute("SET enable_progress_bar = false")
        # A typical query binds the lake's parts five times (`traces` reads `spans` through
        # three CTEs and `outcomes`): their footers are parsed once, not on every bind and
        # scan. DuckDB checks each file's modification time, so a replaced part is re-read.
        self.con.execute("SET parquet_metadata_cache = true")
        if self.lake:
            self.lake.register(self.con)  # its URLs read through fsspec, not an extension
        self.last_compaction: CompactionReport | None = None
        self.compaction_error: str | None = None
        if compact_on_open:
            self._compact_for_reading()
        self._views = (
            ObjectViews(self.con, self.home, self.lake)
            if self.lake
            else LiveViews(self.con, self.home)
        )
        self.con.execute("SET lock_configuration = true")  # no PRAGMA/SET can loosen it now

    def _compact_for_reading(self) -> None:
        """Compact before reading, unless the disk refuses (full, read-only, not ours): then
        read the lake plus the spool as they are (exactly once either way), with a note."""
        try:
            self.last_compaction = self._compact(wait=False)  # never queue
        except (OSError, duckdb.Error) as exc:
            text = str(exc).strip()
            self.compaction_error = text.splitlines()[0] if text else type(exc).__name__
            log.warning(
                "note: could not compact %s (%s): reading the lake and the spool as they are",
                self.home,
                self.compaction_error,
            )

    def compact(self, *, wait: bool = True) -> CompactionReport:
        """Move complete spool files into the lake, then refresh the views. `wait`: queue
        behind another process's compaction, else skip it (`last_compaction.busy`)."""
        self.last_compaction = self._compact(wait=wait)
        self._views.refresh()
        return self.last_compaction

    def _compact(self, *, wait: bool) -> CompactionReport:
        if self.lake:
            return object_lake.compact(self.home, self.lake, self.con, wait=wait)
        return compact(self.home, self.con, wait=wait)

    def sql(self, query: str, params: Any = None) -> duckdb.DuckDBPyRelation:
        """A DuckDB relation for a read-only query (`.fetchall()`, `.pl()`, `.df()` ...).

        Planned now, run when fetched: a compaction that moves its spool files in between fails
        that fetch (an IO error). `fetch`, `run`, `pl` and `df` plan and fetch in one retry."""
        check_read_only(query)
        return _as_relation(self._views.run(lambda: self.con.sql(query, params=params)))

    def fetch(self, query: str, params: Any = None) -> Rows:
        """A read-only query's column names and rows, run and fetched over fresh views again
        when a compaction moves its files meanwhile (a relation from `sql` is fetched later,
        outside that retry)."""
        return self.run(query, params, lambda rel: Rows(list(rel.columns), rel.fetchall()))

    def run(self, query: str, params: Any, use: Callable[[duckdb.DuckDBPyRelation], T]) -> T:
        """`use(relation)` for a read-only query, retried as a whole (planning and fetching)
        when a compaction or a damaged part gets in the way (see `LiveViews.run`)."""
        check_read_only(query)
        return self._views.run(lambda: use(_as_relation(self.con.sql(query, params=params))))

    def pl(self, query: str, params: Any = None) -> Any:
        """The query's result as a Polars DataFrame (JSON columns as text)."""
        require("polars", "Store.pl()")
        return self.run(query, params, lambda rel: rel.pl())

    def df(self, query: str, params: Any = None) -> Any:
        """The query's result as a pandas DataFrame (JSON columns as text)."""
        require("pandas", "Store.df()")
        return self.run(query, params, lambda rel: rel.df())

    def rows(
        self, query: str, params: Any = None, *, batch: int = 4096
    ) -> Iterator[dict[str, Any]]:
        """The rows of a read-only query as dicts, fetched `batch` at a time (a large result
        is never held whole). Run no other query on this store until it is exhausted.

        The first batch is fetched inside the retry around compactions and damaged parts; a
        damaged part met later is moved aside too, but the error is raised (rows were given)."""
        check_read_only(query)

        def start() -> tuple[duckdb.DuckDBPyConnection, list[tuple[Any, ...]]]:
            cursor = self.con.execute(query, params)  # the temp views live on this connection
            return cursor, cursor.fetchmany(batch)

        cursor, chunk = self._views.run(start)
        names = [d[0] for d in cursor.description]
        while chunk:
            for row in chunk:
                yield dict(zip(names, row, strict=True))
            try:
                chunk = cursor.fetchmany(batch)
            except duckdb.Error as exc:
                self._views.recover(exc)  # names and moves a damaged part aside for next time
                raise

    def records(self) -> Iterator[dict[str, Any]]:
        """Every span and outcome record, shaped like spool lines (attributes as dicts)."""
        columns = (
            "trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status, "
            "status_message, attributes, resource"
        )
        query = f"SELECT {columns} FROM spans UNION ALL SELECT {columns} FROM _outcome_spans"
        for record in self.rows(query):
            record["attributes"] = json.loads(record["attributes"] or "{}")
            record["resource"] = json.loads(record["resource"] or "{}")
            yield record

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
