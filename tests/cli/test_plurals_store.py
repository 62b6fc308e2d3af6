"""The store's commands count in the singular for one: 'imported 1 run', 'exported 1 run (...,
1 outcome)', 'compacted 1 spool file', 'wrote 1 row', and in the plural otherwise."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.cli import app
from tracegym.store.commands import counted
from typer.testing import CliRunner


def _run(home: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["--home", str(home), *args])
    return result.exit_code, result.output


def _chats(path: Path, n: int) -> Path:
    runs = [
        {"messages": [{"role": "user", "content": f"hi {i}"},
                      {"role": "assistant", "content": "yo"}],
         "outcome": {"success": i % 2 == 0}}
        for i in range(n)
    ]  # fmt: skip
    path.write_text(json.dumps(runs))
    return path


def _agrees(text: str) -> None:
    """Every '<n> <noun>' of the nouns these commands count agrees with its number."""
    nouns = r"(runs?|spans?|files?|spool files?|outcomes?|rows?|parts?|examples?)"
    for number, noun in re.findall(rf"\b(\d+) {nouns}\b", text):
        assert noun.endswith("s") == (number != "1"), (number, noun, text)


def test_counted():
    assert [counted(n, "run") for n in (0, 1, 2)] == ["0 runs", "1 run", "2 runs"]
    assert counted(1, "spool file") == "1 spool file"
    assert counted(3, "entry", "entries") == "3 entries"


def test_import_and_export_of_one_run_and_of_two(tmp_path: Path):
    home = tmp_path / "home"
    code, out = _run(home, "import", "openai-chat", str(_chats(tmp_path / "one.json", 1)))
    assert code == 0, out
    assert re.search(r"imported 1 run \(\d+ spans?\) from 1 file as openai-chat", out), out
    _agrees(out)
    code, out = _run(home, "import", "openai-chat", str(tmp_path / "one.json"))
    assert "; 1 file already imported" in out, out
    code, out = _run(home, "export", "otlp-json", "-o", str(tmp_path / "one.jsonl"))
    assert code == 0, out
    assert re.search(r"exported 1 run \(\d+ spans?, 1 outcome\)", out), out
    _agrees(out)

    # three chats, the first the same as the one imported: two new runs, one repeated
    code, out = _run(home, "import", "openai-chat", str(_chats(tmp_path / "three.json", 3)))
    assert re.search(r"imported 2 runs \(\d+ spans\) from 1 file", out), out
    assert "; 1 run already in the store; 1 span already in the store" in out, out
    code, out = _run(home, "export", "otlp-json", "-o", str(tmp_path / "all.jsonl"))
    assert re.search(r"exported 3 runs \(\d+ spans, 3 outcomes\)", out), out
    _agrees(out)


def test_compact_and_sql_output_of_one(tmp_path: Path):
    home = tmp_path / "home"
    _run(home, "import", "openai-chat", str(_chats(tmp_path / "one.json", 1)))
    code, out = _run(home, "compact")
    assert code == 0, out
    assert "compacted 1 spool file, " in out and "0 files still being written" in out, out
    _agrees(out)
    code, out = _run(home, "sql", "SELECT 1 AS x", "-o", str(tmp_path / "x.csv"), "-f", "csv")
    assert code == 0 and f"wrote 1 row to {tmp_path / 'x.csv'}" in out, out
    code, out = _run(home, "sql", "SELECT * FROM range(2)", "-o", str(tmp_path / "y.csv"))
    assert code == 0 and "wrote 2 rows to" in out, out


def test_summary_and_the_judge_plan_count_one_in_the_singular(tmp_path: Path):
    from tracegym.analysis.judge import JudgePlan

    home = tmp_path / "home"
    _run(home, "import", "openai-chat", str(_chats(tmp_path / "one.json", 1)))
    code, out = _run(home, "summary")
    assert code == 0, out
    assert re.search(r"records\W+\d+ \(\d+ spans \+ 1 outcome\)", out), out
    plan = JudgePlan(failed_shown=1, runs=1, labellers=1, prompt_tokens=10, reply_tokens=5)
    assert "1 to propose from 1 failed run, 1 labeller x 1 run)" in plan.describe()
    plan = JudgePlan(failed_shown=2, runs=4, labellers=3, prompt_tokens=10, reply_tokens=5)
    assert "from 2 failed runs, 3 labellers x 4 runs)" in plan.describe()
