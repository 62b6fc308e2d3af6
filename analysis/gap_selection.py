"""Capability gaps: candidates from detector findings and signature clusters, kept when they
separate failures from successes (TRACE's coverage, contrastive delta and bootstrap stability).

- coverage = share of failed runs lacking the capability (having a finding of the candidate);
- delta = that share minus the same share among successful runs;
- stability = in how many of `resamples` bootstrap resamples (failed and successful runs each
  resampled with replacement) both thresholds still hold.
A candidate passes when coverage >= min_coverage, delta >= min_delta and stability >=
min_stability; `like_with_like` contrasts spending again with runs of the same kind of request,
and `select` keeps causes, not symptoms (a candidate that follows a cause in the same runs is
folded into it; one covering nearly every failure without naming a behaviour is failure itself).
With no successful runs there is no contrast: candidates are ranked by coverage alone and the
result says so. docs/gaps.md has the rules and what they were measured on.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from tracegym.analysis.detector_names import (
    INVALID_INVOCATION,
    JUDGE,
    SPEND_DETECTORS,
    is_symptom,
)
from tracegym.analysis.detectors.base import Finding
from tracegym.analysis.gap import Gap, GapError, GapMember, GapRequest, MinedRule, Symptom
from tracegym.analysis.request_kinds import RequestKinds
from tracegym.analysis.run_facts import RunFacts
from tracegym.analysis.runs import Run
from tracegym.analysis.signatures import mask


@dataclass(frozen=True)
class Thresholds:
    min_coverage: float = 0.10
    min_delta: float = 0.20
    resamples: int = 10
    min_stability: int = 8
    seed: int = 0


@dataclass
class Candidate:
    """A capability some runs may lack: `lacking` holds their trace ids."""

    key: str
    kind: str  # "finding" (a detector's precise key), "detector" (its whole kind) or "cluster"
    detector: str | None
    lacking: set[str] = field(default_factory=set)
    findings: list[Finding] = field(default_factory=list)
    signatures: list[str] = field(default_factory=list)  # cluster members' signatures


@dataclass
class Scored:
    candidate: Candidate
    coverage: float
    delta: float | None
    failed_lacking: int
    succeeded_lacking: int
    stability: int
    kept: bool
    why: str
    symptoms: list[Symptom] = field(default_factory=list)  # set by `select`
    within_kind: dict[str, Any] | None = None  # the contrast within kinds, when it kept it
    confined: str | None = None  # set by `the_kind_itself`: only failing kinds of request hold it
    by_rates: dict[str, Any] | None = None  # set by `rules_as_rates`: kept on its two-rate test

    def delta_floor(self, t: Thresholds) -> float:
        """The delta a contrast within kinds must reach: `min_delta`, or NEAR_ZERO for a rule
        of rates (`rule_of_rates`), whatever its pooled delta: lucky successes of the kind
        break it too, and its evidence is its Fisher test, not its delta."""
        return NEAR_ZERO if rule_of_rates(self.candidate) else t.min_delta


def rates(lacking: set[str], failed: Sequence[str], succeeded: Sequence[str]):
    """(coverage, delta or None) of a candidate over the given runs."""
    coverage = sum(t in lacking for t in failed) / len(failed) if failed else 0.0
    if not succeeded:
        return coverage, None
    return coverage, coverage - sum(t in lacking for t in succeeded) / len(succeeded)


def stability(
    lacking: set[str], failed: Sequence[str], succeeded: Sequence[str], t: Thresholds
) -> int:
    """Bootstrap resamples (of `t.resamples`) in which the candidate passes both thresholds."""
    rng = np.random.default_rng(t.seed)
    fail_hits = np.array([x in lacking for x in failed], dtype=float)
    succ_hits = np.array([x in lacking for x in succeeded], dtype=float)
    passes = 0
    for _ in range(t.resamples):
        coverage = rng.choice(fail_hits, size=len(fail_hits)).mean() if len(fail_hits) else 0.0
        ok = coverage >= t.min_coverage
        if len(succ_hits):
            ok = ok and coverage - rng.choice(succ_hits, size=len(succ_hits)).mean() >= t.min_delta
        passes += bool(ok)
    return passes


def score(candidate: Candidate, failed: Sequence[str], succeeded: Sequence[str],
          t: Thresholds) -> Scored:  # fmt: skip
    coverage, delta = rates(candidate.lacking, failed, succeeded)
    stable = stability(candidate.lacking, failed, succeeded, t)
    reasons = []
    if coverage < t.min_coverage:
        reasons.append(f"coverage {coverage:.2f} < {t.min_coverage}")
    if delta is not None and delta < t.min_delta:
        reasons.append(f"delta {delta:.2f} < {t.min_delta}")
    if stable < t.min_stability:
        reasons.append(f"stable in {stable}/{t.resamples} < {t.min_stability}")
    return Scored(
        candidate, coverage, delta,
        failed_lacking=sum(x in candidate.lacking for x in failed),
        succeeded_lacking=sum(x in candidate.lacking for x in succeeded),
        stability=stable, kept=not reasons, why="; ".join(reasons) or "kept",
    )  # fmt: skip


MIN_PEERS = 5  # runs on each side needed to compare within kinds of request (detectors' support)


def _kinds(c: Candidate, failed: Sequence[str], kind: Mapping[str, str | None]):
    """The request kinds of the candidate's failed runs and the failed runs of those kinds."""
    kinds = {kind[x] for x in failed if x in c.lacking}
    return kinds, [x for x in failed if kind[x] in kinds]


