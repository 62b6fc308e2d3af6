"""The adapter registry: one folder per capability's LoRA adapter under `<home>/adapters/`.

    <home>/adapters/<adapter_id>/meta.json     capability id and name, base model and its hash,
                                               data hash, hyperparameters, train and eval
                                               metrics, promotion, created_at
    <home>/adapters/<adapter_id>/weights/      the peft adapter (adapter_config.json, weights)
    <home>/adapters/<adapter_id>/router.json   texts the router matches tasks against

A folder is written to a staging directory and renamed into place, so a half-written adapter is
never seen. `load_adapters(policy, ids)` puts registered adapters on a base model (one PeftModel,
one named adapter each).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

META_VERSION = 1


class AdapterError(LookupError):
    """An adapter that is not registered, or a registry folder that cannot be read."""


def adapters_dir(home: str | Path) -> Path:
    return Path(home) / "adapters"


def adapter_id_for(env_id: str) -> str:
    """Adapter ids are safe folder and peft adapter names (no dots, slashes or spaces)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", env_id).strip("_") or "adapter"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)


def save_adapter(
    home: str | Path,
    model: Any,
    adapter_name: str,
    *,
    capability: dict[str, Any],
    base_model: dict[str, Any],
    data_hash: str,
    hyperparameters: dict[str, Any],
    train_metrics: dict[str, Any],
    router_texts: Sequence[str] = (),
) -> Path:
    """Write `model`'s adapter `adapter_name` (a PeftModel) and its metadata, atomically."""
    root = adapters_dir(home)
    root.mkdir(parents=True, exist_ok=True)
    target = root / adapter_name
    staging = Path(tempfile.mkdtemp(prefix=f".{adapter_name}.", dir=root))
    try:
        model.save_pretrained(str(staging / "peft"), selected_adapters=[adapter_name])
        found = next((staging / "peft").rglob("adapter_config.json"), None)
        if found is None:
            raise AdapterError(f"peft wrote no adapter_config.json for {adapter_name}")
        os.replace(found.parent, staging / "weights")
        shutil.rmtree(staging / "peft", ignore_errors=True)
        meta = {
            "version": META_VERSION,
            "adapter_id": adapter_name,
            "capability": capability,  # {"id", "name", "env_id", "family"}
            "base_model": base_model,  # {"name", "hash", "folder"}
            "data_hash": data_hash,
            "hyperparameters": hyperparameters,
            "metrics": {"train": train_metrics, "eval": None},
            "promoted": False,
            "promotion": "not evaluated yet",
            "created_at": _now(),
        }
        write_json_atomic(staging / "meta.json", meta)
        write_json_atomic(staging / "router.json", {"texts": list(router_texts)})
        if target.exists():
            old = root / f".{adapter_name}.old.{os.getpid()}"
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def list_adapters(home: str | Path) -> list[dict[str, Any]]:
    """Every registered adapter's metadata, by id (half-written folders are skipped)."""
    root = adapters_dir(home)
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(root.iterdir()):
        meta = folder / "meta.json"
        if folder.name.startswith(".") or not meta.exists():
            continue
        try:
            out.append(json.loads(meta.read_text()))
        except ValueError:
            continue
    return out


def show(home: str | Path, adapter_id: str) -> dict[str, Any]:
    folder = adapters_dir(home) / adapter_id
    meta = folder / "meta.json"
    if not meta.exists():
        known = ", ".join(a["adapter_id"] for a in list_adapters(home)) or "none"
        raise AdapterError(f"no adapter {adapter_id!r} under {adapters_dir(home)} (have: {known})")
    try:
        data = json.loads(meta.read_text())
    except ValueError as exc:
        raise AdapterError(f"{meta} is not valid JSON: {exc}") from None
    data["path"] = str(folder)
    router = folder / "router.json"
    data["router_texts"] = len(json.loads(router.read_text())["texts"]) if router.exists() else 0
    return data


def update(home: str | Path, adapter_id: str, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into an adapter's meta.json (e.g. eval metrics, promotion)."""
    meta_path = adapters_dir(home) / adapter_id / "meta.json"
    meta = show(home, adapter_id)
    meta.pop("path", None)
    meta.pop("router_texts", None)
    for key, value in fields.items():
        if key == "eval":
            meta["metrics"]["eval"] = value
        else:
            meta[key] = value
    write_json_atomic(meta_path, meta)
    return meta


def router_texts(home: str | Path, adapter_id: str) -> list[str]:
    path = adapters_dir(home) / adapter_id / "router.json"
    return list(json.loads(path.read_text())["texts"]) if path.exists() else []


def load_adapters(model: Any, home: str | Path, adapter_ids: Sequence[str]) -> Any:
    """`model` (a base model or a PeftModel) with the registered adapters loaded by name."""
    from peft import PeftModel
    from tracegym.generation.model import quiet_peft

    for adapter_id in adapter_ids:
        path = adapters_dir(home) / adapter_id / "weights"
        if not (path / "adapter_config.json").exists():
            raise AdapterError(f"adapter {adapter_id!r} has no weights at {path}")
        if isinstance(model, PeftModel):
            if adapter_id not in model.peft_config:
                model.load_adapter(str(path), adapter_name=adapter_id)
        else:
            with quiet_peft():
                model = PeftModel.from_pretrained(model, str(path), adapter_name=adapter_id)
    model.eval()
    return model


__all__ = [
    "AdapterError",
    "adapter_id_for",
    "adapters_dir",
    "list_adapters",
    "load_adapters",
    "router_texts",
    "save_adapter",
    "show",
    "update",
    "write_json_atomic",
]
