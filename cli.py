"""The `tracegym` command: one Typer app; each stage registers its own commands.

    tracegym [--home DIR] demo | summary | outcome | version          (this module)
    tracegym [--home DIR] sql | traces | show | compact | doctor | import | collect | export
                                                                        (store/commands.py)
    tracegym [--home DIR] analyze | attribute                           (analysis/commands.py)
    tracegym [--home DIR] synthesize | envs ...                         (synthesis/commands.py)
    tracegym [--home DIR] nightly | train | evaluate | adapters ...     (training/commands.py)
    tracegym [--home DIR] dashboard                                     (dashboards/commands.py)

Every command works on one data directory: `--home` (before or after the command name), else
$TRACEGYM_HOME, else ./.tracegym. Bad input ends with a one-line message and exit code 2; so
does a home that is missing or not a directory, for every command that reads one (demo, import
and collect create theirs: see cli_options.py).

Start-up: only this module's commands are built on every call; the other modules' commands are
imported and built when one of them runs (or `--help` lists them), so `tracegym traces` pays
for DuckDB, not for Polars, the synthesis families or torch (benchmarks/cli_startup.py).
"""

from __future__ import annotations

import importlib
import json
import math
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from tracegym.cli_options import (
    HomeOption,
    existing_home,
    hide_flag_type,
    hide_flag_types,
    table_console,
    writable_home,
)
from tracegym.tracer.config import resolve_home
from typer.core import TyperGroup

# The commands the stages register (`register(app, home_of, fail)` in each module), in the order
# `--help` lists them. tests/store/test_cli_show.py checks this against what the modules register.
LAZY_COMMANDS: dict[str, tuple[str, ...]] = {
    "tracegym.store.commands": (
        "sql",
        "traces",
        "show",
        "compact",
        "doctor",
        "import",
        "collect",
        "export",
    ),
    "tracegym.analysis.commands": ("analyze", "attribute"),
    "tracegym.synthesis.commands": ("synthesize", "envs"),
    "tracegym.training.commands": ("nightly", "train", "evaluate", "adapters"),
    "tracegym.dashboards.commands": ("dashboard",),
}
_MODULE_OF = {name: module for module, names in LAZY_COMMANDS.items() for name in names}


class LazyCommands(TyperGroup):
    """The `tracegym` group: lists every command, imports a stage's module when one of its
    commands is looked up, and shows no `<bool>` type next to flags in help."""

    def list_commands(self, ctx: Any) -> list[str]:
        listed = super().list_commands(ctx)
        return listed + [name for name in _MODULE_OF if name not in listed]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in _MODULE_OF:
            for name, loaded in stage_commands(_MODULE_OF[cmd_name]).items():
                self.commands.setdefault(name, loaded)
            command = super().get_command(ctx, cmd_name)
        if command is not None:
            hide_flag_types(command, ctx)
        return command

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        for flag in (*self.params, option):
            hide_flag_type(flag)
        return option


def stage_commands(module: str) -> dict[str, Any]:
    """The Click commands `module` registers, built on a Typer app of their own."""
    stage = typer.Typer()
    importlib.import_module(module).register(stage, _home, _fail)
    return dict(typer.main.get_group(stage).commands)


