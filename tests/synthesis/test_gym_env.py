"""tracegym environments as real `gymnasium.Env`s: gymnasium's own `check_env` passes on one
environment of every family, an oracle episode sent through the wrapper as JSON text earns the
verifier's reward, and registered environments load with `gymnasium.make("tracegym/<env_id>")`."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

gym = pytest.importorskip("gymnasium", reason="the gym extra (gymnasium) is not installed")
from gymnasium.utils.env_checker import check_env  # noqa: E402
from tracegym.synthesis import registry  # noqa: E402
from tracegym.synthesis.base import Environment, run_actions  # noqa: E402
from tracegym.synthesis.conventions import Conventions, conventions_from_store  # noqa: E402
from tracegym.synthesis.families import FAMILIES, build_spec  # noqa: E402
from tracegym.synthesis.fixtures import gap, shop_traces  # noqa: E402
from tracegym.synthesis.gym_env import gym_class, register_envs, to_gymnasium  # noqa: E402
from tracegym.synthesis.spec import catalog_from_store, infer_catalog  # noqa: E402

pytestmark = pytest.mark.timeout(180)

ACTION = "cancel_pending_order"
CHAIN = {  # detector -> family, every chain family the shop fixture gives
    "wrong_tool_order": "tool_order",
    "ungrounded_argument": "grounding",
    "poisoned_memory": "memory_hygiene",
    "budget_waste": "budget",
    "premature_finish": "verify_before_finish",
    "invalid_invocation": "exact_arguments",
}
MINED = ("policy_action", "amount", "list_selection", "record_choice")  # from mined evidence


@pytest.fixture(scope="module")
def catalog():
    return infer_catalog(shop_traces(40))


def chain_env(catalog, detector: str) -> Environment:
    spec = build_spec(gap(detector, [ACTION]), catalog)
    return FAMILIES[spec.family](spec)


def requested_action_env() -> Environment:
    from tracegym.tests.synthesis.test_requested_action import FIND, UPDATE, _catalog, _gap

    conventions = Conventions(
        runs=10, system_prompt="Shop rules.", tools=[FIND, UPDATE], opening=["find_user"]
    )
    return registry.from_spec(build_spec(_gap(), _catalog(), conventions))


def mined_env(family: str, home: Path) -> Environment:
    """An environment of a family built from a mined rule: planted runs (or, for lists, the
    small agent tests/synthesis/test_family_list.py writes), analysed, the gap's spec built."""
    from tracegym.analysis.pipeline import analyze
    from tracegym.tests.fixtures.hash_embedder import HashEmbedder

    if family == "record_choice":  # a wrong_choice gap forced from a planted seed
        from tracegym.tests.synthesis.test_family_record_choice import planted_env

        return planted_env(home)
    if family == "list_selection":
        from tracegym.tests.synthesis.test_family_list import SHOP, analyze_lists, write_agent

        write_agent(home, SHOP)
        found = [g for g in analyze_lists(home, write=False).gaps if g.detector == "wrong_list"]
        assert found, "no wrong_list gap"
        env = registry.from_spec(
            build_spec(found[0], catalog_from_store(home), conventions_from_store(home))
        )
        assert env.family == family
        return env
    else:
        from tracegym.tests.fixtures import planted as pl

        pl.generate(home, 8 if family == "policy_action" else 9)
        detector = "forbidden_action" if family == "policy_action" else "wrong_amount"
    result = analyze(home, embedder=HashEmbedder(home / "cache"), write=False)
    found = [g for g in result.gaps if g.detector == detector]
    assert found, f"no {detector} gap in {[g.detector for g in result.gaps]}"
    spec = build_spec(found[0], catalog_from_store(home), conventions_from_store(home))
    env = registry.from_spec(spec)
    assert env.family == family
    return env


def oracle_through_gym(env: Environment, seed: int) -> tuple[float, dict]:
    genv = to_gymnasium(env)
    observation, info = genv.reset(seed=seed)
    assert json.loads(observation)["content"] == env.make_task(seed).instruction
    assert info["seed"] == seed and info["tools"] == env.tool_schemas()
    reward, terminated, truncated = 0.0, False, False
    for action in env.oracle(seed):
        assert not (terminated or truncated)
        observation, reward, terminated, truncated, info = genv.step(json.dumps(action))
        assert observation in genv.observation_space
    assert terminated and not truncated
    return reward, info


def checked(genv) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no spec: alternative render modes not tested"
        check_env(genv)


def assert_gym_env(env: Environment) -> None:
    genv = to_gymnasium(env)
    assert isinstance(genv, gym.Env) and genv.tracegym_env is env
    checked(genv)
    for seed in (0, 3):
        reward, info = oracle_through_gym(env, seed)
        _, direct = run_actions(env, seed, env.oracle(seed))
        assert reward == info["verdict"]["reward"] == direct.reward == 1.0
        assert info["passed"]


@pytest.mark.parametrize("detector", sorted(CHAIN))
def test_check_env_and_oracle_on_every_chain_family(catalog, detector):
    env = chain_env(catalog, detector)
    assert env.family == CHAIN[detector]
    assert_gym_env(env)


def test_check_env_and_oracle_on_requested_action():
    env = requested_action_env()
    assert env.family == "requested_action"
    assert_gym_env(env)


@pytest.mark.parametrize("family", MINED)
def test_check_env_and_oracle_on_the_mined_rule_families(family, tmp_path):
    assert_gym_env(mined_env(family, tmp_path))


def test_every_family_is_covered():
    assert set(FAMILIES) == {*CHAIN.values(), "requested_action", *MINED}


