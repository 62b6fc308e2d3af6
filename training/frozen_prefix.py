"""The frozen lower layers of a LoRA fine-tune, run once per example instead of once per step.

With LoRA on the upper layers only (`TrainConfig.layers`), what enters the lowest adapted layer
does not depend on the adapter: it is a function of the example's tokens alone. SFT sees each
example several times (20 steps of 2 over 20 conversations; 40 steps for a rule), so
`FrozenPrefix` runs the layers below once per example, keeps their output, and each step feeds
it to the adapted layers as `inputs_embeds`. The loss is the same as the whole forward pass's,
up to float rounding (each example runs alone there, unpadded).

Works on decoder models laid out like Llama (`model.model.layers`, `model.model.norm`: SmolLM2,
Llama, Qwen2, Mistral); `FrozenPrefix.of` returns None for any other layout, and training runs
the whole model as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any


class FrozenPrefix:
    """The outputs of layers [0, start) of each example, computed on first use."""

    def __init__(self, inner: Any, start: int, autocast: Any) -> None:
        self.inner = inner  # the decoder stack (LlamaModel)
        self.start = start
        self.autocast = autocast  # a callable giving the training step's autocast context
        self._states: dict[int, Any] = {}

    @classmethod
    def of(cls, model: Any, layers: Sequence[int] | None, autocast: Any) -> FrozenPrefix | None:
        """The prefix below the lowest of `layers` (None: every layer trains, or a layout this
        does not know)."""
        if not layers or min(layers) <= 0:
            return None
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        inner = getattr(base, "model", None)
        stack = getattr(inner, "layers", None)
        if stack is None or not hasattr(inner, "norm") or min(layers) >= len(stack):
            return None
        return cls(inner, min(layers), autocast)

    def states(self, index: int, ids: list[int]) -> Any:
        """What enters the first adapted layer for example `index` (tokens `ids`): [len, hidden]."""
        state = self._states.get(index)
        if state is None:
            import torch

            device = self.inner.embed_tokens.weight.device
            with torch.no_grad(), self.autocast(), self._only(lower=True):
                out = self.inner(input_ids=torch.tensor([ids], device=device), use_cache=False)
            state = self._states[index] = out.last_hidden_state[0]
        return state

    def batch(self, indices: Sequence[int], examples: Sequence[tuple[list[int], list[int]]]) -> Any:
        """The batch's prefix outputs, right-padded with zeros like `sft.collate`'s ids."""
        rows = [self.states(i, examples[i][0]) for i in indices]
        width = max(len(r) for r in rows)
        out = rows[0].new_zeros((len(rows), width, rows[0].shape[-1]))
        for row, state in enumerate(rows):
            out[row, : len(state)] = state
        return out

    @contextlib.contextmanager
    def upper(self) -> Iterator[None]:
        """The model runs the adapted layers only while inside (on `inputs_embeds`)."""
        with self._only(lower=False):
            yield

    @contextlib.contextmanager
    def _only(self, *, lower: bool) -> Iterator[None]:
        import torch

        inner = self.inner
        layers, norm = inner.layers, inner.norm
        try:
            if lower:
                inner.layers = torch.nn.ModuleList(layers[: self.start])
                inner.norm = torch.nn.Identity()
            else:
                inner.layers = torch.nn.ModuleList(layers[self.start :])
            yield
        finally:
            inner.layers, inner.norm = layers, norm


__all__ = ["FrozenPrefix"]
