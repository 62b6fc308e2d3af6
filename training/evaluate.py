"""Held-out evaluation: success of base vs base + adapter (vs base + router), 95% Wilson
intervals, and promotion only when the gain is significant.

    from tracegym.training.evaluate import evaluate_capability
    row = evaluate_capability(model, tokenizer, env, adapter_id, seeds)   # model: a PeftModel
    EvaluationRow.from_dict(row).promoted

A row is an `EvaluationRow`; the evaluation functions return its JSON form (`to_dict()`), the
one adapters' metadata, the nightly's stage results and `tracegym evaluate --json` carry.

The gain is tested with a one-sided two-proportion z-test (pooled); an adapter is promoted when
its held-out success beats the base policy's at p < 0.05. A non-promoted adapter stays in the
registry but the router skips it, and the reason is written to its metadata and the report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from tracegym.generation.batching import map_batched
from tracegym.generation.model import Policy
from tracegym.store.home import DocumentError
from tracegym.training.rollout import rollout
from tracegym.training.router import apply_weights

ALPHA = 0.05
Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def gain_p_value(s1: int, n1: int, s2: int, n2: int) -> float:
    """One-sided p-value that rate 2 (s2/n2) is greater than rate 1 (pooled z-test)."""
    if n1 == 0 or n2 == 0:
        return 1.0
    p1, p2 = s1 / n1, s2 / n2
    pooled = (s1 + s2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return 1.0 if p2 <= p1 else 0.0
    z = (p2 - p1) / se
    return 0.5 * math.erfc(z / math.sqrt(2))


class EvaluationError(DocumentError):
    """An evaluation row (in an adapter's metadata, a stage result or a report) that cannot be
    read: not an object, or a field missing or of the wrong type."""


def _number(data: Mapping[str, Any], key: str, what: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EvaluationError(f"{what} needs a number '{key}', got {value!r}")
    return value


@dataclass(frozen=True)
class Rate:
    """Successes out of `n` held-out cases, their rate and its 95% Wilson interval."""

    passed: int
    n: int
    rate: float
    ci95: tuple[float, float]

    @classmethod
    def of(cls, successes: int, n: int) -> Rate:
        low, high = wilson(successes, n)
        return cls(
            passed=successes,
            n=n,
            rate=round(successes / n, 4) if n else 0.0,
            ci95=(round(low, 4), round(high, 4)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "n": self.n, "rate": self.rate, "ci95": list(self.ci95)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rate:
        if not isinstance(data, Mapping):
            raise EvaluationError(f"a rate must be an object, got {type(data).__name__}")
        passed = int(_number(data, "passed", "a rate"))
        n = int(_number(data, "n", "a rate"))
        ci95 = data.get("ci95")
        if ci95 is None:
            low, high = wilson(passed, n)
            ci95 = (round(low, 4), round(high, 4))
        elif not isinstance(ci95, (list, tuple)) or len(ci95) != 2:
            raise EvaluationError(f"a rate's 'ci95' must be [low, high], got {ci95!r}")
        rate_ = data.get("rate")
        return cls(
            passed=passed,
            n=n,
            rate=float(rate_) if rate_ is not None else (round(passed / n, 4) if n else 0.0),
            ci95=(float(ci95[0]), float(ci95[1])),
        )

    @classmethod
    def coerce(cls, value: Rate | Mapping[str, Any]) -> Rate:
        """`value` as a Rate (the statistics accept a rate's JSON form too)."""
        return value if isinstance(value, Rate) else cls.from_dict(value)


@dataclass(frozen=True)
class Sequential:
    """How a sequential evaluation went: `run` of `planned` cases over `looks` rounds, and why
    it stopped early ("significant", "hopeless") or None when it ran them all."""

    looks: int
    planned: int
    run: int
    stopped: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"looks": self.looks, "planned": self.planned, "run": self.run,
                "stopped": self.stopped}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sequential:
        if not isinstance(data, Mapping):
            raise EvaluationError(f"'sequential' must be an object, got {type(data).__name__}")
        what = "'sequential'"
        return cls(
            looks=int(_number(data, "looks", what)),
            planned=int(_number(data, "planned", what)),
            run=int(_number(data, "run", what)),
            stopped=data.get("stopped"),
        )


@dataclass(frozen=True)
class EvaluationRow:
    """One adapter's held-out evaluation: the base policy's rate, the adapted one's (and the
    router's when it was asked for), the gain, its p-value and the promotion decision.

    Rows sit inside other documents (an adapter's `metrics.eval`, the nightly's evaluate stage
    and report, `tracegym evaluate --json`), so a row carries no version of its own."""

    VERSION: ClassVar[int] = 1

    env_id: str
    env_ids: tuple[str, ...]
    adapter_id: str
    seeds: tuple[int, ...]
    base: Rate
    adapter: Rate
    gain: float
    p_value: float
    promoted: bool
    reason: str
    router: Rate | None = None
    sequential: Sequential | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "env_id": self.env_id,
            "env_ids": list(self.env_ids),
            "adapter_id": self.adapter_id,
            "seeds": list(self.seeds),
            "base": self.base.to_dict(),
            "adapter": self.adapter.to_dict(),
            "gain": self.gain,
            "p_value": self.p_value,
            "promoted": self.promoted,
            "reason": self.reason,
            "router": self.router.to_dict() if self.router is not None else None,
        }
        if self.sequential is not None:
            out["sequential"] = self.sequential.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvaluationRow:
        """A row as written (rows before `env_ids`: the one `env_id`; before `sequential`:
        none)."""
        if not isinstance(data, Mapping):
            raise EvaluationError(f"an evaluation row must be an object, got {type(data).__name__}")
        for key in ("adapter_id", "env_id"):
            if not isinstance(data.get(key), str):
                raise EvaluationError(f"an evaluation row needs an '{key}' string")
        for key in ("base", "adapter"):
            if key not in data:
                raise EvaluationError(f"evaluation row {data['adapter_id']!r} has no '{key}' rate")
        base, adapted = Rate.from_dict(data["base"]), Rate.from_dict(data["adapter"])
        seeds = data.get("seeds") or []
        env_ids = data.get("env_ids") or data["env_id"].split("+")
        sequential = data.get("sequential")
        router = data.get("router")
        p_value = data.get("p_value")
        if p_value is None:
            p_value = round(gain_p_value(base.passed, base.n, adapted.passed, adapted.n), 6)
        return cls(
            env_id=data["env_id"],
            env_ids=tuple(str(e) for e in env_ids),
            adapter_id=data["adapter_id"],
            seeds=tuple(int(s) for s in seeds),
            base=base,
            adapter=adapted,
            gain=float(data.get("gain", round(adapted.rate - base.rate, 4))),
            p_value=float(p_value),
            promoted=bool(data.get("promoted", False)),
            reason=str(data.get("reason") or ""),
            router=Rate.from_dict(router) if router is not None else None,
            sequential=Sequential.from_dict(sequential) if sequential is not None else None,
        )


