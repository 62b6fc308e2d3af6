"""The jobs' commands: `tracegym demo` (the main job end to end) and `tracegym nightly`.

Registered on the main app by `register(app, home_of, fail)`, like each stage's commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from tracegym.cli_options import (
    EmbedderOption,
    HomeOption,
    JsonOption,
    ModelOption,
    existing_home,
    print_json,
    table_console,
    writable_home,
)
from tracegym.training.commands import (
    ChatTemplateOption,
    DeviceMapOption,
    DtypeOption,
    QuantizeOption,
    check_template,
    load_options,
)


def render_demo(console: Console, rows: list[dict[str, Any]], seed: int) -> None:
    """The scripted demo's tickets by kind, and the injected flaws analysis should recover."""
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


def register(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """Add `demo` and `nightly` to `app`."""

    def _scripted_demo(target: Path, tasks: int, seed: int) -> None:
        import tracegym as tg
        from tracegym.examples.support_agent import run_demo
        from tracegym.summary_tables import read_summary, render_summary

        spooled = tg.init(service="tracegym-demo", home=target, capture_messages=True)
        console = table_console()
        if spooled is None:
            console.print(
                "[yellow]warning:[/] spans are not spooled (OTEL_SDK_DISABLED or "
                "TRACEGYM_SPOOL=0); the summary below will not include this demo."
            )
        rows = run_demo(n_tasks=tasks, seed=seed)
        flushed = tg.flush()
        stats = tg.stats()
        render_demo(console, rows, seed)
        try:
            summary, files = read_summary(target)
        except OSError as exc:
            fail(f"cannot read the store under {target}: {exc}")
        render_summary(console, target, summary, files, stats)
        if not flushed or stats.spans_dropped or stats.spans_failed:
            fail(
                f"not every span reached the store ({stats.spans_dropped} dropped, "
                f"{stats.spans_failed} failed, flush {'ok' if flushed else 'timed out'})",
                1,
            )

    @app.command()
    def demo(
        ctx: typer.Context,
        quick: Annotated[
            bool, typer.Option("--quick", help="A small size, for a first look.")
        ] = False,
        model: Annotated[
            str, typer.Option("--model", help="Policy: smollm2 (default), tiny[-SEED] or a folder.")
        ] = "smollm2",
        tasks: Annotated[
            int | None,
            typer.Option("--tasks", min=1, help="Tasks per split (tickets with --scripted)."),
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help="Seed of the task sets.")] = 0,
        agent: Annotated[
            str,
            typer.Option(
                "--agent", help="The bundled agent: shop (default) or clinic (another domain)."
            ),
        ] = "shop",
        embedder: Annotated[
            str | None,
            typer.Option(
                "--embedder",
                help="Router embeddings: minilm or hash (no model). Default: minilm (hash with "
                "tiny).",
            ),
        ] = None,
        scripted: Annotated[
            bool,
            typer.Option(
                "--scripted", help="Only run the scripted agent (no model), and summarise."
            ),
        ] = False,
        mix: Annotated[
            str | None,
            typer.Option(
                "--mix",
                help="The base fine-tune's request mix, e.g. status=0.1,cancel=0.4,refund=0.1,"
                "address=0.4 (normalised; kinds not named get 0). Default: the agent's own "
                "(the shop's 0.4,0.4,0.1,0.1).",
            ),
        ] = None,
        home: HomeOption = None,
    ) -> None:
        """The main job: a support agent's runs (the openai client against `tracegym serve`) ->
        gaps -> environments -> adapters -> held-out success before and after (see
        docs/demo.md). `--scripted` runs the scripted agent only; `--model tiny` runs every
        stage in seconds on a random model that learns nothing."""
        if scripted and mix is not None:
            fail("--mix sets the LM agent's base fine-tune: --scripted has none")
        from tracegym.examples.domains import domain_named
        from tracegym.jobs.demo import parse_mix

        try:
            domain = domain_named(agent)
        except ValueError as exc:
            fail(f"--agent: {exc}")
        try:
            base_mix = parse_mix(mix, domain.kinds) if mix is not None else None
        except ValueError as exc:
            fail(f"--mix: {exc}")
        target = writable_home(home_of(ctx, home), fail)
        if scripted:
            _scripted_demo(target, tasks or 40, seed)
            return
        from tracegym.jobs.demo import DemoConfig
        from tracegym.jobs.demo import run as run_demo

        sizes: dict[str, Any] = {"seed": seed, "agent": agent}
        if embedder is not None:
            sizes["embedder"] = embedder
        if base_mix is not None:
            sizes["mix"] = base_mix
        if tasks:
            sizes.update(dev_tasks=tasks, heldout_tasks=tasks)
        config = DemoConfig.for_model(model, quick, **sizes)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

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
            fail(str(exc))
        except NightlyStageError as exc:
            fail(f"{exc} (completed stages are kept: rerun to resume)", 1)
        from tracegym.jobs.demo import render_markdown
        from tracegym.store.home import Home

        typer.echo(render_markdown(report))
        typer.echo(f"report: {Home.at(target).demo / 'report.md'}")

    @app.command()
    def nightly(
        ctx: typer.Context,
        model: ModelOption = "smollm2",
        steps: Annotated[int | None, typer.Option(min=1, help="LoRA steps per adapter.")] = None,
        eval_seeds: Annotated[int, typer.Option(min=1, help="Held-out tasks per env.")] = 20,
        date: Annotated[
            str | None, typer.Option(help="The night (YYYY-MM-DD) to run or resume.")
        ] = None,
        no_route: Annotated[bool, typer.Option("--no-route", help="Skip router eval.")] = False,
        embedder: EmbedderOption = "minilm",
        chat_template: ChatTemplateOption = None,
        dtype: DtypeOption = None,
        device_map: DeviceMapOption = None,
        quantize: QuantizeOption = None,
        as_json: JsonOption = False,
        home: HomeOption = None,
    ) -> None:
        """Compaction -> analysis -> synthesis -> training -> evaluation -> report (resumable)."""
        from tracegym.jobs.nightly import NightlyBusy, NightlyConfig, NightlyStageError
        from tracegym.jobs.nightly import nightly as run

        target = existing_home(home_of(ctx, home), fail)
        options = load_options(dtype, device_map, quantize, fail, chat_template)
        if chat_template is not None:  # before the night starts: a bad pair ends in one line
            from tracegym.generation.model import ModelError, ensure_model

            try:
                folder = ensure_model(target, model)
            except ModelError as exc:
                fail(str(exc))
            check_template(folder, chat_template, fail)
        config = NightlyConfig(
            model=model,
            train={"steps": steps} if steps else {},
            eval_seeds=eval_seeds,
            route=not no_route,
            date=date,
            chat_template=str(chat_template) if chat_template else None,
            dtype=options.dtype,
            device_map=options.device_map,
            quantize=options.quantize,
        )
        console = table_console()
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        from tracegym.generation.model import ModelError
        from tracegym.jobs.nightly import STAGES
        from tracegym.training.commands import train_progress
        from tracegym.training.router import embedder_named

        bar = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            TextColumn("{task.completed}/{task.total} stages"), TimeElapsedColumn(),
            console=Console(stderr=True), disable=as_json,
        )  # fmt: skip
        night = bar.add_task("nightly", total=len(STAGES))

        def progress(stage: str, message: str) -> None:
            if message.startswith("failed "):  # one environment; the stage goes on
                bar.console.print(
                    f"[yellow]{stage}[/]: {escape(message)}", highlight=False, soft_wrap=True
                )  # one line in a log, however long the reason
                return
            bar.update(night, description=f"{stage}: {escape(message)}")
            if message != "running" and not message.startswith(("training ", "evaluating ")):
                bar.console.print(f"[bold]{stage}[/]: {escape(message)}", highlight=False)
                bar.advance(night)  # the stage ended (done, skipped, already done ...)

        steps_bar, on_step = train_progress(quiet=as_json)
        try:
            with bar, steps_bar:
                result = run(
                    target, config, progress=progress, embedder=embedder_named(embedder, target),
                    on_step=on_step,
                )  # fmt: skip
        except NightlyBusy as exc:
            fail(str(exc), 3)
        except ModelError as exc:
            fail(f"{exc} (completed stages are kept: rerun to resume)")
        except NightlyStageError as exc:
            fail(f"{exc} (completed stages are kept: rerun to resume)", 1)
        if as_json:
            print_json(result.to_dict())
            return
        report = Path(result.dir) / "report.md"
        console.print(f"report: {escape(str(report))}")


__all__ = ["register", "render_demo"]
