"""Request kinds learnt from request text: templates filled with different values cluster
together, different templates apart, boilerplate every request repeats is ignored."""

from __future__ import annotations

import random
import time

import pytest

pytest.importorskip("sklearn")

from tracegym.analysis.request_kinds import RequestKinds, normalise, strip_common
from tracegym.analysis.runs import ROLE, Run, Step

TEMPLATES = {
    "status": "Hi, this is {email}. What is the status of my parcel #{id}?",
    "cancel": "Hello. Please cancel the parcel {id} I sent on {date}, it is no longer needed.",
    "address": "Could you change the delivery address of {id} to {n} {street} street please?",
    "refund": "I was charged ${n}.{c} twice for order {id}; I want my money back.",
}
NAMES = ["ana", "bo", "chen", "dara", "eli", "fatima", "gus", "hana", "ivo", "jun"]
STREETS = ["oak", "elm", "pine", "birch", "cedar", "maple"]


def _run(trace: str, text: str | None, success: bool = True) -> Run:
    steps = []
    if text is not None:
        steps.append(Step(position=0, trace_id=trace, span_id=f"{trace}-u", parent_span_id=None,
                          name="user", operation="chat", agent="a", step_index=0, tool=None,
                          call_id=None, input=text, output=None, status="OK", error_type=None,
                          start_ns=0, end_ns=0, duration_ms=0.0, input_tokens=None,
                          output_tokens=None, memory_store=None, memory_record=None,
                          memory_content_hash=None, memory_result_hashes=[], subtask=None,
                          attributes={ROLE: "user"}))  # fmt: skip
    return Run(trace, trace, "a", success, None, {}, None, steps)


def fill(template: str, rng: random.Random) -> str:
    return template.format(
        email=f"{rng.choice(NAMES)}.{rng.randint(10, 99)}@example.com",
        id=f"PX{rng.randint(10000, 99999)}", date=f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
        n=rng.randint(1, 400), c=rng.randint(10, 99), street=rng.choice(STREETS),
    )  # fmt: skip


def templated_runs(per_kind: int = 12, seed: int = 0, boilerplate: str = "") -> tuple[list, dict]:
    rng = random.Random(seed)
    runs, truth = [], {}
    for i in range(per_kind * len(TEMPLATES)):
        kind = list(TEMPLATES)[rng.randrange(len(TEMPLATES))]
        run = _run(f"t{i:03d}", boilerplate + fill(TEMPLATES[kind], rng), rng.random() < 0.6)
        runs.append(run)
        truth[run.trace_id] = kind
    return runs, truth


def _partition(model: RequestKinds, runs, truth):
    """(learnt kinds mixing templates, templates split over learnt kinds)."""
    learnt: dict[str, set[str]] = {}
    template: dict[str, set[str]] = {}
    for r in runs:
        k = model.kind_of(r)
        learnt.setdefault(str(k), set()).add(truth[r.trace_id])
        template.setdefault(truth[r.trace_id], set()).add(str(k))
    return ([k for k, v in learnt.items() if len(v) > 1],
            [t for t, v in template.items() if len(v) > 1])  # fmt: skip


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_templated_requests_cluster_by_template(seed):
    runs, truth = templated_runs(seed=seed)
    model = RequestKinds().fit(runs)
    mixed, split = _partition(model, runs, truth)
    assert mixed == [] and split == []
    assert len(model.members()) == len(set(truth.values()))


def test_boilerplate_pasted_into_every_request_does_not_merge_the_kinds():
    pasted = (
        "You are a helpful assistant with these tools: "
        + " ".join(f"tool_{w}(order, parcel, status, address, money)" for w in NAMES)
        + "\n\nQuestion: "
    )
    runs, truth = templated_runs(seed=3, boilerplate=pasted * 20)
    model = RequestKinds().fit(runs)
    assert _partition(model, runs, truth) == ([], [])


def test_deterministic_and_named_by_words_of_the_template():
    runs, truth = templated_runs(seed=4)
    a = RequestKinds().fit(runs)
    b = RequestKinds().fit(list(runs))
    assert [a.kind_of(r) for r in runs] == [b.kind_of(r) for r in runs]
    first = runs[0]
    assert a.kind_of(first) == "k0"  # numbered in order of first appearance
    name = a.name(a.kind_of(first))
    words = set(TEMPLATES[truth[first.trace_id]].lower().replace(",", " ").split())
    assert any(w in words for part in name.split("(")[1].rstrip(")").split(" / ")
               for w in part.split())  # fmt: skip


