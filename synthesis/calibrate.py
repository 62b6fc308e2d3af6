"""Difficulty calibration: move an environment's knobs until a policy succeeds 20-60% of the time.

TRACE found that band trainable: easier tasks teach nothing, harder ones give no signal. The
policy is a plain callable `policy(observation, info) -> action` (a model wrapped by the training
code, or a scripted policy from `tracegym.synthesis.policies`); a policy with a `bind(env)`
method is bound to each environment it plays.

    result = calibrate(env, NoisyOraclePolicy(p=0.15), n_seeds=50, k=4)
    result.knobs, result.pass_at_1, result.pass_at_k, result.in_band

Each family orders its knob settings from easiest to hardest (`Environment.levels()`: number of
target records, distractor records/requests, steps, slack, quirks); calibration walks that
ladder from the current setting towards the band and keeps the first level inside it, else the
level closest to the band's middle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from math import comb
from typing import Any

from tracegym.synthesis.base import Environment, Policy
from tracegym.synthesis.policies import (
    AllToolsPolicy,
    NoisyOraclePolicy,
    NullPolicy,
    OraclePolicy,
    RandomToolPolicy,
)

BAND = (0.20, 0.60)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples with c successes (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class Evaluation:
    knobs: dict[str, Any]
    n_seeds: int
    samples: int
    k: int
    pass_at_1: float
    pass_at_k: float
    mean_reward: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CalibrationResult:
    knobs: dict[str, Any]
    level: int
    pass_at_1: float
    pass_at_k: float
    k: int
    n_seeds: int
    in_band: bool
    band: tuple[float, float] = BAND
    history: list[Evaluation] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["history"] = [e.to_dict() for e in self.history]
        return out


def evaluate(
    env: Environment, policy: Policy, seeds: Sequence[int], k: int = 1, samples: int | None = None
) -> Evaluation:
    """pass@1 and pass@k of `policy` on `seeds`, with `samples` (>= k) episodes per seed."""
    n = max(samples or k, k)
    p1 = pk = reward = 0.0
    for seed in seeds:
        wins = 0
        for _ in range(n):
            _episode, verdict = env.rollout(policy, seed)
            wins += verdict.passed
            reward += verdict.reward
        p1 += wins / n
        pk += pass_at_k(n, wins, k)
    m = max(len(seeds), 1)
    return Evaluation(dict(env.knobs), len(seeds), n, k, p1 / m, pk / m, reward / (m * n))


def _with_knobs(env: Environment, knobs: dict[str, Any]) -> Environment:
    return type(env)(env.spec, **knobs) if env.spec is not None else type(env)(**knobs)


def calibrate(
    env: Environment,
    policy: Policy,
    n_seeds: int = 50,
    k: int = 4,
    band: tuple[float, float] = BAND,
    seeds: Sequence[int] | None = None,
    samples: int | None = None,
) -> CalibrationResult:
    """Walk `env.levels()` until `policy`'s pass@1 lies in `band`."""
    levels = env.levels() or [dict(env.knobs)]
    if seeds is None:
        start = env.spec.train_seeds[0] if env.spec else 0
        seeds = range(start, start + n_seeds)
    seeds = list(seeds)
    current = {key: env.knobs.get(key) for key in levels[0]}
    index = next((i for i, lv in enumerate(levels) if lv == current), len(levels) // 2)
    tried: dict[int, Evaluation] = {}
    lo, hi = band
    while index not in tried:
        evaluation = evaluate(_with_knobs(env, levels[index]), policy, seeds, k, samples)
        tried[index] = evaluation
        if evaluation.pass_at_1 > hi and index + 1 < len(levels):
            index += 1  # too easy: harder
        elif evaluation.pass_at_1 < lo and index > 0:
            index -= 1  # too hard: easier
        else:
            break
    inside = [i for i, e in tried.items() if lo <= e.pass_at_1 <= hi]

    def distance(i: int) -> tuple[float, int]:
        rate = tried[i].pass_at_1
        if rate > hi:  # too easy: the hardest such level is nearest
            return (rate - hi, -i)
        return (lo - rate, i)

    best = inside[0] if inside else min(tried, key=distance)
    chosen = tried[best]
    return CalibrationResult(
        dict(levels[best]),
        best,
        chosen.pass_at_1,
        chosen.pass_at_k,
        k,
        len(seeds),
        bool(inside),
        band,
        list(tried.values()),
    )


def scripted_policy(name: str) -> Callable[[], Policy]:
    """A factory for a scripted policy by name: `oracle`, `null`, `random`, `all-tools`,
    `noisy-oracle:P` (errs with probability P)."""
    head, _, arg = name.partition(":")
    factories: dict[str, Callable[[], Policy]] = {
        "oracle": OraclePolicy,
        "null": NullPolicy,
        "random": RandomToolPolicy,
        "all-tools": AllToolsPolicy,
    }
    if head == "noisy-oracle":
        p = float(arg or 0.1)
        if not 0 <= p <= 1:
            raise ValueError(f"noisy-oracle wants a probability in [0, 1], got {p}")
        return lambda: NoisyOraclePolicy(p=p)
    if head not in factories:
        raise ValueError(
            f"unknown scripted policy {name!r} (oracle, null, random, all-tools, noisy-oracle:P)"
        )
    return factories[head]


__all__ = [
    "BAND",
    "AllToolsPolicy",
    "CalibrationResult",
    "Evaluation",
    "NoisyOraclePolicy",
    "NullPolicy",
    "OraclePolicy",
    "RandomToolPolicy",
    "calibrate",
    "evaluate",
    "pass_at_k",
    "scripted_policy",
]
