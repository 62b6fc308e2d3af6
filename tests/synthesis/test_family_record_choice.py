"""The `record_choice` family, built from a `wrong_choice` gap.

tests/fixtures/planted.py's `early_wrong_assumption` runs act on the customer's latest record
while the user named another by an attribute ("for the laptop"); `wrong_choice` flags the write.
Its finding-key candidate is not kept at the default thresholds on seed 0 (one run of it clears
the detector's calibration), so the gap is forced from it as benchmarks/synthesis_real.py forces
one per detector. The family must build an environment from it that passes validity and
fidelity, whose oracle solves every seed and whose verifier fails every wrong choice, a second
write and a write on another candidate; refusals name their reason.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tracegym.analysis.detector_names import WRONG_CHOICE
from tracegym.analysis.detectors.choice import words
from tracegym.analysis.gap import Gap
from tracegym.synthesis import registry
from tracegym.synthesis.base import Action, Environment, run_actions
from tracegym.synthesis.calibrate import evaluate
from tracegym.synthesis.conventions import conventions_from_store
from tracegym.synthesis.families import build_spec, family_for_gap
from tracegym.synthesis.families.record_choice import RecordChoiceEnv
from tracegym.synthesis.spec import catalog_from_store
from tracegym.synthesis.validity import check_environment
from tracegym.synthesis.world import NotSynthesizable

SEED = 0  # a planted seed with early_wrong_assumption (docs/detectors.md: where it fires)
KEY = "wrong_choice:issue_shipment_refund.shipment_number"


def planted_gap(home: Path, seed: int = SEED) -> Gap:
    """The wrong_choice gap of a planted seed, forced from its finding-key candidate."""
    from tracegym.analysis.pipeline import analyze
    from tracegym.benchmarks.planted_causes import ExactSignatures
    from tracegym.benchmarks.synthesis_real import forced_gaps
    from tracegym.tests.fixtures import planted as pl

    pl.generate(home, seed)
    result = analyze(home, embedder=ExactSignatures(), write=False)
    gaps, missing = forced_gaps(result, (WRONG_CHOICE,))
    assert gaps, missing
    return gaps[0]


def planted_env(home: Path) -> Environment:
    """The record_choice environment of planted seed 0 (also enrolled in test_gym_env)."""
    gap = planted_gap(home)
    spec = build_spec(gap, catalog_from_store(home), conventions_from_store(home))
    return registry.from_spec(spec)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Gap, Path, Environment]:
    home = tmp_path_factory.mktemp("planted-choice")
    gap = planted_gap(home)
    spec = build_spec(gap, catalog_from_store(home), conventions_from_store(home))
    return gap, home, family_for_gap(gap)(spec)


def _listed(env: Environment, task: Any) -> list[str]:
    """The candidates' ids in the order the owner lookup lists them."""
    [owner] = task.state.owners.values()
    plan = env.plan  # type: ignore[attr-defined]
    key = plan.list_path.removesuffix("[*]")
    return [e[plan.argument] if isinstance(e, dict) else e for e in owner[key]]


def _on(oracle: list[Action], old: str, new: str) -> list[Action]:
    """The oracle with every mention of record `old` replaced by `new` (its reads, its write
    and its answer): a policy that chose `new`."""
    out = []
    for action in oracle:
        if "answer" in action:
            out.append({"answer": str(action["answer"]).replace(old, new)})
            continue
        args = {k: new if v == old else v for k, v in action["arguments"].items()}
        out.append({**action, "arguments": args})
    return out


def test_the_gap_reaches_the_family(built):
    gap, _home, env = built
    assert gap.detector == WRONG_CHOICE and gap.key == KEY
    assert isinstance(env, RecordChoiceEnv) and env.family == "record_choice"
    assert env.roles.action == "issue_shipment_refund" and env.plan.argument == "shipment_number"
    assert [d.name for d in env.plan.fields] == ["contents"]  # what the users' words matched


def test_it_passes_validity_and_fidelity(built):
    _gap, _home, env = built
    report = check_environment(env, 50)
    assert report.ok, report.failures
    fidelity = pytest.importorskip("tracegym.synthesis.fidelity")
    checked = fidelity.check_fidelity(env, n_seeds=50)
    assert checked.ok, [i.to_dict() for i in checked.issues[:3]]