app = typer.Typer(
    name="tracegym",
    cls=LazyCommands,
    help="Trace agents as OpenTelemetry spans, find the capability gaps behind their failures, "
    "and train them away.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _fail(message: str, code: int = 2) -> NoReturn:
    """A one-line error (the message is printed as it is: it may hold trace content)."""
    Console(stderr=True, highlight=False, soft_wrap=True, emoji=False).print(
        f"[bold red]error:[/] {escape(message)}"
    )
    raise typer.Exit(code)


def _home(ctx: typer.Context, home: Path | None) -> Path:
    """The command's --home, else the global one, else $TRACEGYM_HOME, else ./.tracegym."""
    given = home if home is not None else (ctx.obj or {}).get("home")
    return resolve_home(given)


def _existing_home(home: Path) -> Path:
    return existing_home(home, _fail)


def _writable_home(home: Path) -> Path:
    return writable_home(home, _fail)


@app.callback()
def main(ctx: typer.Context, home: HomeOption = None) -> None:
    """tracegym: trace agents, find their capability gaps, train them away."""
    ctx.obj = {"home": home}


# Rendering --------------------------------------------------------------------------------------
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
        "records", f"{summary['spans']} ({summary['spans'] - recorded} spans + {recorded} outcomes)"
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


def _alarm(n: int) -> str:
    return f"[bold red]{n}[/]" if n else "0"


def _render_demo(console: Console, rows: list[dict[str, Any]], seed: int) -> None:
    kinds: dict[str, list[int]] = {}
    flaws: dict[str, list[int]] = {}
    for row in rows:
        kinds.setdefault(row["kind"], [0, 0])[0 if row["success"] else 1] += 1
        if row["flaw"]:
            flaws.setdefault(row["flaw"], [0, 0])[0 if row["success"] else 1] += 1
    wins = sum(1 for row in rows if row["success"])
    console.print(f"[bold]demo:[/] {len(rows)} support tickets (seed {seed}), {wins} solved")
    table = Table()
    table.add_column("ticket kind")
    table.add_column("solved", justify="right")
    table.add_column("failed", justify="right")
    for kind, (good, bad) in sorted(kinds.items()):
        table.add_row(kind, str(good), str(bad))
    console.print(table)
    if flaws:
        console.print("[bold]injected flaws[/] (the ground truth analysis should recover)")
        truth = Table()
        truth.add_column("flaw")
        truth.add_column("runs solved", justify="right")
        truth.add_column("runs failed", justify="right")
        for flaw, (good, bad) in sorted(flaws.items()):
            truth.add_row(flaw, str(good), str(bad))
        console.print(truth)


def _read_summary(home: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Summarise the whole store (lake and spool) when the analysis extra is installed, else
    the spool alone (the bare, tracer-only install)."""
    from tracegym.summary import spool_files, summarize
    from tracegym.tracer.spool_files import iter_spool

    try:
        from tracegym.store.store import Store
    except ImportError:
        Store = None
    try:
        if Store is None:
            return summarize(iter_spool(home)), spool_files(home)
        with Store(home) as store:
            files = spool_files(home)
            parts = [p for p in (home / "lake").rglob("*.parquet") if p.is_file()]
            files["files"] += len(parts)
            files["bytes"] += sum(p.stat().st_size for p in parts)
            return summarize(store.records()), files
    except OSError as exc:
        _fail(f"cannot read the store under {home}: {exc}")


# Commands ---------------------------------------------------------------------------------------
@app.command()
def demo(
    ctx: typer.Context,
    quick: Annotated[bool, typer.Option("--quick", help="A small size, for a first look.")] = False,
    model: Annotated[
        str, typer.Option("--model", help="Policy: smollm2 (default), tiny[-SEED] or a folder.")
    ] = "smollm2",
    tasks: Annotated[
        int | None,
        typer.Option("--tasks", min=1, help="Tasks per split (tickets with --scripted)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the task sets.")] = 0,
    embedder: Annotated[
        str | None,
        typer.Option(
            "--embedder",
            help="Router embeddings: minilm or hash (no model). Default: minilm (hash with tiny).",
        ),
    ] = None,
    scripted: Annotated[
        bool,
        typer.Option("--scripted", help="Only run the scripted agent (no model), and summarise."),
    ] = False,
    mix: Annotated[
        str | None,
        typer.Option(
            "--mix",
            help="The base fine-tune's request mix, e.g. status=0.1,cancel=0.4,refund=0.1,"
            "address=0.4 (normalised; kinds not named get 0). Default: 0.4,0.4,0.1,0.1.",
        ),
    ] = None,
    home: HomeOption = None,
) -> None:
    """The main job: the LM support agent's runs -> gaps -> environments -> adapters -> held-out
    success before and after (see docs/demo.md). `--scripted` runs the scripted agent only;
    `--model tiny` runs every stage in seconds on a random model that learns nothing."""
    if scripted and mix is not None:
        _fail("--mix sets the LM agent's base fine-tune: --scripted has none")
    from tracegym.jobs.demo import parse_mix

    try:
        base_mix = parse_mix(mix) if mix is not None else None
    except ValueError as exc:
        _fail(f"--mix: {exc}")
    target = _writable_home(_home(ctx, home))
    if scripted:
        _scripted_demo(target, tasks or 40, seed)
        return
    from tracegym.jobs.demo import DemoConfig
    from tracegym.jobs.demo import run as run_demo

    sizes: dict[str, Any] = {"seed": seed}
    if embedder is not None:
        sizes["embedder"] = embedder
    if base_mix is not None:
        sizes["mix"] = base_mix
    if tasks:
        sizes.update(dev_tasks=tasks, heldout_tasks=tasks)
    config = DemoConfig.for_model(model, quick, **sizes)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console,
    )  # fmt: skip
    bars: dict[str, Any] = {}

    def progress(what: str, done: int, total: int) -> None:
        if not total:  # a message (the nightly's stages)
            console.print(f"  {escape(what)}", highlight=False)
            return
        if what not in bars:
            bars[what] = bar.add_task(escape(what), total=total)
        bar.update(bars[what], completed=done, total=total)

    def stage(name: str) -> None:
        console.print(f"[bold]{name}[/]")

    from tracegym.generation.model import ModelError
    from tracegym.jobs.nightly import NightlyStageError

    try:
        with bar:
            report = run_demo(target, config, progress=progress, stage=stage)
    except ModelError as exc:
        _fail(str(exc))
    except NightlyStageError as exc:
        _fail(f"{exc} (completed stages are kept: rerun to resume)", code=1)
    from tracegym.jobs.demo import render_markdown

    typer.echo(render_markdown(report))
    typer.echo(f"report: {target / 'demo' / 'report.md'}")


def _scripted_demo(target: Path, tasks: int, seed: int) -> None:
    import tracegym as tg
    from tracegym.examples.support_agent import run_demo

    spooled = tg.init(service="tracegym-demo", home=target, capture_messages=True)
    console = table_console()
    if spooled is None:
        console.print(
            "[yellow]warning:[/] spans are not spooled (OTEL_SDK_DISABLED or TRACEGYM_SPOOL=0); "
            "the summary below will not include this demo."
        )
    rows = run_demo(n_tasks=tasks, seed=seed)
    flushed = tg.flush()
    stats = tg.stats()
    _render_demo(console, rows, seed)
    summary, files = _read_summary(target)
    render_summary(console, target, summary, files, stats)
    if not flushed or stats.spans_dropped or stats.spans_failed:
        _fail(
            f"not every span reached the store ({stats.spans_dropped} dropped, "
            f"{stats.spans_failed} failed, flush {'ok' if flushed else 'timed out'})",
            code=1,
        )


@app.command()
def summary(
    ctx: typer.Context,
    home: HomeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
) -> None:
    """Summarise what the spool holds: runs, spans by operation, tool calls, outcomes."""
    target = _existing_home(_home(ctx, home))
    result, files = _read_summary(target)
    if as_json:
        typer.echo(json.dumps({"home": str(target), **files, **result}, indent=2))
        return
    render_summary(table_console(), target, result, files)


def _labels(pairs: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            _fail(f"--label wants key=value, got {pair!r}")
        labels[key.strip()] = value
    return labels


def _warn(message: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True, emoji=False).print(
        f"[bold yellow]warning:[/] {escape(message)}"
    )


def _run_known(home: Path, run_id: str) -> bool:
    """Whether any span under `home` has `run_id` as its run id or trace id. Read without
    compacting (recording an outcome writes nothing else); True when it cannot be told."""
    try:
        from tracegym.store.store import Store
    except ImportError:  # the bare, tracer-only install: the spool is the whole store
        return _run_in_spool(home, run_id)
    try:
        with Store(home, compact_on_open=False) as store:
            query = "SELECT count(*) FROM spans WHERE run_id = $id OR trace_id = $id"
            return store.sql(query, {"id": run_id}).fetchall()[0][0] > 0
    except Exception:  # an unreadable store is for the queries to report, not this check
        return True


def _run_in_spool(home: Path, run_id: str) -> bool:
    from tracegym.tracer import semconv as sc
    from tracegym.tracer.spool_files import iter_spool

    try:
        return any(
            record.get("trace_id") == run_id
            or (record.get("attributes") or {}).get(sc.RUN_ID) == run_id
            for record in iter_spool(home)
            if record.get("name") != sc.OUTCOME_SPAN_NAME
        )
    except Exception:
        return True


@app.command()
def outcome(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="Run id (or trace id) the outcome is about.")],
    success: Annotated[
        bool | None,
        typer.Option("--success/--failure", help="Whether the run succeeded.", show_default=False),
    ] = None,
    reward: Annotated[float | None, typer.Option("--reward", help="Reward of the run.")] = None,
    source: Annotated[str, typer.Option("--source", help="Who judged the run.")] = "user",
    label: Annotated[
        list[str] | None, typer.Option("--label", help="key=value; may be repeated.")
    ] = None,
    home: HomeOption = None,
) -> None:
    """Record how a run ended (from any process); the store joins it to the run."""
    import tracegym as tg

    run_id = run_id.strip()
    if not run_id:
        _fail("RUN_ID is empty")
    if success is None and reward is None:
        _fail("say how the run ended: --success or --failure, and/or --reward R")
    if reward is not None and not math.isfinite(reward):
        _fail(f"--reward must be a finite number, got {reward}")
    labels = _labels(label or [])
    target = _existing_home(_home(ctx, home))
    if not _run_known(target, run_id):
        _warn(
            f"no run with run id or trace id {run_id!r} under {target} yet; recording the "
            "outcome anyway (it joins the run when the run's spans arrive)"
        )
    if tg.init(service="tracegym-cli", home=target) is None:
        _fail("tracing is off (OTEL_SDK_DISABLED or TRACEGYM_SPOOL=0): nowhere to record to")
    tg.record_outcome(run_id, success=success, reward=reward, source=source, labels=labels or None)
    flushed = tg.flush()
    stats = tg.stats()
    if not flushed or stats.counters.get("spans_exported.spool", 0) < 1:
        _fail(f"the outcome did not reach the store under {target}", code=1)
    verdict = {True: "success", False: "failure", None: "-"}[success]
    shown = "-" if reward is None else f"{reward:g}"
    typer.echo(f"recorded outcome for {run_id}: {verdict}, reward {shown}, source {source}")


@app.command()
def version() -> None:
    """Print tracegym's version."""
    from tracegym import __version__

    typer.echo(f"tracegym {__version__}")


if __name__ == "__main__":
    app(prog_name="tracegym")
