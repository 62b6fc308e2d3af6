"""Batched generation: the same greedy replies as one episode at a time, and no deadlocks."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracegym.generation.batching import map_batched
from tracegym.generation.model import tiny_model
from tracegym.training.rollout import Session, rollout, rollout_batched
from tracegym.training.toy import press_env

from tests.fixtures.chatml_ids import ChatML

# Trains or runs real models: out of the quick loop (`pytest -m "not slow"`).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy():
    return tiny_model(seed=3)


def test_batched_greedy_replies_equal_sequential_ones(policy):
    encoder = ChatML(policy.tokenizer)
    prompts = [
        encoder.message("user", text)[0] + encoder.header("assistant")
        for text in ["hi", "press the button twice please", "a much longer message " * 6]
    ]

    def alone(ids):
        session = Session(policy)
        session.feed(ids)
        return session.generate(12, encoder.end_id)[0]

    def two_turns(lane, ids):
        first, _ = lane.generate(ids, 12, encoder.end_id)
        follow = ids + first + encoder.message("tool", "ok")[0] + encoder.header("assistant")
        second, _ = lane.generate(follow, 12, encoder.end_id)
        return first, second, follow

    batched = map_batched(policy, two_turns, prompts, batch_size=3)
    for ids, (first, second, follow) in zip(prompts, batched, strict=True):
        assert first == alone(ids)
        assert second == alone(follow)


def test_batched_rollouts_match_sequential_rollouts(policy):
    env = press_env()
    seeds = [1_000_000 + i for i in range(5)]
    sequential = [rollout(policy, env, s, trace=False, max_new_tokens=24) for s in seeds]
    batched = rollout_batched(policy, env, seeds, batch_size=3, trace=False, max_new_tokens=24)
    assert [r.messages for r in batched] == [r.messages for r in sequential]
    assert [r.passed for r in batched] == [r.passed for r in sequential]


def test_an_episode_that_fails_does_not_hang_its_wave(policy):
    encoder = ChatML(policy.tokenizer)

    def work(lane, n):
        if n == 1:
            raise ValueError("boom")
        ids = encoder.message("user", "x")[0] + encoder.header("assistant")
        return len(lane.generate(ids, 4, encoder.end_id)[0])

    with pytest.raises(ValueError, match="boom"):
        map_batched(policy, work, [0, 1, 2], batch_size=3)


# Compaction and the shared prefix -----------------------------------------------------------------
def _episodes(policy):
    """Prompts that share a long system message, with different turn counts (lanes close at
    different steps) and different reply budgets (lanes finish replies at different times)."""
    encoder = ChatML(policy.tokenizer)
    system = encoder.message("system", "You are a helpful agent. Call a tool or answer. " * 4)[0]
    texts = ["hi", "press the button twice please", "a much longer message " * 6, "ok", "no"]
    return encoder, [
        (system + encoder.message("user", text)[0] + encoder.header("assistant"), turns, budget)
        for text, turns, budget in zip(texts, [1, 3, 2, 3, 1], [6, 16, 3, 10, 12], strict=True)
    ]


def _converse(encoder, generate, ids, turns, budget):
    replies = []
    for turn in range(turns):
        new, _ = generate(ids, budget)
        replies.append(new)
        ids = ids + new + encoder.message("tool", "ok " * (turn * 3 + 1))[0]
        ids = ids + encoder.header("assistant")
    return replies


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("share_prefix", [False, True])
def test_compaction_and_shared_prefix_keep_the_replies(policy, compact, share_prefix):
    encoder, episodes = _episodes(policy)

    def alone(episode):
        def generate(ids, budget):
            session = Session(policy)
            session.feed(ids)
            return session.generate(budget, encoder.end_id)

        return _converse(encoder, generate, *episode)

    def batched(lane, episode):
        return _converse(
            encoder, lambda ids, budget: lane.generate(ids, budget, encoder.end_id), *episode
        )

    stats: dict[str, int] = {}
    got = map_batched(
        policy, batched, episodes, batch_size=5, compact=compact, share_prefix=share_prefix,
        stats=stats,
    )  # fmt: skip
    assert got == [alone(e) for e in episodes]
    assert (stats["shared"] > 0) == share_prefix


def test_compaction_computes_fewer_rows(policy):
    encoder, episodes = _episodes(policy)

    def batched(lane, episode):
        return _converse(
            encoder, lambda ids, budget: lane.generate(ids, budget, encoder.end_id), *episode
        )

    work = []
    for compact in (False, True):
        stats: dict[str, int] = {}
        map_batched(policy, batched, episodes, batch_size=5, compact=compact, stats=stats)
        work.append(stats)
    assert work[1]["forwards"] == work[0]["forwards"]
    assert work[1]["tokens"] < work[0]["tokens"]


def test_sampled_replies_do_not_depend_on_compaction(policy):
    """Each lane samples with its own generator whatever row it sits in."""
    encoder, episodes = _episodes(policy)

    def batched(lane, episode):
        return _converse(
            encoder, lambda ids, budget: lane.generate(ids, budget, encoder.end_id), *episode
        )

    runs = [
        map_batched(policy, batched, episodes, batch_size=5, temperature=1.0, seed=7, compact=c)
        for c in (False, True)
    ]
    assert runs[0] == runs[1]


def test_identical_prompts_and_short_prefixes(policy):
    encoder = ChatML(policy.tokenizer)
    long = encoder.message("user", "press the red button, then the blue one " * 3)[0]
    long += encoder.header("assistant")
    short = [encoder.message("user", t)[0] + encoder.header("assistant") for t in ("a", "b")]

    def alone(ids):
        session = Session(policy)
        session.feed(ids)
        return session.generate(8, encoder.end_id)[0]

    def once(lane, ids):
        return lane.generate(ids, 8, encoder.end_id)[0]

    for prompts, shares in (([long, long, long], True), (short, False)):
        stats: dict[str, int] = {}
        assert map_batched(policy, once, prompts, batch_size=3, stats=stats) == [
            alone(p) for p in prompts
        ]
        assert (stats["shared"] > 0) == shares


# Drafts from the conversation (prompt lookup) ---------------------------------------------------
def _repetitive_episodes(policy):
    """Conversations that repeat themselves, as an agent's tool calls do, so drafts hold."""
    encoder = ChatML(policy.tokenizer)
    system = encoder.message("system", "Call tools as JSON. " * 3)[0]
    texts = ["find order O1001 O1001 O1001", "a b c a b c a b c", "hi"]
    return encoder, [
        (system + encoder.message("user", text)[0] + encoder.header("assistant"), turns, 16)
        for text, turns in zip(texts, [3, 2, 3], strict=True)
    ]


