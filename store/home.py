"""A tracegym home: every path under it, and the one way documents there are written and read.

A home is one directory (`--home`, else $TRACEGYM_HOME, else ./.tracegym). Each stage leaves its
output there for the next one; this module is the only place that knows where:

    home = Home.at("~/.tracegym")
    home.spool          # spool/: span files the tracer appends to (tracer.spool_files)
    home.lake           # lake/: compacted Parquet parts
    home.lake_config    # lake.json: the lake's URL when it is on object storage instead
    home.gaps           # gaps.json: what `analyze` found (analysis.gap.GapsDocument)
    home.environments   # envs/: synthesized environments, their index and the synthesis report
    home.adapters       # adapters/: one LoRA adapter per capability, and the registry
    home.models         # models/: converted and fine-tuned base models
    home.nightly        # nightly/: one folder per night, the state, the history and the lock
    home.cache          # cache/: embeddings and other derived data, safe to delete

`write_json` replaces a document atomically (a reader sees the old one or the new one, never
half of either); `read_json` reads one back and names the file when it is not JSON. The tracer
sits below this module and knows only the spool, through `tracer.spool_files.spool_dir`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracegym.tracer.spool_files import spool_dir

GAPS_FILE = "gaps.json"
ENVIRONMENTS_DIR = "envs"
ENVIRONMENT_INDEX_FILE = "index.json"
SYNTHESIS_REPORT_FILE = "synthesis.json"
# inside one environment's folder (envs/<env_id>/)
ENVIRONMENT_SPEC_FILE = "spec.json"
ENVIRONMENT_VALIDITY_FILE = "validity.json"
ENVIRONMENT_CALIBRATION_FILE = "calibration.json"
ENVIRONMENT_DEMOS_FILE = "demos_train.jsonl"
ENVIRONMENT_TASKS_FILES = {"train": "tasks_train.jsonl", "heldout": "tasks_heldout.jsonl"}
ADAPTERS_DIR = "adapters"
MODELS_DIR = "models"
NIGHTLY_DIR = "nightly"
NIGHT_REPORT_FILE = "report.json"
CACHE_DIR = "cache"
EMBEDDINGS_FILE = "embeddings.npz"
IMPORTS_DIR = "imports"
DEMO_DIR = "demo"
LAKE_DIR = "lake"
LAKE_CONFIG_FILE = "lake.json"  # where the lake lives when not under lake/ (object storage)


class DocumentError(ValueError):
    """A document under the home that is not valid JSON (or not the shape its reader needs)."""


@dataclass(frozen=True)
class Home:
    """The paths under one home directory. Building one touches nothing on disk."""

    root: Path

    @classmethod
    def at(cls, path: str | os.PathLike[str] | Home) -> Home:
        if isinstance(path, Home):
            return path
        return cls(Path(path).expanduser())

    def __fspath__(self) -> str:
        return str(self.root)

    # the store
    @property
    def spool(self) -> Path:
        return spool_dir(self.root)

    @property
    def lake(self) -> Path:
        return self.root / LAKE_DIR

    @property
    def lake_config(self) -> Path:
        """lake.json: the URL of a lake on object storage (store/object_lake.py), when set."""
        return self.root / LAKE_CONFIG_FILE

    @property
    def imports(self) -> Path:
        return self.root / IMPORTS_DIR

    # analysis
    @property
    def gaps(self) -> Path:
        return self.root / GAPS_FILE

    @property
    def cache(self) -> Path:
        return self.root / CACHE_DIR

    @property
    def embeddings_cache(self) -> Path:
        return self.cache / EMBEDDINGS_FILE

    # synthesis
    @property
    def environments(self) -> Path:
        return self.root / ENVIRONMENTS_DIR

    def environment(self, env_id: str) -> Path:
        return self.environments / env_id

    def environment_tasks(self, env_id: str, split: str) -> Path:
        """One environment's exported tasks of `split` ("train" or "heldout"), one per seed."""
        return self.environment(env_id) / ENVIRONMENT_TASKS_FILES[split]

    @property
    def environment_index(self) -> Path:
        return self.environments / ENVIRONMENT_INDEX_FILE

    @property
    def synthesis_report(self) -> Path:
        return self.environments / SYNTHESIS_REPORT_FILE

    # training
    @property
    def adapters(self) -> Path:
        return self.root / ADAPTERS_DIR

    @property
    def models(self) -> Path:
        return self.root / MODELS_DIR

    # jobs
    @property
    def nightly(self) -> Path:
        return self.root / NIGHTLY_DIR

    def night(self, date: str) -> Path:
        return self.nightly / date

    def night_report(self, date: str) -> Path:
        """The night's report.json (jobs.nightly.NightlyReport), what dashboards read."""
        return self.night(date) / NIGHT_REPORT_FILE

    def night_stage(self, date: str, stage: str) -> Path:
        """A stage's result that night (jobs.nightly.StageResult), written when it completes."""
        return self.night(date) / "stages" / f"{stage}.json"

    @property
    def nightly_state(self) -> Path:
        return self.nightly / "state.json"

    @property
    def nightly_history(self) -> Path:
        return self.nightly / "history.jsonl"

    @property
    def nightly_lock(self) -> Path:
        return self.nightly / ".lock"

    @property
    def demo(self) -> Path:
        return self.root / DEMO_DIR


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace the file at `path` with `text` atomically: a temporary file in the same folder,
    flushed, then renamed over the target (a reader sees the old file or the new one)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> None:
    """Write `data` as JSON to `path` atomically (`write_text`). Values JSON cannot encode are
    written as `str(value)`."""
    write_text(path, json.dumps(data, indent=indent, ensure_ascii=False, default=str) + "\n")


_MISSING: Any = object()


def read_json(path: str | os.PathLike[str], default: Any = _MISSING) -> Any:
    """The JSON document at `path`. A missing file returns `default` when one is given (else
    FileNotFoundError); a file that is not JSON raises DocumentError naming it."""
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        if default is _MISSING:
            raise
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DocumentError(f"{target} is not valid JSON: {error}") from None
