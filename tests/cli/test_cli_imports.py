"""The command line sits on top and imports downwards only: `tracegym.cli` builds its own
commands and names the jobs' and stages' modules, never importing the example agents."""

from __future__ import annotations

import subprocess
import sys


def _loaded_after(code: str) -> set[str]:
    script = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_importing_the_cli_imports_no_example_agent():
    loaded = _loaded_after("import tracegym.cli")
    assert "tracegym.cli" in loaded
    assert not {m for m in loaded if m.startswith("tracegym.examples")}
    assert not {m for m in loaded if m.startswith("tracegym.jobs")}


def test_the_jobs_commands_register_without_the_example_agents():
    code = (
        "import typer\nfrom tracegym.jobs import commands\n"
        "commands.register(typer.Typer(), lambda ctx, home: home, print)"
    )
    loaded = _loaded_after(code)
    assert "tracegym.jobs.commands" in loaded
    assert not {m for m in loaded if m.startswith("tracegym.examples")}
