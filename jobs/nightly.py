"""The nightly batch job: compaction -> analysis -> synthesis -> training -> evaluation -> report.

    from tracegym.jobs.nightly import nightly, NightlyConfig
    run = nightly(home)                    # or `tracegym nightly`; a NightlyRun

Everything for one night lives under `<home>/nightly/<YYYY-MM-DD>/` (`Home.night(date)`):

    stages/<stage>.json   the stage's result (a StageResult: CompactResult ... ReportResult);
                          written atomically when the stage completes
    report.json           the night's data, for dashboards (NightlyReport)
    report.md             the same as Markdown

Each document is a dataclass in jobs.night_documents (re-exported here) with `to_dict`/`from_dict`
and a version; the JSON keeps the keys it had before the version, so nights written then still
read (as version 0).

Incremental: a stage compares its inputs with the last completed night's (`<home>/nightly/
state.json`, NightlyState) and skips what did not change: analysis runs only when the lake
changed (new runs), synthesis only when gaps.json changed, training only for environments whose
adapter is missing or was trained on other data, base model or settings, evaluation only for
adapters trained tonight (the others keep their numbers).

Safe: a lock file (`<home>/nightly/.lock`, holding the pid) refuses a second concurrent run (a
lock whose process is gone is taken over); every artifact is written to a temporary name and
renamed; after a kill, the next run of the same night skips the stages that completed and redoes
the one that was interrupted (adapters already saved with matching inputs are not retrained).
Each night is appended to `<home>/nightly/history.jsonl` (a NightRecord a line; `read_history`).

One environment's failure does not stop the night: an environment that cannot be trained (no
training examples, a broken spec ...) or an adapter that cannot be evaluated is listed under the
stage's `failed` (id and reason), the stage's status is `partial`, and the night goes on with the
others. A whole stage that fails (analysis, synthesis, loading the base model ...) stops the night
with `NightlyStageError` naming the stage; the stages completed before it are kept.

The `fault` argument (tests) raises `NightlyFault` at a named point: a stage name (just before
its marker is written) or `train:after-adapter` (after the first adapter is saved).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracegym.generation.chat_tokens import Conversation
from tracegym.generation.model import (
    LoadOptions,
    ModelError,
    ensure_model,
    load_policy,
    weights_hash,
)
from tracegym.jobs.night_documents import (
    STAGES,
    AnalyzeResult,
    CompactResult,
    EvaluateResult,
    NightlyDocumentError,
    NightlyReport,
    NightlyState,
    NightRecord,
    ReportAdapter,
    ReportResult,
    StageFailure,
    StageResult,
    SynthesizeResult,
    TrainResult,
    read_history,
    stage_result,
)
from tracegym.store.home import DocumentError, Home, read_json, write_json
from tracegym.store.records import span_record, stable_id, write_spool_file
from tracegym.tracer import semconv as sc
from tracegym.training import adapters, evaluate, sft
from tracegym.training.adapters import AdapterMetadata
from tracegym.training.capabilities import capabilities, env_ids_of
from tracegym.training.evaluate import EvalJob, EvaluationRow, render_markdown
from tracegym.training.router import (
    Router,
    RoutingAccuracy,
    heldout_tasks,
    rounded,
    routing_accuracy,
)


class NightlyBusy(RuntimeError):
    """Another nightly run holds the lock."""


class NightlyFault(RuntimeError):
    """An injected failure (tests)."""


class NightlyStageError(RuntimeError):
    """A whole stage failed (not one environment of it). The night stops there; the stages
    completed before it are kept, so a rerun resumes at this one."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(f"the {stage} stage failed: {_reason(error)}")
        self.stage = stage
        self.error = error


# Raised as they are: a simulated kill, a busy lock, a model that cannot be had (its message
# already says what to do). Anything else a stage raises becomes a NightlyStageError.
_PASS_THROUGH: tuple[type[BaseException], ...] = (NightlyFault, NightlyBusy, ModelError)


