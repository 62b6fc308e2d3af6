"""The router: weights over adapters, none, top-p, weighted combination, routing accuracy."""

from __future__ import annotations

import hashlib
import re

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("peft")

from tracegym.training.router import Router, apply_weights, routing_accuracy  # noqa: E402

# Trains or runs real models: out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow


class FakeEmbedder:
    """Bag of words hashed into 64 dimensions, unit length: fast and deterministic."""

    def encode(self, texts):
        rows = []
        for text in texts:
            v = np.zeros(64, dtype=np.float32)
            for word in re.findall(r"[a-z]+", text.lower()):
                v[int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
            n = np.linalg.norm(v)
            rows.append(v / n if n else v)
        return np.stack(rows)


ENTRIES = {
    "press": ["press the red button", "please press the blue button", "button panel"],
    "refund": ["refund the order", "issue a refund for order", "refund money to customer"],
}


def test_router_weights_none_and_top_p():
    router = Router(FakeEmbedder(), ENTRIES)
    w = router.weights("please press the green button")
    assert max(w, key=w.get) == "press" and abs(sum(w.values()) - 1) < 1e-6
    assert router.choose("refund this order please") == "refund"
    assert router.weights("zebra quantum lattice") == {}  # nothing matches: none
    mixed = Router(FakeEmbedder(), ENTRIES, temperature=5.0, top_p=0.99, threshold=-1.0)
    both = mixed.weights("press the refund button")
    assert set(both) == {"press", "refund"} and abs(sum(both.values()) - 1) < 1e-6
    one = Router(FakeEmbedder(), ENTRIES, top_p=0.01).weights("press the refund button")
    assert len(one) == 1


def test_requests_the_agent_already_handles_get_no_adapter():
    competent = ["what is the status of my order", "where is my order status please",
                 "status of the order I placed"]  # fmt: skip
    plain = Router(FakeEmbedder(), ENTRIES)
    knowing = Router(FakeEmbedder(), ENTRIES, competent=competent)
    status = "what is the status of my refund order"
    assert plain.weights(status)  # the words alone point at the refund adapter
    assert knowing.weights(status) == {}  # but the agent handles requests like this itself
    assert knowing.choose("issue a refund for the order") == "refund"
    assert set(knowing.scores(status)) == {"press", "refund", "none"}


def test_routing_accuracy():
    router = Router(FakeEmbedder(), ENTRIES)
    tasks = [
        ("press the yellow button", "press"),
        ("please refund order 7", "refund"),
        ("zebra quantum lattice", None),
    ]
    report = routing_accuracy(router, tasks)
    assert report["accuracy"] == 1.0 and report["n"] == 3


def test_weighted_combination_is_applied():
    import torch
    from peft import LoraConfig, get_peft_model
    from tracegym.generation.model import tiny_model

    policy = tiny_model()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        base = policy.model(input_ids=ids).logits
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    model = get_peft_model(policy.model, cfg, adapter_name="press")
    model.add_adapter("refund", cfg)

    def out():
        with torch.no_grad():
            return model(input_ids=ids).logits

    assert apply_weights(model, {"press": 1.0}) == "press"
    a = out()
    assert apply_weights(model, {"refund": 1.0}) == "refund"
    b = out()
    assert apply_weights(model, {"press": 0.5, "refund": 0.5}) == "routed"
    assert model.active_adapter == "routed" and "routed" in model.peft_config
    c = out()
    assert not torch.allclose(c, a) and not torch.allclose(c, b) and not torch.allclose(c, base)
    assert apply_weights(model, {}) is None
    assert torch.allclose(out(), base, atol=1e-5)  # none: the base model
    apply_weights(model, {"press": 0.3, "refund": 0.7})  # again: replaces the combination
    assert apply_weights(model, {"press": 1.0}) == "press"
    assert torch.allclose(out(), a, atol=1e-5)


def test_rounded_weights_group_nearly_equal_mixtures():
    from tracegym.training.router import rounded

    a = rounded({"x": 0.62, "y": 0.38})
    b = rounded({"y": 0.41, "x": 0.59})
    assert a == b == {"x": 0.6, "y": 0.4}
    assert rounded({"x": 0.97, "y": 0.03}) == {"x": 1.0}  # a negligible share is dropped
    assert rounded({}) == {}
    assert abs(sum(rounded({"x": 0.33, "y": 0.33, "z": 0.34}).values()) - 1) < 1e-5


def test_embedder_named_falls_back_to_hash_only_when_asked(tmp_path, monkeypatch):
    import sys

    import pytest
    from tracegym.training.router import HashEmbedder, embedder_named

    assert isinstance(embedder_named("hash", tmp_path), HashEmbedder)
    monkeypatch.setitem(sys.modules, "tracegym.analysis.embeddings", None)  # no analysis extra
    assert isinstance(embedder_named("minilm", tmp_path), HashEmbedder)
    with pytest.raises(ImportError):
        embedder_named("minilm", tmp_path, fall_back_to_hash=False)