FIRST_WRITE = "first_write"  # a run's kind of request: the first write tool it calls
LEARNT = "learnt"  # ... the kind `RequestKinds` learns from its request text, else FIRST_WRITE


def like_with_like(
    scored: Sequence[Scored],
    runs: Sequence[Run] | Sequence[RunFacts],
    t: Thresholds,
    *,
    contrast_kinds: str = LEARNT,
    kind_itself: bool = True,
    spread: bool = True,
) -> None:
    """Contrast each candidate with the runs that serve the same kinds of request as its failed
    runs (a run's kind: the one `request_kinds.RequestKinds` learns from its request text, and
    for a run without one, or with `contrast_kinds=FIRST_WRITE` for every run, the first write
    tool it calls, `Run.request_kind`), as well as with all runs (TRACE's pooled contrast,
    `score`):

    - *spending* (a spend detector's candidate, `detector_names.SPEND_DETECTORS`) that passed is
      dropped when its delta within those kinds is under `min_delta`: successful runs of the
      same kind spend as much (the budget the task needs);
    - a *specific behaviour* (`specific`, not a symptom kind) that failed only the contrast
      (its pooled coverage passes) is kept when, within those kinds, its delta and bootstrap
      stability pass: a cause of one kind of request is diluted by the successes of the others;
    - a *rule of rates* (`rules_as_rates`) that failed only the delta is kept on the one-sided
      Fisher test of its two rates (lucky successes that break the rule shrink its delta).

    Both need MIN_PEERS successful runs of those kinds, the second also MIN_PEERS failed runs
    of the candidate; otherwise the pooled contrast stands. Then, with `kind_itself`, a kept
    candidate that is only its kind of request is dropped (`the_kind_itself`), and so is one
    that successful runs show as often as failed runs, or more, pooled or within the kinds of
    its failed runs (`not_more_in_successes`). Candidates changed say so in `why`.
    """
    failed = [r.trace_id for r in runs if r.success is False]
    succeeded = [r.trace_id for r in runs if r.success is True]
    learnt = RequestKinds().fit(runs) if kind_itself or contrast_kinds == LEARNT else None
    kind: dict[str, str | None] = {r.trace_id: r.request_kind() for r in runs}
    if learnt is not None and contrast_kinds == LEARNT:
        for r in runs:
            asked = learnt.kind_of(r)
            kind[r.trace_id] = learnt.name(asked) if asked is not None else kind[r.trace_id]
    if succeeded:
        _spending_and_rescue(scored, failed, succeeded, kind, t)
        rules_as_rates(scored, failed, succeeded, t)
    if learnt is not None and kind_itself:
        the_kind_itself(scored, runs, learnt, t, spread)
    if succeeded:
        not_more_in_successes(scored, failed, succeeded, kind)


def _spending_and_rescue(
    scored: Sequence[Scored],
    failed: Sequence[str],
    succeeded: Sequence[str],
    kind: Mapping[str, str | None],
    t: Thresholds,
) -> None:
    for s in scored:
        c = s.candidate
        spend = s.kept and c.detector in SPEND_DETECTORS
        rescue = (not s.kept and specific(c) and not is_symptom(c.key)
                  and s.coverage >= t.min_coverage and s.failed_lacking >= MIN_PEERS)  # fmt: skip
        if not spend and not rescue:
            continue
        kinds, peers_failed = _kinds(c, failed, kind)
        peers = [x for x in succeeded if kind[x] in kinds]
        named = ", ".join(sorted(k or "(no write)" for k in kinds))
        if rescue and len(peers) < MIN_PEERS:
            s.why += (f"; its kinds of request ({named}) have {len(peers)} successful runs, "
                      f"under {MIN_PEERS}: no contrast within them")  # fmt: skip
        if len(peers) < MIN_PEERS or not peers_failed:
            continue
        _, delta = rates(c.lacking, peers_failed, peers)
        if spend and delta is not None and delta < t.min_delta:
            s.kept = False
            s.why = (f"delta {delta:.2f} < {t.min_delta} against the {len(peers)} successful runs "
                     f"of the same kind of request ({named}): they spend as much")  # fmt: skip
        elif rescue and delta is not None and delta >= t.min_delta:
            stable = stability(c.lacking, peers_failed, peers, t)
            if stable >= t.min_stability:
                s.kept = True
                s.within_kind = {"kinds": sorted(kinds, key=lambda k: k or ""),
                                 "failed": len(peers_failed), "succeeded": len(peers),
                                 "delta": round(delta, 4), "stability": stable}  # fmt: skip
                s.why = (f"kept within its kind of request ({named}: {len(peers_failed)} failed, "
                         f"{len(peers)} successful runs): delta {delta:.2f}, stable in "
                         f"{stable}/{t.resamples} (pooled: {s.why})")  # fmt: skip


