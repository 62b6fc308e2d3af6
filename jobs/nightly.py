"""The nightly batch job: compaction -> analysis -> synthesis -> training -> evaluation -> report.

    from tracegym.jobs.nightly import nightly, NightlyConfig
    report = nightly(home)                 # or `tracegym nightly`

Everything for one night lives under `<home>/nightly/<YYYY-MM-DD>/`:

    stages/<stage>.json   the stage's result; written atomically when the stage completes
    report.json           the night's data (for dashboards)
    report.md             the same as Markdown

Incremental: a stage compares its inputs with the last completed night's (`<home>/nightly/
state.json`) and skips what did not change: analysis runs only when the lake changed (new runs),
synthesis only when gaps.json changed, training only for environments whose adapter is missing
or was trained on other data, base model or settings, evaluation only for adapters trained
tonight (the others keep their numbers).

Safe: a lock file (`<home>/nightly/.lock`, holding the pid) refuses a second concurrent run (a
lock whose process is gone is taken over); every artifact is written to a temporary name and
renamed; after a kill, the next run of the same night skips the stages that completed and redoes
the one that was interrupted (adapters already saved with matching inputs are not retrained).
Each night is appended to `<home>/nightly/history.jsonl`.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracegym.generation.model import ModelError
from tracegym.training.adapters import write_json_atomic

STAGES = ("compact", "analyze", "synthesize", "train", "evaluate", "report")


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def nightly_dir(home: str | Path) -> Path:
    return Path(home) / "nightly"


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
                    owner = json.loads(self.path.read_text() or "{}")
                except (OSError, ValueError):
                    owner = {}
                pid = int(owner.get("pid") or 0)
                if pid and _alive(pid):
                    raise NightlyBusy(
                        f"another nightly run (pid {pid}, since {owner.get('since')}) holds "
                        f"{self.path}"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
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
    return Lock(nightly_dir(home) / ".lock")


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


def _failure(item: str, error: BaseException, **ids: str) -> dict[str, str]:
    """One environment's (or adapter's) failure as recorded in a stage's `failed` list."""
    return {**ids, "item": item, "error": type(error).__name__, "reason": _reason(error)}


