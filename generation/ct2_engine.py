"""CTranslate2 as an optional rollout engine: the batching code's lanes, decoded by CTranslate2.

PyTorch (`training.batching`) stays the default and the reference. This module gives the same
interface (`Lane.generate(ids, max_new_tokens, stop_id) -> (new ids, context full)`, a wave of
lanes decoding in lockstep, `map_batched(engine, fn, items)`), so an episode written for
`batching.map_batched` runs unchanged. `engine_for(policy)` converts a policy's current weights
(a PeftModel's active LoRA adapter merged into a copy) once per distinct weights. Not wired into
the demo: measured at 1.5-2x PyTorch's speed on the shop tasks (docs/demo.md, "Rollout engines,
measured"), short of the clear win that would justify a second path.

    from tracegym.generation.ct2_engine import Ct2Engine, map_batched
    engine = Ct2Engine.from_folder(folder)            # converts once to <folder>.ct2-float32
    results = map_batched(engine, lambda lane, task: agent.run(task, lane=lane), tasks)

Why it is faster on a CPU: fused kernels and no Python per layer. float32 by default: its
greedy replies are PyTorch's (all 32 shop chats token for token); int8 weights cost the
fine-tuned model most of its passes. What it gives up: no KV cache across an episode's turns
(each reply re-reads the conversation; the prefix all lanes share, the system message, is
CTranslate2's cached `static_prompt`; rows are batched by similar length, see `_buckets`), and
sampling uses CTranslate2's own generator (not PyTorch's draws).
Needs `pip install ctranslate2` (CPU wheels on the index).
"""

from __future__ import annotations

import copy
import hashlib
import json
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tracegym.generation.batching import (
    Lane,
    Wave,
    _common_prefix,
    contiguous_split,
    run_waves,
)
from tracegym.generation.model import Policy, save_policy, weights_hash

T = TypeVar("T")
R = TypeVar("R")

MARKER = "tracegym_ct2.json"


def convert(
    folder: str | Path,
    quantization: str = "float32",
    target: str | Path | None = None,
    source_hash: str | None = None,
) -> Path:
    """The CTranslate2 model of HF folder `folder` (`<folder>.ct2-<quantization>` unless
    `target`), converted once: a folder whose weights changed is converted again."""
    import ctranslate2

    folder = Path(folder)
    target = Path(target) if target else folder.with_name(f"{folder.name}.ct2-{quantization}")
    source_hash = source_hash or weights_hash(folder)
    marker = target / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("source") == source_hash:
        return target
    converter = ctranslate2.converters.TransformersConverter(str(folder))
    converter.convert(str(target), quantization=quantization, force=True)
    config_file = target / "config.json"
    config = json.loads(config_file.read_text())
    for key in ("bos_token", "unk_token"):  # CTranslate2 refuses a null special token (the tiny
        if config.get(key) is None:  # model has no BOS); we always pass the ids ourselves
            config[key] = config.get("eos_token")
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    marker.write_text(json.dumps({"source": source_hash, "quantization": quantization}) + "\n")
    return target


@dataclass
class Ct2Engine:
    """A loaded CTranslate2 generator with its tokenizer (the HF folder's) and a name."""

    generator: Any
    tokenizer: Any
    name: str
    max_length: int = 2048

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        *,
        quantization: str = "float32",
        threads: int = 0,
        device: str = "cpu",
        target: str | Path | None = None,
    ) -> Ct2Engine:
        """Convert `folder` (once) and load it; `threads` 0 lets CTranslate2 choose."""
        from transformers import AutoConfig, AutoTokenizer

        folder = Path(folder)
        model_dir = convert(folder, quantization, target)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        limit = getattr(AutoConfig.from_pretrained(folder), "max_position_embeddings", 2048)
        meta = folder / "tracegym_model.json"
        name = json.loads(meta.read_text())["name"] if meta.exists() else folder.name
        return cls.load(model_dir, tokenizer, name, limit, quantization, threads, device)

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        tokenizer: Any,
        name: str,
        max_length: int | None,
        quantization: str = "float32",
        threads: int = 0,
        device: str = "cpu",
    ) -> Ct2Engine:
        """A converted model folder with the tokenizer it was converted with."""
        import ctranslate2

        compute = "int8" if quantization.startswith("int8") else quantization
        generator = ctranslate2.Generator(
            str(model_dir), device=device, compute_type=compute, intra_threads=threads
        )
        return cls(generator, tokenizer, f"{name}-ct2-{quantization}", max_length or 2048)