NEAR_ZERO = 0.05  # a delta at or under this: successful runs show the behaviour as often
RULE_P = 0.05  # a rule of rates' pooled one-sided Fisher p, to pass with a delta under min_delta


def rule_of_rates(c: Candidate) -> bool:
    """Whether the candidate is one rule that a detector mined from two rates (every finding
    carries the rule's Fisher p-value: `wrong_tool_order`'s and `forbidden_action`'s rules of
    rates), not from every successful run keeping it."""
    return (c.kind == "finding" and bool(c.findings)
            and all(f.details.get("p_value") is not None for f in c.findings))  # fmt: skip


def rate_stability(
    lacking: set[str], failed: Sequence[str], succeeded: Sequence[str], t: Thresholds
) -> int:
    """Bootstrap resamples (of `t.resamples`) in which coverage >= `min_coverage` and the
    delta stays above NEAR_ZERO (`stability` with NEAR_ZERO for `min_delta`)."""
    return stability(lacking, failed, succeeded, replace(t, min_delta=NEAR_ZERO + 1e-9))


def rules_as_rates(
    scored: Sequence[Scored], failed: Sequence[str], succeeded: Sequence[str], t: Thresholds
) -> None:
    """Keep a rule of rates (`rule_of_rates`) that failed `min_delta` or its stability:
    successful runs breaking it by luck (a cancel without the look-up that went through) shrink
    its delta, not its evidence. It is kept when its coverage passes, MIN_PEERS failed runs
    break it, its pooled delta is over NEAR_ZERO, the one-sided Fisher exact test of the share
    of failed runs breaking it against that of successful ones gives p <= RULE_P, and in
    `min_stability` resamples coverage and a delta over NEAR_ZERO hold (`rate_stability`). The
    contrast within kinds of request then asks the same floor of it (`Scored.delta_floor`)."""
    from tracegym.analysis.detectors.tool_order import fisher_greater

    for s in scored:
        c = s.candidate
        if s.kept or s.delta is None or not rule_of_rates(c):
            continue
        if s.coverage < t.min_coverage or s.failed_lacking < MIN_PEERS or s.delta <= NEAR_ZERO:
            continue  # (a delta over min_delta that failed on stability is judged the same way)
        p = fisher_greater(len(succeeded) - s.succeeded_lacking, len(succeeded),
                           len(failed) - s.failed_lacking, len(failed))  # fmt: skip
        stable = rate_stability(c.lacking, failed, succeeded, t)
        if p > RULE_P or stable < t.min_stability:
            s.why += (f"; as a rule of rates: one-sided Fisher p {p:.2g} (<= {RULE_P} needed), "
                      f"delta over {NEAR_ZERO} in {stable}/{t.resamples} resamples")  # fmt: skip
            continue
        s.kept, s.stability = True, stable
        s.by_rates = {"p_value": round(p, 6), "failed": s.failed_lacking,
                      "of_failed": len(failed), "succeeded": s.succeeded_lacking,
                      "of_succeeded": len(succeeded), "stability": stable}  # fmt: skip
        missed = (f"delta {s.delta:.2f} < {t.min_delta}" if s.delta < t.min_delta
                  else f"delta {s.delta:.2f} not stable at {t.min_delta}")  # fmt: skip
        s.why = (f"kept as a rule of rates: {s.failed_lacking}/{len(failed)} failed and "
                 f"{s.succeeded_lacking}/{len(succeeded)} successful runs break it ({missed}: "
                 f"lucky successes break it too), one-sided "
                 f"Fisher p {p:.2g} <= {RULE_P}, delta over {NEAR_ZERO} in {stable}/"
                 f"{t.resamples} resamples")  # fmt: skip


def within_kinds_delta(
    lacking: set[str],
    failed: Sequence[str],
    succeeded: Sequence[str],
    kind: Mapping[str, str | None],
) -> tuple[float | None, int]:
    """(The Mantel-Haenszel delta of a candidate within the kinds of request of its failed
    runs, the failed runs it holds in kinds with MIN_PEERS successful runs): each
    kind's delta weighted by failed x successful / all runs of the kind; None without such a
    kind."""
    mine = [x for x in failed if x in lacking]
    counts = Counter(kind.get(x) for x in mine)
    total = weight = 0.0
    judged = 0
    for k, n in counts.items():
        failed_k = [x for x in failed if kind.get(x) == k]
        succeeded_k = [x for x in succeeded if kind.get(x) == k]
        if len(succeeded_k) < MIN_PEERS:
            continue
        _, delta = rates(lacking, failed_k, succeeded_k)
        w = len(failed_k) * len(succeeded_k) / (len(failed_k) + len(succeeded_k))
        total, weight, judged = total + w * (delta or 0.0), weight + w, judged + n
    return (total / weight if weight else None), judged


