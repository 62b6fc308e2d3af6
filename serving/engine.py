"""Continuous batching for the local backend: many callers' requests decoded together.

Requests come from many threads (the server's handlers, each an agent's conversation). One
scheduler thread gathers them, assigns each a slot of a `generation.batching.Wave` (one row of
its batched KV cache), and runs `Wave.step_slots` for all of them at once: lockstep decoding
with shared-prefix prefill, drafts and per-row LoRA adapters, exactly as `map_batched` does in
process. What the engine adds is the slot choice, so that a conversation's next turn feeds only
its new tokens:

- a request whose prompt extends the prompt its slot answered last (the same conversation: the
  previous prompt, the reply as the chat template renders it, the tool result) *continues* that
  slot. The template renders the earlier reply canonically, which may tokenize unlike the
  sampled tokens; the slot keeps the longest common token prefix and feeds the rest. A prefix's
  keys and values do not depend on what follows it, so this is never wrong, only shorter.
- any other request takes a never-used slot, else the least recently used one, keeping what
  prefix it shares with that slot's tokens (usually the system prompt and tools).

A slot's cache is reused only under the same adapter. Greedy replies equal the model's unbatched
greedy replies up to float rounding (`Wave`'s padding and positions).

Gathering: a step starts once every conversation the previous step answered is back with its
next turn (or every slot is asked for), or when waiting longer is not worth it: `patience` times
the previous step's duration after it ended (at least `straggler_s`, a client's round trip; at
most `max_wait_s`); a burst after a quiet spell waits `gather_s` for its companions. Requests
that arrive during a step wait for the next one, and the wait for stragglers lets two groups
that fell out of step merge again (two half batches cost nearly twice one whole batch on a CPU).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tracegym.generation.batching import BASE, Wave
from tracegym.generation.model import Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    """One generation: the prompt's token ids, the reply's limits and how it decodes.

    `on_tokens` is called from the scheduler thread with each batch of new tokens as they are
    decoded (streaming); it must be quick and is never allowed to break the step (its errors are
    logged and dropped)."""

    ids: list[int]
    max_tokens: int
    stop_id: int
    adapter: str | None = None  # None: the base model
    temperature: float = 0.0  # 0: greedy
    on_tokens: Callable[[list[int]], None] | None = None


@dataclass(frozen=True)
class Completion:
    """The reply's tokens (ending with the stop token unless cut short), whether the model's
    context ran out, and how many prompt tokens came from the slot's cache."""

    tokens: list[int]
    context_full: bool
    reused: int