def _status(failed: list[Any]) -> str:
    return "partial" if failed else "done"


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# The job ---------------------------------------------------------------------------------------
class _Night:
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
        self.on_step = on_step
        self.config = config
        self.fault = fault
        self.progress = progress or (lambda stage, message: None)
        self.embedder = embedder
        self.date = config.date or time.strftime("%Y-%m-%d", time.gmtime())
        self.dir = nightly_dir(home) / self.date
        self.previous = _read(nightly_dir(home) / "state.json") or {}
        self.results: dict[str, Any] = {}

    def inject(self, point: str) -> None:
        if self.fault == point:
            raise NightlyFault(f"injected fault at {point}")

    def marker(self, stage: str) -> Path:
        return self.dir / "stages" / f"{stage}.json"

    def run(self) -> dict[str, Any]:
        for stage in STAGES:
            done = _read(self.marker(stage))
            if done is not None:
                self.results[stage] = done
                self.progress(stage, "already done")
                continue
            self.progress(stage, "running")
            started = time.perf_counter()
            result = self.run_stage(stage)
            result["seconds"] = round(time.perf_counter() - started, 3)
            self.inject(stage)
            write_json_atomic(self.marker(stage), result)
            self.results[stage] = result
            self.progress(stage, stage_line(stage, result))
        return self.results["report"]

    def run_stage(self, stage: str) -> dict[str, Any]:
        """One stage; a failure of the whole stage is raised as NightlyStageError."""
        try:
            return getattr(self, f"stage_{stage}")()
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            raise NightlyStageError(stage, exc) from exc

    def failed(self, stage: str, item: str, error: BaseException, **ids: str) -> dict[str, str]:
        """Record one environment's (or adapter's) failure and say so; the stage goes on."""
        entry = _failure(item, error, **ids)
        self.progress(stage, f"failed {item}: {entry['reason']}")
        return entry

    # Stages --------------------------------------------------------------------------------
    def stage_compact(self) -> dict[str, Any]:
        if not (self.home / "spool").exists() and not (self.home / "lake").exists():
            return {"status": "skipped", "reason": "no trace store under this home"}
        try:
            from tracegym.store.store import Store
        except ImportError as exc:
            return {"status": "skipped", "reason": f"the analysis extra is missing: {exc}"}
        with Store(self.home, compact_on_open=False) as store:
            report = store.compact()
        return {
            "status": "done",
            "files": report.files,
            "spans": report.spans,
            "parts": report.parts,
            "lake": _tree_fingerprint(self.home / "lake"),
        }

    def stage_analyze(self) -> dict[str, Any]:
        lake = _tree_fingerprint(self.home / "lake")
        if lake is None:
            return {"status": "skipped", "reason": "no runs in the lake", "lake": None}
        if lake == self.previous.get("lake") and (self.home / "gaps.json").exists():
            return {"status": "skipped", "reason": "no new runs since the last night", "lake": lake}
        from tracegym.analysis.pipeline import analyze

        result = analyze(self.home)
        document = result.gaps_document()
        return {
            "status": "done",
            "lake": lake,
            "runs": document["runs"],
            "gaps": [g["id"] for g in document["gaps"]],
        }

    def stage_synthesize(self) -> dict[str, Any]:
        gaps = self.home / "gaps.json"
        digest = _file_hash(gaps)
        if digest is None:
            return {"status": "skipped", "reason": "no gaps.json", "gaps_hash": None}
        if digest == self.previous.get("gaps_hash"):
            return {
                "status": "skipped",
                "reason": "gaps unchanged",
                "gaps_hash": digest,
                **self._last_synthesis(digest),
            }
        from tracegym.synthesis.pipeline import synthesize

        report = synthesize(self.home)
        return {
            "status": "done",
            "gaps_hash": digest,
            "environments": [e["env_id"] for e in report.environments],
            "rejected": [e["env_id"] for e in report.rejected],
            "not_synthesizable": [e["gap_id"] for e in report.not_synthesizable],
            "without_environment": [w.to_dict() for w in report.without_environment],
        }

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
        from tracegym.generation.model import ensure_model

        return ensure_model(self.home, self.config.model)

    def _train_key(self, capability: Any, base_hash: str, config: Any) -> str:
        specs = [e.spec.to_dict() if e.spec is not None else {"env_id": e.env_id}
                 for e in capability.envs]  # fmt: skip
        # one environment keys as it did before capabilities: its adapter is not retrained
        key = {"spec": specs[0] if len(specs) == 1 else specs, "base": base_hash,
               "config": config.to_dict()}  # fmt: skip
        if self.config.replay:
            key["replay"] = _file_hash(Path(self.config.replay))
        return _hash_json(key)

    def _replay(self) -> list[Any]:
        if not self.config.replay:
            return []
        with Path(self.config.replay).open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def stage_train(self) -> dict[str, Any]:
        from tracegym.synthesis import registry
        from tracegym.training import adapters
        from tracegym.training.capabilities import capabilities
        from tracegym.training.sft import default_config, train_capability

        envs = registry.list_envs(self.home)
        if not envs:
            return {"status": "skipped", "reason": "no environments", "trained": [], "kept": []}
        from tracegym.generation.model import weights_hash

        folder = self._model_folder()
        base_hash = weights_hash(folder)
        config = default_config(self.config.model, **self.config.train)
        replay = self._replay()
        trained: list[str] = []
        kept: list[str] = []
        failed: list[dict[str, str]] = []
        loaded = []
        for item in envs:
            try:
                loaded.append(registry.load(self.home, item["env_id"]))
            except _PASS_THROUGH:
                raise
            except Exception as exc:  # this environment only: record it, train the others
                failed.append(self.failed("train", item["env_id"], exc, env_id=item["env_id"]))
        by_action = self.config.adapter_per_action and config.mode != "grpo"
        for capability in capabilities(loaded, by_action=by_action):
            adapter_id = capability.adapter_id
            try:
                key = self._train_key(capability, base_hash, config)
                existing = self._adapter(adapter_id)
                if existing is not None and existing.get("train_key") == key:
                    # trained earlier tonight (a resumed run) or on an earlier night
                    (trained if existing.get("night") == self.date else kept).append(adapter_id)
                    continue
                self.progress("train", f"training {adapter_id}")
                train_capability(
                    self.home, capability, folder, config, evaluate=False, on_step=self.on_step,
                    replay=replay,
                )  # fmt: skip
                adapters.update(self.home, adapter_id, train_key=key, night=self.date)
            except _PASS_THROUGH:
                raise
            except Exception as exc:  # this capability only: record it, train the others
                ids = "+".join(capability.env_ids)
                failed.append(self.failed("train", ids, exc, env_id=ids))
                continue
            trained.append(adapter_id)
            self.inject("train:after-adapter")
        return {
            "status": _status(failed),
            "trained": trained,
            "kept": kept,
            "failed": failed,
            "model": str(folder),
        }

    def _adapter(self, adapter_id: str) -> dict[str, Any] | None:
        from tracegym.training import adapters

        try:
            return adapters.show(self.home, adapter_id)
        except adapters.AdapterError:
            return None

    def stage_evaluate(self) -> dict[str, Any]:
        from tracegym.generation.model import load_policy
        from tracegym.training import adapters
        from tracegym.training.evaluate import evaluate_job
        from tracegym.training.router import (
            Router,
            heldout_tasks,
            rounded,
            routing_accuracy,
        )

        todo = list(self.results["train"].get("trained", []))
        todo += [
            a["adapter_id"]
            for a in adapters.list_adapters(self.home)
            if a["metrics"].get("eval") is None and a["adapter_id"] not in todo
        ]
        if not todo:
            return {"status": "skipped", "reason": "no adapter trained tonight", "rows": []}
        policy = load_policy(self._model_folder())
        all_ids = [a["adapter_id"] for a in adapters.list_adapters(self.home)]
        model = adapters.load_adapters(policy.model, self.home, all_ids)
        router = None
        embedder = self.embedder
        if embedder is None:
            try:
                from tracegym.analysis.embeddings import Embedder

                embedder = Embedder(self.home / "cache")
            except ImportError:
                embedder = None
        if embedder is not None:
            # every adapter is a candidate while evaluating; promotion decides routing later
            router = Router.from_registry(self.home, embedder, promoted_only=False)

        def route(env: Any, seed: int) -> dict[str, float]:
            assert router is not None
            return rounded(router.weights(env.make_task(seed).instruction))

        rows = []
        failed: list[dict[str, str]] = []
        if router is None or not self.config.route:
            rows = self._evaluate_together(model, policy, todo)
            if rows is not None:
                todo = []
            else:
                rows = []
        for adapter_id in todo:
            try:
                job = self._job(adapter_id)
                self.progress("evaluate", f"evaluating {adapter_id}")
                row = evaluate_job(
                    model,
                    policy.tokenizer,
                    job,
                    name=policy.name,
                    route=route if router is not None and self.config.route else None,
                    max_new_tokens=self.config.max_new_tokens,
                    batch_size=self.config.batch_size,
                )
                adapters.update(
                    self.home,
                    adapter_id,
                    eval=row,
                    promoted=row["promoted"],
                    promotion=row["reason"],
                )
            except _PASS_THROUGH:
                raise
            except Exception as exc:  # this adapter only: record it, evaluate the others
                failed.append(self.failed("evaluate", adapter_id, exc, adapter_id=adapter_id))
                continue
            rows.append(row)
        routing = None
        if router is not None:
            routing = routing_accuracy(
                router, heldout_tasks(self.home, all_ids, self.config.eval_seeds)
            )
        return {"status": _status(failed), "rows": rows, "routing": routing, "failed": failed}

    def _job(self, adapter_id: str) -> Any:
        """The adapter's held-out cases: `eval_seeds` of them, over its environments in turn."""
        from tracegym.synthesis import registry
        from tracegym.training import adapters
        from tracegym.training.capabilities import env_ids_of
        from tracegym.training.evaluate import EvalJob

        meta = adapters.show(self.home, adapter_id)
        envs = [registry.load(self.home, env_id) for env_id in env_ids_of(meta)]
        return EvalJob.spread(envs, adapter_id, self.config.eval_seeds)

    def _evaluate_together(
        self, model: Any, policy: Any, todo: list[str]
    ) -> list[dict[str, Any]] | None:
        """Every adapter's base and adapted arms in shared waves (`evaluate_capabilities`), the
        rows recorded as the one-at-a-time loop records them; None when any of it fails, so the
        loop redoes them one by one and records which adapter failed."""
        from tracegym.training import adapters
        from tracegym.training.evaluate import evaluate_capabilities

        try:
            jobs = [self._job(adapter_id) for adapter_id in todo]
            self.progress("evaluate", f"evaluating {', '.join(todo)} together")
            rows = evaluate_capabilities(
                model, policy.tokenizer, jobs, name=policy.name,
                max_new_tokens=self.config.max_new_tokens, batch_size=self.config.batch_size,
                looks=self.config.eval_looks,
            )  # fmt: skip
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            self.progress("evaluate", f"together failed ({_reason(exc)}): one by one")
            return None
        for row in rows:
            adapters.update(self.home, row["adapter_id"], eval=row, promoted=row["promoted"],
                            promotion=row["reason"])  # fmt: skip
        return rows

    def stage_report(self) -> dict[str, Any]:
        from tracegym.training import adapters

        rows = self.results["evaluate"].get("rows", [])
        report = {
            "date": self.date,
            "home": str(self.home),
            "config": self.config.to_dict(),
            "stages": {
                s: {k: v for k, v in self.results[s].items() if k != "rows"} for s in STAGES[:-1]
            },
            "evaluation": rows,
            "routing": self.results["evaluate"].get("routing"),
            "adapters": [
                {
                    "adapter_id": a["adapter_id"],
                    "capability": a["capability"]["name"],
                    "promoted": a.get("promoted"),
                    "promotion": a.get("promotion"),
                    "data_hash": a["data_hash"],
                }
                for a in adapters.list_adapters(self.home)
            ],
        }
        markdown = render_report(self.date, self.results, rows, report)
        write_json_atomic(self.dir / "report.json", report)
        tmp = self.dir / ".report.md.tmp"
        tmp.write_text(markdown)
        os.replace(tmp, self.dir / "report.md")
        return {"status": "done", "report": str(self.dir / "report.json")}