def not_more_in_successes(
    scored: Sequence[Scored],
    failed: Sequence[str],
    succeeded: Sequence[str],
    kind: Mapping[str, str | None],
) -> None:
    """No kept candidate names a behaviour successful runs show as often as failed runs, or
    more: one whose pooled delta is at most NEAR_ZERO, or whose delta within the kinds of request
    of its failed runs (`within_kinds_delta`, over the kinds holding at least half of them) is,
    is dropped (`why` says which). A transfer successful runs of other requests end with is
    not a cause of failing to act on this one. A candidate kept on its contrast within its
    kinds (`Scored.within_kind`: a delta there of at least `min_delta`) stands, whatever its
    pooled delta: a behaviour successful runs of *other* kinds show is no contrast."""
    for s in scored:
        if not s.kept or s.delta is None or s.within_kind is not None:
            continue  # (kept on its contrast within its kinds, which passed min_delta)
        if s.delta <= NEAR_ZERO:
            s.kept = False
            s.why = (f"successful runs show it as often or more: pooled delta {s.delta:.2f} "
                     f"<= {NEAR_ZERO}")  # fmt: skip
            continue
        within, judged = within_kinds_delta(s.candidate.lacking, failed, succeeded, kind)
        if within is None or judged * 2 < s.failed_lacking or within > NEAR_ZERO:
            continue
        s.kept = False
        s.why = (f"successful runs of the same kinds of request show it as often or more: "
                 f"within-kind delta {within:.2f} <= {NEAR_ZERO} over {judged} of its "
                 f"{s.failed_lacking} failed runs (pooled delta {s.delta:.2f})")  # fmt: skip


KIND_SHARE = 0.8  # a candidate confined to one kind: this share of its failed runs is of it
KIND_COVERAGE = 0.5  # ... covering this share of the kind's failed runs, which all failed


def the_kind_itself(
    scored: Sequence[Scored],
    runs: Sequence[Run] | Sequence[RunFacts],
    kinds: RequestKinds,
    t: Thresholds,
    spread: bool = True,
) -> None:
    """Tell a kept candidate from "this was a run of that kind of request" (kinds learnt from
    the request text, `request_kinds.RequestKinds`), when KIND_SHARE of its failed runs serve
    one kind:

    - MIN_PEERS or more successful runs of that kind show it about as often as its failed
      runs (the delta within the kind is under `min_delta`): a marker of the kind, not of
      failing. It is dropped (`why`, listed in `rejected`);
    - the kind has no successful run at all and the candidate covers KIND_COVERAGE of its
      failed runs (a task every run fails): nothing in the store tells the candidate from the
      kind. It is kept but marked (`Scored.confined`, said in the gap's description; it ranks
      after unmarked gaps of its tier): the behaviour may be the kind's cause (the demo's
      refunds without a look-up) or only what runs of a failing task share.

    With 1 to MIN_PEERS - 1 successful runs of the kind, none in the whole store, or a single
    kind learnt (the pooled contrast already judged it), the pooled verdict stands. With
    `spread`, a candidate over several kinds is judged by `_across_kinds`."""
    failed = [r.trace_id for r in runs if r.success is False]
    succeeded = [r.trace_id for r in runs if r.success is True]
    if not succeeded or len(kinds.members()) < 2:
        return  # no contrast anywhere (coverage alone ranks), or one kind: the pooled one
    kind = {r.trace_id: kinds.kind_of(r) for r in runs}
    for s in scored:
        if not s.kept:
            continue
        mine = [x for x in failed if x in s.candidate.lacking]
        counts = Counter(kind[x] for x in mine if kind[x] is not None)
        if not mine or not counts:
            continue
        top, n_top = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if n_top / len(mine) < KIND_SHARE:
            if spread:
                _across_kinds(s, mine, counts, failed, succeeded, kind, t)
            continue
        failed_k = [x for x in failed if kind[x] == top]
        succeeded_k = [x for x in succeeded if kind[x] == top]
        coverage, delta = rates(s.candidate.lacking, failed_k, succeeded_k)
        named = kinds.name(top)
        confined = (f"{n_top} of its {len(mine)} failed runs serve request kind {named}, "
                    f"{len(failed_k)} failed and {len(succeeded_k)} successful runs")  # fmt: skip
        if not succeeded_k and coverage >= KIND_COVERAGE:
            s.confined = (f"{confined}: no run of that kind succeeded, so nothing tells it from "
                          "the kind of request itself")  # fmt: skip
        elif len(succeeded_k) >= MIN_PEERS and delta is not None and delta < s.delta_floor(t):
            s.kept = False
            s.why = (f"the kind of request itself: {confined}; within the kind delta "
                     f"{delta:.2f} < {s.delta_floor(t)} (successful runs of the kind show it as "
                     "often)")  # fmt: skip


