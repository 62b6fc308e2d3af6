"""`tracegym dashboard`: serve the web dashboard over a data directory.

Registered on the main app by `register(app, home_of, fail)`. Starlette, uvicorn and Jinja2
(the `dashboard` extra) and DuckDB (the `analysis` extra) are imported only when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from tracegym.cli_options import HomeOption, existing_home

DEFAULT_PORT = 8765


def serve(
    home: str | Path,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    announce: Any = print,
) -> None:
    """Serve the dashboard until interrupted. Bound to a non-loopback address it always
    requires a token (one is generated when none is given) and accepts any Host header."""
    import uvicorn
    from tracegym.dashboards.app import create_app
    from tracegym.dashboards.security import is_loopback, new_token

    loopback = is_loopback(host)
    if not loopback and not token:
        token = new_token()
    app = create_app(home, token=token, loopback=loopback)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else shown}:{port}/"
    announce(f"tracegym dashboard for {home} at {url}" + (f"?token={token}" if token else ""))
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


def register(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """Add `tracegym dashboard` to `app`. `home_of(ctx, home)` resolves --home; `fail(msg)`
    prints a one-line error and exits with code 2."""

    @app.command()
    def dashboard(
        ctx: typer.Context,
        port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = (
            DEFAULT_PORT
        ),
        host: Annotated[
            str, typer.Option(help="Address to bind (loopback by default; others need a token).")
        ] = "127.0.0.1",
        token: Annotated[
            str | None,
            typer.Option(
                envvar="TRACEGYM_DASHBOARD_TOKEN",
                help="Require this token (generated when binding beyond loopback without one).",
            ),
        ] = None,
        home: HomeOption = None,
    ) -> None:
        """Serve the web dashboard: runs, failures, gaps, environments and adapters."""
        target = existing_home(home_of(ctx, home), fail)
        try:
            import duckdb  # noqa: F401
            import jinja2  # noqa: F401
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as exc:
            fail(f"the dashboard needs: pip install 'tracegym[dashboard]' (missing {exc.name})")
        try:
            serve(target, host=host, port=port, token=token, announce=typer.echo)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        except KeyboardInterrupt:
            pass
