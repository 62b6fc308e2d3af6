"""`gqa_sdpa` computes what transformers' `sdpa` does, on a model with shared key/value heads."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from tracegym.generation.attention import NAME, use_gqa_sdpa


@pytest.fixture
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _padded_batch():
    ids = torch.randint(0, 97, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :5] = 0  # left padding
    mask[2, :2] = 0
    return ids, mask


def _cached_step(model, ids, mask):
    """A prefill, then a step of three tokens at once onto the cache (as a drafting step)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        first = model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits
        step = torch.randint(0, 97, (3, 3), generator=torch.Generator().manual_seed(1))
        full = torch.cat([mask, torch.ones(3, 3, dtype=torch.long)], dim=1)
        second = model(input_ids=step, attention_mask=full, past_key_values=cache).logits
    return first, second


def test_switching_keeps_the_logits(model):
    ids, mask = _padded_batch()
    before = _cached_step(model, ids, mask)
    assert use_gqa_sdpa(model)
    assert model.config._attn_implementation == NAME
    after = _cached_step(model, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(after[0][real], before[0][real])
    torch.testing.assert_close(after[1], before[1])


def test_switching_keeps_the_gradients(model):
    ids, mask = _padded_batch()

    def grad():
        model.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        return model.model.layers[0].self_attn.k_proj.weight.grad.clone()

    model.train()
    before = grad()
    use_gqa_sdpa(model)
    torch.testing.assert_close(grad(), before)


def test_other_attention_implementations_are_left_alone(model):
    model.set_attn_implementation("eager")
    assert not use_gqa_sdpa(model)
    assert model.config._attn_implementation == "eager"
