"""Issue 36 (9): a run named by its trace id is not shown with that id twice: `show`'s head and
the dashboard's run page name the trace only for a run with an id of its own; the run page
counts '1 span'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.cli import app
from tracegym.store.store import Store
from tracegym.tracer.operations import state
from typer.testing import CliRunner


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """Two one-span runs: 'ticket-1' with an id of its own, and one named by its trace id."""
    saved = state.tracer, state.settings
    tg.init(home=tmp_path, provider=TracerProvider())

    @tg.agent(name="named", run_id="ticket-1")
    def named() -> str:
        return "ok"

    @tg.agent(name="plain")
    def plain() -> str:
        return "ok"

    named()
    plain()
    tg.shutdown()
    state.tracer, state.settings = saved
    return tmp_path


def _ids(home: Path) -> dict[str, tuple[str, str | None]]:
    """agent -> (trace id, run id)."""
    with Store(home) as store:
        rows = store.fetch("SELECT agent, trace_id, run_id FROM traces").rows
    return {agent: (trace, run) for agent, trace, run in rows}


def test_show_names_the_trace_only_for_a_run_with_its_own_id(home: Path):
    ids = _ids(home)
    named_trace, _ = ids["named"]
    plain_trace, plain_run = ids["plain"]
    assert plain_run in (None, plain_trace)  # named by its trace id
    runner = CliRunner()
    named = runner.invoke(app, ["--home", str(home), "show", "ticket-1"])
    assert named.exit_code == 0, named.output
    assert f"run ticket-1 (trace {named_trace}): " in named.output
    plain = runner.invoke(app, ["--home", str(home), "show", plain_trace])
    assert plain.exit_code == 0, plain.output
    assert f"run {plain_trace}: " in plain.output and "(trace " not in plain.output


def test_run_page_names_the_trace_only_for_a_run_with_its_own_id(home: Path):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient
    from tracegym.dashboards.app import create_app

    ids = _ids(home)
    with TestClient(create_app(home), base_url="http://127.0.0.1") as client:
        named = client.get("/run/ticket-1").text
        plain = client.get(f"/run/{ids['plain'][0]}").text

    def facts(page: str) -> str:
        found = re.search(r'<p class="muted" id="run-facts">(.*?)</p>', page, re.S)
        assert found, page[:2000]
        return re.sub(r"<[^>]+>", "", found.group(1))

    assert f"trace {ids['named'][0]} · " in facts(named)
    assert "trace " not in facts(plain)
    assert " 1 span · " in facts(plain) and "1 spans" not in facts(plain)