def test_a_wrong_episode_gets_the_verifiers_lower_reward(catalog):
    env = chain_env(catalog, "wrong_tool_order")
    genv = to_gymnasium(env)
    genv.reset(seed=4)
    oracle = env.oracle(4)
    acting = [a for a in oracle if a.get("name") != "get_order_details"]  # skip the lookup
    for action in acting[:-1]:
        _, reward, terminated, _, info = genv.step(action)  # dicts are accepted too
        assert reward == 0.0 and not terminated
    _, reward, terminated, _, info = genv.step(oracle[-1]["answer"])  # plain text
    _, direct = run_actions(env, 4, acting)
    assert terminated and reward == direct.reward == info["verdict"]["reward"] < 1.0
    assert any("did not come before" in r for r in info["verdict"]["reasons"])


def test_non_ascii_text_round_trips_inside_the_space(catalog):
    env = chain_env(catalog, "wrong_tool_order")
    genv = to_gymnasium(env)
    genv.reset(seed=1)
    observation, *_ = genv.step(json.dumps({"name": "search_products", "arguments": {"q": "é"}}))
    assert observation in genv.observation_space
    assert json.loads(observation)["role"] == "tool"
    _, _, terminated, _, _ = genv.step("Erledigt – café ✓")
    assert terminated and env.episode.answer == "Erledigt – café ✓"


def test_seeding_follows_gymnasiums_contract(catalog):
    env = chain_env(catalog, "wrong_tool_order")
    genv = to_gymnasium(env)
    _, info = genv.reset(seed=11)
    assert info["seed"] == 11  # the same task as tracegym's env.reset(seed=11)
    drawn = [genv.reset()[1]["seed"] for _ in range(3)]
    genv.reset(seed=11)
    assert [genv.reset()[1]["seed"] for _ in range(3)] == drawn
    start, stop = env.spec.train_seeds
    assert all(start <= s < stop for s in drawn) and len(set(drawn)) == 3
    start, stop = env.spec.heldout_seeds
    _, info = genv.reset(options={"split": "heldout"})
    assert start <= info["seed"] < stop
    with pytest.raises(ValueError, match="split"):
        genv.reset(options={"split": "test"})


def test_render_ansi_shows_the_transcript(catalog):
    env = chain_env(catalog, "wrong_tool_order")
    genv = to_gymnasium(env, render_mode="ansi")
    genv.reset(seed=2)
    first = env.oracle(2)[0]
    genv.step(first)
    text = genv.render()
    assert text.startswith("system: ") and f"assistant: {first['name']}(" in text
    assert to_gymnasium(env).render() is None
    with pytest.raises(ValueError, match="render_mode"):
        to_gymnasium(env, render_mode="human")


def test_registered_environments_load_with_gymnasium_make(catalog, tmp_path):
    env = chain_env(catalog, "premature_finish")
    registry.register(tmp_path, env, n_train=3, n_heldout=3, validity_seeds=20)
    ids = register_envs(tmp_path)
    assert ids == [f"tracegym/{env.env_id}"]
    assert register_envs(tmp_path) == ids  # again: nothing changes
    made = gym.make(ids[0], render_mode="ansi")
    assert made.unwrapped.spec.id == ids[0]
    check_env(made.unwrapped)  # with a spec: the render modes are checked too
    observation, info = made.reset(seed=5)
    assert json.loads(observation)["content"] == env.make_task(5).instruction
    for action in env.oracle(5):
        observation, reward, terminated, truncated, info = made.step(json.dumps(action))
    assert terminated and not truncated and reward == 1.0 and info["passed"]
    made.close()


def test_without_gymnasium_the_error_names_the_extra(catalog, monkeypatch):
    env = chain_env(catalog, "wrong_tool_order")
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    gym_class.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"tracegym\[gym\]"):
            to_gymnasium(env)
    finally:
        monkeypatch.undo()
        gym_class.cache_clear()
    assert isinstance(to_gymnasium(env), gym.Env)


def test_a_wrapped_environment_pickles_for_subprocess_vector_envs(catalog):
    import pickle

    genv = to_gymnasium(chain_env(catalog, "wrong_tool_order"))
    genv.reset(seed=6)
    again = pickle.loads(pickle.dumps(genv))
    assert isinstance(again, gym_class()) and again.tracegym_env.task.seed == 6
    _, _, terminated, _, info = again.step(json.dumps(again.tracegym_env.oracle(6)[-1]))
    assert terminated and info["seed"] == 6


@pytest.mark.parametrize("vector", ["sync", "async"])
def test_vector_envs_run_the_wrapped_environments(catalog, vector):
    spec = chain_env(catalog, "wrong_tool_order").spec

    def make():
        return gym.wrappers.RecordEpisodeStatistics(to_gymnasium(FAMILIES[spec.family](spec)))

    if vector == "sync":
        envs = gym.vector.SyncVectorEnv([make, make])
    else:  # a Text space's shared-memory buffer pads strings: pass them by pipe
        envs = gym.vector.AsyncVectorEnv([make, make], shared_memory=False)
    try:
        observations, info = envs.reset(seed=[1, 2])
        task = FAMILIES[spec.family](spec).make_task
        assert [json.loads(o)["content"] for o in observations] == [
            task(1).instruction,
            task(2).instruction,
        ]
        _, rewards, terminated, _, info = envs.step(("done", "done"))
        assert terminated.all() and list(info["episode"]["r"]) == list(rewards)
        assert all(0 < r < 1 for r in rewards)  # answering "done" at once is never a pass
    finally:
        envs.close()
