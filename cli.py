"""The `tracegym` command: one Typer app; each stage registers its own commands.

    tracegym [--home DIR] demo | nightly                                (jobs/commands.py)
    tracegym [--home DIR] sql | traces | show | compact | doctor | import | collect | export
                                                                        (store/commands.py)
    tracegym [--home DIR] analyze | attribute                           (analysis/commands.py)
    tracegym [--home DIR] synthesize | envs ...                         (synthesis/commands.py)
    tracegym [--home DIR] train | evaluate | adapters ...               (training/commands.py)
    tracegym [--home DIR] dashboard                                     (dashboards/commands.py)
    tracegym [--home DIR] summary | outcome | version                   (this module)

`--prices FILE` (before the command name) prices LLM calls with the user's prices over the
built-in table for every command (store/pricing.py).

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
import os
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from tracegym.cli_options import (
    HomeOption,
    existing_home,
    hide_flag_type,
    hide_flag_types,
    table_console,
)
from tracegym.tracer.config import resolve_home
from typer.core import TyperGroup

# The commands the jobs and the stages register (`register(app, home_of, fail)` in each module),
# in the order `--help` lists them (this module's own commands come after them).
# tests/store/test_cli_show.py checks this against what the modules register.
LAZY_COMMANDS: dict[str, tuple[str, ...]] = {
    "tracegym.jobs.commands": ("demo", "nightly"),
    "tracegym.store.commands": (
        "sql",
        "traces",
        "show",
        "compact",
        "views",
        "doctor",
        "import",
        "collect",
        "export",
    ),
    "tracegym.analysis.commands": ("analyze", "attribute"),
    "tracegym.synthesis.commands": ("synthesize", "envs"),
    "tracegym.training.commands": ("train", "evaluate", "adapters"),
    "tracegym.serving.commands": ("serve",),
    "tracegym.dashboards.commands": ("dashboard",),
}
_MODULE_OF = {name: module for module, names in LAZY_COMMANDS.items() for name in names}


class LazyCommands(TyperGroup):
    """The `tracegym` group: lists every command, imports a stage's module when one of its
    commands is looked up, and shows no `<bool>` type next to flags in help."""

    def list_commands(self, ctx: Any) -> list[str]:
        listed = super().list_commands(ctx)
        return [*_MODULE_OF, *(name for name in listed if name not in _MODULE_OF)]

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


PricesOption = Annotated[
    Path | None,
    typer.Option(
        "--prices",
        help="A TOML or JSON file of LLM prices (USD per million tokens) over the built-in "
        "table, for every cost shown (else $TRACEGYM_PRICES, else <home>/prices.toml).",
        show_default=False,
    ),
]


@app.callback()
def main(ctx: typer.Context, home: HomeOption = None, prices: PricesOption = None) -> None:
    """tracegym: trace agents, find their capability gaps, train them away."""
    ctx.obj = {"home": home}
    if prices is not None:  # checked here, so a typo is one clear error, not a warning later
        from tracegym.store.pricing import PRICES_ENV, PricesError, load_overrides

        try:
            load_overrides(prices)
        except PricesError as exc:
            _fail(str(exc))
        os.environ[PRICES_ENV] = str(prices.expanduser().resolve())


@app.command()
def summary(
    ctx: typer.Context,
    home: HomeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
) -> None:
    """Summarise what the spool holds: runs, spans by operation, tool calls, outcomes."""
    from tracegym.summary_tables import read_summary, render_summary

    target = _existing_home(_home(ctx, home))
    try:
        result, files = read_summary(target)
    except OSError as exc:
        _fail(f"cannot read the store under {target}: {exc}")
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
    from tracegym.store.outcome_record import Outcome, OutcomeNotRecorded, TracingOff, record

    try:
        wanted = Outcome(run_id, success, reward, source, _labels(label or []) or None).checked()
    except ValueError as exc:
        _fail(str(exc))
    target = _existing_home(_home(ctx, home))
    if not _run_known(target, wanted.run_id):
        _warn(
            f"no run with run id or trace id {wanted.run_id!r} under {target} yet; recording "
            "the outcome anyway (it joins the run when the run's spans arrive)"
        )
    try:
        done = record(target, wanted)
    except OutcomeNotRecorded as exc:
        _fail(str(exc), code=2 if isinstance(exc, TracingOff) else 1)
    typer.echo(f"recorded outcome for {done.summary()}")


@app.command()
def version() -> None:
    """Print tracegym's version."""
    from tracegym import __version__

    typer.echo(f"tracegym {__version__}")


if __name__ == "__main__":
    app(prog_name="tracegym")