def _across_kinds(
    s: Scored,
    mine: Sequence[str],
    counts: Counter,
    failed: Sequence[str],
    succeeded: Sequence[str],
    kind: Mapping[str, str | None],
    t: Thresholds,
) -> None:
    """A candidate over several kinds, judged kind by kind: in the kinds with MIN_PEERS
    successful runs, by its delta there (averaged with Mantel-Haenszel weights, failed x
    successful / all runs of the kind); a kind none of whose runs succeeded is the kind itself
    where the candidate covers KIND_COVERAGE of its failures. When these kinds hold KIND_SHARE
    of its failed runs: dropped if the first hold MIN_PEERS of them and the averaged delta is
    under `min_delta` (its pooled contrast came from failing kinds being over-represented among
    the failures, not from what runs did within a kind); marked (`confined`) if the first hold
    fewer and the averaged delta does not pass (every kind it is in failed throughout)."""
    total = weight = 0.0
    judged = itself = 0
    for k in counts:
        failed_k = [x for x in failed if kind[x] == k]
        succeeded_k = [x for x in succeeded if kind[x] == k]
        coverage, delta = rates(s.candidate.lacking, failed_k, succeeded_k)
        if len(succeeded_k) >= MIN_PEERS and delta is not None:
            w = len(failed_k) * len(succeeded_k) / (len(failed_k) + len(succeeded_k))
            total, weight, judged = total + w * delta, weight + w, judged + counts[k]
        elif not succeeded_k and coverage >= KIND_COVERAGE:
            itself += counts[k]
    if (judged + itself) / len(mine) < KIND_SHARE:
        return
    within = total / weight if weight else None
    floor = s.delta_floor(t)
    if within is not None and within >= floor:
        return
    contrast = ("" if within is None else f"; the {judged} in kinds with successful runs: "
                f"Mantel-Haenszel delta {within:.2f} < {floor} within them")  # fmt: skip
    what = (
        f"{itself} of its {len(mine)} failed runs serve kinds of request no run of which "
        f"succeeded{contrast} (pooled delta {s.delta if s.delta is not None else 0:.2f})"
    )
    if judged >= MIN_PEERS:
        s.kept = False
        s.why = f"the kinds of request themselves: {what}"
    else:
        s.confined = f"{what}: nothing tells it from those kinds of request"


def candidates_from_findings(findings: Iterable[Finding]) -> list[Candidate]:
    """One candidate per detector kind and one per precise finding key."""
    by_key: dict[tuple[str, str], Candidate] = {}
    for f in findings:
        for kind, key in (("detector", f"detector:{f.detector}"), ("finding", f.key)):
            c = by_key.setdefault((kind, key), Candidate(key, kind, f.detector))
            c.lacking.add(f.trace_id)
            c.findings.append(f)
    return list(by_key.values())


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


# Causes, not symptoms -------------------------------------------------------------------------
FOLD_SHARE = 0.8  # a candidate is folded when earlier causes explain this share of its runs
FAILURE_COVERAGE = 0.9  # an unspecific candidate covering this share of failures is failure
GENERIC_DETAILS = frozenset({"out_of_steps"})  # finding keys that name no tool, argument, step


def specific(c: Candidate) -> bool:
    """Whether the candidate names a behaviour: a precise finding key about a tool, an
    argument, a subtask or a rule (not a detector's whole kind, a cluster, or running out)."""
    if c.kind != "finding":
        return False
    detail = c.key.split(":", 1)[1] if ":" in c.key else ""
    return bool(detail) and detail not in GENERIC_DETAILS


def first_positions(c: Candidate) -> dict[str, int]:
    """Per run, the position of the candidate's earliest finding."""
    out: dict[str, int] = {}
    for f in c.findings:
        if f.position is not None and (f.trace_id not in out or f.position < out[f.trace_id]):
            out[f.trace_id] = f.position
    return out


def _tier(c: Candidate) -> int:
    """Causes rank first (0: a specific behaviour), then what names none (1: a detector's
    whole kind, a cluster), then symptom kinds (2): a symptom never ranks above a cause."""
    if is_symptom(c.key):
        return 2
    return 0 if specific(c) else 1


def _follower(c: Candidate) -> bool:
    """Symptom kinds (budget, retries, apologies) and failed calls (where the run visibly
    broke) follow a cause at the same step as well as after it."""
    return is_symptom(c.key) or c.detector == INVALID_INVOCATION


def more_specific(a: Scored, b: Scored, fails: Mapping[int, set[str]]) -> bool:
    """Whether cause `a`, where its finding sits on the same step (span) as `b`'s, says more
    precisely what went wrong there, so `b` is its symptom at that step: `b` is a follower
    (a failed call or a symptom kind; a refused forbidden write is an `invalid_invocation`)
    and `a` is not; `b` names no behaviour (a detector's whole kind, a cluster); or both name
    one, `a` is no failed call, and `a` claims fewer failed runs (a narrower account of the
    same steps). A strict order: of two candidates at one step, at most one is the other's."""
    if _follower(a.candidate):
        return False  # a failed call does not explain another finding at its own step
    if _follower(b.candidate) or not specific(b.candidate):
        return True
    return len(fails[id(a)]) < len(fails[id(b)])


def _causes_of(
    b: Scored,
    causes: Sequence[Scored],
    fails: dict[int, set[str]],
    at: dict[int, dict[str, int]],
    same_span: bool = True,
) -> tuple[Scored | None, int, int]:
    """The cause `b` follows (the one sharing most of its runs), the runs causes explain
    (their earliest finding comes before `b`'s, or at the same step when the cause is
    `more_specific`), and the runs of that one cause; (None, 0, 0) when under FOLD_SHARE.
    `same_span=False` is the previous rule (only followers tie at the same step)."""
    mine = fails[id(b)]
    if not mine:
        return None, 0, 0
    tie = _follower(b.candidate)
    explained: set[str] = set()
    best, best_runs = None, 0
    for a in causes:
        if a is b:
            continue
        # previously: only a follower ties, and a failed call does not cause itself
        previous = tie and not _follower(a.candidate)
        same_step = more_specific(a, b, fails) if same_span else previous
        pa, pb = at[id(a)], at[id(b)]
        runs = {r for r in mine & fails[id(a)] if r in pa and r in pb
                and (pa[r] < pb[r] or (same_step and pa[r] == pb[r]))}  # fmt: skip
        if not runs:
            continue
        explained |= runs
        if len(runs) > best_runs:
            best, best_runs = a, len(runs)
    if len(explained) / len(mine) < FOLD_SHARE:
        return None, 0, 0
    return best, len(explained), best_runs


