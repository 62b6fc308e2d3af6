"""Batched, KV-cached generation for many episodes at once, each written as plain sequential code.

A small model on a CPU spends most of a decoding step on per-layer overhead, not arithmetic, so
decoding eight episodes together costs little more than decoding one. Episodes (rollouts, the
example agent) stay ordinary sequential functions run in threads; each asks its `Lane` for the
next reply, and when every live lane of a wave is waiting, the last one to arrive runs one batched
step for all of them (no scheduler thread). Each lane's tokens stay in a shared KV cache between
turns: a request feeds only the tokens that are new since the lane's previous request.

    from tracegym.training.batching import map_batched
    results = map_batched(policy, lambda lane, seed: rollout(policy, env_for(seed), seed,
                                                             lm=lane), seeds, batch_size=8)

Rows of different lengths are left-padded with a 0 attention mask, and positions come from the
mask, so a batched greedy reply is the reply the model gives on its own (up to float rounding).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tracegym.training.model import Policy

T = TypeVar("T")
R = TypeVar("R")


class Wave:
    """Up to `size` lanes decoding in lockstep over one batched KV cache."""

    def __init__(
        self,
        policy: Policy,
        size: int,
        *,
        temperature: float = 0.0,
        seed: int = 0,
        max_length: int | None = None,
    ) -> None:
        import torch

        self.policy = policy
        self.size = size
        self.temperature = temperature
        self.generators = [torch.Generator().manual_seed(seed + i) for i in range(size)]
        limit = getattr(policy.model.config, "max_position_embeddings", 2048) or 2048
        self.max_length = min(max_length or limit, limit)
        tok = policy.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        self._cond = threading.Condition()
        self._live = set(range(size))
        self._pending: dict[int, tuple[list[int], int, int]] = {}
        self._results: dict[int, tuple[list[int], bool]] = {}
        self._error: BaseException | None = None
        self._consumed: list[list[int]] = [[] for _ in range(size)]
        self._mask: Any = None
        self._cache: Any = None
        self.lanes = [Lane(self, i) for i in range(size)]

    # the lockstep protocol ---------------------------------------------------------------------
    def _request(
        self, slot: int, ids: list[int], max_new_tokens: int, stop_id: int
    ) -> tuple[list[int], bool]:
        with self._cond:
            self._pending[slot] = (ids, max_new_tokens, stop_id)
            self._maybe_step()
            while slot not in self._results and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise RuntimeError("batched generation failed") from self._error
            return self._results.pop(slot)

    def _close(self, slot: int) -> None:
        with self._cond:
            self._live.discard(slot)
            self._maybe_step()

    def _maybe_step(self) -> None:
        """Run a step when every live lane is waiting (called with the lock held)."""
        if not self._pending or len(self._pending) < len(self._live):
            return
        pending, self._pending = self._pending, {}
        try:
            self._results.update(self._step(pending))
        except BaseException as exc:  # every waiting lane must wake up and see it
            self._error = exc
        self._cond.notify_all()

    # the batched step ----------------------------------------------------------------------------
    def _forward(self, chunk: list[list[int]], chunk_mask: list[list[int]]) -> Any:
        import torch
        from tracegym.training.rollout import _cache_argument

        model, device = self.policy.model, self.policy.device
        new_mask = torch.tensor(chunk_mask, dtype=torch.long, device=device)
        self._mask = new_mask if self._mask is None else torch.cat([self._mask, new_mask], dim=1)
        positions = (self._mask.cumsum(dim=1) - 1).clamp(min=0)[:, -new_mask.shape[1] :]
        if self._cache is None:
            from transformers import DynamicCache

            self._cache = DynamicCache()
        out = model(
            input_ids=torch.tensor(chunk, device=device),
            attention_mask=self._mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{_cache_argument(model): self._cache},
        )
        return out.logits[:, -1].float()

    def _pick(self, logits: Any, row: int) -> int:
        import torch

        if self.temperature and self.temperature > 0:
            probs = torch.softmax(logits[row] / self.temperature, dim=-1).cpu()
            return int(torch.multinomial(probs, 1, generator=self.generators[row]).item())
        return int(torch.argmax(logits[row]).item())

    def _step(
        self, pending: dict[int, tuple[list[int], int, int]]
    ) -> dict[int, tuple[list[int], bool]]:
        import torch

        news: dict[int, list[int]] = {}
        for slot, (ids, _, _) in pending.items():
            seen = self._consumed[slot]
            if ids[: len(seen)] != seen:
                raise ValueError("a lane's conversation may only grow (its prefix changed)")
            news[slot] = ids[len(seen) :]
        width = max(1, max(len(n) for n in news.values()))
        chunk, chunk_mask = [], []
        for slot in range(self.size):
            new = news.get(slot, [])
            pad = width - len(new)
            chunk.append([self.pad_id] * pad + new)
            chunk_mask.append([0] * pad + [1] * len(new))
            self._consumed[slot] = self._consumed[slot] + new
        out: dict[int, list[int]] = {slot: [] for slot in pending}
        full: dict[int, bool] = {slot: False for slot in pending}
        running = set(pending)
        for slot in list(running):
            if len(self._consumed[slot]) >= self.max_length:
                full[slot] = True
                running.discard(slot)
        with torch.no_grad():
            logits = self._forward(chunk, chunk_mask)
            while running:
                step_ids, step_mask = [], []
                for slot in range(self.size):
                    if slot in running:
                        token = self._pick(logits, slot)
                        out[slot].append(token)
                        _, max_new, stop_id = pending[slot]
                        done = token == stop_id or len(out[slot]) >= max_new
                        if not done and len(self._consumed[slot]) + 1 >= self.max_length:
                            full[slot] = done = True
                        if done:
                            running.discard(slot)
                            step_ids.append(self.pad_id)
                            step_mask.append(0)
                            continue
                        self._consumed[slot] = self._consumed[slot] + [token]
                        step_ids.append(token)
                        step_mask.append(1)
                    else:
                        step_ids.append(self.pad_id)
                        step_mask.append(0)
                if not running:
                    break
                logits = self._forward([[t] for t in step_ids], [[m] for m in step_mask])
        # the last token of each reply is not in the cache yet: the lane's next request feeds it
        return {slot: (out[slot], full[slot]) for slot in pending}


class Lane:
    """One episode's handle on a wave: `generate` returns the reply to the conversation `ids`."""

    def __init__(self, wave: Wave, slot: int) -> None:
        self.wave = wave
        self.slot = slot
        self.closed = False

    @property
    def max_length(self) -> int:
        return self.wave.max_length

    def generate(
        self, ids: Sequence[int], max_new_tokens: int, stop_id: int
    ) -> tuple[list[int], bool]:
        """New token ids (ending with `stop_id` unless cut short) and whether the context ran
        out. Blocks until every other live lane of the wave is waiting too."""
        return self.wave._request(self.slot, list(ids), max_new_tokens, stop_id)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.wave._close(self.slot)


