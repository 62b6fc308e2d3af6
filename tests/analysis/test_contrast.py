"""Contrast pairs: a seed's allowed and refused task, trained in the same batch (training.sft)."""

from __future__ import annotations

from typing import Any

import pytest
from tracegym.training.sft import batch_units


def test_batch_units_keep_each_group_whole_and_follow_dropped_conversations():
    # conversation 4 had no assistant token within max_length: example 4 is conversation 5
    kept = [0, 1, 2, 3, 5, 6]
    units = batch_units(kept, [(0, 1), (4, 5), (2, 3)])
    assert units == [[0, 1], [2, 3], [4], [5]]
    assert batch_units(kept) == [[i] for i in range(6)]  # no groups: one example each


@pytest.mark.slow
def test_contrast_pairs_share_a_batch_and_train_their_own_steps(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    from tracegym.generation.model import ensure_model, tiny_model
    from tracegym.training import sft
    from tracegym.training.toy import PressEnv, press_env

    class Contrasting(PressEnv):
        """The toy task with a stand-in rule: one colour allowed, or two."""

        def contrast_knobs(self) -> tuple[dict[str, Any], dict[str, Any]]:
            return {"colors": 1}, {"colors": 2}

    env = Contrasting(press_env().spec)
    data = sft.capability_data(env, range(6), contrast=True)
    assert data.groups == [(0, 1), (2, 3), (4, 5)] and data.demonstrations == 6
    assert sft.capability_data(env, range(6)).groups == []  # off unless asked
    assert sft.capability_data(press_env(), range(6), contrast=True).groups == []  # no rule

    batches: list[list[list[int]]] = []
    collate = sft.collate

    def recording(examples: Any, pad_id: int, device: Any) -> dict:
        batches.append([ids for ids, _ in examples])
        return collate(examples, pad_id, device)

    monkeypatch.setattr(sft, "collate", recording)
    policy = tiny_model()
    config = sft.default_config("tiny", steps=6, batch_size=1)
    sft.train_adapter(policy, data.conversations, config, "x", groups=data.groups)
    encoded = sft.encode_examples(policy.tokenizer, data.conversations, config.max_length)
    pairs = [sorted([encoded[a][0], encoded[b][0]]) for a, b in data.groups]
    assert len(batches) == 6 and all(sorted(batch) in pairs for batch in batches)
    assert {str(sorted(batch)) for batch in batches} == {str(pair) for pair in pairs}

    # a capability taught on pairs trains contrast_steps at contrast_lr; without pairs, its own
    folder = ensure_model(tmp_path, "tiny")
    config = sft.default_config("tiny", steps=2, train_seeds=4, contrast_steps=3,
                                contrast_lr=0.02)  # fmt: skip
    meta = sft.train_capability(tmp_path, env, folder, config, evaluate=False)
    assert meta["metrics"]["train"]["contrast_pairs"] == 2
    assert meta["hyperparameters"]["steps"] == 3 and meta["hyperparameters"]["lr"] == 0.02
    plain = sft.default_config("tiny", steps=2, train_seeds=4, contrast_steps=3,
                               contrast_pairs=False)  # fmt: skip
    meta = sft.train_capability(tmp_path, env, folder, plain, evaluate=False)
    assert meta["metrics"]["train"]["contrast_pairs"] == 0
    assert meta["hyperparameters"]["steps"] == 2