def select(
    scored: Sequence[Scored], failed: Sequence[str], t: Thresholds, same_span: bool = True
) -> list[Scored]:
    """The kept candidates, best first: causes, with the symptoms that follow them folded in,
    without near-duplicates.

    1. *Failure itself*: a candidate that covers FAILURE_COVERAGE of the failed runs and names
       no specific behaviour (`specific`) is not kept (its `why` says so).
    2. *Symptoms*: a candidate whose failed runs are, for FOLD_SHARE of them, runs where a kept
       cause's earliest finding comes first is folded into that cause (`Scored.symptoms`): it
       follows the cause. At the same step (the same decisive span) it follows a cause that is
       `more_specific`: symptom kinds (`detector_names.is_symptom`: budget, retries,
       apologies) and failed calls (a refused forbidden write's `invalid_invocation`) follow
       any cause that is no failed call; a detector's whole kind or a cluster follows any such
       cause; of two behaviours on the same calls the one claiming more failed runs follows
       the narrower one. A cluster (it names no behaviour) and a symptom kind are never the
       cause. A detector's whole kind folded into its own precise key is not listed as a
       symptom (its findings are that key's). `same_span=False` is the previous rule (only
       symptom kinds and failed calls tie at a step), for benchmarks.
    3. The rest are ranked: causes that name a specific behaviour, then candidates that name
       none, then symptom kinds (`_tier`); within each, gaps `the_kind_itself` marked as
       confined to kinds of request that failed throughout come after the others, and then
       by coverage x delta (coverage alone without successes); at equal rank a precise
       finding key comes before its detector's whole kind, and that before a cluster, and a
       detector's candidate before an LLM judge's (`analysis/judge.py`). A
       detector's kind is kept only if it covers enough failures its kept precise keys miss;
       any candidate that mostly repeats (Jaccard >= 0.8) a kept gap's failed runs is
       dropped (its symptoms go to that gap).
    """
    failed_set = set(failed)

    def rank(s: Scored) -> tuple:
        impact = s.coverage * (s.delta if s.delta is not None else 1.0)
        specificity = {"finding": 0, "detector": 1, "cluster": 2}[s.candidate.kind]
        # at equal impact the traces' own evidence (a detector, with its decisive steps) comes
        # before an optional LLM judge's label of the same runs
        judged = s.candidate.detector == JUDGE
        return (_tier(s.candidate), s.confined is not None, -round(impact, 6), judged,
                specificity, s.candidate.key)  # fmt: skip

    passing = sorted((s for s in scored if s.kept), key=rank)
    for s in passing:
        s.symptoms = []
    failure = {id(s) for s in passing
               if s.coverage >= FAILURE_COVERAGE and not specific(s.candidate)}  # fmt: skip
    fails = {id(s): s.candidate.lacking & failed_set for s in passing}
    at = {id(s): first_positions(s.candidate) for s in passing}
    causes = [s for s in passing if specific(s.candidate) and not is_symptom(s.candidate.key)]
    parent: dict[int, tuple[Scored, int, int]] = {}
    for b in passing:
        cause, explained, shared = _causes_of(b, causes, fails, at, same_span)
        if cause is not None:
            parent[id(b)] = (cause, explained, shared)

    def root(s: Scored) -> Scored:
        seen = {id(s)}
        while id(s) in parent and id(parent[id(s)][0]) not in seen:
            s = parent[id(s)][0]
            seen.add(id(s))
        return s

    roots = [s for s in passing if id(s) not in parent]
    for b in passing:
        if id(b) in parent:
            cause, explained, shared = parent[id(b)]
            home = root(cause)
            if home is b or id(home) in parent:  # a cycle: keep b as a gap of its own
                roots.append(b)
                continue
            b.kept = False
            b.why = f"follows {cause.candidate.key}: folded into {home.candidate.key}"
            if b.candidate.kind == "detector" and b.candidate.detector == home.candidate.detector:
                b.why = f"its findings are {home.candidate.key}'s, on the same steps"
                continue  # a detector's whole kind is no symptom of its own precise key
            home.symptoms.append(_symptom(b, len(fails[id(b)]), shared, explained, cause))
    kept: list[Scored] = []
    for s in sorted(roots, key=rank):
        if id(s) in failure:
            s.kept = False
            s.why = (f"covers {s.coverage:.2f} of the failed runs and names no specific "
                     "behaviour: failure itself, not a capability")  # fmt: skip
            continue
        runs = fails.get(id(s), set())
        if s.candidate.kind == "detector":
            covered = set().union(*(k.candidate.lacking & failed_set for k in kept
                                    if k.candidate.detector == s.candidate.detector))  # fmt: skip
            if covered and len(runs - covered) / max(1, len(failed_set)) < t.min_coverage:
                continue
        twin = next((k for k in kept
                     if _jaccard(runs, k.candidate.lacking & failed_set) >= 0.8), None)  # fmt: skip
        if twin is not None:
            twin.symptoms.extend(s.symptoms)
            continue
        kept.append(s)
    return kept


