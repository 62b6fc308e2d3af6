"""Batched, KV-cached generation for many episodes at once, each written as plain sequential code.

A small model on a CPU spends most of a decoding step on per-layer overhead, not arithmetic, so
decoding eight episodes together costs little more than decoding one. Episodes (rollouts, the
example agent) stay ordinary sequential functions run in threads; each asks its `Lane` for the
next reply, and when every live lane of a wave is waiting, the last one to arrive runs one batched
step for all of them (no scheduler thread). Each lane's tokens stay in a shared KV cache between
turns: a request feeds only the tokens that are new since the lane's previous request.

    from tracegym.generation.batching import map_batched
    results = map_batched(policy, lambda lane, seed: rollout(policy, env_for(seed), seed,
                                                             lm=lane), seeds, batch_size=8)

Rows of different lengths are left-padded with a 0 attention mask, and positions come from the
mask, so a batched greedy reply is the reply the model gives on its own (up to float rounding).
Two things keep the batch small (see `Wave`): lanes that are not decoding leave the forward pass
and padding columns are cut, and the prompt prefix every lane shares is prefilled once. A third
makes fewer steps: greedy lanes feed drafts of their next tokens, copied from their own
conversation, and keep the ones the model agrees with (`drafts`). In the demo's dev stage (24
lanes, SmolLM2) it took 90 forward passes instead of 224, with the same replies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from tracegym.generation import tokens
from tracegym.generation.drafts import DRAFT_BUDGET, NgramIndex, draft_length
from tracegym.generation.model import Policy, cache_argument

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
    copies its cache to every row. `draft_budget` lets a greedy step feed each lane's guess of
    its next tokens (`drafts`: what followed the same tokens earlier in its conversation) and keep
    those the model agrees with, up to about that many tokens per step over all rows. All three
    leave the replies unchanged (up to float rounding).
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
        adapters: Sequence[str | None] | None = None,
        draft_budget: int = DRAFT_BUDGET,
        split_prefill: bool = True,
    ) -> None:
        import torch

        self.policy = policy
        # a step's prefill as several forwards when that pads less (`_prefill_plan`)
        self.split_prefill = split_prefill
        self.size = size
        self.temperature = temperature
        self.compact = compact
        self.share_prefix = share_prefix
        self.min_prefix = max(1, min_prefix)
        # tokens a decoding step may feed to check lanes' drafts (`drafts`); 0: none. Drafts are
        # only checked against greedy choices, so sampling waves never draft
        self.draft_budget = draft_budget if not temperature or temperature <= 0 else 0
        self._index = [NgramIndex() for _ in range(size)]
        # each lane's LoRA adapter (None: the base model), mixed in one batch by peft's
        # `adapter_names`; None: the model as it is set
        self.adapters = _row_adapters(policy.model, adapters, size)
        self.generators = [torch.Generator().manual_seed(seed + i) for i in range(size)]
        # each lane's sampling temperature (0: greedy), the wave's unless set per lane (an engine
        # serving requests of different temperatures in one batch)
        self.temperatures = [float(temperature or 0.0)] * size
        # called with (slot, new tokens) as a step appends to a lane's reply (streaming); it
        # must not raise
        self.on_tokens: Callable[[int, list[int]], None] | None = None
        self._idle: set[int] = set()  # lanes whose rows a `step_slots` call leaves parked
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
        # row i of `_mask` and of every cached layer belongs to lane `_slots[i]`
        self._slots: list[int] = list(range(size)) if not compact else []
        self._mask: Any = None
        self._cache: Any = None
        self._parked: list[_Rows] = []  # rows sitting out until the next step
        # work done, for tests and benchmarks: forward passes, token rows computed, shared tokens
        # and rows: the batch rows of all forward passes (rows / forwards: the mean batch)
        self.stats = {
            "forwards": 0, "tokens": 0, "rows": 0, "shared": 0, "drafted": 0, "accepted": 0,
        }  # fmt: skip
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

    # the cache's rows ----------------------------------------------------------------------------
    def _rows(self) -> _Rows | None:
        kv = _get_kv(self._cache) if self._cache is not None else None
        return None if kv is None else _Rows(self._slots, self._mask, kv)

    def _install(self, rows: _Rows) -> None:
        self._slots, self._mask = rows.slots, rows.mask
        _set_kv(self._cache, rows.kv)

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
            idle = [i for i, s in enumerate(part.slots) if s in self._idle and s not in slots]
            if idle:
                self._parked.append(part.select(idle))
        present = {s for part in kept for s in part.slots}
        for slot in sorted(slots - present):  # a lane new to the cache (`step_slots`)
            kept.append(_empty_row(slot, current))
        joined = _join(kept)
        self._install(joined.pack())

    def _find_row(self, slot: int) -> tuple[Any, int] | None:
        """The mask holding `slot`'s row (the batch's or a parked part's) and the row's index."""
        for part in self._parked:
            if slot in part.slots:
                return part.mask, part.slots.index(slot)
        if self._mask is not None and slot in self._slots:
            return self._mask, self._slots.index(slot)
        return None

    def truncate(self, slot: int, keep: int) -> None:
        """Forget all but the first `keep` tokens of lane `slot`'s conversation, so that its
        next request may follow another one (a new conversation, or the same one re-rendered
        differently). The kept tokens' keys and values stay valid (a causal model's prefix does
        not depend on what follows); the dropped columns are masked and `pack` removes them."""
        keep = max(0, min(keep, len(self._consumed[slot])))
        if keep == len(self._consumed[slot]):
            return
        found = self._find_row(slot)
        if found is not None:
            mask, row = found
            mask[row, mask[row].cumsum(dim=0) > keep] = 0
        elif keep > 0:
            raise ValueError(f"lane {slot} has no cached rows to keep {keep} tokens of")
        del self._consumed[slot][keep:]
        self._index[slot] = NgramIndex()

    def step_slots(
        self, pending: dict[int, tuple[list[int], int, int]], idle: Iterable[int] = ()
    ) -> dict[int, tuple[list[int], bool]]:
        """One batched step for the lanes in `pending` only (slot -> (ids, max new tokens, stop
        id)), called by one thread at a time instead of the lanes' lockstep protocol (a serving
        engine's scheduler). Lanes in `idle` keep their cached rows, parked, for a later step;
        other lanes' rows are dropped. Needs a cache this module can edit (`_get_kv`)."""
        if self._cache is not None and self._rows() is None:
            raise ValueError("this model's KV cache cannot be regrouped by lane")
        self._idle = set(idle)
        try:
            return self._step(pending)
        finally:
            self._idle = set()

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
    def _names(self, slots: Sequence[int]) -> list[str] | None:
        return None if self.adapters is None else [self.adapters[s] for s in slots]

    def _forward(
        self,
        chunk: list[list[int]],
        chunk_mask: list[list[int]],
        names: list[str] | None = None,
        keep: int = 1,
    ) -> Any:
        """The logits of the chunk's last `keep` columns, `[rows, keep, vocab]`."""
        import torch

        model, device = self.policy.model, self.policy.device
        new_mask = torch.tensor(chunk_mask, dtype=torch.long, device=device)
        self._mask = new_mask if self._mask is None else torch.cat([self._mask, new_mask], dim=1)
        positions = (self._mask.cumsum(dim=1) - 1).clamp(min=0)[:, -new_mask.shape[1] :]
        if self._cache is None:
            from transformers import DynamicCache

            self._cache = DynamicCache()
        self.stats["forwards"] += 1
        self.stats["tokens"] += new_mask.numel()
        self.stats["rows"] += new_mask.shape[0]
        real = int(new_mask.sum().item())
        tokens.add(fed=real, padded=new_mask.numel() - real)
        extra = {} if names is None else {"adapter_names": names}
        out = model(
            input_ids=torch.tensor(chunk, device=device),
            attention_mask=self._mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=keep,
            **{cache_argument(model): self._cache},
            **extra,
        )
        return out.logits[:, -keep:].float()

    def _prefill_shared(self, news: dict[int, list[int]]) -> int:
        """On a wave's first step, prefill the prefix all rows share once and copy its cache to
        every row; returns its length (0 when there is none worth sharing). Each row keeps at
        least one token of its own, whose logits the step needs."""

        if not self.share_prefix or self._cache is not None or len(self._slots) < 2:
            return 0
        if any(not news.get(s) for s in self._slots):
            return 0
        seqs = [news[s] for s in self._slots]
        shared = min(_common_prefix(seqs), min(len(s) for s in seqs) - 1)
        if shared < self.min_prefix:
            return 0
        # once per adapter among the rows (an adapter changes the prefix's keys and values)
        names = self._names(self._slots)
        distinct = sorted(set(names)) if names is not None else [None]
        prefix = seqs[0][:shared]
        self._forward([prefix] * len(distinct), [[1] * shared] * len(distinct),
                      None if names is None else distinct, keep=1)  # fmt: skip
        kv = _get_kv(self._cache)
        if kv is None:  # cannot copy rows: start over the usual way
            self._cache = self._mask = None
            return 0
        if len(distinct) == 1:
            self._cache.batch_repeat_interleave(len(self._slots))
            self._mask = self._mask.expand(len(self._slots), -1).contiguous()
        else:
            assert names is not None
            rows = _Rows(list(range(len(distinct))), self._mask, kv)
            rows = rows.select([distinct.index(n) for n in names])
            self._mask = rows.mask
            _set_kv(self._cache, rows.kv)
        self.stats["shared"] += shared * (len(self._slots) - len(distinct))
        return shared

    def _prefill(self, news: dict[int, list[int]], shared: int = 0) -> Any:
        """Feed each row's new tokens (after the `shared` ones), left-padded to the longest;
        returns the last column's logits, one row per `_slots` entry."""
        width = max(1, max(len(news.get(s, [])) - shared for s in self._slots))
        chunk, chunk_mask = [], []
        for slot in self._slots:
            new = news.get(slot, [])
            self._consumed[slot].extend(new)
            new = new[shared:]
            pad = width - len(new)
            chunk.append([self.pad_id] * pad + new)
            chunk_mask.append([0] * pad + [1] * len(new))
        return self._forward(chunk, chunk_mask, self._names(self._slots))[:, -1]

    def _prefill_plan(self, news: dict[int, list[int]]) -> list[list[int]]:
        """The rows' prefill as one forward, or as several when their new tokens differ so much
        in length that padding the short ones to the long ones costs more (a new conversation's
        prompt beside tool results; `prefill_groups`)."""
        if not self.split_prefill or not self.compact or len(self._slots) < 2:
            return [list(self._slots)]
        lengths = {s: len(news.get(s, [])) for s in self._slots}
        if min(lengths.values()) == 0:  # a row with nothing to feed keeps the one-forward path
            return [list(self._slots)]
        return prefill_groups(lengths, PREFILL_OVERHEAD)

    def _prefill_apart(self, news: dict[int, list[int]], groups: list[list[int]]) -> Any:
        """`_prefill` one group of rows at a time, the others parked, then every row back in
        the batch; returns the logits in the order of `_slots` as it is then."""
        import torch

        everyone = set(self._slots)
        idle = self._idle
        self._idle = idle | everyone  # rows outside the group sit parked, not dropped
        last: dict[int, Any] = {}
        try:
            for group in groups:
                if self._cache is None:
                    self._slots = sorted(group)
                else:
                    self._regroup(set(group))
                logits = self._prefill(news)
                last.update({s: logits[i] for i, s in enumerate(self._slots)})
        finally:
            self._idle = idle
        self._regroup(everyone)
        return torch.stack([last[s] for s in self._slots])

    def _pick(self, logits: Any, rows: dict[int, int]) -> dict[int, int]:
        """The next token of each lane in `rows` (slot -> row of `logits`)."""
        import torch

        picks = {}
        sampled = {slot: row for slot, row in rows.items() if self.temperatures[slot] > 0}
        for slot, row in sampled.items():
            picks[slot] = self._sample(logits[row], slot)
        if len(sampled) < len(rows):
            best = torch.argmax(logits, dim=-1).tolist()
            picks.update({s: best[row] for s, row in rows.items() if s not in sampled})
        return picks

    def _sample(self, logits: Any, slot: int) -> int:
        import torch

        probs = torch.softmax(logits / self.temperatures[slot], dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=self.generators[slot]).item())

    def _drafts(self, running: set[int]) -> dict[int, list[int]]:
        """Each running lane's draft for the next step (`drafts.NgramIndex`), only when decoding
        greedily; lanes without one are left out."""
        k = draft_length(len(running), self.draft_budget)
        if k <= 0:
            return {}
        found = {}
        for slot in running:
            if self.temperatures[slot] > 0:  # drafts are checked against greedy choices only
                continue
            seq = self._consumed[slot]
            room = self.max_length - len(seq) - 1  # positions left after the lane's next token
            draft = self._index[slot].propose(seq, min(k, room))
            if draft:
                found[slot] = draft
                self.stats["drafted"] += len(draft)
        return found

    def _verify(
        self, logits: Any, rows: dict[int, int], drafts: dict[int, list[int]]
    ) -> dict[int, list[int]]:
        """Each lane's new tokens after a drafting step: the greedy token at each fed position,
        as long as the draft agreed with the one before (the last one is always the model's)."""
        import torch

        best = torch.argmax(logits, dim=-1).tolist()  # [rows][columns]
        replies = {}
        for slot, row in rows.items():
            if self.temperatures[slot] > 0:  # a sampling lane beside drafting ones: no draft
                replies[slot] = [self._sample(logits[row, -1], slot)]
                continue
            draft = drafts.get(slot, [])
            greedy = best[row][len(best[row]) - 1 - len(draft) :]
            new = [greedy[0]]
            for i, guess in enumerate(draft):
                if guess != new[-1]:
                    break
                new.append(greedy[i + 1])
            replies[slot] = new
        return replies

    def _drop_rejected(
        self, drafts: dict[int, list[int]], replies: dict[int, list[int]], kept: dict[int, int]
    ) -> None:
        """Mask the cache columns of draft tokens that are not in their lane's conversation:
        guesses the model disagreed with, and anything fed after the reply's end. Positions come
        from the mask, so the next tokens sit right after the kept ones; `pack` removes the
        holes at the next request."""
        for row, slot in enumerate(self._slots):
            if slot not in drafts:
                continue
            valid = 1 + min(kept.get(slot, 0), len(replies[slot]) - 1)
            rejected = 1 + len(drafts[slot]) - valid
            if rejected > 0:
                self._mask[row, -rejected:] = 0

    def _extend(
        self,
        replies: dict[int, list[int]],
        pending: dict[int, tuple[list[int], int, int]],
        out: dict[int, list[int]],
        full: dict[int, bool],
        running: set[int],
    ) -> dict[int, int]:
        """Append each lane's new tokens to its reply up to its end (the stop token, its token
        limit or the context's); returns how many of them went into the lane's conversation (all
        but a reply's last token, which the lane's next request feeds)."""
        kept: dict[int, int] = {}
        generated = 0
        for slot, new in replies.items():
            _, max_new, stop_id = pending[slot]
            before = len(out[slot])
            for i, token in enumerate(new):
                out[slot].append(token)
                generated += 1
                self.stats["accepted"] += i > 0  # a draft token the model agreed with
                done = token == stop_id or len(out[slot]) >= max_new
                if not done and len(self._consumed[slot]) + 1 >= self.max_length:
                    full[slot] = done = True
                if done:
                    running.discard(slot)
                    break
                self._consumed[slot].append(token)
                kept[slot] = i + 1
            if self.on_tokens is not None:
                self.on_tokens(slot, out[slot][before:])
        tokens.add(generated=generated)
        return kept

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
                if self._cache is None:
                    self._slots = sorted(pending)
                else:
                    self._regroup(set(pending))
            shared = self._prefill_shared(news)
            groups = self._prefill_plan(news) if not shared else [list(self._slots)]
            if len(groups) == 1:
                logits = self._prefill(news, shared)
            else:
                logits = self._prefill_apart(news, groups)
            out: dict[int, list[int]] = {slot: [] for slot in pending}
            full: dict[int, bool] = {slot: False for slot in pending}
            running = set(pending)
            for slot in list(running):
                if len(self._consumed[slot]) >= self.max_length:
                    full[slot] = True
                    running.discard(slot)
            drafts: dict[int, list[int]] = {}
            while running:
                rows = {s: i for i, s in enumerate(self._slots) if s in running}
                if drafts:
                    replies = self._verify(logits, rows, drafts)
                else:
                    replies = {slot: [t] for slot, t in self._pick(logits, rows).items()}
                kept = self._extend(replies, pending, out, full, running)
                if drafts:
                    self._drop_rejected(drafts, replies, kept)
                if not running:
                    break
                if self.compact:
                    self._park(running)
                drafts = self._drafts(running)
                width = 1 + max((len(d) for d in drafts.values()), default=0)
                step_ids, step_mask = [], []
                for s in self._slots:
                    row = [out[s][-1], *drafts.get(s, [])] if s in running else []
                    step_ids.append([self.pad_id] * (width - len(row)) + row)
                    step_mask.append([0] * (width - len(row)) + [1] * len(row))
                logits = self._forward(step_ids, step_mask, self._names(self._slots), keep=width)
                if not drafts:
                    logits = logits[:, -1]
        # the last token of each reply is not in the cache yet: the lane's next request feeds it
        return {slot: (out[slot], full[slot]) for slot in pending}


