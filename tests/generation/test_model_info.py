"""A model folder's tracegym_model.json: typed, written through store.home, old ones still read."""

from __future__ import annotations

import json

import pytest
from tracegym.generation.model import (
    MODEL_INFO_FILE,
    ModelInfo,
    ModelInfoError,
    models_dir,
    weights_hash,
)
from tracegym.store.home import DocumentError, Home


def test_model_info_round_trips():
    info = ModelInfo(name="tiny-0", hash="0123456789abcdef")
    data = info.to_dict()
    assert data == {"version": ModelInfo.VERSION, "name": "tiny-0", "hash": "0123456789abcdef"}
    assert ModelInfo.from_dict(json.loads(json.dumps(data))) == info


def test_a_folder_written_before_the_version_still_reads(tmp_path):
    (tmp_path / MODEL_INFO_FILE).write_text(json.dumps({"name": "smollm2", "hash": "feed"}))
    assert ModelInfo.read(tmp_path) == ModelInfo(name="smollm2", hash="feed")
    assert weights_hash(tmp_path) == "feed"  # the recorded hash, the folder is not rehashed
    assert ModelInfo.read(tmp_path / "elsewhere") is None  # any HF folder has none


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"hash": "feed"}', "'name'"),
        ('{"name": "x", "hash": 7}', "'hash'"),
        ("[]", "must be an object"),
        ("{oops", "not valid JSON"),
    ],
)
def test_a_bad_model_info_names_the_file(tmp_path, text, words):
    (tmp_path / MODEL_INFO_FILE).write_text(text)
    with pytest.raises(DocumentError, match=words) as caught:
        ModelInfo.read(tmp_path)
    assert MODEL_INFO_FILE in str(caught.value)
    if words != "not valid JSON":
        assert isinstance(caught.value, ModelInfoError)


def test_models_live_under_the_home():
    assert models_dir("/h") == Home.at("/h").models