def _symptom(b: Scored, runs: int, shared: int, explained: int, cause: Scored) -> Symptom:
    return Symptom(
        key=b.candidate.key,
        name=gap_name(b.candidate),
        detector=dominant_detector(b.candidate),
        failed_runs=runs,
        shared=shared,
        explained=explained,
        why=f"in {explained} of its {runs} failed runs an earlier finding of a kept cause comes "
        f"first ({shared} of them {cause.candidate.key}'s)",
    )


# Describing a gap ---------------------------------------------------------------------------
def snake(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:80] or "gap"


def gap_name(c: Candidate) -> str:
    if c.kind == "cluster":
        top = Counter(f.detector for f in c.findings).most_common(1)
        return snake(f"{top[0][0] if top else 'failure'}_cluster_{c.key.split(':')[-1]}")
    if c.kind == "detector":
        return snake(c.detector or c.key)
    detail = c.key.split(":", 1)[1] if ":" in c.key else c.key
    return snake(f"{c.detector}_{detail.replace('>', '_before_')}")


MAX_DESCRIBED = 2_000  # runs whose steps describe a gap's tools and typical calls


def _tools_and_patterns(c: Candidate, runs: Mapping[str, Run]) -> tuple[list[str], list[str]]:
    """The tools the candidate's findings are about (the tool a finding names counts twice, the
    tools of its spans once) and its calls' argument patterns, over the findings of its first
    MAX_DESCRIBED runs (in finding order): a summary, and each run read is one read from disk
    in a streamed analysis (`run_archive`)."""
    tools: Counter[str] = Counter()
    patterns: Counter[str] = Counter()
    seen: set[str] = set()
    for f in c.findings:
        named = f.details.get("tool")  # a tool the finding is about, even one never called
        if isinstance(named, str):
            tools[named] += 2
        if f.trace_id not in seen and len(seen) >= MAX_DESCRIBED:
            continue
        seen.add(f.trace_id)
        run = runs.get(f.trace_id)
        if run is None:
            continue
        steps = run.by_span() if f.span_ids else {}
        for span in f.span_ids:
            step = steps.get(span)
            if step is not None and step.tool:
                tools[step.tool] += 1
        if f.position is None or f.position >= len(run.steps):
            continue
        step = run.steps[f.position]
        args = step.arguments
        if isinstance(args, dict):
            shown = ", ".join(f"{k}={_shape(v)}" for k, v in sorted(args.items()))
            patterns[f"{step.tool}({shown})"] += 1
    return [t for t, _ in tools.most_common(5)], [p for p, _ in patterns.most_common(3)]


def _shape(value: Any) -> str:
    """An argument value's pattern: short values masked (`<id>`, `<n>`), long text as <text>."""
    text = value if isinstance(value, str) else str(value)
    return mask(text) if len(text) <= 24 else "<text>"


def _successful_behaviour(tools: Sequence[str], successes: Sequence[Run | RunFacts]) -> str:
    if not successes or not tools:
        return "no successful runs to compare with" if not successes else ""
    parts = []
    for tool in tools[:3]:
        using = [r for r in successes if tool in r.tool_sequence()]
        if not using:
            parts.append(f"successful runs never call {tool}")
            continue
        before: Counter[str] = Counter()
        for r in using:
            seq = r.tool_sequence()
            i = seq.index(tool)
            before[seq[i - 1] if i else "(nothing)"] += 1
        prev, n = before.most_common(1)[0]
        parts.append(
            f"{len(using)}/{len(successes)} successful runs call {tool}, "
            f"{n} of them right after {prev}"
        )
    return "; ".join(parts)


def _member(f: Finding, run: Run | RunFacts) -> GapMember:
    return GapMember(trace_id=f.trace_id, run_id=run.run_id, step=f.step_index,
                     position=f.position, agent=f.agent, span_ids=tuple(f.span_ids),
                     evidence=f.message)  # fmt: skip


def members(c: Candidate, runs: Mapping[str, Run] | Mapping[str, RunFacts]) -> list[GapMember]:
    """Every failed run of the candidate at its decisive step: the earliest of the candidate's
    findings in the run (trace id order)."""
    first: dict[str, Finding] = {}
    for f in c.findings:
        run = runs.get(f.trace_id)
        if run is None or not run.failed or f.trace_id not in c.lacking:
            continue
        known = first.get(f.trace_id)
        at = f.position if f.position is not None else 1 << 30
        if known is None or at < (known.position if known.position is not None else 1 << 30):
            first[f.trace_id] = f
    return [_member(first[t], runs[t]) for t in sorted(first)]


def dominant_detector(c: Candidate) -> str:
    """The candidate's detector; a cluster's is the most frequent among its findings."""
    if c.detector:
        return c.detector
    counts = Counter(f.detector for f in c.findings)
    return max(counts, key=lambda d: (counts[d], d)) if counts else "cluster"


