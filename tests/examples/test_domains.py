"""The bundled domains: seeded tasks, oracles that pass their own verifiers, tools that refuse a
rule break, disjoint seed ranges, and a shop descriptor that is examples/shop.py itself."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from tracegym.examples import clinic, shop
from tracegym.examples.domains import CLINIC, DOMAINS, SHOP, Domain, domain_named

UNTRACED = {"shop": shop.Shop, "clinic": clinic.Clinic}


@pytest.fixture(params=sorted(DOMAINS))
def domain(request: pytest.FixtureRequest) -> Domain:
    return DOMAINS[request.param]


def test_registry_names_both_domains():
    assert set(DOMAINS) == {"shop", "clinic"}
    assert domain_named("clinic") is CLINIC
    with pytest.raises(ValueError, match="known: shop, clinic"):
        domain_named("bank")


def test_tasks_are_seeded(domain: Domain):
    first = [domain.make_task(s) for s in range(50)]
    again = [domain.make_task(s) for s in range(50)]
    assert [vars(t) for t in first] == [vars(t) for t in again]
    assert len({t.request for t in first}) == 50
    assert {t.kind for t in first} == set(domain.kinds)
    assert all(t.task_id.startswith(f"{domain.name}:") and t.seed == i
               for i, t in enumerate(first))  # fmt: skip


def test_weights_and_kinds_choose_the_kind(domain: Domain):
    only = domain.kinds[2]
    assert {domain.make_task(s, (only,)).kind for s in range(30)} == {only}
    weights = [1.0 if k == domain.kinds[0] else 0.0 for k in domain.kinds]
    assert {domain.make_task(s, domain.kinds, weights).kind for s in range(30)} == {domain.kinds[0]}


@pytest.mark.parametrize("kind_index", range(4))
def test_the_oracle_passes_its_own_verifier(domain: Domain, kind_index: int):
    kind = domain.kinds[kind_index]
    for seed in range(200):
        task = domain.make_task(seed, (kind,))
        tools = UNTRACED[domain.name](task)
        for name, arguments in domain.oracle_actions(task):
            assert not tools.call(name, arguments).startswith("Error"), (seed, name)
        verdict = domain.verify(task, tools, domain.oracle_answer(task))
        assert verdict.passed and verdict.reward == 1.0, (seed, verdict.reasons)


def test_demonstrations_are_the_oracle_episode(domain: Domain):
    task = domain.make_task(3)
    messages = domain.demonstration(task)
    assert messages[0] == {"role": "user", "content": task.request}
    calls = [m["tool_calls"][0]["function"] for m in messages if m.get("tool_calls")]
    assert [(c["name"], c["arguments"]) for c in calls] == domain.oracle_actions(task)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert all(json.loads(r) for r in results)
    assert messages[-1] == {"role": "assistant", "content": domain.oracle_answer(task)}


def test_seed_ranges_are_disjoint(domain: Domain):
    ranges = sorted((domain.dev_seeds, domain.demo_seeds, domain.heldout_seeds))
    for (_, stop), (start, _) in itertools.pairwise(ranges):
        assert stop <= start
    dev = {t.task_id for t in domain.tasks(domain.dev_seeds, 100)}
    held = {t.task_id for t in domain.tasks(domain.heldout_seeds, 100)}
    assert not dev & held


def test_a_descriptor_refuses_overlapping_seeds_or_a_partial_mix():
    fields = dict(vars(CLINIC))
    with pytest.raises(ValueError, match="overlap"):
        Domain(**{**fields, "heldout_seeds": (50_000, 150_000)})
    with pytest.raises(ValueError, match="every kind"):
        Domain(**{**fields, "base_mix": {"when": 1.0}})


def test_the_schemas_name_the_tools_and_the_base_mix_every_kind(domain: Domain):
    task = domain.make_task(0)
    tools = domain.tools_for(task)
    assert all(callable(getattr(tools, name)) for name in domain.tool_names)
    assert set(domain.base_mix) == set(domain.kinds)
    assert sum(domain.base_mix.values()) == pytest.approx(1.0)


def test_the_shop_descriptor_is_shop_py():
    assert SHOP.kinds == shop.KINDS and SHOP.rules == shop.RULES
    assert list(SHOP.tool_schemas) == shop.TOOL_SCHEMAS
    assert (SHOP.dev_seeds, SHOP.demo_seeds, SHOP.heldout_seeds) == (
        shop.DEV_SEEDS, shop.DEMO_SEEDS, shop.HELDOUT_SEEDS)  # fmt: skip
    for seed in range(100):
        task = SHOP.make_task(seed)
        assert vars(task) == vars(shop.make_task(seed))
        assert SHOP.demonstration(task) == shop.demonstration(task)
        assert SHOP.oracle_actions(task) == shop.oracle_actions(task)
    assert isinstance(SHOP.tools_for(shop.make_task(1)), shop.ShopTools)
    # the demo's base mix as jobs/demo.py has it: status and cancel common, the others rare
    assert dict(SHOP.base_mix) == {"status": 0.4, "cancel": 0.4, "refund": 0.1, "address": 0.1}


def test_the_clinic_differs_from_the_shop():
    assert not set(CLINIC.tool_names) & set(SHOP.tool_names)
    arguments = {a for t in CLINIC.tool_schemas for a in t["function"]["parameters"]["properties"]}
    shop_arguments = {a for t in SHOP.tool_schemas
                      for a in t["function"]["parameters"]["properties"]}  # fmt: skip
    assert not arguments & shop_arguments


def test_the_customer_key_finds_who_is_asking(domain: Domain):
    for seed in range(20):
        task = domain.make_task(seed)
        found = re.findall(domain.customer_key, task.request)
        assert found == [getattr(task, "email", None) or getattr(task, "phone", None)]
