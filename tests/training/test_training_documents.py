"""The training stage's documents: adapter metadata, router texts, evaluation rows and routing
accuracy. Each round-trips with the same keys, reads what the code before the types wrote (the
fixture home), and names what is wrong with a bad document."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tracegym.store.home import DocumentError, Home
from tracegym.training import adapters
from tracegym.training.adapters import (
    AdapterDocumentError,
    AdapterError,
    AdapterMetadata,
    AdapterMetrics,
    BaseModelRef,
    CapabilityRef,
    RouterTexts,
)
from tracegym.training.evaluate import (
    EvalJob,
    EvaluationError,
    EvaluationRow,
    Rate,
    Sequential,
    _row,
    render_markdown,
)
from tracegym.training.router import RoutingAccuracy, RoutingError

OLD_HOME = Path(__file__).parents[1] / "fixtures" / "home_before_typed_documents"
OLD_ADAPTERS = ["refund_order-1dc1158a1f", "requested_action-231244f4b1"]


def _old_meta(adapter_id: str = OLD_ADAPTERS[0]) -> dict[str, Any]:
    return json.loads((OLD_HOME / "adapters" / adapter_id / "meta.json").read_text())


def _meta(adapter_id: str = "toy-press") -> AdapterMetadata:
    return AdapterMetadata(
        adapter_id=adapter_id,
        capability=CapabilityRef(
            id="gap-1",
            name="press the button",
            env_id="toy-press",
            env_ids=("toy-press",),
            family="requested_action",
            action="press",
        ),
        base_model=BaseModelRef(name="tiny-0", hash="abc", folder="/m/tiny-0"),
        data_hash="d1",
        hyperparameters={"rank": 16, "steps": 5, "mode": "sft"},
        metrics=AdapterMetrics(train={"steps": 5, "loss_first": 1.0, "loss_last": 0.1}),
        created_at="2026-01-02T03:04:05Z",
    )


def _env(env_id: str) -> SimpleNamespace:
    return SimpleNamespace(env_id=env_id)


def _write(home: Path, meta: AdapterMetadata | dict[str, Any], texts: Any = None) -> Path:
    folder = Home.at(home).adapters / (
        meta.adapter_id if isinstance(meta, AdapterMetadata) else meta["adapter_id"]
    )
    folder.mkdir(parents=True)
    data = meta.to_dict() if isinstance(meta, AdapterMetadata) else meta
    (folder / "meta.json").write_text(json.dumps(data))
    if texts is not None:
        (folder / "router.json").write_text(json.dumps(texts))
    return folder


# the fixture home ------------------------------------------------------------------------------
def test_old_home_adapter_metadata_reads_through_the_types():
    metas = adapters.all_metadata(OLD_HOME)
    assert [m.adapter_id for m in metas] == OLD_ADAPTERS
    refund, address = metas
    assert refund.capability.env_ids == (
        "budget-f94c5c1c97", "exact_arguments-cc36fd8376", "requested_action-3577fa0b11"
    )  # fmt: skip
    assert refund.env_ids == list(refund.capability.env_ids)
    assert refund.capability.action == "refund_order" and address.capability.env_ids == (
        "requested_action-231244f4b1",
    )
    assert refund.base_model == BaseModelRef(
        "smollm2-shop", "22e8b333f84ead8d", "/tmp/base-home/models/shop-base-e04f65649bef"
    )
    assert refund.hyperparameters["rank"] == 8 and refund.metrics.train["steps"] == 40
    row = refund.metrics.eval
    assert row is not None and row.promoted and refund.promoted
    assert row.base == Rate(0, 6, 0.0, (0.0, 0.3903)) and row.adapter.passed == 5
    assert row.sequential == Sequential(looks=2, planned=12, run=6, stopped="significant")
    assert row.router is None and row.seeds == (1000000, 1000001)
    assert refund.train_key == "6984e7f614fbaf27" and refund.night == "2026-12-05"
    assert refund.extra == {}


@pytest.mark.parametrize("adapter_id", OLD_ADAPTERS)
def test_old_home_adapter_metadata_writes_back_the_same_keys_and_values(adapter_id):
    old = _old_meta(adapter_id)
    again = AdapterMetadata.from_dict(old).to_dict()
    assert list(again) == list(old)
    assert {k: v for k, v in again.items() if k != "version"} == {
        k: v for k, v in old.items() if k != "version"
    }
    assert old["version"] == 1 and again["version"] == AdapterMetadata.VERSION


def test_old_home_router_texts_read_through_the_type():
    for adapter_id in OLD_ADAPTERS:
        raw = json.loads((OLD_HOME / "adapters" / adapter_id / "router.json").read_text())
        texts = adapters.read_router_texts(OLD_HOME, adapter_id)
        assert "version" not in raw and texts.texts == tuple(raw["texts"])
        assert adapters.router_texts(OLD_HOME, adapter_id) == raw["texts"]
    assert adapters.read_router_texts(OLD_HOME, "nope") == RouterTexts(())


def test_old_home_evaluation_rows_and_routing_read_through_the_types():
    night = OLD_HOME / "nightly" / "2026-12-05"
    stage = json.loads((night / "stages" / "evaluate.json").read_text())
    report = json.loads((night / "report.json").read_text())
    for raw in [*stage["rows"], *report["evaluation"]]:
        row = EvaluationRow.from_dict(raw)
        assert row.to_dict() == raw
        assert row.adapter_id in OLD_ADAPTERS and row.promoted and row.gain > 0
    routing = RoutingAccuracy.from_dict(stage["routing"])
    assert (
        routing.accuracy == 1.0
        and routing.n == 48
        and set(routing.per_adapter) == set(OLD_ADAPTERS)
    )
    assert routing.to_dict() == stage["routing"]
    demo = json.loads((OLD_HOME / "demo" / "report.json").read_text())
    for entry in demo["adapters"]:
        assert EvaluationRow.from_dict(entry["eval"]).to_dict() == entry["eval"]


def test_old_home_through_the_json_view():
    listed = adapters.all_metadata(OLD_HOME)
    assert [a.adapter_id for a in listed] == OLD_ADAPTERS
    shown = adapters.show(OLD_HOME, OLD_ADAPTERS[1])
    assert shown["capability"]["env_ids"] == ["requested_action-231244f4b1"]
    assert shown["router_texts"] == 34 and shown["path"].endswith(OLD_ADAPTERS[1])


# round trips -------------------------------------------------------------------------------------
def test_adapter_metadata_round_trips():
    meta = _meta()
    data = meta.to_dict()
    assert data["version"] == AdapterMetadata.VERSION
    assert (
        "train_key" not in data and "night" not in data
    )  # written only once the nightly sets them
    assert data["metrics"] == {"train": meta.metrics.train, "eval": None}
    assert AdapterMetadata.from_dict(json.loads(json.dumps(data))) == meta


def test_evaluation_row_round_trips_and_renders():
    job = EvalJob("toy-press", ((_env("env-a"), 5), (_env("env-b"), 9)))
    row = _row(job, Rate.of(1, 10), Rate.of(9, 10), alpha=0.05)
    assert row.env_id == "env-a+env-b" and row.seeds == (5, 9) and row.promoted
    data = row.to_dict()
    assert list(data) == [
        "env_id", "env_ids", "adapter_id", "seeds", "base", "adapter", "gain", "p_value",
        "promoted", "reason", "router",
    ]  # fmt: skip
    assert data["base"] == {"passed": 1, "n": 10, "rate": 0.1, "ci95": list(row.base.ci95)}
    assert EvaluationRow.from_dict(json.loads(json.dumps(data))) == row
    table = render_markdown([row])
    assert table == render_markdown([data]) and "| env-a+env-b |" in table


def test_routing_accuracy_round_trips():
    routing = RoutingAccuracy(accuracy=0.5, n=4, per_adapter={"a": 1.0, "none": 0.0})
    assert RoutingAccuracy.from_dict(routing.to_dict()) == routing
    assert RoutingAccuracy.from_dict({"accuracy": None, "n": 0}).per_adapter == {}


def test_update_metadata_records_evaluation_and_nightly_fields(tmp_path):
    _write(tmp_path, _meta(), {"texts": ["press"]})
    row = _row(EvalJob("toy-press", ((_env("toy-press"), 1),)), Rate.of(0, 1), Rate.of(1, 1), 0.05)
    meta = adapters.update_metadata(
        tmp_path, "toy-press", eval=row.to_dict(), promoted=row.promoted, promotion=row.reason,
        train_key="k1", night="2026-01-02", note="kept",
    )  # fmt: skip
    assert meta.metrics.eval == row and meta.train_key == "k1" and meta.extra == {"note": "kept"}
    again = adapters.metadata(tmp_path, "toy-press")
    assert again == meta
    on_disk = json.loads((tmp_path / "adapters" / "toy-press" / "meta.json").read_text())
    assert on_disk["night"] == "2026-01-02" and on_disk["note"] == "kept"
    assert on_disk["metrics"]["eval"] == row.to_dict()


# documents written before ----------------------------------------------------------------------
def test_metadata_without_version_env_ids_or_action_reads_as_version_0():
    old = _old_meta()
    for key in ("version", "train_key", "night"):
        del old[key]
    del old["capability"]["env_ids"], old["capability"]["action"]
    del old["metrics"]["eval"]["env_ids"], old["metrics"]["eval"]["sequential"]
    meta = AdapterMetadata.from_dict(old)
    assert meta.version == AdapterMetadata.VERSION
    assert meta.env_ids == ["budget-f94c5c1c97"] and meta.capability.action is None
    assert meta.metrics.eval is not None and meta.metrics.eval.sequential is None
    assert meta.metrics.eval.env_ids == (
        "budget-f94c5c1c97", "exact_arguments-cc36fd8376", "requested_action-3577fa0b11"
    )  # fmt: skip
    assert meta.train_key is None and "train_key" not in meta.to_dict()


def test_an_unevaluated_adapter_reads_with_no_evaluation():
    old = _old_meta()
    old["metrics"]["eval"] = None
    old["promoted"], old["promotion"] = False, "not evaluated yet"
    meta = AdapterMetadata.from_dict(old)
    assert meta.metrics.eval is None and meta.evaluation is None and not meta.promoted


# bad documents -----------------------------------------------------------------------------------
def _broken(change: Any) -> dict[str, Any]:
    data = copy.deepcopy(_old_meta())
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d.pop("adapter_id"), "'adapter_id'"),
        (lambda d: d.pop("capability"), "no 'capability'"),
        (lambda d: d.__setitem__("capability", "refund"), "'capability' must be an object"),
        (lambda d: d["capability"].pop("env_id"), "'env_id'"),
        (lambda d: d["base_model"].pop("name"), "'name'"),
        (lambda d: d.__setitem__("version", 99), "version 99"),
        (lambda d: d["metrics"]["eval"].pop("base"), "no 'base' rate"),
        (lambda d: d["metrics"]["eval"]["adapter"].__setitem__("n", "six"), "'n'"),
    ],
)
def test_a_bad_metadata_document_is_a_named_error(change, words):
    with pytest.raises(AdapterDocumentError, match=words) as caught:
        AdapterMetadata.from_dict(_broken(change))
    assert isinstance(caught.value, DocumentError) and isinstance(caught.value, AdapterError)


def test_a_bad_meta_json_names_the_file_and_listing_skips_it(tmp_path):
    _write(tmp_path, _meta("good"))
    _write(tmp_path, {"adapter_id": "bad", "capability": {"env_id": "e"}})
    (Home.at(tmp_path).adapters / "broken").mkdir()
    (Home.at(tmp_path).adapters / "broken" / "meta.json").write_text("{not json")
    assert [m.adapter_id for m in adapters.all_metadata(tmp_path)] == ["good"]
    with pytest.raises(AdapterDocumentError, match=r"bad[/\\]meta.json.*'base_model'"):
        adapters.metadata(tmp_path, "bad")
    with pytest.raises(AdapterDocumentError, match="not valid JSON"):
        adapters.show(tmp_path, "broken")
    with pytest.raises(AdapterError, match=r"no adapter 'nope'.*have: good"):
        adapters.metadata(tmp_path, "nope")


def test_a_bad_router_json_is_a_named_error(tmp_path):
    _write(tmp_path, _meta(), {"text": ["typo"]})
    with pytest.raises(AdapterDocumentError, match=r"router.json.*'texts' list"):
        adapters.read_router_texts(tmp_path, "toy-press")


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ([], "must be an object"),
        ({"env_id": "e", "base": {}, "adapter": {}}, "'adapter_id'"),
        ({"adapter_id": "a", "env_id": "e", "adapter": {"passed": 1, "n": 1}}, "no 'base'"),
        (
            {
                "adapter_id": "a",
                "env_id": "e",
                "base": {"passed": 1, "n": 1, "ci95": [0]},
                "adapter": {"passed": 1, "n": 1},
            },
            "ci95",
        ),
    ],
)
def test_a_bad_evaluation_row_is_a_named_error(data, words):
    with pytest.raises(EvaluationError, match=words):
        EvaluationRow.from_dict(data)


def test_a_bad_routing_accuracy_is_a_named_error():
    with pytest.raises(RoutingError, match="'n'"):
        RoutingAccuracy.from_dict({"accuracy": 1.0})
    with pytest.raises(RoutingError, match="per_adapter"):
        RoutingAccuracy.from_dict({"accuracy": 1.0, "n": 2, "per_adapter": [1]})