def map_batched(
    policy: Policy,
    fn: Callable[[Lane, T], R],
    items: Iterable[T],
    *,
    batch_size: int = 8,
    temperature: float = 0.0,
    seed: int = 0,
    on_done: Callable[[R], None] | None = None,
) -> list[R]:
    """`[fn(lane, item) for item in items]`, run `batch_size` at a time in threads that share
    batched generation. Results keep the order of `items`; an exception in `fn` is raised after
    its wave finishes."""
    items = list(items)
    results: list[Any] = [None] * len(items)
    for start in range(0, len(items), max(1, batch_size)):
        wave_items = items[start : start + batch_size]
        wave = Wave(policy, len(wave_items), temperature=temperature, seed=seed + start)

        def run(index: int, wave: Wave = wave, wave_items: list[T] = wave_items) -> R:
            lane = wave.lanes[index]
            try:
                return fn(lane, wave_items[index])
            finally:
                lane.close()

        with ThreadPoolExecutor(max_workers=len(wave_items)) as pool:
            futures = [pool.submit(run, i) for i in range(len(wave_items))]
            for offset, future in enumerate(futures):
                results[start + offset] = future.result()
                if on_done is not None:
                    on_done(results[start + offset])
    return results


__all__ = ["Lane", "Wave", "map_batched"]
