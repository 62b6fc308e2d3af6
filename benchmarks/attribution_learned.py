"""Would a step scorer learnt from labelled failures beat the attribution rules on unseen runs?

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/attribution_learned.py [--data DIR] [--shuffles N]
        [--embeddings CACHE_DIR]

The rules of `tracegym.analysis.attribution` were chosen on half of each labelled multi-agent
set and score far lower on the other half (Who&When step 60.3 tuned, 36.5 untuned). This asks
whether learning from labels does better than hand-chosen rules: per candidate turn (an agent
turn that is not an execution result, the requester or a system prompt) a vector of generic
features (its place among the turns, whether its agent speaks first or often, writes code,
only announces a plan, is a logged prompt template, states numbers nothing before it holds,
authored a failed or a successful execution, follows a failure, its length, its share of the
system's boilerplate; and, in the `+ rule picks` variant, which rules would pick it), a
logistic regression (scikit-learn, balanced classes) over turns "is the labelled step", and
per run the turn it scores highest. The features were written before any fit, from what the
rules already read; the variant and C were compared on the tuning halves only (`tuning-half
CV` rows: development numbers).

Protocols, each printed next to the rules and the best same-run baseline:

- `fit tuning half -> untuned half`: the plain split the rules are reported on;
- `untuned half, 5-fold CV (+ tuning half)`: each untuned run scored by a model fitted on the
  tuning half and the other four fifths of the untuned half (never on itself), mean over
  `--shuffles` shuffles: what a user who labelled most of their failures would get;
- `tuning-half CV`: 5-fold within the tuning half (development);
- across systems: fitted on every labelled run of one system, scored on the other.

Splits as in benchmarks/diagnosis_generalization.py (Who&When even/odd files, AgenTracer
sha256(question_ID) even/odd). Nothing here is used by `tracegym attribute`: see
docs/attribution.md ("A learnt step scorer") for the outcome.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import diagnosis_generalization as dg

_MADE_UP = re.compile(
    r"\b(assum\w*|hypothetical\w*|simulat\w*|placeholder|example|mock|dummy|sample)\b", re.I
)
RULE_PICKS = ("off_task", "failed_execution", "ungrounded_claim", "handover", "first_action")


@dataclass
class Candidate:
    step: int
    agent: str | None
    features: dict[str, float]


@dataclass
class Example:
    candidates: list[Candidate]
    gold_agent: str | None
    gold_step: int | None
    rules_agent: str | None
    rules_step: int | None


def candidates(run: Any, profile: Any, embedder: Any = None) -> list[Candidate]:
    """Every agent turn of `run` that could be the decisive step, with its features; with an
    `embedder` (`analysis.embeddings.Embedder`) also the turn's sentence-embedding cosine to
    the question, to the last agent turn and to the turn before, and its novelty (1 - the
    highest cosine to an earlier turn)."""
    from tracegym.analysis import attribution as a

    ctx = a._context(run, profile)
    turns = ctx.turns
    pool = [
        t for t in turns
        if not t.execution and not ctx.requester(t) and t.role != "system" and not t.after_end
    ]  # fmt: skip
    rules = {
        "off_task": a._rule_off_task, "failed_execution": a._rule_failed_execution,
        "ungrounded_claim": a._rule_ungrounded_claim, "handover": a._rule_handover,
        "first_action": a._rule_first_action,
    }  # fmt: skip
    picks: dict[str, int | None] = {}
    for name, rule in rules.items():
        decision = rule(ctx)
        picks[name] = ctx.action_start(decision.turn).index if decision else None
    seen = set(a._all_numbers(ctx.question))
    fresh: dict[int, int] = {}
    for turn in turns:
        if not turn.template:
            code = " ".join(a._FENCE.findall(turn.text))
            fresh[turn.index] = len(a._numbers(turn.evidence) - seen - a._all_numbers(code))
        seen |= a._all_numbers(turn.text)
    failed_authors: set[int] = set()
    ok_authors: set[int] = set()
    first_failure = first_author = None
    for turn in turns:
        if not turn.execution:
            continue
        author = a._author(turns, turn)
        if author is None:
            continue
        if turn.failed:
            failed_authors.add(author.index)
            if first_failure is None:
                first_failure, first_author = turn.index, author.index
        else:
            ok_authors.add(author.index)
    agents = [t.agent for t in pool]
    spoken: set[str | None] = set()
    vectors = None
    if embedder is not None and pool:
        texts = [ctx.question[:1000]] + [(t.evidence or t.text)[:1000] for t in turns]
        vectors = embedder.encode(texts)
    out: list[Candidate] = []
    for k, turn in enumerate(pool):
        before = turns[turn.index - 1] if turn.index > 0 else None
        after = turns[turn.index + 1] if turn.index + 1 < len(turns) else None
        features = {
            "place": k / max(1, len(pool) - 1),
            "place_0": k == 0,
            "place_1": k == 1,
            "place_2": k == 2,
            "place_3_on": k >= 3,
            "last": k == len(pool) - 1,
            "agent_first_turn": turn.agent not in spoken,
            "agent_share": agents.count(turn.agent) / len(pool),
            "orchestrator": turn.agent == profile.orchestrator,
            "writes_code": turn.writes_code,
            "plan_only": a._announces_only(turn),
            "template": turn.template,
            "fresh_numbers": math.log1p(fresh.get(turn.index, 0)),
            "any_fresh_number": fresh.get(turn.index, 0) > 0,
            "made_up_words": bool(_MADE_UP.search(turn.evidence)),
            "authored_failure": turn.index in failed_authors,
            "authored_first_failure": turn.index == first_author,
            "authored_success": turn.index in ok_authors,
            "after_first_failure": first_failure is not None and turn.index > first_failure,
            "follows_failure": before is not None and before.execution and before.failed,
            "follows_execution": before is not None and before.execution,
            "hands_over": after is not None and after.agent != turn.agent,
            "length": math.log1p(len(turn.evidence)) / 10,
            "boilerplate": turn.boilerplate,
        }
        for name in RULE_PICKS:
            features[f"pick_{name}"] = picks[name] == turn.index
        if vectors is not None:
            v, earlier = vectors[1 + turn.index], vectors[1 : 1 + turn.index]
            features["sim_question"] = float(v @ vectors[0])
            features["sim_last_turn"] = float(v @ vectors[1 + pool[-1].index])
            features["sim_previous"] = float(v @ earlier[-1]) if len(earlier) else 0.0
            features["novelty"] = 1.0 - (float((earlier @ v).max()) if len(earlier) else 0.0)
        spoken.add(turn.agent)
        out.append(Candidate(turn.step, turn.agent, {k: float(v) for k, v in features.items()}))
    return out


def examples(labelled: dg.LabelledSet, runs: Sequence[Any], embedder: Any = None) -> list[Example]:
    from tracegym.analysis.attribution import attribute, learn_profiles, system_key

    profiles = learn_profiles(labelled.runs)  # label-free, from every run of the set
    out = []
    for run in runs:
        profile = profiles[system_key(run)]
        rules = attribute(run, profile=profile)
        gold_agent, gold_step = labelled.gold(run)
        out.append(
            Example(
                candidates(run, profile, embedder), gold_agent, gold_step, rules.agent, rules.step
            )
        )
    return out


Scores = tuple[float, float, float]  # agent %, step %, step +-1 %


def _names(variant: str, sample: Example) -> list[str]:
    names = sorted(sample.candidates[0].features)
    return names if variant == "+ rule picks" else [n for n in names if not n.startswith("pick_")]


def fit(train: Sequence[Example], names: Sequence[str], c: float) -> Any:
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    x = [[cand.features[n] for n in names] for e in train for cand in e.candidates]
    y = [cand.step == e.gold_step for e in train for cand in e.candidates]
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=2000)
    return model.fit(np.array(x), np.array(y))


def predict(model: Any, names: Sequence[str], example: Example) -> Candidate | None:
    import numpy as np

    if not example.candidates:
        return None
    x = np.array([[cand.features[n] for n in names] for cand in example.candidates])
    return example.candidates[int(np.argmax(model.decision_function(x)))]


def score(pairs: Sequence[tuple[Example, str | None, int | None]]) -> Scores:
    n = max(1, len(pairs))
    agent = sum(dg.agent_hit(a, e.gold_agent) for e, a, _ in pairs)
    step = sum(s is not None and s == e.gold_step for e, _, s in pairs)
    near = sum(
        s is not None and e.gold_step is not None and abs(s - e.gold_step) <= 1 for e, _, s in pairs
    )
    return 100 * agent / n, 100 * step / n, 100 * near / n


def scored(model: Any, names: Sequence[str], test: Sequence[Example]) -> Scores:
    pairs = []
    for example in test:
        best = predict(model, names, example)
        pairs.append((example, best.agent if best else None, best.step if best else None))
    return score(pairs)


def rules(test: Sequence[Example]) -> Scores:
    return score([(e, e.rules_agent, e.rules_step) for e in test])


def cross_validated(
    extra: Sequence[Example], pool: Sequence[Example], names: Sequence[str], c: float,
    shuffles: int,
) -> Scores:  # fmt: skip
    """Each run of `pool` scored by a model fitted on `extra` and the other 4/5 of `pool`."""
    totals = [0.0, 0.0, 0.0]
    for seed in range(shuffles):
        order = list(pool)
        random.Random(seed).shuffle(order)
        folds = [order[i::5] for i in range(5)]
        pairs = []
        for i, test in enumerate(folds):
            train = list(extra) + [e for j, fold in enumerate(folds) if j != i for e in fold]
            model = fit(train, names, c)
            for example in test:
                best = predict(model, names, example)
                pairs.append((example, best.agent if best else None, best.step if best else None))
        for k, value in enumerate(score(pairs)):
            totals[k] += value / shuffles
    return (totals[0], totals[1], totals[2])


def _row(label: str, values: Scores) -> str:
    return f"  {label:<58} {values[0]:6.1f} {values[1]:6.1f} {values[2]:8.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=dg.DATA)
    parser.add_argument("--shuffles", type=int, default=5)
    parser.add_argument("--c", type=float, default=0.3, help="inverse regularisation")
    parser.add_argument(
        "--embeddings", type=Path, metavar="CACHE_DIR",
        help="add sentence-embedding features (all-MiniLM-L6-v2, cached under CACHE_DIR)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("needs scikit-learn: pip install -e '.[analysis]'")
        return 2
    loaders: dict[str, Callable[[Path, Path], dg.LabelledSet | None]] = {
        "Who&When": dg.load_whowhen,
        "AgenTracer": dg.load_agentracer,
    }
    embedder = None
    if args.embeddings is not None:
        from tracegym.analysis.embeddings import Embedder

        embedder = Embedder(args.embeddings)
    halves: dict[str, tuple[list[Example], list[Example]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, load in loaders.items():
            labelled = load(args.data, Path(tmp) / name)
            if labelled is None:
                print(f"{name}: not under {args.data}; skipped")
                continue
            tune_split, report_split = [k for k in labelled.splits if k != "all"]
            halves[name] = (
                examples(labelled, labelled.splits[tune_split], embedder),
                examples(labelled, labelled.splits[report_split], embedder),
            )
    if not halves:
        return 1
    head = f"  {'':<58} {'agent':>6} {'step':>6} {'step+-1':>8}"
    for name, (tune, report) in halves.items():
        print(f"\n== {name}: tuning half n={len(tune)}, untuned half n={len(report)}")
        print(head)
        print(_row("rules (tracegym attribute), untuned half", rules(report)))
        print(_row("rules, tuning half (development)", rules(tune)))
        for variant in ("turn features", "+ rule picks"):
            names = _names(variant, tune[0])
            model = fit(tune, names, args.c)
            split = scored(model, names, report)
            print(_row(f"[{variant}] fit tuning half -> untuned half", split))
            cv = cross_validated(tune, report, names, args.c, args.shuffles)
            print(_row(f"[{variant}] untuned half, 5-fold CV (+ tuning half)", cv))
            dev = cross_validated((), tune, names, args.c, args.shuffles)
            print(_row(f"[{variant}] tuning-half CV (development)", dev))
    if len(halves) == 2:
        print("\n== Across systems (fitted on every labelled run of one, scored on the other)")
        print(head)
        (a, (tune_a, report_a)), (b, (tune_b, report_b)) = halves.items()
        for source, target, train, test in (
            (a, b, tune_a + report_a, tune_b + report_b),
            (b, a, tune_b + report_b, tune_a + report_a),
        ):
            print(_row(f"rules on {target}", rules(test)))
            for variant in ("turn features", "+ rule picks"):
                names = _names(variant, train[0])
                model = fit(train, names, args.c)
                print(_row(f"[{variant}] {source} -> {target}", scored(model, names, test)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
