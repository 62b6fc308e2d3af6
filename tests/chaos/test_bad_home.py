"""Every command that reads a home refuses a missing one (or a file) with a
one-line error and exit code 2, instead of answering from an empty store; `outcome` for a run
the store does not hold (yet) warns and still records.

Reproduction: `tracegym --home /nonexistent traces` (and `sql`, `show`, a home that is a file)
printed an empty table with exit code 0; `tracegym outcome NO-SUCH-RUN --success` said nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracegym.cli import app
from typer.testing import CliRunner

# Every command that reads a home (cli_options.py); demo, import and collect create theirs.
READERS = [
    ["traces"],
    ["sql", "SELECT 1"],
    ["show", "abc"],
    ["compact"],
    ["summary"],
    ["outcome", "run-1", "--success"],
    ["analyze"],
    ["analyze", "--where", "success = false"],
    ["attribute"],
    ["synthesize"],
    ["envs", "list"],
    ["envs", "show", "x"],
    ["envs", "sample", "x"],
    ["envs", "check"],
    ["train", "x", "--model", "tiny"],
    ["evaluate"],
    ["adapters", "list"],
    ["adapters", "show", "x"],
    ["nightly", "--model", "tiny"],
    ["dashboard", "--port", "0"],
]


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # a message, not an exception's traceback
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize("args", READERS, ids=" ".join)
@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_command_that_reads_a_home_refuses_a_bad_one(tmp_path: Path, kind: str, args) -> None:
    home = tmp_path / kind
    if kind == "file":
        home.write_text("not a directory")
    result = CliRunner().invoke(app, ["--home", str(home), *args])
    line = _one_line_error(result)
    expected = "no tracegym home at" if kind == "missing" else "is not a directory"
    assert expected in line and str(home) in line
    assert not home.exists() if kind == "missing" else home.read_text() == "not a directory"


@pytest.mark.parametrize(
    "args",
    [["import", "openai-chat", "{runs}"], ["collect", "--port", "0"]],
    ids=["import", "collect"],
)
def test_a_command_that_creates_its_home_refuses_a_file(tmp_path: Path, args) -> None:
    runs = tmp_path / "runs.json"
    runs.write_text('[{"messages": [{"role": "user", "content": "hi"}]}]')
    home = tmp_path / "a-file"
    home.write_text("not a directory")
    command = [a.format(runs=runs) for a in args]
    line = _one_line_error(CliRunner().invoke(app, ["--home", str(home), *command]))
    assert "is not a directory" in line and home.read_text() == "not a directory"


def test_import_creates_a_missing_home(tmp_path: Path) -> None:
    runs = tmp_path / "runs.json"
    runs.write_text('[{"messages": [{"role": "user", "content": "hi"}, '
                    '{"role": "assistant", "content": "ok"}]}]')  # fmt: skip
    home = tmp_path / "new" / "home"
    result = CliRunner().invoke(app, ["--home", str(home), "import", "openai-chat", str(runs)])
    assert result.exit_code == 0, result.output
    assert list((home / "spool").glob("*.jsonl"))


@pytest.mark.parametrize("flags, redact", [([], True), (["--no-redact"], False)])
def test_collect_creates_a_missing_home_and_redacts_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], redact: bool
) -> None:
    from tracegym.store import receiver

    made: dict = {}

    class Quiet:
        """The command's Receiver, recording how it was made; serving returns at once."""

        def __init__(self, home: Path, **kwargs) -> None:
            made.update(kwargs, home=home)

        def serve_forever(self) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(receiver, "Receiver", Quiet)
    home = tmp_path / "new"
    result = CliRunner().invoke(app, ["--home", str(home), "collect", "--port", "0", *flags])
    assert result.exit_code == 0, result.output
    assert home.is_dir() and made["home"] == home and made["redact"] is redact


# outcome ----------------------------------------------------------------------------------------
def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command in a fresh interpreter (it installs a tracer provider of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACEGYM_"))}
    return subprocess.run(
        [sys.executable, "-m", "tracegym.cli", "--home", str(home), *args],
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _home_with_one_run(home: Path) -> Path:
    from tracegym.store.records import span_record, write_spool_file
    from tracegym.tracer import semconv as sc

    record = span_record(
        trace_id="ab" * 16, span_id="cd" * 8, name="invoke_agent a", start_ns=1, end_ns=2,
        attributes={sc.OPERATION: "invoke_agent", sc.RUN_ID: "run-7"},
    )  # fmt: skip
    write_spool_file(home, [record], "one-run")
    return home


def _outcomes(home: Path) -> list[tuple[str, bool]]:
    """(trace id, success) per run in the outcomes view; the unknown run's is its target."""
    pytest.importorskip("duckdb")
    from tracegym.store.store import Store

    with Store(home) as store:
        query = "SELECT trace_id, success FROM outcomes ORDER BY trace_id"
        return store.sql(query).fetchall()


def test_outcome_for_an_unknown_run_warns_and_still_records(tmp_path: Path) -> None:
    home = _home_with_one_run(tmp_path / "home")
    unknown = _cli(home, "outcome", "NO-SUCH-RUN", "--success")
    assert unknown.returncode == 0, unknown.stderr
    assert "warning: no run with run id or trace id 'NO-SUCH-RUN'" in unknown.stderr
    assert "recorded outcome for NO-SUCH-RUN" in unknown.stdout
    for known in ("run-7", "ab" * 16):  # by run id, and by trace id
        done = _cli(home, "outcome", known, "--failure")
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr
    # one outcome per run: the unknown one (kept for when its run arrives) and run-7's latest
    assert _outcomes(home) == [("NO-SUCH-RUN", True), ("ab" * 16, False)]
