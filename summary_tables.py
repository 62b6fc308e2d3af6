"""The store's summary as Rich tables (`tracegym summary`, `tracegym demo --scripted`).

`tracegym.summary` computes the numbers with the standard library alone; this module reads them
from a home (the whole store when the analysis extra is installed, else the spool) and renders
them. It sits above the store and below the commands that print it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from tracegym.store.home import Home
from tracegym.summary import spool_files, summarize
from tracegym.tracer.spool_files import iter_spool


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _when(ns: int | None) -> str:
    if ns is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))


def _alarm(n: int) -> str:
    return f"[bold red]{n}[/]" if n else "0"


def render_summary(
    console: Console,
    home: Path,
    summary: dict[str, Any],
    files: dict[str, int],
    stats: Any = None,
) -> None:
    """Print a `summarize` result (and, in-process, the tracer's stats) as Rich tables."""
    console.print(f"[bold]tracegym store:[/] {escape(str(home))}")
    overview = Table(show_header=False)
    overview.add_column(style="bold")
    overview.add_column(justify="right")
    overview.add_row("store files", f"{files['files']} ({_bytes(files['bytes'])})")
    # The dashboard's overview counts the same way: spans plus outcome records.
    recorded = summary["outcomes"]["recorded"]
    overview.add_row(
        "records",
        f"{summary['spans']} ({summary['spans'] - recorded} span"
        f"{'' if summary['spans'] - recorded == 1 else 's'} + {recorded} outcome"
        f"{'' if recorded == 1 else 's'})",
    )
    overview.add_row("traces", str(summary["traces"]))
    overview.add_row("runs", str(summary["runs"]))
    overview.add_row("spans with errors", str(summary["errors"]))
    llm = summary["llm"]
    overview.add_row(
        "LLM calls / tokens in / out",
        f"{llm['calls']} / {llm['input_tokens']} / {llm['output_tokens']}",
    )
    services = ", ".join(f"{k} ({v})" for k, v in summary["services"].items()) or "-"
    overview.add_row("services", Text(services))
    overview.add_row("first span", _when(summary["time"]["first_start_ns"]))
    overview.add_row("last span", _when(summary["time"]["last_end_ns"]))
    console.print(overview)

    ops = Table(title="spans by operation", title_justify="left", min_width=40)
    ops.add_column("gen_ai.operation.name")
    ops.add_column("spans", justify="right")
    for operation, count in summary["operations"].items():
        ops.add_row(Text(operation), str(count))
    console.print(ops)

    if summary["tools"]:
        tools = Table(title="tool calls", title_justify="left", min_width=40)
        tools.add_column("tool")
        tools.add_column("calls", justify="right")
        tools.add_column("errors", justify="right")
        for name, entry in summary["tools"].items():
            errors = entry["errors"]
            tools.add_row(Text(name), str(entry["calls"]), f"[red]{errors}[/]" if errors else "0")
        console.print(tools)

    out = summary["outcomes"]
    outcomes = Table(title="outcomes (latest per run)", title_justify="left")
    for column in ("success", "failure", "unknown", "mean reward", "runs without", "recorded"):
        outcomes.add_column(column, justify="right")
    mean = out["mean_reward"]
    outcomes.add_row(
        f"[green]{out['success']}[/]",
        f"[red]{out['failure']}[/]",
        str(out["unknown"]),
        "-" if mean is None else f"{mean:.3f}",
        str(out["runs_without_outcome"]),
        str(out["recorded"]),
    )
    console.print(outcomes)
    if out["unmatched"]:
        console.print(f"{out['unmatched']} outcome target(s) match no run in this store.")

    if stats is not None:
        tracer = Table(title="tracer (this process)", title_justify="left")
        for column in ("exported", "dropped", "failed", "redacted", "internal errors"):
            tracer.add_column(column, justify="right")
        tracer.add_row(
            str(stats.spans_exported),
            _alarm(stats.spans_dropped),
            _alarm(stats.spans_failed),
            str(stats.spans_redacted),
            _alarm(stats.internal_errors),
        )
        console.print(tracer)


def read_summary(home: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Summarise the whole store (lake and spool) when the analysis extra is installed, else
    the spool alone (the bare, tracer-only install). Raises OSError when the store cannot be
    read."""
    try:
        from tracegym.store.store import Store
    except ImportError:
        Store = None
    if Store is None:
        return summarize(iter_spool(home)), spool_files(home)
    with Store(home) as store:
        files = spool_files(home)
        parts = [p for p in Home.at(home).lake.rglob("*.parquet") if p.is_file()]
        files["files"] += len(parts)
        files["bytes"] += sum(p.stat().st_size for p in parts)
        return summarize(store.records()), files


__all__ = ["read_summary", "render_summary"]
