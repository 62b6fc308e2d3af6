"""The web dashboard: HTTP-level checks (status codes, escaping, read-only SQL, token, Host)
and end-to-end checks in a real headless Chromium (Debian's `chromium`, driven by Playwright's
Python client; skipped with the reason when either is missing). Screenshots of every page go to
`test-artifacts/dashboard/` (git-ignored).

One small store serves every test: the example agent's runs, a run whose tool results are XSS
payloads, analysis (with a hashed stand-in for the embedding model), synthesis, an adapter's
metadata and a night of the batch job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("duckdb")
pytest.importorskip("sklearn")

import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.tracer.operations import state

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
XSS_SCRIPT = "<script>window.__xss = 1; alert(1)</script>"
XSS_IMG = '<img src=x onerror="window.__xss = 2; alert(2)">'
XSS_JSON = "</script><script>window.__xss = 3; alert(3)</script>"


class _HashModel:
    """Stands in for all-MiniLM-L6-v2: a bag-of-words hash (no model load, deterministic)."""

    def encode(self, texts: list[str], **_: Any) -> Any:
        from tracegym.training.router import HashEmbedder

        return HashEmbedder(384).encode(texts)


def _xss_run() -> str:
    """One failed run whose tool results, agent input and labels are XSS payloads."""

    @tg.tool
    def lookup(query: str) -> str:
        return XSS_SCRIPT

    @tg.tool
    def render(query: str) -> str:
        return XSS_IMG

    @tg.agent(name="xss-agent", run_id="xss-run")
    def agent(task: str) -> str:
        lookup(task)
        render(task)
        return task

    agent(XSS_IMG)
    tg.record_outcome(
        "xss-run", success=False, reward=0.0, source="test", labels={"note": XSS_JSON}
    )
    return "xss-run"


def _add_training_artifacts(home: Path, env_id: str | None) -> None:
    """An evaluated adapter and one recorded night, as the training stage writes them."""
    from tracegym.jobs.nightly import record_night, stage_result
    from tracegym.store.home import Home, write_json
    from tracegym.training.evaluate import EvaluationRow, rate

    paths = Home.at(home)
    folder = paths.adapters / "lora-demo"
    folder.mkdir(parents=True)
    row = {
        "env_id": env_id,
        "adapter_id": "lora-demo",
        "base": rate(6, 20),
        "adapter": rate(14, 20),
        "router": rate(13, 20),
        "gain": 0.4,
        "p_value": 0.005,
        "promoted": True,
        "reason": "held-out gain +0.40 is significant (p=0.005 < 0.05)",
    }
    write_json(
        folder / "meta.json",
        {
            "version": 1,
            "adapter_id": "lora-demo",
            "capability": {
                "id": "gap-x",
                "name": "demo capability",
                "env_id": env_id,
                "family": "grounding",
            },
            "base_model": {"name": "tiny"},
            "data_hash": "d",
            "hyperparameters": {},
            "metrics": {"train": {}, "eval": row},
            "promoted": True,
            "promotion": row["reason"],
            "created_at": "2026-01-02T00:00:00Z",
        },
    )
    paths.night("2026-01-02").mkdir(parents=True)
    report = {"date": "2026-01-02", "evaluation": [row], "routing": {"accuracy": 0.9, "n": 20}}
    write_json(paths.night_report("2026-01-02"), report)
    stages = {s: "done" for s in ("compact", "analyze", "synthesize", "train", "evaluate")}
    paths.nightly_history.write_text(
        json.dumps(
            {
                "date": "2026-01-02",
                "finished_at": "2026-01-02T03:00:00Z",
                "stages": stages,
                "report": str(paths.night_report("2026-01-02")),
            }
        )
        + "\n"
    )
    results = {s: stage_result(s, {"status": "done"}) for s in (*stages, "report")}
    results["analyze"].gaps = ["gap-1", "gap-2", "gap-3"]
    results["train"].trained = ["lora-demo"]
    results["evaluate"].rows = [EvaluationRow.from_dict(row)]
    record_night(home, "2026-01-02", results, paths.night_report("2026-01-02"))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tracegym.analysis.embeddings import Embedder
    from tracegym.analysis.pipeline import analyze
    from tracegym.examples.support_agent import run_demo
    from tracegym.synthesis.pipeline import synthesize
    from tracegym.synthesis.policies import NoisyOraclePolicy

    class HashedEmbedder(Embedder):
        def _load_model(self) -> Any:
            return _HashModel()

    home = tmp_path_factory.mktemp("dashboard")
    saved = state.tracer, state.settings
    tg.init(home=home, provider=TracerProvider(), capture_messages=True)
    run_demo(n_tasks=40, seed=1)
    _xss_run()
    tg.shutdown()
    state.tracer, state.settings = saved
    analyze(home, embedder=HashedEmbedder(home / "cache"))
    # A gap whose name and evidence are hostile too: gap names reach the chart JSON.
    document = json.loads((home / "gaps.json").read_text())
    document["gaps"].append(
        {
            "id": "gap-xss",
            "rank": len(document["gaps"]) + 1,
            "name": XSS_JSON,
            "key": XSS_IMG,
            "kind": "finding",
            "detector": "xss_detector",
            "description": XSS_SCRIPT,
            "coverage": 0.5,
            "delta": 0.5,
            "stability": 10,
            "failed_runs_lacking": 1,
            "successful_runs_lacking": 0,
            "tools": ["lookup"],
            "examples": [
                {
                    "trace_id": _trace_of(home, "xss-run"),
                    "run_id": "xss-run",
                    "step": 1,
                    "position": 1,
                    "agent": "xss-agent",
                    "span_ids": [],
                    "evidence": XSS_IMG,
                }
            ],
            "signatures": [XSS_SCRIPT],
        },
    )
    (home / "gaps.json").write_text(json.dumps(document))
    report = synthesize(
        home,
        policy=NoisyOraclePolicy(0.3),
        n_train=10,
        n_heldout=10,
        validity_seeds=10,
        calibration_seeds=8,
        k=2,
    )
    env_id = report.environments[0].env_id if report.environments else None
    _add_training_artifacts(home, env_id)
    from tracegym.store.store import Store

    Store(home).close()  # compact, as the batch job would
    return home


def _trace_of(home: Path, run_id: str) -> str:
    from tracegym.store.store import Store

    with Store(home, compact_on_open=False) as store:
        return store.sql("SELECT trace_id FROM traces WHERE run_id = $r", {"r": run_id}).fetchall()[
            0
        ][0]


class Server:
    """The dashboard app on a free loopback port, in a thread."""

    def __init__(self, home: Path, token: str | None = None, loopback: bool = True) -> None:
        import uvicorn
        from tracegym.dashboards.app import create_app

        app = create_app(home, token=token, loopback=loopback)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
        request = urllib.request.Request(self.url + path, headers=headers or {})

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(request, timeout=60) as response:
                return response.status, response.read().decode(), response.headers
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), exc.headers

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def server(home: Path) -> Iterator[Server]:
    running = Server(home)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def xss_trace(home: Path) -> str:
    return _trace_of(home, "xss-run")


def _gaps(home: Path) -> list[dict[str, Any]]:
    return json.loads((home / "gaps.json").read_text())["gaps"]


# HTTP ----------------------------------------------------------------------------------------
PAGES = ["/", "/runs", "/sessions", "/gaps", "/environments", "/adapters"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_answer_with_security_headers(server: Server, path: str):
    status, body, headers = server.get(path)
    assert status == 200, body[:500]
    csp = headers["content-security-policy"]
    assert (
        "script-src 'self'" in csp
        and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    )
    assert headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in body  # no inline script at all: only src= and JSON data islands


def test_overview_shows_counts_tools_findings_and_nights(server: Server, home: Path):
    _, body, _ = server.get("/")
    assert "41</b><span>runs" in body
    assert "get_order" in body and "2026-01-02" in body
    assert _gaps(home)[0]["detector"] in body


def test_runs_filters_and_pagination(server: Server, xss_trace: str):
    _, everything, _ = server.get("/runs")
    assert "41 runs" in everything and "page 1 of 1" in everything
    _, failed, _ = server.get("/runs?outcome=failure")
    _, succeeded, _ = server.get("/runs?outcome=success")
    n_failed = int(failed.split('id="run-count">')[1].split(" ")[0])
    n_ok = int(succeeded.split('id="run-count">')[1].split(" ")[0])
    assert n_failed + n_ok == 41 and n_failed > 0
    _, by_agent, _ = server.get("/runs?agent=xss-agent")
    assert "1 run matching" in by_agent and f"/run/{xss_trace}" in by_agent
    _, by_text, _ = server.get("/runs?q=" + urllib.parse.quote("onerror"))
    assert f"/run/{xss_trace}" in by_text
    _, by_tool, _ = server.get("/runs?tool=render")
    assert "1 run matching" in by_tool
    _, by_finding, _ = server.get("/runs?finding=gap-xss")
    assert "1 run matching" in by_finding
    _, future, _ = server.get("/runs?since=2999-01-01")
    assert "0 runs matching" in future
    _, odd, _ = server.get("/runs?since=not-a-date&q=%27%3B+DROP+VIEW+spans%3B--")
    assert "0 runs matching" in odd  # (a malformed page answers 400: see below)
    status, _, _ = server.get("/runs")
    assert status == 200  # the views survived the quote in the search text


TRACES_PAGE = """
    SELECT trace_id, run_id, agent, start_time, round(duration_ms, 1) AS duration_ms,
           spans, tool_calls, llm_calls, errors, tokens, success, reward,
           count(*) OVER () AS total
    FROM traces WHERE {where}
    ORDER BY start_time DESC, trace_id LIMIT $limit OFFSET $offset
