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
Two things keep the batch small (see `Wave`): lanes that are not decoding leave the forward pass
and padding columns are cut, and the prompt prefix every lane shares is prefilled once. And
`map_batched` keeps the batch full (continuous batching): when an episode ends, the next item
starts on a new lane of the same wave, its prompt is prefilled (after a copy of the shared
prefix's cache) and its rows join the others', instead of the wave draining to its slowest
episode before the next wave starts.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tracegym.training.model import Policy

T = TypeVar("T")
R = TypeVar("R")


# The KV cache as plain tensors ------------------------------------------------------------------
def _get_kv(cache: Any) -> list[tuple[Any, Any]] | None:
    """Each layer's (keys, values), `[rows, heads, columns, dim]`; None for a cache this module
    cannot edit (sliding windows, other layouts): the wave then never compacts it."""
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers >= 4.56
        if not all(
            getattr(layer, "keys", None) is not None and not getattr(layer, "is_sliding", False)
            for layer in layers
        ):
            return None
        return [(layer.keys, layer.values) for layer in layers]
    keys, values = getattr(cache, "key_cache", None), getattr(cache, "value_cache", None)
    if keys is None or values is None or getattr(cache, "sliding_window", None):
        return None
    return list(zip(keys, values, strict=True))


def _set_kv(cache: Any, kv: list[tuple[Any, Any]]) -> None:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer, (keys, values) in zip(layers, kv, strict=True):
            layer.keys, layer.values = keys, values
    else:
        cache.key_cache[:] = [k for k, _ in kv]
        cache.value_cache[:] = [v for _, v in kv]


@dataclass
class _Rows:
    """Rows split off a wave's cache: their lanes, attention mask and each layer's keys/values."""

    slots: list[int]
    mask: Any
    kv: list[tuple[Any, Any]]

    def select(self, rows: list[int]) -> _Rows:
        import torch

        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        return _Rows(
            [self.slots[r] for r in rows],
            self.mask[index],
            [(k[index], v[index]) for k, v in self.kv],
        )

    def left_pad(self, columns: int) -> _Rows:
        """Widened to `columns` with masked zero columns on the left (positions come from the
        mask and keys already carry their rotary positions, so nothing else moves)."""
        import torch.nn.functional as F

        extra = columns - self.mask.shape[1]
        if extra <= 0:
            return self
        return _Rows(
            self.slots,
            F.pad(self.mask, (extra, 0)),
            [(F.pad(k, (0, 0, extra, 0)), F.pad(v, (0, 0, extra, 0))) for k, v in self.kv],
        )

    def pack(self) -> _Rows:
        """Each row's real columns moved to the right end, in order, and columns that are then
        padding in every row cut: the holes left by shorter turns and dropped rows go away."""
        import torch

        mask = self.mask
        keep = int(mask.sum(dim=1).max().item())
        columns = mask.shape[1]
        # a stable sort of the 0/1 mask lists each row's pad columns, then its real ones in order
        order = torch.sort(mask, dim=1, stable=True).indices[:, columns - keep :]
        packed = mask.gather(1, order)
        if keep == columns and torch.equal(packed, mask):
            return self

        def take(x: Any) -> Any:
            rows, heads, _, dim = x.shape
            return x.gather(2, order[:, None, :, None].expand(rows, heads, keep, dim))

        return _Rows(self.slots, packed, [(take(k), take(v)) for k, v in self.kv])


def _join(parts: list[_Rows]) -> _Rows:
    import torch

    columns = max(p.mask.shape[1] for p in parts)
    parts = [p.left_pad(columns) for p in parts]
    if len(parts) == 1:
        return parts[0]
    return _Rows(
        [s for p in parts for s in p.slots],
        torch.cat([p.mask for p in parts]),
        [
            (torch.cat([p.kv[i][0] for p in parts]), torch.cat([p.kv[i][1] for p in parts]))
            for i in range(len(parts[0].kv))
        ],
    )


def _common_prefix(seqs: list[list[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return n


class Wave:
    """Up to `size` lanes decoding in lockstep over one batched KV cache.

    `compact` keeps only rows that still decode in the forward pass: a lane whose reply is done
    sits out (its cache rows parked) until the next step, a closed lane's rows are dropped, and
    padding columns are cut, so a late step costs what its live lanes cost. `share_prefix`
    prefills the prompt prefix common to every lane (the system message) once, at batch 1, and
    copies its cache to every row; lanes that join later copy that prefix's rows too. Both leave
    the replies unchanged (up to float rounding).

    Lanes are named by `slots` (default `range(size)`); lane `s` samples with a generator seeded
    `seed + s`, whatever row it sits in. With `refill` (and `compact`), a lane that `_retire`s
    hands its place to a new lane: `refill()` (called with the wave's lock held) names the slot
    to open, or None. The new lane's first request is prefilled as its own forward pass (after a
    copy of the shared prefix) and its rows join the others' (`_join`).
    """

    def __init__(
        self,
        policy: Policy,
        size: int,
        *,
        temperature: float = 0.0,
        seed: int = 0,
        max_length: int | None = None,
        compact: bool = True,
        share_prefix: bool = True,
        min_prefix: int = 16,
        slots: Sequence[int] | None = None,
        refill: Callable[[], int | None] | None = None,
    ) -> None:
        self.policy = policy
        self.size = size
        self.temperature = temperature
        self.seed = seed
        self.compact = compact
        self.share_prefix = share_prefix
        self.min_prefix = max(1, min_prefix)
        self.refill = refill
        limit = getattr(policy.model.config, "max_position_embeddings", 2048) or 2048
        self.max_length = min(max_length or limit, limit)
        tok = policy.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        self._cond = threading.Condition()
        self._live: set[int] = set()
        self._pending: dict[int, tuple[list[int], int, int]] = {}
        self._results: dict[int, tuple[list[int], bool]] = {}
        self._error: BaseException | None = None
        self._consumed: dict[int, list[int]] = {}
        self.generators: dict[int, Any] = {}
        self.lanes: dict[int, Lane] = {}
        # row i of `_mask` and of every cached layer belongs to lane `_slots[i]`
        self._slots: list[int] = []
        self._mask: Any = None
        self._cache: Any = None
        self._parked: list[_Rows] = []  # rows sitting out until the next step
        # the shared prefix's ids and its cache rows (one row), for lanes that join later
        self._prefix: tuple[list[int], _Rows] | None = None
        # work done, for tests and benchmarks: forward passes, token rows computed, shared tokens
        # (prefilled once instead of once per row), lanes opened in place of finished ones
        self.stats = {"forwards": 0, "tokens": 0, "shared": 0, "refills": 0}
        for slot in range(size) if slots is None else slots:
            self._open(slot)
        if not compact:
            self._slots = sorted(self._live)

    def _open(self, slot: int) -> Lane:
        import torch

        if slot in self.lanes:
            raise ValueError(f"slot {slot} was used already")
        self._live.add(slot)
        self._consumed[slot] = []
        self.generators[slot] = torch.Generator().manual_seed(self.seed + slot)
        lane = self.lanes[slot] = Lane(self, slot)
        return lane

    # the lockstep protocol ---------------------------------------------------------------------
    def _request(
        self, slot: int, ids: list[int], max_new_tokens: int, stop_id: int
    ) -> tuple[list[int], bool]:
        with self._cond:
            if self._error is None and slot not in self._live:
                raise RuntimeError(f"lane {slot} is closed")
            if self._error is None:
                self._pending[slot] = (ids, max_new_tokens, stop_id)
                self._maybe_step()
            while slot not in self._results and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise RuntimeError("batched generation failed") from self._error
            return self._results.pop(slot)

    def _close(self, lane: Lane, refill: bool = False) -> Lane | None:
        with self._cond:
            successor = None
            if not lane.closed:
                lane.closed = True
                self._live.discard(lane.slot)
            if refill and self.can_refill:
                slot = self.refill() if self.refill is not None else None
                if slot is not None:
                    successor = self._open(slot)
                    self.stats["refills"] += 1
            self._maybe_step()
            return successor

    def _retire(self, lane: Lane) -> Lane | None:
        """Close `lane` (its episode is over) and open the lane `refill` names in its place, in
        one move, so that no step runs without the new lane; returns the new lane, if any."""
        return self._close(lane, refill=True)

    @property
    def can_refill(self) -> bool:
        """Whether a new lane can still join: rows are added with `_join`, which needs
        compaction and a cache this module can edit (a lock-free read may be stale)."""
        if self.refill is None or not self.compact or self._error is not None:
            return False
        return self._cache is None or _get_kv(self._cache) is not None

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

    # the cache's rows ----------------------------------------------------------------------------
    def _rows(self) -> _Rows | None:
        kv = _get_kv(self._cache) if self._cache is not None else None
        return None if kv is None else _Rows(self._slots, self._mask, kv)

    def _install(self, rows: _Rows) -> None:
        self._slots, self._mask = rows.slots, rows.mask
        _set_kv(self._cache, rows.kv)

    def _placed(self) -> set[int]:
        """The lanes that have rows in the cache (in the batch or parked)."""
        if self._cache is None:
            return set()
        return set(self._slots).union(*(p.slots for p in self._parked))

    def _regroup(self, slots: set[int]) -> None:
        """Before a step: parked rows back in, rows of other lanes (closed ones) dropped, holes
        packed away. Rows stay in their order (the step's chunk follows `_slots`)."""
        current = self._rows()
        if current is None:
            return
        parts = [*self._parked, current]
        self._parked = []
        kept = []
        for part in parts:
            rows = [i for i, s in enumerate(part.slots) if s in slots]
            if rows:
                kept.append(part if len(rows) == len(part.slots) else part.select(rows))
        if not kept:  # every row belonged to a closed lane
            self._cache = self._mask = None
            self._slots = []
            return
        joined = _join(kept)
        self._install(joined.pack())

    def _park(self, running: set[int]) -> None:
        """Rows of lanes that stopped decoding leave the batch until the next step."""
        rows = self._rows()
        if rows is None:
            return
        out = [i for i, s in enumerate(rows.slots) if s not in running]
        if not out:
            return
        self._parked.append(rows.select(out))
        self._install(rows.select([i for i, s in enumerate(rows.slots) if s in running]))

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
        self.stats["forwards"] += 1
        self.stats["tokens"] += new_mask.numel()
        out = model(
            input_ids=torch.tensor(chunk, device=device),
            attention_mask=self._mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{_cache_argument(model): self._cache},
        )
        return out.logits[:, -1].float()

    def _feed(self, news: dict[int, list[int]], skip: int = 0) -> Any:
        """One forward pass over each row's new tokens (after the first `skip`, already in the
        cache), left-padded to the longest; the logits of each row's last token."""
        width = max(1, max(len(news.get(s, [])) - skip for s in self._slots))
        chunk, chunk_mask = [], []
        for slot in self._slots:
            new = news.get(slot, [])
            if new:
                self._consumed[slot].extend(new)
            new = new[skip:]
            pad = width - len(new)
            chunk.append([self.pad_id] * pad + new)
            chunk_mask.append([0] * pad + [1] * len(new))
        return self._forward(chunk, chunk_mask)

    def _prefill_shared(self, news: dict[int, list[int]]) -> int:
        """With an empty cache, put the prompt prefix all rows share in it once, and return its
        length (0 when there is none worth sharing). The wave's stored prefix is copied when the
        rows start with enough of it; otherwise the rows' common prefix is prefilled at batch 1,
        copied to every row and stored. Each row keeps at least one token of its own, whose
        logits the step needs."""
        import torch

        if not self.share_prefix or self._cache is not None or not self._slots:
            return 0
        if any(not news.get(s) for s in self._slots):
            return 0
        seqs = [news[s] for s in self._slots]
        rows, longest = len(seqs), min(len(s) for s in seqs) - 1
        if self._prefix is not None:
            ids, prefix = self._prefix
            shared = min(_common_prefix([ids, *seqs]), longest)
            if shared >= self.min_prefix:
                from transformers import DynamicCache

                self._cache = DynamicCache()
                index = torch.zeros(rows, dtype=torch.long, device=prefix.mask.device)
                for layer, (keys, values) in enumerate(prefix.kv):
                    self._cache.update(keys[index, :, :shared], values[index, :, :shared], layer)
                self._mask = prefix.mask[index, :shared]
                self.stats["shared"] += shared * rows
                return shared
        if rows < 2:
            return 0
        shared = min(_common_prefix(seqs), longest)
        if shared < self.min_prefix:
            return 0
        self._forward([seqs[0][:shared]], [[1] * shared])
        kv = _get_kv(self._cache)
        if kv is None:  # cannot copy rows: start over the usual way
            self._cache = self._mask = None
            return 0
        if self._prefix is None:
            self._prefix = (seqs[0][:shared], _Rows([-1], self._mask, kv))
        self._cache.batch_repeat_interleave(rows)
        self._mask = self._mask.expand(rows, -1).contiguous()
        self.stats["shared"] += shared * (rows - 1)
        return shared

    def _prefill(self, slots: list[int], news: dict[int, list[int]]) -> Any:
        """Rows for lanes new to the cache: their prompts (after the shared prefix) fed as one
        forward pass in a cache of their own, whose rows then join the wave's after the rows it
        has (`_join`). Returns the new rows' logits."""
        prior = None
        if self._cache is not None:
            prior = self._cache, self._rows()
            if prior[1] is None:
                raise RuntimeError("new lanes cannot join a cache that cannot be edited")
        self._cache = self._mask = None
        self._slots = list(slots)
        shared = self._prefill_shared(news)
        logits = self._feed(news, skip=shared)
        if prior is not None:
            new = self._rows()
            if new is None:
                raise RuntimeError("new lanes cannot join a cache that cannot be edited")
            self._cache = prior[0]
            self._install(_join([prior[1], new]))
        return logits

    def _pick(self, logits: Any, rows: dict[int, int]) -> dict[int, int]:
        """The next token of each lane in `rows` (slot -> row of `logits`)."""
        import torch

        if self.temperature and self.temperature > 0:
            picks = {}
            for slot, row in rows.items():
                probs = torch.softmax(logits[row] / self.temperature, dim=-1).cpu()
                token = torch.multinomial(probs, 1, generator=self.generators[slot])
                picks[slot] = int(token.item())
            return picks
        best = torch.argmax(logits, dim=-1).tolist()
        return {slot: best[row] for slot, row in rows.items()}

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
        with torch.no_grad():
            if self.compact:
                placed = self._placed()
                fresh = sorted(s for s in pending if s not in placed)
                if self._cache is not None:
                    self._regroup(set(pending) - set(fresh))
            else:  # every lane keeps its row; the first step prefills them all
                fresh = list(self._slots) if self._cache is None else []
            parts = []
            if self._cache is not None:  # lanes already in the cache feed their new tokens
                parts.append(self._feed(news))
            if fresh:
                parts.append(self._prefill(fresh, news))
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)
            out: dict[int, list[int]] = {slot: [] for slot in pending}
            full: dict[int, bool] = {slot: False for slot in pending}
            running = set(pending)
            for slot in list(running):
                if len(self._consumed[slot]) >= self.max_length:
                    full[slot] = True
                    running.discard(slot)
            while running:
                rows = {s: i for i, s in enumerate(self._slots) if s in running}
                for slot, token in self._pick(logits, rows).items():
                    out[slot].append(token)
                    _, max_new, stop_id = pending[slot]
                    done = token == stop_id or len(out[slot]) >= max_new
                    if not done and len(self._consumed[slot]) + 1 >= self.max_length:
                        full[slot] = done = True
                    if done:
                        running.discard(slot)
                    else:
                        self._consumed[slot].append(token)
                if not running:
                    break
                if self.compact:
                    self._park(running)
                step_ids = [out[s][-1] if s in running else self.pad_id for s in self._slots]
                step_mask = [[1] if s in running else [0] for s in self._slots]
                logits = self._forward([[t] for t in step_ids], step_mask)
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
        """The episode needs no more replies: the wave stops waiting for this lane."""
        self.wave._close(self)


def map_batched(
    policy: Policy,
    fn: Callable[[Lane, T], R],
    items: Iterable[T],
    *,
    batch_size: int = 8,
    temperature: float = 0.0,
    seed: int = 0,
    on_done: Callable[[R], None] | None = None,
    compact: bool = True,
    share_prefix: bool = True,
    continuous: bool = True,
    stats: dict[str, int] | None = None,
) -> list[R]:
    """`[fn(lane, item) for item in items]`, up to `batch_size` at a time in threads that share
    batched generation. Results keep the order of `items`.

    `continuous` keeps `batch_size` episodes live: when one ends, the next item starts on a new
    lane of the same wave and its first request joins the batch. Otherwise (and when the wave
    cannot add rows: `compact=False`, or a cache `_get_kv` cannot edit) items run in waves of
    `batch_size`, each until its slowest episode ends. Item `i` samples with a generator seeded
    `seed + i`, so sampled results depend neither on `batch_size` nor on timing (up to float
    rounding in the batched forward pass).

    `on_done` is called once per item that returns, in the calling thread, as the item
    finishes: in completion order, not the order of `items`. When `fn` (or `on_done`) raises, no
    new item starts, the started ones finish, and then the first exception is raised.

    `compact` and `share_prefix` are `Wave`'s; `stats`, when given, adds up the waves'
    `Wave.stats` (`refills` counts the items that started in a finished one's place)."""
    items = list(items)
    size = max(1, batch_size)
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    events: queue.Queue[tuple[int, Any, BaseException | None] | None] = queue.Queue()
    cursor = {"next": 0}
    callback_failed = False

    def admit() -> int | None:  # the next item to start, if any (one wave at a time calls it)
        if errors or cursor["next"] >= len(items):
            return None
        cursor["next"] += 1
        return cursor["next"] - 1

    def work(wave: Wave, lane: Lane | None) -> None:
        try:
            while lane is not None:
                try:
                    result = fn(lane, items[lane.slot])
                except BaseException as exc:
                    errors.append(exc)  # before the lane retires: nothing new starts
                    events.put((lane.slot, None, exc))
                else:
                    events.put((lane.slot, result, None))
                lane = wave._retire(lane)
        finally:
            events.put(None)

    while cursor["next"] < len(items) and not errors:
        first = [cursor["next"] + i for i in range(min(size, len(items) - cursor["next"]))]
        cursor["next"] += len(first)
        wave = Wave(
            policy,
            len(first),
            temperature=temperature,
            seed=seed,
            compact=compact,
            share_prefix=share_prefix,
            slots=first,
            refill=admit if continuous else None,
        )
        threads = [
            threading.Thread(target=work, args=(wave, wave.lanes[i]), name=f"map_batched-{i}")
            for i in first
        ]
        for thread in threads:
            thread.start()
        try:
            running = len(threads)
            while running:
                event = events.get()
                if event is None:
                    running -= 1
                    continue
                index, result, exc = event
                if exc is None:
                    results[index] = result
                    if on_done is not None and not callback_failed:
                        try:
                            on_done(result)
                        except BaseException as failure:
                            callback_failed = True
                            errors.append(failure)
        except BaseException as exc:  # interrupted: let the started items finish, start no more
            errors.append(exc)
            raise
        finally:
            for thread in threads:
                thread.join()
            if stats is not None:
                for key, value in wave.stats.items():
                    stats[key] = stats.get(key, 0) + value
    if errors:
        raise errors[0]
    return results


__all__ = ["Lane", "Wave", "map_batched"]
