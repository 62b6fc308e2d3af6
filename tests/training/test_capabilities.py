"""One adapter per capability: environments teaching the same action train one adapter."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from tracegym.training.adapters import (
    AdapterDocumentError,
    AdapterMetadata,
    CapabilityRef,
    adapter_id_for,
)
from tracegym.training.capabilities import capabilities, env_ids_of, split_seeds
from tracegym.training.evaluate import EvalJob
from tracegym.training.toy import PressEnv, press_spec

OLD_HOME = Path(__file__).parents[1] / "fixtures" / "home_before_typed_documents"


def env(env_id: str, action: str | None, train=(0, 100), heldout=(1_000, 2_000)) -> PressEnv:
    spec = dataclasses.replace(
        press_spec(env_id, gap_name=f"gap of {env_id}"),
        roles={"action": action} if action else {},
        train_seeds=train,
        heldout_seeds=heldout,
    )
    return PressEnv(spec)


def test_environments_of_one_action_make_one_capability():
    a, b = env("refund-a", "refund"), env("refund-b", "refund")
    c, d = env("address", "update_address"), env("no-action", None)
    groups = capabilities([a, c, b, d])
    assert [g.env_ids for g in groups] == [["refund-a", "refund-b"], ["address"], ["no-action"]]
    # alone in its group, an environment keeps its own adapter id (as before capabilities)
    assert [g.adapter_id for g in groups[1:]] == [adapter_id_for("address"), "no-action"]
    assert groups[0].adapter_id.startswith("refund-")
    assert capabilities([b, a])[0].adapter_id == groups[0].adapter_id  # order does not matter
    assert capabilities([a, env("refund-c", "refund")])[0].adapter_id != groups[0].adapter_id
    meta = groups[0].meta()
    assert meta["env_ids"] == ["refund-a", "refund-b"] and meta["env_id"] == "refund-a"
    assert meta["action"] == "refund" and meta["name"] == "refund: gap of refund-a, gap of refund-b"
    assert env_ids_of({"capability": meta}) == ["refund-a", "refund-b"]
    assert env_ids_of({"capability": {"env_id": "old"}}) == ["old"]  # metadata before env_ids
    assert [g.env_ids for g in capabilities([a, b], by_action=False)] == [
        ["refund-a"],
        ["refund-b"],
    ]


def test_a_capability_names_itself_in_the_adapter_metadatas_type():
    [group] = capabilities([env("refund-a", "refund"), env("refund-b", "refund")])
    ref = group.ref()
    assert isinstance(ref, CapabilityRef) and ref.env_ids == ("refund-a", "refund-b")
    assert CapabilityRef.from_dict(group.meta()) == ref
    meta = AdapterMetadata.from_dict(
        json.loads((OLD_HOME / "adapters" / "refund_order-1dc1158a1f" / "meta.json").read_text())
    )
    assert env_ids_of(meta) == list(meta.capability.env_ids) == env_ids_of(meta.to_dict())
    assert len(env_ids_of(meta)) > 1  # the demo's refund environments train together
    with pytest.raises(AdapterDocumentError, match="'env_id'"):
        env_ids_of({"capability": {"name": "no environment"}})


def test_seeds_are_shared_out_from_each_environments_own_ranges():
    a, b = env("a", "x", train=(0, 100)), env("b", "x", train=(500, 502))
    assert split_seeds(5, [a, b]) == [[0, 1, 2], [500, 501]]
    assert split_seeds(8, [a, b]) == [[0, 1, 2, 3], [500, 501]]  # b's range holds only two
    assert split_seeds(3, [a]) == [[0, 1, 2]]
    a, b = env("a", "x", heldout=(10, 20)), env("b", "x", heldout=(70, 80))
    job = EvalJob.spread([a, b], "cap", 5)
    assert [(e.env_id, s) for e, s in job.cases] == [
        ("a", 10), ("b", 70), ("a", 11), ("b", 71), ("a", 12)
    ]  # fmt: skip
    assert job.env_ids == ["a", "b"] and job.head(0, 2).env_ids == ["a", "b"]
    one = EvalJob.spread([a], "cap", 3)
    assert one == EvalJob.of(a, "cap", [10, 11, 12])


def test_a_capability_trains_one_adapter_on_its_environments(tmp_path):
    pytest.importorskip("peft")
    from tracegym.generation.model import ensure_model
    from tracegym.training import adapters
    from tracegym.training.sft import default_config, train_capability

    folder = ensure_model(tmp_path, "tiny")
    [capability] = capabilities([env("press-a", "press"), env("press-b", "press")])
    config = default_config("tiny", steps=2, train_seeds=6)
    meta = train_capability(tmp_path, capability, folder, config, eval_seeds=4)
    assert meta["adapter_id"] == capability.adapter_id
    assert meta["capability"]["env_ids"] == ["press-a", "press-b"]
    assert meta["metrics"]["train"]["demonstrations"] == 6  # 3 + 3, as many as one environment
    row = meta["metrics"]["eval"]
    assert row["env_ids"] == ["press-a", "press-b"] and row["base"]["n"] == 4
    texts = adapters.router_texts(tmp_path, capability.adapter_id)
    assert "gap of press-a" in texts and "gap of press-b" in texts


def test_the_nightly_trains_one_adapter_for_environments_of_one_action(tmp_path):
    pytest.importorskip("peft")
    import json

    from tracegym.cli import app
    from tracegym.synthesis import registry
    from typer.testing import CliRunner

    for env_id in ("press-a", "press-b"):
        registry.register(tmp_path, env(env_id, "press"), n_train=8, n_heldout=4, validity_seeds=10)
    registry.register(tmp_path, env("alone", None), n_train=8, n_heldout=4, validity_seeds=10)
    night = ["nightly", "--model", "tiny", "--steps", "2", "--eval-seeds", "4"]
    night += ["--embedder", "hash", "--no-route", "--date", "2026-01-02"]
    result = CliRunner().invoke(app, ["--home", str(tmp_path), *night])
    assert result.exit_code == 0, result.output
    stages = tmp_path / "nightly" / "2026-01-02" / "stages"
    train = json.loads((stages / "train.json").read_text())
    [group] = capabilities([env("press-a", "press"), env("press-b", "press")])
    assert sorted(train["trained"]) == sorted([group.adapter_id, "alone"])
    rows = {r["adapter_id"]: r for r in json.loads((stages / "evaluate.json").read_text())["rows"]}
    assert rows[group.adapter_id]["env_ids"] == ["press-a", "press-b"]
    assert rows["alone"]["env_ids"] == ["alone"]