@dataclass
class NightlyConfig:
    model: str = "smollm2"  # see model.ensure_model: smollm2, tiny[-SEED] or a folder
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides
    eval_seeds: int = 20
    max_new_tokens: int = 96  # per assistant turn in evaluation rollouts
    route: bool = True  # evaluate the router on each environment too (routing accuracy is
    # measured whenever an embedder is available)
    replay: str | None = None  # JSONL of the agent's passing conversations, mixed into training
    batch_size: int = 8  # evaluation episodes decoding together (base and adapted arms of
    # every environment share the waves when the router column is off)
    adapter_per_action: bool = True  # environments teaching the same action train one adapter
    # (training.capabilities); off: one adapter per environment
    eval_looks: int = 2  # with the router column off: the seeds run in this many rounds and an
    # adapter stops once its decision is clear, p split over the looks (evaluate.settled)
    date: str | None = None  # YYYY-MM-DD (default: today, UTC)
    chat_template: str | None = None  # checked by the command before the night starts
    dtype: str | None = None  # the base model's load options (model.LoadOptions; None: as
    device_map: str | None = None  # before, float32 on one device)
    quantize: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_options(self) -> LoadOptions:
        return LoadOptions(
            dtype=self.dtype,
            device_map=self.device_map,
            quantize=self.quantize,
            chat_template=self.chat_template,
        )


@dataclass
class NightlyRun:
    """What `nightly()` returns: the night, its folder and every stage's result."""

    date: str
    dir: str
    stages: dict[str, StageResult]

    def to_dict(self) -> dict[str, Any]:
        stages = {name: result.to_dict() for name, result in self.stages.items()}
        return {"date": self.date, "dir": self.dir, "stages": stages}


def nightly_dir(home: str | Path) -> Path:
    return Home.at(home).nightly


# Lock ------------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Lock:
    """An exclusive lock file holding the owner's pid; a dead owner's lock is taken over."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held = False

    def acquire(self) -> Lock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    owner = read_json(self.path)
                except (OSError, DocumentError):
                    owner = {}
                if not isinstance(owner, dict):
                    owner = {}
                pid = int(owner.get("pid") or 0)
                if pid and _alive(pid):
                    raise NightlyBusy(
                        f"another nightly run (pid {pid}, since {owner.get('since')}) holds "
                        f"{self.path}"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            # created exclusively (that is the lock), so not through write_json's rename
            with os.fdopen(fd, "w") as handle:
                handle.write(json.dumps({"pid": os.getpid(), "since": _now()}))
            self.held = True
            return self
        raise NightlyBusy(f"could not take {self.path}")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock(home: str | Path) -> Lock:
    return Lock(Home.at(home).nightly_lock)


# Helpers ---------------------------------------------------------------------------------------
def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _hash_json(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _file_hash(path: Path) -> str | None:
    if not path.exists():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _tree_fingerprint(folder: Path) -> str | None:
    """Names and sizes of the files under `folder` (the lake only ever gains files)."""
    if not folder.is_dir():
        return None
    items = sorted(
        (str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*") if p.is_file()
    )
    return _hash_json(items)


def _reason(error: BaseException) -> str:
    """An exception as one line for a report: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _failure(item: str, error: BaseException, **ids: str) -> StageFailure:
    """One environment's (or adapter's) failure as recorded in a stage's `failed` list."""
    return StageFailure(item=item, error=type(error).__name__, reason=_reason(error), **ids)


def _status(failed: list[Any]) -> str:
    return "partial" if failed else "done"


def _completed(stage: str, path: Path) -> StageResult | None:
    """The stage's result when it completed earlier tonight; None when it did not, or when its
    marker cannot be read (the stage is then redone)."""
    try:
        return stage_result(stage, read_json(path))
    except (OSError, DocumentError):
        return None


