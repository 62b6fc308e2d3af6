"""The users' wording learnt from their requests, and the `requested_action` environment built
from an `unserved_request` gap: a tool the agent never called, known from its definition only."""

from __future__ import annotations

import pytest
from tracegym.synthesis.base import run_actions
from tracegym.synthesis.conventions import Conventions
from tracegym.synthesis.families import RequestedActionEnv, build_spec, family_for_gap
from tracegym.synthesis.families.requested_action import RequestedRecordActionEnv
from tracegym.synthesis.registry import from_spec
from tracegym.synthesis.spec import infer_catalog
from tracegym.synthesis.validity import check_environment
from tracegym.synthesis.wording import WordingError, learn_wording
from tracegym.synthesis.world import NotSynthesizable

REQUESTS = [
    ("Hi, my email is ben94@mail.com. Please change my address to 53 Hill Ln.", "ben94@mail.com"),
    ("Hi, my email is ana75@mail.com. Please change my address to 88 Pine Rd.", "ana75@mail.com"),
    ("Hi, my email is gus8@mail.com. Please change my address to 33 Hill Ln.", "gus8@mail.com"),
]
UPDATE = {
    "type": "function",
    "function": {
        "name": "update_address",
        "description": "set the customer's address",
        "parameters": {
            "type": "object",
            "properties": {"user_id": {"type": "string"}, "address": {"type": "string"}},
            "required": ["user_id", "address"],
        },
    },
}
FIND = {
    "type": "function",
    "function": {
        "name": "find_user",
        "parameters": {
            "type": "object",
            "properties": {"email": {"type": "string"}},
            "required": ["email"],
        },
    },
}


def test_wording_keeps_the_fixed_words_and_collects_the_values():
    wording = learn_wording(REQUESTS)
    assert wording.slots == ["identity", "value"]
    assert wording.values == [["33 Hill Ln", "53 Hill Ln", "88 Pine Rd"]]  # no full stop, sorted
    assert learn_wording(REQUESTS[::-1]) == wording  # whatever order the runs came in
    assert wording.fill("kai1@mail.com", ["1 Oak St"]) == (
        "Hi, my email is kai1@mail.com. Please change my address to 1 Oak St."
    )


def test_wording_needs_requests_that_share_it():
    with pytest.raises(WordingError, match="at least 2"):
        learn_wording(REQUESTS[:1])
    with pytest.raises(WordingError):
        learn_wording([("Please change my address to 1 Oak St.", None),
                       ("What a lovely day it is", None)])  # fmt: skip


def _catalog(statuses=("pending",)):
    traces = [
        [{"tool": "find_user", "arguments": {"email": f"{name}{i}@mail.com"},
          "result": {"user_id": f"U{100 + i}", "orders": [f"O{1000 + i}"]}},
         {"tool": "get_order", "arguments": {"order_id": f"O{1000 + i}"},
          "result": {"order_id": f"O{1000 + i}", "status": statuses[i % len(statuses)]}}]
        for i, name in enumerate(["ana", "ben", "cleo", "dan", "eva", "finn"] * 3)
    ]  # fmt: skip
    return infer_catalog(traces)


def _gap(**extra):
    return {
        "id": "gap-addr", "detector": "unserved_request", "key": "unserved_request:update_address",
        "tools": ["update_address"],
        "requests": [{"text": t, "first_call": {"tool": "find_user", "arguments": {"email": e}}}
                     for t, e in REQUESTS],
        **extra,
    }  # fmt: skip


@pytest.fixture(scope="module")
def env():
    conventions = Conventions(runs=10, system_prompt="Shop rules.", tools=[FIND, UPDATE],
                              opening=["find_user"])  # fmt: skip
    assert family_for_gap(_gap()) is RequestedActionEnv
    return from_spec(build_spec(_gap(), _catalog(), conventions))