# The report --------------------------------------------------------------------------------------
def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def synthesis_summary(result: dict[str, Any]) -> str:
    """'1 environment, 2 gaps without one (see report)': what synthesis left, in a line."""
    made = result.get("environments") or []
    without = result.get("without_environment") or []
    line = _plural(len(made), "environment", "environments")
    if without:
        return f"{line}, {_plural(len(without), 'gap', 'gaps')} without one (see report)"
    return f"{line}, every gap got one" if made else line


def stage_line(stage: str, result: dict[str, Any]) -> str:
    """The stage's status as the command line prints it when the stage ends."""
    status = str(result.get("status", "done"))
    if stage == "synthesize" and ("environments" in result or "without_environment" in result):
        reason = f" ({result['reason']})" if result.get("reason") else ""
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


def without_environment_lines(result: dict[str, Any]) -> list[str]:
    """The report's section on the gaps synthesis gave no environment, each with its reason."""
    if "without_environment" not in result:
        return []
    from tracegym.synthesis.pipeline import GapWithoutEnvironment

    lines = ["## Gaps without an environment", ""]
    records = []
    for item in result["without_environment"]:
        try:
            records.append(GapWithoutEnvironment.from_dict(item))
        except ValueError:
            lines.append(f"- (an unreadable record: {md_text(item)})")
    if result.get("status") == "skipped":
        lines += ["As the last synthesis of these same gaps left them.", ""]
    for w in records:
        checks = f" ({', '.join(w.failed_checks)})" if w.failed_checks else ""
        lines.append(
            f"- {md_text(w.gap_name or w.gap_id)} ({md_text(w.gap_id)}, detector "
            f"{md_text(w.detector or 'none')}): {w.stage.label}{md_text(checks)}: "
            f"{md_text(w.reason)}"
        )
    if not result["without_environment"]:
        lines.append("Every gap got an environment.")
    return [*lines, ""]


