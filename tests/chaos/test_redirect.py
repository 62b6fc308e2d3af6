"""The token redirect (`?token=T` -> cookie + 303) must stay on the dashboard.

Before the fix, `//evil.com/?token=T` with a valid token answered `Location: //evil.com/`, which
a browser reads as another origin (an open redirect carrying the dashboard's authority). Every
Location must be a same-origin path: one leading `/`, never `//`, `/\\`, a scheme or a netloc.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from tracegym.dashboards.security import Guard

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-token"

HOSTILE = [
    "//evil.com/",
    "//evil.com",
    "///evil.com",
    "////evil.com/x",
    "/\\evil.com",
    "/\\\\evil.com",
    "/\\/evil.com",
    "/%2F/evil.com",
    "/%2f%2fevil.com",
    "/%5Cevil.com",
    "/%5C%5Cevil.com/",
    "/%09/evil.com",
    "/%0d%0a/evil.com",
    "/http://evil.com",
    "/https:/evil.com",
]


class _Dashboard:
    """Guard (with a token, loopback Host check) around a trivial app, on a loopback port."""

    def __init__(self) -> None:
        import uvicorn

        async def page(request):  # any path answers, like a catch-all 404 page would
            return PlainTextResponse("ok")

        app = Starlette()
        app.add_route("/{rest:path}", page)
        guarded = Guard(app, token=TOKEN, loopback_only_hosts=True)
        config = uvicorn.Config(guarded, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def location(self, target: str) -> tuple[int, str | None]:
        """Send `target` verbatim as the request target; the status and Location."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.putrequest("GET", target, skip_accept_encoding=True)
            connection.endheaders()
            response = connection.getresponse()
            response.read()
            return response.status, response.getheader("location")
        finally:
            connection.close()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def dashboard() -> Iterator[_Dashboard]:
    running = _Dashboard()
    yield running
    running.stop()


def _assert_same_origin(location: str) -> None:
    assert location.startswith("/"), location
    assert not location.startswith(("//", "/\\")), location
    parts = urlsplit(location)
    assert (parts.scheme, parts.netloc) == ("", ""), location
    assert not any(c in location for c in "\\\t\r\n "), location  # nothing a browser rewrites


@pytest.mark.parametrize("path", HOSTILE)
def test_token_redirect_stays_on_the_dashboard(dashboard: _Dashboard, path: str):
    status, location = dashboard.location(f"{path}?token={TOKEN}&keep=1")
    assert status == 303
    assert location is not None
    _assert_same_origin(location)
    assert location.endswith("?keep=1")  # the other parameters survive, the token does not


def test_ordinary_redirects_are_unchanged(dashboard: _Dashboard):
    assert dashboard.location(f"/runs?token={TOKEN}&outcome=failure") == (
        303,
        "/runs?outcome=failure",
    )
    assert dashboard.location(f"/?token={TOKEN}") == (303, "/")
    assert dashboard.location(f"/traces/a%20b?token={TOKEN}") == (303, "/traces/a%20b")


@pytest.mark.parametrize("path", ["", "/", "//", "\\\\x", "//evil.com/a/b", "/a//b", "/ü"])
def test_same_origin_path(path: str):
    from tracegym.dashboards.security import same_origin_path

    _assert_same_origin(same_origin_path(path))
