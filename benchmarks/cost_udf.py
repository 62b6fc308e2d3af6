"""The views' `tracegym_cost` (store/pricing.py): the vectorised (Arrow) UDF the views register
against a row-at-a-time Python UDF of the same prices, and a plain SQL sum as the floor, on one
in-memory table of LLM calls. Prints each one's time and the ratios (same run, same machine).

    python -m tracegym.benchmarks.cost_udf [--rows 200000]
"""

from __future__ import annotations

import argparse
import time

import duckdb
from tracegym.store.pricing import Prices

TYPES = ["VARCHAR", "VARCHAR", "BIGINT", "BIGINT"]


def best_of(con: duckdb.DuckDBPyConnection, sql: str, tries: int = 3) -> float:
    times = []
    for _ in range(tries):
        start = time.perf_counter()
        con.sql(sql).fetchall()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    rows = parser.parse_args().rows
    prices = Prices()
    con = duckdb.connect()
    con.create_function("cost_row", prices.cost, TYPES, "DOUBLE", null_handling="special")
    con.create_function("cost_batch", prices.cost_batch, TYPES, "DOUBLE", type="arrow",
                        null_handling="special")  # fmt: skip
    con.execute(
        "CREATE TABLE calls AS SELECT (['gpt-4o', 'gpt-4o-mini', 'my-model'])[1 + (i % 3)::INT] "
        "AS model, 'openai' AS provider, (i % 5000)::BIGINT AS tokens_in, "
        "(i % 700)::BIGINT AS tokens_out FROM range($n) r(i)",
        {"n": rows},
    )
    args = "model, provider, tokens_in, tokens_out"
    con.sql(f"SELECT sum(cost_batch({args})) FROM calls").fetchall()  # the price table, loaded
    floor = best_of(con, "SELECT sum(tokens_in + tokens_out) FROM calls")
    batch = best_of(con, f"SELECT sum(cost_batch({args})) FROM calls")
    row = best_of(con, f"SELECT sum(cost_row({args})) FROM calls")
    print(f"{rows} LLM calls: plain sum {floor * 1e3:.1f} ms, vectorised cost "
          f"{batch * 1e3:.0f} ms ({batch / rows * 1e6:.2f} us/call), row-at-a-time cost "
          f"{row * 1e3:.0f} ms; row / vectorised = {row / batch:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