def render_report(
    date: str, results: dict[str, Any], rows: list[dict[str, Any]], report: dict[str, Any]
) -> str:
    """report.md: each stage in a line, the gaps without an environment, the evaluation and
    the adapters."""
    from tracegym.training.evaluate import render_markdown

    lines = [f"# tracegym nightly {date}", ""]
    for stage in STAGES[:-1]:
        r = results[stage]
        if stage == "synthesize":
            summary = stage_line(stage, r).partition(" - ")[2]
            extra = "; ".join(part for part in (r.get("reason"), summary) if part)
        else:
            extra = r.get("reason") or ", ".join(
                f"{k}={v}" for k, v in r.items() if k in ("trained", "kept", "environments")
            )
        lines.append(f"- **{stage}**: {r.get('status')} {('- ' + extra) if extra else ''}")
        for entry in r.get("failed") or []:
            lines.append(f"  - failed {entry['item']}: {entry['reason']}")
    lines.append("")
    lines += without_environment_lines(results["synthesize"])
    lines += ["## Evaluation (held-out success, 95% Wilson intervals)", ""]
    lines.append(render_markdown(rows) if rows else "No adapter was evaluated tonight.\n")
    routing = report["routing"]
    if routing:
        lines.append(f"Routing accuracy: {routing['accuracy']} over {routing['n']} tasks.\n")
    lines += ["## Adapters", ""]
    for a in report["adapters"]:
        state = "promoted" if a["promoted"] else "not promoted"
        lines.append(f"- {a['adapter_id']} ({a['capability']}): {state}: {a['promotion']}")
    return "\n".join(lines) + "\n"


