"""Tiny random models per chat family (for tests): a Qwen2 with ChatML, a Llama with Llama 3's
headers, a Mistral with [INST]; each with its family's special tokens and the repository's
tool-capable template. Built offline in well under a second.

    folder = tiny_family_model("llama3", seed=0, target=tmp_path / "llama3")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracegym.generation.chat_format import CHATML, FAMILIES, LLAMA3, MISTRAL, template_text

# Special tokens per family: (all specials, bos, eos, pad).
_SPECIALS: dict[str, tuple[list[str], str | None, str, str]] = {
    CHATML: (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", "<|endoftext|>"),
    LLAMA3: (
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|end_of_text|>",
    ),
    MISTRAL: (
        [
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ],
        "<s>",
        "</s>",
        "</s>",
    ),
}
# Ordinary (not special) added tokens: Qwen's tool tags are plain text the model writes.
_PLAIN_ADDED = {CHATML: ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]}
_CORPUS = [
    "You are a helpful agent. Call a tool or answer in text. system user assistant tool ipython",
    '{"name": "lookup", "arguments": {"id": "A-12"}}',
    '{"name": "press", "parameters": {"color": "red"}}',
    '{"type": "function", "function": {"name": "x", "description": "y", "parameters": {}}}',
    "Tool result: the order is shipped. Error: unknown tool. The answer is done, ok, yes, no.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 _-.,:;!?'\"()[]{}<>/\\|=+*",
]


def tiny_family_tokenizer(family: str, vocab_size: int = 384) -> Any:
    """A byte-level BPE tokenizer trained here, with the family's special tokens and template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if family not in _SPECIALS:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    specials, bos, eos, pad = _SPECIALS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in _PLAIN_ADDED.get(family, [])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, unk_token=None
    )
    fast.chat_template = template_text(family)
    return fast


def family_classes(family: str) -> tuple[Any, Any]:
    """The transformers config and causal-LM classes of the family's reference architecture."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    return {
        CHATML: (Qwen2Config, Qwen2ForCausalLM),
        LLAMA3: (LlamaConfig, LlamaForCausalLM),
        MISTRAL: (MistralConfig, MistralForCausalLM),
    }[family]


def tiny_family_policy(family: str, seed: int = 0, hidden: int = 64, layers: int = 2) -> Any:
    """A tiny random model of the family's architecture with its tokenizer (a Policy)."""
    import torch
    from tracegym.generation.model import Policy

    tokenizer = tiny_family_tokenizer(family)
    config_cls, model_cls = family_classes(family)
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.eval()
    return Policy(model, tokenizer, f"tiny-{family}-{seed}")


def tiny_family_model(family: str, seed: int = 0, *, target: str | Path) -> Path:
    """A tiny model folder of `family` at `target` (built and saved; an existing one is kept)."""
    from tracegym.generation.model import MODEL_INFO_FILE, save_policy

    target = Path(target)
    if not (target / MODEL_INFO_FILE).exists():
        save_policy(tiny_family_policy(family, seed), target)
    return target


__all__ = ["family_classes", "tiny_family_model", "tiny_family_policy", "tiny_family_tokenizer"]
