"""The compute floor of a stage: the matmul work its tokens need, over what this machine's cores
do in matmul, measured in the same run. A stage's wall time over its floor says how far it is
from what the hardware allows.

    shape = ModelShape.from_folder(folder)
    probe = matmul_gflops(shape.hidden, shape.intermediate, rows=256)  # GFLOP/s, these threads
    work = stage_flops(shape, counts)  # counts: tokens.TokenCounts
    floor_seconds = work["total"] / (probe * 1e9)

FLOPs, counted as 2 x multiply-adds of the weights a token goes through (attention's score
products, about 4 x context x hidden per layer, are left out, so this is a floor):

    fed token          2 x the layers' parameters (the input embedding is a lookup)
    generated token    + 2 x the output head (decoding keeps the logits of the last column only)
    trained token      forward 2 x (layers + head), backward 2 x (head + the layers from the
                       lowest LoRA layer up): frozen weights need no weight gradient, only the
                       gradient through them; LoRA's own products are a rounding error. The usual
                       6 x parameters of a full fine-tune is printed beside it (`six_n`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a decoder-only model."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    layer_params: int  # parameters of one decoder layer
    head_params: int  # the output projection (vocab x hidden, tied or not)

    @property
    def body_params(self) -> int:
        return self.layers * self.layer_params

    @property
    def params(self) -> int:
        """Parameters a token's forward pass multiplies by (layers and head)."""
        return self.body_params + self.head_params

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """From a Llama-style config.json (SmolLM2, the tiny test model)."""
        d = int(config["hidden_size"])
        ff = int(config["intermediate_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or d // heads)
        attention = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2  # q, o; k, v
        mlp = 3 * d * ff  # gate, up, down
        layer = attention + mlp + 2 * d  # two norms
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=d,
            intermediate=ff,
            vocab=int(config["vocab_size"]),
            layer_params=layer,
            head_params=int(config["vocab_size"]) * d,
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ModelShape:
        return cls.from_config(json.loads((Path(folder) / "config.json").read_text()))


def stage_flops(shape: ModelShape, counts: Any, lora_layers: int | None = None) -> dict[str, float]:
    """The matmul FLOPs of `counts` (a `tokens.TokenCounts`): generation, training (with the
    backward pass through the top `lora_layers` layers; None: all of them), their total, and
    the training part by the 6 x parameters rule."""
    backward_layers = shape.layers if lora_layers is None else lora_layers
    generation = 2 * shape.body_params * counts.fed + 2 * shape.head_params * counts.generated
    per_trained = 2 * shape.params + 2 * (shape.head_params + backward_layers * shape.layer_params)
    training = per_trained * counts.trained
    return {
        "generation": float(generation),
        "training": float(training),
        "total": float(generation + training),
        "six_n": float(6 * shape.params * counts.trained),
    }


def matmul_gflops(
    k: int, n: int, *, rows: int = 256, seconds: float = 0.5, threads: int | None = None
) -> float:
    """fp32 GFLOP/s of a `[rows, k] @ [k, n]` matmul on this machine now (the best of repeated
    timings over about `seconds`), with torch's current thread count or `threads`."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        a = torch.randn(rows, k)
        b = torch.randn(k, n)
        out = torch.empty(rows, n)
        flops = 2.0 * rows * k * n
        reps = max(1, int(2e8 // flops))  # about 0.2 GFLOP a timing, a few ms
        torch.matmul(a, b, out=out)  # warm up
        best = float("inf")
        deadline = time.perf_counter() + seconds
        while True:
            started = time.perf_counter()
            for _ in range(reps):
                torch.matmul(a, b, out=out)
            best = min(best, (time.perf_counter() - started) / reps)
            if time.perf_counter() > deadline:
                break
        return flops / best / 1e9
    finally:
        torch.set_num_threads(before)


__all__ = ["ModelShape", "matmul_gflops", "stage_flops"]
