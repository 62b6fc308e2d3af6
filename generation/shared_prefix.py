"""The SFT loss of a batch whose rows begin alike, with their common beginning run once.

A training batch's conversations share their start: the system message with the tools and the
rules (about 150 of SmolLM2's 420 tokens on the shop), and a contrast pair (training.sft) shares
everything up to the order's state (about 300). `shared_prefix_loss` runs that common part once,
at batch 1, keeps its keys and values with their autograd graph, repeats them for every row, and
runs each row's own remainder on top. The loss, and the gradient through the repeated keys and
values (summed over the rows, as a batched pass sums it), are those of the whole batch up to
float rounding; the common part costs one row instead of all of them, forward and backward.

Decoder models laid out like Llama (`model.model.layers`, each layer's `self_attn.layer_idx`),
every layer of one attention type; anywhere else it returns None and the caller runs the batch
whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from tracegym.generation.batching import _common_prefix
from tracegym.generation.model import cache_argument

MIN_SHARED = 32  # tokens in common worth a second, batch-1 pass
# ... and at least this share of the shortest row. Below it the second pass's fixed cost ate the
# saving: on SmolLM2 (demo seeds 0 and 9, the data this was chosen on) a batch of two sharing
# 36% of their positions (the system message alone) stepped 2-4% faster in isolation and no
# faster in the nightly; a contrast pair (72%) 10-12% faster, its capability's training 5-13%
# (docs/training.md)
MIN_SHARE = 0.5


def common_length(examples: Sequence[tuple[list[int], list[int]]]) -> int:
    """Positions whose tokens and labels every example shares, leaving each example at least
    one position of its own."""
    pairs = [list(zip(ids, mask, strict=True)) for ids, mask in examples]
    return max(0, min(_common_prefix(pairs), min(len(p) for p in pairs) - 1))


@contextlib.contextmanager
def _numbered_from_zero(stack: Any) -> Iterator[None]:
    """The running layers' attention modules numbered 0.. while inside, so the cache built by
    their pass has one entry per running layer (the frozen ones below may be cut out)."""
    attentions = [layer.self_attn for layer in stack]
    saved = [a.layer_idx for a in attentions]
    try:
        for i, attention in enumerate(attentions):
            attention.layer_idx = i
        yield
    finally:
        for attention, idx in zip(attentions, saved, strict=True):
            attention.layer_idx = idx


def _stack(model: Any) -> Any:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    stack = getattr(getattr(base, "model", None), "layers", None)
    if stack is None or not all(hasattr(layer, "self_attn") for layer in stack):
        return None
    if len(set(getattr(base.config, "layer_types", None) or ["one"])) > 1:
        return None  # sliding and full attention mixed: a layer's number decides its mask
    return stack


def shared_prefix_loss(
    model: Any,
    inputs: dict[str, Any],
    examples: Sequence[tuple[list[int], list[int]]],
    *,
    min_shared: int = MIN_SHARED,
    min_share: float = MIN_SHARE,
) -> Any | None:
    """`sft.sft_loss(model, inputs)` with the rows' common beginning run once; None when they
    share fewer than `min_shared` positions or `min_share` of the shortest row, there is one
    row, or the layout is not known.

    `inputs` is `sft.collate`'s batch of `examples` (right-padded), optionally with the
    `inputs_embeds` to feed instead of `input_ids` (training.frozen)."""
    import torch
    import torch.nn.functional as F
    from transformers import DynamicCache

    rows = len(examples)
    # the common part's last position predicts a token that may differ: it runs with the rows
    shared = common_length(examples) - 1 if rows > 1 else 0
    stack = _stack(model)
    shortest = min(len(ids) for ids, _ in examples)
    if shared < max(min_shared, min_share * shortest) or stack is None:
        return None
    if not hasattr(DynamicCache, "batch_repeat_interleave"):  # older transformers
        return None
    feed = "inputs_embeds" if "inputs_embeds" in inputs else "input_ids"
    tokens, labels, attention = inputs[feed], inputs["labels"], inputs["attention_mask"]
    width = labels.shape[1]
    # position p's logits predict token p + 1: keep the positions whose next token has a label
    keep = labels.new_zeros(labels.shape, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != -100
    cache_key = cache_argument(model)
    cache = DynamicCache()
    with _numbered_from_zero(stack):
        head = model(
            **{feed: tokens[:1, :shared], cache_key: cache},
            attention_mask=attention[:1, :shared],
            use_cache=True,
            logits_to_keep=keep[:1, :shared],
        )
        cache.batch_repeat_interleave(rows)
        positions = torch.arange(shared, width, device=labels.device).expand(rows, -1)
        tail = model(
            **{feed: tokens[:, shared:], cache_key: cache},
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep[:, shared:],
        )
    targets = labels[:, 1:]
    head_targets = targets[:1, :shared][keep[:1, :shared]]
    tail_targets = targets[:, shared:][keep[:, shared : width - 1]]
    if head.logits.dim() != 2 or tail.logits.dim() != 2:
        return None
    total = rows * head_targets.numel() + tail_targets.numel()
    if total == 0:
        return None
    head_sum = F.cross_entropy(head.logits.float(), head_targets, reduction="sum")
    tail_sum = F.cross_entropy(tail.logits.float(), tail_targets, reduction="sum")
    return (rows * head_sum + tail_sum) / total


__all__ = ["MIN_SHARE", "MIN_SHARED", "common_length", "shared_prefix_loss"]
