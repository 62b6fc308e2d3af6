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
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tracegym.synthesis.base import Environment, run_actions
from tracegym.synthesis.spec import EnvironmentSpec
from tracegym.synthesis.validity import ValidityReport, check_environment

INDEX_VERSION = 1


class RegistryError(LookupError):
    """An environment that is not registered, or a registry that cannot be read."""


def envs_dir(home: str | Path) -> Path:
    return Path(home) / "envs"


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


def read_index(home: str | Path) -> dict[str, Any]:
    path = envs_dir(home) / "index.json"
    if not path.exists():
        return {"version": INDEX_VERSION, "environments": []}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise RegistryError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("environments"), list):
        raise RegistryError(f"{path} is not a tracegym environment index")
    return data


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(
        json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8"
    )
    os.replace(tmp, path)


def _write_index(home: str | Path, index: dict[str, Any]) -> None:
    envs_dir(home).mkdir(parents=True, exist_ok=True)
    index["environments"].sort(key=lambda e: e["env_id"])
    _write_json(envs_dir(home) / "index.json", index)


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
    root = envs_dir(home)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.env_id}.", dir=root))
    try:
        spec.save(staging / "spec.json")
        t0, t1 = spec.train_seeds
        h0, h1 = spec.heldout_seeds
        train = range(t0, min(t1, t0 + n_train))
        heldout = range(h0, min(h1, h0 + n_heldout))
        _jsonl(staging / "tasks_train.jsonl", (env.export_task(s, "train") for s in train))
        _jsonl(staging / "tasks_heldout.jsonl", (env.export_task(s, "heldout") for s in heldout))
        _jsonl(staging / "demos_train.jsonl", (demonstration(env, s) for s in train))
        _write_json(staging / "validity.json", report.to_dict())
        if calibration is not None:
            _write_json(staging / "calibration.json", calibration)
        target = root / spec.env_id
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    index = read_index(home)
    index["environments"] = [e for e in index["environments"] if e["env_id"] != spec.env_id]
    index["environments"].append(
        {
            "env_id": spec.env_id,
            "family": spec.family,
            "entry_point": spec.entry_point,
            "gap_id": spec.gap.get("id"),
            "gap_name": spec.gap.get("name"),
            "description": spec.description,
            "knobs": spec.knobs,
            "train_seeds": list(spec.train_seeds),
            "heldout_seeds": list(spec.heldout_seeds),
            "tasks": {"train": len(train), "heldout": len(heldout)},
            "validity": {"ok": report.ok, "checked_at": _now()},
            "calibration": None
            if calibration is None
            else {
                k: calibration.get(k) for k in ("pass_at_1", "pass_at_k", "k", "in_band", "policy")
            },
            "registered_at": _now(),
        }
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
    kept = [e for e in index["environments"] if e["env_id"] != env_id]
    if len(kept) == len(index["environments"]) and not missing_ok:
        raise RegistryError(f"no environment {env_id!r} under {envs_dir(home)}")
    target = envs_dir(home) / env_id
    if target.is_dir():
        shutil.rmtree(target)
    if len(kept) != len(index["environments"]):
        index["environments"] = kept
        _write_index(home, index)


def list_envs(home: str | Path) -> list[dict[str, Any]]:
    return list(read_index(home)["environments"])


def entry(home: str | Path, env_id: str) -> dict[str, Any]:
    for item in list_envs(home):
        if item["env_id"] == env_id:
            return item
    known = ", ".join(e["env_id"] for e in list_envs(home)) or "none"
    raise RegistryError(f"no environment {env_id!r} under {envs_dir(home)} (registered: {known})")


def load_spec(home: str | Path, env_id: str) -> EnvironmentSpec:
    entry(home, env_id)
    path = envs_dir(home) / env_id / "spec.json"
    try:
        return EnvironmentSpec.load(path)
    except (OSError, ValueError, KeyError) as exc:
        raise RegistryError(f"cannot read {path}: {exc}") from None


def load(home: str | Path, env_id: str, **knobs: Any) -> Environment:
    """The registered environment, ready to `reset`/`step`."""
    return from_spec(load_spec(home, env_id), **knobs)


def show(home: str | Path, env_id: str) -> dict[str, Any]:
    """Everything about one environment: index entry, spec, validity, calibration."""
    item = entry(home, env_id)
    folder = envs_dir(home) / env_id
    out = {"entry": item, "path": str(folder), "spec": load_spec(home, env_id).to_dict()}
    for name in ("validity", "calibration"):
        path = folder / f"{name}.json"
        out[name] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    return out


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
    "RegistryError",
    "demonstration",
    "entry",
    "environment_class",
    "envs_dir",
    "from_spec",
    "list_envs",
    "load",
    "load_spec",
    "read_index",
    "register",
    "sample",
    "show",
    "unregister",
]
