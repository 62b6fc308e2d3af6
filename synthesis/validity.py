"""Validity checks every environment must pass before it is registered (`tracegym envs check`).

- solvable: the oracle passes 100% of 200 train seeds;
- not trivially passed: a null policy (answers at once) and a random-tool policy each pass <= 5%;
- not fooled: calling every tool and answering with everything seen passes no task, and the
  oracle's actions followed by an empty answer pass no task;
- deterministic: the same seed gives the same task, the same oracle and the same verdicts, in
  this instance and in a fresh one built from the same spec;
- disjoint splits: no train seed and held-out seed give the same task (and the ranges do not
  overlap);
- faithful: every train task's records, tool results, reads, writes and system prompt agree with
  the traces the catalog was inferred from (`synthesis.fidelity`; value: the share of seeds
  clean).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tracegym.synthesis.base import Environment, run_actions
from tracegym.synthesis.fidelity import check_fidelity
from tracegym.synthesis.policies import AllToolsPolicy, NullPolicy, RandomToolPolicy

MAX_CHEAT_RATE = 0.05


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    value: float | None = None


@dataclass
class ValidityReport:
    env_id: str
    ok: bool
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "checks": [asdict(c) for c in self.checks],
        }


def _seeds(env: Environment, split: str, n: int) -> list[int]:
    if env.spec is None:
        start = 0 if split == "train" else 1_000_000
        return list(range(start, start + n))
    start, stop = env.spec.train_seeds if split == "train" else env.spec.heldout_seeds
    return list(range(start, min(stop, start + n)))


def _rate(env: Environment, make_policy: Callable[[], Any], seeds: list[int]) -> tuple[float, int]:
    passed = 0
    for seed in seeds:
        _episode, verdict = env.rollout(make_policy(), seed)
        passed += verdict.passed
    return passed / max(len(seeds), 1), passed


def check_environment(
    env: Environment,
    n_seeds: int = 200,
    *,
    cheat_seeds: int | None = None,
    determinism_seeds: int = 20,
    fresh: Callable[[], Environment] | None = None,
) -> ValidityReport:
    """Run every check on `env`; `fresh` builds a second instance (default: from its spec)."""
    started = time.perf_counter()
    report = ValidityReport(env.env_id, ok=True)
    cheat = cheat_seeds or n_seeds
    train = _seeds(env, "train", n_seeds)
    heldout = _seeds(env, "heldout", n_seeds)

    def run(name: str, fn: Callable[[], Check]) -> None:
        try:
            report.checks.append(fn())
        except Exception as exc:  # a crashing environment fails the check, never the caller
            where = traceback.extract_tb(exc.__traceback__)[-1]
            report.checks.append(
                Check(
                    name,
                    False,
                    f"raised {type(exc).__name__}: {exc} "
                    f"({where.filename.rsplit('/', 1)[-1]}:{where.lineno})",
                )
            )

    def oracle() -> Check:
        failed = []
        for seed in train:
            _episode, verdict = run_actions(env, seed, env.oracle(seed))
            if not verdict.passed:
                failed.append((seed, verdict.reasons[:2]))
        rate = 1 - len(failed) / len(train)
        detail = f"oracle passed {len(train) - len(failed)}/{len(train)} seeds"
        if failed:
            detail += f"; e.g. seed {failed[0][0]}: {'; '.join(failed[0][1])}"
        return Check("oracle", not failed, detail, rate)

    def cheat_check(name: str, make: Callable[[], Any], limit: float) -> Check:
        rate, passed = _rate(env, make, train[:cheat])
        return Check(
            name,
            rate <= limit,
            f"{name} policy passed {passed}/{len(train[:cheat])} "
            f"seeds ({rate:.1%}, at most {limit:.0%})",
            rate,
        )

    def empty_answer() -> Check:
        passed = 0
        seeds = train[: min(cheat, 50)]
        for seed in seeds:
            actions = [a for a in env.oracle(seed) if "answer" not in a]
            _episode, verdict = run_actions(env, seed, [*actions, {"answer": ""}])
            passed += verdict.passed
        return Check(
            "empty_answer",
            passed == 0,
            f"the oracle's actions with an empty answer passed {passed}/{len(seeds)} "
            "seeds (must be 0)",
            passed / len(seeds),
        )

    def determinism() -> Check:
        other = fresh() if fresh else type(env)(env.spec, **env.knobs)
        problems = []
        for seed in train[:determinism_seeds] + heldout[:3]:
            a, b = env.make_task(seed), env.make_task(seed)
            if a.fingerprint() != b.fingerprint() or a.oracle != b.oracle:
                problems.append(f"seed {seed} gave two different tasks")
            if other is not None:
                c = other.make_task(seed)
                if c.fingerprint() != a.fingerprint() or c.oracle != a.oracle:
                    problems.append(f"seed {seed} gave a different task in a fresh instance")
            verdicts = []
            for _ in range(2):
                _e, v1 = run_actions(env, seed, env.oracle(seed))
                _e, v2 = env.rollout(RandomToolPolicy(seed=7), seed)
                verdicts.append((v1.reward, v1.passed, v2.reward, v2.passed, tuple(v2.reasons)))
            if verdicts[0] != verdicts[1]:
                problems.append(f"seed {seed} gave two different verdicts")
            if problems:
                break
        return Check(
            "determinism",
            not problems,
            problems[0]
            if problems
            else f"{min(determinism_seeds, len(train)) + min(3, len(heldout))} seeds: same "
            "task, oracle and verdicts",
        )

    def splits() -> Check:
        if env.spec is not None:
            (a, b), (c, d) = env.spec.train_seeds, env.spec.heldout_seeds
            if a < d and c < b:
                return Check("splits", False, f"train seeds [{a}, {b}) overlap held-out [{c}, {d})")
        train_prints = {env.make_task(s).fingerprint(): s for s in train}
        shared = [
            (train_prints[env.make_task(s).fingerprint()], s)
            for s in heldout
            if env.make_task(s).fingerprint() in train_prints
        ]
        if shared:
            return Check(
                "splits",
                False,
                f"train seed {shared[0][0]} and held-out seed "
                f"{shared[0][1]} give the same task ({len(shared)} such pairs)",
            )
        duplicates = len(train) - len(train_prints)
        return Check(
            "splits",
            True,
            f"{len(train)} train and {len(heldout)} held-out tasks, "
            f"none shared ({duplicates} repeated within train)",
        )

    def fidelity() -> Check:
        result = check_fidelity(env, n_seeds=len(train))
        return Check("fidelity", result.ok, result.detail(), result.share_clean)

    run("oracle", oracle)
    run("null", lambda: cheat_check("null", NullPolicy, MAX_CHEAT_RATE))
    run(
        "random_tool",
        lambda: cheat_check("random_tool", lambda: RandomToolPolicy(seed=1), MAX_CHEAT_RATE),
    )
    run("all_tools", lambda: cheat_check("all_tools", AllToolsPolicy, 0.0))
    run("empty_answer", empty_answer)
    run("determinism", determinism)
    run("splits", splits)
    run("fidelity", fidelity)
    report.ok = all(c.ok for c in report.checks)
    report.seconds = time.perf_counter() - started
    return report


__all__ = ["MAX_CHEAT_RATE", "Check", "ValidityReport", "check_environment"]