_ENGINES: dict[tuple[str, str], Ct2Engine] = {}
_ENGINES_LOCK = threading.Lock()


def _effective_model(model: Any) -> Any:
    """The plain model whose weights `model` decodes with: a PeftModel's active adapter merged
    into a copy (or dropped, when its adapter layers are disabled); the original is untouched."""
    if not hasattr(model, "merge_and_unload"):
        return model
    from peft.tuners.lora import LoraLayer

    disabled = any(m.disable_adapters for m in model.modules() if isinstance(m, LoraLayer))
    clone = copy.deepcopy(model)
    return clone.unload() if disabled else clone.merge_and_unload()


def _state_hash(model: Any) -> str:
    import torch

    h = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        h.update(key.encode())
        flat = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
        h.update(flat.numpy().tobytes())
    return h.hexdigest()[:16]


def engine_for(policy: Any, quantization: str = "float32", threads: int = 0) -> Ct2Engine:
    """The engine that decodes with `policy`'s current weights (LoRA adapters merged),
    converted once per distinct weights (`<tmp>/tracegym-ct2/model-<hash>.ct2-<quantization>`,
    the HF copy in between deleted) and kept in this process."""
    import shutil

    model = _effective_model(policy.model)
    digest = _state_hash(model)
    with _ENGINES_LOCK:
        engine = _ENGINES.get((digest, quantization))
        if engine is None:
            root = Path(tempfile.gettempdir()) / "tracegym-ct2"
            target = root / f"model-{digest}.ct2-{quantization}"
            marker = target / MARKER
            if not (marker.exists() and json.loads(marker.read_text())["source"] == digest):
                root.mkdir(parents=True, exist_ok=True)
                staging = Path(tempfile.mkdtemp(prefix=".hf-", dir=root))
                try:
                    save_policy(Policy(model, policy.tokenizer, policy.name), staging / "hf")
                    convert(staging / "hf", quantization, target, source_hash=digest)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
            config = getattr(policy.model, "config", None)
            limit = getattr(config, "max_position_embeddings", None)
            device = "cuda" if str(policy.device).startswith("cuda") else "cpu"
            engine = Ct2Engine.load(
                target, policy.tokenizer, policy.name, limit, quantization, threads, device
            )
            _ENGINES[(digest, quantization)] = engine
    return engine


