"""Compaction's peak memory with spool read in bounded passes (`lake.BATCH_BYTES`) against one
pass over every file of a batch (the baseline, in the same run, on a copy of the same spool).

    .venv/bin/python benchmarks/compaction_memory.py [--runs 100000] [--work /tmp/tracegym-cm]

The spool is scale.py's replicated tau2 runs (200,000 lines a file); each compaction runs in a
fresh process and prints spans/s and that process's peak RSS.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scale  # noqa: E402 - the replicated runs

_CHILD = """
import resource, sys, time
from tracegym.store import lake
home, limit = sys.argv[1], int(sys.argv[2])
if limit:
    lake.BATCH_BYTES = limit
start = time.perf_counter()
report = lake.compact(home)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{report.spans:,} spans from {report.files} files in {seconds:.1f} s = "
      f"{report.spans / seconds:,.0f}/s; peak {peak:,.0f} MB")
"""


def spool(home: Path, runs: int, work: Path) -> None:
    records = scale._runs_of(scale.seed_lines(work))
    folder = home / "spool"
    folder.mkdir(parents=True, exist_ok=True)
    batch: list[str] = []
    files = 0
    for line in scale.replicate(records, runs):
        batch.append(line)
        if len(batch) >= scale.LINES_PER_FILE:
            (folder / f"scale-{files:04d}.jsonl").write_text("\n".join(batch) + "\n")
            files, batch = files + 1, []
    if batch:
        (folder / f"scale-{files:04d}.jsonl").write_text("\n".join(batch) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tracegym-cm"))
    args = parser.parse_args()
    bounded, whole = args.work / "bounded", args.work / "whole"
    shutil.rmtree(args.work / "bounded", ignore_errors=True)
    shutil.rmtree(args.work / "whole", ignore_errors=True)
    spool(bounded, args.runs, args.work)
    shutil.copytree(bounded, whole)
    size = sum(p.stat().st_size for p in (bounded / "spool").glob("*.jsonl"))
    print(f"{args.runs:,} runs: {size / 2**30:.1f} GB of spool")
    for name, home, limit in (("bounded passes (default)", bounded, 0),
                              ("one pass a batch (baseline)", whole, 1 << 62)):  # fmt: skip
        out = subprocess.run([sys.executable, "-c", _CHILD, str(home), str(limit)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        print(f"  {name}: {out.stdout.strip()}", flush=True)
    shutil.rmtree(bounded), shutil.rmtree(whole)


if __name__ == "__main__":
    main()