"""  # the runs list as it read the `traces` view before paging over a per-trace key


@pytest.mark.parametrize(
    "filters, where",
    [
        ({}, "true"),
        ({"outcome": "failure"}, "success = false"),
        ({"outcome": "success"}, "success = true"),
        ({"outcome": "unknown"}, "success IS NULL"),
        ({"agent": "xss-agent"}, "agent = 'xss-agent'"),
        (
            {"tool": "get_order"},
            "trace_id IN (SELECT trace_id FROM tool_calls WHERE tool = 'get_order')",
        ),
        ({"since": "2999-01-01"}, "start_time >= '2999-01-01'"),
        (
            {"q": "ORDER", "tool": "get_order", "outcome": "failure"},
            "success = false AND trace_id IN (SELECT trace_id FROM tool_calls "
            "WHERE tool = 'get_order') AND trace_id IN (SELECT trace_id FROM spans "
            "WHERE contains(lower(name), 'order') OR contains(lower(input), 'order') "
            "OR contains(lower(output), 'order') OR contains(lower(status_message), 'order') "
            "OR contains(lower(error_type), 'order') OR trace_id = 'ORDER' OR run_id = 'ORDER')",
        ),
    ],
)
def test_runs_query_pages_like_the_traces_view(
    home: Path, monkeypatch: pytest.MonkeyPatch, filters: dict[str, str], where: str
):
    from tracegym.dashboards import queries
    from tracegym.store.store import Store

    monkeypatch.setattr(queries, "PAGE_SIZE", 7)
    with Store(home, compact_on_open=False) as store:
        for page in range(1, 9):
            query = queries.runs(queries.RunFilters(**filters, page=page), None)
            got = store.sql(query.sql, query.params).fetchall()
            params = {"limit": 7, "offset": (page - 1) * 7}
            want = store.sql(TRACES_PAGE.format(where=where), params).fetchall()
            # the traces view's columns, then the list's extras (request, first error, labels)
            assert [r[:13] for r in got if r[0] is not None] == want, (filters, page)
            total = store.sql(f"SELECT count(*) FROM traces WHERE {where}").fetchall()[0][0]
            assert got[0][12] == total  # known on a page past the end too


def test_runs_page_past_the_end_keeps_the_total(server: Server):
    _, body, _ = server.get("/runs?page=99")
    assert "41 runs" in body and "no runs match" in body


def test_run_page_escapes_hostile_content(server: Server, xss_trace: str):
    status, body, _ = server.get(f"/run/{xss_trace}")
    assert status == 200
    assert "&lt;script&gt;window.__xss = 1; alert(1)&lt;/script&gt;" in body
    assert "&lt;img src=x onerror=" in body
    assert XSS_SCRIPT not in body and "<img src=x" not in body and XSS_JSON not in body
    assert "failure" in body and "note" in body  # the outcome and its labels
    status, by_run_id, _ = server.get("/run/xss-run")
    assert status == 200 and xss_trace in by_run_id
    assert server.get("/run/nope")[0] == 404


def test_gap_chart_json_is_escaped_in_its_data_island(server: Server):
    _, body, _ = server.get("/gaps")
    island = body.split('<script type="application/json" id="gaps-data">')[1].split("</script>")[0]
    assert "<" not in island and "\\u003c/script\\u003e" in island
    assert json.loads(island)["names"]["gap-xss"] == XSS_JSON


def test_run_page_shows_provenance_findings_and_decisive_step(server: Server, home: Path):
    gap = _gaps(home)[0]
    example = gap["examples"][0]
    _, body, _ = server.get(f"/run/{example['trace_id']}")
    assert f'id="span-{example["span_ids"][0]}"' in body
    assert gap["name"] in body and "decisive step" in body
    from tracegym.store.store import Store

    with Store(home, compact_on_open=False) as store:
        trace_id, write = store.sql(
            "SELECT trace_id, source_write_span_ids[1] FROM memory_ops "
            "WHERE source_write_span_ids[1] IS NOT NULL ORDER BY trace_id LIMIT 1"
        ).fetchall()[0]
    _, body, _ = server.get(f"/run/{trace_id}")
    assert "read content written by" in body and f"#span-{write}" in body


def test_sql_box_reads_and_refuses_writes(server: Server):
    sql = "SELECT tool, count(*) AS n FROM tool_calls GROUP BY tool ORDER BY n DESC"
    status, body, _ = server.get("/runs?sql=" + urllib.parse.quote(sql))
    assert status == 200 and 'id="sql-result"' in body and "get_order" in body
    for refused in [
        "DROP VIEW spans",
        "CREATE TABLE x AS SELECT 1",
        "SELECT 1; SELECT 2",
        "COPY (SELECT 1) TO '/tmp/x.csv'",
        "INSTALL httpfs",
        "ATTACH 'x.db'",
        "SET enable_external_access = true",
    ]:
        status, body, _ = server.get("/runs?sql=" + urllib.parse.quote(refused))
        assert status == 400 and 'id="sql-error"' in body and "refused" in body, refused
    status, body, _ = server.get(
        "/runs?sql=" + urllib.parse.quote("SELECT * FROM read_text('/etc/passwd')")
    )
    assert status == 400 and "root:" not in body and "Permission" in body
    status, body, _ = server.get("/runs?sql=" + urllib.parse.quote("SELECT * FROM nowhere"))
    assert status == 400 and "nowhere" in body
    assert server.get("/runs?sql=SELECT+count(*)+FROM+spans")[0] == 200


def test_environment_and_adapter_pages(server: Server, home: Path):
    from tracegym.synthesis.registry import list_envs

    env = list_envs(home)[0]
    _, body, _ = server.get("/environments")
    assert env.env_id in body
    status, body, _ = server.get(f"/environments/{env.env_id}")
    assert status == 200 and 'id="oracle"' in body and "Validity" in body and "pass@1" in body
    assert server.get("/environments/none-such")[0] == 404
    _, body, _ = server.get("/adapters")
    assert "lora-demo" in body and "promoted" in body and "Routing accuracy 90.0%" in body
    assert "[" in body and "n=20" in body  # Wilson intervals


def test_token_guard_and_loopback_host_check(home: Path):
    guarded = Server(home, token="s3cret")
    try:
        assert guarded.get("/")[0] == 401
        assert guarded.get("/", {"Authorization": "Bearer wrong"})[0] == 401
        assert guarded.get("/", {"Authorization": "Bearer s3cret"})[0] == 200
        status, _, headers = guarded.get("/runs?token=s3cret&outcome=failure")
        assert status == 303 and headers["location"] == "/runs?outcome=failure"
        cookie = headers["set-cookie"].split(";")[0]
        assert "httponly" in headers["set-cookie"].lower()
        assert guarded.get("/runs", {"Cookie": cookie})[0] == 200
        assert (
            guarded.get("/", {"Host": "evil.example:80", "Authorization": "Bearer s3cret"})[0]
            == 400
        )
    finally:
        guarded.stop()


def test_read_only_checks_and_helpers():
    from tracegym.dashboards.db import check_single_select
    from tracegym.dashboards.security import is_loopback
    from tracegym.store.store import ReadOnlyError

    check_single_select("WITH x AS (SELECT 1) SELECT * FROM x")
    for sql in ["DELETE FROM spans", "PRAGMA version", "SELECT 1; DROP TABLE x"]:
        with pytest.raises(ReadOnlyError):
            check_single_select(sql)
    with pytest.raises(ValueError):
        check_single_select("SELEC 1")
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")


def test_command_registers_and_serve_generates_a_token(monkeypatch: pytest.MonkeyPatch, home: Path):
    import typer
    import uvicorn
    from tracegym.dashboards import commands
    from typer.testing import CliRunner

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    app = typer.Typer()

    def fail(message: str) -> None:
        typer.echo(message)
        raise typer.Exit(2)

    commands.register(app, lambda ctx, h: h, fail)

    @app.command()
    def other() -> None:  # a second command, so `dashboard` stays a subcommand
        pass

    done = CliRunner().invoke(app, ["dashboard", "--home", str(home), "--host", "0.0.0.0"])
    assert done.exit_code == 0, done.output
    assert seen["host"] == "0.0.0.0" and "?token=" in done.output
    assert seen["app"].token and seen["app"].token in done.output
    done = CliRunner().invoke(app, ["dashboard", "--home", str(home), "--port", "9999"])
    assert seen["port"] == 9999 and seen["app"].token is None and "127.0.0.1:9999" in done.output
    done = CliRunner().invoke(app, ["dashboard", "--home", str(home / "missing")])
    assert done.exit_code == 2 and "no tracegym home" in done.output


def _store_rows(home: Path, sql: str) -> list[tuple[Any, ...]]:
    from tracegym.store.store import Store

    with Store(home, compact_on_open=False) as store:
        return store.sql(sql).fetchall()


def test_run_page_is_a_tree_with_a_detail_pane_and_readable_errors(server: Server, home: Path):
    trace_id, span_id = _store_rows(
        home,
        "SELECT trace_id, span_id FROM spans WHERE status = 'ERROR' AND events LIKE "
        "'%stacktrace%' ORDER BY trace_id LIMIT 1",
    )[0]
    _, body, _ = server.get(f"/run/{trace_id}")
    assert 'id="span-tree"' in body and 'id="detail-pane"' in body
    assert f'id="detail-{span_id}"' in body and '<details class="span' not in body
    assert body.count('data-tab="attrs"') == body.count('class="detail"')  # tabs per span
    # The stack trace is text with real newlines, not a JSON string with literal \n.
    events = body.split(f'id="detail-{span_id}"')[1].split('data-panel="events"')[1]
    trace = events.split('exception.stacktrace</th><td><pre class="value">')[1].split("</pre>")[0]
    assert trace.startswith("Traceback (most recent call last):\n  File ") and "\\n" not in trace
    # One span is selected (the decisive step or the first error): only its detail shows.
    sections = re.findall(r'<section class="detail"[^>]*>', body)
    assert [tag.endswith(" hidden>") for tag in sections].count(False) == 1
    assert body.count(' aria-current="true"') == 1
    assert 'id="request"' in body  # the run's request, at the top


def test_chat_spans_render_as_a_chat():
    from tracegym.dashboards import spanview

    recorded = json.dumps(
        [
            {"role": "system", "content": "You are the shop's assistant."},
            {"role": "user", "content": "Where is\norder W-1?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_order", "arguments": '{"order_id": "W-1"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
        ]
    )
    chat = spanview.chat(recorded, "user")
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool"]
    assert chat[1]["content"] == "Where is\norder W-1?"  # a real newline
    assert chat[2]["tool_calls"][0]["name"] == "get_order"
    assert chat[2]["tool_calls"][0]["arguments"] == '{\n  "order_id": "W-1"\n}'
    assert chat[3]["tool_call_id"] == "c1" and '"status": "shipped"' in chat[3]["content"]
    assert spanview.chat("not json", "user") == []
    assert spanview.request(recorded) == "Where is order W-1?"
    assert spanview.request('{"ticket_id": "T1", "message": "refund please"}') == "refund please"
    nested = spanview.text('{"error": "Traceback\\n  line 1\\nKeyError: x", "n": 1}')
    assert "Traceback\n" in nested and "\\n" not in nested


def test_runs_list_shows_request_first_error_findings_and_labels(server: Server, home: Path):
    _, body, _ = server.get("/runs?outcome=failure")
    table = body.split('id="runs-table"')[1].split("</table>")[0]
    rows = table.split('<tr class="run-row')[1:]
    assert rows and all(r.startswith(" failed") for r in rows)  # failed rows are marked
    assert all('class="request-line"' in r for r in rows)
    assert any('class="bad"' in r.split('class="error-cell"')[1][:200] for r in rows)
    gap = _gaps(home)[0]
    assert gap["name"] in table  # a gap's member runs carry its name
    assert "sortable" in body.split('id="runs-table"')[1][:40]
    assert 'class="filters auto"' in body  # drop-downs apply on change (app.js)
    _, xss_row, _ = server.get("/runs?agent=xss-agent")
    assert "note" in xss_row.split('id="runs-table"')[1]  # the outcome's labels
    _, empty, _ = server.get("/runs?since=2999-01-01")
    assert "no runs match these filters" in empty


def test_overview_counts_what_summary_counts(server: Server, home: Path):
    from tracegym.store.store import Store
    from tracegym.summary import summarize

    with Store(home, compact_on_open=False) as store:
        records = summarize(store.records())["spans"]
        spans = store.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        outcomes = store.sql("SELECT count(*) FROM _outcome_spans").fetchall()[0][0]
    assert records == spans + outcomes and outcomes > 0
    _, body, _ = server.get("/")
    card = body.split('id="span-count"')[1].split("</div></div>")[0]
    assert f"<b>{spans}</b><span>spans</span>" in card
    assert f"+ {outcomes} outcome records = {records} records" in card


def test_overview_charts_runs_one_by_one_when_they_span_minutes(server: Server):
    _, body, _ = server.get("/")
    island = body.split('id="overview-data">')[1].split("</script>")[0]
    chart = json.loads(island)
    # the fixture's runs are seconds apart: per minute, and as they fill a minute or two,
    # one bar per run (a bar for the day, or the minute, would say nothing)
    assert chart["per"] == "minute" and sum(chart["runs"]) == 41
    assert all(len(d) == len("2026-01-01 10:00") for d in chart["days"])
    assert len(chart["days"]) < 3 and "Runs one by one" in body
    per_run = chart["per_run"]
    assert len(per_run["ids"]) == 41 and per_run["outcome"].count("failure") == 17
    assert 'data-chart="per_run"' in body


def test_nightly_history_shows_why_gaps_got_no_environment(tmp_path: Path):
    from tracegym.dashboards import artifacts, pages
    from tracegym.store.home import Home, write_json

    home = Home.at(tmp_path)
    report = {
        "date": "2026-01-03",
        "stages": {
            "synthesize": {
                "status": "done",
                "environments": [],
                "without_environment": [
                    {
                        "gap_id": "gap-1",
                        "gap_name": "refund before lookup",
                        "detector": "tool_order",
                        "stage": "no_family",
                        "reason": "no environment family fits <b>this</b> gap",
                    },
                    {"gap_id": "gap-2", "stage": "a stage of tomorrow", "reason": "why"},
                ],
            }
        },
    }
    write_json(home.night_report("2026-01-03"), report)
    night = {"date": "2026-01-03", "stages": {"synthesize": "done"}}
    home.nightly_history.write_text("cut sh\n" + json.dumps(night) + "\n")
    history = artifacts.nightly_history(tmp_path)
    assert [n.date for n in history] == ["2026-01-03"]
    rows = pages._nights(history, [])
    assert rows[0]["stages"] == {"synthesize": "done"}
    assert rows[0]["without"][0]["gap"] == "refund before lookup"
    assert rows[0]["without"][0]["reason"].startswith("no environment family fits")
    assert rows[0]["without"][0]["stage"] == "no family"  # where synthesis stopped, as a label
    assert rows[0]["without"][1] == {  # a record this version cannot read: shown as it is
        "gap": "gap-2",
        "gap_id": "gap-2",
        "stage": "a stage of tomorrow",
        "reason": "why",
    }


def test_sessions_group_runs_by_conversation(server: Server, home: Path):
    conversation, n = _store_rows(
        home,
        "SELECT json_extract_string(attributes, '$.\"gen_ai.conversation.id\"') AS c, count(*) "
        "FROM spans WHERE parent_span_id IS NULL AND c IS NOT NULL GROUP BY c ORDER BY c LIMIT 1",
    )[0]
    status, body, _ = server.get("/sessions")
    assert status == 200 and f"/sessions/conversation/{conversation}" in body
    assert 'href="/sessions"' in body.split("<nav>")[1]  # in the navigation
    status, body, _ = server.get(f"/sessions/conversation/{conversation}")
    assert status == 200 and body.count('<li class="session-run') == n
    trace_id = body.split('class="run-link" href="/run/')[1].split('"')[0]
    _, run_page, _ = server.get(f"/run/{trace_id}")
    assert f'href="/sessions/conversation/{conversation}"' in run_page  # linked from the run
    assert server.get("/sessions/conversation/none-such")[0] == 404
    assert server.get("/sessions/planet/x")[0] == 404


def test_unknown_route_answers_the_sites_404_page(server: Server):
    status, body, _ = server.get("/no/such/page")
    assert status == 404 and "<nav>" in body and "Not found" in body
    assert "/no/such/page" in body and 'href="/runs"' in body


def test_sql_box_shows_json_indented_and_wrapped(server: Server):
    sql = "SELECT attributes, {'a': 1, 'b': [1, 2]} AS s FROM spans LIMIT 2"
    status, body, _ = server.get("/runs?sql=" + urllib.parse.quote(sql))
    assert status == 200
    result = body.split('id="sql-result"')[1].split("</table>")[0]
    assert '<pre class="cell">{\n  &#34;' in result  # JSON text, indented, as a block
    assert "&#34;b&#34;: [\n" in result  # a struct column too


# Browser -------------------------------------------------------------------------------------
def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    path = os.environ.get("TRACEGYM_CHROMIUM")
    return path if path and Path(path).exists() else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = _chromium()
    if executable is None:
        pytest.skip("no chromium on PATH (CI installs Debian's: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def context(browser: Any) -> Iterator[Any]:
    """One browser context for the module: plotly.min.js is fetched once, then cached."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    yield context
    context.close()


