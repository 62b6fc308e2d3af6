"""The adapter registry: one folder per capability's LoRA adapter under `<home>/adapters/`.

    <home>/adapters/<adapter_id>/meta.json     capability id and name, base model and its hash,
                                               data hash, hyperparameters, train and eval
                                               metrics, promotion, created_at
    <home>/adapters/<adapter_id>/weights/      the peft adapter (adapter_config.json, weights)
    <home>/adapters/<adapter_id>/router.json   texts the router matches tasks against

A folder is written to a staging directory and renamed into place, so a half-written adapter is
never seen. `load_adapters(policy, ids)` puts registered adapters on a base model (one PeftModel,
one named adapter each).

meta.json is an `AdapterMetadata` (with `CapabilityRef`, `BaseModelRef`, `AdapterMetrics` and
the evaluation's `training.evaluate.EvaluationRow`) and router.json a `RouterTexts`; read them
with `metadata`, `all_metadata` and `read_router_texts`, change them with `update_metadata`.
`show` is the JSON view `tracegym adapters show --json` prints.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tracegym.generation.model import quiet_peft
from tracegym.store.home import DocumentError, Home, read_json, write_json
from tracegym.training.evaluate import EvaluationError, EvaluationRow

if TYPE_CHECKING:
    from tracegym.training.evaluate import EvaluationRow

META_FILE = "meta.json"
ROUTER_FILE = "router.json"
WEIGHTS_DIR = "weights"


class AdapterError(LookupError):
    """An adapter that is not registered, or a registry folder that cannot be read."""


class AdapterDocumentError(AdapterError, DocumentError):
    """An adapter's meta.json or router.json that is not the document its reader needs."""