@dataclass
class EngineStats:
    """Work done, for tests and benchmarks."""

    requests: int = 0
    steps: int = 0
    forwards: int = 0
    rows: int = 0  # batch rows over all forward passes
    max_batch: int = 0  # most requests in one step
    continued: int = 0  # requests that continued the conversation their slot held
    reused_tokens: int = 0  # prompt tokens not fed again (their keys and values were cached)
    prompt_tokens: int = 0

    @property
    def rows_per_forward(self) -> float:
        return self.rows / self.forwards if self.forwards else 0.0

    @property
    def reused_share(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class _Slot:
    used: bool = False
    adapter: str | None = None
    prompt_len: int = 0  # the length of the prompt this slot answered last
    last_used: int = 0


@dataclass
class _Job:
    request: Request
    future: Future[Completion] = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    continues: tuple[int, int | None] = (-1, None)  # (engine step, the slot it continues)


def default_threads() -> int:
    """Intra-op threads for the engine: all cores but one. On a 2-core CPU, two threads per
    forward pass while the server's handlers and the agents' threads also want a core made
    serve's steps several times slower than in process (OpenMP threads waiting on a descheduled
    sibling); one thread kept them even."""
    import torch

    return max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) - 1))


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Engine:
    """A scheduler thread over one `Wave` of `slots` rows; `submit` from any thread."""

    def __init__(
        self,
        policy: Policy,
        *,
        slots: int = 16,
        gather_s: float = 0.005,
        patience: float = 0.25,
        straggler_s: float = 0.05,
        max_wait_s: float = 1.0,
        max_length: int | None = None,
        threads: int | None = None,
        compact: bool = True,
    ) -> None:
        """`threads`: the scheduler thread's intra-op threads for the forward passes (torch's
        setting is per thread); default: one core fewer than the machine has (at least one),
        which leaves the server's own Python threads a core (see `default_threads`).
        `compact` False keeps every slot's row in every forward pass (`Wave`'s `compact`): the
        way to batch a model whose cache cannot be regrouped by row, switched to on its own
        when such a cache is met."""
        self.policy = policy
        self.threads = threads or default_threads()
        self.size = slots
        self.gather_s = gather_s
        self.patience = patience
        self.straggler_s = straggler_s
        self.max_wait_s = max_wait_s
        self.max_length = max_length
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._pending: list[_Job] = []
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._closed = False
        self._answered: set[int] = set()  # slots the previous step answered: likely back soon
        self._last_end = 0.0
        self._last_step_s = 0.0
        self._clock = 0
        self._compact = compact
        self._wave = self._new_wave()
        self._thread = threading.Thread(target=self._run, name="tracegym-engine", daemon=True)
        self._thread.start()

    # the callers' side ---------------------------------------------------------------------------
    def submit(self, request: Request) -> Future[Completion]:
        if not request.ids:
            raise ValueError("a request needs at least one prompt token")
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        job = _Job(request)
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._pending.append(job)
            self._cond.notify_all()
        return job.future

    def generate(self, request: Request, timeout: float | None = None) -> Completion:
        return self.submit(request).result(timeout)

    def call_between_steps(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` in the scheduler thread before the next step (loading adapters: the model
        must not change during a step); its result or error lands in the future."""
        future: Future[Any] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._calls.append((fn, future))
            self._cond.notify_all()
        return future

    @property
    def mixes_adapters(self) -> bool:
        """Whether rows may carry different LoRA adapters (the model is a PeftModel)."""
        return self._wave.adapters is not None

    def replace_model(self, model: Any) -> None:
        """Serve `model` from the next step on (e.g. a PeftModel that now holds adapters); the
        cached conversations start over. Call from `call_between_steps`."""
        self.policy = Policy(model, self.policy.tokenizer, self.policy.name, self.policy.folder)
        self._wave = self._new_wave()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    # the scheduler ----------------------------------------------------------------------------
    def _new_wave(self) -> Wave:
        model = self.policy.model
        adapters = [None] * self.size if hasattr(model, "peft_config") else None
        wave = Wave(
            self.policy, self.size, max_length=self.max_length, adapters=adapters,
            compact=self._compact,
        )  # fmt: skip
        self._slots = [_Slot() for _ in range(self.size)]
        return wave

    def _run(self) -> None:
        import torch

        torch.set_num_threads(self.threads)  # this thread's only
        while True:
            with self._cond:
                while not self._pending and not self._calls and not self._closed:
                    self._cond.wait()
                if self._closed:
                    for job in self._pending:
                        job.future.set_exception(RuntimeError("the engine is closed"))
                    self._pending = []
                    return
                calls, self._calls = self._calls, []
            if calls:
                for fn, future in calls:
                    try:
                        future.set_result(fn())
                    except BaseException as exc:  # the caller sees it
                        future.set_exception(exc)
                continue
            jobs = self._gather()
            if not jobs:
                continue
            try:
                self._step(jobs)
            except BaseException as exc:  # never leave a caller waiting on a dead scheduler
                log.exception("a batched step failed; its requests fail and the cache starts over")
                self._wave = self._new_wave()
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)

    def _gather(self) -> list[_Job]:
        """Wait for this step's requests (see the module's docstring); returns them, oldest
        first, with a slot each (those that found none stay pending)."""
        with self._cond:
            first = min(job.arrived for job in self._pending)
            wait = min(max(self.straggler_s, self.patience * self._last_step_s), self.max_wait_s)
            expected = self._answered
            if first - self._last_end > wait:  # a burst after a quiet spell
                expected, wait = set(), self.gather_s
            start = max(first, self._last_end)
            while not self._closed and not self._calls:
                left = start + wait - time.monotonic()
                if len(self._pending) >= self.size or left <= 0:
                    break
                if expected and expected <= {self._continues(job) for job in self._pending}:
                    break
                self._cond.wait(left)
            if self._closed or self._calls:
                return []
            jobs, self._pending = self._pending[: self.size], self._pending[self.size :]
        return jobs

    def _continuation(self, request: Request, taken: set[int]) -> tuple[int, int]:
        """The slot whose conversation `request` continues (its prompt extends the prompt that
        slot answered last, under the same adapter) and the tokens they share; (-1, -1) if none."""
        consumed = self._wave._consumed
        best, best_common = -1, -1
        for slot, info in enumerate(self._slots):
            if slot in taken or not info.used or info.adapter != request.adapter:
                continue
            common = _common(consumed[slot], request.ids)
            if common >= info.prompt_len and common > best_common:
                best, best_common = slot, common
        return best, best_common

    def _continues(self, job: _Job) -> int | None:
        """The slot `job` continues, worked out once per step (called with the lock held)."""
        step, slot = job.continues
        if step != self.stats.steps:
            found, _ = self._continuation(job.request, set())
            slot = found if found >= 0 else None
            job.continues = (self.stats.steps, slot)
        return slot

    def _choose(self, request: Request, taken: set[int]) -> tuple[int, int, bool]:
        """The slot for `request`, the prompt tokens it keeps from that slot's cache, and whether
        it continues the slot's conversation."""
        consumed = self._wave._consumed
        best, best_common = self._continuation(request, taken)
        if best >= 0:
            return best, best_common, True
        free = [s for s in range(self.size) if s not in taken]
        slot = min(free, key=lambda s: (self._slots[s].used, self._slots[s].last_used))
        info = self._slots[slot]
        common = _common(consumed[slot], request.ids) if info.adapter == request.adapter else 0
        return slot, common, False

    def _step(self, jobs: list[_Job]) -> None:
        wave = self._wave
        taken: set[int] = set()
        batch: dict[int, _Job] = {}
        reused: dict[int, int] = {}
        for job in jobs:
            request = job.request
            slot, common, continued = self._choose(request, taken)
            taken.add(slot)
            keep = min(common, len(request.ids) - 1)
            wave.truncate(slot, keep)
            if wave.adapters is not None:
                wave.adapters[slot] = request.adapter if request.adapter is not None else BASE
            wave.temperatures[slot] = float(request.temperature or 0.0)
            self._clock += 1
            self._slots[slot] = _Slot(True, request.adapter, len(request.ids), self._clock)
            batch[slot] = job
            reused[slot] = keep
            self.stats.requests += 1
            self.stats.continued += continued
            self.stats.reused_tokens += keep
            self.stats.prompt_tokens += len(request.ids)
        self.stats.steps += 1
        self.stats.max_batch = max(self.stats.max_batch, len(batch))
        idle = [s for s, info in enumerate(self._slots) if info.used and s not in batch]

        def on_tokens(slot: int, new: list[int]) -> None:
            callback = batch[slot].request.on_tokens
            if callback is None or not new:
                return
            try:
                callback(new)
            except Exception:  # a caller's callback must not break the batch
                log.exception("an on_tokens callback failed")

        pending = {
            s: (j.request.ids, j.request.max_tokens, j.request.stop_id) for s, j in batch.items()
        }
        before = dict(wave.stats)
        wave.on_tokens = on_tokens
        started = time.monotonic()
        try:
            results = wave.step_slots(pending, idle)
        finally:
            wave.on_tokens = None
            self.stats.forwards += wave.stats["forwards"] - before["forwards"]
            self.stats.rows += wave.stats["rows"] - before["rows"]
        with self._cond:
            self._answered = set(batch)
            self._last_end = time.monotonic()
            self._last_step_s = self._last_end - started
        for slot, job in batch.items():
            tokens, full = results[slot]
            job.future.set_result(Completion(tokens, full, reused[slot]))
        if self._compact and wave._rows() is None:
            # a cache `Wave` cannot regroup by row (sliding windows): every slot's row stays in
            # every forward pass from now on, which serves any subset of slots
            log.warning("this model's KV cache cannot be regrouped: batching without compaction")
            self._compact = False
            self._wave = self._new_wave()


__all__ = ["Completion", "Engine", "EngineStats", "Request"]
