"""The dashboard over a home written before the stages handed each other typed documents
(tests/fixtures/home_before_typed_documents: documents only, no lake or spool): every page
answers and shows the gaps, environments, adapters and nights it holds, and a damaged document
shows a note rather than taking its page down.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.asgi import asgi_get

pytest.importorskip("starlette")
pytest.importorskip("duckdb")

OLD_HOME = Path(__file__).resolve().parents[1] / "fixtures" / "home_before_typed_documents"


def _raw(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture
def old_home(tmp_path: Path) -> Path:
    """A copy (the dashboard writes nothing, but a test must not risk the fixture)."""
    return Path(shutil.copytree(OLD_HOME, tmp_path / "home"))


def test_old_home_pages_show_its_gaps_environments_adapters_and_nights(old_home: Path):
    from tracegym.dashboards.app import create_app

    app = create_app(old_home)
    gaps = _raw(old_home / "gaps.json")
    envs = _raw(old_home / "envs" / "index.json")["environments"]
    metas = [_raw(p) for p in sorted((old_home / "adapters").glob("*/meta.json"))]
    nights = [json.loads(line) for line in (old_home / "nightly" / "history.jsonl").open()]
    assert gaps["gaps"] and envs and metas and nights  # the fixture has each

    pages: dict[str, str] = {}
    paths = ["/", "/gaps", "/environments", "/adapters", "/runs", "/sessions"]
    for path in paths + [f"/environments/{e['env_id']}" for e in envs]:
        status, body = asgi_get(app, path)
        assert status == 200, (path, body[:500])
        assert 'class="error"' not in body, (path, body)
        pages[path] = body

    runs = gaps["runs"]
    assert f"{runs['failed']} failed / {runs['total']} runs analysed" in pages["/"]
    assert 'class="note"' not in pages["/gaps"]  # gaps.json read whole: nothing left out
    assert pages["/gaps"].count('class="gap-row"') == len(gaps["gaps"])
    for gap in gaps["gaps"]:
        assert f"<b>{gap['name']}</b>" in pages["/gaps"]
        assert f"{gap['stability']}/{gaps['thresholds']['resamples']}" in pages["/gaps"]
    assert f"Candidates not kept ({len(gaps['rejected'])})" in pages["/gaps"]

    assert 'class="note"' not in pages["/environments"]
    for env in envs:
        assert f">{env['env_id']}</a>" in pages["/environments"]
        detail = pages[f"/environments/{env['env_id']}"]
        assert 'id="oracle"' in detail and env["gap_name"] in detail

    for meta in metas:
        assert meta["adapter_id"] in pages["/adapters"]
        assert meta["capability"]["name"] in pages["/adapters"]
        assert meta["adapter_id"] in pages["/"]  # the night's before -> after
    assert "Routing accuracy" in pages["/adapters"]
    for night in nights:
        assert f"<td>{night['date']}</td>" in pages["/"]
        assert f"night of {night['date']}" in pages["/adapters"]


def test_old_home_documents_read_typed(old_home: Path):
    from tracegym.analysis.gap import GapsDocument
    from tracegym.dashboards import artifacts

    document, note = artifacts.gaps_document(old_home)
    assert note is None and isinstance(document, GapsDocument)
    gaps, bad = artifacts.gaps(document)
    assert bad is None
    assert [g.id for g in gaps] == [g["id"] for g in _raw(old_home / "gaps.json")["gaps"]]
    assert document.runs.total == _raw(old_home / "gaps.json")["runs"]["total"]


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"gaps": "none"}', "\xff\xfe"])
def test_a_damaged_gaps_file_is_a_note_not_a_crash(old_home: Path, damage: str):
    from tracegym.dashboards import artifacts
    from tracegym.dashboards.app import create_app

    (old_home / "gaps.json").write_bytes(damage.encode("latin-1"))
    document, note = artifacts.gaps_document(old_home)
    assert not document.gaps and note and "gaps.json" in note
    status, body = asgi_get(create_app(old_home), "/gaps")
    assert status == 200 and 'class="note"' in body and "no gaps" in body


def test_a_gap_record_that_is_not_a_gap_is_left_out_and_named(old_home: Path):
    from tracegym.dashboards import artifacts

    data = _raw(old_home / "gaps.json")
    data["gaps"].append({"id": "gap-odd", "key": "k", "kind": "finding", "signatures": "x"})
    (old_home / "gaps.json").write_text(json.dumps(data))
    document, note = artifacts.gaps_document(old_home)
    gaps, bad = artifacts.gaps(document)
    assert note is None and len(gaps) == len(data["gaps"]) - 1
    assert bad is not None and bad.startswith("not gaps, left out: gap-odd (")


def test_an_adapter_whose_metadata_is_damaged_is_left_out(old_home: Path):
    from tracegym.dashboards.app import create_app

    damaged, kept = sorted((old_home / "adapters").glob("*/meta.json"))
    damaged.write_text('{"adapter_id": "x"')
    status, body = asgi_get(create_app(old_home), "/adapters")
    assert status == 200
    assert _raw(kept)["adapter_id"] in body and damaged.parent.name not in body


def test_old_home_nights_read_as_the_nightly_reads_them(old_home: Path):
    """The dashboard reads a night as jobs.nightly's types: its history line a NightRecord, its
    report a NightlyReport, with the same rows and routing."""
    from tracegym.dashboards import artifacts
    from tracegym.jobs.nightly import NightlyReport, read_history
    from tracegym.store.home import Home

    nights = artifacts.nightly_history(old_home)
    records = read_history(old_home)
    assert [n.date for n in nights] == sorted({r.date for r in records}, reverse=True)
    for night in nights:
        record = next(r for r in reversed(records) if r.date == night.date)
        report = NightlyReport.from_dict(_raw(Home.at(old_home).night_report(night.date)))
        assert night.record == record and night.report == report
        assert night.stages == record.stages
        assert list(night.evaluation) == report.evaluation and night.evaluation
        assert night.routing == report.routing and night.routing is not None


def test_a_damaged_evaluation_row_leaves_the_rest_of_the_night(old_home: Path):
    from tracegym.dashboards.app import create_app
    from tracegym.store.home import Home, write_json

    date = json.loads((old_home / "nightly" / "history.jsonl").read_text().splitlines()[-1])["date"]
    path = Home.at(old_home).night_report(date)
    report = _raw(path)
    damaged, *kept = report["evaluation"]
    assert kept
    report["evaluation"][0] = {**damaged, "base": "not a rate"}
    write_json(path, report)
    status, body = asgi_get(create_app(old_home), "/")
    assert status == 200
    assert f"{damaged['adapter_id']}: " not in body
    assert all(f"{row['adapter_id']}: " in body for row in kept)


def test_a_damaged_part_of_the_report_leaves_the_parts_that_read(old_home: Path):
    """report.json that does not read whole as a NightlyReport (an adapter entry and one
    stage's result damaged) still gives the night its rows, routing and other stages."""
    from tracegym.dashboards import artifacts
    from tracegym.jobs.nightly import NightlyReport, SynthesizeResult
    from tracegym.store.home import Home, write_json

    (night,) = artifacts.nightly_history(old_home)
    path = Home.at(old_home).night_report(night.date)
    report = _raw(path)
    report["adapters"][0] = "not an adapter"
    report["stages"]["train"]["failed"] = ["not a failure"]
    write_json(path, report)
    with pytest.raises(ValueError):
        NightlyReport.from_dict(report)

    (damaged,) = artifacts.nightly_history(old_home)
    assert damaged.record == night.record
    assert damaged.evaluation == night.evaluation and damaged.evaluation
    assert damaged.routing == night.routing and damaged.routing is not None
    assert "train" not in damaged.report.stages
    assert isinstance(damaged.report.stages["synthesize"], SynthesizeResult)
    assert damaged.without_environment == night.without_environment