RateLike = Rate | Mapping[str, Any]


def gain(base: RateLike, adapted: RateLike) -> dict[str, float]:
    """`gain` (adapted rate less base rate) and its one-sided `p_value`, of two rates."""
    base, adapted = Rate.coerce(base), Rate.coerce(adapted)
    p = gain_p_value(base.passed, base.n, adapted.passed, adapted.n)
    return {"gain": round(adapted.rate - base.rate, 4), "p_value": round(p, 6)}


def rate(successes: int, n: int) -> dict[str, Any]:
    """`Rate.of(successes, n)` in its JSON form (reports carry it as an object)."""
    return Rate.of(successes, n).to_dict()


def decide(
    base: RateLike, adapted: RateLike, alpha: float = ALPHA, looks: int = 1
) -> tuple[bool, str]:
    """Promote when the gain is positive and significant at `alpha`, split evenly over `looks`
    (Bonferroni: peeking `looks` times keeps the chance of promoting a useless adapter <= alpha)."""
    base, adapted = Rate.coerce(base), Rate.coerce(adapted)
    threshold = alpha / max(1, looks)
    split = f": {alpha} over {looks} looks" if looks > 1 else ""
    p = gain_p_value(base.passed, base.n, adapted.passed, adapted.n)
    gain = adapted.rate - base.rate
    if p < threshold and gain > 0:
        return (
            True,
            f"held-out gain {gain:+.2f} is significant (p={p:.3g} < {threshold:.3g}{split})",
        )
    return (
        False,
        f"held-out gain {gain:+.2f} is not significant (p={p:.3g} >= {threshold:.3g}{split})",
    )