# The job ---------------------------------------------------------------------------------------
class NightRunner:
    """One night's stages, run in order under `nightly/<date>/`: a stage completed earlier
    tonight is read back, not redone."""

    def __init__(
        self,
        home: Path,
        config: NightlyConfig,
        fault: str | None,
        progress: Callable[[str, str], None] | None,
        embedder: Any,
        on_step: Callable[[Any], None] | None = None,
    ) -> None:
        self.home = home
        self.paths = Home.at(home)
        self.on_step = on_step
        self.config = config
        self.fault = fault
        self.progress = progress or (lambda stage, message: None)
        self.embedder = embedder
        self.date = config.date or time.strftime("%Y-%m-%d", time.gmtime())
        self.dir = self.paths.night(self.date)
        self.previous = NightlyState.read(home)
        self.results: dict[str, StageResult] = {}

    def inject(self, point: str) -> None:
        if self.fault == point:
            raise NightlyFault(f"injected fault at {point}")

    def marker(self, stage: str) -> Path:
        return self.paths.night_stage(self.date, stage)

    def run(self) -> StageResult:
        for stage in STAGES:
            done = _completed(stage, self.marker(stage))
            if done is not None:
                self.results[stage] = done
                self.progress(stage, "already done")
                continue
            self.progress(stage, "running")
            started = time.perf_counter()
            result = self.run_stage(stage)
            result.seconds = round(time.perf_counter() - started, 3)
            self.inject(stage)
            write_json(self.marker(stage), result.to_dict())
            self.results[stage] = result
            self.progress(stage, stage_line(stage, result))
        return self.results["report"]

    def run_stage(self, stage: str) -> StageResult:
        """One stage; a failure of the whole stage is raised as NightlyStageError."""
        try:
            return getattr(self, f"stage_{stage}")()
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            raise NightlyStageError(stage, exc) from exc

    def failed(self, stage: str, item: str, error: BaseException, **ids: str) -> StageFailure:
        """Record one environment's (or adapter's) failure and say so; the stage goes on."""
        entry = _failure(item, error, **ids)
        self.progress(stage, f"failed {item}: {entry.reason}")
        return entry

    # Stages --------------------------------------------------------------------------------
    def stage_compact(self) -> CompactResult:
        if not self.paths.spool.exists() and not self.paths.lake.exists():
            return CompactResult(status="skipped", reason="no trace store under this home")
        try:
            from tracegym.store.store import Store
        except ImportError as exc:
            return CompactResult(status="skipped", reason=f"the analysis extra is missing: {exc}")
        with Store(self.home, compact_on_open=False) as store:
            report = store.compact()
        return CompactResult(
            files=report.files, spans=report.spans, parts=report.parts,
            lake=_tree_fingerprint(self.paths.lake),
        )  # fmt: skip

    def stage_analyze(self) -> AnalyzeResult:
        lake = _tree_fingerprint(self.paths.lake)
        if lake is None:
            return AnalyzeResult(status="skipped", reason="no runs in the lake", lake=None)
        if lake == self.previous.lake and self.paths.gaps.exists():
            return AnalyzeResult(
                status="skipped", reason="no new runs since the last night", lake=lake
            )
        from tracegym.analysis.pipeline import analyze

        result = analyze(self.home)
        document = result.gaps_document()
        return AnalyzeResult(
            lake=lake, runs=document.runs.to_dict(), gaps=[g.id for g in document.gaps]
        )

    def stage_synthesize(self) -> SynthesizeResult:
        digest = _file_hash(self.paths.gaps)
        if digest is None:
            return SynthesizeResult(status="skipped", reason="no gaps.json", gaps_hash=None)
        if digest == self.previous.gaps_hash:
            return SynthesizeResult(
                status="skipped", reason="gaps unchanged", gaps_hash=digest,
                **self._last_synthesis(digest),
            )  # fmt: skip
        from tracegym.synthesis.pipeline import synthesize

        report = synthesize(self.home)
        return SynthesizeResult(
            gaps_hash=digest,
            environments=[e.env_id for e in report.environments],
            rejected=[e.env_id for e in report.rejected],
            not_synthesizable=[e.gap_id for e in report.not_synthesizable],
            without_environment=[w.to_dict() for w in report.without_environment],
        )

    def _last_synthesis(self, digest: str) -> dict[str, Any]:
        """The gaps without an environment as the last synthesis of these same gaps left them
        (a skipped stage still says why), or nothing when that record is gone or is of others."""
        from tracegym.synthesis.pipeline import SynthesisRecordError, last_synthesis

        try:
            last = last_synthesis(self.home)
        except SynthesisRecordError:
            return {}
        if last is None or last.gaps_hash != digest:
            return {}
        return {
            "environments": list(last.environments),
            "without_environment": [w.to_dict() for w in last.without_environment],
        }

    def _model_folder(self) -> Path:
        return ensure_model(self.home, self.config.model)

    def _train_key(self, capability: Any, base_hash: str, config: Any) -> str:
        specs = [e.spec.to_dict() if e.spec is not None else {"env_id": e.env_id}
                 for e in capability.envs]  # fmt: skip
        # one environment keys as it did before capabilities: its adapter is not retrained
        key = {"spec": specs[0] if len(specs) == 1 else specs, "base": base_hash,
               "config": config.to_dict()}  # fmt: skip
        if self.config.replay:
            key["replay"] = _file_hash(Path(self.config.replay))
        load = self.config.load_options().key()
        if load:  # how the base model loads changes what an adapter learns on it
            key["load"] = load
        return _hash_json(key)

    def _replay(self) -> list[Any]:
        if not self.config.replay:
            return []
        with Path(self.config.replay).open(encoding="utf-8") as handle:
            return [Conversation.from_dict(json.loads(line)) for line in handle if line.strip()]

    def stage_train(self) -> TrainResult:
        from tracegym.synthesis import registry  # polars: loaded when a night trains

        envs = registry.list_envs(self.home)
        if not envs:
            return TrainResult(status="skipped", reason="no environments")
        folder = self._model_folder()
        base_hash = weights_hash(folder)
        config = sft.default_config(self.config.model, **self.config.train)
        replay = self._replay()
        trained: list[str] = []
        kept: list[str] = []
        failed: list[StageFailure] = []
        loaded = []
        for item in envs:
            try:
                loaded.append(registry.load(self.home, item.env_id))
            except _PASS_THROUGH:
                raise
            except Exception as exc:  # this environment only: record it, train the others
                failed.append(self.failed("train", item.env_id, exc, env_id=item.env_id))
        by_action = self.config.adapter_per_action and config.mode != "grpo"
        for capability in capabilities(loaded, by_action=by_action):
            adapter_id = capability.adapter_id
            try:
                key = self._train_key(capability, base_hash, config)
                existing = self._adapter(adapter_id)
                if existing is not None and existing.train_key == key:
                    # trained earlier tonight (a resumed run) or on an earlier night
                    (trained if existing.night == self.date else kept).append(adapter_id)
                    continue
                self.progress("train", f"training {adapter_id}")
                sft.train_capability(
                    self.home, capability, folder, config, evaluate=False,
                    on_step=self.on_step, replay=replay, load=self.config.load_options(),
                )  # fmt: skip
                adapters.update_metadata(self.home, adapter_id, train_key=key, night=self.date)
            except _PASS_THROUGH:
                raise
            except Exception as exc:  # this capability only: record it, train the others
                ids = "+".join(capability.env_ids)
                failed.append(self.failed("train", ids, exc, env_id=ids))
                continue
            trained.append(adapter_id)
            self.inject("train:after-adapter")
        return TrainResult(
            status=_status(failed), trained=trained, kept=kept, failed=failed, model=str(folder)
        )

    def _adapter(self, adapter_id: str) -> AdapterMetadata | None:
        try:
            return adapters.metadata(self.home, adapter_id)
        except adapters.AdapterError:
            return None

    def stage_evaluate(self) -> EvaluateResult:
        train = self.results["train"]
        todo = list(train.trained) if isinstance(train, TrainResult) else []
        todo += [
            a.adapter_id
            for a in adapters.all_metadata(self.home)
            if a.evaluation is None and a.adapter_id not in todo
        ]
        if not todo:
            return EvaluateResult(status="skipped", reason="no adapter trained tonight")
        options = self.config.load_options()
        policy = load_policy(
            self._model_folder(),
            dtype=options.dtype,
            device_map=options.device_map,
            quantize=options.quantize,
            chat_template=options.chat_template,
        )
        all_ids = [a.adapter_id for a in adapters.all_metadata(self.home)]
        model = adapters.load_adapters(policy.model, self.home, all_ids)
        router = None
        embedder = self.embedder
        if embedder is None:
            try:
                from tracegym.analysis.embeddings import Embedder

                embedder = Embedder(self.paths.cache)
            except ImportError:
                embedder = None
        if embedder is not None:
            # every adapter is a candidate while evaluating; promotion decides routing later
            router = Router.from_registry(self.home, embedder, promoted_only=False)

        def route(env: Any, seed: int) -> dict[str, float]:
            assert router is not None
            return rounded(router.weights(env.make_task(seed).instruction))

        rows: list[EvaluationRow] = []
        failed: list[StageFailure] = []
        if router is None or not self.config.route:
            together = self._evaluate_together(model, policy, todo)
            if together is not None:
                rows, todo = together, []
        for adapter_id in todo:
            try:
                job = self._job(adapter_id)
                self.progress("evaluate", f"evaluating {adapter_id}")
                row = EvaluationRow.from_dict(
                    evaluate.evaluate_job(
                        model,
                        policy.tokenizer,
                        job,
                        name=policy.name,
                        route=route if router is not None and self.config.route else None,
                        max_new_tokens=self.config.max_new_tokens,
                        batch_size=self.config.batch_size,
                    )
                )
                adapters.update_metadata(
                    self.home, adapter_id, eval=row, promoted=row.promoted, promotion=row.reason
                )
            except _PASS_THROUGH:
                raise
            except Exception as exc:  # this adapter only: record it, evaluate the others
                failed.append(self.failed("evaluate", adapter_id, exc, adapter_id=adapter_id))
                continue
            rows.append(row)
        routing = None
        if router is not None:
            routing = RoutingAccuracy.from_dict(
                routing_accuracy(router, heldout_tasks(self.home, all_ids, self.config.eval_seeds))
            )
        return EvaluateResult(status=_status(failed), rows=rows, routing=routing, failed=failed)

    def _job(self, adapter_id: str) -> Any:
        """The adapter's held-out cases: `eval_seeds` of them, over its environments in turn."""
        from tracegym.synthesis import registry  # polars: loaded when a night evaluates

        meta = adapters.metadata(self.home, adapter_id)
        envs = [registry.load(self.home, env_id) for env_id in env_ids_of(meta)]
        return EvalJob.spread(envs, adapter_id, self.config.eval_seeds)

    def _evaluate_together(
        self, model: Any, policy: Any, todo: list[str]
    ) -> list[EvaluationRow] | None:
        """Every adapter's base and adapted arms in shared waves (`evaluate_capabilities`), the
        rows recorded as the one-at-a-time loop records them; None when any of it fails, so the
        loop redoes them one by one and records which adapter failed."""
        try:
            jobs = [self._job(adapter_id) for adapter_id in todo]
            self.progress("evaluate", f"evaluating {', '.join(todo)} together")
            rows = [EvaluationRow.from_dict(row) for row in evaluate.evaluate_capabilities(
                model, policy.tokenizer, jobs, name=policy.name,
                max_new_tokens=self.config.max_new_tokens, batch_size=self.config.batch_size,
                looks=self.config.eval_looks,
            )]  # fmt: skip
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            self.progress("evaluate", f"together failed ({_reason(exc)}): one by one")
            return None
        for row in rows:
            adapters.update_metadata(self.home, row.adapter_id, eval=row, promoted=row.promoted,
                                     promotion=row.reason)  # fmt: skip
        return rows

    def stage_report(self) -> ReportResult:
        evaluated = self.results["evaluate"]
        rows = evaluated.rows if isinstance(evaluated, EvaluateResult) else []
        report = NightlyReport(
            date=self.date,
            home=str(self.home),
            config=self.config.to_dict(),
            stages={s: self.results[s] for s in STAGES[:-1]},
            evaluation=rows,
            routing=evaluated.routing if isinstance(evaluated, EvaluateResult) else None,
            adapters=[
                ReportAdapter(
                    adapter_id=a.adapter_id,
                    capability=a.capability.name,
                    promoted=a.promoted,
                    promotion=a.promotion,
                    data_hash=a.data_hash,
                )
                for a in adapters.all_metadata(self.home)
            ],
        )
        markdown = render_report(self.date, self.results, rows, report)
        report_file = self.paths.night_report(self.date)
        write_json(report_file, report.to_dict())
        tmp = self.dir / ".report.md.tmp"
        tmp.write_text(markdown)
        os.replace(tmp, self.dir / "report.md")
        return ReportResult(report=str(report_file))