@pytest.mark.parametrize("compact", [False, True])
def test_drafted_steps_keep_the_greedy_replies(policy, compact):
    encoder, episodes = _repetitive_episodes(policy)

    def batched(lane, episode):
        return _converse(
            encoder, lambda ids, budget: lane.generate(ids, budget, encoder.end_id), *episode
        )

    plain: dict[str, int] = {}
    drafted: dict[str, int] = {}
    reference = map_batched(policy, batched, episodes, batch_size=3, compact=compact,
                            draft_budget=0, stats=plain)  # fmt: skip
    got = map_batched(policy, batched, episodes, batch_size=3, compact=compact,
                      draft_budget=64, stats=drafted)  # fmt: skip
    assert got == reference
    assert plain["drafted"] == plain["accepted"] == 0
    # the random model's greedy replies loop, so its own earlier tokens predict the next ones
    assert 0 < drafted["accepted"] <= drafted["drafted"]
    assert drafted["forwards"] < plain["forwards"]


def test_sampling_waves_do_not_draft(policy):
    encoder, episodes = _repetitive_episodes(policy)
    stats: dict[str, int] = {}

    def batched(lane, episode):
        return _converse(
            encoder, lambda ids, budget: lane.generate(ids, budget, encoder.end_id), *episode
        )

    map_batched(policy, batched, episodes, batch_size=3, temperature=1.0, stats=stats)
    assert stats["drafted"] == 0