def test_runs_without_request_text_have_no_kind():
    runs, _ = templated_runs(per_kind=3, seed=5)
    silent = _run("silent", None)
    model = RequestKinds().fit([*runs, silent])
    assert model.kind_of(silent) is None and model.name(None) == "(no request)"
    assert RequestKinds().fit([runs[0]]).kind_of(runs[0]) is None  # nothing to compare with
    empty = [_run(f"e{i}", "{}") for i in range(3)]  # an agent's empty arguments ask nothing
    assert {RequestKinds().fit([*runs, *empty]).kind_of(r) for r in empty} == {None}
    assert RequestKinds().kind_of(runs[0]) is None  # nothing fitted


def test_a_run_not_fitted_on_gets_the_kind_of_its_request():
    """A streamed analysis fits on a sample: the other runs take the kind of the same masked
    request, else of the nearest kind within the distance, else none."""
    runs, truth = templated_runs(per_kind=12, seed=3, boilerplate="Support chat. ")
    fitted, rest = runs[:30], runs[30:]
    model = RequestKinds().fit(fitted)
    whole = RequestKinds().fit(runs)
    for run in rest:  # the same templates: the kind fitted runs of its template have
        peers = {model.kind_of(r) for r in fitted if truth[r.trace_id] == truth[run.trace_id]}
        assert peers == {model.kind_of(run)}, truth[run.trace_id]
    assert [model.kind_of(r) for r in fitted] == [model.kinds_[r.trace_id] for r in fitted]
    assert _partition(model, rest, truth) == _partition(whole, rest, truth) == ([], [])
    reworded = _run("reworded", "Support chat. What is the current status of parcel PX55555?")
    assert model.kind_of(reworded) == model.kind_of(
        next(r for r in fitted if truth[r.trace_id] == "status")
    )
    assert model.kind_of(_run("far", "Support chat. Bonjour, quel temps fait-il?")) is None
    assert model.kind_of(_run("silent", None)) is None


def test_identical_requests_are_one_kind():
    runs = [_run(f"r{i}", "Please help me.") for i in range(6)]
    model = RequestKinds().fit(runs)
    assert {model.kind_of(r) for r in runs} == {"k0"}


def test_values_are_masked_and_common_text_cut():
    text = normalise('Hi, this is ana.12@example.com: order #PX12345 for "Blue Lamp", $40.50')
    assert "ana" not in text and "12345" not in text and "blue" not in text
    assert "xemail" in text and "xid" in text and "xquoted" in text and "xnum" in text
    assert strip_common(["intro text: cancel it now", "intro text: refund it now"]) == [
        "cancel", "refund"]  # fmt: skip
    assert strip_common(["same", "same"]) == ["same", "same"]  # nothing would be left


def test_hundreds_of_runs_fit_well_under_a_second():
    runs, _ = templated_runs(per_kind=100, seed=6)
    clock = time.perf_counter()
    RequestKinds().fit(runs)
    assert time.perf_counter() - clock < 1.0


def test_a_kinds_name_is_its_heaviest_words_as_a_full_sort_would_rank_them() -> None:
    import numpy as np
    from tracegym.analysis.request_kinds import _heaviest

    rng = np.random.default_rng(3)
    vocabulary = [f"w{i}" + "x" * int(rng.integers(0, 4)) for i in range(300)]
    for zeros in (0.5, 0.995):  # most words of the kind absent; or all but one or two
        weight = np.round(rng.random(300), 2) * (rng.random(300) > zeros)
        weight[rng.integers(0, 300)] = 1e-12  # positive, but 0 at 9 decimals
        full = sorted(range(300), key=lambda j: (-round(weight[j], 9), -len(vocabulary[j]),
                                                 vocabulary[j]))  # fmt: skip
        expected = [vocabulary[j] for j in full[:3] if weight[j] > 0]
        assert _heaviest(vocabulary, weight, 3) == expected
