"""gaps.json as a typed document: `GapsDocument` round-trips with today's keys, reads the home
written before typed documents (and a document without a version), keeps records that are not
gaps in place, and names what is wrong with a damaged document; `analyze` writes it at
`Home.gaps` with the same keys as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracegym.analysis.gap import (
    Gap,
    GapMember,
    GapsDocument,
    GapsDocumentError,
    GapThresholds,
    NotAGap,
    RejectedCandidate,
    RunCounts,
)
from tracegym.store.home import DocumentError, Home

OLD_HOME = Path(__file__).resolve().parents[1] / "fixtures" / "home_before_typed_documents"
KEYS = ["version", "generated_at", "runs", "contrast", "thresholds", "gaps", "rejected",
        "detector_errors"]  # fmt: skip


def _document(**changes: object) -> GapsDocument:
    gap = Gap(id="gap-1", name="tool_errors_pay", key="tool_errors:pay", kind="finding",
              detector="tool_errors", rank=1, coverage=1.0, delta=0.9, stability=10,
              tools=("pay",),
              members=(GapMember("t1", "r1", 2, 3, "agent", ("s1",), "e"),))  # fmt: skip
    fields: dict[str, object] = {
        "generated_at": "2026-01-02T03:04:05Z",
        "runs": RunCounts(total=40, failed=20, succeeded=19, unknown=1),
        "contrast": "failed vs successful runs",
        "thresholds": GapThresholds(
            min_coverage=0.1, min_delta=0.2, resamples=10, min_stability=8, seed=3
        ),
        "gaps": (gap,),
        "rejected": (RejectedCandidate("cluster:ab", "cluster", 0.4231, -0.0315, 2, "delta"),),
        "detector_errors": {"mine": "ValueError: no"},
    }
    fields.update(changes)
    return GapsDocument(**fields)  # type: ignore[arg-type]


def test_round_trip_through_json_keeps_todays_keys():
    document = _document()
    data = json.loads(json.dumps(document.to_dict()))
    assert list(data) == KEYS and data["version"] == GapsDocument.VERSION == 1
    assert data["runs"] == {"total": 40, "failed": 20, "succeeded": 19, "unknown": 1}
    assert data["thresholds"] == {"min_coverage": 0.1, "min_delta": 0.2, "resamples": 10,
                                  "min_stability": 8, "seed": 3}  # fmt: skip
    assert data["rejected"] == [{"key": "cluster:ab", "kind": "cluster", "coverage": 0.4231,
                                 "delta": -0.0315, "stability": 2, "why": "delta"}]  # fmt: skip
    assert GapsDocument.from_dict(data) == document
    # a filtered analysis says so; a later version's fields are kept through a read and write
    filtered = _document(where="success = false")
    data = {**filtered.to_dict(), "future": {"x": 1}}
    assert list(data) == [*KEYS, "where", "future"]
    again = GapsDocument.from_dict(data)
    assert again.where == "success = false" and again.extra == {"future": {"x": 1}}
    assert again.to_dict() == data


def test_write_and_read_go_through_the_home(tmp_path: Path):
    document = _document()
    path = document.write(tmp_path / "home")
    assert path == Home.at(tmp_path / "home").gaps
    assert GapsDocument.read(tmp_path / "home") == document
    assert GapsDocument.read_file(path) == document
    with pytest.raises(FileNotFoundError):
        GapsDocument.read(tmp_path / "none")


def test_the_home_before_typed_documents_reads():
    raw = json.loads((OLD_HOME / "gaps.json").read_text(encoding="utf-8"))
    document = GapsDocument.read(OLD_HOME)
    assert document.gaps and all(isinstance(g, Gap) for g in document.gaps)
    assert [g.id for g in document.gaps] == [r["id"] for r in raw["gaps"]]
    assert document.runs == RunCounts(**raw["runs"]) and document.not_gaps == ()
    assert document.thresholds.resamples == raw["thresholds"]["resamples"]
    assert [r.key for r in document.rejected] == [r["key"] for r in raw["rejected"]]
    assert document.to_dict() == raw  # read and written back, the document is unchanged


def test_a_document_without_a_version_reads_as_version_0():
    older = {"gaps": [{"id": "gap-1", "key": "budget_waste:out_of_steps",
                       "examples": [{"trace_id": "t"}]}]}  # fmt: skip
    document = GapsDocument.from_dict(older)
    assert document.version == 0 and document.runs == RunCounts() and document.rejected == ()
    assert document.generated_at is None and document.thresholds == GapThresholds()
    [gap] = document.gaps
    assert gap.detector == "budget_waste" and [m.trace_id for m in gap.members] == ["t"]


def test_a_record_that_is_no_gap_is_kept_in_its_place():
    good = _document().gaps[0].to_dict()
    no_detector = {"id": "gap-x", "name": "x", "key": "cluster:1", "signatures": ["plain text"]}
    data = {**_document().to_dict(), "gaps": [no_detector, good]}
    document = GapsDocument.from_dict(data)
    assert [g.id for g in document.gaps] == ["gap-1"]
    [bad] = document.not_gaps
    assert isinstance(bad, NotAGap) and (bad.index, bad.gap_id, bad.name) == (0, "gap-x", "x")
    assert "names no detector" in bad.reason
    assert document.to_dict() == data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object with a 'gaps' list"),
        ({"version": 2, "gaps": []}, "gaps.json version 2 is not supported (expected 1)"),
        ({"version": "1", "gaps": []}, "gaps.json version '1' is not supported"),
        ({"version": 1, "gaps": {}}, "'gaps' must be a list, got dict"),
        ({"version": 1, "gaps": [3]}, "gaps[0] must be an object, got int"),
        ({"version": 1, "gaps": [{"key": "x"}]}, "gaps[0] has no 'id' string"),
        ({"version": 1, "gaps": [{"id": "g"}]}, "gaps[0] (g) has neither 'key' nor 'detector'"),
        ({"version": 1, "gaps": [{"id": "g", "key": "k", "tools": "a"}]},
         "gaps[0] (g): 'tools' must be a list"),
        ({"version": 1, "gaps": [], "runs": [1]}, "'runs' must be an object, got list"),
        ({"version": 1, "gaps": [], "rejected": {}}, "'rejected' must be a list, got dict"),
        ({"version": 1, "gaps": [], "rejected": [2]}, "a rejected candidate must be an object"),
    ],
)  # fmt: skip
def test_a_damaged_document_says_what_is_wrong(data: object, message: str):
    with pytest.raises(GapsDocumentError) as info:
        GapsDocument.from_dict(data)  # type: ignore[arg-type]
    assert message in str(info.value) and isinstance(info.value, DocumentError)


def test_not_strict_leaves_out_records_not_shaped_like_gaps():
    good = _document().gaps[0].to_dict()
    document = GapsDocument.from_dict({"version": 1, "gaps": [3, {"key": "x"}, good]},
                                      strict=False)  # fmt: skip
    assert [g.id for g in document.gaps] == ["gap-1"]
    assert [(b.index, b.gap_id) for b in document.not_gaps] == [(0, None), (1, None)]
    assert "a gap must be an object, got int" in document.not_gaps[0].reason


def test_a_damaged_file_is_named(tmp_path: Path):
    path = Home.at(tmp_path).gaps
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(DocumentError, match="is not valid JSON") as info:
        GapsDocument.read(tmp_path)
    assert str(path) in str(info.value)
    path.write_text('{"version": 1, "gaps": [3]}', encoding="utf-8")
    with pytest.raises(GapsDocumentError, match="gaps\\[0\\] must be an object") as info:
        GapsDocument.read(tmp_path)
    assert str(path) in str(info.value)


def test_analyze_writes_the_document_with_todays_keys(tmp_path: Path):
    pytest.importorskip("duckdb")
    pytest.importorskip("sklearn")
    from tracegym.analysis.pipeline import analyze
    from tracegym.tests.fixtures.declined_store import write_declined_store
    from tracegym.tests.fixtures.hash_embedder import HashEmbedder

    write_declined_store(tmp_path)
    result = analyze(tmp_path, embedder=HashEmbedder(tmp_path / "cache"))
    written = json.loads(Home.at(tmp_path).gaps.read_text(encoding="utf-8"))
    assert list(written) == KEYS and written["version"] == 1
    assert list(written["runs"]) == ["total", "failed", "succeeded", "unknown"]
    assert list(written["thresholds"]) == ["min_coverage", "min_delta", "resamples",
                                           "min_stability", "seed"]  # fmt: skip
    assert all(list(r) == ["key", "kind", "coverage", "delta", "stability", "why"]
               for r in written["rejected"])  # fmt: skip
    document = GapsDocument.read(tmp_path)
    assert document.gaps == tuple(result.gaps) and document.runs.total == 40
    assert document.to_dict() == written
