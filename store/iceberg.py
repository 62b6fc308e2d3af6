"""The lake's parts appended to Iceberg tables: many writers (hosts), one table per lake table.

Each writer compacts its own home as usual (store/lake.py) and then `publish(home, target)`
appends the parts not yet in the tables to `<namespace>.spans`, `.outcomes` and `.nightly`
(pyiceberg; a SQL catalog on SQLite by default, any pyiceberg catalog by its properties: REST,
Glue, Hive...). Spark, Trino, DuckDB (through pyiceberg's scan) and Polars (`pl.scan_iceberg`)
then read the tables with their own Iceberg readers.

Exactly once: every append's snapshot names the parts it carries (the summary property
`tracegym.parts`, `<writer>/<path under the lake>`), and an append commits only on the snapshot
it read (the catalog's compare-and-swap). A writer that loses the race reloads the table, drops
the parts the winner appended and tries again; a writer killed before its commit left no
snapshot, and its rerun appends the same parts. Snapshots must not be expired while writers run
(their summaries are the record; docs/lake_engines.md says what is not supported).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracegym.store.home import Home
from tracegym.store.parts import TABLES, lake_parts
from tracegym.store.schema import lake_read_select

PARTS_PROPERTY = "tracegym.parts"
DEFAULT_NAMESPACE = "tracegym"
RETRIES = "commit.retry.num-retries"  # pyiceberg's own, on the table's properties
TRIES = 50  # each retry follows another writer's successful commit: progress, but bounded


@dataclass(frozen=True)
class IcebergTarget:
    """Where the tables are: a pyiceberg catalog's properties and a namespace. `writer` names
    this writer's parts in the record (default: the home's absolute path)."""

    catalog: dict[str, str]
    namespace: str = DEFAULT_NAMESPACE
    name: str = "tracegym"

    @classmethod
    def sqlite(cls, directory: str | os.PathLike, namespace: str = DEFAULT_NAMESPACE):
        """A SQL catalog in `<directory>/catalog.db` with its warehouse beside it."""
        root = Path(directory).absolute()
        root.mkdir(parents=True, exist_ok=True)
        (root / "warehouse").mkdir(exist_ok=True)
        properties = {"type": "sql", "uri": f"sqlite:///{root / 'catalog.db'}",
                      "warehouse": (root / "warehouse").as_uri()}  # fmt: skip
        return cls(properties, namespace)

    def load(self) -> Any:
        from pyiceberg.catalog import load_catalog

        return load_catalog(self.name, **self.catalog)


@dataclass
class PublishReport:
    """What one `publish` appended: rows and parts per table, and commits lost to others."""

    rows: dict[str, int] = field(default_factory=dict)
    parts: dict[str, int] = field(default_factory=dict)
    conflicts: int = 0


def iceberg_schema() -> Any:
    """The lake's columns as an Iceberg schema (from DuckDB's own description of them)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BooleanType,
        DateType,
        DoubleType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        TimestampType,
    )
    from tracegym.store.dialects import lake_duckdb_columns

    scalar = {"VARCHAR": StringType, "BIGINT": LongType, "INTEGER": IntegerType,
              "DOUBLE": DoubleType, "BOOLEAN": BooleanType, "TIMESTAMP": TimestampType,
              "DATE": DateType}  # fmt: skip
    columns = lake_duckdb_columns()
    fields, next_id = [], len(columns) + 1
    for field_id, (name, kind) in enumerate(columns, start=1):
        if kind.endswith("[]"):
            kind_of = ListType(next_id, scalar[kind[:-2]](), element_required=False)
            next_id += 1
        else:
            kind_of = scalar[kind]()
        fields.append(NestedField(field_id, name, kind_of, required=False))
    return Schema(*fields)


