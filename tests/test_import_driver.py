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
