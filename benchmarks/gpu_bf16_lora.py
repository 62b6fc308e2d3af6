"""A real open model's architecture in bf16 through tracegym's own loading and LoRA training:
the device check of issue 33 (run it where a GPU is lent; CPU works with `--arch tiny`).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gpu_bf16_lora.py [--arch qwen2.5-1.5b]
        [--steps 5] [--device-map auto] [--work DIR]

No weights are downloaded: the architecture's config (layer count, widths, heads, vocabulary)
is written out with random weights and the family's tiny tokenizer (`generation.tiny_families`,
the family's chat template and special tokens), saved as a model folder, then loaded by
`generation.model.load_policy(folder, dtype="bfloat16")` as `tracegym train --dtype bfloat16`
loads one, and trained for `--steps` LoRA steps (`training.sft.train_adapter`, bf16 autocast)
on the toy environment's demonstrations rendered through the model's template. Prints the
seconds to build, save, load and train, the loss before and after, the LoRA weights' dtype and
the GPU's peak memory, then one greedy reply through the same policy.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

# Real architectures' shapes (from their published configs); vocabularies as published, so the
# embedding's size is the real one even though the tiny tokenizer uses its first few hundred ids.
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-1.5b": ("chatml", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                    num_attention_heads=12, num_key_value_heads=2,
                                    vocab_size=151936, tie_word_embeddings=True,
                                    rope_theta=1_000_000.0)),
    "qwen2.5-7b": ("chatml", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                  num_attention_heads=28, num_key_value_heads=4,
                                  vocab_size=152064, tie_word_embeddings=False,
                                  rope_theta=1_000_000.0)),
    "llama3.2-1b": ("llama3", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8,
                                   vocab_size=128256, tie_word_embeddings=True,
                                   rope_theta=500_000.0)),
    "mistral-7b": ("mistral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8,
                                   vocab_size=32768, tie_word_embeddings=False,
                                   rope_theta=1_000_000.0)),
    "tiny": ("chatml", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                            tie_word_embeddings=True)),
}  # fmt: skip


def build(arch: str, folder: Path, device: str) -> float:
    """Write the architecture with random bf16 weights and the family's tokenizer to `folder`."""
    import torch
    from tracegym.generation.tiny_families import family_classes, tiny_family_tokenizer

    family, shape = ARCHS[arch]
    tokenizer = tiny_family_tokenizer(family)
    config_cls, model_cls = family_classes(family)
    config = config_cls(**shape, max_position_embeddings=4096, torch_dtype="bfloat16",
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.bos_token_id)  # fmt: skip
    start = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen2.5-1.5b", choices=sorted(ARCHS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device-map", default=None, help="e.g. auto (accelerate places it)")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()

    import torch
    from tracegym.generation.model import load_policy
    from tracegym.training.sft import capability_data, default_config, train_adapter
    from tracegym.training.toy import press_env

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device               {device}"
          + (f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else ""))  # fmt: skip
    work = args.work or Path(tempfile.mkdtemp(prefix="tracegym-gpu-"))
    folder = work / args.arch
    print(f"build + save         {build(args.arch, folder, device):.1f} s -> {folder}", flush=True)

    start = time.perf_counter()
    policy = load_policy(folder, device=None if args.device_map else device, dtype="bfloat16",
                         device_map=args.device_map)  # fmt: skip
    weights = sum(p.numel() for p in policy.model.parameters())
    dtypes = sorted({str(p.dtype) for p in policy.model.parameters()})
    print(f"load_policy          {time.perf_counter() - start:.1f} s: {weights / 1e6:,.0f}M "
          f"parameters, {dtypes}, on {policy.device}", flush=True)  # fmt: skip

    data = capability_data(press_env(), range(8))
    config = default_config(args.arch, steps=args.steps, precision="bf16", batch_size=2)
    start = time.perf_counter()
    model, metrics = train_adapter(policy, data.conversations, config, "gpu-check")
    seconds = time.perf_counter() - start
    lora = sorted({str(p.dtype) for n, p in model.named_parameters() if "lora_" in n})
    loss = f"loss {metrics.loss_first:.3f} -> {metrics.loss_last:.3f}"
    print(f"train {args.steps} LoRA steps  {seconds:.1f} s ({seconds / args.steps:.2f} s a step): "
          f"{loss}; LoRA weights {lora}")  # fmt: skip
    if device == "cuda":
        print(f"GPU peak memory      {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    prompt = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Press the red button."}], add_generation_prompt=True,
        return_tensors="pt", return_dict=True).to(policy.device)  # fmt: skip
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    reply = policy.tokenizer.decode(out[0, prompt["input_ids"].shape[1] :])
    print(f"one greedy reply     {len(out[0]) - prompt['input_ids'].shape[1]} tokens: {reply!r}")


if __name__ == "__main__":
    main()
