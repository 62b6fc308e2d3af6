"""The dashboard's web app (Starlette): routes, templates, static files.

Handlers are plain (sync) functions: Starlette runs them in its thread pool (anyio's, 40
threads), and the DuckDB connections serialise their own queries. The SQL box holds at most a
few of those threads (it answers 503 beyond its small queue), and `/healthz` is async, so it
never needs one. Templates autoescape everything they print.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from tracegym.dashboards import outcome_form, pages, params
from tracegym.dashboards.db import Database, SqlBox, SqlBoxBusy
from tracegym.dashboards.findings import FindingsModel
from tracegym.dashboards.queries import RunFilters
from tracegym.dashboards.security import CsrfToken, Guard
from tracegym.store.store import ReadOnlyError

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
NAV = [
    ("overview", "/", "Overview"),
    ("runs", "/runs", "Runs"),
    ("sessions", "/sessions", "Sessions"),
    ("gaps", "/gaps", "Gaps"),
    ("environments", "/environments", "Environments"),
    ("adapters", "/adapters", "Adapters"),
]
CHART_PAGES = {"overview.html", "gaps.html", "adapters.html"}  # the pages that load plotly.js
EXAMPLE_SQL = (
    "SELECT tool, count(*) AS calls, count(*) FILTER (WHERE status = 'ERROR') AS errors\n"
    "FROM tool_calls GROUP BY tool ORDER BY errors DESC"
)


def plotly_js() -> Path | None:
    """plotly.min.js as bundled in the `plotly` wheel (the dashboard extra): no CDN."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


def _number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _number
    env.filters["pct"] = lambda v: "–" if v is None else f"{100 * v:.1f}%"
    return env


def create_app(
    home: str | Path,
    *,
    token: str | None = None,
    loopback: bool = True,
    sql_timeout_s: float = 20.0,
    sql_waiting: int = 3,
) -> Starlette:
    """The dashboard over `home`. `loopback`: only accept Host headers naming loopback.
    `sql_timeout_s`, `sql_waiting`: the SQL box's time limit and queue (see `SqlBox`)."""
    home = Path(home)
    db = Database(home)
    ctx = pages.Context(home=home, db=db, findings=FindingsModel(db))
    sql_box = SqlBox(home, timeout_s=sql_timeout_s, waiting=sql_waiting)
    templates = _templates()
    csrf = CsrfToken()  # the outcome form's token (dashboards/outcome_form.py)
    has_charts = plotly_js() is not None

    def render(
        request: Request, name: str, section: str, status: int = 200, **data: Any
    ) -> Response:
        html = templates.get_template(name).render(
            nav=NAV,
            section=section,
            home=str(home),
            lake=db.lake,  # where the lake rows come from: every page says when it is remote
            charts=has_charts,
            uses_charts=name in CHART_PAGES,
            request=request,
            **data,
        )
        return HTMLResponse(html, status)

    def overview(request: Request) -> Response:
        return render(request, "overview.html", "overview", **pages.overview(ctx))

    def runs(request: Request) -> Response:
        q = request.query_params
        page = params.integer(q, "page", 1, 1, params.MAX_PAGE)
        filters = RunFilters(
            **{
                k: q.get(k, "").strip()[:500]
                for k in ("agent", "outcome", "since", "until", "tool", "finding", "q")
            },
            page=page,
        )
        sql = q.get("sql", "")
        data: dict[str, Any] = {"sql": sql or EXAMPLE_SQL, "sql_result": None, "sql_error": None}
        status = 200
        if sql.strip():
            try:
                data["sql_result"] = sql_box.run(sql)
            except SqlBoxBusy as exc:  # refused before any page query
                return PlainTextResponse(str(exc), 503, headers={"retry-after": "10"})
            except ReadOnlyError as exc:
                data["sql_error"], status = str(exc), 400
            except ValueError as exc:
                data["sql_error"], status = str(exc), 400
        data["sql_cells"] = pages.sql_cells(data["sql_result"])
        return render(request, "runs.html", "runs", status, **data, **pages.runs(ctx, filters))

    def run(request: Request) -> Response:
        ident = request.path_params["trace_id"]
        found = pages.resolve(ctx, ident)
        if found is None:
            return render(request, "missing.html", "runs", 404, what=f"run {ident}")
        data = {**pages.run(ctx, *found), **outcome_form.form_context(request, csrf)}
        return render(request, "run.html", "runs", **data)

    async def run_outcome(request: Request) -> Response:
        return await outcome_form.post_outcome(request, ctx, csrf)

    def sessions(request: Request) -> Response:
        return render(request, "sessions.html", "sessions", **pages.sessions(ctx))

    def session(request: Request) -> Response:
        kind, ident = request.path_params["kind"], request.path_params["ident"]
        try:
            data = pages.session(ctx, kind, ident)
        except LookupError:
            return render(request, "missing.html", "sessions", 404, what=f"{kind} {ident}")
        return render(request, "session.html", "sessions", **data)

    def gaps(request: Request) -> Response:
        return render(request, "gaps.html", "gaps", **pages.gaps(ctx))

    def environments(request: Request) -> Response:
        return render(request, "environments.html", "environments", **pages.environments(ctx))

    def environment(request: Request) -> Response:
        env_id = request.path_params["env_id"]
        try:
            data = pages.environment(ctx, env_id)
        except LookupError:
            return render(
                request, "missing.html", "environments", 404, what=f"environment {env_id}"
            )
        return render(request, "environment.html", "environments", **data)

    def adapters(request: Request) -> Response:
        return render(request, "adapters.html", "adapters", **pages.adapters(ctx))

    def plotly(request: Request) -> Response:
        path = plotly_js()
        if path is None:
            return PlainTextResponse(
                "plotly is not installed (pip install 'tracegym[dashboard]')", 404
            )
        return FileResponse(
            path, media_type="text/javascript", headers={"cache-control": "public, max-age=86400"}
        )

    async def health(request: Request) -> Response:
        """Async: answered on the event loop, whatever the thread pool is busy with."""
        return PlainTextResponse("ok")

    routes = [
        Route("/", overview),
        Route("/runs", runs),
        Route("/run/{trace_id}", run),
        Route("/run/{trace_id}/outcome", run_outcome, methods=["POST"]),
        Route("/runs/{trace_id}", run),  # the list is /runs: a run's page answers under it too
        Route("/sessions", sessions),
        Route("/sessions/{kind}/{ident:path}", session),
        Route("/gaps", gaps),
        Route("/environments", environments),
        Route("/environments/{env_id}", environment),
        Route("/adapters", adapters),
        Route("/static/plotly.min.js", plotly),
        Route("/healthz", health),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ctx.findings.start()  # fit the detectors in the background while pages are served
        threading.Thread(target=pages.warm, args=(ctx,), daemon=True).start()
        yield
        db.close()
        sql_box.close()

    async def not_found(request: Request, exc: Exception) -> Response:
        """Unknown routes get the site's page (with its navigation), not a bare text."""
        message = f"There is no page at {request.url.path}."
        return render(request, "missing.html", "", 404, message=message)

    async def bad_parameter(request: Request, exc: Exception) -> Response:
        """A malformed or out-of-range query-string value: 400 with what was wrong."""
        return render(request, "bad_request.html", "", 400, message=str(exc))

    handlers = {404: not_found, params.BadParameter: bad_parameter}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.state.ctx = ctx
    return Guard(app, token, loopback_only_hosts=loopback)  # type: ignore[return-value]
