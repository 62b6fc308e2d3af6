"""Environments as plain files under `<home>/envs/`, with an index.

    <home>/envs/index.json                  the registry: one entry per environment
    <home>/envs/<env_id>/spec.json          family, gap, tool schemas and roles, knobs, seed ranges
    <home>/envs/<env_id>/tasks_train.jsonl  one task per train seed: seed, system prompt, tools,
                                            first observation, step budget
    <home>/envs/<env_id>/tasks_heldout.jsonl the same for the held-out seeds (a disjoint range)
    <home>/envs/<env_id>/demos_train.jsonl  oracle demonstrations for the train seeds
    <home>/envs/<env_id>/validity.json      the validity report it was registered with
    <home>/envs/<env_id>/calibration.json   how its knobs were calibrated (if they were)

`load(home, env_id)` gives a runnable `Environment` back (its class is the spec's
`entry_point`, so environments you write yourself register and load the same way).
`read_index`/`list_envs`/`entry` give the index typed (`EnvironmentIndex`, `EnvironmentEntry`),
`detail` one environment's documents (`EnvironmentDetail`); the paths are `store.home.Home`'s.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracegym.store.home import (
    ENVIRONMENT_CALIBRATION_FILE,
    ENVIRONMENT_DEMOS_FILE,
    ENVIRONMENT_SPEC_FILE,
    ENVIRONMENT_TASKS_FILES,
    ENVIRONMENT_VALIDITY_FILE,
    DocumentError,
    Home,
    read_json,
    write_json,
)
from tracegym.synthesis.base import Environment, run_actions
from tracegym.synthesis.spec import EnvironmentSpec
from tracegym.synthesis.validity import Check, ValidityReport, check_environment

INDEX_VERSION = 1


class RegistryError(LookupError):
    """An environment that is not registered, or a registry that cannot be read."""


class RegistryDocumentError(RegistryError, DocumentError):
    """A document the registry writes (`envs/index.json`, one of its entries, an environment's
    validity.json) is not the shape it writes; the message names the file or the entry and
    what is wrong."""


def envs_dir(home: str | Path) -> Path:
    """`<home>/envs/` (`Home.environments`)."""
    return Home.at(home).environments


def _text(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    return None if value is None else str(value)


def _number(data: Mapping[str, Any], name: str, where: str) -> Any:
    value = data.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RegistryDocumentError(f"{where}: {name!r} must be a number, got {value!r:.80}")
    return value


def _seed_range(data: Mapping[str, Any], name: str, where: str) -> list[int]:
    value = data.get(name)
    if not (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise RegistryDocumentError(f"{where}: {name!r} must be [start, stop], got {value!r:.80}")
    return [int(value[0]), int(value[1])]


def _mapping(data: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RegistryDocumentError(
            f"{where}: {name!r} must be an object, got {type(value).__name__}"
        )
    return value


@dataclass(frozen=True)
class TaskCounts:
    """How many train and held-out tasks were exported for an environment."""

    train: int = 0
    heldout: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"train": self.train, "heldout": self.heldout}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "tasks") -> TaskCounts:
        return cls(
            train=int(_number(data, "train", where) or 0),
            heldout=int(_number(data, "heldout", where) or 0),
        )


@dataclass(frozen=True)
class ValiditySummary:
    """Whether an environment passed its validity checks when registered, and when."""

    ok: bool
    checked_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checked_at": self.checked_at}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "validity") -> ValiditySummary:
        ok = data.get("ok")
        if not isinstance(ok, bool):
            raise RegistryDocumentError(f"{where}: 'ok' must be true or false, got {ok!r:.80}")
        return cls(ok=ok, checked_at=_text(data, "checked_at"))


@dataclass(frozen=True)
class CalibrationSummary:
    """How an environment's knobs were calibrated: the policy, its pass@1 and pass@k, and
    whether they fell in the band (the full record is the environment's calibration.json)."""

    pass_at_1: float | None = None
    pass_at_k: float | None = None
    k: int | None = None
    in_band: bool | None = None
    policy: str | None = None

    KEYS = ("pass_at_1", "pass_at_k", "k", "in_band", "policy")

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.KEYS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "calibration") -> CalibrationSummary:
        in_band = data.get("in_band")
        return cls(
            pass_at_1=_number(data, "pass_at_1", where),
            pass_at_k=_number(data, "pass_at_k", where),
            k=_number(data, "k", where),
            in_band=None if in_band is None else bool(in_band),
            policy=_text(data, "policy"),
        )