class Ct2Wave(Wave):
    """`batching.Wave`'s lockstep protocol (the last waiting lane runs the step), with each
    step one `generate_batch` call for every waiting lane. The prefix all lanes share on the
    first step (the system message) is passed as `static_prompt`, which CTranslate2 prefills
    once and caches."""

    def __init__(
        self,
        engine: Ct2Engine,
        size: int,
        *,
        temperature: float = 0.0,
        seed: int = 0,
        max_length: int | None = None,
        min_prefix: int = 16,
        buckets: bool = True,
    ) -> None:
        self.engine = engine
        self.buckets = buckets
        self.size = size
        self.temperature = temperature
        self.seed = seed
        self.min_prefix = max(1, min_prefix)
        self.max_length = min(max_length or engine.max_length, engine.max_length)
        self._cond = threading.Condition()
        self._live = set(range(size))
        self._pending: dict[int, tuple[list[int], int, int]] = {}
        self._results: dict[int, tuple[list[int], bool]] = {}
        self._error: BaseException | None = None
        self._prefix: list[int] | None = None
        self.stats = {"forwards": 0, "tokens": 0, "shared": 0}
        self.lanes = [Lane(self, i) for i in range(size)]

    def _step(
        self, pending: dict[int, tuple[list[int], int, int]]
    ) -> dict[int, tuple[list[int], bool]]:
        if self._prefix is None:
            seqs = [ids for ids, _, _ in pending.values()]
            shared = min(_common_prefix(seqs), min(len(s) for s in seqs) - 1)
            self._prefix = seqs[0][:shared] if shared >= self.min_prefix and len(seqs) > 1 else []
        prefix = self._prefix
        results: dict[int, tuple[list[int], bool]] = {}
        groups: dict[tuple[int, int], list[int]] = {}
        for slot, (ids, max_new, stop_id) in pending.items():
            room = self.max_length - len(ids)
            if room <= 0:
                results[slot] = ([], True)
            else:
                groups.setdefault((min(max_new, room), stop_id), []).append(slot)
        for (limit, stop_id), slots in groups.items():
            # the shared prefix only when every row has it and a token of its own after it
            use = bool(prefix) and all(
                pending[s][0][: len(prefix)] == prefix and len(pending[s][0]) > len(prefix)
                for s in slots
            )
            cut = len(prefix) if use else 0
            lengths = [len(pending[s][0]) - cut for s in slots]
            for part in _buckets(lengths, limit) if self.buckets else [list(range(len(slots)))]:
                rows = [slots[i] for i in part]
                results.update(self._generate(pending, rows, limit, stop_id, prefix[:cut]))
        return results

    def _generate(
        self,
        pending: dict[int, tuple[list[int], int, int]],
        slots: list[int],
        limit: int,
        stop_id: int,
        prefix: list[int],
    ) -> dict[int, tuple[list[int], bool]]:
        """One `generate_batch` call for `slots`, `prefix` (maybe empty) as the static prompt."""
        convert = self.engine.tokenizer.convert_ids_to_tokens
        cut = len(prefix)
        sampling = (
            {"sampling_topk": 0, "sampling_temperature": self.temperature}
            if self.temperature and self.temperature > 0
            else {"sampling_topk": 1}
        )
        out = self.engine.generator.generate_batch(
            [convert(pending[s][0][cut:]) for s in slots],
            max_length=limit,
            end_token=[stop_id],
            return_end_token=True,
            include_prompt_in_result=False,
            static_prompt=convert(prefix) if prefix else None,
            **sampling,
        )
        self.stats["forwards"] += 1
        results = {}
        for slot, result in zip(slots, out, strict=True):
            new = list(result.sequences_ids[0])
            ids, max_new, _ = pending[slot]
            self.stats["tokens"] += len(ids) - cut + len(new)
            self.stats["shared"] += cut
            stopped = bool(new) and new[-1] == stop_id
            full = not stopped and len(new) < max_new and len(ids) + len(new) >= self.max_length
            results[slot] = (new, full)
        return results


def _buckets(lengths: list[int], tail: int, step_rows: float = 8.0) -> list[list[int]]:
    """Indexes of `lengths` split into groups of similar prompt length, each one
    `generate_batch` call. CTranslate2 prefills a batch up to its shortest prompt and feeds the
    rest one token a step, so a group costs about (spread + tail) steps of (step_rows + rows)
    row-costs (a CPU step's fixed cost is about 8 rows' on SmolLM2); the split minimising the
    sum is found exactly over the lengths in order."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)

    def cost(i: int, j: int) -> float:
        spread = lengths[order[j - 1]] - lengths[order[i]]
        return (spread + tail) * (step_rows + j - i)

    return contiguous_split(order, cost)


def map_batched(
    engine: Ct2Engine,
    fn: Callable[[Lane, T], R],
    items: Iterable[T],
    *,
    batch_size: int = 8,
    temperature: float = 0.0,
    seed: int = 0,
    on_done: Callable[[R], None] | None = None,
    stats: dict[str, int] | None = None,
) -> list[R]:
    """`batching.map_batched` over CTranslate2 waves: `[fn(lane, item) for item in items]`,
    `batch_size` at a time in threads, results in the order of `items`."""
    import ctranslate2

    if temperature and temperature > 0:
        ctranslate2.set_random_seed(seed)
    return run_waves(
        lambda start, n: Ct2Wave(engine, n, temperature=temperature, seed=seed + start),
        fn, items, batch_size=batch_size, on_done=on_done, stats=stats,
    )  # fmt: skip


__all__ = ["Ct2Engine", "Ct2Wave", "convert", "engine_for", "map_batched"]
