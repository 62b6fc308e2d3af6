"""The analysis commands: `tracegym analyze` (capability gaps) and `tracegym attribute`
(the decisive step and agent of each failed run, as JSON lines)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from enum import Enum
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
    from tracegym.analysis.gap_selection import Scored, Thresholds
    from tracegym.analysis.pipeline import Analysis


class Engine(str, Enum):
    """What runs a streamed analysis's worker tasks (`analysis.streaming.ENGINES`)."""

    processes = "processes"
    spark = "spark"


def render_gaps(console: Console, document: GapsDocument) -> None:
    """The gaps table, then each gap's paragraph, the causes' folded symptoms and where its
    member runs are listed (the `gap_runs` view: what the dashboard's run filter shows)."""
    runs = document.runs
    gaps = document.gaps
    console.print(
        f"[bold]{len(gaps)} capability gap{'' if len(gaps) == 1 else 's'}[/] from "
        f"{runs.total} run{'' if runs.total == 1 else 's'} "
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
    line = f"judge: {len(judged.capabilities)} capabilities proposed"
    if judged.verdicts:
        first = judged.verdicts[0]
        kept = ", ".join(v.capability.name for v in judged.kept) or "none"
        line += f"; kept (>= {first.agree} of {len(first.scores)} labellings pass): {kept}"
        missed = [f"{v.capability.name} ({v.passed} of {len(v.scores)})"
                  for v in judged.verdicts if not v.kept]  # fmt: skip
        if missed:
            line += f"; not kept: {', '.join(missed)}"
    line += f"; {labelled} labellings, {len(judged.skipped)} skipped"
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
        max_resident: Annotated[
            int | None,
            typer.Option(
                min=1,
                help="Runs analysed in memory (default 5,000). Past this many the runs stream "
                "from the lake, memory flat in their number: the detectors learn from a seeded "
                "sample of this many, and every run is checked against them.",
            ),
        ] = None,
        workers: Annotated[
            int | None,
            typer.Option(
                min=1, help="Processes a streamed analysis checks runs in (default: one per CPU)."
            ),
        ] = None,
        engine: Annotated[
            Engine,
            typer.Option(
                help="What runs a streamed analysis's workers: local processes, or Spark tasks "
                "(the spark extra and Java; --workers cores for a local session).",
            ),
        ] = Engine.processes,
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
                    workers=workers, engine=engine.value,
                    **({"max_resident": max_resident} if max_resident else {}),
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
        empty = None if result.gaps else nothing_kept(result, judged=judged is not None)
        if as_json:
            printed = document.to_dict()
            if empty is not None:  # not in gaps.json: what this analysis says about itself
                printed["nothing_kept"] = empty.to_dict()
            sys.stdout.write(json.dumps(printed, indent=2, ensure_ascii=False, default=str) + "\n")
        else:
            render_gaps(table_console(), document)
            if empty is not None:
                render_nothing_kept(table_console(), empty)
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


# When no gap is kept ------------------------------------------------------------------------------
def failed_runs(n: int) -> str:
    """`1 failed run`, `2 failed runs`."""
    return f"{n} failed run{'' if n == 1 else 's'}"


NEAREST = 5  # near misses listed
FEW_RUNS = 20  # fewer failed (or successful) runs than this: one run moves a rate by 5% or more


@dataclass(frozen=True)
class NearMiss:
    """A candidate not kept: its rates, the thresholds it missed (or, having passed them all,
    why it was dropped)."""

    key: str
    failed_runs: int
    coverage: float
    delta: float | None
    stability: int
    missed: tuple[str, ...]  # "delta 0.15 < 0.2", ...; empty when it passed all three
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "failed_runs": self.failed_runs, "coverage": self.coverage,
                "delta": self.delta, "stability": self.stability, "missed": list(self.missed),
                "why": self.why}  # fmt: skip


@dataclass(frozen=True)
class NothingKept:
    """Why an analysis kept no gap, from what it already has: the runs by outcome, the failed
    runs no detector found anything in, the candidates nearest to passing, and what to do next
    (more runs, outcomes, an LLM judge)."""

    failed: int
    succeeded: int
    unknown: int
    untouched: int  # failed runs without a single detector finding
    nearest: tuple[NearMiss, ...]
    next_steps: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"failed": self.failed, "succeeded": self.succeeded, "unknown": self.unknown,
                "failed_without_findings": self.untouched,
                "nearest": [m.to_dict() for m in self.nearest],
                "next_steps": list(self.next_steps)}  # fmt: skip