@dataclass(frozen=True)
class EnvironmentEntry:
    """One registered environment, as the registry's index lists it."""

    env_id: str
    family: str
    entry_point: str
    gap_id: str | None
    gap_name: str | None
    description: str
    knobs: dict[str, Any]
    train_seeds: list[int]
    heldout_seeds: list[int]
    tasks: TaskCounts
    validity: ValiditySummary
    calibration: CalibrationSummary | None = None
    registered_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "family": self.family,
            "entry_point": self.entry_point,
            "gap_id": self.gap_id,
            "gap_name": self.gap_name,
            "description": self.description,
            "knobs": dict(self.knobs),
            "train_seeds": list(self.train_seeds),
            "heldout_seeds": list(self.heldout_seeds),
            "tasks": self.tasks.to_dict(),
            "validity": self.validity.to_dict(),
            "calibration": None if self.calibration is None else self.calibration.to_dict(),
            "registered_at": self.registered_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvironmentEntry:
        """RegistryDocumentError naming the entry and the field when it is not one."""
        if not isinstance(data, Mapping):
            raise RegistryDocumentError(
                f"an environment entry must be an object, got {type(data).__name__}"
            )
        env_id = data.get("env_id")
        if not isinstance(env_id, str) or not env_id:
            raise RegistryDocumentError(f"environment entry without an 'env_id': {data!r:.200}")
        where = f"environment {env_id!r}"
        for name in ("family", "entry_point"):
            if not isinstance(data.get(name), str):
                raise RegistryDocumentError(f"{where}: {name!r} must be a string")
        calibration = _mapping(data, "calibration", where)
        return cls(
            env_id=env_id,
            family=data["family"],
            entry_point=data["entry_point"],
            gap_id=_text(data, "gap_id"),
            gap_name=_text(data, "gap_name"),
            description=str(data.get("description") or ""),
            knobs=dict(_mapping(data, "knobs", where)),
            train_seeds=_seed_range(data, "train_seeds", where),
            heldout_seeds=_seed_range(data, "heldout_seeds", where),
            tasks=TaskCounts.from_dict(_mapping(data, "tasks", where), f"{where} tasks"),
            validity=ValiditySummary.from_dict(
                _mapping(data, "validity", where), f"{where} validity"
            ),
            calibration=CalibrationSummary.from_dict(calibration, f"{where} calibration")
            if data.get("calibration") is not None
            else None,
            registered_at=_text(data, "registered_at"),
        )


