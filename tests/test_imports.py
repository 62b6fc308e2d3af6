"""The bare tracer stays light: importing it pulls in none of the heavy analysis/training
packages (each check runs in a fresh interpreter)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(120)

HEAVY = ["torch", "duckdb", "polars", "sklearn", "numpy", "pyarrow", "pandas", "transformers"]

CHECK = """
import json, sys
{imports}
heavy = {heavy!r}
print(json.dumps(sorted(name for name in heavy if name in sys.modules)))
"""


@pytest.mark.parametrize(
    "imports",
    [
        "import tracegym",
        "import tracegym.tracer",
        "from tracegym.tracer import agent, tool, llm, memory_read, memory_write",
        "import tracegym as tg\n"
        "tg.init(home='home', flush_interval_s=0.05)\n"
        "tg.agent(name='a')(lambda: tg.tool(lambda: 1)())()\n"
        "tg.record_outcome('r', success=True)\n"
        "tg.flush(); tg.shutdown()\n"
        "tg.testing.capture().__enter__()",
    ],
    ids=["tracegym", "tracegym.tracer", "api", "init-and-trace"],
)
def test_tracer_does_not_import_heavy_packages(run_python, imports):
    result = run_python(CHECK.format(imports=imports, heavy=HEAVY))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_heavy_packages_are_importable_here(run_python):
    """The control: the check above would see them if the tracer imported them."""
    result = run_python(CHECK.format(imports="import tracegym, duckdb, numpy", heavy=HEAVY))
    if result.returncode != 0:
        pytest.skip("duckdb/numpy not installed in this environment")
    assert {"duckdb", "numpy"} <= set(json.loads(result.stdout))


BLOCKED = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            raise ImportError("blocked heavy import: " + name)

sys.meta_path.insert(0, Block())
import tracegym as tg
tg.init(home="home", flush_interval_s=0.05)

@tg.tool
def work(x):
    return x * 2

assert tg.agent(name="a")(lambda: work(21))() == 42
assert tg.flush()
print("ok")
"""


def test_tracer_works_with_heavy_packages_missing(run_python):
    result = run_python(BLOCKED.format(heavy=set(HEAVY)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_testing_helper_importable_by_its_public_name(run_python):
    result = run_python("from tracegym.testing import capture\nprint(capture.__name__)")
    assert result.returncode == 0, result.stderr
