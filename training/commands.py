"""The training commands: `tracegym train`, `evaluate` and `adapters list/show`.

Registered on the main app by `register(app, home_of, fail)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
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
)

if TYPE_CHECKING:
    from tracegym.generation.model import LoadOptions
    from tracegym.training.adapters import AdapterMetadata


ChatTemplateOption = Annotated[
    Path | None,
    typer.Option(
        "--chat-template",
        help="A Jinja chat template that can express tools (checked before any weights load).",
    ),
]
DtypeOption = Annotated[
    str | None, typer.Option(help="auto, float32, bfloat16 or float16 (default: float32).")
]
DeviceMapOption = Annotated[
    str | None, typer.Option("--device-map", help="Passed to from_pretrained (e.g. auto).")
]
QuantizeOption = Annotated[
    str | None, typer.Option(help="4bit or 8bit (needs a CUDA GPU and bitsandbytes).")
]


def load_options(
    dtype: str | None,
    device_map: str | None,
    quantize: str | None,
    fail: Any,
    chat_template: Path | None = None,
) -> LoadOptions:
    """The flags as LoadOptions, checked (quantize on a CPU included) before anything loads."""
    from tracegym.generation.model import LoadOptions, ModelError

    try:
        options = LoadOptions(
            dtype=dtype,
            device_map=device_map,
            quantize=quantize,
            chat_template=str(chat_template) if chat_template is not None else None,
        )
        options.from_pretrained_kwargs()
    except ModelError as exc:
        fail(str(exc))
    return options


def check_template(folder: Path, chat_template: Path | None, fail: Any) -> None:
    """The model's template, or --chat-template's, must express tools: training and evaluation
    render in it (config and tokenizer only, so a bad model ends before any weights load)."""
    from tracegym.generation.model import ModelError, require_tool_template

    try:
        require_tool_template(folder, chat_template)
    except ModelError as exc:
        fail(str(exc))


_PHASES = {
    "sample": ("rejection sampling", "rollouts"),
    "sft": ("SFT", "steps"),
    "grpo": ("GRPO", "steps"),
    "evaluate": ("held-out evaluation", "tasks"),
}


def _step_info(step: Any) -> str:
    """A TrainStep's numbers as short text: loss, sampled reward, share kept."""
    parts = []
    if step.loss is not None:
        parts.append(f"loss {step.loss:.4f}")
    if step.reward is not None:
        parts.append(
            f"kept {step.reward:.0%}" if step.phase == "sample" else f"reward {step.reward:.3f}"
        )
    return ", ".join(parts)


