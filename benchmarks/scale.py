"""Analysis and the store at scale: 1k, 10k (and 100k) runs of real tau2 traces.

The runs are the tau2-bench runs of `../shared/data/tau2-retail-telecom` (all files, about
800 runs), imported once into a seed home and replicated with fresh trace and run ids until
each size is reached (the planted synthetic generator of `analysis_speed.py` when the data is
absent). Per size this prints:

- compaction: spool JSON lines -> Parquet lake, spans/s;
- analyze cold (no embedding cache) and warm, each in a fresh process: seconds, the pipeline's
  own stage timings, and the process's peak RSS (getrusage of the child, so the figure is the
  whole process, model and interpreter included);
- a typical query (failed runs per agent and tool, through the `tool_calls` and `traces`
  views) against raw DuckDB over the same Parquet files, best of 5.

    nice -n 15 .venv/bin/python benchmarks/scale.py [--sizes 1000,10000,100000] \
        [--max-resident N] [--workers N] [--engine processes|spark] [--phases cold,warm] \
        [--no-query] [--s3]

With `--s3`, each size is measured again on a home whose lake is on a moto S3 server on
127.0.0.1 (the object lake: compaction by commits, analysis reading the lake's URL, the query
with the part cache against raw DuckDB over local copies of the committed parts).

Past `--max-resident` runs (analyze's default: 5,000) the analysis streams (analysis/streaming.py:
detectors fitted on a sample in one worker process, every run detected in `--workers`); the
peak RSS is printed for the analysing process, its largest worker, and all of them at once
(summed), each sampled every 0.2 s from /proc.

Goal on a 2-core machine: 100k runs analysed within 10 minutes under 4 GB peak, memory flat in
the number of runs. Homes are kept under `--work` (default /tmp/tracegym-scale) so a second
invocation does not regenerate them; delete the folder to start over.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAU2 = ROOT / ".." / "shared" / "data" / "tau2-retail-telecom"
LINES_PER_FILE = 200_000  # spool lines per generated file


def seed_lines(work: Path) -> list[dict]:
    """The spool records of every tau2 file, imported once into `<work>/seed`."""
    seed = work / "seed"
    marker = seed / ".imported"
    if not marker.exists():
        from tracegym.store.importers import import_path

        seed.mkdir(parents=True, exist_ok=True)
        files = sorted(TAU2.glob("*.json"))
        if files:
            for path in files:
                import_path("tau2-bench", path, seed)
        else:  # no shared data: the synthetic generator of analysis_speed.py
            sys.path.insert(0, str(ROOT.parent))
            from tracegym.benchmarks.analysis_speed import synthetic_runs

            synthetic_runs(seed, 1000)
        marker.write_text("")
    records = []
    for path in sorted((seed / "spool").glob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return records


def _runs_of(records: list[dict]) -> list[list[dict]]:
    """Records grouped by run: a trace's spans, then the outcome records that target its run id
    (an outcome is a trace of its own, naming the run by `tracegym.outcome.target`)."""
    by_trace: dict[str, list[dict]] = {}
    outcomes: dict[str, list[dict]] = {}
    for r in records:
        target = (r.get("attributes") or {}).get("tracegym.outcome.target")
        if r["name"] == "tracegym.outcome" and isinstance(target, str):
            outcomes.setdefault(target, []).append(r)
        else:
            by_trace.setdefault(r["trace_id"], []).append(r)
    runs = []
    for spans in by_trace.values():
        run_ids = {(s.get("attributes") or {}).get("tracegym.run.id") for s in spans}
        runs.append(spans + [o for rid in sorted(run_ids - {None}) for o in outcomes.get(rid, [])])
    return runs


def replicate(runs: list[list[dict]], total: int) -> Iterator[str]:
    """Spool lines for `total` runs: copy k of run i gets fresh trace and span ids (hashes of k
    and the originals) and run id (`<id>/x<k>`), everything else as recorded."""
    from tracegym.store.records import stable_id

    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    for n in range(total):
        k, i = divmod(n, len(runs))
        for record in runs[i]:
            out = dict(record)
            if k:  # span ids are unique in the lake too: the spans view keeps one of each
                out["trace_id"] = stable_id("scale", k, record["trace_id"])
                out["span_id"] = stable_id("scale", k, record["span_id"], width=16)
                if record.get("parent_span_id"):
                    out["parent_span_id"] = stable_id("scale", k, record["parent_span_id"],
                                                      width=16)  # fmt: skip
            attrs = dict(record.get("attributes") or {})
            for key in ("tracegym.run.id", "tracegym.outcome.target"):
                if k and isinstance(attrs.get(key), str):
                    attrs[key] = f"{attrs[key]}/x{k}"
            out["attributes"] = attrs
            yield dumps(out)


def write_spool(work: Path, home: Path, size: int) -> None:
    """`size` replicated runs as spool files under `home`, LINES_PER_FILE lines a file."""
    runs = _runs_of(seed_lines(work))
    spool = home / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    batch: list[str] = []
    files = 0

    def flush() -> None:
        nonlocal files, batch
        (spool / f"scale-{files:04d}.jsonl").write_text("\n".join(batch) + "\n")
        files, batch = files + 1, []

    for line in replicate(runs, size):
        batch.append(line)
        if len(batch) >= LINES_PER_FILE:
            flush()
    if batch:
        flush()


def generate(work: Path, size: int) -> Path:
    """`<work>/runs-<size>` with `size` replicated runs, compacted (timed: the marker file keeps
    the spans and seconds, so a later invocation reports the first compaction)."""
    home = work / f"runs-{size}"
    marker = home / ".generated"
    if marker.exists():
        return home
    write_spool(work, home, size)
    from tracegym.store import lake

    start = time.perf_counter()
    report = lake.compact(home)
    marker.write_text(json.dumps({"spans": report.spans,
                                  "seconds": time.perf_counter() - start}))  # fmt: skip
    return home


_CHILD = """
import json, sys, time
from tracegym.analysis.pipeline import analyze
home, batch, options = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
start = time.perf_counter()
result = analyze(home, write=False, **({"batch_rows": batch} if batch else {}), **options)
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "timings": result.timings, "runs": len(result.facts),
                  "failed": sum(f.success is False for f in result.facts),
                  "gaps": [g.name for g in result.gaps], "embedded": result.embedded,
                  "fitted_on": result.fitted_on, "streamed": result.streamed}))