def test_step_slots_serves_a_subset_and_keeps_idle_lanes_caches(policy):
    """A serving engine's use of a wave: steps for some lanes only, an idle lane's cache kept
    (its next turn feeds only new tokens), a lane truncated to a shared prefix and reused for
    another conversation; every reply as the model gives it alone."""
    from tracegym.generation.batching import Wave

    encoder = ChatML(policy.tokenizer)
    prompts = [
        encoder.message("user", text)[0] + encoder.header("assistant")
        for text in ["hi there", "press the button twice please", "something else entirely"]
    ]

    def alone(ids):
        session = Session(policy)
        session.feed(ids)
        return session.generate(10, encoder.end_id)[0]

    wave = Wave(policy, 2)
    first = wave.step_slots(
        {0: (prompts[0], 10, encoder.end_id), 1: (prompts[1], 10, encoder.end_id)}
    )
    assert first[0][0] == alone(prompts[0]) and first[1][0] == alone(prompts[1])
    follow = (
        prompts[0] + first[0][0] + encoder.message("tool", "ok")[0] + encoder.header("assistant")
    )
    fed = wave.stats["tokens"]
    again = wave.step_slots({0: (follow, 10, encoder.end_id)}, idle=[1])
    assert again[0][0] == alone(follow)
    fresh = Wave(policy, 1, share_prefix=False)
    fresh.step_slots({0: (follow, 10, encoder.end_id)})
    assert wave.stats["tokens"] - fed < fresh.stats["tokens"]  # only the new tokens were fed
    shared = next(i for i, (a, b) in enumerate(zip(prompts[1], prompts[2], strict=False)) if a != b)
    wave.truncate(1, shared)
    other = wave.step_slots({1: (prompts[2], 10, encoder.end_id)}, idle=[0])
    assert other[1][0] == alone(prompts[2])


def test_prefill_groups_split_only_where_padding_costs_more_than_a_forward():
    from tracegym.generation.batching import prefill_groups

    assert prefill_groups({0: 5, 1: 6, 2: 4}, overhead=16) == [[1, 0, 2]]
    # a new conversation's prompt beside two tool results: fed apart
    assert prefill_groups({0: 8, 1: 300, 2: 10}, overhead=16) == [[1], [2, 0]]
    assert prefill_groups({0: 8, 1: 300, 2: 10}, overhead=10_000) == [[1, 2, 0]]
    assert prefill_groups({3: 7}) == [[3]]


def test_a_long_new_prompt_beside_short_turns_is_fed_apart_with_the_same_replies(policy):
    """A serving step where one lane starts a long conversation while two others continue with
    a short tool result: fed as separate forwards it pads far less, and every reply is still
    the one the model gives alone."""
    from tracegym.generation.batching import Wave

    encoder = ChatML(policy.tokenizer)
    prompts = [
        encoder.message("user", text)[0] + encoder.header("assistant")
        for text in ["hi there", "press the button twice please"]
    ]
    long_prompt = (
        encoder.message("system", "You are a careful shop agent; check the order first. " * 8)[0]
        + encoder.message("user", "cancel my order")[0]
        + encoder.header("assistant")
    )

    def alone(ids):
        session = Session(policy)
        session.feed(ids)
        return session.generate(8, encoder.end_id)[0]

    def serve(split):
        wave = Wave(policy, 3, split_prefill=split, draft_budget=0)
        first = wave.step_slots({i: (p, 8, encoder.end_id) for i, p in enumerate(prompts)})
        follows = {
            i: (
                prompts[i] + first[i][0] + encoder.message("tool", "ok")[0]
                + encoder.header("assistant"), 8, encoder.end_id,
            )
            for i in (0, 1)
        }  # fmt: skip
        before = wave.stats["tokens"]
        second = wave.step_slots({**follows, 2: (long_prompt, 8, encoder.end_id)})
        return follows, second, wave.stats["tokens"] - before

    follows, together, fed_together = serve(split=False)
    _, apart, fed_apart = serve(split=True)
    assert apart == together
    assert apart[2][0] == alone(long_prompt)
    assert all(apart[i][0] == alone(follows[i][0]) for i in (0, 1))
    assert fed_apart < fed_together
