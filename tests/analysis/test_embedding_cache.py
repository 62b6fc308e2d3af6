"""The embedding cache under concurrent analyses and on a disk that refuses it: whole files, and
the analysis never dies for its cache."""

from __future__ import annotations

import logging
import os

import numpy as np
from tracegym.analysis import embeddings
from tracegym.analysis.embeddings import Embedder


class _Letters:
    """A stand-in for MiniLM: a text's vector is its letter counts, normalised."""

    def encode(self, texts, batch_size=64):
        rows = np.zeros((len(texts), 384), dtype=np.float32)
        for i, text in enumerate(texts):
            for ch in text:
                rows[i, ord(ch) % 384] += 1
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1)


class _Fake(Embedder):
    def _load_model(self):
        return _Letters()


def test_two_analyses_saving_one_cache_at_once_both_finish_and_leave_a_whole_file(
    tmp_path, monkeypatch
):
    first, second = _Fake(tmp_path), _Fake(tmp_path)
    real_replace = os.replace
    calls = []

    def replace_after_the_other_saved(src, dst):
        calls.append(src)
        if len(calls) == 1:  # the first writer is between writing and renaming: the other saves
            second.encode(["the second analysis's failure"])
        real_replace(src, dst)

    monkeypatch.setattr(embeddings.os, "replace", replace_after_the_other_saved)
    vectors = first.encode(["the first analysis's failure"])
    assert vectors.shape == (1, 384) and len(calls) == 2 and calls[0] != calls[1]
    monkeypatch.setattr(embeddings.os, "replace", real_replace)
    reread = _Fake(tmp_path)
    assert reread._cache  # a whole file: the last writer's
    assert not list(tmp_path.glob("*.tmp.npz"))  # no temporary file left behind


def test_a_cache_that_cannot_be_written_costs_the_cache_not_the_analysis(tmp_path, caplog):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder should be")
    embedder = _Fake(blocked)
    with caplog.at_level(logging.WARNING, logger="tracegym.analysis.embeddings"):
        vectors = embedder.encode(["a failure", "another failure"])
    assert vectors.shape == (2, 384) and embedder.computed == 2
    assert "embedding cache not written" in caplog.text