@dataclass
class EnvironmentIndex:
    """`<home>/envs/index.json`: one entry per registered environment, sorted by id."""

    VERSION = INDEX_VERSION

    version: int = INDEX_VERSION
    environments: list[EnvironmentEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "environments": [e.to_dict() for e in self.environments],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvironmentIndex:
        """RegistryDocumentError when `data` is not an index (or one entry is not an entry)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("environments"), list):
            raise RegistryDocumentError("not a tracegym environment index")
        version = data.get("version", 0)
        if not isinstance(version, int) or version > cls.VERSION:
            raise RegistryDocumentError(
                f"environment index version {version!r} is not supported "
                f"(this tracegym reads up to {cls.VERSION})"
            )
        return cls(
            version=cls.VERSION,
            environments=[EnvironmentEntry.from_dict(e) for e in data["environments"]],
        )

    def without(self, env_id: str) -> EnvironmentIndex:
        return EnvironmentIndex(self.version, [e for e in self.environments if e.env_id != env_id])


def environment_class(entry_point: str) -> type[Environment]:
    module, _, name = entry_point.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"cannot load environment class {entry_point!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise RegistryError(f"{entry_point} is not an Environment subclass")
    return cls


def from_spec(spec: EnvironmentSpec, **knobs: Any) -> Environment:
    return environment_class(spec.entry_point)(spec, **knobs)


def read_index(home: str | Path) -> EnvironmentIndex:
    """The registry's index (empty when nothing was registered yet); RegistryDocumentError
    naming the file when it cannot be read as one."""
    path = Home.at(home).environment_index
    try:
        data = read_json(path, default=None)
    except DocumentError as exc:
        raise RegistryDocumentError(str(exc)) from None
    if data is None:
        return EnvironmentIndex()
    try:
        return EnvironmentIndex.from_dict(data)
    except RegistryDocumentError as exc:
        if str(exc) == "not a tracegym environment index":
            raise RegistryDocumentError(f"{path} is not a tracegym environment index") from None
        raise RegistryDocumentError(f"{path}: {exc}") from None


def _write_index(home: str | Path, index: EnvironmentIndex) -> None:
    index.environments.sort(key=lambda e: e.env_id)
    write_json(Home.at(home).environment_index, index.to_dict())


def _jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    n = 0
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
    return n


def register(
    home: str | Path,
    env: Environment,
    *,
    validity: ValidityReport | None = None,
    calibration: dict[str, Any] | None = None,
    n_train: int = 500,
    n_heldout: int = 200,
    validity_seeds: int = 200,
) -> Path:
    """Check `env` (unless a passing report is given) and write it under `<home>/envs/`.

    Raises ValueError with the failed checks when it does not pass: a failing environment is
    never registered (and an earlier version of it is removed)."""
    spec = env.spec
    if spec is None:
        raise ValueError("only environments with an EnvironmentSpec can be registered")
    report = validity or check_environment(env, validity_seeds)
    if not report.ok:
        unregister(home, spec.env_id, missing_ok=True)
        raise ValueError(f"{spec.env_id} failed validity: {'; '.join(report.failures)}")
    spec.knobs = dict(env.knobs)
    paths = Home.at(home)
    root = paths.environments
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.env_id}.", dir=root))
    try:
        spec.save(staging / ENVIRONMENT_SPEC_FILE)
        t0, t1 = spec.train_seeds
        h0, h1 = spec.heldout_seeds
        train = range(t0, min(t1, t0 + n_train))
        heldout = range(h0, min(h1, h0 + n_heldout))
        for split, seeds in (("train", train), ("heldout", heldout)):
            tasks = (env.export_task(s, split) for s in seeds)
            _jsonl(staging / ENVIRONMENT_TASKS_FILES[split], tasks)
        _jsonl(staging / ENVIRONMENT_DEMOS_FILE, (demonstration(env, s) for s in train))
        write_json(staging / ENVIRONMENT_VALIDITY_FILE, report.to_dict())
        if calibration is not None:
            write_json(staging / ENVIRONMENT_CALIBRATION_FILE, calibration)
        target = paths.environment(spec.env_id)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    index = read_index(home).without(spec.env_id)
    index.environments.append(
        EnvironmentEntry(
            env_id=spec.env_id,
            family=spec.family,
            entry_point=spec.entry_point,
            gap_id=spec.gap.get("id"),
            gap_name=spec.gap.get("name"),
            description=spec.description,
            knobs=spec.knobs,
            train_seeds=list(spec.train_seeds),
            heldout_seeds=list(spec.heldout_seeds),
            tasks=TaskCounts(train=len(train), heldout=len(heldout)),
            validity=ValiditySummary(ok=report.ok, checked_at=_now()),
            calibration=None
            if calibration is None
            else CalibrationSummary(**{k: calibration.get(k) for k in CalibrationSummary.KEYS}),
            registered_at=_now(),
        )
    )
    _write_index(home, index)
    return target


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def demonstration(env: Environment, seed: int) -> dict[str, Any]:
    """The oracle's episode on `seed` as a chat transcript, with its verdict."""
    actions = env.oracle(seed)
    episode, verdict = run_actions(env, seed, actions)
    return {
        "env_id": env.env_id,
        "seed": seed,
        "task_id": f"{env.env_id}:{seed}",
        "system_prompt": episode.task.system_prompt,
        "messages": episode.messages(),  # OpenAI chat format; the tools are in tasks_*.jsonl
        "actions": actions,
        "reward": verdict.reward,
        "passed": verdict.passed,
    }


def unregister(home: str | Path, env_id: str, missing_ok: bool = False) -> None:
    index = read_index(home)
    kept = index.without(env_id)
    if len(kept.environments) == len(index.environments) and not missing_ok:
        raise RegistryError(f"no environment {env_id!r} under {envs_dir(home)}")
    target = Home.at(home).environment(env_id)
    if target.is_dir():
        shutil.rmtree(target)
    if len(kept.environments) != len(index.environments):
        _write_index(home, kept)


def list_envs(home: str | Path) -> list[EnvironmentEntry]:
    return list(read_index(home).environments)


def entry(home: str | Path, env_id: str) -> EnvironmentEntry:
    entries = list_envs(home)
    for item in entries:
        if item.env_id == env_id:
            return item
    known = ", ".join(e.env_id for e in entries) or "none"
    raise RegistryError(f"no environment {env_id!r} under {envs_dir(home)} (registered: {known})")


def load_spec(home: str | Path, env_id: str) -> EnvironmentSpec:
    entry(home, env_id)
    path = Home.at(home).environment(env_id) / ENVIRONMENT_SPEC_FILE
    try:
        return EnvironmentSpec.load(path)
    except (OSError, ValueError, KeyError) as exc:
        raise RegistryError(f"cannot read {path}: {exc}") from None


def load(home: str | Path, env_id: str, **knobs: Any) -> Environment:
    """The registered environment, ready to `reset`/`step`."""
    return from_spec(load_spec(home, env_id), **knobs)


def validity_report_from_dict(data: Mapping[str, Any]) -> ValidityReport:
    """A validity.json document (`ValidityReport.to_dict()`) read back; RegistryDocumentError
    naming the field when it is not one."""
    if not isinstance(data, Mapping) or not isinstance(data.get("checks"), list):
        raise RegistryDocumentError(f"not a validity report (no 'checks' list): {data!r:.200}")
    checks = []
    for i, check in enumerate(data["checks"]):
        if not isinstance(check, Mapping) or not isinstance(check.get("name"), str):
            raise RegistryDocumentError(f"validity report: checks[{i}] has no 'name'")
        value = check.get("value")
        checks.append(
            Check(
                name=check["name"],
                ok=bool(check.get("ok")),
                detail=str(check.get("detail") or ""),
                value=None if value is None else float(value),
            )
        )
    return ValidityReport(
        env_id=str(data.get("env_id") or ""),
        ok=bool(data.get("ok")),
        checks=checks,
        seconds=float(data.get("seconds") or 0.0),
    )


def read_validity(home: str | Path, env_id: str) -> ValidityReport | None:
    """The validity report an environment was registered with (None when it has none)."""
    path = Home.at(home).environment(env_id) / ENVIRONMENT_VALIDITY_FILE
    try:
        data = read_json(path, default=None)
        return None if data is None else validity_report_from_dict(data)
    except (DocumentError, OSError) as exc:
        raise RegistryError(f"cannot read {path}: {exc}") from None


@dataclass(frozen=True)
class EnvironmentDetail:
    """Everything about one registered environment: its index entry, folder, spec, the
    validity report it was registered with and its calibration record (calibration.json, as
    `synthesis.calibrate` wrote it), the last two None when it has none."""

    entry: EnvironmentEntry
    path: Path
    spec: EnvironmentSpec
    validity: ValidityReport | None
    calibration: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry.to_dict(),
            "path": str(self.path),
            "spec": self.spec.to_dict(),
            "validity": None if self.validity is None else self.validity.to_dict(),
            "calibration": self.calibration,
        }