def test_the_environment_asks_in_the_users_words_for_a_tool_never_called(env):
    task = env.make_task(4)
    assert task.instruction.startswith("Hi, my email is ")
    assert "Please change my address to " in task.instruction
    assert task.system_prompt == "Shop rules."
    (find, update, answer) = task.oracle
    assert find["name"] == "find_user" and find["arguments"]["email"] in task.instruction
    assert update["name"] == "update_address"
    assert update["arguments"]["user_id"] == task.state["record"]["user_id"]  # from the record
    assert update["arguments"]["address"] in task.instruction  # from the user's words
    assert "answer" in answer
    assert [t["function"]["name"] for t in env.tool_schemas()] == ["find_user", "update_address"]


def test_the_verifier_wants_the_right_call_after_the_opening(env):
    task = env.make_task(7)
    find, update, answer = task.oracle
    assert run_actions(env, 7, task.oracle)[1].passed
    assert not run_actions(env, 7, [find, answer])[1].passed  # never acted
    assert not run_actions(env, 7, [update, answer])[1].passed  # skipped the opening
    guessed = {"name": "update_address",
               "arguments": {**update["arguments"], "user_id": "U999999"}}  # fmt: skip
    assert not run_actions(env, 7, [find, guessed, answer])[1].passed
    assert check_environment(env, 60).ok


def test_what_the_family_cannot_build_is_said(env):
    catalog = _catalog()
    # a lookup of a record no read returns (update_address's user_id): nothing to look up
    looked_up = Conventions(runs=10, tools=[FIND, UPDATE], opening=["find_user"],
                            lookups={"update_address": "get_order"})  # fmt: skip
    with pytest.raises(NotSynthesizable, match="nothing to look up first"):
        build_spec(_gap(), catalog, looked_up)
    with pytest.raises(NotSynthesizable, match="definition is unknown"):
        build_spec(_gap(), catalog, Conventions(runs=10, opening=["find_user"]))
    with pytest.raises(NotSynthesizable, match="cannot learn how users ask"):
        build_spec(_gap(requests=[]), catalog, Conventions(runs=10, tools=[FIND, UPDATE],
                                                            opening=["find_user"]))  # fmt: skip
    with pytest.raises(NotSynthesizable, match="no recorded opening call"):
        build_spec(_gap(requests=[]), catalog, Conventions(runs=10, tools=[FIND, UPDATE]))
    # a whole detector's gap names several tools: the per-tool gaps are built instead
    with pytest.raises(NotSynthesizable, match="not about one tool"):
        build_spec(_gap(key="detector:unserved_request"), catalog, Conventions(runs=10))