def test_the_oracle_solves_every_seed_and_every_wrong_choice_fails(built):
    _gap, _home, env = built
    first = last = 0
    for seed in range(60):
        task = env.make_task(seed)
        target = task.meta["choice"]["target"]
        assert run_actions(env, seed, task.oracle)[1].passed
        listed = _listed(env, task)
        assert sorted(listed) == sorted([target, *task.meta["choice"]["others"]])
        first += listed[0] == target
        last += listed[-1] == target
        for rival in task.meta["choice"]["others"]:
            _, verdict = run_actions(env, seed, _on(task.oracle, target, rival))
            assert not verdict.passed
            assert any("never ran on" in r for r in verdict.reasons)
            assert any(rival in r for r in verdict.reasons)
    assert 0 < first < 60 and 0 < last < 60  # no position is the answer


def test_the_user_describes_exactly_one_record_and_never_names_it(built):
    _gap, _home, env = built
    for seed in range(40):
        task = env.make_task(seed)
        target, said = task.meta["choice"]["target"], task.meta["choice"]["said"]
        told = f" {words(task.instruction)} "
        assert all(f" {words(v)} " in told for v in said.values())
        described = [
            eid
            for eid, record in task.state.entities.items()
            if all(words(str(record.get(f))) == words(v) for f, v in said.items())
        ]
        assert described == [target]
        for eid in task.state.entities:
            assert eid not in task.instruction and eid not in task.system_prompt


def test_the_write_runs_once_on_it_and_on_no_other(built):
    _gap, _home, env = built
    for seed in range(10):
        task = env.make_task(seed)
        [rival, *_] = task.meta["choice"]["others"]
        write = next(a for a in task.oracle if a.get("name") == env.roles.action)
        answer = task.oracle[-1]
        twice = [*task.oracle[:-1], write, answer]
        _, verdict = run_actions(env, seed, twice)
        assert not verdict.passed and any("2 times" in r for r in verdict.reasons)
        other = {**write, "arguments": {**write["arguments"], env.roles.id_arg: rival}}
        both = [*task.oracle[:-1], other, answer]
        _, verdict = run_actions(env, seed, both)
        assert not verdict.passed and any(f"also ran on {rival!r}" in r for r in verdict.reasons)
        assert not run_actions(env, seed, [a for a in task.oracle if a is not write])[1].passed


def test_the_verifier_compares_ids_as_the_detector_does(built):
    _gap, _home, env = built
    task = env.make_task(3)
    target = task.meta["choice"]["target"]
    episode, verdict = run_actions(env, 3, task.oracle)
    assert verdict.passed
    loose = copy.deepcopy(episode)
    for step in loose.calls:
        if step["action"].get("name") == env.roles.action:
            step["action"]["arguments"][env.roles.id_arg] = f"  {target.lower()} "
    assert words(f"  {target.lower()} ") == words(target)
    assert env.verify(loose).passed