@pytest.fixture
def page(context: Any) -> Iterator[Any]:
    """A fresh page that records dialogs (alert() must never run) and page errors."""
    page = context.new_page()
    page.dialogs = []
    page.errors = []

    def on_dialog(dialog: Any) -> None:
        page.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    yield page
    page.close()


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _clean(page: Any) -> None:
    assert page.dialogs == [], page.dialogs
    assert page.evaluate("window.__xss") is None
    assert page.errors == [], page.errors


@pytest.mark.parametrize(
    ("name", "path", "selector"),
    [
        ("overview", "/", "#chart-daily[data-drawn]"),
        ("runs", "/runs", "#runs-table a.run-link"),
        ("gaps", "/gaps", "#chart-map[data-drawn]"),
        ("environments", "/environments", "a.env-link"),
        ("adapters", "/adapters", "#chart-adapters[data-drawn]"),
    ],
)
def test_browser_pages_load_with_data(
    page: Any, server: Server, name: str, path: str, selector: str
):
    page.goto(server.url + path)
    page.wait_for_selector(selector, timeout=30000)
    _shot(page, name)
    _clean(page)


def test_browser_gap_evidence_is_one_click_away(page: Any, server: Server, home: Path):
    gap = _gaps(home)[0]
    page.goto(server.url + "/gaps")
    page.locator(f'tr[id="{gap["id"]}"] a.evidence-link').first.click()
    page.wait_for_selector("#waterfall")
    assert gap["examples"][0]["trace_id"] in page.url
    span_id = gap["examples"][0]["span_ids"][0]
    node = page.locator(f'a[id="span-{span_id}"]')
    assert "selected" in node.get_attribute("class")  # the evidence span is selected
    assert page.locator(f'section[id="detail-{span_id}"]').is_visible()  # and shown
    assert page.locator("#detail-pane .detail:visible").count() == 1
    assert page.locator(".tree .node.decisive").count() == 1
    _shot(page, "run")
    _clean(page)
    page.goto(server.url + "/environments")
    page.locator("a.env-link").first.click()
    page.wait_for_selector("#oracle")
    _shot(page, "environment")
    _clean(page)