# A forward pass's fixed cost in fed tokens, for splitting a prefill (`prefill_groups`): on
# SmolLM2-135M on 2 CPU cores a forward of a few rows costs about what 16 more tokens do.
PREFILL_OVERHEAD = 16


def prefill_groups(lengths: dict[int, int], overhead: int = PREFILL_OVERHEAD) -> list[list[int]]:
    """Rows (slot -> new tokens to feed) split into prefill forwards, longest first. A forward
    costs its rows times its longest row's tokens (the rest is padding) plus `overhead`; the
    split of the rows sorted by length that minimises the sum is found exactly."""
    order = sorted(lengths, key=lambda s: (-lengths[s], s))
    return contiguous_split(order, lambda i, j: (j - i) * lengths[order[i]] + overhead)


def contiguous_split(order: list[T], cost: Callable[[int, int], float]) -> list[list[T]]:
    """`order` cut into consecutive parts minimising the sum of `cost(i, j)` over each part
    `order[i:j]`, exactly (dynamic programming over the cut points, n^2 calls of `cost`)."""
    n = len(order)
    best = [0.0] + [float("inf")] * n
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            total = best[i] + cost(i, j)
            if total < best[j]:
                best[j], start[j] = total, i
    parts: list[list[T]] = []
    j = n
    while j > 0:
        parts.append(order[start[j] : j])
        j = start[j]
    return parts[::-1]


