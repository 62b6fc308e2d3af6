"""The home's paths and its atomic JSON documents."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tracegym.store.home import DocumentError, Home, read_json, write_json
from tracegym.tracer.spool_files import spool_dir


def test_paths_are_under_the_root_and_agree_with_the_tracer(tmp_path: Path) -> None:
    home = Home.at(tmp_path)
    assert home.spool == spool_dir(tmp_path)
    assert home.gaps == tmp_path / "gaps.json"
    assert home.environment("e1") == tmp_path / "envs" / "e1"
    assert home.synthesis_report.parent == home.environments
    assert home.night("2026-01-02").parent == home.nightly
    assert Home.at(home) is home
    assert os.fspath(home) == str(tmp_path)
    assert not any(tmp_path.iterdir())  # building paths creates nothing


def test_write_json_replaces_whole_documents_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "doc.json"
    write_json(target, {"a": 1})
    write_json(target, {"b": [1, 2], "when": Path("/x")})
    assert json.loads(target.read_text()) == {"b": [1, 2], "when": "/x"}
    assert [p.name for p in target.parent.iterdir()] == ["doc.json"]


def test_a_failed_write_keeps_the_old_document(tmp_path: Path) -> None:
    target = tmp_path / "doc.json"
    write_json(target, {"a": 1})

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        write_json(target, {"bad": Unprintable()})
    assert read_json(target) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_read_json_names_a_damaged_file_and_defaults_a_missing_one(tmp_path: Path) -> None:
    bad = tmp_path / "gaps.json"
    bad.write_text("{not json")
    with pytest.raises(DocumentError, match=r"gaps\.json"):
        read_json(bad)
    assert read_json(tmp_path / "missing.json", default=None) is None
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "missing.json")


def test_write_text_replaces_a_text_file_whole(tmp_path: Path) -> None:
    from tracegym.store.home import write_text

    target = tmp_path / "night" / "report.md"
    write_text(target, "# one\n")
    write_text(target, "# two\n")
    assert target.read_text() == "# two\n"
    assert [p.name for p in target.parent.iterdir()] == ["report.md"]