def look_sizes(n: int, looks: int) -> list[int]:
    """Seeds run by each look of a sequential evaluation: `n` seeds in `looks` near-equal
    rounds, cumulative (a look may add no seed when n < looks)."""
    looks = max(1, looks)
    return [n * (k + 1) // looks for k in range(looks)]


def settled(
    base: RateLike, adapted: RateLike, planned: int, alpha: float, looks: int
) -> str | None:
    """Whether a look can stop an adapter's evaluation: "significant" (promote now),
    "hopeless" (even if every remaining seed went to the adapter and none to the base, the gain
    could not become significant), or None (run the next round). Stopping for futility never
    promotes, so it keeps the error bound of `decide`."""
    base, adapted = Rate.coerce(base), Rate.coerce(adapted)
    threshold = alpha / max(1, looks)
    if decide(base, adapted, alpha, looks)[0]:
        return "significant"
    left = planned - base.n
    best = gain_p_value(base.passed, planned, adapted.passed + left, planned)
    return "hopeless" if best >= threshold else None


@dataclass(frozen=True)
class EvalJob:
    """One adapter's held-out cases: (environment, seed) pairs, from one environment or taken in
    turn from the environments of its capability (each from its own held-out seed range)."""

    adapter_id: str
    cases: tuple[tuple[Any, int], ...]

    @classmethod
    def of(cls, env: Any, adapter_id: str, seeds: Sequence[int]) -> EvalJob:
        return cls(adapter_id, tuple((env, int(s)) for s in seeds))

    @classmethod
    def spread(cls, envs: Sequence[Any], adapter_id: str, n: int) -> EvalJob:
        """`n` cases over `envs` in turn: case i is envs[i % k] on that env's (i // k)-th
        held-out seed, so every prefix of the cases covers the environments evenly."""
        cases = []
        for i in range(n):
            env = envs[i % len(envs)]
            h0, h1 = env.spec.heldout_seeds if env.spec is not None else (1_000_000, 1_001_000)
            if h0 + i // len(envs) < h1:
                cases.append((env, h0 + i // len(envs)))
        return cls(adapter_id, tuple(cases))

    @property
    def env_ids(self) -> list[str]:
        return list(dict.fromkeys(env.env_id for env, _ in self.cases))

    def head(self, start: int, stop: int) -> EvalJob:
        return EvalJob(self.adapter_id, self.cases[start:stop])


def _run(
    policy: Policy,
    cases: Sequence[tuple[Any, int]],
    adapter: str | None,
    batch_size: int = 8,
    **kw: Any,
) -> int:
    """Greedy passes over `cases`, generating for `batch_size` episodes at a time."""
    import copy

    if batch_size <= 1:
        return sum(rollout(policy, copy.deepcopy(env), s, adapter=adapter, **kw).passed
                   for env, s in cases)  # fmt: skip

    def one(lane: Any, case: tuple[Any, int]) -> Any:
        env, s = case
        return rollout(policy, copy.deepcopy(env), s, adapter=adapter, lm=lane, **kw)

    return sum(r.passed for r in map_batched(policy, one, list(cases), batch_size=batch_size))


def run_arms(
    policy: Policy,
    jobs: Sequence[EvalJob],
    batch_size: int = 8,
    **kw: Any,
) -> list[tuple[list[Any], list[Any]]]:
    """(base rollouts, adapter rollouts) of each job, every episode of every job in the same
    waves: a lane decodes with its own adapter (or none), so the base and the adapted arms, and
    all environments, share batched steps instead of queueing."""
    import copy

    items = [
        (j, env, seed, adapter)
        for j, job in enumerate(jobs)
        for adapter in (None, job.adapter_id)
        for env, seed in job.cases
    ]

    def one(lane: Any, item: tuple[int, Any, int, str | None]) -> Any:
        _, env, seed, adapter = item
        return rollout(policy, copy.deepcopy(env), seed, adapter=adapter, lm=lane, **kw)

    results = map_batched(policy, one, items, batch_size=batch_size,
                          adapter_of=lambda item: item[3])  # fmt: skip
    arms: list[tuple[list[Any], list[Any]]] = [([], []) for _ in jobs]
    for (j, _, _, adapter), result in zip(items, results, strict=True):
        arms[j][adapter is not None].append(result)
    return arms


def evaluate_capabilities(
    model: Any,
    tokenizer: Any,
    jobs: Sequence[EvalJob],
    *,
    name: str = "policy",
    alpha: float = ALPHA,
    batch_size: int = 8,
    looks: int = 1,
    **rollout_kwargs: Any,
) -> list[dict[str, Any]]:
    """`evaluate_job` (without the router column) for each job, the base and adapted episodes
    of all of them batched together (`model` a PeftModel holding every adapter). Greedy replies
    are each lane's own, so the rows are what the one-at-a-time evaluation gives, up to float
    rounding in a different batch.

    `looks` > 1 makes it sequential: the cases run in `looks` rounds, and after each round an
    adapter whose decision is already clear (`settled`) runs no more; `alpha` is split over the
    looks. An adapter at 0/6 -> 6/6 is promoted after one round of a 12-case plan."""
    policy = Policy(model, tokenizer, name)
    if batch_size <= 1 and looks <= 1:
        return [
            evaluate_job(model, tokenizer, job, name=name, alpha=alpha, batch_size=batch_size,
                         **rollout_kwargs)
            for job in jobs
        ]  # fmt: skip
    runs: list[tuple[list[Any], list[Any]]] = [([], []) for _ in jobs]
    stops: list[str | None] = [None] * len(jobs)
    plans = [look_sizes(len(job.cases), looks) for job in jobs]

    def passed(results: list[Any]) -> Rate:
        return Rate.of(sum(r.passed for r in results), len(results))

    for look in range(max(1, looks)):
        todo = [
            j for j in range(len(jobs)) if stops[j] is None and plans[j][look] > len(runs[j][0])
        ]
        chunk = [jobs[j].head(len(runs[j][0]), plans[j][look]) for j in todo]
        arms = run_arms(policy, chunk, batch_size=batch_size, **rollout_kwargs) if todo else []
        for j, (base, adapted) in zip(todo, arms, strict=True):
            runs[j][0].extend(base)
            runs[j][1].extend(adapted)
            if look < looks - 1:
                planned = len(jobs[j].cases)
                stops[j] = settled(passed(runs[j][0]), passed(runs[j][1]), planned,
                                   alpha, looks)  # fmt: skip
    rows = []
    for job, (base, adapted), stop in zip(jobs, runs, stops, strict=True):
        row = _row(job.head(0, len(base)), passed(base), passed(adapted), alpha, looks)
        if looks > 1:
            reason = row.reason
            if stop is not None:
                why = {"significant": "", "hopeless": ": the rest could not make it significant"}
                reason += f"; stopped after {len(base)} of {len(job.cases)} seeds{why[stop]}"
            sequential = Sequential(looks, len(job.cases), len(base), stop)
            row = replace(row, reason=reason, sequential=sequential)
        rows.append(row.to_dict())
    return rows


def _row(job: EvalJob, base: Rate, adapted: Rate, alpha: float, looks: int = 1) -> EvaluationRow:
    promoted, reason = decide(base, adapted, alpha, looks)
    seeds = sorted(s for _, s in job.cases)
    env_ids = job.env_ids
    difference = gain(base, adapted)
    return EvaluationRow(
        env_id="+".join(env_ids),
        env_ids=tuple(env_ids),
        adapter_id=job.adapter_id,
        seeds=(seeds[0], seeds[-1]) if seeds else (),
        base=base,
        adapter=adapted,
        gain=difference["gain"],
        p_value=difference["p_value"],
        promoted=promoted,
        reason=reason,
    )


def evaluate_capability(
    model: Any,
    tokenizer: Any,
    env: Any,
    adapter_id: str,
    seeds: Sequence[int],
    **kwargs: Any,
) -> dict[str, Any]:
    """`evaluate_job` on one environment's `seeds`."""
    return evaluate_job(model, tokenizer, EvalJob.of(env, adapter_id, seeds), **kwargs)


def evaluate_job(
    model: Any,
    tokenizer: Any,
    job: EvalJob,
    *,
    name: str = "policy",
    route: Callable[[Any, int], Mapping[str, float]] | None = None,
    alpha: float = ALPHA,
    **rollout_kwargs: Any,
) -> dict[str, Any]:
    """Greedy held-out success of the base model (adapters disabled), the base with the job's
    adapter, and (with `route`, a task's adapter weights: see `router.rounded`, so that tasks
    with the same mixture run as one batch) the router."""
    policy = Policy(model, tokenizer, name)
    n = len(job.cases)
    with model.disable_adapter():
        base = Rate.of(_run(policy, job.cases, None, **rollout_kwargs), n)
    model.base_model.enable_adapter_layers()  # a router may have switched them off
    model.set_adapter(job.adapter_id)
    adapted = Rate.of(_run(policy, job.cases, job.adapter_id, **rollout_kwargs), n)
    row = _row(job, base, adapted, alpha)
    if route is not None:
        # route every task, then run the tasks routed to the same mixture together
        groups: dict[tuple[tuple[str, float], ...], list[tuple[Any, int]]] = {}
        for env, s in job.cases:
            groups.setdefault(tuple(sorted(route(env, s).items())), []).append((env, s))
        passed = 0
        for key, group in groups.items():
            use = apply_weights(model, dict(key))
            passed += _run(policy, group, use, **rollout_kwargs)
        row = replace(row, router=Rate.of(passed, n))
    return row.to_dict()


def render_markdown(rows: Sequence[EvaluationRow | Mapping[str, Any]]) -> str:
    """The evaluation as a Markdown table."""

    def fmt(r: Rate | None) -> str:
        if not r:
            return "-"
        return f"{r.rate:.2f} [{r.ci95[0]:.2f}, {r.ci95[1]:.2f}] (n={r.n})"

    lines = [
        "| environment | base | + adapter | + router | gain | p | promoted |",
        "|---|---|---|---|---|---|---|",
    ]
    typed = [r if isinstance(r, EvaluationRow) else EvaluationRow.from_dict(r) for r in rows]
    for row in typed:
        lines.append(
            f"| {row.env_id} | {fmt(row.base)} | {fmt(row.adapter)} | "
            f"{fmt(row.router)} | {row.gain:+.2f} | {row.p_value:.3g} | "
            f"{'yes' if row.promoted else 'no'} |"
        )
    reasons = [f"- {row.adapter_id}: {row.reason}" for row in typed]
    return "\n".join([*lines, "", *reasons]) + "\n"


__all__ = [
    "EvalJob",
    "EvaluationError",
    "EvaluationRow",
    "Rate",
    "Sequential",
    "decide",
    "evaluate_capabilities",
    "evaluate_capability",
    "evaluate_job",
    "gain",
    "gain_p_value",
    "look_sizes",
    "rate",
    "render_markdown",
    "run_arms",
    "settled",
    "wilson",
]