def test_browser_sql_box_shows_rows_and_refuses_writes(page: Any, server: Server):
    page.goto(server.url + "/runs")
    page.fill("#sql-form textarea", "SELECT agent, count(*) AS runs FROM traces GROUP BY agent")
    page.click("#sql-form button")
    page.wait_for_selector("#sql-result")
    assert "support-agent" in page.inner_text("#sql-result")
    page.fill(
        "#sql-form textarea",
        "SELECT name, attributes, events FROM spans WHERE status = 'ERROR' LIMIT 3",
    )
    page.click("#sql-form button")
    page.wait_for_selector("#sql-result pre.cell")
    assert "\n" in page.locator("#sql-result pre.cell").first.inner_text()  # indented JSON
    _check_layout(page, "runs-sql")  # wrapped in the page, not pushed off-screen
    page.fill("#sql-form textarea", "DROP VIEW spans")
    page.click("#sql-form button")
    page.wait_for_selector("#sql-error")
    assert "read-only" in page.inner_text("#sql-error")
    _clean(page)


def test_browser_xss_payloads_run_nothing(page: Any, server: Server, xss_trace: str):
    page.goto(f"{server.url}/run/{xss_trace}")
    page.wait_for_selector("#waterfall")
    page.evaluate("document.querySelectorAll('#waterfall [hidden]').forEach(n => n.hidden = false)")
    text = page.inner_text("#waterfall")
    assert "<script>window.__xss = 1" in text and "<img src=x onerror=" in text
    assert page.locator("#waterfall img").count() == 0
    _shot(page, "run-xss")
    _clean(page)
    # The overview and gaps pages (hostile gap name, description and evidence, also in their
    # chart JSON) are checked by test_browser_pages_load_with_data; the runs list here.
    page.goto(server.url + "/runs?q=onerror")
    page.wait_for_selector("#runs-table a.run-link")
    _clean(page)