# The report --------------------------------------------------------------------------------------
def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def synthesis_summary(result: SynthesizeResult) -> str:
    """'1 environment, 2 gaps without one (see report)': what synthesis left, in a line."""
    made = result.environments or []
    without = result.without_environment or []
    line = _plural(len(made), "environment", "environments")
    if without:
        return f"{line}, {_plural(len(without), 'gap', 'gaps')} without one (see report)"
    return f"{line}, every gap got one" if made else line


def stage_line(stage: str, result: StageResult) -> str:
    """The stage's status as the command line prints it when the stage ends."""
    status = result.status
    if isinstance(result, SynthesizeResult) and result.says_what_it_left:
        reason = f" ({result.reason})" if result.reason else ""
        return f"{status}{reason} - {synthesis_summary(result)}"
    return status


def md_text(value: Any) -> str:
    """Untrusted text (gap names come from traces) as inert Markdown: no HTML, no markup, one
    line."""
    text = " ".join(str(value).split())
    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(char, entity)
    for char in "\\`*_[]#|":
        text = text.replace(char, "\\" + char)
    return text


def without_environment_lines(result: StageResult) -> list[str]:
    """The report's section on the gaps synthesis gave no environment, each with its reason."""
    if not isinstance(result, SynthesizeResult) or not result.says_what_it_left:
        return []
    from tracegym.synthesis.pipeline import GapWithoutEnvironment

    lines = ["## Gaps without an environment", ""]
    records = []
    without = result.without_environment or []
    for item in without:
        try:
            records.append(GapWithoutEnvironment.from_dict(item))
        except ValueError:
            lines.append(f"- (an unreadable record: {md_text(item)})")
    if result.skipped:
        lines += ["As the last synthesis of these same gaps left them.", ""]
    for w in records:
        checks = f" ({', '.join(w.failed_checks)})" if w.failed_checks else ""
        lines.append(
            f"- {md_text(w.gap_name or w.gap_id)} ({md_text(w.gap_id)}, detector "
            f"{md_text(w.detector or 'none')}): {w.stage.label}{md_text(checks)}: "
            f"{md_text(w.reason)}"
        )
    if not without:
        lines.append("Every gap got an environment.")
    return [*lines, ""]


