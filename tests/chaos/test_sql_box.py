"""The dashboard's SQL box could be starved. Its time limit started before the
query waited for the connection, so queued cross joins ran unbounded once their turn came, and
every waiting request held one of the server's threads until `/healthz` timed out. Now the limit
counts from the query's start, one query runs and a few wait, the rest get 503 at once, and
`/healthz` needs no thread at all."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("uvicorn")

import uvicorn
from tracegym.dashboards.app import create_app
from tracegym.dashboards.db import SqlBox, SqlBoxBusy
from tracegym.store.records import span_record, write_spool_file

BASE_NS = 1_764_460_800_000_000_000
# Seconds of work on one core (about 7 s here): only the time limit ends it early.
SLOW = "SELECT count(*) FROM range(40000) a, range(40000) b WHERE a.range + b.range = -1"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    record = span_record(
        trace_id="ab" * 16, span_id="01" * 8, name="invoke_agent support", start_ns=BASE_NS,
        end_ns=BASE_NS + 1_000, attributes={"gen_ai.operation.name": "invoke_agent",
                                            "gen_ai.agent.name": "support"},
    )  # fmt: skip
    write_spool_file(tmp_path, [record], "one")
    return tmp_path


def timed(fn, *args) -> tuple[float, float, object]:
    """(start, end, result or the exception raised) of `fn(*args)`."""
    start = time.monotonic()
    try:
        result: object = fn(*args)
    except Exception as exc:  # the outcome under test
        result = exc
    return start, time.monotonic(), result


def test_the_time_limit_counts_from_when_the_query_starts(home: Path):
    box = SqlBox(home, timeout_s=1.0, waiting=1)
    outcomes: list[tuple[float, float, object]] = []
    try:
        threads = [threading.Thread(target=lambda: outcomes.append(timed(box.run, SLOW)))]
        threads[0].start()
        time.sleep(0.2)  # the second one queues behind the first
        threads.append(threading.Thread(target=lambda: outcomes.append(timed(box.run, SLOW))))
        threads[1].start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        box.close()
    first, second = sorted(outcomes, key=lambda o: o[1])
    for _, _, result in (first, second):  # both stopped, neither ran to its end
        assert isinstance(result, ValueError) and "stopped after 1 s" in str(result), result
    assert 0.8 < first[1] - first[0] < 2.5
    # The second waited for the first, then had its own full second (it used to be stopped,
    # or rather not, while still waiting: its timer fired into the first query).
    assert second[1] - first[1] > 0.8
    assert second[1] - second[0] < 4.5


def test_a_full_queue_is_refused_at_once(home: Path):
    box = SqlBox(home, timeout_s=1.0, waiting=1)
    try:
        busy = [threading.Thread(target=timed, args=(box.run, SLOW)) for _ in range(2)]
        for thread in busy:
            thread.start()
        time.sleep(0.2)  # one running, one waiting
        start = time.monotonic()
        with pytest.raises(SqlBoxBusy, match="busy"):
            box.run("SELECT 1")
        assert time.monotonic() - start < 0.5
        for thread in busy:
            thread.join(timeout=60)
        assert box.run("SELECT 1").rows == [(1,)]  # and free again afterwards
    finally:
        box.close()


class Server:
    """The dashboard on 127.0.0.1, a free port, in a thread."""

    def __init__(self, home: Path) -> None:
        app = create_app(home, sql_timeout_s=1.5, sql_waiting=1)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def get(self, path: str) -> tuple[int, float]:
        """(HTTP status, seconds taken)."""
        start = time.monotonic()
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                response.read()
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        return status, time.monotonic() - start


def test_a_starved_sql_box_answers_503_while_pages_and_healthz_answer(home: Path):
    sql = "/runs?" + urllib.parse.urlencode({"sql": SLOW})
    with Server(home) as server:
        assert server.get("/runs")[0] == 200  # warm: the page's own queries work
        answers: list[tuple[int, float]] = []
        clients = [threading.Thread(target=lambda: answers.append(server.get(sql)))
                   for _ in range(6)]  # fmt: skip
        for client in clients:
            client.start()
        time.sleep(0.5)  # one query running, one waiting, four refused by now
        refused = [a for a in answers if a[0] == 503]
        assert len(refused) == 4, answers
        assert all(seconds < 1.0 for _, seconds in refused)
        health = server.get("/healthz")
        page = server.get("/runs")
        assert health[0] == 200 and health[1] < 1.0, health
        assert page[0] == 200 and page[1] < 5.0, page
        for client in clients:
            client.join(timeout=60)
    # The two admitted were stopped by their own limit (400 with the message), in time.
    assert sorted(status for status, _ in answers) == [400, 400, 503, 503, 503, 503], answers
    assert max(seconds for _, seconds in answers) < 7.0
