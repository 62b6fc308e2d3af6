"""Hostile or filtered input must not crash a command or replace
what the store holds.

11. A 6 KB deeply nested JSON (`'[' * 3000 + ']' * 3000`) ended every importer in a
    RecursionError traceback (exit 1); the docs promise a one-line error and exit code 2.
4.  `analyze --where ...` overwrote `<home>/gaps.json` (which the dashboard and `synthesize`
    read) with the analysis of a subset of the runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.cli import app
from tracegym.store.importers import FORMATS, ImportFormatError, import_path
from typer.testing import CliRunner

DEEP = 3000
SHAPES = {
    "array": "[" * DEEP + "]" * DEEP,
    "object": '{"a":' * DEEP + "1" + "}" * DEEP,
}
IMPORTERS = sorted(FORMATS)  # the issue's six, and any format registered later


def _written(home: Path) -> list[Path]:
    """Whatever an import left in the store: spool files and import registry entries."""
    return sorted(p for sub in ("spool", "imports") if (home / sub).is_dir()
                  for p in (home / sub).iterdir())  # fmt: skip


def _import(home: Path, fmt: str, path: Path):
    return CliRunner().invoke(app, ["--home", str(home), "import", fmt, str(path)])


def _one_line_error(result, path: Path) -> str:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # a message, not a RecursionError
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: nothing imported: ") and str(path) in lines[0]
    assert "nested too deeply" in lines[0]
    return lines[0]


def test_the_issues_six_importers_are_covered() -> None:
    six = {"tau-bench", "tau2-bench", "whowhen", "swe-agent", "openai-chat", "otlp-json"}
    assert six <= set(IMPORTERS)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("fmt", IMPORTERS)
def test_deeply_nested_json_is_a_one_line_error(tmp_path: Path, fmt: str, shape: str) -> None:
    path = tmp_path / f"deep-{shape}.json"
    path.write_text(SHAPES[shape])
    home = tmp_path / "home"
    _one_line_error(_import(home, fmt, path), path)
    assert _written(home) == []


@pytest.mark.parametrize("fmt", ["openai-chat", "otlp-json"])
def test_a_deep_line_of_a_jsonl_file_is_named(tmp_path: Path, fmt: str) -> None:
    good = {
        "openai-chat": {"messages": [{"role": "user", "content": "hi"}]},
        "otlp-json": {"resourceSpans": []},
    }[fmt]
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n" + SHAPES["array"] + "\n")
    home = tmp_path / "home"
    assert "(record line 3)" in _one_line_error(_import(home, fmt, path), path)
    assert _written(home) == []


def test_nothing_of_a_folder_is_imported_when_one_file_is_too_deep(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    (folder / "a.json").write_text(json.dumps([{"messages": messages}]))
    (folder / "b.json").write_text(SHAPES["object"])
    home = tmp_path / "home"
    _one_line_error(_import(home, "openai-chat", folder), folder / "b.json")
    assert _written(home) == []


def test_a_converter_that_recurses_too_deep_is_a_format_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsed fine, but the importer's own walk over it recurses: the driver still names the
    file (whichever importer meets it)."""
    from tracegym.store.importers import whowhen

    def walk(path: Path, data: bytes, **kwargs) -> list:
        return walk(path, data, **kwargs)

    monkeypatch.setattr(whowhen, "convert", walk)
    path = tmp_path / "ok.json"
    path.write_text("{}")
    with pytest.raises(ImportFormatError, match=r"ok\.json: nested too deeply"):
        import_path("whowhen", path, tmp_path / "home")
    assert _written(tmp_path / "home") == []


# analyze --where --------------------------------------------------------------------------------
def _store(home: Path) -> Path:
    """40 runs of one tool: those whose payment is declined fail."""
    from tracegym.tests.fixtures.declined_store import write_declined_store

    return write_declined_store(home)


@pytest.mark.slow
def test_a_filtered_analysis_leaves_the_stores_gaps_json_alone(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    home = _store(tmp_path / "home")
    runner = CliRunner()
    whole = runner.invoke(app, ["--home", str(home), "analyze"])
    assert whole.exit_code == 0, whole.output
    before = (home / "gaps.json").read_bytes()
    assert json.loads(before)["runs"]["total"] == 40

    filtered = runner.invoke(app, ["--home", str(home), "analyze", "--where", "success = false"])
    assert filtered.exit_code == 0, filtered.output
    assert (home / "gaps.json").read_bytes() == before
    assert "filtered by --where: not written" in filtered.output

    output = tmp_path / "failed-only.json"
    kept = runner.invoke(
        app, ["--home", str(home), "analyze", "--where", "success = false", "-o", str(output)]
    )
    assert kept.exit_code == 0, kept.output
    assert (home / "gaps.json").read_bytes() == before
    document = json.loads(output.read_text())
    assert document["where"] == "success = false" and document["runs"]["total"] == 20
    assert document["runs"]["succeeded"] == 0

    as_json = runner.invoke(app, ["--home", str(home), "analyze", "--where", "1 = 1", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["where"] == "1 = 1"
    assert (home / "gaps.json").read_bytes() == before