def train_progress(quiet: bool = False) -> tuple[Any, Any]:
    """A Rich progress bar (on stderr, drawn only on a terminal) with one bar per training phase,
    and the `on_step` callback that drives it (training.sft.TrainStep). When a phase completes,
    a line says so (also when not a terminal, so logs show it); `quiet` prints nothing."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    bar = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, disable=quiet or not console.is_terminal,
    )  # fmt: skip
    tasks: dict[str, Any] = {}

    def on_step(step: Any) -> None:
        label, unit = _PHASES.get(step.phase, (step.phase, "steps"))
        info = _step_info(step)
        if step.phase not in tasks:
            tasks[step.phase] = bar.add_task(label, total=step.total, info=info)
        bar.update(tasks[step.phase], completed=step.done, total=step.total, info=info)
        if step.done >= step.total and not quiet:
            text = f"{step.phase}: {step.done}/{step.total} {unit}" + (f", {info}" if info else "")
            bar.console.print(escape(text), highlight=False)

    return bar, on_step


def register(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """Add `train`, `evaluate` and the `adapters` group to `app`."""

    def _home(ctx: typer.Context, home: Path | None) -> Path:
        return existing_home(home_of(ctx, home), fail)

    @app.command()
    def train(
        ctx: typer.Context,
        env_id: Annotated[str, typer.Argument(help="A registered environment.")],
        model: ModelOption = "smollm2",
        mode: Annotated[str, typer.Option(help="sft or grpo (grpo starts from SFT).")] = "sft",
        steps: Annotated[int | None, typer.Option(min=1)] = None,
        lr: Annotated[float | None, typer.Option(min=0)] = None,
        rank: Annotated[int | None, typer.Option(min=1)] = None,
        alpha: Annotated[int | None, typer.Option(min=1)] = None,
        targets: Annotated[
            str | None, typer.Option(help="Comma-separated module names (q_proj,v_proj,...).")
        ] = None,
        samples: Annotated[
            int, typer.Option(min=0, help="Rejection-sampling rollouts per train seed.")
        ] = 0,
        train_seeds: Annotated[int | None, typer.Option(min=1)] = None,
        warm_start_steps: Annotated[
            int | None, typer.Option(min=0, help="grpo: SFT steps first (default: --steps).")
        ] = None,
        grpo_lr: Annotated[
            float | None, typer.Option(min=0, help="grpo: learning rate (default: --lr).")
        ] = None,
        eval_seeds: Annotated[int, typer.Option(min=1)] = 20,
        no_eval: Annotated[bool, typer.Option("--no-eval")] = False,
        chat_template: ChatTemplateOption = None,
        dtype: DtypeOption = None,
        device_map: DeviceMapOption = None,
        quantize: QuantizeOption = None,
        as_json: JsonOption = False,
        home: HomeOption = None,
    ) -> None:
        """Train (and evaluate) the LoRA adapter of one environment's capability."""
        from tracegym.generation.model import ModelError, ensure_model
        from tracegym.synthesis import registry
        from tracegym.training.adapters import AdapterMetadata
        from tracegym.training.sft import NoTrainingData, default_config, train_capability

        target = _home(ctx, home)
        if mode not in ("sft", "grpo"):
            fail(f"--mode must be sft or grpo, not {mode!r}")
        options = load_options(dtype, device_map, quantize, fail, chat_template)
        try:
            env = registry.load(target, env_id)
            folder = ensure_model(target, model)
        except (registry.RegistryError, ModelError) as exc:
            fail(str(exc))
        check_template(folder, chat_template, fail)
        overrides: dict[str, Any] = {"mode": mode, "samples": samples}
        for key, value in (
            ("steps", steps),
            ("lr", lr),
            ("rank", rank),
            ("alpha", alpha),
            ("train_seeds", train_seeds),
            ("warm_start_steps", warm_start_steps),
            ("grpo_lr", grpo_lr),
        ):
            if value is not None:
                overrides[key] = value
        if targets:
            overrides["targets"] = [t.strip() for t in targets.split(",") if t.strip()]
        config = default_config(model, **overrides)
        bar, on_step = train_progress(quiet=as_json)
        try:
            with bar:
                meta = train_capability(
                    target,
                    env,
                    folder,
                    config,
                    eval_seeds=eval_seeds,
                    evaluate=not no_eval,
                    on_step=on_step,
                    load=options,
                )
        except NoTrainingData as exc:
            fail(str(exc))
        if as_json:
            print_json(meta)
            return
        _print_adapter(AdapterMetadata.from_dict(meta))

    @app.command()
    def evaluate(
        ctx: typer.Context,
        adapter_ids: Annotated[
            list[str] | None, typer.Argument(help="Adapters to evaluate (default: all).")
        ] = None,
        model: Annotated[
            str | None,
            typer.Option(
                "--model", help="Base model (default: the one the adapters were trained on)."
            ),
        ] = None,
        eval_seeds: Annotated[int, typer.Option(min=1)] = 20,
        embedder: EmbedderOption = "minilm",
        chat_template: ChatTemplateOption = None,
        dtype: DtypeOption = None,
        device_map: DeviceMapOption = None,
        quantize: QuantizeOption = None,
        as_json: JsonOption = False,
        home: HomeOption = None,
    ) -> None:
        """Held-out success of base, base + adapter and base + router, with 95% intervals."""
        from tracegym.generation.model import ModelError, ensure_model, load_policy
        from tracegym.synthesis import registry
        from tracegym.training import adapters
        from tracegym.training.evaluate import (
            EvalJob,
            EvaluationRow,
            evaluate_job,
            render_markdown,
        )
        from tracegym.training.router import (
            Router,
            RoutingAccuracy,
            embedder_named,
            heldout_tasks,
            rounded,
            routing_accuracy,
        )

        target = _home(ctx, home)
        registered = adapters.all_metadata(target)
        known = [a.adapter_id for a in registered]
        chosen = adapter_ids or known
        missing = [a for a in chosen if a not in known]
        if missing or not chosen:
            fail(f"no adapter {', '.join(missing)}" if missing else "no adapters registered")
        bases = {a.base_model.folder for a in registered}
        if model is None and len(bases) > 1:
            fail(f"the adapters were trained on different base models ({len(bases)}): --model")
        options = load_options(dtype, device_map, quantize, fail, chat_template)
        try:
            folder = ensure_model(target, model) if model else Path(bases.pop())
            check_template(folder, chat_template, fail)
            policy = load_policy(
                folder,
                dtype=options.dtype,
                device_map=options.device_map,
                quantize=options.quantize,
                chat_template=options.chat_template,
            )
        except ModelError as exc:
            fail(str(exc))
        peft_model = adapters.load_adapters(policy.model, target, known)
        router = Router.from_registry(target, embedder_named(embedder, target), promoted_only=False)

        def route(env: Any, seed: int) -> dict[str, float]:
            return rounded(router.weights(env.make_task(seed).instruction))

        rows: list[EvaluationRow] = []
        for adapter_id in chosen:
            meta = adapters.metadata(target, adapter_id)
            envs = [registry.load(target, env_id) for env_id in meta.env_ids]
            job = EvalJob.spread(envs, adapter_id, eval_seeds)
            row = EvaluationRow.from_dict(
                evaluate_job(peft_model, policy.tokenizer, job, name=policy.name, route=route)
            )
            adapters.update_metadata(
                target, adapter_id, eval=row, promoted=row.promoted, promotion=row.reason
            )
            rows.append(row)
        routing = RoutingAccuracy.from_dict(
            routing_accuracy(router, heldout_tasks(target, known, eval_seeds))
        )
        if as_json:
            print_json({"rows": [row.to_dict() for row in rows], "routing": routing.to_dict()})
            return
        console = table_console()
        console.print(render_markdown(rows), markup=False, highlight=False)
        tasks = f"{routing.n} task{'' if routing.n == 1 else 's'}"
        console.print(f"routing accuracy: {routing.accuracy} over {tasks}")

    group = typer.Typer(help="The trained LoRA adapters: list, show, export.", no_args_is_help=True)
    app.add_typer(group, name="adapters")

    @group.command("list")
    def list_(ctx: typer.Context, as_json: JsonOption = False, home: HomeOption = None) -> None:
        """The registered adapters."""
        from tracegym.training import adapters

        items = adapters.all_metadata(_home(ctx, home))
        if as_json:
            print_json([a.to_dict() for a in items])
            return
        table = Table()
        for column in (
            "adapter",
            "capability",
            "base",
            "rank",
            "steps",
            "base",
            "adapted",
            "promoted",
        ):
            table.add_column(column)
        for a in items:
            row = a.metrics.eval
            table.add_row(
                escape(a.adapter_id),
                escape(a.capability.name),
                escape(a.base_model.name),
                str(a.hyperparameters.get("rank")),
                str(a.hyperparameters.get("steps")),
                f"{row.base.rate:.2f}" if row else "-",
                f"{row.adapter.rate:.2f}" if row else "-",
                "yes" if a.promoted else "no",
            )
        console = table_console()
        console.print(table)
        console.print(f"{len(items)} adapter(s)", style="dim")

    @group.command("show")
    def show(
        ctx: typer.Context,
        adapter_id: Annotated[str, typer.Argument()],
        as_json: JsonOption = False,
        home: HomeOption = None,
    ) -> None:
        """One adapter's metadata: capability, base model, data, settings, metrics."""
        from tracegym.training import adapters

        target = _home(ctx, home)
        try:
            meta = adapters.metadata(target, adapter_id)
            shown = adapters.show(target, adapter_id) if as_json else None
        except adapters.AdapterError as exc:
            fail(str(exc))
        if as_json:
            print_json(shown)
            return
        _print_adapter(meta)

    @group.command("export")
    def export(
        ctx: typer.Context,
        target: Annotated[Path, typer.Argument(help="Folder to write the adapters to.")],
        base_model: Annotated[
            str | None,
            typer.Option(
                "--base-model",
                help="The base model's name in each adapter_config.json (default: the name "
                "the adapters were trained on).",
            ),
        ] = None,
        home: HomeOption = None,
    ) -> None:
        """Write the promoted adapters as plain peft folders for vLLM or SGLang, and print
        their command lines."""
        from tracegym.store.home import DocumentError
        from tracegym.training import adapters

        source = _home(ctx, home)
        try:
            manifest = adapters.export_adapters(source, target, base_model=base_model)
        except (adapters.AdapterError, DocumentError) as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"cannot write to {target}: {exc.strerror or exc}")
        root = target.resolve()
        typer.echo(f"exported {len(manifest.adapters)} adapter(s) to {root}")
        typer.echo(f"vLLM:   {manifest.vllm_command(root)}")
        typer.echo(f"SGLang: {manifest.sglang_command(root)}")