REFUND = {"type": "function", "function": {"name": "refund_order", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"]}}}  # fmt: skip


def _refund_gap():
    requests = [
        {"text": f"Hi, my email is {e}. I want a refund for my order O{1000 + i}.",
         "first_call": {"tool": "find_user", "arguments": {"email": e}}}
        for i, e in enumerate(["ana11@mail.com", "ben22@mail.com", "cleo33@mail.com"])
    ]  # fmt: skip
    return _gap(key="unserved_request:refund_order", tools=["refund_order"], requests=requests)


@pytest.mark.parametrize("lookups", [{"refund_order": "get_order"}, {}])
def test_an_action_never_called_on_a_record_the_user_names(lookups):
    """The agent never calls refund_order (no recorded call: its definition only), and its
    id, order_id, is what get_order looks records up by: the user asks in their own words for
    it on one of their records; the oracle finds the user, looks the record up (where the
    agent's conventions do) and acts on it, and no other record."""
    conventions = Conventions(runs=10, tools=[FIND, REFUND], opening=["find_user"],
                              lookups=lookups)  # fmt: skip
    spec = build_spec(_refund_gap(), _catalog(), conventions)
    assert spec.family == "requested_action" and spec.roles["action"] == "refund_order"
    assert spec.roles["lookup"] == "get_order" and spec.roles["owner"] == "find_user"
    env = from_spec(spec)
    assert isinstance(env, RequestedRecordActionEnv)
    task = env.make_task(3)
    assert task.instruction.startswith("Hi, my email is ")
    assert "I want a refund for my order O" in task.instruction  # the users' words
    names = [a.get("name") for a in task.oracle if "name" in a]
    looked = (
        ["find_user", "get_order", "refund_order"] if lookups else ["find_user", "refund_order"]
    )
    assert names == looked
    refund = task.oracle[len(names) - 1]
    assert refund["arguments"]["order_id"] in task.instruction
    assert run_actions(env, 3, task.oracle)[1].passed
    answer = task.oracle[-1]
    assert not run_actions(env, 3, [*task.oracle[: len(names) - 1], answer])[1].passed  # never
    other = task.goal.forbidden_calls[0]  # the user's other order: left alone
    assert not run_actions(env, 3, [*task.oracle[:-1], other, answer])[1].passed
    assert check_environment(env, 60).ok


def test_the_state_the_definition_names_is_the_only_one_acted_in():
    """refund_order was never called, so no status rule can be mined; its definition says it
    refunds a delivered order: a share of the tasks name an order in another observed state,
    which the oracle looks up and leaves alone, saying why; refunding it fails the task."""
    text = "Refund a delivered order. Pending orders are cancelled."
    described = {"type": "function", "function": {**REFUND["function"], "description": text}}
    conventions = Conventions(runs=10, tools=[FIND, described], opening=["find_user"])
    catalog = _catalog(("pending", "shipped", "delivered"))
    spec = build_spec(_refund_gap(), catalog, conventions)
    status = spec.roles["status"]
    assert status["allowed"] == ["delivered"] and status["refused"] == ["pending", "shipped"]
    env = from_spec(spec)
    kinds = {"refunded": 0, "left": 0}
    for seed in range(40):
        task = env.make_task(seed)
        names = [a.get("name") for a in task.oracle if "name" in a]
        assert names[:2] == ["find_user", "get_order"]  # looked up first, always
        target = task.oracle[1]["arguments"]["order_id"]
        answer = task.oracle[-1]
        if "refund_order" in names:
            kinds["refunded"] += 1
            assert not run_actions(env, seed, [*task.oracle[:2], answer])[1].passed
        else:
            kinds["left"] += 1
            refund = {"name": "refund_order", "arguments": {"order_id": target}}
            assert not run_actions(env, seed, [*task.oracle[:-1], refund, answer])[1].passed
            # not even tried, on a record that does not exist (an error is still an attempt)
            junk = {"name": "refund_order", "arguments": {"order_id": "no-such-order"}}
            assert not run_actions(env, seed, [*task.oracle[:-1], junk, answer])[1].passed
            assert "unchanged" in answer["answer"]
        assert run_actions(env, seed, task.oracle)[1].passed
    assert kinds == {"refunded": 20, "left": 20}  # every other seed
    assert check_environment(env, 60).ok
    # without the description's word, nothing is refused (as before)
    plain = build_spec(_refund_gap(), catalog, Conventions(runs=10, tools=[FIND, REFUND],
                                                           opening=["find_user"]))  # fmt: skip
    assert not (plain.roles.get("status") or {}).get("refused")


def test_an_action_on_a_record_needs_a_read_that_shows_it():
    conventions = Conventions(runs=10, tools=[FIND, REFUND], opening=["find_user"],
                              lookups={"refund_order": "get_order"})  # fmt: skip
    bare = infer_catalog([[c] for c in _catalog_traces()])  # find_user only: no get_order
    with pytest.raises(NotSynthesizable, match="nothing to look up first"):
        build_spec(_refund_gap(), bare, conventions)


def test_the_users_values_are_those_the_recorded_calls_would_take():
    """Where the action was called, its recorded arguments say which of the users' words it
    takes (`33 Hill Ln`, not `4 Pine Rd` when every recorded address had a two-digit number)."""
    requests = [*REQUESTS, ("Hi, my email is ivo4@mail.com. Please change my address to 4 Pine Rd.",
                            "ivo4@mail.com")]  # fmt: skip
    gap = _gap(requests=[{"text": t, "first_call": {"tool": "find_user", "arguments": {"email": e}}}
                         for t, e in requests])  # fmt: skip
    traces = [*([c] for c in _catalog_traces()), *(
        [{"tool": "update_address", "arguments": {"user_id": f"U{100 + i}", "address": a},
          "result": {"user_id": f"U{100 + i}", "address": a}}]
        for i, a in enumerate(["12 Oak St", "53 Hill Ln", "88 Pine Rd", "21 Elm Ave",
                               "64 Lake Dr", "70 Oak St"]))]  # fmt: skip
    conventions = Conventions(runs=10, tools=[FIND, UPDATE], opening=["find_user"])
    env = from_spec(build_spec(gap, infer_catalog(traces), conventions))
    said = {env.make_task(seed).oracle[1]["arguments"]["address"] for seed in range(60)}
    assert said == {"53 Hill Ln", "88 Pine Rd", "33 Hill Ln"}  # the users' words that fit
    fidelity = pytest.importorskip("tracegym.synthesis.fidelity")
    assert fidelity.check_fidelity(env, n_seeds=100).ok


def _catalog_traces():
    for i, name in enumerate(["ana", "ben", "cleo", "dan", "eva", "finn"] * 3):
        yield {"tool": "find_user", "arguments": {"email": f"{name}{i}@mail.com"},
               "result": {"user_id": f"U{100 + i}", "orders": [f"O{1000 + i}"]}}  # fmt: skip


def test_the_users_words_win_over_recorded_calls_that_fit_none_of_them():
    """An agent that never serves the request records only its mistaken calls (the demo's LM
    agent: `update_address(address="O9049")`, an order id): their format fits none of the users'
    words, so the words are kept, said in the spec, and the environment is faithful."""
    traces = [*([c] for c in _catalog_traces()), *(
        [{"tool": "update_address", "arguments": {"user_id": f"U{100 + i}", "address": f"O{o}"},
          "result": {"user_id": f"U{100 + i}", "address": f"O{o}"}}]
        for i, o in enumerate([9049, 9670, 9850, 6456, 1305, 3478]))]  # fmt: skip
    conventions = Conventions(runs=10, tools=[FIND, UPDATE], opening=["find_user"])
    spec = build_spec(_gap(), infer_catalog(traces), conventions)
    assert "fit none of the users' words" in spec.extra["requested"]["overruled_formats"]["address"]
    env = from_spec(spec)
    said = {env.make_task(seed).oracle[1]["arguments"]["address"] for seed in range(60)}
    assert said == {"53 Hill Ln", "88 Pine Rd", "33 Hill Ln"}
    fidelity = pytest.importorskip("tracegym.synthesis.fidelity")
    assert fidelity.check_fidelity(env, n_seeds=100).ok
    assert check_environment(env, 100).ok
    # where the recorded calls fit the words, nothing is overruled
    assert build_spec(_gap(), _catalog(), conventions).extra["requested"]["overruled_formats"] == {}


def test_contrast_versions_ask_the_same_and_differ_in_what_the_rule_allows():
    """`contrast_knobs`: the same seed with its order allowed, then refused. The request and
    the order named are the same; only the looked-up status, and so the oracle's action,
    differ. Without a rule that refuses there is nothing to contrast."""
    text = "Refund a delivered order. Pending orders are cancelled."
    described = {"type": "function", "function": {**REFUND["function"], "description": text}}
    conventions = Conventions(runs=10, tools=[FIND, described], opening=["find_user"])
    spec = build_spec(_refund_gap(), _catalog(("pending", "shipped", "delivered")), conventions)
    env = from_spec(spec)
    knobs = env.contrast_knobs()
    assert knobs is not None
    allowed, refused = (from_spec(spec, **k) for k in knobs)
    for seed in range(6):
        a, r = allowed.make_task(seed), refused.make_task(seed)
        assert a.instruction == r.instruction
        order = a.oracle[1]["arguments"]["order_id"]
        assert r.oracle[1]["arguments"]["order_id"] == order
        assert "refund_order" in [x.get("name") for x in a.oracle]
        assert "refund_order" not in [x.get("name") for x in r.oracle]
        assert run_actions(allowed, seed, a.oracle)[1].passed
        assert run_actions(refused, seed, r.oracle)[1].passed
    plain_conventions = Conventions(runs=10, tools=[FIND, REFUND], opening=["find_user"])
    plain = build_spec(_refund_gap(), _catalog(("pending", "shipped", "delivered")),
                       plain_conventions)  # fmt: skip
    assert from_spec(plain).contrast_knobs() is None