# Screenshots: every page at 1400 px, with data and on an empty store ------------------------
LAYOUT_PROBLEMS = """() => {
  const width = document.documentElement.clientWidth;
  const scrolls = (el) => {
    for (let a = el.parentElement; a; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (["auto", "scroll", "hidden"].includes(s.overflowX)) return true;
    }
    return false;
  };
  const out = { overflow: [], clipped: [], page: document.documentElement.scrollWidth - width };
  for (const el of document.body.querySelectorAll("*")) {
    if (el.closest(".js-plotly-plot")) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (r.right > width + 1 && !scrolls(el)) out.overflow.push(el.tagName + "." + el.className);
    const cell = el.parentElement && el.parentElement.closest("td, th");
    if (cell && !scrolls(cell) && !el.closest("pre")) {
      const c = cell.getBoundingClientRect();
      if (r.right > c.right + 1) {
        out.overflow.push("past its cell: " + el.tagName + "." + el.className);
      }
    }
    const s = getComputedStyle(el);
    const intended = s.textOverflow === "ellipsis" || s.webkitLineClamp !== "none";
    if (s.overflowX === "hidden" && !intended && el.scrollWidth > el.clientWidth + 1) {
      out.clipped.push(el.tagName + "." + el.className);
    }
  }
  return out;
}"""


