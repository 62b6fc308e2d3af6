"""What checking every spool line costs compaction, beside a floor in the same run.

Compaction reads spool lines through `schema.read_json_source`, which keeps only lines that are
spans (a JSON object with `v`, the ids, `name` and the times of the right types). The floor is
the same COPY through a plain `read_json(..., ignore_errors=true)` with the typed columns, as
compaction read the spool before, which kept garbage lines as rows of NULLs. Both write the
same Parquet parts from the same synthetic spool (store_speed's); best of `--runs`. Goal: the
checked read within 1.3x of the floor.

    .venv/bin/python benchmarks/spool_validation.py [--spans 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from tracegym.store.schema import SPOOL_COLUMNS, read_json_source, row_select
from tracegym.tracer.spool_files import spool_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))
from store_speed import write_synthetic_spool


def unchecked_source(paths_param: str) -> str:
    """The spool read as compaction read it before lines were checked (the floor)."""
    columns = ", ".join(f"'{name}': '{kind}'" for name, kind in SPOOL_COLUMNS.items())
    return (
        f"read_json({paths_param}, format='newline_delimited', columns={{{columns}}}, "
        "ignore_errors=true, maximum_object_size=67108864, filename=true)"
    )


def copy_time(con: duckdb.DuckDBPyConnection, source: str, files: list[str], out: Path) -> float:
    select = row_select(source, with_source=True)
    start = time.perf_counter()
    con.execute(
        f"COPY ({select}) TO '{out}' (FORMAT parquet, PARTITION_BY (_table, day, _src), "
        "OVERWRITE_OR_IGNORE true, COMPRESSION zstd)",
        {"paths": files},
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        write_synthetic_spool(home, args.spans)
        files = sorted(str(p) for p in spool_dir(home).glob("*.jsonl"))
        con = duckdb.connect()
        best = {"checked": float("inf"), "floor": float("inf")}
        for run in range(args.runs):  # interleaved, so load on the machine hits both alike
            for label, source in (
                ("floor", unchecked_source("$paths")),
                ("checked", read_json_source("$paths", filename=True)),
            ):
                elapsed = copy_time(con, source, files, Path(tmp) / f"{label}-{run}")
                best[label] = min(best[label], elapsed)
        for label, elapsed in best.items():
            print(f"{label:8s} {args.spans / elapsed:12,.0f} spans/s  ({elapsed:.3f} s)")
        print(f"ratio checked / floor: {best['checked'] / best['floor']:.2f} (goal <= 1.3)")


if __name__ == "__main__":
    main()
