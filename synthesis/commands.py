"""The synthesis commands: `tracegym synthesize` and `tracegym envs list/show/sample/check`.

Registered on the main app by `register(app, home_of, fail)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from tracegym.cli_options import HomeOption, JsonOption, existing_home, print_json, table_console

if TYPE_CHECKING:  # the pipeline is imported when a command runs (the CLI starts fast)
    from tracegym.synthesis.pipeline import SynthesisReport


def load_policy(name: str) -> Any:
    """`noisy-oracle:0.1`, `oracle`, `random`, `null`, `all-tools`, or `module:callable` (a
    zero-argument factory returning a policy callable)."""
    from tracegym.synthesis.calibrate import scripted_policy

    head = name.partition(":")[0]
    if head in ("oracle", "null", "random", "all-tools", "noisy-oracle"):
        return scripted_policy(name)
    import importlib

    module, _, attr = name.partition(":")
    if not attr:
        raise ValueError(
            f"--policy {name!r}: use a scripted policy (noisy-oracle:P, oracle, "
            "random, null, all-tools) or module:factory"
        )
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--policy {name!r}: {exc}") from None


def render_report(console: Console, report: SynthesisReport) -> None:
    console.print(
        f"[bold]{len(report.environments)} environment(s)[/] from "
        f"{escape(report.gaps_path)} (tools from {escape(report.catalog_source)})"
    )
    if report.environments:
        table = Table()
        for column in ("environment", "family", "gap", "action", "pass@1", "in band"):
            table.add_column(column)
        for env in report.environments:
            cal = env.calibration
            table.add_row(
                escape(env.env_id),
                env.family,
                escape(str(env.name)),
                escape(str(env.action)),
                "-" if not cal else f"{cal.pass_at_1:.2f}",
                "-" if not cal else ("yes" if cal.in_band else "no"),
            )
        console.print(table)
    missing = report.without_environment
    if missing:
        console.print(f"[bold]{len(missing)} gap(s) without an environment[/]")
    for item in missing:
        checks = f" [{', '.join(item.failed_checks)}]" if item.failed_checks else ""
        console.print(
            f"[yellow]{escape(item.stage.value)}[/] {escape(str(item.gap_name or item.gap_id))} "
            f"({escape(str(item.detector or '-'))}){escape(checks)}: {escape(item.reason)}"
        )


def render_rules(console: Console, rules: list[dict[str, Any]]) -> None:
    """The rules an environment enforces (`MinedRule.to_dict()`s), with their evidence."""
    if not rules:
        console.print("rules: none mined")
        return
    console.print(f"rules: {len(rules)} mined from the agent's successful runs")
    for rule in rules:
        confidence = rule.get("confidence")
        shown = "-" if not isinstance(confidence, (int, float)) else f"{confidence:.2f}"
        console.print(
            f"  {escape(str(rule.get('statement') or rule.get('tool')))} "
            f"(support {rule.get('support', 0)}, abstained {rule.get('abstained', 0)}, "
            f"confidence {shown}, failed runs {rule.get('failed_runs', 0)}, "
            f"evidence {len(rule.get('evidence_runs') or [])} run(s))",
            highlight=False,
        )


def register(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """Add `synthesize` and the `envs` command group to `app`."""

    @app.command()
    def synthesize(
        ctx: typer.Context,
        gaps: Annotated[
            Path | None,
            typer.Option("--gaps", help="gaps.json to read (default: <home>/gaps.json)."),
        ] = None,
        policy: Annotated[
            str | None,
            typer.Option(
                "--policy",
                help="Calibrate the knobs against this policy: noisy-oracle:P, or "
                "module:factory returning a policy(observation, info) callable.",
            ),
        ] = None,
        train: Annotated[int, typer.Option("--train", min=1, help="Train tasks to export.")] = 500,
        heldout: Annotated[
            int, typer.Option("--heldout", min=1, help="Held-out tasks to export.")
        ] = 200,
        seeds: Annotated[
            int, typer.Option("--seeds", min=10, help="Seeds per validity check.")
        ] = 200,
        as_json: JsonOption = False,
        home: HomeOption = None,
    ) -> None:
        """Turn each capability gap into a verified training environment under <home>/envs/."""
        from tracegym.synthesis.pipeline import GapsFileError
        from tracegym.synthesis.pipeline import synthesize as run

        target = existing_home(home_of(ctx, home), fail)
        factory = None
        if policy:
            try:
                factory = load_policy(policy)
            except ValueError as exc:
                fail(str(exc))
        try:
            report = run(
                target,
                gaps,
                factory,
                n_train=train,
                n_heldout=heldout,
                validity_seeds=seeds,
                policy_name=policy,
            )
        except GapsFileError as exc:
            fail(str(exc))
        if as_json:
            print_json(report.body())
            return
        render_report(table_console(), report)

    envs = typer.Typer(
        help="The registered environments: list, show, sample, check.", no_args_is_help=True
    )
    app.add_typer(envs, name="envs")

    def _registry(ctx: typer.Context, home: Path | None) -> tuple[Path, Any]:
        from tracegym.synthesis import registry

        return existing_home(home_of(ctx, home), fail), registry

    @envs.command("list")
    def list_(ctx: typer.Context, as_json: JsonOption = False, home: HomeOption = None) -> None:
        """The registered environments."""
        target, registry = _registry(ctx, home)
        try:
            items = registry.list_envs(target)
        except registry.RegistryError as exc:
            fail(str(exc))
        if as_json:
            print_json([item.to_dict() for item in items])
            return
        console = table_console()
        table = Table()
        for column in ("environment", "family", "gap", "train", "held-out", "pass@1", "valid"):
            table.add_column(column)
        for item in items:
            pass_at_1 = item.calibration.pass_at_1 if item.calibration else None
            table.add_row(
                escape(item.env_id),
                item.family,
                escape(str(item.gap_name)),
                str(item.tasks.train),
                str(item.tasks.heldout),
                "-" if pass_at_1 is None else f"{pass_at_1:.2f}",
                "yes" if item.validity.ok else "no",
            )
        console.print(table)
        console.print(
            f"{len(items)} environment(s) under {escape(str(registry.envs_dir(target)))}",
            style="dim",
        )

    @envs.command("show")
    def show(
        ctx: typer.Context,
        env_id: Annotated[str, typer.Argument(help="Environment id.")],
        as_json: JsonOption = False,
        home: HomeOption = None,
    ) -> None:
        """One environment: its gap, tools and roles, knobs, validity and calibration."""
        target, registry = _registry(ctx, home)
        try:
            data = registry.detail(target, env_id)
        except registry.RegistryError as exc:
            fail(str(exc))
        if as_json:
            print_json(data.to_dict())
            return
        console = table_console()
        spec = data.spec
        roles = spec.roles
        console.print(f"[bold]{escape(env_id)}[/] ({spec.family}) at {escape(str(data.path))}")
        console.print(escape(spec.description), highlight=False)
        gap = spec.gap
        console.print(
            f"gap: {escape(str(gap.get('name')))} ({gap.get('id')}), "
            f"detector {escape(str(gap.get('detector')))}"
        )
        table = Table("role", "tool", show_header=True)
        for role in ("finder", "owner", "lookup", "action", "answer_tool"):
            if roles.get(role):
                table.add_row(role, escape(roles[role]))
        for other in roles.get("others", []):
            table.add_row("other", escape(other))
        console.print(table)
        console.print(f"knobs: {json.dumps(spec.knobs)}")
        render_rules(console, (spec.extra or {}).get("rules") or [])
        console.print(f"seeds: train {list(spec.train_seeds)}, held-out {list(spec.heldout_seeds)}")
        if data.validity:
            for check in data.validity.checks:
                mark = "[green]ok[/]" if check.ok else "[red]FAIL[/]"
                console.print(f"  {mark} {check.name}: {escape(check.detail)}")
        cal = data.calibration
        if cal:
            console.print(
                f"calibrated against {escape(str(cal.get('policy')))}: pass@1 "
                f"{cal['pass_at_1']:.2f}, pass@{cal['k']} {cal['pass_at_k']:.2f}, "
                f"{'in' if cal['in_band'] else 'outside'} the band {cal['band']}"
            )

    @envs.command("sample")
    def sample(
        ctx: typer.Context,
        env_id: Annotated[str, typer.Argument(help="Environment id.")],
        seed: Annotated[int | None, typer.Option("--seed", help="Task seed.")] = None,
        heldout: Annotated[
            bool, typer.Option("--heldout", help="From the held-out range.")
        ] = False,
        as_json: JsonOption = False,
        home: HomeOption = None,
    ) -> None:
        """One task (system prompt, tools, first message) and its oracle episode."""
        target, registry = _registry(ctx, home)
        try:
            data = registry.sample(target, env_id, seed, "heldout" if heldout else "train")
        except registry.RegistryError as exc:
            fail(str(exc))
        if as_json:
            print_json(data)
            return
        console = table_console()
        task = data["task"]
        console.print(
            f"[bold]{escape(task['task_id'])}[/] ({task['split']}, at most "
            f"{task['max_steps']} steps)"
        )
        console.print(f"[bold]system:[/] {escape(task['system_prompt'])}", highlight=False)
        console.print("[bold]tools:[/] " + ", ".join(t["function"]["name"] for t in task["tools"]))
        console.print(f"[bold]user:[/] {escape(task['observation']['content'])}", highlight=False)
        console.print("[bold]oracle episode:[/]")
        for message in data["oracle"]["messages"][2:]:  # after the system prompt and request
            if message.get("tool_calls"):
                call = message["tool_calls"][0]["function"]
                text = f"{call['name']} {call['arguments']}"
            else:
                text = str(message["content"])
            if len(text) > 300:
                text = text[:297] + "..."
            console.print(f"  [cyan]{message['role']}[/]: {escape(text)}", highlight=False)
        console.print(f"reward {data['oracle']['reward']}")

    @envs.command("check")
    def check(
        ctx: typer.Context,
        env_id: Annotated[str | None, typer.Argument(help="Environment id (default: all).")] = None,
        seeds: Annotated[int, typer.Option("--seeds", min=10, help="Seeds per check.")] = 200,
        as_json: JsonOption = False,
        home: HomeOption = None,
    ) -> None:
        """Re-run the validity checks (fidelity to the traces among them); exit code 1 when any
        environment fails."""
        from tracegym.synthesis.validity import check_environment

        target, registry = _registry(ctx, home)
        try:
            ids = [env_id] if env_id else [e.env_id for e in registry.list_envs(target)]
            if env_id:
                registry.entry(target, env_id)
        except registry.RegistryError as exc:
            fail(str(exc))
        reports = []
        for name in ids:
            try:
                env = registry.load(target, name)
                reports.append(check_environment(env, seeds).to_dict())
            except Exception as exc:
                reports.append(
                    {
                        "env_id": name,
                        "ok": False,
                        "seconds": 0.0,
                        "checks": [
                            {"name": "load", "ok": False, "detail": f"{type(exc).__name__}: {exc}"}
                        ],
                    }
                )
        if as_json:
            print_json(reports)
        else:
            console = table_console()
            for report in reports:
                verdict = "[green]valid[/]" if report["ok"] else "[red]INVALID[/]"
                console.print(
                    f"[bold]{escape(report['env_id'])}[/] {verdict} ({report['seconds']:.1f} s)"
                )
                for c in report["checks"]:
                    mark = "[green]ok[/]" if c["ok"] else "[red]FAIL[/]"
                    console.print(f"  {mark} {c['name']}: {escape(c['detail'])}", highlight=False)
            if not reports:
                console.print(f"no environments under {escape(str(registry.envs_dir(target)))}")
        if any(not r["ok"] for r in reports):
            raise typer.Exit(1)
