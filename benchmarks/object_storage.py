"""The lake on object storage (a moto S3 server on 127.0.0.1, in a process of its own) against
the same Parquet files read by DuckDB straight from a local disk, in the same run.

Prints: compaction spans/s into S3 beside compaction into the local lake (the same spool);
then, for store_speed.py's three queries over the S3 home, best of 5 through the store's
views, with the part cache on (the default: local copies of committed parts, fetched once;
the first open's fetch is printed on its own) and off (DuckDB reads through s3fs), each as a
ratio to raw DuckDB over the same files on local disk (goal: within 1.5x).

    .venv/bin/python benchmarks/object_storage.py [--spans 200000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from store_speed import QUERIES, best_of, write_synthetic_spool
from tracegym.store import lake, object_lake
from tracegym.store.object_lake import LakeConfig, ObjectLake
from tracegym.store.store import Store
from tracegym.tracer.spool import spool_dir


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    """`moto_server` on loopback in its own process (its Python does not share our GIL)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"http://127.0.0.1:{port}"
        time.sleep(0.1)
    server.kill()
    raise SystemExit("moto_server did not start")


def start_s3(bucket: str) -> subprocess.Popen:
    """`start_moto`, with `bucket` created on it and the environment pointing s3fs (and every
    process started after) at it."""
    server, endpoint = start_moto()
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
    )  # fmt: skip
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).call_s3("create_bucket", Bucket=bucket)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=200_000)
    args = parser.parse_args()
    server = start_s3("tracegym-bench")
    url = "s3://tracegym-bench/lake"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run(Path(tmp), url, args.spans)
    finally:
        server.kill()


def run(tmp: Path, url: str, spans: int) -> None:
    local_home, home = tmp / "local", tmp / "s3-home"
    write_synthetic_spool(local_home, spans)
    shutil.copytree(spool_dir(local_home), spool_dir(home))
    start = time.perf_counter()
    lake.compact(local_home)
    local_s = time.perf_counter() - start
    object_lake.set_lake(home, LakeConfig(url))
    start = time.perf_counter()
    report = object_lake.compact(home, ObjectLake(LakeConfig(url)))
    s3_s = time.perf_counter() - start
    print(
        f"compaction of {spans:,} spans: S3 {spans / s3_s:,.0f} spans/s "
        f"({report.commits} commit, {report.parts} parts), local {spans / local_s:,.0f} spans/s, "
        f"ratio {s3_s / local_s:.2f}"
    )

    # The floor: the very files the commits name, fetched to a local disk, read by DuckDB.
    floor_dir = tmp / "floor"
    s3 = ObjectLake(LakeConfig(url))
    parts = s3.snapshot().parts("spans")
    files = s3.local_copies(parts, floor_dir)
    floor = duckdb.connect()
    floor.execute(f"CREATE VIEW f AS SELECT * FROM read_parquet({files!r}, hive_partitioning=true)")
    floor.execute("CREATE VIEW ft AS SELECT * FROM f WHERE operation = 'execute_tool'")

    start = time.perf_counter()
    cached = Store(home, compact_on_open=False)
    print(f"first open with the part cache (fetches {len(parts)} parts): "
          f"{time.perf_counter() - start:.2f} s")  # fmt: skip
    direct_home = tmp / "direct-reader"
    direct_home.mkdir()
    object_lake.set_lake(direct_home, LakeConfig(url, cache=False))
    direct = Store(direct_home, compact_on_open=False)
    print(f"queries over {spans:,} spans on S3 (best of 5; ms, ratio to raw DuckDB on local disk):")
    print(f"  {'query':28s} {'raw local':>10s} {'cached':>10s} {'ratio':>6s} "
          f"{'via s3fs':>10s} {'ratio':>6s}")  # fmt: skip
    for label, query in QUERIES.items():
        base = best_of(5, lambda q=query: floor.sql(q.format(tools="ft", spans="f")).fetchall())
        row = [f"  {label:28s} {base * 1e3:10.1f}"]
        for store in (cached, direct):
            ours = best_of(
                5,
                lambda q=query, s=store: s.sql(
                    q.format(tools="tool_calls", spans="spans")
                ).fetchall(),
            )
            row.append(f"{ours * 1e3:10.1f} {ours / base:6.2f}")
        print(" ".join(row))
    cached.close()
    direct.close()


if __name__ == "__main__":
    main()
