"""What checking the lake's parts costs a reader, beside the same reader without the check.

Opening a `Store` checks the magic numbers and footer of every lake part it has not checked
before (store/parts.py: verdicts kept per process, good footers in the lake's CHECKED_FILE).
Over a lake of `--parts` parts this prints, best of five: a fresh process's open plus a count
over `spans` when every footer is new, when all are known good, and with the check turned off
(the floor); a refresh in the same process; then `tracegym doctor`'s full read of every part,
beside a `SELECT *` of the whole lake. Goal: a fresh open within 1.5x of the floor.

    .venv/bin/python benchmarks/parts_check.py [--parts 2000] [--spans-per-part 200]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from tracegym.store import lake, parts
from tracegym.store.health import examine
from tracegym.store.records import span_record, stable_id, write_spool_file

BASE_NS = 1_764_460_800_000_000_000

OPEN = """
import sys, time
from tracegym.store import parts, views
if sys.argv[2] == "off":
    views.screen = lambda *args, **kwargs: parts.Screened([], set())
from tracegym.store.store import Store
start = time.perf_counter()
with Store(sys.argv[1], compact_on_open=False) as store:
    store.fetch("SELECT count(*) FROM spans")
    first = time.perf_counter() - start
    start = time.perf_counter()
    store._views.refresh()
    store.fetch("SELECT count(*) FROM spans")
print(first, time.perf_counter() - start)
"""


def make_lake(home: Path, n_parts: int, spans_per_part: int) -> None:
    """`n_parts` copies of one compacted part (one day of tool spans) under distinct names."""
    records = [
        span_record(trace_id=stable_id("t", i // 10), span_id=stable_id("s", i, width=16),
                    name="execute_tool q", start_ns=BASE_NS + i, end_ns=BASE_NS + i + 5,
                    attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "q"})
        for i in range(spans_per_part)
    ]  # fmt: skip
    write_spool_file(home, records, "20251130T000000-bench-0-00000000")
    lake.compact(home)
    (first,) = lake.spans_dir(home).rglob("*.parquet")
    data = first.read_bytes()
    for i in range(1, n_parts):
        (first.parent / f"part-20251130T000000-bench-{i}-{i:08x}-0.parquet").write_bytes(data)


def fresh_open(home: Path, check: str) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", OPEN, str(home), check], capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=2000)
    parser.add_argument("--spans-per-part", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        make_lake(home, args.parts, args.spans_per_part)
        cold, on, off = [], [], []
        for _ in range(5):  # alternated: a load that comes and goes hits all alike
            (lake.lake_dir(home) / parts.CHECKED_FILE).unlink(missing_ok=True)
            cold.append(fresh_open(home, "on"))  # checks every footer, writes CHECKED_FILE
            on.append(fresh_open(home, "on"))  # finds them in CHECKED_FILE
            off.append(fresh_open(home, "off"))
        first, checked = min(t for t, _ in cold), min(t for t, _ in on)
        floor = min(t for t, _ in off)
        print(f"{args.parts} parts of {args.spans_per_part} spans")
        print(f"fresh open + count, every footer checked: {first * 1000:8.1f} ms")
        print(f"fresh open + count, footers known good:   {checked * 1000:8.1f} ms")
        print(f"fresh open + count, no check (floor):     {floor * 1000:8.1f} ms")
        print(f"ratios: {first / floor:.2f}x first open after new parts, {checked / floor:.2f}x "
              "later opens (goal <= 1.5x)")  # fmt: skip
        again = min(t for _, t in on), min(t for _, t in off)
        print(f"refresh + count in the same process: {again[0] * 1000:.1f} ms "
              f"(floor {again[1] * 1000:.1f} ms, ratio {again[0] / again[1]:.2f}x)")  # fmt: skip
        start = time.perf_counter()
        health = examine(home)
        doctor = time.perf_counter() - start
        glob = str(lake.spans_dir(home) / "**" / "*.parquet")
        start = time.perf_counter()
        duckdb.connect().execute(f"SELECT * FROM read_parquet('{glob}')").fetchall()
        read_all = time.perf_counter() - start
        assert not health.corrupt and health.parts == args.parts == len(parts.lake_parts(home))
        print(f"doctor (every part read whole): {doctor * 1000:.0f} ms; "
              f"SELECT * of the lake: {read_all * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
