"""The run page's outcome form (loopback clients only, a CSRF token, recorded as `tracegym
outcome` records it) and the cost the runs list and run page show. HTTP checks with Starlette's
test client; the form submitted in a real headless Chromium (skipped without one)."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("duckdb")

import tracegym as tg
from tracegym.store.store import Store

from tests.fixtures.priced_home import priced_home

LOCAL = ("127.0.0.1", 50000)
# genai-prices' gpt-4o: $2.50 / $10 per million tokens; two calls of 1000 in, 100 out.
RUN_COST = 2 * (1000 * 2.5 + 100 * 10.0) / 1e6


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield priced_home(tmp_path, calls=2)
    tg.shutdown()  # the pipeline the form's recording started


def _client(home: Path, client: tuple[str, int] = LOCAL) -> Any:
    from starlette.testclient import TestClient
    from tracegym.dashboards.app import create_app

    return TestClient(
        create_app(home), base_url="http://127.0.0.1", client=client, follow_redirects=False
    )


def _token(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF token in the run page's form"
    return found.group(1)


def _outcomes(home: Path) -> list[tuple]:
    with Store(home, compact_on_open=False) as store:
        return store.sql(
            "SELECT run_id, success, source, labels FROM outcomes ORDER BY run_id"
        ).fetchall()


def test_runs_list_and_run_page_show_the_cost(home: Path):
    with _client(home) as client:
        runs = client.get("/runs").text
        assert f"${RUN_COST:.4f}" in runs
        assert re.search(r'<td class="cost nowrap" data-sort="-1"[^>]*>–</td>', runs)
        page = client.get("/run/priced").text
        assert re.search(rf'<span id="run-cost"[^>]*>\${RUN_COST:.4f}</span>', page)
        unpriced = client.get("/run/unpriced").text
        assert re.search(r'<span id="run-cost"[^>]*>–</span>', unpriced)


def test_the_form_records_an_outcome_like_the_cli_with_who_and_why(home: Path):
    with _client(home) as client:
        page = client.get("/run/priced")
        assert 'id="outcome-form"' in page.text and "no outcome recorded" in page.text
        answer = client.post(
            "/run/priced/outcome",
            data={"csrf_token": _token(page.text), "verdict": "failure",
                  "reason": "refunded the <wrong> order", "who": "alice"},
        )  # fmt: skip
        assert answer.status_code == 303
        trace_id = answer.headers["location"].split("/")[2].split("#")[0]
        shown = client.get(f"/run/{trace_id}").text
    assert '<span class="tag bad">failure</span>' in shown
    assert "source alice" in shown and "recorded " in shown
    assert "refunded the &lt;wrong&gt; order" in shown  # escaped like every value
    [(run_id, success, source, labels)] = _outcomes(home)
    assert (run_id, success, source) == ("priced", False, "alice")
    assert json.loads(labels) == {"reason": "refunded the <wrong> order", "via": "dashboard"}


@pytest.mark.parametrize("token", [None, "", "forged-token"])
def test_a_post_without_the_right_token_is_refused(home: Path, token: str | None):
    with _client(home) as client:
        client.get("/run/priced")
        data = {"verdict": "success"} | ({} if token is None else {"csrf_token": token})
        answer = client.post("/run/priced/outcome", data=data)
    assert answer.status_code == 403 and "CSRF" in answer.text
    assert _outcomes(home) == []


def test_a_client_that_is_not_this_machine_gets_no_form_and_cannot_post(home: Path):
    with _client(home) as local:
        token = _token(local.get("/run/priced").text)
    with _client(home, client=("192.0.2.7", 40000)) as remote:
        assert 'id="outcome-form"' not in remote.get("/run/priced").text
        answer = remote.post(
            "/run/priced/outcome", data={"csrf_token": token, "verdict": "success"}
        )
    assert answer.status_code == 403
    assert _outcomes(home) == []


def test_bad_fields_unknown_runs_and_other_bodies_are_refused(home: Path):
    with _client(home) as client:
        token = _token(client.get("/run/priced").text)
        bad = client.post("/run/priced/outcome", data={"csrf_token": token, "verdict": "maybe"})
        assert bad.status_code == 400
        missing = client.post("/run/nope/outcome", data={"csrf_token": token, "verdict": "success"})
        assert missing.status_code == 404
        as_json = client.post("/run/priced/outcome", json={"csrf_token": token})
        assert as_json.status_code == 415
        huge = client.post("/run/priced/outcome", data={"csrf_token": token, "reason": "x" * 40000})
        assert huge.status_code == 413
        assert client.get("/run/priced/outcome").status_code == 405
    assert _outcomes(home) == []


# Chromium ------------------------------------------------------------------------------------
class _Server:
    """The dashboard on a free loopback port, in a thread."""

    def __init__(self, home: Path) -> None:
        import uvicorn
        from tracegym.dashboards.app import create_app

        config = uvicorn.Config(create_app(home), host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def browser_page(home: Path) -> Iterator[tuple[Any, str]]:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no chromium on PATH (CI installs Debian's: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    pytest.importorskip("uvicorn")
    server = _Server(home)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=executable, headless=True,
                args=["--no-sandbox", "--disable-dev-shm-usage"],
            )  # fmt: skip
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            yield page, server.url
            browser.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_browser_marks_a_run_and_a_form_without_its_token_is_refused(
    browser_page: tuple[Any, str], home: Path
):
    page, url = browser_page
    page.goto(f"{url}/run/priced")
    page.check("#outcome-form input[value=success]")
    page.fill("#outcome-form input[name=reason]", "answered from the right order")
    page.fill("#outcome-form input[name=who]", "bob")
    page.click("#outcome-form button[type=submit]")
    page.wait_for_selector("#outcome .tag.ok")
    assert "source bob" in page.inner_text("#outcome")
    assert "answered from the right order" in page.inner_text("table.labels")
    artifacts = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
    artifacts.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(artifacts / "run-outcome-form.png"), full_page=True)

    page.goto(f"{url}/run/unpriced")
    page.evaluate("document.querySelector('#outcome-form input[name=csrf_token]').remove()")
    page.check("#outcome-form input[value=failure]")
    with page.expect_navigation() as navigation:
        page.click("#outcome-form button[type=submit]")
    assert navigation.value.status == 403
    assert "CSRF" in page.inner_text("body")
    assert [row[:3] for row in _outcomes(home)] == [("priced", True, "bob")]

    page.goto(f"{url}/runs")
    costs = page.locator("#runs-table td.cost").all_inner_texts()
    assert sorted(costs) == sorted([f"${RUN_COST:.4f}", "–"])
    page.screenshot(path=str(artifacts / "runs-cost.png"), full_page=True)
