"""The CTranslate2 rollout engine: PyTorch's greedy replies, through the batching code's lanes."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip(
    "ctranslate2", reason="the CTranslate2 engine is optional (pip install ctranslate2)"
)

import itertools

from tracegym.examples.lm_agent import ShopAgent
from tracegym.examples.shop import make_task
from tracegym.generation import ct2_engine
from tracegym.generation.batching import map_batched
from tracegym.generation.model import ensure_model, load_policy
from tracegym.training.rollout import Session

from tests.fixtures.chatml_ids import ChatML

# Converts and runs real (tiny) models: out of the quick loop.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return ensure_model(tmp_path_factory.mktemp("home"), "tiny-3")


@pytest.fixture(scope="module")
def policy(folder):
    return load_policy(folder, device="cpu")


@pytest.fixture(scope="module")
def engine(folder):
    return ct2_engine.Ct2Engine.from_folder(folder, quantization="float32", threads=1)


def test_float32_greedy_replies_equal_pytorch_ones_over_two_turns(policy, engine):
    """Exact on the tiny model in float32 (both are greedy argmax over the same weights; a tie
    broken differently by float rounding would show here as a differing token)."""
    encoder = ChatML(policy.tokenizer)
    system = encoder.message("system", "You are a helpful agent. " * 4)[0]
    prompts = [
        system + encoder.message("user", text)[0] + encoder.header("assistant")
        for text in ["hi", "press the button twice please", "a much longer message " * 6]
    ]

    def alone(ids):
        session = Session(policy)
        session.feed(ids)
        return session.generate(12, encoder.end_id)[0]

    def two_turns(lane, ids):
        first, full = lane.generate(ids, 12, encoder.end_id)
        assert not full
        follow = ids + first + encoder.message("tool", "ok")[0] + encoder.header("assistant")
        second, _ = lane.generate(follow, 12, encoder.end_id)
        return first, second, follow

    stats = {}
    batched = ct2_engine.map_batched(engine, two_turns, prompts, batch_size=3, stats=stats)
    for ids, (first, second, follow) in zip(prompts, batched, strict=True):
        assert first == alone(ids)
        assert second == alone(follow)
    assert stats["shared"] >= 2 * len(prompts) * len(system)  # the system message, as a prefix


def test_shop_agent_chats_equal_pytorch_ones(policy, engine):
    agent = ShopAgent(policy, max_new_tokens=24)
    tasks = [make_task(1000 + i) for i in range(6)]

    def one(lane, task):
        return agent.run(task, lane=lane)

    reference = map_batched(policy, one, tasks, batch_size=4)
    ours = ct2_engine.map_batched(engine, one, tasks, batch_size=4)
    assert [r.messages for r in ours] == [r.messages for r in reference]
    assert [r.passed for r in ours] == [r.passed for r in reference]
    assert [r.generated_tokens for r in ours] == [r.generated_tokens for r in reference]


def test_a_reply_is_cut_at_max_new_tokens_and_at_the_context_end(policy, engine):
    encoder = ChatML(policy.tokenizer)
    ids = encoder.message("user", "hi")[0] + encoder.header("assistant")
    never = len(policy.tokenizer) + 5  # a stop id the model cannot produce

    wave = ct2_engine.Ct2Wave(engine, 1)
    new, full = wave.lanes[0].generate(ids, 5, never)
    assert len(new) == 5 and not full

    short = ct2_engine.Ct2Wave(engine, 1, max_length=len(ids) + 3)
    new, full = short.lanes[0].generate(ids, 20, never)
    assert len(new) == 3 and full
    assert short.lanes[0].generate(ids + new, 20, never) == ([], True)


def test_conversion_is_cached_and_redone_when_the_weights_change(folder, tmp_path):
    target = tmp_path / "ct2"
    ct2_engine.convert(folder, "float32", target)
    first = (target / "model.bin").stat().st_mtime_ns
    ct2_engine.convert(folder, "float32", target)
    assert (target / "model.bin").stat().st_mtime_ns == first
    marker = target / ct2_engine.MARKER
    marker.write_text(json.dumps({"source": "another model"}))
    ct2_engine.convert(folder, "float32", target)
    assert json.loads(marker.read_text())["source"] != "another model"


def _replies(policy, prompts, encoder, engine=None):
    def one(lane, ids):
        return lane.generate(ids, 12, encoder.end_id)[0]

    if engine is not None:
        return ct2_engine.map_batched(engine, one, prompts, batch_size=len(prompts))
    return map_batched(policy, one, prompts, batch_size=len(prompts))


def test_engine_for_merges_the_active_adapter(policy, monkeypatch, tmp_path):
    """`engine_for`: the PeftModel's active LoRA adapter merged into the converted weights (and
    none when its adapter layers are disabled), giving PyTorch's greedy replies in each state;
    one conversion per distinct weights."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    monkeypatch.setattr(ct2_engine.tempfile, "gettempdir", lambda: str(tmp_path))
    encoder = ChatML(policy.tokenizer)
    prompts = [
        encoder.message("user", text)[0] + encoder.header("assistant")
        for text in ["hi", "press the button", "the order is shipped " * 3]
    ]
    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(copy.deepcopy(policy.model), config)
    adapted = type(policy)(peft_model, policy.tokenizer, "tiny-3-lora")

    with_adapter = _replies(adapted, prompts, encoder)
    with peft_model.disable_adapter():
        without = _replies(adapted, prompts, encoder)
    assert with_adapter != without  # the adapter changes the replies, so merging is tested

    assert _replies(adapted, prompts, encoder, ct2_engine.engine_for(adapted)) == with_adapter
    with peft_model.disable_adapter():
        assert _replies(adapted, prompts, encoder, ct2_engine.engine_for(adapted)) == without
    assert ct2_engine.engine_for(adapted) is ct2_engine.engine_for(adapted)  # kept
    assert len(list((tmp_path / "tracegym-ct2").glob("model-*.ct2-float32"))) == 2


@pytest.mark.parametrize(
    "lengths", [[0, 20, 38, 50, 65, 80, 94, 108], [0, 3, 2, 2, 2, 0, 2, 2], [0, 200, 5, 210], [7]]
)
def test_buckets_split_every_row_once_by_length(lengths):
    parts = ct2_engine._buckets(lengths, 48)
    assert sorted(i for part in parts for i in part) == list(range(len(lengths)))
    spans = [(min(lengths[i] for i in p), max(lengths[i] for i in p)) for p in parts]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # in length order
    if max(lengths) - min(lengths) <= 5:
        assert len(parts) == 1  # near-equal prompts stay one batch
    if lengths == [0, 200, 5, 210]:
        assert sorted(map(sorted, parts)) == [[0, 2], [1, 3]]  # far apart: two batches
