"""Start-up time of the light commands (`traces`, `show`, `sql`) against the floor of
`python -c "import duckdb"`, in the same run. Goal: each under 2x the floor.

Every command is a fresh interpreter (`python -m tracegym.cli ...`, what the `tracegym` script
runs), timed wall clock around `subprocess.run`, on a small home made first (3 runs of 6 spans,
compacted once before timing). Rounds interleave the commands so that a noisy neighbour hits
them alike; each reports its best and its median of `--repeat` rounds. `python -c pass` and
`tracegym --help` (which imports every stage to list its commands) are shown for reference,
and so are `import tracegym` and `import typer, rich`: where the rest of the time goes.

    .venv/bin/python benchmarks/cli_startup.py [--repeat 9] [--checkout DIR] [--json]

`--checkout DIR` times another checkout of tracegym (e.g. a `git worktree` of an older commit)
with this interpreter, for before/after numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = 1_764_460_800_000_000_000
GOAL = 2.0


def make_home(home: Path) -> str:
    """Three runs of six spans (agent, chat, two tools, one failing, a memory read) and their
    outcomes; returns a run id to `show`."""
    from tracegym.store.records import outcome_record, span_record, write_spool_file

    op = "gen_ai.operation.name"
    records = []
    for n in range(3):
        trace, start, root = f"{n + 1:02x}" * 16, BASE + n * 10_000_000, f"{n:02x}00" * 4
        shapes = [
            ("invoke_agent support", None, {op: "invoke_agent", "tracegym.run.id": f"run-{n}",
             "tracegym.input": '{"message": "where is my order?"}'}),
            ("chat m", root, {op: "chat", "gen_ai.input.messages":
             '[{"role": "user", "content": "where is my order?"}]'}),
            ("execute_tool find_user", root, {op: "execute_tool", "gen_ai.tool.name": "find_user"}),
            ("execute_tool get_order", root, {op: "execute_tool", "gen_ai.tool.name": "get_order",
             "error.type": "KeyError"}),
            ("search_memory notes", root, {op: "search_memory"}),
            ("chat m", root, {op: "chat"}),
        ]  # fmt: skip
        for i, (name, parent, attributes) in enumerate(shapes):
            records.append(span_record(
                trace_id=trace, span_id=f"{n:02x}{i:02x}" * 4, name=name, parent_span_id=parent,
                start_ns=start + i * 1000, end_ns=start + i * 1000 + 500,
                status="ERROR" if "error.type" in attributes else "UNSET", attributes=attributes,
            ))  # fmt: skip
        records.append(
            outcome_record(f"run-{n}", time_ns=start + 9_000_000, success=n == 0, reward=0.0)
        )
    write_spool_file(home, records, "bench")
    return "run-1"


def commands(home: Path, run_id: str) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "tracegym.cli", "--home", str(home)]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import duckdb (floor)": [sys.executable, "-c", "import duckdb"],
        # where the rest goes: the tracer package every tracegym module sits under (its public
        # names load on first use), the CLI stack, and DuckDB's connection with the store's views
        "import tracegym": [sys.executable, "-c", "import tracegym"],
        "import typer, rich": [sys.executable, "-c", "import typer, rich.table"],
        "duckdb + typer + rich": [sys.executable, "-c", "import duckdb, typer, rich.table"],
        "tracegym traces": [*cli, "traces"],
        "tracegym show": [*cli, "show", run_id],
        "tracegym sql": [*cli, "sql", "SELECT count(*) FROM spans"],
        "tracegym --help": [*cli, "--help"],
    }


def timed(argv: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9, help="Timed rounds (after a warm-up).")
    parser.add_argument("--checkout", type=Path, help="Time this checkout of tracegym instead.")
    parser.add_argument("--json", action="store_true", help="Print the numbers as JSON.")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER")}
    env.update(HF_HUB_OFFLINE="1", COLUMNS="120")
    with tempfile.TemporaryDirectory(prefix="tg-startup-") as tmp:
        if args.checkout is not None:  # `tracegym` importable from the other checkout first
            parent = Path(tmp) / "src"
            parent.mkdir()
            (parent / "tracegym").symlink_to(args.checkout.resolve(), target_is_directory=True)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(parent), env.get("PYTHONPATH")]))
        home = Path(tmp) / "home"
        home.mkdir()
        run_id = make_home(home)
        argvs = commands(home, run_id)
        for argv in argvs.values():  # warm-up: bytecode caches, the first compaction
            timed(argv, env)
        times: dict[str, list[float]] = {name: [] for name in argvs}
        for _ in range(args.repeat):
            for name, argv in argvs.items():
                times[name].append(timed(argv, env))

    floor = min(times["import duckdb (floor)"])
    rows = {
        name: {"best_s": min(ts), "median_s": statistics.median(ts), "x_floor": min(ts) / floor}
        for name, ts in times.items()
    }
    light = ("tracegym traces", "tracegym show", "tracegym sql")
    verdict = all(rows[name]["x_floor"] < GOAL for name in light)
    if args.json:
        print(json.dumps({"repeat": args.repeat, "goal_x_floor": GOAL, "met": verdict,
                          "commands": rows}, indent=2))  # fmt: skip
        return
    print(f"best and median of {args.repeat} rounds, fresh interpreter each ({sys.executable})")
    print(f"{'command':<24}{'best s':>9}{'median s':>10}{'x floor':>9}")
    for name, row in rows.items():
        print(f"{name:<24}{row['best_s']:>9.3f}{row['median_s']:>10.3f}{row['x_floor']:>9.2f}")
    met = "met" if verdict else "NOT met"
    print(f"goal: traces, show and sql under {GOAL:g}x the floor: {met}")


if __name__ == "__main__":
    main()
