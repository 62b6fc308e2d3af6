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


def test_public_names_resolve_lazily_to_the_tracer_api(run_python):
    """`import tracegym` loads no OpenTelemetry SDK; each public name resolves on first use to
    the object its module defines, `__all__` lists exactly the resolvable names, and an unknown
    name still raises AttributeError."""
    script = """
import importlib, json, sys
import tracegym, tracegym.tracer as tracer
loaded = "opentelemetry.sdk.trace" in sys.modules
pairs = []
for name in tracer.__all__:
    value = getattr(tracegym, name)
    module = importlib.import_module(value.__module__)
    pairs.append([name, getattr(module, name) is value, name in dir(tracegym)])
try:
    tracegym.no_such_name
    missing = "no error"
except AttributeError as error:
    missing = str(error)
print(json.dumps({"loaded": loaded, "pairs": pairs, "missing": missing,
                  "all": sorted(tracegym.__all__), "version": tracegym.__version__}))
"""
    result = run_python(script)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["loaded"] is False
    assert len(report["pairs"]) == 29
    assert all(same and listed for _, same, listed in report["pairs"])
    assert "no_such_name" in report["missing"]
    assert {"init", "agent", "tool", "__version__", "testing"} <= set(report["all"])
    assert report["version"]


def test_the_light_commands_do_not_load_the_tracer_api_or_the_sdk(run_python, tmp_path):
    """`traces` never traces: the CLI and the store read the tracer's light modules
    (spool_files, semconv) but neither its API, setup and integrations nor the OpenTelemetry
    SDK (~0.17 s of each light command's start-up before)."""
    home = str(tmp_path / "home")
    made = run_python(
        "import tracegym as tg\n"
        f"tg.init(home={home!r}, service='s')\n"
        "tg.agent(name='a')(lambda: tg.tool(lambda: 1)())()\n"
        "tg.shutdown()"
    )
    assert made.returncode == 0, made.stderr
    script = f"""
import sys
from typer.testing import CliRunner
from tracegym.cli import app
result = CliRunner().invoke(app, ["--home", {home!r}, "traces"])
api = sorted(m for m in ("tracegym.tracer.api", "tracegym.tracer.setup",
                         "tracegym.tracer.integrations", "opentelemetry.sdk.trace")
             if m in sys.modules)
print(result.exit_code, " a " in result.output, api)
"""
    result = run_python(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "True", "[]"]


def test_other_instrumentations_spans_map_without_leaving_the_tracer(run_python):
    """The tracer maps another instrumentation's spans (the spool record, `by_operation`) with
    its own attribute mapping: no tracegym module outside the tracer is loaded to do it."""
    script = """
import json, sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tracegym.tracer.spool import span_record
from tracegym.tracer.testing import Captured
from tracegym.tracer.third_party import apply_policy, attributes_of

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("openinference.instrumentation.openai")
with tracer.start_as_current_span("ChatCompletion") as span:
    span.set_attributes({
        "openinference.span.kind": "LLM",
        "llm.token_count.prompt": 3,
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.content": "hi",
    })
(finished,) = exporter.get_finished_spans()
attributes = span_record(finished)["attributes"]
apply_policy(finished, "chat", attributes_of(finished))
outside = sorted(
    m for m in sys.modules
    if m.startswith("tracegym.") and not m.startswith("tracegym.tracer")
)
print(json.dumps({
    "operation": attributes.get("gen_ai.operation.name"),
    "input_tokens": attributes.get("gen_ai.usage.input_tokens"),
    "messages": "gen_ai.input.messages" in attributes,
    "chat": len(Captured(exporter).by_operation("chat")),
    "outside": outside,
}))
"""
    result = run_python(script)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "operation": "chat",
        "input_tokens": 3,
        "messages": True,
        "chat": 1,
        "outside": [],
    }
