"""The typed contract between analysis and its readers: `Gap` round-trips through gaps.json,
reads older records, lists every member run; the `gap_runs` view and the dashboard's run filter
show the same member runs as gaps.json; the view is empty and typed without a gaps.json."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("sklearn")

from rich.console import Console
from tracegym.analysis.commands import render_gaps
from tracegym.analysis.gap import Gap, GapError, GapMember, GapRequest, Symptom
from tracegym.analysis.pipeline import analyze
from tracegym.store.store import Store
from tracegym.tests.fixtures.hash_embedder import HashEmbedder
from tracegym.tests.fixtures.seat_agent import write_seat_agent


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("seat")
    truth = write_seat_agent(home, failed=13)
    result = analyze(home, embedder=HashEmbedder(home / "cache"))
    return home, truth, result


def _gap() -> Gap:
    return Gap(
        id="gap-0123456789", name="wrong_tool_order_a_before_b", key="wrong_tool_order:a>b",
        kind="finding", detector="wrong_tool_order", description="d", rank=1, coverage=0.5,
        delta=0.4, stability=9, failed_runs_lacking=7, successful_runs_lacking=1,
        tools=("b", "a"), argument_patterns=("b(x=<id>)",),
        members=tuple(GapMember(f"t{i}", f"r{i}", i, i + 1, "agent", (f"s{i}", "s"), f"e{i}")
                      for i in range(7)),
        requests=(GapRequest("do b", {"tool": "a", "arguments": {"x": 1}}),),
        successful_behaviour="10/10 call a", signatures=("wrong_tool_order: ...",),
        symptoms=(Symptom("budget_waste:out_of_steps", "budget_waste_out_of_steps",
                          "budget_waste", 7, 7, 7, "follows"),),
        within_kind={"kinds": ["b"], "failed": 8, "succeeded": 9, "delta": 0.5, "stability": 9},
    )  # fmt: skip


def test_gap_round_trips_through_json():
    gap = _gap()
    record = json.loads(json.dumps(gap.to_dict()))
    assert Gap.from_dict(record) == gap
    assert len(record["members"]) == 7 and len(record["examples"]) == 5  # examples: the first 5
    assert record["examples"] == record["members"][:5]


def test_older_records_read_and_bad_ones_say_why():
    old = {"id": "gap-1", "key": "budget_waste:out_of_steps", "detector": None,
           "examples": [{"trace_id": "t", "span_ids": ["s"], "step": 2}], "rank": 3,
           "custom": {"kept": True}}  # fmt: skip
    gap = Gap.from_dict(old)
    assert gap.detector == "budget_waste" and gap.kind == "finding" and gap.rank == 3
    assert [m.trace_id for m in gap.members] == ["t"] and gap.members[0].step == 2
    assert gap.to_dict()["custom"] == {"kept": True}  # fields a later version adds survive
    signatures = ["premature_finish: x\naround: a > b", "premature_finish: y"]
    cluster = {"id": "gap-2", "key": "cluster:ab", "kind": "cluster", "signatures": signatures}
    assert Gap.from_dict(cluster).detector == "premature_finish"
    with pytest.raises(GapError, match="names no detector"):
        Gap.from_dict({"id": "gap-3", "key": "cluster:cd", "kind": "cluster"})
    with pytest.raises(GapError, match="'id'"):
        Gap.from_dict({"key": "x:y"})
    with pytest.raises(GapError, match="'tools' must be a list"):
        Gap.from_dict({"id": "g", "key": "x:y", "tools": "a"})


def test_every_failed_run_of_a_gap_is_listed(seat):
    home, truth, result = seat
    failed = {r.trace_id for r in result.failed}
    assert result.gaps
    document = json.loads((home / "gaps.json").read_text())
    for gap, record in zip(result.gaps, document["gaps"], strict=True):
        assert Gap.from_dict(record) == gap
        ids = [m.trace_id for m in gap.members]
        assert len(ids) == len(set(ids)) == gap.failed_runs_lacking > 5  # more than examples
        assert set(ids) <= failed
        runs = {r.trace_id: r for r in result.runs}
        for m in gap.members:  # the decisive step is a step of that run
            assert runs[m.trace_id].steps[m.position].span_id == m.span_ids[0]
    assert {m.trace_id for m in result.gaps[0].members} == truth["wrong_order"]


def test_gap_runs_view_lists_the_same_members(seat):
    home, _, result = seat
    with Store(home) as store:
        rows = store.sql(
            "SELECT gap_id, gap_name, rank, detector, trace_id, run_id, step, position, "
            "span_ids, evidence FROM gap_runs ORDER BY rank, trace_id"
        ).fetchall()
        gap = result.gaps[0]
        one = store.sql("SELECT trace_id FROM gap_runs WHERE gap_id = ?", params=[gap.id])
        assert sorted(r[0] for r in one.fetchall()) == sorted(m.trace_id for m in gap.members)
        joined = store.sql(
            "SELECT count(*) FROM gap_runs g JOIN traces t USING (trace_id) WHERE NOT t.success"
        ).fetchall()[0][0]
    expected = [(g.id, g.name, g.rank, g.detector, m.trace_id, m.run_id, m.step, m.position,
                 list(m.span_ids), m.evidence) for g in result.gaps for m in g.members]  # fmt: skip
    assert rows == sorted(expected, key=lambda r: (r[2], r[4]))
    assert joined == len(rows)


def test_gap_runs_is_empty_and_typed_without_a_gaps_file(tmp_path: Path):
    write_seat_agent(tmp_path, failed=2, succeeded=2, baggage=0)
    with Store(tmp_path) as store:
        types = {r[0]: r[1] for r in store.sql("DESCRIBE gap_runs").fetchall()}
        assert store.sql("SELECT count(*) FROM gap_runs").fetchall()[0][0] == 0
        (tmp_path / "gaps.json").write_text("{not json")  # read when queried: no refresh
        assert store.sql("SELECT count(*) FROM gap_runs").fetchall()[0][0] == 0
        assert store.sql("SELECT count(*) FROM traces").fetchall()[0][0] == 4
    assert types["trace_id"] == "VARCHAR" and types["span_ids"] == "VARCHAR[]"
    assert types["rank"] == "INTEGER" and types["step"] == "BIGINT"


def test_dashboard_filter_and_cli_show_every_member(seat):
    from tracegym.dashboards import artifacts, pages

    home, _, result = seat
    _, traces = pages.finding_options(home)
    for gap in result.gaps:
        assert traces[gap.id] == [m.trace_id for m in gap.members]
    evidence = artifacts.gap_evidence(home)
    assert {t for t, items in evidence.items() if items} == {
        m.trace_id for g in result.gaps for m in g.members
    }
    out = io.StringIO()
    render_gaps(Console(file=out, width=200), result.gaps_document())
    text = out.getvalue()
    for gap in result.gaps:
        assert gap.name in text and f"{len(gap.members)} member runs" in text


def test_dashboard_pages_and_sandboxed_sql_list_every_member(seat):
    pytest.importorskip("uvicorn")
    import threading
    import time
    import urllib.request

    import uvicorn
    from tracegym.dashboards.app import create_app
    from tracegym.dashboards.db import Database

    home, truth, result = seat
    gap = result.gaps[0]
    db = Database(home)  # the dashboard's sandbox reads gaps.json and nothing else of the home
    rows = db.query("SELECT trace_id FROM gap_runs WHERE gap_id = $g", {"g": gap.id}).rows
    assert sorted(r[0] for r in rows) == sorted(m.trace_id for m in gap.members)
    server = uvicorn.Server(uvicorn.Config(create_app(home), host="127.0.0.1", port=0,
                                           log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        with urllib.request.urlopen(url + "/gaps", timeout=60) as response:
            page = response.read().decode()
        with urllib.request.urlopen(url + f"/runs?finding={gap.id}", timeout=60) as response:
            listed = response.read().decode()
    finally:
        server.should_exit = True
        thread.join(10)
    assert f"all {len(gap.members)} member runs" in page
    assert all(s.name in page for s in gap.symptoms) and gap.symptoms
    assert f"{len(truth['wrong_order'])} runs matching" in listed


def test_synthesize_builds_the_cause_not_the_symptom(seat):
    """`synthesize` once built an environment for the symptom, budget_waste_out_of_steps."""
    from tracegym.synthesis.pipeline import load_gaps, synthesize

    home, _, result = seat
    assert [g.id for g in load_gaps(home / "gaps.json")] == [g.id for g in result.gaps]
    report = synthesize(home, n_train=5, n_heldout=5, validity_seeds=20)
    assert [(e.family, e.action) for e in report.environments] == [("tool_order", "change_seat")]
    assert report.environments[0].gap_id == result.gaps[0].id
