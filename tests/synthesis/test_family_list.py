"""The `list_selection` family and the list rule it enforces (`wrong_list`'s mined rule).

No planted cause of tests/fixtures/planted.py makes wrong lists, so a small agent is written here
the way tests/fixtures/seat_agent.py writes one (records straight to the spool), in two domains
whose names and relations differ: a shop whose successful returns pass *some* of the order's
items (the ones the user names: subset), whose failed runs mix in an item of another order with
the same name; an airline whose successful rebookings pass *all* of the booking's segments
(equal), whose failed runs drop one. `analyze` must mine the rule into `Gap.rules`, the family
must build an environment from it that passes validity, whose verifier fails the wrong lists, and
whose system prompt is the agent's own and names no element. On the shared tau-bench sets the
same from their real `wrong_list` findings.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from tracegym.analysis.detector_names import WRONG_CHOICE, WRONG_LIST
from tracegym.analysis.detectors.list_args import WrongListArgument
from tracegym.analysis.detectors.registry import default_detectors
from tracegym.analysis.gap import Gap, MinedRule
from tracegym.analysis.pipeline import analyze
from tracegym.analysis.runs import load_runs
from tracegym.store.records import outcome_record, span_record, write_spool_file
from tracegym.store.store import Store
from tracegym.synthesis.base import Action, Environment, run_actions
from tracegym.synthesis.conventions import conventions_from_store
from tracegym.synthesis.families import build_spec, family_for_gap
from tracegym.synthesis.families.list_selection import ListSelectionEnv
from tracegym.synthesis.spec import catalog_from_store
from tracegym.synthesis.validity import check_environment
from tracegym.synthesis.world import NotSynthesizable
from tracegym.tests.fixtures.hash_embedder import HashEmbedder
from tracegym.tracer import semconv as sc

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
BASE_NS = 1_764_460_800_000_000_000
NAMES = ("Kettle", "Desk Lamp", "Blender", "Toaster", "Mixer", "Heater", "Fan", "Radio")
CITIES = ("Lisbon", "Oslo", "Quito", "Perth", "Dakar", "Hanoi", "Lima", "Turin")


@dataclass(frozen=True)
class Domain:
    """One small agent: its read, its write with a list argument, and how users ask."""

    name: str
    read: str
    record_arg: str
    list_key: str
    element_id: str
    label: str
    write: str
    list_arg: str
    relation: str  # what its successful runs keep: subset | equal
    prompt: str


SHOP = Domain("shop", "get_order", "order_id", "items", "item_id", "product", "return_items",
              "item_ids", "subset",
              "You are the shop's assistant. Returns are accepted within 30 days; refund to the "
              "original payment method.")  # fmt: skip
AIRLINE = Domain("airline", "get_booking", "booking_id", "segments", "segment_id", "origin",
                 "rebook_segments", "segment_ids", "equal",
                 "You are the airline's assistant. Rebooking moves a whole journey; no fee "
                 "applies within 24 hours.")  # fmt: skip


class _Run:
    def __init__(self, d: Domain, index: int) -> None:
        self.d, self.trace = d, f"{index + 1:032x}"
        self.run_id = f"{d.name}-{index:03d}"
        self.records: list[dict[str, Any]] = []
        self.clock = BASE_NS + index * 10**10
        self.spans = 0
        self.root = self._id()

    def _id(self) -> str:
        self.spans += 1
        return f"{int(self.trace, 16) * 100 + self.spans:016x}"[-16:]

    def span(self, name: str, attributes: dict[str, Any]) -> None:
        self.clock += 1000
        self.records.append(span_record(
            trace_id=self.trace, span_id=self._id(), parent_span_id=self.root, name=name,
            start_ns=self.clock, end_ns=self.clock + 500,
            attributes={sc.AGENT_NAME: f"{self.d.name}-agent", sc.RUN_ID: self.run_id,
                        **attributes},
        ))  # fmt: skip

    def chat(self, text: str, request: str) -> None:
        self.span("chat model", {
            sc.OPERATION: sc.OP_CHAT, sc.INPUT_TOKENS: 200, sc.OUTPUT_TOKENS: 40,
            sc.SYSTEM_INSTRUCTIONS: self.d.prompt,
            sc.INPUT_MESSAGES: json.dumps([{"role": "user", "content": request}]),
            sc.OUTPUT_MESSAGES: json.dumps([{"role": "assistant", "content": text}]),
        })  # fmt: skip

    def tool(self, name: str, arguments: dict[str, Any], result: Any) -> None:
        self.span(f"execute_tool {name}", {
            sc.OPERATION: sc.OP_TOOL, sc.TOOL_NAME: name,
            sc.TOOL_ARGUMENTS: json.dumps(arguments), sc.TOOL_RESULT: json.dumps(result),
        })  # fmt: skip

    def close(self, request: str, success: bool) -> list[dict[str, Any]]:
        root = span_record(
            trace_id=self.trace, span_id=self.root, name=f"invoke_agent {self.d.name}-agent",
            start_ns=BASE_NS + int(self.trace, 16) * 10**10 - 10**10, end_ns=self.clock + 1000,
            attributes={sc.OPERATION: sc.OP_AGENT, sc.AGENT_NAME: f"{self.d.name}-agent",
                        sc.RUN_ID: self.run_id, sc.INPUT: request},
        )  # fmt: skip
        return [root, *self.records, outcome_record(self.run_id, time_ns=self.clock + 2000,
                                                    success=success)]  # fmt: skip


def _record(d: Domain, rng: random.Random, rid: str, labels: list[str]) -> dict[str, Any]:
    pool = NAMES if d is SHOP else CITIES
    elements = []
    for label in labels or rng.sample(pool, rng.randint(2, 4)):
        element = {d.element_id: str(rng.randrange(10**9, 10**10)), d.label: label}
        element["price" if d is SHOP else "fare"] = round(rng.uniform(10, 900), 2)
        elements.append(element)
    return {d.record_arg: rid, "status": "confirmed", d.list_key: elements}


def write_agent(home: Path, d: Domain, *, succeeded: int = 24, wrong: int = 9, seed: int = 0):
    """The agent's runs in `home`'s spool; returns the trace ids of the wrong-list runs."""
    rng = random.Random(f"{d.name}:{seed}")
    kinds = ["ok"] * succeeded + ["wrong"] * wrong
    rng.shuffle(kinds)
    records: list[dict[str, Any]] = []
    truth: set[str] = set()
    for i, kind in enumerate(kinds):
        run = _Run(d, i)
        rid = f"#{d.name[0].upper()}{rng.randrange(10**6, 10**7)}"
        other = f"#{d.name[0].upper()}{rng.randrange(10**6, 10**7)}"
        mine = _record(d, rng, rid, [])
        mine["previous"] = other  # the agent reads it too, in every run
        labels = [e[d.label] for e in mine[d.list_key]]
        theirs = _record(d, rng, other, labels[:1] + [n for n in NAMES if n not in labels][:1])
        if d.relation == "subset":
            picked = rng.sample(mine[d.list_key], rng.randint(1, len(labels) - 1))
            said = " and the ".join(e[d.label] for e in picked)
            request = f"Hi, please return the {said} from order {rid}."
        else:
            picked = list(mine[d.list_key])
            request = f"Hi, please move every flight of booking {rid} to next Monday."
        run.chat("Let me look that up.", request)
        run.tool(d.read, {d.record_arg: rid}, mine)
        run.tool(d.read, {d.record_arg: other}, theirs)
        ids = [e[d.element_id] for e in picked]
        if kind == "wrong":
            truth.add(run.trace)
            if d.relation == "subset":  # the same name, from the other record
                rest = [e[d.element_id] for e in mine[d.list_key] if e not in picked]
                ids = [theirs[d.list_key][0][d.element_id], *rest[:1]]
            else:  # one segment dropped
                ids = ids[:-1]
        run.tool(d.write, {d.record_arg: rid, d.list_arg: ids}, {"status": "done"})
        run.chat("Done.", request)
        records += run.close(request, kind == "ok")
    write_spool_file(home, records, f"{d.name}-agent-{seed}")
    return truth


@dataclass
class Built:
    domain: Domain
    home: Path
    truth: set[str]
    gap: Gap
    env: Environment


def analyze_lists(home: Path, **options: Any) -> Any:
    """`analyze` without `wrong_choice`: in the shop's wrong runs one element also comes from a
    record the user did not name, so `wrong_choice` flags 8 of the 9 on the same calls and
    selection keeps it, `wrong_list` folded in (`test_wrong_choice_keeps_the_wrong_list_as_its_
    symptom`); the family under test here is the one of `wrong_list` gaps."""
    detectors = [x for x in default_detectors() if x.name != WRONG_CHOICE]
    return analyze(home, embedder=HashEmbedder(home / "cache"), detectors=detectors, **options)


def _build(home: Path, d: Domain) -> Built:
    truth = write_agent(home, d)
    result = analyze_lists(home)
    [gap] = [g for g in result.gaps if g.key == f"{WRONG_LIST}:{d.write}.{d.list_arg}"]
    spec = build_spec(gap, catalog_from_store(home), conventions_from_store(home))
    return Built(d, home, truth, gap, family_for_gap(gap)(spec))


@pytest.fixture(scope="module", params=[SHOP, AIRLINE], ids=lambda d: d.name)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    return _build(tmp_path_factory.mktemp(request.param.name), request.param)


def _domain(b: Built) -> Domain:
    return b.domain


def test_the_rule_reaches_the_gap(built: Built):
    d = _domain(built)
    with Store(built.home) as store:
        successful = {r.trace_id for r in load_runs(store) if r.success}
    [rule] = built.gap.rules
    assert (rule.kind, rule.tool, rule.argument, rule.relation) == (
        "list", d.write, d.list_arg, d.relation)  # fmt: skip
    assert (rule.read_tool, rule.path) == (d.read, f"{d.list_key}[*].{d.element_id}")
    assert rule.support == 24 and rule.confidence == 1.0 and rule.failed_runs == 9
    assert set(rule.evidence_runs) <= successful and len(rule.evidence_runs) == 10
    assert list(rule.evidence_runs) == sorted(rule.evidence_runs)
    assert {m.trace_id for m in built.gap.members} == built.truth


def test_the_environment_enforces_the_mined_rule_and_passes_validity(built: Built):
    env = built.env
    assert isinstance(env, ListSelectionEnv) and env.family == "list_selection"
    assert [MinedRule.from_dict(r) for r in env.spec.extra["rules"]] == list(built.gap.rules)
    report = check_environment(env, 50)
    assert report.ok, report.failures
    fidelity = pytest.importorskip("tracegym.synthesis.fidelity")
    checked = fidelity.check_fidelity(env, n_seeds=50)
    assert checked.ok, [i.to_dict() for i in checked.issues[:3]]


def _target(task: Any) -> str:
    [target] = task.meta["list"]["expected"]  # one record at the default knobs
    return target


def _list_call(oracle: list[Action], tool: str) -> Action:
    return next(a for a in oracle if a.get("name") == tool)


def _with_list(oracle: list[Action], tool: str, arg: str, value: list[str]) -> list[Action]:
    out = []
    for action in oracle:
        if action.get("name") == tool:
            action = {**action, "arguments": {**action["arguments"], arg: value}}
        out.append(action)
    return out


def test_the_verifier_wants_exactly_the_elements_asked_for(built: Built):
    d, env = _domain(built), built.env
    for seed in range(20):
        task = env.make_task(seed)
        assert run_actions(env, seed, task.oracle)[1].passed
        expected = _list_call(task.oracle, d.write)["arguments"][d.list_arg]
        record = task.state.entities[_target(task)]
        every = [e[d.element_id] for e in record[d.list_key]]
        # any order, and as loosely written as the detector compares them
        shuffled = list(reversed([v.upper() for v in expected]))
        assert run_actions(env, seed, _with_list(task.oracle, d.write, d.list_arg, shuffled))[
            1
        ].passed
        wrong = [every, expected[:-1], expected + expected[:1]]
        if d.relation == "equal":
            wrong = wrong[1:]
        else:
            assert len(every) > len(expected)  # passing all elements is not what was asked
        others = [e for eid, r in task.state.entities.items() if eid != _target(task)
                  for e in r[d.list_key]]  # fmt: skip
        wrong.append([*expected[:-1], others[0][d.element_id]])  # one from another record
        for value in wrong:
            _, verdict = run_actions(env, seed, _with_list(task.oracle, d.write, d.list_arg, value))
            assert not verdict.passed and any(d.list_arg in r for r in verdict.reasons)


def test_the_other_record_holds_elements_of_the_same_names(built: Built):
    d, env = _domain(built), built.env
    if d.relation == "equal":
        pytest.skip("the airline's elements are not named by the user")
    similar = 0
    for seed in range(20):
        task = env.make_task(seed)
        target = _target(task)
        asked = [
            e[d.label]
            for e in task.state.entities[target][d.list_key]
            if e[d.element_id] in task.meta["list"]["expected"][_target(task)]
        ]
        assert all(name in task.instruction for name in asked)
        others = {e[d.label] for eid, r in task.state.entities.items() if eid != target
                  for e in r[d.list_key]}  # fmt: skip
        similar += bool(others & set(asked))
        # the other record is there to be found: the field the agent read its id from links it
        assert task.state.entities[target]["previous"] in task.state.entities
    assert similar == 20


def test_the_request_is_worded_as_the_users_worded_theirs(built: Built):
    d, env = _domain(built), built.env
    opening = {SHOP: "Hi, please return the ", AIRLINE: "Hi, please move every flight of booking "}
    for seed in range(10):
        task = env.make_task(seed)
        target = _target(task)
        assert task.instruction.startswith(opening[d]) and target in task.instruction
    # without the users' words, the chain's own phrasing
    plain = type(env)(replace(env.spec, extra={**env.spec.extra, "wording": None}))
    assert not plain.make_task(0).instruction.startswith(opening[d])
    assert run_actions(plain, 0, plain.oracle(0))[1].passed


def test_the_prompt_is_the_agents_own_and_names_no_element(built: Built):
    d, env = _domain(built), built.env
    for seed in range(20):
        task = env.make_task(seed)
        assert task.system_prompt.startswith(d.prompt)
        record = task.state.entities[_target(task)]
        for element in record[d.list_key]:
            assert element[d.element_id] not in task.system_prompt
            assert element[d.label] not in task.system_prompt
        assert not any(v in task.instruction for v in task.meta["list"]["expected"][_target(task)])


def test_several_records_each_with_its_own_list(built: Built):
    d, env = _domain(built), built.env
    harder = type(env)(env.spec, targets=2, records=1)
    for seed in range(10):
        task = harder.make_task(seed)
        (a, first), (b, second) = task.meta["list"]["expected"].items()
        assert a in task.instruction and b in task.instruction
        assert run_actions(harder, seed, task.oracle)[1].passed
        swapped = []
        for action in task.oracle:
            if action.get("name") == d.write:
                mine = action["arguments"][d.record_arg]
                lists = {a: second, b: first}
                action = {**action, "arguments": {**action["arguments"], d.list_arg: lists[mine]}}
            swapped.append(action)
        _, verdict = run_actions(harder, seed, swapped)
        assert not verdict.passed and sum(d.list_arg in r for r in verdict.reasons) == 2
        one = [x for x in task.oracle if x.get("arguments", {}).get(d.record_arg) != b]
        _, verdict = run_actions(harder, seed, one)
        assert not verdict.passed and any(b in r for r in verdict.reasons)


def test_a_broken_list_world_fails_fidelity(built: Built):
    fidelity = pytest.importorskip("tracegym.synthesis.fidelity")
    d, env = _domain(built), built.env

    class Telling(ListSelectionEnv):  # the prompt states the list
        def generate(self, seed: int) -> Any:
            task = super().generate(seed)
            task.system_prompt += f" Pass {d.list_arg} {' and '.join(_expected(task))}."
            return task

    class Misshapen(ListSelectionEnv):  # an element id the traces never showed the like of
        def generate(self, seed: int) -> Any:
            task = super().generate(seed)
            task.state.entities[_target(task)][d.list_key][0][d.element_id] = "x-1"
            return task

    assert fidelity.check_fidelity(env, n_seeds=10).ok
    told = fidelity.check_fidelity(Telling(env.spec), n_seeds=10)
    assert not told.ok and any(i.where == "system prompt" for i in told.issues)
    bent = fidelity.check_fidelity(Misshapen(env.spec), n_seeds=10)
    assert not bent.ok and any(f"{d.list_key}[0].{d.element_id}" in i.where for i in bent.issues)


def _expected(task: Any) -> list[str]:
    return task.meta["list"]["expected"][_target(task)]


def test_the_ladder_stays_solvable(built: Built):
    env = built.env
    for level in env.levels():
        harder = type(env)(env.spec, **level)
        for seed in range(5):
            assert run_actions(harder, seed, harder.oracle(seed))[1].passed, level


def test_no_mined_rule_no_environment(built: Built):
    catalog = catalog_from_store(built.home)
    with pytest.raises(NotSynthesizable, match="no list rule was mined"):
        ListSelectionEnv.build_spec(replace(built.gap, rules=()), catalog)
    [rule] = built.gap.rules
    elsewhere = replace(rule, read_tool="lookup_something_else")
    with pytest.raises(NotSynthesizable, match="lookup_something_else not in the recorded tools"):
        ListSelectionEnv.build_spec(replace(built.gap, rules=(elsewhere,)), catalog)
    named = replace(rule, relation="named", read_tool=None, path=None)
    with pytest.raises(NotSynthesizable, match="what the user named"):
        ListSelectionEnv.build_spec(replace(built.gap, rules=(named,)), catalog)
    unrecorded = replace(rule, path="refunds[*].refund_id")
    with pytest.raises(NotSynthesizable, match="no recorded list at refunds"):
        ListSelectionEnv.build_spec(replace(built.gap, rules=(unrecorded,)), catalog)


# Real data --------------------------------------------------------------------------------------
REAL = {
    "grok3": DATA / "tau-bench-grok3-retail" / "grok-3-retail.json",
    "agentrx": DATA / "agentrx-tau-retail" / "tau_dataset_full.json",
}


@dataclass
class RealSet:
    home: Path
    runs: list[Any]
    detector: WrongListArgument


@pytest.fixture(scope="module", params=sorted(REAL))
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RealSet:
    path = REAL[request.param]
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    from tracegym.store.importers import import_path

    home = tmp_path_factory.mktemp(request.param)
    import_path("tau-bench", path, home)
    with Store(home) as store:
        runs = load_runs(store)
    return RealSet(home, runs, WrongListArgument().fit(runs))


def _valid(env: Environment) -> str | None:
    """Validity (fidelity included) passes; where only fidelity fails, on none of the list's
    own paths, the shared world's records are at fault, not this family's: the reason, for an
    xfail."""
    report = check_environment(env, 50)
    failing = [c.name for c in report.checks if not c.ok]
    if failing == ["fidelity"]:
        from tracegym.synthesis.fidelity import check_fidelity

        issues = check_fidelity(env, n_seeds=50).issues
        plan = env.spec.extra["list"]
        lists = [p.split("[")[0] for p in (plan["list_path"], plan["mirror"]) if p]
        mine = [i for i in issues if any(f".{name}" in i.where for name in lists)]
        assert not mine, [i.to_dict() for i in mine[:3]]
        return f"the shared world's own records break fidelity: {issues[0].to_dict()}"
    assert report.ok, report.failures
    return None


def test_real_sets_mine_no_whole_list_rule_from_lists_of_one(real: RealSet):
    """The exchanges of these sets pass one fulfillment or one item: read as "the whole list"
    they made wrong_list findings of every exchange of part of a longer order. Lists of one
    cannot tell a whole from a part, so the rule mined is "a part of the order's items" and the
    failed runs break none."""
    relations = {rule.relation for rule in real.detector.mined_.values()}
    assert relations == {"subset"}
    assert [f for run in real.runs for f in real.detector.detect(run)] == []


def test_every_list_rule_mined_on_real_runs_makes_a_valid_environment(real: RealSet):
    """The other rules wrong_list mines there (subsets of an order's items, named by the item's
    name) have no finding, so no gap: forced, to exercise the subset path on real shapes."""
    catalog = catalog_from_store(real.home)
    relations, reasons = set(), []
    for (tool, arg), rule in sorted(real.detector.mined_.items()):
        gap = Gap(id=f"gap-{tool}", name=tool, key=f"{WRONG_LIST}:{tool}.{arg}", kind="finding",
                  detector=WRONG_LIST, tools=(tool,), rules=(rule,))  # fmt: skip
        env = ListSelectionEnv(ListSelectionEnv.build_spec(gap, catalog))
        relations.add(rule.relation)
        reasons += filter(None, [_valid(env)])
    assert relations == {"subset"}
    if reasons:
        pytest.xfail(reasons[0])


def test_wrong_choice_keeps_the_wrong_list_as_its_symptom(tmp_path: Path):
    """With every detector, the shop's wrong runs give one gap on the same calls: wrong_choice's
    (it also names the element picked from the other record), with wrong_list's key among its
    symptoms, so the wrong list is still shown; the AIRLINE's dropped segment is wrong_list's."""
    write_agent(tmp_path, SHOP)
    [gap] = analyze(tmp_path, embedder=HashEmbedder(tmp_path / "cache")).gaps
    assert gap.key == f"{WRONG_CHOICE}:{SHOP.write}.{SHOP.list_arg}"
    assert f"{WRONG_LIST}:{SHOP.write}.{SHOP.list_arg}" in {s.key for s in gap.symptoms}
