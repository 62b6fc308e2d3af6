"""The `policy_action` family: environments built only from the state rules the diagnosis mined
(`Gap.rules` from forbidden_action / missed_action), on a generated agent with a planted
policy-forbidden cause and on the shared AgentRx tau-retail runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tracegym.analysis import detector_names as dn
from tracegym.analysis.gap import Gap, MinedRule
from tracegym.analysis.pipeline import analyze
from tracegym.benchmarks.planted_causes import ExactSignatures
from tracegym.synthesis.base import Environment, contains_token, run_actions
from tracegym.synthesis.conventions import conventions_from_store
from tracegym.synthesis.families import DETECTOR_FAMILY, build_spec
from tracegym.synthesis.families.policy_action import PolicyActionEnv, catalog_path
from tracegym.synthesis.registry import from_spec
from tracegym.synthesis.spec import Catalog, catalog_from_store
from tracegym.synthesis.validity import check_environment
from tracegym.synthesis.world import NotSynthesizable, get_all, path_tokens
from tracegym.tests.fixtures import planted as pl

AGENTRX = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "agentrx-tau-retail"
PLANTED_SEED = 8  # a cancel forbidden while the record's status is one the policy excludes


class World:
    """A store, its forbidden_action gap, catalog and the environment built from them."""

    def __init__(self, home: Path, gap: Gap) -> None:
        self.home = home
        self.gap = gap
        self.catalog: Catalog = catalog_from_store(home)
        self.conventions = conventions_from_store(home)
        self.spec = build_spec(gap, self.catalog, self.conventions)
        self.env: Environment = from_spec(self.spec)


def _forbidden_gap(home: Path) -> Gap:
    result = analyze(home, embedder=ExactSignatures(), write=False)
    kept = [g for g in result.gaps if g.detector == dn.FORBIDDEN_ACTION]
    if kept:
        return kept[0]
    # AgentRx keeps no gap at the default thresholds (2 failed runs): the gap is built from the
    # forbidden_action candidate's findings exactly as analysis describes a kept one
    from tracegym.analysis.gap_selection import describe, gap_name

    prefix = f"{dn.FORBIDDEN_ACTION}:"  # the per-tool candidate, not the whole detector's
    scored = next(s for s in result.scored if s.candidate.key.startswith(prefix))
    by_trace = {r.trace_id: r for r in result.runs}
    successes = [r for r in result.runs if r.success is True]
    return describe(scored, gap_name(scored.candidate), by_trace, successes, {})


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> World:
    home = tmp_path_factory.mktemp("planted-policy")
    truth = pl.generate(home, PLANTED_SEED)
    assert pl.POLICY_FORBIDDEN in truth.causes
    return World(home, _forbidden_gap(home))


@pytest.fixture(scope="module")
def agentrx(tmp_path_factory: pytest.TempPathFactory) -> World:
    source = AGENTRX / "tau_dataset_full.json"
    if not source.is_file():
        pytest.skip(f"shared data absent: {source} (AgentRx tau-retail)")
    from tracegym.store.importers import import_path

    home = tmp_path_factory.mktemp("agentrx-policy")
    import_path("tau-bench", source, home)
    return World(home, _forbidden_gap(home))


@pytest.fixture(params=["planted", "agentrx"])
def world(request: pytest.FixtureRequest) -> World:
    return request.getfixturevalue(request.param)


def _state(env: PolicyActionEnv, record: dict[str, Any], path: str) -> list[Any]:
    return get_all(record, path_tokens(catalog_path(path)))


def test_the_family_serves_both_state_detectors():
    assert DETECTOR_FAMILY[dn.FORBIDDEN_ACTION] == "policy_action"
    assert DETECTOR_FAMILY[dn.MISSED_ACTION] == "policy_action"


def test_the_enforced_rule_is_the_gaps_mined_rule(world: World):
    gap, spec, env = world.gap, world.spec, world.env
    assert isinstance(env, PolicyActionEnv) and spec.family == "policy_action"
    assert gap.rules, "forbidden_action findings carry their mined rule"
    mined = [r.to_dict() for r in gap.rules]
    assert spec.extra["rules"] and all(r in mined for r in spec.extra["rules"])
    rule = MinedRule.from_dict(spec.extra["rules"][0])
    assert rule.evidence_runs and rule.support >= 3 and rule.failed_runs >= 1
    assert (spec.roles["action"], spec.roles["lookup"]) == (rule.tool, rule.read_tool)
    # the states shown: forbidden records hold a value the rule names, the others none of them;
    # every value shown is one the traces showed at that field
    observed = json.dumps(world.catalog.tools[rule.read_tool].result)
    forbidden_seen = allowed_seen = 0
    for seed in range(30):
        task = env.make_task(seed)
        for eid in task.meta["targets"]:
            values = _state(env, task.state.entities[eid], rule.path or "")
            shown = {str(v).casefold() for v in values}
            assert values and all(json.dumps(v) in observed for v in values)
            if eid in task.meta["forbidden"]:
                assert shown & set(rule.values)
                forbidden_seen += 1
            else:
                assert not shown & set(rule.values)
                allowed_seen += 1
    assert forbidden_seen and allowed_seen


def test_the_environment_passes_validity_and_fidelity(world: World):
    report = check_environment(world.env, 50)
    assert report.ok, report.failures
    assert {c.name for c in report.checks} >= {"oracle", "null", "random_tool", "all_tools"}
    if any(c.name == "fidelity" for c in report.checks):
        return
    fidelity = pytest.importorskip("tracegym.synthesis.fidelity")
    assert fidelity.check_fidelity(world.env, n_seeds=50).ok


def test_acting_regardless_of_the_state_fails_and_the_oracle_passes(world: World):
    env = world.env
    assert isinstance(env, PolicyActionEnv)
    r = env.roles
    with_forbidden = 0
    for seed in range(20):
        task = env.make_task(seed)
        _, verdict = run_actions(env, seed, task.oracle)
        assert verdict.passed, verdict.reasons
        if not task.meta["forbidden"]:
            continue
        with_forbidden += 1
        # look every record up and act on every one: what the failed runs did
        always = [a for a in task.oracle if "name" in a and a["name"] != r.action]
        always += list(task.meta["actions"].values())
        _, verdict = run_actions(env, seed, [*always, task.oracle[-1]])
        assert not verdict.passed
        assert any(c["name"] == "forbidden_call" and not c["ok"] for c in verdict.checks)
    assert with_forbidden >= 10
    # never acting fails the records that should have been acted on
    for seed in range(5):
        task = env.make_task(seed)
        if len(task.meta["forbidden"]) < len(task.meta["targets"]):
            reads = [a for a in task.oracle if a.get("name") != r.action]
            assert not run_actions(env, seed, reads)[1].passed


def test_the_state_must_be_looked_up(world: World):
    env = world.env
    assert isinstance(env, PolicyActionEnv)
    for seed in range(5):
        task = env.make_task(seed)
        blind = [a for a in task.oracle if a.get("name") != env.roles.lookup]
        _, verdict = run_actions(env, seed, blind)
        assert not verdict.passed


def test_neither_prompt_nor_request_states_the_rule(world: World):
    """Nothing the environment adds states the rule; the agent's own recorded instructions (the
    tau policy, recorded as the chats' system message) are the agent's and stay as they are."""
    env = world.env
    own = getattr(env, "conventions", None)
    recorded = getattr(own, "system_prompt", "") or ""
    for rule in map(MinedRule.from_dict, world.spec.extra["rules"]):
        for seed in range(20):
            task = env.make_task(seed)
            added = task.system_prompt.replace(recorded, "") if recorded else task.system_prompt
            for text in (added, task.instruction):
                assert rule.statement not in text
                assert not contains_token(text, rule.path or "")
                assert not any(contains_token(text, v) for v in rule.values)


def test_without_a_mined_rule_nothing_is_built(planted: World):
    gap, catalog = planted.gap, planted.catalog
    with pytest.raises(NotSynthesizable, match="no mined precondition or trigger rule"):
        build_spec(replace(gap, rules=()), catalog)
    rule = gap.rules[0]
    with pytest.raises(NotSynthesizable, match="no recorded write calls"):
        build_spec(replace(gap, rules=(replace(rule, tool="teleport_record"),)), catalog)
    with pytest.raises(NotSynthesizable, match="no field"):
        build_spec(replace(gap, rules=(replace(rule, path="colour_of_the_sky"),)), catalog)
    with pytest.raises(NotSynthesizable, match="never shows"):
        build_spec(replace(gap, rules=(replace(rule, values=("on the moon",)),)), catalog)


def test_a_threshold_rule_forbids_the_records_beyond_it(planted: World):
    """The planted store's date rule (a coincidence of its successful runs, kept as a mined
    rule): checked alone, forbidden records lie beyond the threshold, the others within."""
    from tracegym.analysis.detectors.precondition import ForbiddenAction
    from tracegym.analysis.detectors.state import date_value
    from tracegym.analysis.runs import load_runs
    from tracegym.store import Store

    dated = [r for r in planted.gap.rules if r.above is not None or r.below is not None]
    if not dated:  # the gap's findings name its state rule; a threshold is mined beside it
        tool = planted.gap.rules[0].tool
        with Store(planted.home) as store:
            mined = ForbiddenAction().fit(load_runs(store)).rules_
        dated = [p.to_rule() for p in mined
                 if p.tool == tool and (p.above is not None or p.below is not None)]  # fmt: skip
    if not dated:
        pytest.skip("this seed's gap mined no threshold")
    rule = dated[0]
    spec = build_spec(replace(planted.gap, rules=(rule,)), planted.catalog, planted.conventions)
    env = from_spec(spec)
    for seed in range(20):
        task = env.make_task(seed)
        for eid in task.meta["targets"]:
            (value,) = _state(env, task.state.entities[eid], rule.path or "")
            number = date_value(value) if isinstance(value, str) else float(value)
            assert number is not None
            beyond = (rule.above is not None and number > rule.above) or (
                rule.below is not None and number < rule.below
            )
            assert beyond == (eid in task.meta["forbidden"])
    assert check_environment(env, 30).ok


def test_a_trigger_rule_requires_the_action_in_its_state(planted: World):
    rule = planted.gap.rules[0]
    allowed = planted.spec.extra["policy_action"]["fields"][rule.path]["allowed"][0]
    trigger = MinedRule(
        detector=dn.MISSED_ACTION, kind="trigger", tool=rule.tool, read_tool=rule.read_tool,
        path=rule.path, values=(str(allowed).casefold(),), support=4, confidence=1.0,
        statement=f"after {rule.read_tool} shows {rule.path} = {allowed}, {rule.tool} is called",
    )  # fmt: skip
    gap = replace(planted.gap, detector=dn.MISSED_ACTION, rules=(trigger,))
    env = from_spec(build_spec(gap, planted.catalog, planted.conventions))
    assert isinstance(env, PolicyActionEnv)
    for seed in range(10):
        task = env.make_task(seed)
        assert not task.meta["forbidden"]
        for eid in task.meta["targets"]:
            assert _state(env, task.state.entities[eid], rule.path or "") == [allowed]
        reads = [a for a in task.oracle if a.get("name") != env.roles.action]
        assert not run_actions(env, seed, reads)[1].passed
    assert check_environment(env, 30).ok


def test_the_ladder_varies_records_and_forbidden_share(planted: World):
    env = planted.env
    seen = set()
    for level in env.levels():
        harder = from_spec(planted.spec, **level)
        task = harder.make_task(1)
        n = len(task.meta["targets"])
        assert n == level["targets"] >= 2
        assert len(task.meta["forbidden"]) == round(n * level["forbidden_share"])
        seen.add((n, len(task.meta["forbidden"])))
    assert len(seen) >= 4


def test_the_request_follows_the_users_recorded_wording(planted: World):
    """Where the gap kept its users' requests and two of them share a wording (the record and
    the customer aside), tasks ask in those words; else in the chain families' phrasing."""
    from tracegym.analysis.gap import GapRequest

    catalog = planted.catalog
    spec = planted.spec
    action, owner = spec.roles["action"], spec.roles["owner"]
    ids = [str(x) for x in catalog.tools[action].arguments[spec.roles["id_arg"]].examples[:2]]
    emails = [str(x) for x in catalog.tools[owner].arguments[spec.roles["owner_arg"]].examples[:2]]
    said = [
        f"Hi, this is {e}. Please sort out my record {i} today."
        for e, i in zip(emails, ids, strict=True)
    ]
    gap = replace(planted.gap, requests=tuple(GapRequest(t) for t in said))
    env = from_spec(build_spec(gap, catalog, planted.conventions))
    for seed in range(5):
        task = env.make_task(seed)
        assert task.instruction.startswith("Hi, this is ")
        assert task.instruction.endswith("Please sort out my record " + " and ".join(
            task.meta["targets"]) + " today.")  # fmt: skip
        assert any(f"this is {o}." in task.instruction for o in task.state.owners)
    assert check_environment(env, 30).ok
    # one recorded request is no wording: the chain phrasing stays
    alone = replace(planted.gap, requests=(GapRequest(said[0]),))
    env = from_spec(build_spec(alone, catalog, planted.conventions))
    assert "sort out" not in env.make_task(0).instruction