"""


def _tree_rss(pid: int) -> dict[int, int]:
    """Resident bytes of `pid` and of every process under it now (Linux /proc; {} elsewhere)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        rss[int(entry.name)] = int(fields[21]) * resource.getpagesize()
    tree, todo = {}, [pid]
    while todo:
        at = todo.pop()
        tree[at] = rss.get(at, 0)
        todo += children.get(at, [])
    return tree


def analyze_once(home: Path, batch: int, options: dict | None = None) -> dict:
    """`analyze` in a fresh process: its result summary, and the peak RSS of that process, of
    its largest worker and of all of them at once, sampled every 0.2 s. (Not getrusage: a
    process started by fork and exec keeps its parent's peak as its own on Linux, so the child
    of this process after generating a spool would report this process's peak.)"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(home), str(batch), json.dumps(options or {})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT.parent,
    )  # fmt: skip
    own = worker = tree = 0
    while process.poll() is None:
        sizes = _tree_rss(process.pid)
        own = max(own, sizes.get(process.pid, 0))
        worker = max([worker] + [v for k, v in sizes.items() if k != process.pid])
        tree = max(tree, sum(sizes.values()))
        time.sleep(0.2)
    out, err = process.communicate()
    if process.returncode:
        raise RuntimeError(f"analyze failed ({process.returncode}): {err[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(peak_mb=own / 2**20, workers_peak_mb=worker / 2**20, tree_peak_mb=tree / 2**20)
    return result


QUERY = """
SELECT t.agent, c.tool, count(*) AS calls, count(DISTINCT c.trace_id) AS runs
FROM {tools} c JOIN {traces} t ON t.trace_id = c.trace_id
WHERE t.success = false GROUP BY ALL ORDER BY calls DESC
"""


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def lake_files(home: Path) -> dict[str, list[str]]:
    """The Parquet parts of a local lake, per table (spans, outcomes)."""
    return {t: sorted(str(p) for p in (home / "lake" / t).rglob("*.parquet"))
            for t in ("spans", "outcomes")}  # fmt: skip


def query_ratio(home: Path, files: dict[str, list[str]]) -> tuple[float, float]:
    """The typical query through the views of `home`, and the same on raw DuckDB over `files`
    (the same parts on a local disk): tool calls are spans whose `operation` is execute_tool, a
    run's outcome the latest outcome record naming its run id (what the views do, less their
    other columns)."""
    import duckdb
    from tracegym.store.store import Store

    with Store(home) as store:
        ours = best_of(5, lambda: store.sql(QUERY.format(tools="tool_calls",
                                                         traces="traces")).fetchall())  # fmt: skip
    raw = duckdb.connect()
    for name, table in (("s", "spans"), ("o", "outcomes")):
        raw.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({files[table]!r}, "
                    "union_by_name=true)")  # fmt: skip
    raw.execute("CREATE VIEW rt AS SELECT trace_id, tool FROM s WHERE operation = 'execute_tool'")
    raw.execute(
        "CREATE VIEW ro AS SELECT r.trace_id, r.agent, arg_max(json_extract_string(o.attributes, "
        "'$.\"tracegym.outcome.success\"') = 'true', o.start_ns) AS success FROM s r "
        "LEFT JOIN o ON json_extract_string(o.attributes, '$.\"tracegym.outcome.target\"') "
        "= r.run_id WHERE r.parent_span_id IS NULL GROUP BY ALL"
    )
    base = best_of(5, lambda: raw.sql(QUERY.format(tools="rt", traces="ro")).fetchall())
    return ours, base


def measure(
    work: Path, size: int, batch: int, options: dict, phases: list[str], query: bool = True
) -> None:
    start = time.perf_counter()
    home = generate(work, size)
    made = time.perf_counter() - start
    compaction = json.loads((home / ".generated").read_text())
    compaction = (f"{compaction['spans']:,} spans in {compaction['seconds']:.1f} s = "
                  f"{compaction['spans'] / compaction['seconds']:,.0f}/s")  # fmt: skip
    print(f"{size:,} runs (generated in {made:.1f} s): compaction {compaction}", flush=True)
    analyze_and_query(home, batch, options, phases, lake_files(home) if query else None)


def measure_s3(
    work: Path, size: int, batch: int, options: dict, phases: list[str], query: bool = True
) -> None:
    """The same on a home whose lake is on the moto S3 server (`s3://tracegym-scale/`): the
    spool is written anew (the server keeps objects in memory, so nothing is reused), compacted
    into S3 by commits, analysed, and queried with the part cache (the default) against raw
    DuckDB over local copies of the very parts the commits name."""
    from tracegym.store import object_lake
    from tracegym.store.object_lake import LakeConfig, ObjectLake

    home = work / f"s3-runs-{size}"
    shutil.rmtree(home, ignore_errors=True)
    write_spool(work, home, size)
    config = LakeConfig(f"s3://tracegym-scale/runs-{size}")
    object_lake.set_lake(home, config)
    lake = ObjectLake(config)
    start = time.perf_counter()
    report = object_lake.compact(home, lake)
    seconds = time.perf_counter() - start
    print(f"{size:,} runs on S3: compaction {report.spans:,} spans in {seconds:.1f} s = "
          f"{report.spans / seconds:,.0f}/s ({report.commits} commits)", flush=True)  # fmt: skip
    files = None
    if query:
        snapshot = lake.snapshot()
        files = {t: lake.local_copies(snapshot.parts(t), work / "s3-floor")
                 for t in ("spans", "outcomes")}  # fmt: skip
    analyze_and_query(home, batch, options, phases, files)


def analyze_and_query(
    home: Path, batch: int, options: dict, phases: list[str], files: dict[str, list[str]] | None
) -> None:
    """`analyze` per phase in a fresh process, then (`files`: the raw baseline's parts) the
    typical query against raw DuckDB."""
    cache = home / "cache"
    for phase in phases:
        if phase == "cold":
            for f in cache.glob("embeddings*"):
                f.unlink()
        r = analyze_once(home, batch, options)
        stages = ", ".join(f"{k} {v:.1f}" for k, v in r["timings"].items())
        how = f"streamed, fitted on {r['fitted_on']:,}" if r["streamed"] else "in memory"
        print(
            f"  analyze {phase} ({how}): {r['seconds']:.1f} s ({stages}; {r['embedded']} "
            f"embedded), peak RSS (sampled) {r['peak_mb']:,.0f} MB, largest worker "
            f"{r['workers_peak_mb']:,.0f} MB, all processes at once {r['tree_peak_mb']:,.0f} MB; "
            f"{r['runs']} runs, {r['failed']} failed, "
            f"{len(r['gaps'])} gaps: {', '.join(r['gaps'])}",
            flush=True,
        )
    if files is None:
        return
    ours, base = query_ratio(home, files)
    print(f"  query: views {ours * 1e3:.1f} ms, raw DuckDB {base * 1e3:.1f} ms, "
          f"ratio {ours / base:.2f}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument(
        "--batch-rows", type=int, default=20_000, help="span rows fetched at a time (0: default)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/tracegym-scale"))
    parser.add_argument(
        "--max-resident",
        type=int,
        default=0,
        help="runs analysed in memory before streaming (0: analyze's default)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="processes a streamed analysis detects in (0: one per CPU)",
    )
    parser.add_argument(
        "--engine",
        default="",
        help="what runs a streamed analysis's workers: processes (analyze's default) or spark "
        "(a local[--workers] session)",
    )
    parser.add_argument("--phases", default="cold,warm", help="cold (no embedding cache), warm")
    parser.add_argument("--no-query", action="store_true", help="skip the query timing")
    parser.add_argument(
        "--s3",
        action="store_true",
        help="per size, the same again on a home whose lake is on a moto S3 server (loopback)",
    )
    args = parser.parse_args()
    options = {k: v for k, v in (("max_resident", args.max_resident), ("workers", args.workers),
                                 ("engine", args.engine)) if v}  # fmt: skip
    phases = [p for p in args.phases.split(",") if p]
    print(f"load averages {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    server = None
    if args.s3:  # a moto S3 server on 127.0.0.1, the bucket made, the environment set
        from object_storage import start_s3

        server = start_s3("tracegym-scale")
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            for how in (measure, measure_s3) if server else (measure,):
                how(args.work, size, args.batch_rows, options, phases, query=not args.no_query)
    finally:
        if server:
            server.kill()
    print(f"load averages {os.getloadavg()}; this process peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
