"""The run page's outcome form: a person triaging runs marks one a success or a failure.

Writing is the one thing the dashboard does besides reading, so it is guarded three ways: only a
loopback client may post (even a dashboard exposed with `--host` and a token records nothing
from elsewhere), the form carries a CSRF token (a per-process secret: a page of another origin
cannot read it, so a forged post has none, or a wrong one, and gets 403), and the outcome is
recorded exactly as `tracegym outcome` records it (store/outcome_record.py), with the person's
name as its source and the reason as a label; the outcome span's time is when.
"""

from __future__ import annotations

import getpass
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from tracegym.dashboards import pages
from tracegym.dashboards.security import CsrfToken, client_is_loopback
from tracegym.store.outcome_record import Outcome, OutcomeNotRecorded, record

MAX_BODY = 16 * 1024  # bytes of a posted form: three short fields
MAX_REASON = 2000
MAX_WHO = 200
VIA = "dashboard"


def default_who() -> str:
    """The OS user the dashboard runs as (the form's "by" field starts with it)."""
    try:
        return getpass.getuser()
    except Exception:  # no user name in the environment nor the password database
        return "dashboard"


def form_context(request: Request, csrf: CsrfToken) -> dict[str, Any]:
    """What run.html needs to show the form: none of it for a client that may not post."""
    if not client_is_loopback(request):
        return {"outcome_form": None}
    return {"outcome_form": {"csrf_token": csrf.value, "who": default_who()}}


def parse_form(body: bytes) -> dict[str, str]:
    """An application/x-www-form-urlencoded body: each field's first value."""
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {key: values[0] for key, values in fields.items() if values}


def outcome_of(run_id: str, fields: dict[str, str]) -> Outcome:
    """The posted fields as an outcome; ValueError for a verdict that is not one."""
    verdict = fields.get("verdict", "")
    if verdict not in ("success", "failure"):
        raise ValueError("choose success or failure")
    reason = " ".join(fields.get("reason", "").split())[:MAX_REASON]
    who = " ".join(fields.get("who", "").split())[:MAX_WHO] or default_who()
    labels = {"via": VIA, **({"reason": reason} if reason else {})}
    return Outcome(run_id, success=verdict == "success", source=who, labels=labels)


async def post_outcome(request: Request, ctx: pages.Context, csrf: CsrfToken) -> Response:
    """POST /run/{trace_id}/outcome: check, record, and back to the run's page (303)."""
    if not client_is_loopback(request):
        return PlainTextResponse("outcomes are recorded from this machine only", 403)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return PlainTextResponse("post the run page's form", 415)
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return PlainTextResponse("form too large", 413)
    fields = parse_form(body)
    if not csrf.check(fields.get("csrf_token")):
        return PlainTextResponse("missing or wrong CSRF token: reload the run's page", 403)
    ident = request.path_params["trace_id"]
    found = await run_in_threadpool(pages.resolve, ctx, ident)
    if found is None:
        return PlainTextResponse(f"no run {ident}", 404)
    trace_id, got = found
    spans = got["spans"][trace_id]
    roots = [s for s in spans if s["parent_span_id"] is None] or spans
    run_id = next((s["run_id"] for s in roots if s.get("run_id")), None) or trace_id
    try:
        outcome = outcome_of(run_id, fields)
        await run_in_threadpool(record, ctx.home, outcome, "tracegym-dashboard")
    except ValueError as exc:
        return PlainTextResponse(str(exc), 400)
    except OutcomeNotRecorded as exc:
        return PlainTextResponse(str(exc), 500)
    await run_in_threadpool(ctx.db.refresh)  # its spool file is read now, not at the next refresh
    return RedirectResponse(f"/run/{quote(trace_id, safe='')}#outcome", 303)