def render_report(
    date: str,
    results: Mapping[str, StageResult],
    rows: list[EvaluationRow],
    report: NightlyReport,
) -> str:
    """report.md: each stage in a line, the gaps without an environment, the evaluation and
    the adapters."""
    lines = [f"# tracegym nightly {date}", ""]
    for stage in STAGES[:-1]:
        r = results[stage]
        if stage == "synthesize":
            summary = stage_line(stage, r).partition(" - ")[2]
            extra = "; ".join(part for part in (r.reason, summary) if part)
        else:
            extra = r.reason or ", ".join(
                f"{k}={v}"
                for k, v in r.to_dict().items()
                if k in ("trained", "kept", "environments")
            )
        lines.append(f"- **{stage}**: {r.status} {('- ' + extra) if extra else ''}")
        for entry in r.failures:
            lines.append(f"  - failed {entry.item}: {entry.reason}")
    lines.append("")
    lines += without_environment_lines(results["synthesize"])
    lines += ["## Evaluation (held-out success, 95% Wilson intervals)", ""]
    lines.append(render_markdown(rows) if rows else "No adapter was evaluated tonight.\n")
    routing = report.routing
    if routing is not None:
        lines.append(f"Routing accuracy: {routing.accuracy} over {routing.n} tasks.\n")
    lines += ["## Adapters", ""]
    for a in report.adapters:
        state = "promoted" if a.promoted else "not promoted"
        lines.append(f"- {a.adapter_id} ({a.capability}): {state}: {a.promotion}")
    return "\n".join(lines) + "\n"