def detail(home: str | Path, env_id: str) -> EnvironmentDetail:
    """One environment's entry, spec, validity and calibration (RegistryError when it is not
    registered or a document of its folder cannot be read)."""
    item = entry(home, env_id)
    folder = Home.at(home).environment(env_id)
    path = folder / ENVIRONMENT_CALIBRATION_FILE
    try:
        calibration = read_json(path, default=None)
    except (DocumentError, OSError) as exc:
        raise RegistryError(f"cannot read {path}: {exc}") from None
    return EnvironmentDetail(
        entry=item,
        path=folder,
        spec=load_spec(home, env_id),
        validity=read_validity(home, env_id),
        calibration=calibration,
    )


def show(home: str | Path, env_id: str) -> dict[str, Any]:
    """`detail` as one JSON-ready document (what `tracegym envs show --json` prints)."""
    return detail(home, env_id).to_dict()


def sample(
    home: str | Path,
    env_id: str,
    seed: int | None = None,
    split: str = "train",
) -> dict[str, Any]:
    """One task (as exported) and its oracle demonstration."""
    env = load(home, env_id)
    assert env.spec is not None
    start, stop = env.spec.train_seeds if split == "train" else env.spec.heldout_seeds
    seed = start if seed is None else seed
    if not start <= seed < stop:
        raise RegistryError(f"seed {seed} is outside the {split} range [{start}, {stop})")
    return {"task": env.export_task(seed, split), "oracle": demonstration(env, seed)}


__all__ = [
    "CalibrationSummary",
    "EnvironmentDetail",
    "EnvironmentEntry",
    "EnvironmentIndex",
    "RegistryDocumentError",
    "RegistryError",
    "TaskCounts",
    "ValiditySummary",
    "demonstration",
    "detail",
    "entry",
    "environment_class",
    "envs_dir",
    "from_spec",
    "list_envs",
    "load",
    "load_spec",
    "read_index",
    "read_validity",
    "register",
    "sample",
    "show",
    "unregister",
    "validity_report_from_dict",
]
