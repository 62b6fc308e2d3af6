"""The embedded trace store: spool ingestion, compaction into a Parquet lake, DuckDB views, the
importers, exporters and the OTLP receiver; and the home every stage reads and writes.

    from tracegym.store import Store, compact
    compact(home)                                   # spool -> lake
    Store(home).sql("SELECT * FROM tool_calls").df()

Needs `tracegym[analysis]` (DuckDB, Polars, pyarrow) except for `Home`/`read_json`/`write_json`
and `tracegym.store.records`, which importers and the OTLP receiver use to write spool files with
the standard library only. Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracegym.lazy import lazy_exports

if TYPE_CHECKING:  # the names, for type checkers and editors
    from tracegym.store.home import (
        DocumentError as DocumentError,
    )
    from tracegym.store.home import (
        Home as Home,
    )
    from tracegym.store.home import (
        read_json as read_json,
    )
    from tracegym.store.home import (
        write_json as write_json,
    )
    from tracegym.store.importers import (
        import_path as import_path,
    )
    from tracegym.store.lake import (
        CompactionReport as CompactionReport,
    )
    from tracegym.store.lake import (
        compact as compact,
    )
    from tracegym.store.receiver import (
        Receiver as Receiver,
    )
    from tracegym.store.store import (
        ReadOnlyError as ReadOnlyError,
    )
    from tracegym.store.store import (
        Store as Store,
    )

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Store": "store",
        "ReadOnlyError": "store",
        "compact": "lake",
        "CompactionReport": "lake",
        "import_path": "importers",
        "Receiver": "receiver",
        "Home": "home",
        "DocumentError": "home",
        "read_json": "home",
        "write_json": "home",
    },
)