def _check_layout(page: Any, name: str) -> None:
    _shot(page, name)
    problems = page.evaluate(LAYOUT_PROBLEMS)
    assert problems["page"] <= 0, f"{name}: the page scrolls sideways by {problems['page']} px"
    assert problems["overflow"] == [], f"{name}: past the viewport: {problems['overflow'][:5]}"
    assert problems["clipped"] == [], f"{name}: clipped text: {problems['clipped'][:5]}"
    _clean(page)


def _chart_labels_fit(page: Any, chart: str) -> None:
    """Every tick label of the chart lies inside it, and none overlaps the legend."""
    boxes = page.evaluate(
        """(id) => {
          const root = document.getElementById(id).getBoundingClientRect();
          const box = (n) => { const r = n.getBoundingClientRect();
                               return [r.left, r.top, r.right, r.bottom]; };
          return { root: [root.left, root.top, root.right, root.bottom],
                   ticks: Array.from(document.querySelectorAll(
                     "#" + id + " .xtick text, #" + id + " .ytick text")).map(box),
                   legend: Array.from(document.querySelectorAll("#" + id + " .legend"))
                     .map(box) };
        }""",
        chart,
    )
    left, top, right, bottom = boxes["root"]
    assert boxes["ticks"], chart
    for x0, y0, x1, y1 in boxes["ticks"]:
        assert x0 >= left - 1 and x1 <= right + 1 and y0 >= top - 1 and y1 <= bottom + 1, chart
        for lx0, ly0, lx1, ly1 in boxes["legend"]:
            assert x1 <= lx0 or x0 >= lx1 or y1 <= ly0 or y0 >= ly1, f"{chart}: label on legend"


def _data_pages(home: Path) -> list[tuple[str, str, str]]:
    from tracegym.synthesis.registry import list_envs

    gap = _gaps(home)[0]
    example = gap["examples"][0]
    conversation = _store_rows(
        home,
        "SELECT json_extract_string(attributes, '$.\"gen_ai.conversation.id\"') AS c FROM spans "
        "WHERE c IS NOT NULL ORDER BY c LIMIT 1",
    )[0][0]
    env_id = list_envs(home)[0].env_id
    return [
        ("overview", "/", "#chart-daily[data-drawn]"),
        ("runs", "/runs", "#runs-table a.run-link"),
        ("run", f"/run/{example['trace_id']}#span-{example['span_ids'][0]}", "#detail-pane"),
        ("sessions", "/sessions", "a.session-link"),
        ("session", f"/sessions/conversation/{conversation}", "#session-runs"),
        ("gaps", "/gaps", "#chart-map[data-drawn]"),
        ("environments", "/environments", "a.env-link"),
        ("environment", f"/environments/{env_id}", "#oracle"),
        ("adapters", "/adapters", "#chart-adapters[data-drawn]"),
        ("not-found", "/no/such/page", "#not-found"),
    ]


