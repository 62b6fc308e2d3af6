"""The demo's cached development runs (`demo/stages/dev.json`) through their type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracegym.jobs.demo import DemoDocumentError, DevRuns
from tracegym.store.home import DocumentError, write_json

RUN = {"task_id": "t-1", "seed": 7, "kind": "refund", "passed": True, "messages": []}


def test_dev_runs_round_trip(tmp_path: Path):
    path = tmp_path / "dev.json"
    write_json(path, DevRuns(key="abc", results=[RUN]).to_dict())
    assert json.loads(path.read_text()) == {"version": 1, "key": "abc", "results": [RUN]}
    assert DevRuns.read(path) == DevRuns(key="abc", results=[RUN])


def test_dev_runs_written_before_versions_read_as_version_0(tmp_path: Path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"key": "abc", "results": [RUN]}))
    runs = DevRuns.read(path)
    assert runs is not None and runs.version == 0 and runs.results == [RUN]


def test_no_dev_runs_yet_is_none(tmp_path: Path):
    assert DevRuns.read(tmp_path / "dev.json") is None


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"results": []}, "'key'"),
        ({"key": "abc", "results": {}}, "'results'"),
        ([RUN], "not a JSON object"),
        ({"key": "abc", "results": [], "version": 2}, "version 2"),
    ],
)
def test_damaged_dev_runs_name_the_file_and_what_is_wrong(tmp_path: Path, data, words):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DemoDocumentError, match=words) as caught:
        DevRuns.read(path)
    assert str(path) in str(caught.value) and isinstance(caught.value, DocumentError)
