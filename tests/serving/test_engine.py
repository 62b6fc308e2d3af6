"""The batching engine on the tiny model: concurrent requests decode in one batch with the
replies each gives alone, a conversation's next turn reuses its slot's cache, requests of two
adapters share a batch and each gets its own adapter's reply, tokens are announced as they come."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from tracegym.generation.chat_format import ChatFormat, template_text  # noqa: E402
from tracegym.generation.model import Policy, tiny_model  # noqa: E402
from tracegym.serving.engine import Engine, Request  # noqa: E402
from tracegym.serving.local import stop_token  # noqa: E402

SYSTEM = {"role": "system", "content": "You are the shop's agent. Answer briefly."}
ASKS = ["hi", "press the button twice please", "a much longer message " * 6, "refund order 7"]


@pytest.fixture(scope="module")
def policy() -> Policy:
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def fmt(policy: Policy) -> ChatFormat:
    return ChatFormat(policy.tokenizer, template_text("chatml"))


def alone(model, ids: list[int], stop: int, n: int = 20) -> list[int]:
    """The reply `model.generate` gives on its own, greedy."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(
            input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n,
            do_sample=False, eos_token_id=stop, pad_token_id=0,
        )  # fmt: skip
    return out[0, len(ids) :].tolist()


def prompts(fmt: ChatFormat) -> list[list[int]]:
    return [fmt.render_ids([SYSTEM, {"role": "user", "content": a}]) for a in ASKS]


def test_concurrent_requests_are_batched_and_answer_as_alone(policy, fmt):
    stop = stop_token(fmt)
    # a long gather window and as many slots as requests: the step starts once all are queued
    engine = Engine(policy, slots=len(ASKS), gather_s=30.0)
    try:
        results: dict[int, list[int]] = {}

        def ask(i: int, ids: list[int]) -> None:
            results[i] = engine.generate(Request(ids, 20, stop)).tokens

        threads = [threading.Thread(target=ask, args=p) for p in enumerate(prompts(fmt))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        engine.close()
    for i, ids in enumerate(prompts(fmt)):
        assert results[i] == alone(policy.model, ids, stop)
    assert engine.stats.steps == 1 and engine.stats.max_batch == len(ASKS)
    assert engine.stats.rows_per_forward > 1


def test_a_conversations_next_turn_reuses_its_slots_cache(policy, fmt):
    stop = stop_token(fmt)
    engine = Engine(policy, slots=2, gather_s=0.0)
    try:
        messages = [SYSTEM, {"role": "user", "content": "refund order 7"}]
        first = engine.generate(Request(fmt.render_ids(messages), 20, stop))
        other = fmt.render_ids([SYSTEM, {"role": "user", "content": "something else"}])
        engine.generate(Request(other, 5, stop))  # another conversation in the other slot
        text = policy.tokenizer.decode(first.tokens[:-1])
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "ok"}]
        follow = fmt.render_ids(messages)
        second = engine.generate(Request(follow, 20, stop))
    finally:
        engine.close()
    assert first.reused == 0
    assert engine.stats.continued == 1
    assert second.reused >= len(fmt.render_ids(messages[:2]))  # at least the first prompt
    assert second.tokens == alone(policy.model, follow, stop)


def test_a_slot_taken_by_another_conversation_keeps_only_the_shared_prefix(policy, fmt):
    stop = stop_token(fmt)
    engine = Engine(policy, slots=1, gather_s=0.0)
    try:
        one, two = prompts(fmt)[:2]
        engine.generate(Request(one, 8, stop))
        second = engine.generate(Request(two, 20, stop))
    finally:
        engine.close()
    shared = next(i for i, (a, b) in enumerate(zip(one, two, strict=False)) if a != b)
    assert second.reused == shared and engine.stats.continued == 0
    assert second.tokens == alone(policy.model, two, stop)