def _print_adapter(meta: AdapterMetadata) -> None:
    from tracegym.training.sft import TrainConfig, TrainMetrics

    console = table_console()
    console.print(f"[bold]{escape(meta.adapter_id)}[/]: {escape(meta.capability.name)}")
    base = meta.base_model
    console.print(f"  base model: {escape(base.name)} ({base.hash})", highlight=False)
    console.print(f"  data: {meta.data_hash}  created: {meta.created_at}", highlight=False)
    hp = TrainConfig.from_dict(meta.hyperparameters)
    console.print(
        f"  {hp.mode}: rank {hp.rank}, alpha {hp.alpha}, {hp.steps} steps, "
        f"lr {hp.lr}, targets {', '.join(hp.targets)}",
        highlight=False,
    )
    train = TrainMetrics.from_dict(meta.metrics.train)
    console.print(
        f"  train: loss {train.loss_first} -> {train.loss_last}, "
        f"{train.tokens_per_second} tokens/s",
        highlight=False,
    )
    row = meta.metrics.eval
    if row:
        b, a = row.base, row.adapter
        console.print(
            f"  held-out: base {b.rate:.2f} {list(b.ci95)} -> adapter {a.rate:.2f} "
            f"{list(a.ci95)} (n={a.n})",
            highlight=False,
        )
    state = "promoted" if meta.promoted else "not promoted"
    console.print(f"  {state}: {escape(meta.promotion)}")


__all__ = ["register", "train_progress"]