def _table(catalog: Any, target: IcebergTarget, name: str) -> Any:
    """The table `name`, created partitioned by day when missing (by this writer or another)."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    identifier = f"{target.namespace}.{name}"
    if catalog.table_exists(identifier):
        return _no_blind_retries(catalog.load_table(identifier))
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(target.namespace)
    schema = iceberg_schema()
    day = schema.find_field("day").field_id
    spec = PartitionSpec(PartitionField(day, 1000, IdentityTransform(), "day"))
    try:
        return catalog.create_table(
            identifier, schema=schema, partition_spec=spec, properties={RETRIES: "0"}
        )
    except TableAlreadyExistsError:
        return _no_blind_retries(catalog.load_table(identifier))


def _no_blind_retries(table: Any) -> Any:
    """pyiceberg retries a lost append on the new snapshot by itself, so the parts the winner
    appended would go in twice: the tables keep its retries off and `publish` retries after
    looking again (a table made elsewhere gets the property once)."""
    if table.metadata.properties.get(RETRIES) == "0":
        return table
    with table.transaction() as transaction:
        transaction.set_properties({RETRIES: "0"})
    return table.refresh()


def _with_lake_columns(table: Any) -> Any:
    """Add the lake's columns a table made by an older tracegym lacks (schema evolution by
    name; rows appended before read NULL there). Attributes need none: they are JSON text."""
    missing = {n for n, _ in _names(iceberg_schema())} - {n for n, _ in _names(table.schema())}
    if not missing:
        return table
    from pyiceberg.exceptions import CommitFailedException

    try:
        with table.update_schema() as update:
            update.union_by_name(iceberg_schema())
    except CommitFailedException:  # another writer evolved it first
        pass
    return table.refresh()


def _names(schema: Any) -> list[tuple[str, int]]:
    return [(f.name, f.field_id) for f in schema.fields]


def appended(table: Any) -> set[str]:
    """Every part any snapshot of `table` says it appended."""
    names: set[str] = set()
    for snapshot in table.metadata.snapshots:
        listed = snapshot.summary.get(PARTS_PROPERTY) if snapshot.summary else None
        if listed:
            names.update(json.loads(listed))
    return names


def _rows(parts: list[Path]) -> Any:
    """The parts' rows as an Arrow table with the lake's columns (`day` from the path)."""
    import duckdb
    from tracegym.store.dialects import lake_duckdb_columns

    names = ", ".join(f'"{name}"' for name, _ in lake_duckdb_columns())
    with duckdb.connect() as con:
        source = "read_parquet($files, hive_partitioning=true)"
        query = f"SELECT {names} FROM ({lake_read_select(source)})"
        return con.sql(query, params={"files": [str(p) for p in parts]}).to_arrow_table()


def _arrow_for(table: Any, rows: Any) -> Any:
    """`rows` in the table's own Arrow schema: its column order and types (DuckDB may give
    other string kinds), NULL in a column a newer writer added and this lake lacks."""
    import pyarrow as pa

    schema = table.schema().as_arrow()
    columns = [
        rows[f.name].cast(f.type) if f.name in rows.column_names
        else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]  # fmt: skip
    return pa.Table.from_arrays(columns, schema=schema)


def publish(home: str | os.PathLike, target: IcebergTarget, writer: str | None = None):
    """Append the lake parts of `home` that no snapshot names yet; returns a PublishReport."""
    from pyiceberg.exceptions import CommitFailedException

    home = Path(home).absolute()
    writer = writer or str(home)
    lake = Home.at(home).lake
    catalog = target.load()
    report = PublishReport()
    for name in TABLES:
        local = {f"{writer}/{p.relative_to(lake)}": p for p in lake_parts(home, name)}
        table = _with_lake_columns(_table(catalog, target, name))
        for attempt in range(TRIES):
            table = table.refresh()
            pending = sorted(set(local) - appended(table))
            if not pending:
                break
            rows = _rows([local[key] for key in pending])
            try:
                properties = {PARTS_PROPERTY: json.dumps(pending)}
                table.append(_arrow_for(table, rows), snapshot_properties=properties)
            except CommitFailedException:
                report.conflicts += 1
                time.sleep(min(0.05 * (attempt + 1), 1.0))
                continue
            report.rows[name] = report.rows.get(name, 0) + rows.num_rows
            report.parts[name] = report.parts.get(name, 0) + len(pending)
            break
        else:
            raise RuntimeError(f"{name}: {TRIES} commits lost to other writers in a row")
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m tracegym.store.iceberg HOME CATALOG_DIR`: compact HOME, then publish its
    parts to the SQLite catalog under CATALOG_DIR."""
    import sys

    from tracegym.store import lake

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    lake.compact(Path(args[0]), wait=True)
    report = publish(args[0], IcebergTarget.sqlite(args[1]))
    print(f"appended {report.rows} rows from {report.parts} parts ({report.conflicts} conflicts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
