"""The analysis commands: `tracegym analyze` (capability gaps) and `tracegym attribute`
(the decisive step and agent of each failed run, as JSON lines)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from tracegym.cli_options import HomeOption, existing_home, table_console
from tracegym.store.home import Home

if TYPE_CHECKING:
    from tracegym.analysis.gap import GapsDocument


def render_gaps(console: Console, document: GapsDocument) -> None:
    """The gaps table, then each gap's paragraph, the causes' folded symptoms and where its
    member runs are listed (the `gap_runs` view: what the dashboard's run filter shows)."""
    runs = document.runs
    gaps = document.gaps
    console.print(
        f"[bold]{len(gaps)} capability gaps[/] from {runs.total} runs "
        f"({runs.failed} failed, {runs.succeeded} succeeded): {document.contrast}"
    )
    table = Table()
    numeric = {"#", "coverage", "delta", "stable", "failed"}
    for column in ("#", "gap", "coverage", "delta", "stable", "failed", "tools"):
        table.add_column(column, justify="right" if column in numeric else "left")
    resamples = document.thresholds.resamples
    for gap in gaps:
        delta = "-" if gap.delta is None else f"{gap.delta:.2f}"
        table.add_row(
            str(gap.rank), escape(gap.name), f"{gap.coverage:.2f}", delta,
            f"{gap.stability}/{resamples}", str(gap.failed_runs_lacking),
            escape(", ".join(gap.tools[:3])),
        )  # fmt: skip
    console.print(table)
    for gap in gaps:
        console.print(f"[bold]{gap.rank}. {escape(gap.name)}[/] ({gap.id})")
        console.print(f"   {escape(gap.description)}", highlight=False)
        console.print(
            f"   [dim]{len(gap.members)} member runs: SELECT * FROM gap_runs "
            f"WHERE gap_id = '{gap.id}'[/]",
            highlight=False,
        )
    for name, error in document.detector_errors.items():
        console.print(f"[yellow]detector {escape(name)} failed and was skipped:[/] "
                      f"{escape(error)}")  # fmt: skip


def _written(target: Path, where: str, output: Path | None) -> str:
    """What the analysis left on disk, for the line on stderr."""
    if output is not None:
        return f"wrote {output}"
    gaps_file = Home.at(target).gaps
    if where:
        return (
            f"filtered by --where: not written ({gaps_file}, the whole store's, "
            "which the dashboard and synthesize read, is unchanged; --output FILE keeps this one)"
        )
    return f"wrote {gaps_file}"


JUDGE_KEY_ENV = "TRACEGYM_JUDGE_API_KEY"


def _judge(
    url: str | None,
    model: str | None,
    labellers: int,
    agree: int,
    min_coverage: float,
    min_delta: float,
    fail: Any,
) -> tuple[Any, Any]:
    """(what the judge will say, a hook maker: approve -> `extra_candidates`), both None
    without --judge-url."""
    if url is None and model is None:
        return None, None
    if not url or not model:
        fail("--judge-url and --judge-model go together")
    if agree > labellers:
        fail(f"--judge-agree {agree} exceeds --judge-labellers {labellers}")
    from tracegym.analysis.judge import JudgeConfig, Judged, OpenAICompatibleJudge, judge_hook

    try:
        judge = OpenAICompatibleJudge(url, model, api_key=os.environ.get(JUDGE_KEY_ENV) or None)
    except ValueError as exc:
        fail(f"--judge-url: {exc}")
    config = JudgeConfig(labellers=labellers, agree=agree, min_coverage=min_coverage,
                         min_delta=min_delta)  # fmt: skip
    judged = Judged()
    return judged, lambda approve: judge_hook(judge, judged, config, approve)


def _interactive() -> bool:
    return sys.stdin.isatty()


def _approver(budget: int | None, yes: bool, status: Any) -> Any:
    """Before the judge's first call: print its plan, refuse above --judge-budget, and on a
    terminal without --yes ask (`JudgeNotStarted` stops the analysis before anything is sent)."""
    from tracegym.analysis.judge import JudgeNotStarted

    def approve(plan: Any) -> None:
        status.stop()
        try:
            Console(stderr=True, soft_wrap=True).print(escape(plan.describe()), highlight=False)
            if budget is not None and plan.tokens > budget:
                raise JudgeNotStarted(f"about {plan.tokens:,} tokens is over --judge-budget "
                                      f"{budget:,}: nothing was sent")  # fmt: skip
            if not yes and _interactive() and not typer.confirm("Send them?", err=True):
                raise JudgeNotStarted("declined: nothing was sent (--yes does not ask)")
        finally:
            status.start()

    return approve


def _judge_line(judged: Any) -> str:
    if judged.error:
        return f"judge: no candidates ({judged.error})"
    labelled = sum(len(by_run) for by_run in judged.labels.values())
    kept = ", ".join(v.capability.name for v in judged.kept) or "none"
    line = (f"judge: {len(judged.capabilities)} capabilities proposed, kept by enough "
            f"labellers: {kept}; {labelled} labellings, {len(judged.skipped)} skipped")  # fmt: skip
    if judged.skipped:
        line += f" (e.g. {judged.skipped[0].why})"
    if judged.tokens_spent:
        line += f"; the server counted {judged.tokens_spent:,} tokens"
    return line


def register(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """Add `analyze` and `attribute` to `app`."""

    @app.command()
    def analyze(
        ctx: typer.Context,
        as_json: Annotated[bool, typer.Option("--json", help="Print gaps.json to stdout.")] = False,
        min_coverage: Annotated[float, typer.Option(min=0, max=1)] = 0.10,
        min_delta: Annotated[float, typer.Option(min=-1, max=1)] = 0.20,
        min_stability: Annotated[int, typer.Option(min=0)] = 8,
        resamples: Annotated[int, typer.Option(min=1)] = 10,
        seed: Annotated[int, typer.Option()] = 0,
        where: Annotated[
            str,
            typer.Option(
                help="SQL condition over the traces view. A filtered analysis never replaces "
                "<home>/gaps.json: it is written only with --output."
            ),
        ] = "",
        output: Annotated[
            Path | None,
            typer.Option("--output", "-o", help="Write the gaps here, not to <home>/gaps.json."),
        ] = None,
        judge_url: Annotated[
            str | None,
            typer.Option(
                help="Off by default. An OpenAI-compatible server (http(s)://host:port/v1) whose "
                "model proposes capabilities and labels runs, scored like every other candidate. "
                "Summaries of every run (request, tool calls, errors, answer) are SENT TO THIS "
                "URL. Needs --judge-model; the key, if any, is read from TRACEGYM_JUDGE_API_KEY."
            ),
        ] = None,
        judge_model: Annotated[
            str | None, typer.Option(help="The model name sent to --judge-url.")
        ] = None,
        judge_labellers: Annotated[
            int, typer.Option(min=1, max=10, help="Independent labellings of every run.")
        ] = 3,
        judge_agree: Annotated[
            int,
            typer.Option(min=1, help="Labellings a capability must pass (coverage, delta) in."),
        ] = 2,
        judge_budget: Annotated[
            int | None,
            typer.Option(
                min=1,
                help="Refuse to start the judge above this many tokens "
                "(the estimate printed before any call).",
            ),
        ] = None,
        yes: Annotated[
            bool, typer.Option("--yes", help="Start the judge without asking (still printed).")
        ] = False,
        home: HomeOption = None,
    ) -> None:
        """Find the capability gaps behind failed runs; writes <home>/gaps.json.

        With --where (a subset of the runs) or --output, <home>/gaps.json is left as it is:
        the dashboard and synthesize read it as the analysis of the whole store."""
        from tracegym.analysis.gap_selection import Thresholds
        from tracegym.analysis.judge import JudgeNotStarted
        from tracegym.analysis.pipeline import analyze as run_analysis
        from tracegym.store.store import check_read_only

        if min_stability > resamples:
            fail(f"--min-stability {min_stability} exceeds --resamples {resamples}")
        if where:
            try:
                check_read_only(f"SELECT * FROM traces WHERE {where}")
            except ValueError as exc:
                fail(f"--where: {exc}")
        judged, make_hook = _judge(judge_url, judge_model, judge_labellers, judge_agree,
                                   min_coverage, min_delta, fail)  # fmt: skip
        target = existing_home(home_of(ctx, home), fail)
        thresholds = Thresholds(min_coverage, min_delta, resamples, min_stability, seed)
        store_wide = not where and output is None
        status = Console(stderr=True).status("analysing", spinner="dots")
        hook = make_hook(_approver(judge_budget, yes, status)) if make_hook else None
        try:
            with status:
                result = run_analysis(
                    target, thresholds=thresholds, where=where, write=store_wide,
                    extra_candidates=hook, progress=lambda stage: status.update(escape(stage)),
                )  # fmt: skip
        except JudgeNotStarted as exc:
            fail(f"judge not started: {exc}")
        except Exception as exc:
            fail(f"analysis failed: {exc}")
        document = result.gaps_document()
        if where:
            document = replace(document, where=where)
        if output is not None:
            try:
                document.write_file(output)
            except OSError as exc:
                fail(f"cannot write {output}: {exc.strerror or exc}")
        if as_json:
            sys.stdout.write(
                json.dumps(document.to_dict(), indent=2, ensure_ascii=False, default=str) + "\n"
            )
        else:
            render_gaps(table_console(), document)
        if not as_json or not store_wide:
            Console(stderr=True, soft_wrap=True).print(
                escape(_written(target, where, output)), style="dim", highlight=False
            )
        if judged is not None:
            Console(stderr=True, soft_wrap=True).print(
                escape(_judge_line(judged)), style="yellow" if judged.error else "dim",
                highlight=False,
            )  # fmt: skip

    @app.command()
    def attribute(ctx: typer.Context, home: HomeOption = None) -> None:
        """For every failed run: the decisive step and responsible agent, as JSON lines
        {"run", "trace_id", "agent", "step", "reason", "confidence"}."""
        from tracegym.analysis.attribution import attribute_runs, to_json_line
        from tracegym.analysis.pipeline import default_detector_set, run_detectors
        from tracegym.analysis.runs import load_runs
        from tracegym.store.store import Store

        target = existing_home(home_of(ctx, home), fail)
        with Store(target) as store:
            runs = load_runs(store)
        findings, _ = run_detectors(default_detector_set(), runs)
        for attribution in attribute_runs(runs, findings):
            sys.stdout.write(to_json_line(attribution) + "\n")