def _text(data: Mapping[str, Any], key: str, what: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise AdapterDocumentError(f"{what} needs a '{key}' string, got {value!r}")
    return value


def _object(data: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise AdapterDocumentError(f"{what} must be an object, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class CapabilityRef:
    """The capability an adapter learnt: its gap(s), the environments it trained on (`env_id`
    the first, `env_ids` all of them), their family and the action they teach."""

    id: str
    name: str
    env_id: str
    env_ids: tuple[str, ...]
    family: str
    action: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "env_id": self.env_id,
            "env_ids": list(self.env_ids),
            "family": self.family,
            "action": self.action,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapabilityRef:
        """A record as written (before `env_ids`: its one `env_id`; before `action`: None)."""
        data = _object(data, "an adapter's 'capability'")
        env_id = _text(data, "env_id", "an adapter's 'capability'")
        env_ids = data.get("env_ids") or [env_id]
        if not isinstance(env_ids, list):
            raise AdapterDocumentError(f"'capability.env_ids' must be a list, got {env_ids!r}")
        action = data.get("action")
        return cls(
            id=str(data.get("id") or env_id),
            name=str(data.get("name") or env_id),
            env_id=env_id,
            env_ids=tuple(str(e) for e in env_ids),
            family=str(data.get("family") or ""),
            action=str(action) if action else None,
        )


@dataclass(frozen=True)
class BaseModelRef:
    """The base model an adapter was trained on: its name, weights hash and folder."""

    name: str
    hash: str
    folder: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "hash": self.hash, "folder": self.folder}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaseModelRef:
        data = _object(data, "an adapter's 'base_model'")
        what = "an adapter's 'base_model'"
        return cls(
            name=_text(data, "name", what),
            hash=_text(data, "hash", what, ""),
            folder=_text(data, "folder", what, ""),
        )


@dataclass(frozen=True)
class AdapterMetrics:
    """Training metrics (`TrainMetrics.to_dict()`: loss, tokens, speed, data counts) and the
    held-out evaluation, None until the adapter is evaluated."""

    train: dict[str, Any]
    eval: EvaluationRow | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"train": self.train, "eval": self.eval.to_dict() if self.eval else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdapterMetrics:
        data = _object(data, "an adapter's 'metrics'")
        train = _object(data.get("train") or {}, "an adapter's 'metrics.train'")
        row = data.get("eval")
        try:
            evaluation = EvaluationRow.from_dict(row) if row is not None else None
        except EvaluationError as exc:
            raise AdapterDocumentError(f"an adapter's 'metrics.eval': {exc}") from None
        return cls(train=dict(train), eval=evaluation)


@dataclass(frozen=True)
class AdapterMetadata:
    """An adapter's meta.json: what it learnt, from which base model and data, with which
    settings, how it trained and evaluated, and whether it is promoted (the router uses only
    promoted adapters). The nightly adds `train_key` (what the training depended on) and
    `night` (when it trained); `extra` keeps keys this version does not know."""

    VERSION: ClassVar[int] = 2

    adapter_id: str
    capability: CapabilityRef
    base_model: BaseModelRef
    data_hash: str
    hyperparameters: dict[str, Any]
    metrics: AdapterMetrics
    promoted: bool = False
    promotion: str = "not evaluated yet"
    created_at: str = ""
    train_key: str | None = None
    night: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION

    _KEYS: ClassVar[tuple[str, ...]] = (
        "version", "adapter_id", "capability", "base_model", "data_hash", "hyperparameters",
        "metrics", "promoted", "promotion", "created_at", "train_key", "night",
    )  # fmt: skip

    @property
    def env_ids(self) -> list[str]:
        """The environments the adapter learnt (older metadata: its one env_id)."""
        return list(self.capability.env_ids)

    @property
    def evaluation(self) -> EvaluationRow | None:
        return self.metrics.eval

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.version,
            "adapter_id": self.adapter_id,
            "capability": self.capability.to_dict(),
            "base_model": self.base_model.to_dict(),
            "data_hash": self.data_hash,
            "hyperparameters": self.hyperparameters,
            "metrics": self.metrics.to_dict(),
            "promoted": self.promoted,
            "promotion": self.promotion,
            "created_at": self.created_at,
        }
        if self.train_key is not None:
            out["train_key"] = self.train_key
        if self.night is not None:
            out["night"] = self.night
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdapterMetadata:
        """A meta.json as written by any version up to this one (version 1 has the same keys;
        a document without a version is read as version 0)."""
        data = _object(data, "an adapter's meta.json")
        adapter_id = _text(data, "adapter_id", "an adapter's meta.json")
        version = data.get("version", 0)
        if not isinstance(version, int) or version > cls.VERSION:
            raise AdapterDocumentError(
                f"adapter {adapter_id!r}: meta.json version {version!r} is not one this "
                f"tracegym reads (up to {cls.VERSION})"
            )
        for key in ("capability", "base_model"):
            if key not in data:
                raise AdapterDocumentError(f"adapter {adapter_id!r}: meta.json has no '{key}'")
        hyperparameters = _object(data.get("hyperparameters") or {}, "'hyperparameters'")
        train_key, night = data.get("train_key"), data.get("night")
        return cls(
            version=cls.VERSION,
            adapter_id=adapter_id,
            capability=CapabilityRef.from_dict(data["capability"]),
            base_model=BaseModelRef.from_dict(data["base_model"]),
            data_hash=str(data.get("data_hash") or ""),
            hyperparameters=dict(hyperparameters),
            metrics=AdapterMetrics.from_dict(data.get("metrics") or {}),
            promoted=bool(data.get("promoted", False)),
            promotion=str(data.get("promotion") or "not evaluated yet"),
            created_at=str(data.get("created_at") or ""),
            train_key=str(train_key) if train_key is not None else None,
            night=str(night) if night is not None else None,
            extra={k: v for k, v in data.items() if k not in cls._KEYS},
        )


@dataclass(frozen=True)
class RouterTexts:
    """An adapter's router.json: the texts the router matches tasks against (its gap's name
    and description, then its training requests)."""

    VERSION: ClassVar[int] = 1

    texts: tuple[str, ...]
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "texts": list(self.texts)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RouterTexts:
        data = _object(data, "an adapter's router.json")
        texts = data.get("texts")
        if not isinstance(texts, list):
            raise AdapterDocumentError(f"router.json needs a 'texts' list, got {texts!r}")
        return cls(texts=tuple(str(t) for t in texts))


def adapters_dir(home: str | os.PathLike[str]) -> Path:
    return Home.at(home).adapters


def adapter_id_for(env_id: str) -> str:
    """Adapter ids are safe folder and peft adapter names (no dots, slashes or spaces)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", env_id).strip("_") or "adapter"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def save_adapter(
    home: str | os.PathLike[str],
    model: Any,
    adapter_name: str,
    *,
    capability: CapabilityRef | Mapping[str, Any],
    base_model: BaseModelRef | Mapping[str, Any],
    data_hash: str,
    hyperparameters: Mapping[str, Any],
    train_metrics: Mapping[str, Any],
    router_texts: Sequence[str] = (),
) -> Path:
    """Write `model`'s adapter `adapter_name` (a PeftModel) and its metadata, atomically."""
    if not isinstance(capability, CapabilityRef):
        capability = CapabilityRef.from_dict(capability)
    if not isinstance(base_model, BaseModelRef):
        base_model = BaseModelRef.from_dict(base_model)
    root = adapters_dir(home)
    root.mkdir(parents=True, exist_ok=True)
    target = root / adapter_name
    staging = Path(tempfile.mkdtemp(prefix=f".{adapter_name}.", dir=root))
    try:
        model.save_pretrained(str(staging / "peft"), selected_adapters=[adapter_name])
        found = next((staging / "peft").rglob("adapter_config.json"), None)
        if found is None:
            raise AdapterError(f"peft wrote no adapter_config.json for {adapter_name}")
        os.replace(found.parent, staging / WEIGHTS_DIR)
        shutil.rmtree(staging / "peft", ignore_errors=True)
        meta = AdapterMetadata(
            adapter_id=adapter_name,
            capability=capability,
            base_model=base_model,
            data_hash=data_hash,
            hyperparameters=dict(hyperparameters),
            metrics=AdapterMetrics(train=dict(train_metrics)),
            created_at=_now(),
        )
        write_json(staging / META_FILE, meta.to_dict())
        write_json(staging / ROUTER_FILE, RouterTexts(tuple(router_texts)).to_dict())
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


def _read_metadata(path: Path) -> AdapterMetadata:
    try:
        return AdapterMetadata.from_dict(read_json(path))
    except AdapterDocumentError as exc:
        raise AdapterDocumentError(f"{path}: {exc}") from None
    except DocumentError as exc:
        raise AdapterDocumentError(str(exc)) from None


def all_metadata(home: str | os.PathLike[str]) -> list[AdapterMetadata]:
    """Every registered adapter's metadata, by id (half-written folders and unreadable
    documents are skipped)."""
    root = adapters_dir(home)
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(root.iterdir()):
        meta = folder / META_FILE
        if folder.name.startswith(".") or not meta.exists():
            continue
        try:
            out.append(_read_metadata(meta))
        except DocumentError:
            continue
    return out


def metadata(home: str | os.PathLike[str], adapter_id: str) -> AdapterMetadata:
    """One adapter's metadata; AdapterError names the registered ones when it is missing."""
    meta = adapters_dir(home) / adapter_id / META_FILE
    if not meta.exists():
        known = ", ".join(a.adapter_id for a in all_metadata(home)) or "none"
        raise AdapterError(f"no adapter {adapter_id!r} under {adapters_dir(home)} (have: {known})")
    return _read_metadata(meta)


def update_metadata(
    home: str | os.PathLike[str],
    adapter_id: str,
    *,
    eval: EvaluationRow | Mapping[str, Any] | None = None,
    **fields: Any,
) -> AdapterMetadata:
    """Record an evaluation (`eval`, into `metrics.eval`) and other fields (`promoted`,
    `promotion`, `train_key`, `night`, ...) in an adapter's meta.json."""
    meta = metadata(home, adapter_id)
    if eval is not None:
        row = eval if isinstance(eval, EvaluationRow) else EvaluationRow.from_dict(eval)
        meta = replace(meta, metrics=replace(meta.metrics, eval=row))
    typed = {"capability": CapabilityRef, "base_model": BaseModelRef, "metrics": AdapterMetrics}
    for key, kind in typed.items():
        if isinstance(fields.get(key), Mapping):
            fields[key] = kind.from_dict(fields[key])
    known = {k: v for k, v in fields.items() if k in AdapterMetadata._KEYS}
    extra = {k: v for k, v in fields.items() if k not in AdapterMetadata._KEYS}
    meta = replace(meta, **known, extra={**meta.extra, **extra})
    write_json(adapters_dir(home) / adapter_id / META_FILE, meta.to_dict())
    return meta


def read_router_texts(home: str | os.PathLike[str], adapter_id: str) -> RouterTexts:
    """An adapter's router texts (none when it has no router.json)."""
    path = adapters_dir(home) / adapter_id / ROUTER_FILE
    if not path.exists():
        return RouterTexts(())
    try:
        return RouterTexts.from_dict(read_json(path))
    except DocumentError as exc:
        raise AdapterDocumentError(f"{path}: {exc}") from None


# The JSON view `tracegym adapters show --json` prints.
def show(home: str | os.PathLike[str], adapter_id: str) -> dict[str, Any]:
    """`metadata` as a JSON object, with its folder (`path`) and number of `router_texts`."""
    data = metadata(home, adapter_id).to_dict()
    data["path"] = str(adapters_dir(home) / adapter_id)
    data["router_texts"] = len(read_router_texts(home, adapter_id).texts)
    return data


def router_texts(home: str | os.PathLike[str], adapter_id: str) -> list[str]:
    return list(read_router_texts(home, adapter_id).texts)


def load_adapters(model: Any, home: str | os.PathLike[str], adapter_ids: Sequence[str]) -> Any:
    """`model` (a base model or a PeftModel) with the registered adapters loaded by name."""
    from peft import PeftModel

    for adapter_id in adapter_ids:
        path = adapters_dir(home) / adapter_id / WEIGHTS_DIR
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


EXPORT_MANIFEST = "tracegym_adapters.json"


@dataclass(frozen=True)
class ExportManifest:
    """The manifest `export_adapters` writes beside the folders: the base model's name and, per
    adapter, its folder (relative to the manifest) and capability."""

    VERSION: ClassVar[int] = 1

    base_model: str
    adapters: dict[str, str]
    capabilities: dict[str, str] = field(default_factory=dict)
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "base_model": self.base_model,
            "adapters": [
                {"id": a, "path": path, "capability": self.capabilities.get(a, "")}
                for a, path in self.adapters.items()
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExportManifest:
        data = _object(data, EXPORT_MANIFEST)
        rows = data.get("adapters")
        if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
            raise AdapterDocumentError(f"{EXPORT_MANIFEST} needs an 'adapters' list of objects")
        return cls(
            base_model=_text(data, "base_model", EXPORT_MANIFEST),
            adapters={str(r.get("id")): str(r.get("path")) for r in rows},
            capabilities={str(r.get("id")): str(r.get("capability") or "") for r in rows},
        )

    def vllm_command(self, root: str | os.PathLike[str]) -> str:
        modules = " ".join(f"{a}={Path(root) / p}" for a, p in self.adapters.items())
        return f"vllm serve {self.base_model} --enable-lora --lora-modules {modules}"

    def sglang_command(self, root: str | os.PathLike[str]) -> str:
        paths = " ".join(f"{a}={Path(root) / p}" for a, p in self.adapters.items())
        return f"python -m sglang.launch_server --model-path {self.base_model} --lora-paths {paths}"


def export_adapters(
    home: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    base_model: str | None = None,
) -> ExportManifest:
    """Copy each promoted adapter's weights to `target/<id>/` as a plain peft folder whose
    `adapter_config.json` names the base model by `base_model` (default: the name the adapters
    were trained on), not by a local folder, so vLLM and SGLang load them beside the base model
    they serve; writes the manifest. Each folder is replaced whole (staged, then renamed)."""
    promoted = [m for m in all_metadata(home) if m.promoted]
    if not promoted:
        raise AdapterError("no promoted adapters to export")
    names = {m.base_model.name for m in promoted}
    if base_model is None:
        if len(names) > 1:
            raise AdapterError(
                f"the promoted adapters were trained on different base models "
                f"({', '.join(sorted(names))}): pass the one to name with --base-model"
            )
        base_model = names.pop()
    root = Path(target)
    if root.exists() and not root.is_dir():
        raise AdapterError(f"{root} exists and is not a folder")
    for meta in promoted:
        source = adapters_dir(home) / meta.adapter_id / WEIGHTS_DIR
        if not (source / "adapter_config.json").exists():
            raise AdapterError(f"adapter {meta.adapter_id!r} has no weights at {source}")
    root.mkdir(parents=True, exist_ok=True)
    exported: dict[str, str] = {}
    for meta in promoted:
        source = adapters_dir(home) / meta.adapter_id / WEIGHTS_DIR
        staging = Path(tempfile.mkdtemp(prefix=f".{meta.adapter_id}.", dir=root))
        try:
            folder = staging / "peft"
            shutil.copytree(source, folder)
            config = read_json(folder / "adapter_config.json")
            write_json(
                folder / "adapter_config.json", {**config, "base_model_name_or_path": base_model}
            )
            final = root / meta.adapter_id
            if final.exists():
                shutil.rmtree(final)
            os.replace(folder, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        exported[meta.adapter_id] = meta.adapter_id
    manifest = ExportManifest(
        base_model=base_model,
        adapters=exported,
        capabilities={m.adapter_id: m.capability.name for m in promoted},
    )
    write_json(root / EXPORT_MANIFEST, manifest.to_dict())
    return manifest


__all__ = [
    "AdapterDocumentError",
    "AdapterError",
    "AdapterMetadata",
    "AdapterMetrics",
    "BaseModelRef",
    "CapabilityRef",
    "ExportManifest",
    "RouterTexts",
    "adapter_id_for",
    "adapters_dir",
    "all_metadata",
    "export_adapters",
    "load_adapters",
    "metadata",
    "read_router_texts",
    "router_texts",
    "save_adapter",
    "show",
    "update_metadata",
]