def _missed(s: Scored, t: Thresholds) -> tuple[tuple[str, ...], float]:
    """The thresholds `s` missed, and how far it is from passing them (the relative shortfalls
    summed: 0 for a candidate that passed all three and was dropped for another reason)."""
    missed, short = [], 0.0
    if s.coverage < t.min_coverage:
        missed.append(f"coverage {s.coverage:.2f} < {t.min_coverage}")
        short += (t.min_coverage - s.coverage) / max(t.min_coverage, 1e-9)
    if s.delta is not None and s.delta < t.min_delta:
        missed.append(f"delta {s.delta:.2f} < {t.min_delta}")
        short += (t.min_delta - s.delta) / max(t.min_delta, 1e-9)
    if s.stability < t.min_stability:
        missed.append(f"stable in {s.stability}/{t.resamples} < {t.min_stability}")
        short += (t.min_stability - s.stability) / max(t.min_stability, 1)
    return tuple(missed), short


def nothing_kept(result: Analysis, *, judged: bool = False, limit: int = NEAREST) -> NothingKept:
    """What to tell a user whose analysis kept no gap (see `NothingKept`)."""
    t = result.thresholds
    failed = {r.trace_id for r in result.facts if r.success is False}
    n_failed, n_ok = len(failed), sum(1 for r in result.facts if r.success is True)
    unknown = len(result.facts) - n_failed - n_ok
    untouched = sum(1 for x in failed if not result.findings.get(x))
    near = []
    for s in result.scored:
        if s.kept or not s.failed_lacking:
            continue
        missed, short = _missed(s, t)
        near.append((short, -s.failed_lacking, s.candidate.key, s, missed))
    near.sort(key=lambda item: item[:3])
    nearest = tuple(NearMiss(s.candidate.key, s.failed_lacking, round(s.coverage, 4),
                             None if s.delta is None else round(s.delta, 4), s.stability,
                             missed, s.why) for *_, s, missed in near[:limit])  # fmt: skip
    steps = []
    if not n_failed and not n_ok:
        steps.append("outcomes: no run has one; record them (`tracegym outcome RUN_ID "
                     "--success/--failure`, or import runs with their rewards): analysis "
                     "contrasts failed runs with successful ones")  # fmt: skip
    elif not n_failed:
        steps.append("nothing to explain: no run failed")
    else:
        if unknown:
            steps.append(f"outcomes: {unknown} {'run has' if unknown == 1 else 'runs have'} "
                         "none; `tracegym outcome RUN_ID "
                         "--success/--failure` adds them to the contrast")  # fmt: skip
        if not n_ok:
            steps.append("outcomes: no run succeeded, so nothing tells a failing behaviour from "
                         "what every run does; record the successes too")  # fmt: skip
        unstable = [m for m in nearest if m.missed and all(x.startswith("stable")
                                                           for x in m.missed)]  # fmt: skip
        if n_failed < FEW_RUNS or n_ok < FEW_RUNS or unstable:
            why = (f"{len(unstable)} of the nearest candidates pass coverage and delta but not "
                   "the bootstrap" if unstable else
                   f"with {failed_runs(n_failed)} one run moves coverage by "
                   f"{1 / n_failed:.0%}")  # fmt: skip
            steps.append(f"more runs: {n_failed} failed and {n_ok} successful so far; {why}")
        if untouched and not judged:
            steps.append(f"--judge-url URL --judge-model NAME: {untouched} of the "
                         f"{failed_runs(n_failed)} have no finding from any detector; an LLM "
                         "judge proposes "
                         "and labels capabilities the detectors do not see (it sends summaries "
                         "of the runs to that server)")  # fmt: skip
        if nearest:
            steps.append("to look closer (exploratory, not a verdict): lower --min-delta or "
                         "--min-stability, or analyse one agent or task with --where")  # fmt: skip
    return NothingKept(n_failed, n_ok, unknown, untouched, nearest, tuple(steps))


def render_nothing_kept(console: Console, empty: NothingKept) -> None:
    """Why no gap was kept and what to do next, under the (empty) gaps table."""
    console.print(f"[bold]No gap kept.[/] {empty.untouched} of {failed_runs(empty.failed)} "
                  f"{'has' if empty.failed == 1 else 'have'} no finding from any detector.",
                  highlight=False)  # fmt: skip
    if empty.nearest:
        console.print("Nearest candidates (what each missed):")
        for m in empty.nearest:
            delta = "-" if m.delta is None else f"{m.delta:.2f}"
            missed = "; ".join(m.missed) or m.why
            console.print(f"  {escape(m.key)}: {failed_runs(m.failed_runs)}, coverage "
                          f"{m.coverage:.2f}, delta {delta}, stable {m.stability}: "
                          f"{escape(missed)}", highlight=False)  # fmt: skip
    for step in empty.next_steps:
        console.print(f"Next: {escape(step)}", highlight=False)
