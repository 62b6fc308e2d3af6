"""The import driver: all or nothing, no duplicate runs across files, labels given later."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.store.importers import ImportFormatError, import_path
from tracegym.store.store import Store


def _run(text: str, success: bool) -> dict:
    return {
        "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}],
        "outcome": {"success": success},
    }


def _counts(home: Path) -> tuple:
    with Store(home) as store:
        return store.sql(
            "SELECT (SELECT count(*) FROM spans), (SELECT count(DISTINCT span_id) FROM spans), "
            "(SELECT count(*) FROM traces)"
        ).fetchall()[0]


def test_a_run_in_two_files_is_stored_once(tmp_path: Path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps([_run("one", True), _run("two", False)]))
    second.write_text(json.dumps([_run("two", False), _run("three", True)]))
    home = tmp_path / "home"
    assert import_path("openai-chat", first, home).runs == 2
    report = import_path("openai-chat", second, home)
    assert (report.runs, report.repeated_runs) == (1, 1)
    spans, distinct, traces = _counts(home)
    assert spans == distinct and traces == 3
    again = import_path("openai-chat", second, home)
    assert again.already_imported == [second] and again.files == 0


def test_nothing_is_written_when_one_file_of_a_folder_is_bad(tmp_path: Path):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps([_run("one", True)]))
    (folder / "b.json").write_text('[{"messages": [')
    home = tmp_path / "home"
    with pytest.raises(ImportFormatError, match=r"b\.json"):
        import_path("openai-chat", folder, home)
    assert not (home / "spool").exists() or not list((home / "spool").iterdir())
    assert not (home / "imports").exists() or not list((home / "imports").iterdir())


# ---------------------------------------------------------------------------------------------
# What the store already holds is not written again, whoever wrote it


def _traced_home(home: Path, tracer_setup) -> None:
    """Two runs the tracer recorded in process (agent, LLM call, tool), with outcomes."""
    import tracegym as tg

    tracer_setup(home=home, flush_interval_s=0.05)

    @tg.tool
    def lookup(order_id: str) -> str:
        return "shipped"

    @tg.llm(model="gpt-test")
    def chat(prompt: str) -> dict:
        return {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1}}  # fmt: skip

    @tg.agent(name="support", run_id=lambda task: task)
    def run(task: str) -> str:
        chat(task)
        return lookup(task)

    run("A1")
    run("B2")
    tg.record_outcome("A1", success=True, source="verifier")
    tg.record_outcome("B2", success=False, source="verifier")
    assert tg.flush(10)


def _store_counts(home: Path) -> tuple:
    with Store(home) as store:
        return store.sql(
            "SELECT (SELECT count(*) FROM spans), (SELECT count(DISTINCT span_id) FROM spans), "
            "(SELECT count(*) FROM _outcome_spans), (SELECT count(*) FROM traces), "
            "(SELECT count(*) FROM tool_calls), (SELECT count(*) FROM llm_calls)"
        ).fetchall()[0]


def _export(home: Path, out: Path) -> None:
    from tracegym.cli import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["export", "otlp-json", "--home", str(home), "-o", str(out)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("where", ["spool", "lake"])
def test_export_imported_back_into_its_own_home_adds_nothing(
    tmp_path: Path, tracer_setup, where: str
):
    import tracegym as tg

    home, fresh, out = tmp_path / "home", tmp_path / "fresh", tmp_path / "runs.jsonl"
    _traced_home(home, tracer_setup)
    if where == "lake":
        tg.shutdown()  # closes the spool file, so that compaction takes it into the lake
        with Store(home) as store:
            store.compact()
        assert not list((home / "spool").glob("*.jsonl"))
        assert list((home / "lake").rglob("*.parquet"))
    before = _store_counts(home)
    assert before == (6, 6, 2, 2, 2, 2)
    _export(home, out)

    report = import_path("otlp-json", out, home)
    assert (report.runs, report.spans) == (0, 0)
    assert (report.repeated_runs, report.repeated_spans) == (2, 8)  # 6 spans and 2 outcomes
    assert report.spool_files == []
    assert _store_counts(home) == before
    assert import_path("otlp-json", out, home).already_imported == [out]

    report = import_path("otlp-json", out, fresh)  # a fresh home gets everything
    assert (report.runs, report.spans, report.repeated_runs, report.repeated_spans) == (2, 6, 0, 0)
    assert _store_counts(fresh) == before


def test_only_the_spans_missing_from_a_stored_trace_are_written(tmp_path: Path, tracer_setup):
    home, out = tmp_path / "home", tmp_path / "runs.jsonl"
    _traced_home(home, tracer_setup)
    _export(home, out)
    with Store(home) as store:
        ((trace_id, span_id),) = store.sql(
            "SELECT trace_id, span_id FROM tool_calls WHERE trace_id = "
            "(SELECT trace_id FROM traces WHERE run_id = 'A1')"
        ).fetchall()
    partial = tmp_path / "partial"  # the same home, less one tool span
    from tracegym.store.records import write_spool_file
    from tracegym.tracer.spool import iter_spool

    kept = [r for r in iter_spool(home) if r["span_id"] != span_id]
    write_spool_file(partial, kept, "copy")
    report = import_path("otlp-json", out, partial)
    assert (report.runs, report.spans, report.repeated_runs, report.repeated_spans) == (1, 1, 1, 7)
    assert _store_counts(partial) == _store_counts(home)
    with Store(partial) as store:
        assert store.sql("SELECT trace_id, span_id FROM tool_calls WHERE span_id = $s",
                         {"s": span_id}).fetchall() == [(trace_id, span_id)]  # fmt: skip


def test_an_outcome_with_new_labels_still_arrives(tmp_path: Path):
    """Outcome ids derive from the run and the source: new labels reuse them, and must land."""
    from tracegym.store.records import outcome_record, span_record, stable_id, write_spool_file
    from tracegym.tracer import semconv as sc

    trace = stable_id("trace", "t")
    span = span_record(trace_id=trace, span_id=stable_id("s", width=16), name="invoke_agent a",
                       start_ns=1, end_ns=2, attributes={sc.OPERATION: sc.OP_AGENT})  # fmt: skip
    first = outcome_record(trace, time_ns=3, success=False, labels=["wrong_tool"])
    home = tmp_path / "home"
    write_spool_file(home, [span, first], "traced")
    relabelled = outcome_record(trace, time_ns=4, success=False, labels=["bad_plan"])
    assert (relabelled["trace_id"], relabelled["span_id"]) == (first["trace_id"], first["span_id"])
    source = tmp_path / "labelled.jsonl"
    _write_otlp(source, [span, relabelled])
    report = import_path("otlp-json", source, home)
    assert (report.spans, report.repeated_spans) == (0, 1)  # the span, not the outcome
    with Store(home) as store:
        labels = store.sql("SELECT outcome_labels FROM traces").fetchall()
    assert "bad_plan" in str(labels)
    again = tmp_path / "again.jsonl"  # the very same outcome is not stored twice
    again.write_bytes(source.read_bytes() + b"\n")
    report = import_path("otlp-json", again, home)
    assert (report.repeated_runs, report.repeated_spans) == (1, 1)  # the registry knew the run
    with Store(home) as store:
        assert store.sql("SELECT count(*) FROM _outcome_spans").fetchall() == [(2,)]


def _write_otlp(path: Path, records: list[dict]) -> None:
    from tracegym.store.exporters.otlp_json import request

    path.write_text(json.dumps(request(records)) + "\n")


def test_without_duckdb_the_spool_is_checked(tmp_path: Path, tracer_setup, monkeypatch):
    import sys

    home, out = tmp_path / "home", tmp_path / "runs.jsonl"
    _traced_home(home, tracer_setup)
    before = _store_counts(home)
    _export(home, out)
    monkeypatch.setitem(sys.modules, "tracegym.store.store", None)  # import fails: no DuckDB
    report = import_path("otlp-json", out, home)
    assert (report.runs, report.spans, report.repeated_spans) == (0, 0, 8)
    monkeypatch.undo()
    assert _store_counts(home) == before
