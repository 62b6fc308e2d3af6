"""The dashboard's guards: a token when exposed, a Host check on loopback, headers, and for
its one form (a run's outcome) a loopback-client check and a CSRF token.

Trace content is untrusted, so every response carries a Content-Security-Policy that allows
scripts from the dashboard itself only (no inline script, no eval): even markup that slipped
through escaping could not run. On loopback the Host header must name loopback too (a DNS
rebinding page cannot read the dashboard). With a token, each request must carry it as
`Authorization: Bearer TOKEN`, or `?token=TOKEN` once (which sets an HttpOnly cookie and
redirects to the same path without the token: always a path of this origin, never `//host`).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "tracegym_dashboard_token"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
# RFC 3986 pchar minus "%": the (decoded) path is encoded again, so a "%" is a literal one.
_PATH_SAFE = "/!$&'()*+,;=:@-._~"


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(24)


def client_is_loopback(request: Request) -> bool:
    """Whether the request's peer is this machine (the only one the dashboard takes writes
    from). A proxy in front would make every client look local: the dashboard has none."""
    client = request.client
    return client is not None and is_loopback(client.host)


class CsrfToken:
    """The token the dashboard's forms carry: a secret of this process, so a page of another
    origin (which cannot read the dashboard's pages) cannot forge a post with it."""

    def __init__(self) -> None:
        self.value = secrets.token_urlsafe(32)

    def check(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self.value.encode())


def same_origin_path(path: str) -> str:
    """`path` (decoded) as a Location that stays on this origin.

    Browsers read `//host`, `/\\host` (a backslash counts as a slash) and those with tabs or
    newlines in between (which they drop) as another origin: the leading slashes and backslashes
    become one `/`, and everything else is percent-encoded, so no character is left that a
    browser would rewrite into an authority."""
    return "/" + quote(path.lstrip("/\\"), safe=_PATH_SAFE)


def _host_name(header: str) -> str:
    if header.startswith("["):
        return header.split("]")[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware: token check, loopback Host check, security headers on every answer."""

    def __init__(self, app: ASGIApp, token: str | None, loopback_only_hosts: bool) -> None:
        self.app = app
        self.token = token
        self.loopback_only_hosts = loopback_only_hosts

    def _authorised(self, request: Request) -> bool:
        if self.token is None:
            return True
        given = request.headers.get("authorization", "")
        candidates = [
            given[7:] if given.lower().startswith("bearer ") else "",
            request.cookies.get(COOKIE, ""),
        ]
        return any(c and hmac.compare_digest(c, self.token) for c in candidates)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response: Response | None = None
        host = _host_name(request.headers.get("host", ""))
        if self.loopback_only_hosts and not is_loopback(host):
            response = PlainTextResponse("bad Host header for a loopback dashboard", 400)
        elif self.token is not None and not self._authorised(request):
            offered = request.query_params.get("token", "")
            if offered and hmac.compare_digest(offered, self.token):
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                query = urlencode(rest)
                target = same_origin_path(scope["path"]) + (f"?{query}" if query else "")
                response = RedirectResponse(target, 303)
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            else:
                response = PlainTextResponse(
                    "this dashboard needs its token: open the URL tracegym dashboard printed "
                    "(…?token=…) or send 'Authorization: Bearer TOKEN'",
                    401,
                )
        if response is not None:
            response.headers.update(HEADERS)
            await response(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.decode().lower() for k, _ in headers}
                headers += [
                    (k.encode(), v.encode()) for k, v in HEADERS.items() if k not in present
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