@pytest.mark.slow
def test_screenshots_with_data_fit_the_viewport(page: Any, server: Server, home: Path):
    for name, path, selector in _data_pages(home):
        page.goto(server.url + path)
        page.wait_for_selector(selector, timeout=30000)
        _check_layout(page, f"data-{name}")
        if name == "overview":
            _chart_labels_fit(page, "chart-daily")
        if name == "gaps":
            _chart_labels_fit(page, "chart-gaps")
            names = page.eval_on_selector_all(
                "#chart-map .legend .traces text", "ns => ns.map(n => n.textContent)"
            )
            assert any(n != "no gap" for n in names), names  # not all grey
        if name == "run":  # the tabs switch the pane's panels
            detail = page.locator("#detail-pane .detail:visible")
            detail.locator('.tab[data-tab="events"]').click()
            assert detail.locator('[data-panel="events"]').is_visible()
            assert not detail.locator('[data-panel="io"]').is_visible()
            _shot(page, "data-run-events")
            failing, span_id = _store_rows(
                home,
                "SELECT trace_id, span_id FROM spans WHERE status = 'ERROR' AND events LIKE "
                "'%stacktrace%' ORDER BY trace_id LIMIT 1",
            )[0]
            page.goto(f"{server.url}/run/{failing}#span-{span_id}")  # an error: its stack trace
            page.wait_for_selector("#detail-pane")
            detail = page.locator("#detail-pane .detail:visible")
            assert detail.locator("pre.status-message").is_visible()
            assert page.locator(".tree .node.target").count() == 1  # the last one named
            detail.locator('.tab[data-tab="events"]').click()
            stack = detail.locator('[data-panel="events"] pre').nth(2).inner_text()
            assert stack.startswith("Traceback") and len(stack.splitlines()) > 3
            _check_layout(page, "data-run-error")
            page.locator(".tree .node", has_text="chat").first.click()  # messages as a chat
            # the pane switches in the page's script: wait for it (count() does not wait; under
            # load the click's handler may not have run yet)
            page.wait_for_selector("#detail-pane .detail:visible .chat .msg .who")
            detail = page.locator("#detail-pane .detail:visible")
            assert detail.locator(".chat .msg .who").count() >= 2
            _check_layout(page, "data-run-chat")


def test_browser_runs_sort_by_a_column_and_filters_apply_on_change(page: Any, server: Server):
    page.goto(server.url + "/runs")
    page.wait_for_selector("#runs-table a.run-link")
    headers = page.locator("#runs-table thead th")
    column = [h.strip() for h in headers.all_inner_texts()].index("spans")

    def spans() -> list[int]:
        cells = page.locator(f"#runs-table tbody tr td:nth-child({column + 1})")
        return [int(t) for t in cells.all_inner_texts()]

    assert spans() != sorted(spans(), reverse=True)  # not already in that order
    headers.nth(column).click()
    assert spans() == sorted(spans(), reverse=True)
    headers.nth(column).click()
    assert spans() == sorted(spans())
    with page.expect_navigation():
        page.select_option("#run-filters select[name=outcome]", "failure")
    assert "outcome=failure" in page.url
    assert page.locator("#runs-table tr.run-row").count() == page.locator("tr.failed").count()
    _clean(page)


def test_browser_success_rate_axis_reads_round_percentages(page: Any, server: Server):
    """The per-day chart (a store spanning days) on the page's own plotly and chart code."""
    page.goto(server.url + "/")
    page.wait_for_selector("#chart-daily[data-drawn]")
    ticks = page.evaluate(
        """async () => {
          const node = document.createElement("div");
          node.style.width = "1200px"; node.style.height = "320px";
          document.body.appendChild(node);
          const [traces, layout] = CHARTS.daily({
            days: ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"],
            runs: [12, 30, 7, 19], rate: [0.16, 0.32, 0.95, 0.63] });
          await Plotly.newPlot(node, traces, Object.assign({}, LAYOUT, layout), CONFIG);
          return Array.from(node.querySelectorAll(".y2tick text")).map((n) => n.textContent);
        }"""
    )
    assert ticks == ["0%", "20%", "40%", "60%", "80%", "100%"], ticks
    _clean(page)


@pytest.fixture(scope="module")
def empty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("empty-home"))
    yield running
    running.stop()


@pytest.mark.slow
def test_screenshots_of_an_empty_store_draw_no_empty_charts(page: Any, empty_server: Server):
    for name, path in [
        ("overview", "/"),
        ("runs", "/runs"),
        ("sessions", "/sessions"),
        ("gaps", "/gaps"),
        ("environments", "/environments"),
        ("adapters", "/adapters"),
        ("not-found", "/run/none-such"),
    ]:
        page.goto(empty_server.url + path)
        page.wait_for_load_state("load")
        assert page.locator("[data-chart], .js-plotly-plot").count() == 0, name  # no axes
        _check_layout(page, f"empty-{name}")
    page.goto(empty_server.url + "/")
    assert "tracegym demo --scripted" in page.inner_text("#chart-daily-empty")
    page.goto(empty_server.url + "/runs")
    assert "no runs yet" in page.inner_text("#runs-table")


# Hostile query strings, hostile names in charts, garbage rows -------------------------------
@pytest.mark.parametrize(
    "value",
    [
        "99999999999999999999",  # once overflowed the OFFSET (INT64) and answered 500
        "9223372036854775807",
        "1000000001",
        "0",
        "-1",
        "+2",
        "1e3",
        "1.5",
        "abc",
        " 2",
        "%EF%BC%92",  # a full-width digit: int() reads it, the page must not
    ],
)
def test_runs_page_out_of_range_or_malformed_answers_400(server: Server, value: str):
    status, body, _ = server.get("/runs?page=" + value.replace(" ", "%20"))
    assert status == 400, body[:300]
    assert 'id="bad-request"' in body and "page must be" in body


def test_runs_page_in_range_and_far_dates_answer_200(server: Server):
    for path in ["/runs?page=", "/runs?page=1", "/runs?page=1000000000", "/runs?page=007"]:
        status, body, _ = server.get(path)
        assert status == 200 and "41 runs" in body, path
    status, body, _ = server.get("/runs?until=9999-12-31")  # its day after once overflowed
    assert status == 200 and "41 runs matching" in body
    status, body, _ = server.get("/runs?since=0001-01-01&until=0001-01-02")
    assert status == 200 and "0 runs matching" in body


HOSTILE_TOOL = '<a href="https://evil.example/">click</a> <img src=x onerror="window.__xss=4">'
HOSTILE_RUN = "<b>r</b>-hostile"  # the overview's per-run labels show 8 characters: "<b>r</b>"


