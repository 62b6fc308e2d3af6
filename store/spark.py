"""The views on a SparkSession: `register_views(spark, home)`.

The same views as `tracegym sql` (store/views.py), in Spark SQL (store/dialects.py), as
temporary views over the lake's Parquet. Spark lists the lake's files when a view is created:
call `register_views` again to see parts compacted since. Spool files not compacted yet are
not read (run `tracegym compact` first). Needs the `spark` extra (pyspark, sqlglot, duckdb).
"""

from __future__ import annotations

import os
from typing import Any

from tracegym.store.dialects import BASE_VIEWS, DERIVED, spark_statements
from tracegym.store.pricing import Prices, PricesError
from tracegym.store.views import COST_FUNCTION

VIEWS = [view for view, _ in BASE_VIEWS if not view.startswith("_")] + list(DERIVED)


def register_views(spark: Any, home: str | os.PathLike) -> list[str]:
    """Create (or replace) every view as a temporary view on `spark` over the lake of `home`
    (a local path, or a URL the session reads such as s3a://bucket/prefix); returns the names
    of the views users query. `tracegym_cost` (the cost columns, store/pricing.py) is a
    Python UDF on the session, with the home's prices (looked for locally)."""
    register_cost(spark, home)
    for statement in spark_statements(home):
        spark.sql(statement)
    return VIEWS


def register_cost(spark: Any, home: str | os.PathLike) -> Prices:
    """(Re)define `tracegym_cost(model, provider, input_tokens, output_tokens)` on `spark`; a
    prices file that cannot be read leaves the table's prices (as in DuckDB's views)."""
    try:
        prices = Prices.load(home)
    except PricesError:
        prices = Prices()
    spark.udf.register(COST_FUNCTION, prices.cost, "double")
    return prices