def describe(s: Scored, name: str, runs: Mapping[str, Run],
             successes: Sequence[Run | RunFacts], detector_text: Mapping[str, str],
             rank: int = 0, symptoms: Sequence[Symptom] = (),
             facts: Mapping[str, RunFacts] | None = None) -> Gap:  # fmt: skip
    """The gap: stats, every member run, and a paragraph a person can check. `facts`, where
    given, name the member runs (`runs` is then read only for the steps findings name)."""
    c = s.candidate
    tools, patterns = _tools_and_patterns(c, runs)
    instead = _successful_behaviour(tools, successes)
    first = sorted(c.findings, key=lambda f: (f.trace_id, f.position or 0))
    listed = members(c, facts if facts is not None else runs)
    # the users' words, where findings kept them (unserved_request): synthesis reuses them
    requests: list[GapRequest] = []
    for f in first:
        text = f.details.get("request")
        if isinstance(text, str) and text and all(r.text != text for r in requests):
            call = f.details.get("first_call")
            requests.append(GapRequest(text, call if isinstance(call, Mapping) else None))
        if len(requests) == 12:
            break
    dominant = dominant_detector(c)
    what = detector_text.get(dominant, "") or "a recurring failure pattern"
    if c.kind == "cluster":
        what = f"failures whose signatures read alike, mostly: {what}"
    contrast = (
        f"and in {s.succeeded_lacking} successful runs (delta {s.delta:.2f})"
        if s.delta is not None
        else "(there are no successful runs to contrast with)"
    )
    within = s.within_kind
    kind_text = (
        f"Kept within its kind of request ({', '.join(k or '(no write)' for k in within['kinds'])}"
        f": {within['failed']} failed, {within['succeeded']} successful runs): delta "
        f"{within['delta']:.2f}, stable in {within['stability']} resamples. "
        if within
        else ""
    )
    rated = s.by_rates
    rates_text = (
        f"Kept as a rule of rates: {rated['failed']}/{rated['of_failed']} failed and "
        f"{rated['succeeded']}/{rated['of_succeeded']} successful runs break it (lucky successes "
        f"break it too), one-sided Fisher p {rated['p_value']:.2g}. "
        if rated
        else ""
    )
    folded = (
        "Folded in, as what follows it in the same runs: "
        + ", ".join(f"{x.name} ({x.shared}/{x.failed_runs} runs)" for x in symptoms)
        + ". "
        if symptoms
        else ""
    )
    text = (
        f"{what[0].upper()}{what[1:]}. Seen in {s.failed_lacking} failed runs "
        f"(coverage {s.coverage:.2f}) {contrast}, stable in {s.stability} of the bootstrap "
        f"resamples. "
        + kind_text
        + rates_text
        + (f"Confined to failing kinds of request: {s.confined}. " if s.confined else "")
        + (f"Tools involved: {', '.join(tools)}. " if tools else "")
        + (f"Typical calls: {'; '.join(patterns)}. " if patterns else "")
        + (f"Evidence, e.g.: {listed[0].evidence.rstrip('.')}. " if listed else "")
        + (f"What successful runs do instead: {instead}. " if instead else "")
        + folded
    ).strip()
    return Gap(
        id=gap_id(c.key),
        name=name,
        key=c.key,
        kind=c.kind,
        detector=dominant,
        description=text,
        rank=rank,
        coverage=round(s.coverage, 4),
        delta=None if s.delta is None else round(s.delta, 4),
        stability=s.stability,
        failed_runs_lacking=s.failed_lacking,
        successful_runs_lacking=s.succeeded_lacking,
        tools=tuple(tools),
        argument_patterns=tuple(patterns),
        members=tuple(listed),
        requests=tuple(requests),
        successful_behaviour=instead,
        signatures=tuple(c.signatures[:3]),
        symptoms=tuple(symptoms),
        rules=mined_rules(first, {m.trace_id for m in listed}),
        within_kind=dict(within) if within else None,
        confined=s.confined,
    )


def mined_rules(findings: Sequence[Finding], members: set[str]) -> tuple[MinedRule, ...]:
    """The distinct rules the findings of the gap's member runs break (a detector that mines
    rules puts `MinedRule.to_dict()` in `Finding.details["mined_rule"]`), each with the number of
    member runs breaking it, most broken first."""
    rules: dict[tuple[Any, ...], tuple[MinedRule, set[str]]] = {}
    for f in findings:
        data = f.details.get("mined_rule")
        if f.trace_id not in members or not isinstance(data, Mapping):
            continue
        try:
            rule = MinedRule.from_dict(data)
        except GapError:
            continue
        rules.setdefault(rule.identity(), (rule, set()))[1].add(f.trace_id)
    ordered = sorted(rules.values(), key=lambda item: (-len(item[1]), item[0].statement))
    return tuple(replace(rule, failed_runs=len(runs)) for rule, runs in ordered)


def gap_id(key: str) -> str:
    """Stable across analyses: a hash of the candidate's key."""
    return "gap-" + hashlib.sha256(key.encode()).hexdigest()[:10]