def test_two_adapters_in_one_batch_each_answer_as_alone(fmt):
    base = tiny_model(seed=3)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base.model, config, adapter_name="press")
    model.add_adapter("refund", peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))  # fmt: skip
    model.eval()
    policy = Policy(model, base.tokenizer, "tiny")
    stop = stop_token(fmt)
    ids = prompts(fmt)[3]
    names = ["press", "refund", None]
    engine = Engine(policy, slots=3, gather_s=30.0)
    try:
        futures = [engine.submit(Request(ids, 16, stop, adapter=n)) for n in names]
        together = [f.result().tokens for f in futures]
    finally:
        engine.close()
    assert engine.stats.max_batch == 3
    expected = []
    for name in names:
        if name is None:
            with model.disable_adapter():
                expected.append(alone(model, ids, stop, 16))
        else:
            model.set_adapter(name)
            expected.append(alone(model, ids, stop, 16))
    assert together == expected
    assert len({tuple(t) for t in together}) == 3  # the adapters do change the reply


def test_tokens_are_announced_as_they_are_decoded(policy, fmt):
    stop = stop_token(fmt)
    engine = Engine(policy, slots=1, gather_s=0.0)
    seen: list[list[int]] = []
    try:
        done = engine.generate(Request(prompts(fmt)[3], 20, stop, on_tokens=seen.append))
    finally:
        engine.close()
    assert len(seen) > 1 and [t for part in seen for t in part] == done.tokens


def test_a_failing_callback_does_not_break_the_batch(policy, fmt):
    stop = stop_token(fmt)
    engine = Engine(policy, slots=2, gather_s=30.0)

    def boom(tokens: list[int]) -> None:
        raise RuntimeError("client went away")

    try:
        bad = engine.submit(Request(prompts(fmt)[0], 10, stop, on_tokens=boom))
        good = engine.submit(Request(prompts(fmt)[1], 10, stop))
        assert bad.result().tokens == alone(policy.model, prompts(fmt)[0], stop, 10)
        assert good.result().tokens == alone(policy.model, prompts(fmt)[1], stop, 10)
    finally:
        engine.close()


def test_sampling_and_greedy_requests_share_a_batch(policy, fmt):
    stop = stop_token(fmt)
    engine = Engine(policy, slots=2, gather_s=30.0)
    try:
        hot = engine.submit(Request(prompts(fmt)[0], 10, stop, temperature=1.0))
        cold = engine.submit(Request(prompts(fmt)[1], 10, stop))
        assert 1 <= len(hot.result().tokens) <= 10
        assert cold.result().tokens == alone(policy.model, prompts(fmt)[1], stop, 10)
    finally:
        engine.close()


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(fmt):
    base = tiny_model(seed=3)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base.model, config, adapter_name="press")
    model.eval()
    stop = stop_token(fmt)
    ids = prompts(fmt)[0]
    engine = Engine(Policy(model, base.tokenizer, "tiny"), slots=2, gather_s=0.0)
    try:
        with pytest.raises(ValueError):  # peft refuses an adapter it does not hold
            engine.generate(Request(ids, 5, stop, adapter="missing"))
        after = engine.generate(Request(ids, 5, stop, adapter="press"))
    finally:
        engine.close()
    model.set_adapter("press")
    assert after.tokens == alone(model, ids, stop, 5)


def test_without_compaction_replies_and_reuse_are_the_same(policy, fmt):
    """Every slot's row in every forward pass (a cache that cannot be regrouped by row)."""
    stop = stop_token(fmt)
    engine = Engine(policy, slots=3, gather_s=0.0, compact=False)
    try:
        one, two = prompts(fmt)[:2]
        first = engine.generate(Request(one, 16, stop))
        engine.generate(Request(two, 16, stop))
        text = policy.tokenizer.decode(first.tokens[:-1])
        follow = fmt.render_ids([SYSTEM, {"role": "user", "content": ASKS[0]},
                                 {"role": "assistant", "content": text},
                                 {"role": "user", "content": "ok"}])  # fmt: skip
        second = engine.generate(Request(follow, 16, stop))
    finally:
        engine.close()
    assert first.tokens == alone(policy.model, one, stop, 16)
    assert second.tokens == alone(policy.model, follow, stop, 16)
    assert second.reused > len(one) // 2 and engine.stats.continued == 1
