"""Batched generation: the same greedy replies as one episode at a time, and no deadlocks."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracegym.training.batching import map_batched
from tracegym.training.model import tiny_model
from tracegym.training.rollout import ChatEncoder, Session, rollout, rollout_batched
from tracegym.training.toy import press_env


@pytest.fixture(scope="module")
def policy():
    return tiny_model(seed=3)


def test_batched_greedy_replies_equal_sequential_ones(policy):
    encoder = ChatEncoder(policy.tokenizer)
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
    encoder = ChatEncoder(policy.tokenizer)

    def work(lane, n):
        if n == 1:
            raise ValueError("boom")
        ids = encoder.message("user", "x")[0] + encoder.header("assistant")
        return len(lane.generate(ids, 4, encoder.end_id)[0])

    with pytest.raises(ValueError, match="boom"):
        map_batched(policy, work, [0, 1, 2], batch_size=3)