def _empty_row(slot: int, like: _Rows) -> _Rows:
    """A row with no cached columns for `slot`, shaped like `like`'s (its first step feeds all
    of its tokens)."""
    import torch

    mask = torch.zeros((1, 0), dtype=like.mask.dtype, device=like.mask.device)
    kv = [
        (k.new_zeros((1, k.shape[1], 0, k.shape[3])), v.new_zeros((1, v.shape[1], 0, v.shape[3])))
        for k, v in like.kv
    ]
    return _Rows([slot], mask, kv)


BASE = "__base__"  # peft's name for "no adapter" in a mixed batch


def _row_adapters(model: Any, adapters: Sequence[str | None] | None, size: int) -> list[str] | None:
    """Each lane's adapter as peft's `adapter_names` wants it, or None when there is nothing to
    mix (no list given). Switches the model's adapter layers on: a mixed batch needs them."""
    if adapters is None:
        return None
    adapters = list(adapters)
    if len(adapters) != size:
        raise ValueError(f"{len(adapters)} adapters for a wave of {size} lanes")
    if not hasattr(model, "peft_config"):
        if any(a is not None for a in adapters):
            raise ValueError("per-lane adapters need a PeftModel holding them")
        return None
    model.base_model.enable_adapter_layers()
    return [a if a is not None else BASE for a in adapters]


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
    compact: bool = True,
    share_prefix: bool = True,
    stats: dict[str, int] | None = None,
    adapter_of: Callable[[T], str | None] | None = None,
    draft_budget: int = DRAFT_BUDGET,
) -> list[R]:
    """`[fn(lane, item) for item in items]`, run `batch_size` at a time in threads that share
    batched generation. Results keep the order of `items`; an exception in `fn` is raised after
    its wave finishes. `compact`, `share_prefix` and `draft_budget` (0: no drafts) are
    `Wave`'s; `stats`, when given, adds up the waves' `Wave.stats`. `adapter_of(item)`: the
    LoRA adapter that item's lane decodes with (None: the base model), so items of different
    adapters share a wave (`policy.model` a PeftModel holding them); without it every lane uses
    the model as it is set."""
    items = list(items)

    def make(start: int, n: int) -> Wave:
        adapters = None
        if adapter_of is not None:
            adapters = [adapter_of(item) for item in items[start : start + n]]
        return Wave(
            policy, n, temperature=temperature, seed=seed + start, compact=compact,
            share_prefix=share_prefix, adapters=adapters, draft_budget=draft_budget,
        )  # fmt: skip

    return run_waves(make, fn, items, batch_size=batch_size, on_done=on_done, stats=stats)


