"""Scaled dot-product attention that lets torch share key/value heads (`enable_gqa`).

transformers' `sdpa` attention copies every key/value head to each query head it serves
(`repeat_kv`) whenever a mask is given and more than one query token is fed: a prefill, or a
decoding step of several tokens. SmolLM2 has 9 query heads on 3 key/value heads, so each such
forward pass copied the whole KV cache three times over, layer by layer: on this CPU a 24-row step
of 2 tokens over 400 cached columns cost 2.3x a step of one (358 against 154 ms), and a third of
that was copying. torch's own kernel reads shared heads in place. Registered with transformers'
`AttentionInterface` as `gqa_sdpa`; `load_policy` switches models that use `sdpa` to it. The
numbers are the same up to float rounding (`tests/generation/test_attention.py`).
"""

from __future__ import annotations

from typing import Any

NAME = "gqa_sdpa"


def gqa_sdpa_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention contract: `[batch, heads, q, dim]` in, `[batch, q, heads, dim]`
    out, the mask additive or boolean (`[batch, 1, q, k]`) or None for a causal pass."""
    import torch.nn.functional as F

    q_length = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and attention_mask is None and q_length > 1)
    if causal and key.shape[2] > q_length:  # a prefill into an empty static cache, as `sdpa`
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make `gqa_sdpa` an attention implementation transformers knows (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, gqa_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the masks `sdpa` gets
    return NAME


def use_gqa_sdpa(model: Any) -> bool:
    """Switch a model that runs transformers' `sdpa` to `gqa_sdpa`; others are left alone."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    model.set_attn_implementation(NAME)
    return True


__all__ = ["NAME", "gqa_sdpa_attention", "register", "use_gqa_sdpa"]