def _write_garbage_parts(home: Path) -> None:
    """Lake parts with garbage rows, written directly: one row with every column NULL, one
    with only a trace id, then for each column a copy of a real span (root and tool) with that
    column NULL; likewise an outcome record with every column NULL."""
    import duckdb
    from tracegym.store.lake import outcomes_dir, spans_dir

    con = duckdb.connect()
    for folder, source in [(spans_dir(home), "spans"), (outcomes_dir(home), "outcomes")]:
        parts = [str(p) for p in sorted(folder.rglob("*.parquet"))]
        assert parts, source
        read = "read_parquet($parts, hive_partitioning=false)"
        columns = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {read}", {"parts": parts})
                   .fetchall()]  # fmt: skip

        def nulled(keep: set[str], columns: list[str] = columns) -> str:
            return ", ".join(c if c in keep else f"CASE WHEN false THEN {c} END AS {c}"
                             for c in columns)  # fmt: skip

        selects = [f"(SELECT {nulled(set())} FROM {read} LIMIT 1)"]
        if source == "spans":  # a trace of one span with only its trace id: no time at all
            selects.append(
                f"(SELECT * REPLACE ('{'f' * 32}' AS trace_id) FROM "
                f"(SELECT {nulled(set())} FROM {read} LIMIT 1))"
            )
            selects += [
                f"(SELECT {nulled(set(columns) - {c})} FROM {read} "
                "WHERE parent_span_id IS NULL OR tool IS NOT NULL)"
                for c in columns
            ]
        target = folder / "day=2026-01-01"
        target.mkdir(parents=True, exist_ok=True)
        con.execute(
            f"COPY ({' UNION ALL '.join(selects)}) TO '{target / 'part-garbage-0.parquet'}' "
            "(FORMAT parquet)",
            {"parts": parts},
        )
    con.close()


@pytest.fixture(scope="module")
def garbage_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run calling a tool with a hostile name, under a hostile run id, then garbage rows."""
    from tracegym.store.store import Store

    home = tmp_path_factory.mktemp("garbage")
    saved = state.tracer, state.settings
    tg.init(home=home, provider=TracerProvider())

    @tg.tool(HOSTILE_TOOL)
    def hostile(query: str) -> str:
        raise RuntimeError("refused")

    @tg.agent(name="hostile-agent", run_id=HOSTILE_RUN, conversation_id="hostile-chat")
    def agent(task: str) -> str:
        with contextlib.suppress(RuntimeError):
            hostile(task)
        return task

    agent("look it up")
    tg.record_outcome(HOSTILE_RUN, success=False, reward=0.0, source="test")
    tg.shutdown()
    state.tracer, state.settings = saved
    Store(home).close()  # compact: the run's spans and outcome go to the lake
    _write_garbage_parts(home)
    return home


@pytest.fixture(scope="module")
def garbage_server(garbage_home: Path) -> Iterator[Server]:
    running = Server(garbage_home)
    yield running
    running.stop()


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/runs",
        "/runs?outcome=failure",
        "/runs?q=look",
        "/runs?agent=hostile-agent",
        "/runs?sql=" + urllib.parse.quote("SELECT * FROM traces"),
        "/run/{trace}",
        "/run/" + "f" * 32,  # a trace of one span with only its trace id
        "/sessions",
        "/sessions/conversation/hostile-chat",
        "/gaps",
        "/environments",
        "/adapters",
    ],
)
def test_null_rows_in_the_lake_never_make_a_page_answer_500(
    garbage_server: Server, garbage_home: Path, path: str
):
    status, body, _ = garbage_server.get(path.format(trace=_trace_of(garbage_home, HOSTILE_RUN)))
    assert status == 200, body[:500]
    assert "<img src=x" not in body and '<a href="https://evil.example/">' not in body


def test_run_page_with_null_rows_shows_its_spans(garbage_server: Server, garbage_home: Path):
    _, body, _ = garbage_server.get("/run/" + _trace_of(garbage_home, HOSTILE_RUN))
    assert "look it up" in body and "&lt;a href=&#34;https://evil.example/&#34;&gt;" in body
    assert 'class="node error' in body  # the tool's error, among the garbage copies


CHART_INJECTIONS = """(id) => {
  const chart = document.getElementById(id);
  // plotly keeps each label's source in an inert data-unformatted attribute: not a link
  const hostile = [...chart.querySelectorAll("*")].filter((el) => [...el.attributes].some(
    (a) => a.name.startsWith("on") || (!a.name.startsWith("data-")
                                        && a.value.includes("evil.example"))));
  const bold = [...chart.querySelectorAll("tspan")].filter(
    (t) => (t.getAttribute("style") || "").includes("bold"));
  return {
    hostile: hostile.map((el) => el.outerHTML.slice(0, 200)),
    links: chart.querySelectorAll("a[href], a[*|href]").length,
    images: chart.querySelectorAll("img, image").length,
    bold: bold.map((t) => t.textContent),
    ticks: [...chart.querySelectorAll(".xtick text")].map((t) => t.textContent),
    legend: [...chart.querySelectorAll(".legendtext")].map((t) => t.textContent),
  };
}"""


def test_browser_charts_show_hostile_names_as_text(page: Any, garbage_server: Server):
    page.goto(garbage_server.url + "/")
    page.wait_for_selector("#chart-tools[data-drawn]", timeout=30000)
    page.wait_for_selector("#chart-daily[data-drawn]", timeout=30000)
    tools = page.evaluate(CHART_INJECTIONS, "chart-tools")
    assert tools["hostile"] == [] and tools["links"] == 0 and tools["images"] == 0, tools
    assert tools["ticks"] == [HOSTILE_TOOL], tools  # the whole name, as text
    box = page.locator("#chart-tools .bars path").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # plotly's layer
    page.wait_for_selector("#chart-tools .hoverlayer .hovertext", timeout=10000)
    hovered = page.evaluate(CHART_INJECTIONS, "chart-tools")
    assert hovered["hostile"] == [] and hovered["links"] == 0 and hovered["images"] == 0
    hover = page.text_content("#chart-tools .hoverlayer")
    assert HOSTILE_TOOL in hover, hover
    runs = page.evaluate(CHART_INJECTIONS, "chart-daily")  # one bar per run: id in labels
    assert runs["bold"] == [] and runs["hostile"] == [], runs
    assert any(t.endswith(" <b>r</b>") for t in runs["ticks"]), runs
    assert any(t.startswith("unknown time") for t in runs["ticks"]), runs["ticks"]
    _shot(page, "overview-hostile")
    _clean(page)