def record_night(home: Path, date: str, results: Mapping[str, StageResult], report: Path) -> Path:
    """Record the night in the store (the `nightly` view) as one spool record of its own."""

    def count(stage: str, key: str) -> int:
        value = getattr(results.get(stage), key, None)
        return len(value) if isinstance(value, (list, tuple)) else int(value or 0)

    evaluated = results.get("evaluate")
    rows = evaluated.rows if isinstance(evaluated, EvaluateResult) else []
    adapters_promoted = sum(1 for row in rows if row.promoted)
    now = time.time_ns()
    attributes = {
        sc.OPERATION: "nightly",
        sc.NIGHTLY_PREFIX + "date": date,
        sc.NIGHTLY_PREFIX + "gaps": count("analyze", "gaps"),
        sc.NIGHTLY_PREFIX + "environments": count("synthesize", "environments"),
        sc.NIGHTLY_PREFIX + "adapters_trained": count("train", "trained"),
        sc.NIGHTLY_PREFIX + "adapters_promoted": adapters_promoted,
        sc.NIGHTLY_PREFIX + "stages": json.dumps({s: results[s].status for s in STAGES}),
        sc.NIGHTLY_PREFIX + "report": str(report),
    }
    record = span_record(
        trace_id=stable_id("nightly", date), span_id=stable_id("nightly", date, width=16),
        name=sc.NIGHTLY_SPAN_NAME, start_ns=now, end_ns=now, attributes=attributes,
        scope="tracegym.nightly",
    )  # fmt: skip
    return write_spool_file(home, [record], f"nightly-{date}")