def record_night(home: Path, date: str, results: dict[str, Any], report: Path) -> Path:
    """Record the night in the store (the `nightly` view) as one spool record of its own."""
    import time

    from tracegym.store.records import span_record, stable_id, write_spool_file
    from tracegym.tracer import semconv as sc

    def count(stage: str, key: str) -> int:
        value = results.get(stage, {}).get(key)
        return len(value) if isinstance(value, (list, tuple)) else int(value or 0)

    adapters_promoted = sum(
        1 for row in results.get("evaluate", {}).get("rows", []) or [] if row.get("promoted")
    )
    now = time.time_ns()
    attributes = {
        sc.OPERATION: "nightly",
        sc.NIGHTLY_PREFIX + "date": date,
        sc.NIGHTLY_PREFIX + "gaps": count("analyze", "gaps"),
        sc.NIGHTLY_PREFIX + "environments": count("synthesize", "environments"),
        sc.NIGHTLY_PREFIX + "adapters_trained": count("train", "trained"),
        sc.NIGHTLY_PREFIX + "adapters_promoted": adapters_promoted,
        sc.NIGHTLY_PREFIX + "stages": json.dumps({s: results[s].get("status") for s in STAGES}),
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
) -> dict[str, Any]:
    """Run (or resume) tonight's job under `home`; returns the stage results and report path.
    `progress(stage, message)` hears of stages, `on_step` of every training step
    (training.sft.TrainStep). Raises NightlyBusy when another run holds the lock."""
    home = Path(home)
    config = config or NightlyConfig()
    with lock(home):
        night = _Night(home, config, fault, progress, embedder, on_step)
        night.run()
        results = night.results
        state = {
            "date": night.date,
            "finished_at": _now(),
            "lake": results["analyze"].get("lake"),
            "gaps_hash": results["synthesize"].get("gaps_hash") or night.previous.get("gaps_hash"),
        }
        if not (night.dir / "recorded").exists():
            with (nightly_dir(home) / "history.jsonl").open("a", encoding="utf-8") as handle:
                handle.write(
                    json.dumps(
                        {
                            "date": night.date,
                            "finished_at": state["finished_at"],
                            "stages": {s: results[s].get("status") for s in STAGES},
                            "gaps_without_environment": len(
                                results["synthesize"].get("without_environment") or []
                            ),
                            "report": str(night.dir / "report.json"),
                        }
                    )
                    + "\n"
                )
            record_night(home, night.date, results, night.dir / "report.json")
            (night.dir / "recorded").touch()
        write_json_atomic(nightly_dir(home) / "state.json", state)
        return {"date": night.date, "dir": str(night.dir), "stages": results}


__all__ = [
    "STAGES",
    "Lock",
    "NightlyBusy",
    "NightlyConfig",
    "NightlyFault",
    "NightlyStageError",
    "lock",
    "nightly",
    "nightly_dir",
]