def test_harder_levels_describe_by_more_and_guessing_gets_rarer(built):
    _gap, _home, env = built
    levels = env.levels()
    assert [lv["candidates"] for lv in levels] == sorted(lv["candidates"] for lv in levels)

    class Guess:  # looks up the customer and acts on a random listed record
        def __init__(self) -> None:
            self.n = 0

        def __call__(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
            task = self.env.task
            if info.get("step") == 0:
                self.queue = list(task.oracle)
                listed = _listed(self.env, task)
                pick = listed[(task.seed * 7 + 3) % len(listed)]
                self.queue = _on(self.queue, task.meta["choice"]["target"], pick)
            return self.queue.pop(0) if self.queue else {"answer": ""}

    rates = []
    for level in (levels[0], levels[-1]):
        harder = type(env)(env.spec, **level)
        guess = Guess()
        guess.env = harder
        rates.append(evaluate(harder, guess, range(40), k=1).pass_at_1)
    assert rates[0] > rates[1] and rates[0] < 1.0


def _two_fields(env: RecordChoiceEnv) -> RecordChoiceEnv:
    """The same world with a second describing field (`colour`) on the record and its listing."""
    spec = copy.deepcopy(env.spec)
    colour = {"type": "string", "examples": ["black", "white", "red", "blue"],
              "enum": ["black", "blue", "red", "white"], "wordlike": True}  # fmt: skip
    r = env.roles
    spec.catalog.tools[r.lookup].result["properties"]["colour"] = dict(colour)
    owner = spec.catalog.tools[r.owner].result
    owner["properties"][env.plan.list_path.removesuffix("[*]")]["items"]["properties"]["colour"] = (
        dict(colour)
    )
    gap = Gap(id="gap-two", name="two", key=KEY, kind="finding", detector=WRONG_CHOICE,
              tools=("issue_shipment_refund", "find_sender_by_email"))  # fmt: skip
    rebuilt = RecordChoiceEnv.build_spec(gap, spec.catalog)
    rebuilt.extra["conventions"] = spec.extra.get("conventions")
    return RecordChoiceEnv(rebuilt, fields=2, shared=2)


def test_two_stated_fields_and_near_matches(built):
    _gap, _home, env = built
    two = _two_fields(env)
    assert {d.name for d in two.plan.fields} == {"contents", "colour"}
    near = 0
    for seed in range(30):
        task = two.make_task(seed)
        target, said = task.meta["choice"]["target"], task.meta["choice"]["said"]
        assert len(said) == 2 and all(v in task.instruction for v in said.values())
        assert run_actions(two, seed, task.oracle)[1].passed
        for rival in task.meta["choice"]["others"]:
            record = task.state.entities[rival]
            same = sum(words(str(record[f])) == words(v) for f, v in said.items())
            assert same < 2
            near += same == 1
            assert not run_actions(two, seed, _on(task.oracle, target, rival))[1].passed
    assert near >= 30  # `shared`: rivals that differ in one stated value only
    one = RecordChoiceEnv(two.spec, fields=1, shared=2)  # one of the two fields stated
    for seed in range(30):
        task = one.make_task(seed)
        [(name, value)] = task.meta["choice"]["said"].items()
        for rival in task.meta["choice"]["others"]:
            assert words(str(task.state.entities[rival][name])) != words(value)
    report = check_environment(two, 30)
    assert report.ok, report.failures


def test_the_request_follows_the_users_words_when_the_gap_keeps_them(built):
    """wrong_choice keeps no requests today; given the users' requests (planted wording), the
    description goes in their value slot and the owner's identity in theirs."""
    from tracegym.analysis.gap import GapRequest

    gap, home, env = built
    said = [("ana.44@example.com", "laptop"), ("ben.57@example.com", "toys"),
            ("eli.42@example.com", "documents")]  # fmt: skip
    requests = tuple(
        GapRequest(f"Hi, this is {email}. Please refund my shipment for the {what}.",
                   {"tool": "find_sender_by_email", "arguments": {"email": email}})
        for email, what in said
    )  # fmt: skip
    worded = registry.from_spec(
        build_spec(replace(gap, requests=requests), catalog_from_store(home),
                   conventions_from_store(home))
    )  # fmt: skip
    assert env.spec.extra["wording"] is None  # the gap as analysis gives it
    for seed in range(10):
        task = worded.make_task(seed)
        [value] = task.meta["choice"]["said"].values()
        [owner] = task.state.owners
        assert task.instruction.startswith(f"Hi, this is {owner}. Please refund my shipment for "
                                           f"the {value}.")  # fmt: skip
        assert run_actions(worded, seed, task.oracle)[1].passed


def test_refusals_name_their_reason(built):
    gap, home, _env = built
    catalog = catalog_from_store(home)
    with pytest.raises(NotSynthesizable, match="given by the user"):
        build_spec(replace(gap, key="wrong_choice:issue_shipment_refund.amount"), catalog)
    with pytest.raises(NotSynthesizable, match="not in the recorded tools"):
        build_spec(replace(gap, key="wrong_choice:no_such_tool.shipment_number"), catalog)
    with pytest.raises(NotSynthesizable, match="names no write argument"):
        build_spec(replace(gap, key="wrong_choice"), catalog)
    bare = copy.deepcopy(catalog)
    for tool in ("lookup_shipment", "find_sender_by_email"):
        shape = bare.tools[tool].result
        for sub in [shape, *(v.get("items", {}) for v in shape["properties"].values())]:
            sub.get("properties", {}).pop("contents", None)
    with pytest.raises(NotSynthesizable, match="no field users describe them by"):
        build_spec(gap, bare)
    alone = copy.deepcopy(catalog)
    del alone.tools["find_sender_by_email"]
    with pytest.raises(NotSynthesizable):
        build_spec(replace(gap, tools=("issue_shipment_refund",)), alone)


# Real data: an option inside a looked-up record -------------------------------------------------
@pytest.fixture(scope="module")
def tau2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tau2-bench retail (3 models, pooled) imported as benchmarks/gaps_real.py imports it."""
    from tracegym.benchmarks.gaps_real import DATA, prepare, real_sets

    found, _skipped = real_sets(DATA.resolve())
    pooled = [s for s in found if s.name.startswith("tau2 retail pooled")]
    if not pooled:
        pytest.skip(f"the tau2 retail files are absent under {DATA}")
    return prepare(pooled[0], tmp_path_factory.mktemp("tau2-retail"))


@pytest.mark.slow
def test_a_payment_method_chosen_among_the_users_on_real_runs(tau2: Path):
    """wrong_choice flags modify_pending_order_payment's payment_method_id there (the user said
    "gift card", the agent passed PayPal); the environment built from that key lists the user's
    payment methods, the user describes one by its source, and it passes validity."""
    from tracegym.analysis.detectors.choice import WrongChoice
    from tracegym.analysis.runs import load_runs
    from tracegym.store.store import Store

    tool, arg = "modify_pending_order_payment", "payment_method_id"
    with Store(tau2) as store:
        runs = load_runs(store)
    detector = WrongChoice().fit(runs)
    flagged = [
        f for run in runs for f in detector.detect(run) if f.key == f"{WRONG_CHOICE}:{tool}.{arg}"
    ]
    assert flagged and all(run.success is not True for run in runs
                           if run.trace_id in {f.trace_id for f in flagged})  # fmt: skip
    gap = Gap(id="gap-payment", name=tool, key=f"{WRONG_CHOICE}:{tool}.{arg}", kind="finding",
              detector=WRONG_CHOICE, tools=(tool, "get_user_details"),
              members=())  # fmt: skip
    env = family_for_gap(gap)(
        build_spec(gap, catalog_from_store(tau2), conventions_from_store(tau2))
    )
    assert env.plan.source == "owner" and env.plan.path == "payment_methods{*}"
    assert "source" in {d.name for d in env.plan.fields}
    for seed in range(20):
        task = env.make_task(seed)
        choice = task.meta["choice"]
        methods = next(iter(task.state.owners.values()))["payment_methods"]
        assert set(methods) == {choice["target"], *choice["others"]}
        said = choice["said"]
        alike = [k for k, m in methods.items()
                 if all(words(str(m.get(f))) == words(v) for f, v in said.items())]  # fmt: skip
        assert alike == [choice["target"]] and choice["target"] not in task.instruction
        assert run_actions(env, seed, task.oracle)[1].passed
        for rival in choice["others"]:
            assert not run_actions(env, seed, _on(task.oracle, choice["target"], rival))[1].passed
    report = check_environment(env, 50)
    assert report.ok, report.failures


@pytest.mark.slow
def test_an_order_described_by_an_item_in_it_on_real_runs(tmp_path: Path):
    """AgentRx tau-retail: wrong_choice flags cancel_pending_order's order_id (the user said
    "tablet", the agent cancelled another order). The orders' only short texts are inside their
    item lists: the user names an item of the order, which no other listed order holds."""
    from tracegym.benchmarks.gaps_real import DATA
    from tracegym.store.importers import import_path
    from tracegym.synthesis.world import get_all, path_tokens

    path = DATA.resolve() / "agentrx-tau-retail" / "tau_dataset_full.json"
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    from tracegym.analysis.detectors.choice import WrongChoice
    from tracegym.analysis.runs import load_runs
    from tracegym.store.store import Store

    import_path("tau-bench", path, tmp_path)
    tool = "cancel_pending_order"
    with Store(tmp_path) as store:
        runs = load_runs(store)
    detector = WrongChoice().fit(runs)
    keys = {f.key for run in runs for f in detector.detect(run)}
    assert f"{WRONG_CHOICE}:{tool}.order_id" in keys
    gap = Gap(id="gap-order", name=tool, key=f"{WRONG_CHOICE}:{tool}.order_id", kind="finding",
              detector=WRONG_CHOICE, tools=(tool,))  # fmt: skip
    catalog = catalog_from_store(tmp_path)
    env = family_for_gap(gap)(build_spec(gap, catalog, conventions_from_store(tmp_path)))
    assert env.plan.fields[0].name == "items[*].name"
    for seed in range(20):
        task = env.make_task(seed)
        choice = task.meta["choice"]
        [value] = choice["said"].values()
        holding = [eid for eid, record in task.state.entities.items()
                   if value in get_all(record, path_tokens("items[*].name"))]  # fmt: skip
        assert holding == [choice["target"]] and f"the {value}" in task.instruction
        assert run_actions(env, seed, task.oracle)[1].passed
        for rival in choice["others"]:
            assert not run_actions(env, seed, _on(task.oracle, choice["target"], rival))[1].passed
    report = check_environment(env, 50)
    assert report.ok, report.failures