def nightly(
    home: str | Path,
    config: NightlyConfig | None = None,
    *,
    fault: str | None = None,
    progress: Callable[[str, str], None] | None = None,
    embedder: Any = None,
    on_step: Callable[[Any], None] | None = None,
) -> NightlyRun:
    """Run (or resume) tonight's job under `home`; returns the stage results and report path.
    `progress(stage, message)` hears of stages, `on_step` of every training step
    (training.sft.TrainStep). Raises NightlyBusy when another run holds the lock."""
    home = Path(home)
    paths = Home.at(home)
    config = config or NightlyConfig()
    with lock(home):
        night = NightRunner(home, config, fault, progress, embedder, on_step)
        night.run()
        results = night.results
        analyzed, synthesized = results["analyze"], results["synthesize"]
        state = NightlyState(
            date=night.date,
            finished_at=_now(),
            lake=getattr(analyzed, "lake", None),
            gaps_hash=getattr(synthesized, "gaps_hash", None) or night.previous.gaps_hash,
        )
        if not (night.dir / "recorded").exists():
            without = getattr(synthesized, "without_environment", None) or []
            record = NightRecord(
                date=night.date,
                finished_at=state.finished_at,
                stages={s: results[s].status for s in STAGES},
                gaps_without_environment=len(without),
                report=str(paths.night_report(night.date)),
            )
            with paths.nightly_history.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record.to_dict()) + "\n")
            record_night(home, night.date, results, paths.night_report(night.date))
            (night.dir / "recorded").touch()
        write_json(paths.nightly_state, state.to_dict())
        return NightlyRun(date=night.date, dir=str(night.dir), stages=results)


__all__ = [
    "STAGES",
    "AnalyzeResult",
    "CompactResult",
    "EvaluateResult",
    "Lock",
    "NightRecord",
    "NightRunner",
    "NightlyBusy",
    "NightlyConfig",
    "NightlyDocumentError",
    "NightlyFault",
    "NightlyReport",
    "NightlyRun",
    "NightlyStageError",
    "NightlyState",
    "ReportAdapter",
    "ReportResult",
    "StageFailure",
    "StageResult",
    "SynthesizeResult",
    "TrainResult",
    "lock",
    "nightly",
    "nightly_dir",
    "read_history",
    "stage_result",
]
