"""`tracegym demo`: the main job end to end on a bundled agent (`--agent shop` or `clinic`).

The agent is written as users write one (`examples/openai_agent.py`: the `openai` client with
`tools=`, traced by `tg.instrument("openai")` and its own `@tg.tool` functions), and its model
calls go to `tracegym serve` (the local backend, in this process, on a loopback port).

    prepare   the policy: SmolLM2 (or any model) plus a short base fine-tune on demonstrations
              whose task mix is uneven (the domain's `base_mix`: some requests common, others
              rare), cached under <home>/models/ after the first time
    dev       the base agent on the development tasks, traced into <home> like any user's agent
    nightly   tracegym's nightly job: compaction, analysis (gaps), synthesis (environments),
              training (one adapter per gap), evaluation (promotion)
    heldout   the base agent and the routed agent on the held-out tasks, also traced: `serve`
              holds the promoted adapters and routes each conversation to one of them (or
              none); a conversation routed to none is the base agent's, run once
    report    <home>/demo/report.md and report.json: gaps (coverage, delta, an example failed
              run and its attributed step), environments, adapters, held-out success before and
              after with 95% Wilson intervals, and where to look next

Nothing in analysis, synthesis or training is told which requests are weak: the mix shapes
the base model only, and the nightly job reads nothing but the traces. Each stage's result is
written under <home>/demo/stages/, so a rerun reuses the model, and the dev runs when the
settings are the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import tracegym as tg
from tracegym.analysis.gap import GapsDocument
from tracegym.examples.domains import SHOP, Domain, domain_named
from tracegym.examples.lm_agent import CustomerNotes
from tracegym.examples.openai_agent import OpenAIAgent, first_messages
from tracegym.generation.chat_tokens import Conversation
from tracegym.generation.model import ensure_model, load_policy, save_policy, weights_hash
from tracegym.jobs.nightly import NightlyConfig, NightlyRun, nightly
from tracegym.store.home import DocumentError, Home, read_json, write_json
from tracegym.training import adapters, sft
from tracegym.training.evaluate import gain, rate
from tracegym.training.router import Router, embedder_named
from tracegym.training.sft import TrainStep, default_config


def normalise_mix(
    mix: Mapping[str, float], kinds: tuple[str, ...] = SHOP.kinds
) -> dict[str, float]:
    """A task mix over every request kind (in `kinds` order, absent kinds 0), summing to 1
    (rounded to 6 digits, so that the same mix keys the same cached model). Raises ValueError
    on an unknown kind, a weight that is negative or not finite, or an all-zero mix."""
    unknown = [k for k in mix if k not in kinds]
    if unknown:
        raise ValueError(f"unknown request kind {unknown[0]!r} (known: {', '.join(kinds)})")
    for kind, weight in mix.items():
        if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"the weight of {kind!r} must be a finite number >= 0, not {weight!r}")
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("the mix needs at least one weight above 0")
    return {k: round(mix.get(k, 0.0) / total, 6) for k in kinds}


def parse_mix(text: str, kinds: tuple[str, ...] = SHOP.kinds) -> dict[str, float]:
    """`status=0.1,cancel=0.4,refund=0.1,address=0.4` as a normalised mix (kinds not named get
    0; weights need not sum to 1). Raises ValueError with a message fit for the command line."""
    mix: dict[str, float] = {}
    for item in text.split(","):
        kind, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not kind:
            raise ValueError(f"expected KIND=WEIGHT, got {item.strip()!r} (e.g. {_MIX_EXAMPLE})")
        if kind in mix:
            raise ValueError(f"{kind!r} is given twice")
        try:
            mix[kind] = float(value)
        except ValueError:
            raise ValueError(f"the weight of {kind!r} is not a number: {value!r}") from None
    return normalise_mix(mix, kinds)


_MIX_EXAMPLE = "status=0.1,cancel=0.4,refund=0.1,address=0.4"

Progress = Callable[[str, int, int], None]  # (what, done, total)
# tokens of a training conversation: the chat template lists every tool's JSON schema in the
# system turn (534 SmolLM2 tokens for the shop's prompt, 660 for the clinic's; about twice as
# many with the tiny model's small vocabulary), and a clinic episode makes up to four calls
MAX_LENGTH = 2048


@dataclass
class DemoConfig:
    """Sizes and models of one demo (`quick()` for a first look)."""

    model: str = "smollm2"
    agent: str = "shop"  # the bundled domain whose agent runs (examples/domains.py)
    seed: int = 0
    dev_tasks: int = 48
    # 96: at 48 the shop's +25 points (26/48 -> 38/48) left 95% intervals overlapping by 0.017
    # (docs/demo.md, run F); the held-out stage is a third of the stages' minutes
    heldout_tasks: int = 96
    base_demos: int = 96
    base_steps: int = 40
    adapter_steps: int = 20
    adapter_train_seeds: int = 32
    # an adapter taught a rule on contrast pairs (a refund only for delivered orders): its
    # steps, at 3e-3 (None: adapter_steps, at the others' rate); 20 steps, or 1e-3, did not
    # teach SmolLM2 the rule on development seed 5 (docs/demo.md)
    contrast_steps: int | None = 40
    eval_seeds: int = 12
    eval_looks: int = 2  # the nightly's evaluation stops an adapter once its decision is clear
    batch_size: int = 24  # dev episodes decoding together: 48 tasks in two waves
    # episodes decoding together where two arms run the same tasks (the nightly's evaluation:
    # base and adapter on every environment; held-out: the base and the routed agent); None:
    # batch_size. A wave lasts as long as its longest episode, and a wider decoding step costs
    # little more on a CPU, so fewer, wider waves win (at 8 and 8 the full size took 18.1 min
    # warm, 5.4 of them held-out: docs/demo.md)
    arms_batch_size: int | None = 48
    max_new_tokens: int = 48
    embedder: str = "minilm"  # or "hash" (no model)
    replay: bool = True  # mix the agent's passing dev runs into adapter training
    replay_max: int | None = None  # at most this many of them (None: all)
    # the nightly's own router column per environment; off: the held-out comparison is the
    # router's real test, on the agent's own tasks (routing accuracy is still measured)
    nightly_router: bool = False
    # held-out: also run the router's weighted mixture of adapters where it differs from the
    # top-1 adapter `serve` routes to (what one LoRA per request costs); a third, smaller arm
    compare_mix: bool = True
    base_train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides
    adapter_train: dict[str, Any] = field(default_factory=dict)
    # the base fine-tune's task mix; None: the domain's `base_mix` (in the shop, status and
    # cancel requests are common, refunds and address changes rare: the agent's uneven
    # competence, which nothing downstream is told). `--mix` sets another
    mix: dict[str, float] | None = None
    # torch threads during the run; None: one for a tiny model (its matmuls are too small to
    # share: on two busy cores two threads made its training 3-4x slower), else torch's default
    threads: int | None = None

    def __post_init__(self) -> None:
        domain = self.domain  # an unknown agent fails here, with the known ones named
        self.mix = normalise_mix(self.mix or domain.base_mix, domain.kinds)

    @property
    def domain(self) -> Domain:
        return domain_named(self.agent)

    @classmethod
    def quick(cls, **overrides: Any) -> DemoConfig:
        """A first look that still shows the loop working: 24 dev and 24 held-out tasks; every
        stage's episodes in one wave (24 dev tasks, the nightly's 2 x 8 seeds per environment,
        48 held-out episodes: a wave lasts as long as its longest episode, and a wider step
        costs little more on a CPU); adapters of 20 LoRA steps of two conversations (12
        demonstrations of the environment and the agent's own passing dev runs): as many
        tokens as 10 steps of 4, twice the updates. 10 steps of 4 promoted no adapter; 20 of one
        with at most 4 dev runs promoted both but helped the agent's own refunds less (see
        docs/demo.md)."""
        sizes = dict(
            dev_tasks=24, heldout_tasks=24, adapter_steps=20, adapter_train_seeds=12,
            adapter_train={"batch_size": 2}, eval_seeds=8, batch_size=24, arms_batch_size=48,
        )  # fmt: skip
        return cls(**{**sizes, **overrides})

    @classmethod
    def tiny(cls, **overrides: Any) -> DemoConfig:
        """The tiny random model's size: it learns nothing whatever the size, so the run only
        has to show every stage working (seconds, not minutes), and the router needs no
        embedding model."""
        sizes = dict(
            model="tiny", dev_tasks=24, heldout_tasks=24, base_demos=16, base_steps=8,
            adapter_steps=6, adapter_train_seeds=8, eval_seeds=4, max_new_tokens=24,
            embedder="hash", contrast_steps=None,
        )  # fmt: skip
        return cls(**{**sizes, **overrides})

    @classmethod
    def for_model(cls, model: str, quick: bool = False, **overrides: Any) -> DemoConfig:
        """The size `tracegym demo` runs: the tiny model's for a tiny model (with or without
        --quick), else --quick's or the full one."""
        if is_tiny(model):
            return cls.tiny(model=model, **overrides)
        return (cls.quick if quick else cls)(model=model, **overrides)

    @property
    def arms_batch(self) -> int:
        return self.arms_batch_size or self.batch_size

    @property
    def tiny_model(self) -> bool:
        return is_tiny(self.model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEV_SETTINGS = ("agent", "dev_tasks", "seed", "batch_size", "max_new_tokens")


def is_tiny(model: str) -> bool:
    """The tiny random test model (`tiny` or `tiny-SEED`), which learns nothing."""
    return model == "tiny" or model.startswith("tiny-")


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `n` for the block (restored after); None: unchanged."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


class DemoDocumentError(DocumentError):
    """A demo document under <home>/demo/ that is not the shape its reader needs."""


@dataclass
class DevRuns:
    """The development runs (`demo/stages/dev.json`), kept for a rerun with the same settings:
    `key` hashes the model and `DEV_SETTINGS`, `results` are `lm_agent.TaskResult.to_dict()`."""

    VERSION: ClassVar[int] = 1

    key: str
    results: list[dict[str, Any]]
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.VERSION, "key": self.key, "results": self.results}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DevRuns:
        if not isinstance(data, Mapping):
            raise DemoDocumentError(f"the dev runs are not a JSON object: {type(data).__name__}")
        key, results, version = data.get("key"), data.get("results"), data.get("version", 0)
        if not isinstance(key, str) or not isinstance(results, list):
            raise DemoDocumentError("the dev runs need a 'key' (text) and 'results' (a list)")
        if not isinstance(version, int) or version > cls.VERSION:
            raise DemoDocumentError(f"the dev runs have version {version!r} (up to {cls.VERSION})")
        return cls(key=key, results=[dict(r) for r in results], version=version)

    @classmethod
    def read(cls, path: Path) -> DevRuns | None:
        """The dev runs at `path`, None when there are none yet."""
        data = read_json(path, None)
        if data is None:
            return None
        try:
            return cls.from_dict(data)
        except DemoDocumentError as error:
            raise DemoDocumentError(f"{path}: {error}") from None