def run_waves(
    make_wave: Callable[[int, int], Any],
    fn: Callable[[Lane, T], R],
    items: Iterable[T],
    *,
    batch_size: int,
    on_done: Callable[[R], None] | None = None,
    stats: dict[str, int] | None = None,
) -> list[R]:
    """`[fn(lane, item) for item in items]` in waves of `batch_size` threads, each wave from
    `make_wave(start, n)` (anything with `lanes` and `stats`: `Wave`, or another engine's), so
    every engine shares one ordering, error and stats rule."""
    items = list(items)
    results: list[Any] = [None] * len(items)
    for start in range(0, len(items), max(1, batch_size)):
        wave_items = items[start : start + batch_size]
        wave = make_wave(start, len(wave_items))

        def run(index: int, wave: Any = wave, wave_items: list[T] = wave_items) -> R:
            lane = wave.lanes[index]
            try:
                return fn(lane, wave_items[index])
            finally:
                lane.close()

        try:
            with ThreadPoolExecutor(max_workers=len(wave_items)) as pool:
                futures = [pool.submit(run, i) for i in range(len(wave_items))]
                for offset, future in enumerate(futures):
                    results[start + offset] = future.result()
                    if on_done is not None:
                        on_done(results[start + offset])
        finally:
            if stats is not None:
                for key, value in wave.stats.items():
                    stats[key] = stats.get(key, 0) + value
    return results


__all__ = ["Lane", "Wave", "map_batched", "run_waves"]
