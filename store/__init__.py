"""The embedded trace store: spool ingestion, compaction into a Parquet lake, DuckDB views.

Needs `tracegym[analysis]` (DuckDB, Polars, pyarrow) except for `tracegym.store.records`,
which importers and the OTLP receiver use to write spool files with the standard library only.
"""