def upper_layers(folder: Path) -> list[int] | None:
    """LoRA on the upper 40% of a deep model's layers: the backward pass stops there, so a step
    costs about half (SmolLM2: 12 of 30 layers). Shallow models train every layer."""
    config = json.loads((Path(folder) / "config.json").read_text())
    n = int(config.get("num_hidden_layers") or 0)
    return list(range(n - n * 2 // 5, n)) if n > 4 else None


def _tasks(
    domain: Domain, seeds: tuple[int, int], n: int, seed: int, weights: Any = None
) -> list[Any]:
    return domain.tasks(seeds, n, offset=seed * 10_000, weights=weights)


# Stages ------------------------------------------------------------------------------------------
def base_demos(config: DemoConfig) -> list[Any]:
    """The base fine-tune's demonstration tasks, their kinds drawn with `config.mix`."""
    domain = config.domain
    weights = [(config.mix or {})[k] for k in domain.kinds]
    return _tasks(domain, domain.demo_seeds, config.base_demos, config.seed, weights)


def base_settings(source: Path, config: DemoConfig) -> tuple[list[Any], dict[str, Any], str]:
    """The base fine-tune's tasks, its TrainConfig overrides, and the cache key of its model
    (the source weights, the mix, the settings and the demonstrations' seeds)."""
    demo_tasks = base_demos(config)
    train = {"steps": config.base_steps, "batch_size": 4, "max_length": MAX_LENGTH, "lr": 1e-3,
             "layers": upper_layers(source), "precision": "auto"}  # fmt: skip
    if config.tiny_model:
        train.update(lr=1e-2, precision="fp32")
    train.update(config.base_train)
    key = _hash({"base": weights_hash(source), "mix": config.mix, "train": train,
                 "demos": [t.seed for t in demo_tasks]})  # fmt: skip
    return demo_tasks, train, key


def prepare_model(home: Path, config: DemoConfig, progress: Progress | None = None) -> Path:
    """The base agent's model: `config.model` fine-tuned briefly on demonstrations drawn with
    `config.mix` (the domain's base mix by default), merged and saved once under
    <home>/models/shop-base-<key>/."""
    source = ensure_model(home, config.model)
    demo_tasks, train, key = base_settings(source, config)
    domain = config.domain
    target = Home.at(home).models / f"{domain.name}-base-{key}"
    if (target / "tracegym_model.json").exists():
        return target
    policy = load_policy(source)
    conversations = [
        Conversation.of(domain.demonstration(t), domain.tool_schemas, domain.rules)
        for t in demo_tasks
    ]
    settings = default_config(policy.name, **train)

    def on_step(step: TrainStep) -> None:
        if progress is not None:
            progress("base fine-tune", step.done, step.total)

    name = f"{domain.name}-base"
    model, _ = sft.train_adapter(policy, conversations, settings, name, on_step=on_step)
    merged = model.merge_and_unload()
    policy.model = merged
    policy.name = f"{policy.name}-{domain.name}"
    save_policy(policy, target)
    return target


# The agent, through `tracegym serve` -------------------------------------------------------------
def local_backend(policy: Any, home: Path, config: DemoConfig, slots: int) -> Any:
    """The backend `tracegym serve` answers the agent from: the policy in process, batched
    (the demo's tests put a scripted one here). Its forward passes take the run's torch threads
    (`torch_threads`): the agents wait on the engine while it steps, so no core is left idle for
    them (serve's own default keeps one back)."""
    import torch
    from tracegym.serving.local import LocalBackend

    return LocalBackend(
        policy.model, policy.chat_format, home=home, slots=slots,
        max_tokens=config.max_new_tokens, name=policy.name, threads=torch.get_num_threads(),
    )  # fmt: skip


@contextlib.contextmanager
def serving(backend: Any, router: Any) -> Iterator[str]:
    """`tracegym serve`'s app over `backend` on a free loopback port, routing with `router`
    (a `serving.ConversationRouter`); yields its /v1 URL."""
    from tracegym.serving.app import create_app
    from tracegym.serving.server import running

    with running(create_app(backend, router)) as url:
        yield f"{url}/v1"


def conversation_router(router: Any, promoted: list[str], base_model: str) -> Any:
    from tracegym.serving.routing import ConversationRouter

    return ConversationRouter(router, promoted, base_model)


def _agent(url: str, config: DemoConfig, split: str, model: str, notes: Any) -> OpenAIAgent:
    return OpenAIAgent(
        url, domain=config.domain, model=model, split=split, notes=notes,
        max_tokens=config.max_new_tokens, max_retries=0, timeout=600.0,
    )  # fmt: skip


def run_agent(
    home: Path,
    policy: Any,
    tasks: list[Any],
    config: DemoConfig,
    split: str,
    *,
    progress: Progress | None = None,
    label: str = "",
    notes: Any = None,
) -> list[dict[str, Any]]:
    """The agent on `tasks`, `config.batch_size` conversations at a time, its model calls
    answered by `tracegym serve` over `policy` (the base model); every run traced into `home`'s
    spool; `notes` are its memory (`lm_agent.CustomerNotes`)."""
    done = [0]

    def tick(_: Any) -> None:
        done[0] += 1
        if progress is not None:
            progress(label or split, done[0], len(tasks))

    backend = local_backend(policy, home, config, slots=config.batch_size)
    with serving(backend, conversation_router(None, [], policy.name)) as url:
        agent = _agent(url, config, split, policy.name, notes)
        results = agent.run_many(tasks, concurrency=config.batch_size, on_done=tick)
    return [r.to_dict() for r in results]


def run_heldout(
    home: Path, folder: Path, tasks: list[Any], config: DemoConfig, embedder: Any,
    notes_file: Path, competent: list[str], progress: Progress | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """The base agent and the routed agent on the same held-out tasks: (base results, routed
    results, routing), both through one `tracegym serve` holding the promoted adapters. The
    routed agent asks for model "auto": the server routes each conversation once, from its
    first user message, to one adapter (what a multi-LoRA server can serve) or to none when
    nothing matches or the request is closer to `competent`, the requests the base agent
    passed in dev. The base agent names the base model. A conversation routed to none is the
    base agent's, so its base run is its routed run too (not a second run that could differ
    only by float rounding in another batch). Both agents' conversations decode in the same
    batches, each with its own adapter; both start from the dev notes in `notes_file`.

    With `config.compare_mix`, a third agent runs the router's weighted mixture of adapters
    (one combined LoRA per mixture, named explicitly as the request's model) where it differs
    from the top-1 choice: what one adapter per request costs against the mix
    (`routing["mix"]`)."""
    from tracegym.serving.protocol import ChatRequest
    from tracegym.training.router import apply_weights, rounded

    policy = load_policy(folder)
    promoted = [a.adapter_id for a in adapters.all_metadata(home) if a.promoted]
    router = None
    if promoted:
        policy.model = adapters.load_adapters(policy.model, home, promoted)
        router = Router.from_registry(home, embedder, promoted_only=True, competent=competent)
    routing = conversation_router(router, promoted, policy.name)
    notes = CustomerNotes(notes_file)
    use: dict[str, str | None] = {}  # the server's top-1 decision per conversation
    mix: dict[str, str | None] = {}  # the weighted mixture's model per conversation
    mixtures: dict[tuple[tuple[str, float], ...], str] = {}
    for task in tasks:
        first = first_messages(config.domain, task.request, notes)
        # asked as the conversation's first request asks it: its requests find it remembered
        use[task.task_id] = routing.decide(ChatRequest({"model": "auto"}, first)).adapter
        if not (config.compare_mix and router is not None):
            continue
        weights = rounded(router.weights(first[-1]["content"]))
        key = tuple(weights.items())
        if len(weights) > 1 and key not in mixtures:
            name = f"mix-{len(mixtures)}"
            mixtures[key] = apply_weights(policy.model, weights, name) or name
        mix[task.task_id] = mixtures.get(key) or (next(iter(weights)) if weights else None)
    routing.adapters += list(mixtures.values())  # named explicitly by the mix agent only
    backend = local_backend(policy, home, config, slots=config.arms_batch)
    with serving(backend, routing) as url:

        def agent(split: str, model: str) -> OpenAIAgent:
            return _agent(url, config, split, model, CustomerNotes(notes_file))

        base_agent = agent("heldout-base", policy.name)
        routed_agent = agent("heldout-routed", "auto")
        adapted = [t for t in tasks if use[t.task_id] is not None]
        items = [(base_agent, t) for t in tasks] + [(routed_agent, t) for t in adapted]
        mixed = [t for t in tasks if t.task_id in mix and mix[t.task_id] != use[t.task_id]]
        items += [(agent("heldout-mix", mix[t.task_id] or policy.name), t) for t in mixed]
        done = [0]

        def one(item: tuple[OpenAIAgent, Any]) -> Any:
            result = item[0].run(item[1])
            done[0] += 1
            if progress is not None:
                progress("held-out: base, routed (and mix)", done[0], len(items))
            return result

        with ThreadPoolExecutor(max_workers=config.arms_batch) as pool:
            rows = [r.to_dict() for r in pool.map(one, items)]
    base = rows[: len(tasks)]
    routed_runs = dict(zip([t.task_id for t in adapted], rows[len(tasks) :], strict=False))
    routed = [routed_runs.get(t.task_id, row) for t, row in zip(tasks, base, strict=True)]
    routes = {t.task_id: ({use[t.task_id]: 1.0} if use[t.task_id] else {}) for t in tasks}
    on_base = len(tasks) - len(adapted)
    report: dict[str, Any] = {"promoted": promoted, "routes": routes, "on_base": on_base}
    if config.compare_mix and router is not None:
        mixed_runs = dict(zip([t.task_id for t in mixed], rows[len(tasks) + len(adapted) :],
                              strict=True))  # fmt: skip
        with_mix = [mixed_runs.get(t.task_id, row) for t, row in zip(tasks, routed, strict=True)]
        report["mix"] = {
            "mixtures": {name: dict(key) for key, name in mixtures.items()},
            "differs": len(mixed),
            "success": rate_row(with_mix),
            "top1_vs_mix": gain(rate_row(with_mix), rate_row(routed)),
        }
    return base, routed, report


def passed_requests(results: list[dict[str, Any]]) -> list[str]:
    """The user's request of each run that passed: what the agent handles without help."""
    return [
        next(m["content"] for m in r["messages"] if m["role"] == "user")
        for r in results
        if r["passed"] and any(m["role"] == "user" for m in r.get("messages") or [])
    ]


# The whole job ---------------------------------------------------------------------------------
def rate_row(results: list[dict[str, Any]]) -> dict[str, Any]:
    return rate(sum(1 for r in results if r["passed"]), len(results))


def by_kind(results: list[dict[str, Any]], kinds: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {k: rate_row([r for r in results if r["kind"] == k]) for k in kinds}


def run(
    home: str | Path,
    config: DemoConfig | None = None,
    *,
    progress: Progress | None = None,
    stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the demo under `home` (see the module docstring); returns the report's data."""
    config = config or DemoConfig()
    threads = config.threads if config.threads is not None else (1 if config.tiny_model else None)
    with torch_threads(threads):
        return _run(Path(home), config, progress, stage)


def _run(
    home: Path,
    config: DemoConfig,
    progress: Progress | None,
    stage: Callable[[str], None] | None,
) -> dict[str, Any]:
    out = Home.at(home).demo
    domain = config.domain
    minutes: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        if stage is not None:
            stage(name)
        started = time.perf_counter()
        value = fn()
        minutes[name] = round((time.perf_counter() - started) / 60, 2)
        return value

    folder = timed("prepare", lambda: prepare_model(home, config, progress))

    def trace() -> None:
        # (again after the dev runs: a new init closes this process's spool file, so the
        # nightly's compaction can take it whole)
        tg.init(service="tracegym-demo", home=home, capture_messages=True)

    trace()
    # what the dev runs depend on (not the nightly's or held-out settings)
    dev_key = _hash({"model": folder.name, **{k: getattr(config, k) for k in DEV_SETTINGS}})
    dev_file = out / "stages" / "dev.json"
    cached = DevRuns.read(dev_file)

    # the agent's memory: what it noted in dev; both held-out agents start from those notes
    notes_file = out / "stages" / "notes.json"

    def dev() -> list[dict[str, Any]]:
        if cached is not None and cached.key == dev_key and notes_file.exists():
            return cached.results
        notes_file.unlink(missing_ok=True)
        notes = CustomerNotes(notes_file)
        policy = load_policy(folder)
        tasks = _tasks(domain, domain.dev_seeds, config.dev_tasks, config.seed)
        results = run_agent(home, policy, tasks, config, "dev", progress=progress, notes=notes)
        notes.save()
        tg.flush()
        write_json(dev_file, DevRuns(key=dev_key, results=results).to_dict())
        return results

    dev_results = timed("dev", dev)
    tg.flush()
    trace()
    lr = 1e-2 if config.tiny_model else 1e-3
    # bf16 autocast where the hardware has it: a SmolLM2 step in about half the time
    precision = "fp32" if config.tiny_model else "auto"
    contrast = {"contrast_steps": config.contrast_steps, "contrast_lr": lr * 3}
    train = {"steps": config.adapter_steps, "train_seeds": config.adapter_train_seeds,
             "batch_size": 4, "max_length": MAX_LENGTH, "layers": upper_layers(folder), "lr": lr,
             "precision": precision, **(contrast if config.contrast_steps else {}),
             **config.adapter_train}  # fmt: skip
    # rehearsal: the agent's own verifier-passing dev conversations go into every adapter's
    # data, so adapters learn the environments' capability without forgetting the agent's
    # conventions (its prompt, finding the customer first)
    replay = out / "stages" / "replay.jsonl"
    passing = [
        Conversation(r["messages"], [dict(t) for t in domain.tool_schemas]).to_dict()
        for r in dev_results
        if r["passed"] and r.get("messages")
    ]
    replay.write_text("".join(json.dumps(c) + "\n" for c in passing[: config.replay_max]))
    night_config = NightlyConfig(
        model=str(folder), train=train, eval_seeds=config.eval_seeds,
        max_new_tokens=config.max_new_tokens, replay=str(replay) if config.replay else None,
        route=config.nightly_router, batch_size=config.arms_batch, eval_looks=config.eval_looks,
    )  # fmt: skip
    embedder = embedder_named(config.embedder, home, fall_back_to_hash=False)

    def night_progress(name: str, message: str) -> None:
        if progress is not None:
            progress(f"nightly {name}: {message}", 0, 0)

    def train_step(step: Any) -> None:
        if progress is not None:
            progress(f"nightly {step.phase} {step.name}", step.done, step.total)

    night = timed("nightly", lambda: nightly(home, night_config, progress=night_progress,
                                              embedder=embedder, on_step=train_step))  # fmt: skip
    heldout = _tasks(domain, domain.heldout_seeds, config.heldout_tasks, config.seed)

    competent = passed_requests(dev_results)

    def heldout_runs() -> Any:
        return run_heldout(home, folder, heldout, config, embedder, notes_file, competent,
                           progress)  # fmt: skip

    base, routed, routing = timed("heldout", heldout_runs)
    tg.flush()
    report = build_report(home, config, folder, dev_results, night, base, routed, routing, minutes)
    write_json(out / "report.json", report)
    tmp = out / ".report.md.tmp"
    tmp.write_text(render_markdown(report))
    os.replace(tmp, out / "report.md")
    return report


def build_report(
    home: Path, config: DemoConfig, folder: Path, dev: list[dict[str, Any]], night: NightlyRun,
    base: list[dict[str, Any]], routed: list[dict[str, Any]], routing: dict[str, Any],
    minutes: dict[str, float],
) -> dict[str, Any]:  # fmt: skip
    """Everything the report says, as data (report.json; the dashboards read it too)."""
    from tracegym.synthesis import registry  # polars: loaded when the report is built

    paths = Home.at(home)
    gaps = list(GapsDocument.read(paths).gaps) if paths.gaps.exists() else []
    before, after = rate_row(base), rate_row(routed)
    disjoint = after["ci95"][0] > before["ci95"][1] if after.get("ci95") else False
    paired = paired_test(base, routed)
    return {
        "config": config.to_dict(),
        "note": TINY_NOTE if config.tiny_model else None,
        "model": str(folder),
        "minutes": minutes,
        "dev": {"success": rate_row(dev), "by_kind": by_kind(dev, config.domain.kinds)},
        "gaps": [
            {
                "id": g.id,
                "name": g.name,
                "detector": g.detector,
                "coverage": g.coverage,
                "delta": g.delta,
                "stability": g.stability,
                "description": g.description,
                "runs": len(g.members),
                "example": g.members[0].to_dict() if g.members else None,
            }
            for g in gaps
        ],
        "environments": [
            {"env_id": e.env_id, "family": e.family, "gap_id": e.gap_id, "gap_name": e.gap_name}
            for e in registry.list_envs(home)
        ],
        "adapters": [
            {
                "adapter_id": a.adapter_id,
                "capability": a.capability.name,
                "promoted": a.promoted,
                "promotion": a.promotion,
                "eval": a.evaluation.to_dict() if a.evaluation is not None else None,
            }
            for a in adapters.all_metadata(home)
        ],
        "nightly": {"date": night.date, "dir": night.dir},
        "heldout": {
            "base": before,
            "routed": after,
            **gain(before, after),
            "intervals_disjoint": disjoint,
            "paired": paired,
            "by_kind": {
                "base": by_kind(base, config.domain.kinds),
                "routed": by_kind(routed, config.domain.kinds),
            },
            "routing": routing,
        },
        "examples": {"base_failed": [r for r in base if not r["passed"]][:3]},
    }


def paired_test(base: list[dict[str, Any]], routed: list[dict[str, Any]]) -> dict[str, Any]:
    """Both agents ran the same held-out tasks: the tasks the routed agent passed and the base
    failed (`fixed`), the other way (`broken`), and the exact one-sided sign test on them (the
    chance of at least `fixed` of the discordant tasks going the routed agent's way if either
    way were equally likely; McNemar's exact test). More telling than the two-proportion test
    at small sizes, since the tasks' own difficulty cancels."""
    by_id = {r["task_id"]: r["passed"] for r in base}
    pairs = [(by_id[r["task_id"]], r["passed"]) for r in routed if r["task_id"] in by_id]
    fixed = sum(1 for b, a in pairs if a and not b)
    broken = sum(1 for b, a in pairs if b and not a)
    n = fixed + broken
    p = sum(math.comb(n, k) for k in range(fixed, n + 1)) / 2**n if n else 1.0
    return {"tasks": len(pairs), "fixed": fixed, "broken": broken, "p_value": round(p, 6)}


def evidence_line(heldout: dict[str, Any]) -> str:
    """How strong the held-out evidence is, in words, with the numbers it rests on."""
    base = heldout["base"]
    paired = heldout.get("paired") or {}
    p_pair = paired.get("p_value", 1.0)
    numbers = (
        f"n = {base['n']} held-out tasks, each run by both agents; {paired.get('fixed', 0)} "
        f"fixed, {paired.get('broken', 0)} broken (exact sign test, one-sided p = {p_pair:.2g}); "
        f"two-proportion test p = {heldout['p_value']:.2g}; the 95% intervals "
        f"{'do not overlap' if heldout['intervals_disjoint'] else 'overlap'}"
    )
    if heldout["gain"] <= 0:
        verdict = "No gain shown"
    elif p_pair < ALPHA and heldout["intervals_disjoint"]:
        verdict = "Strong evidence of a gain"
    elif p_pair < ALPHA:
        verdict = (
            "A gain that is significant at this size, but its size is uncertain (the intervals "
            "overlap; the full size, `tracegym demo`, measures it more tightly)"
        )
    else:
        verdict = f"Weak evidence: not significant at p < {ALPHA}, it could be chance"
    return f"**Evidence:** {verdict}: {numbers}."


ALPHA = 0.05

TINY_NOTE = (
    "This run used the tiny random test model: it learns nothing, so it shows the pipeline "
    "working end to end (tracing, compaction, analysis, synthesis, training when there is an "
    "environment, evaluation, routing), not a gain. Its success rates say nothing about "
    "tracegym's loop: `tracegym demo --quick` or `tracegym demo` (SmolLM2) measure that."
)


def _mix_line(mix: dict[str, float] | None) -> str:
    mix = mix or {}
    shares = ", ".join(f"{k} {v:.0%}" for k, v in mix.items())
    return (
        f"Base fine-tune's request mix: {shares} (shapes the base agent only; nothing "
        "downstream is told)."
    )


def _pct(row: dict[str, Any]) -> str:
    if not row.get("n"):
        return "n/a"
    lo, hi = row["ci95"]
    return f"{row['rate']:.0%} ({row['passed']}/{row['n']}, 95% CI {lo:.0%}-{hi:.0%})"


def _routing_line(heldout: dict[str, Any], routing: dict[str, Any]) -> str:
    n = heldout["base"]["n"]
    on_base = routing.get("on_base", n)
    line = (
        f"`tracegym serve` routed {n - on_base} of {n} held-out conversations to an adapter "
        f"(one per conversation, as a multi-LoRA server serves them); the other {on_base} are "
        "the base agent's, so their base run counts for both agents."
    )
    mix = routing.get("mix")
    if mix:
        line += (
            f" The router's weighted mixture of adapters differed from the top-1 adapter on "
            f"{mix['differs']} of them: with the mixture {_pct(mix['success'])} succeed, against "
            f"{_pct(heldout['routed'])} with one adapter per conversation."
        )
    return line


def render_markdown(report: dict[str, Any]) -> str:
    """The report a person reads (report.md)."""
    h = report["heldout"]
    lines = ["# tracegym demo", ""]
    if report.get("note"):
        lines += [f"**Note:** {report['note']}", ""]
    lines += [
        f"Held-out success: base {_pct(h['base'])} -> routed {_pct(h['routed'])}: "
        f"{h['gain'] * 100:+.1f} points (p={h['p_value']:.3g}; intervals "
        f"{'do not overlap' if h['intervals_disjoint'] else 'overlap'}).",
        "",
        evidence_line(h),
        "",
        _routing_line(h, h.get("routing") or {}),
        "",
        "| request | base | routed |",
        "|---|---|---|",
    ]
    for kind in h["by_kind"]["base"]:
        base, routed = h["by_kind"]["base"][kind], h["by_kind"]["routed"][kind]
        lines.append(f"| {kind} | {_pct(base)} | {_pct(routed)} |")
    lines += ["", _mix_line(report.get("config", {}).get("mix"))]
    lines += ["", f"## Gaps found in {report['dev']['success']['n']} development runs", ""]
    if not report["gaps"]:
        lines.append("No gap passed the thresholds.")
    for g in report["gaps"]:
        lines.append(
            f"- **{g['name']}** ({g['detector']}): coverage {g['coverage']}, delta {g['delta']}, "
            f"stability {g['stability']}. {g.get('description') or ''}"
        )
        ex = g.get("example")
        if ex:
            lines.append(
                f"  - e.g. run `{ex['trace_id']}`, step {ex['step']} ({ex.get('agent')}): "
                f"{ex['evidence']} -> `tracegym show {ex['trace_id']}`"
            )
    lines += ["", "## Environments", ""]
    lines += [
        f"- `{e['env_id']}` ({e['family']}) for {e.get('gap_name')}" for e in report["environments"]
    ]
    if not report["environments"]:
        lines.append(
            "None: synthesis built no environment (the nightly report says why, gap by gap), "
            "so there was nothing to train an adapter on."
        )
    lines += ["", "## Adapters", ""]
    if not report["adapters"]:
        lines.append("None.")
    for a in report["adapters"]:
        state = "promoted" if a["promoted"] else "not promoted"
        lines.append(f"- `{a['adapter_id']}` ({a['capability']}): {state}: {a['promotion']}")
    lines += ["", "## Minutes per stage", ""]
    lines += [f"- {k}: {v}" for k, v in report["minutes"].items()]
    lines += [
        "",
        "## Where to look next",
        "",
        '- `tracegym sql "SELECT agent, count(*), avg(success::int) FROM traces GROUP BY 1"`',
        "- `tracegym show <trace_id>` for any run above",
        f"- the nightly report: `{report['nightly']['dir']}/report.md`",
        "- `tracegym dashboard` to see it all in the browser",
        "",
    ]
    return "\n".join(lines)


__all__ = ["DemoConfig", "build_report", "prepare_model", "render_markdown", "run"]
