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
    seeds = [1_000_000 + i for i in range(7)]
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


# Compaction and the shared prefix -----------------------------------------------------------------
def _episodes(policy):
    """Prompts that share a long system message, with different turn counts (lanes close at
    different steps) and different reply budgets (lanes finish replies at different times)."""
    encoder = ChatEncoder(policy.tokenizer)
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
    encoder = ChatEncoder(policy.tokenizer)
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


# Continuous batching ----------------------------------------------------------------------------
def _uneven(policy, n=8):
    """More episodes than a batch, of very different lengths (1 to 5 turns, 2 to 16 tokens a
    reply), sharing a long system message: lanes close mid-wave and new ones join."""
    encoder = ChatEncoder(policy.tokenizer)
    system = encoder.message("system", "You are a helpful agent. Call a tool or answer. " * 4)[0]
    texts = ["hi", "press the button twice please", "a much longer message " * 6, "ok", "no"]
    turns, budgets = [1, 5, 1, 2, 4, 1, 3, 1, 2], [4, 16, 2, 12, 6, 3, 9, 16, 5]
    return encoder, len(system), [
        (
            system + encoder.message("user", texts[i % len(texts)] + f" {i}")[0]
            + encoder.header("assistant"),
            turns[i % len(turns)],
            budgets[i % len(budgets)],
        )
        for i in range(n)
    ]  # fmt: skip


def _lane_converse(encoder):
    def batched(lane, episode):
        return _converse(
            encoder, lambda ids, budget: lane.generate(ids, budget, encoder.end_id), *episode
        )

    return batched


@pytest.mark.parametrize("share_prefix", [False, True])
def test_continuous_batching_keeps_the_replies(policy, share_prefix):
    encoder, system, episodes = _uneven(policy)

    def alone(episode):
        def generate(ids, budget):
            session = Session(policy)
            session.feed(ids)
            return session.generate(budget, encoder.end_id)

        return _converse(encoder, generate, *episode)

    stats: dict[str, int] = {}
    done = []
    got = map_batched(
        policy, _lane_converse(encoder), episodes, batch_size=3, share_prefix=share_prefix,
        stats=stats, on_done=done.append,
    )  # fmt: skip
    assert got == [alone(e) for e in episodes]
    assert sorted(map(str, done)) == sorted(map(str, got))  # once per item
    assert stats["refills"] == len(episodes) - 3  # one wave: every later item joined it
    if share_prefix:  # lanes that joined later copied the stored prefix instead of prefilling it
        assert stats["shared"] >= system * (len(episodes) - 1)
    else:
        assert stats["shared"] == 0


def test_continuous_batching_keeps_the_batch_full(policy):
    encoder, _, episodes = _uneven(policy, n=9)
    work = []
    for compact, continuous in ((True, False), (True, True), (False, True)):
        stats: dict[str, int] = {}
        got = map_batched(
            policy, _lane_converse(encoder), episodes, batch_size=3, compact=compact,
            continuous=continuous, stats=stats,
        )  # fmt: skip
        work.append((got, stats))
    (waves, fixed), (refilled, continuous), (plain, uncompacted) = work
    assert refilled == waves == plain
    assert fixed["refills"] == 0 and continuous["refills"] == 6
    assert continuous["forwards"] < fixed["forwards"]  # fewer, fuller steps
    assert uncompacted["refills"] == 0  # a wave that keeps every row runs in fixed waves


def test_results_keep_the_order_of_items(policy):
    """Items that finish early (no generation at all, closing their lane themselves, one short
    reply) and late ones: results in item order, `on_done` once per item."""
    encoder = ChatEncoder(policy.tokenizer)

    def work(lane, n):
        if n % 3 == 0:
            return n  # never asks for a reply
        ids = encoder.message("user", "x " * n)[0] + encoder.header("assistant")
        for _ in range(n % 4):
            ids = ids + lane.generate(ids, 3 + n, encoder.end_id)[0] + encoder.header("tool")
        if n % 5 == 0:
            lane.close()
        return n

    done: list[int] = []
    stats: dict[str, int] = {}
    items = list(range(11))
    assert map_batched(policy, work, items, batch_size=3, on_done=done.append, stats=stats) == items
    assert sorted(done) == items
    assert stats["refills"] == len(items) - 3


def test_a_failing_item_does_not_hang_the_continuous_batch(policy):
    encoder = ChatEncoder(policy.tokenizer)
    started: list[int] = []
    done: list[int] = []

    def work(lane, n):
        started.append(n)
        ids = encoder.message("user", "x " * (n + 1))[0] + encoder.header("assistant")
        reply = lane.generate(ids, 4 + 3 * n, encoder.end_id)[0]
        if n == 2:
            raise ValueError("boom")
        lane.generate(ids + reply + encoder.header("assistant"), 8, encoder.end_id)
        return n

    with pytest.raises(ValueError, match="boom"):
        map_batched(policy, work, range(20), batch_size=3, on_done=done.append)
    assert 2 in started and 2 not in done
    assert len(started) < 20  # nothing new started after the failure
    assert sorted(done) == sorted(n for n in started if n != 2)  # the started ones finished


def test_sampled_replies_do_not_depend_on_batch_size(policy):
    """Item i samples with a generator seeded seed + i, wherever and whenever it runs."""
    encoder, _, episodes = _uneven(policy, n=6)
    runs = []
    for size, continuous in ((1, True), (2, True), (4, True), (4, False), (6, True)):
        run = map_batched(
            policy, _lane_converse(encoder), episodes, batch_size=size, temperature=1.0,
            seed=7, continuous=continuous,
        )  # fmt: skip
        runs.append(run)
    assert all(run == runs[0] for run in runs[1:])
    other_seed = map_batched(
        policy, _lane_converse(encoder), episodes, batch_size=4, temperature=1.0, seed=8
    )
    assert other_seed != runs[0]
