"""`tracegym serve`: the promoted adapters behind an OpenAI-compatible endpoint on loopback.

Registered on the main app by `register(app, home_of, fail)`. Starlette, uvicorn and httpx are
imported only when it runs.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

import typer
from tracegym.cli_options import EmbedderOption, HomeOption, existing_home

DEFAULT_PORT = 8808


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def base_model_name(home: str | Path) -> str | None:
    """The one base model the promoted adapters were trained on (None: no promoted adapter)."""
    from tracegym.training import adapters

    names = {m.base_model.name for m in adapters.all_metadata(home) if m.promoted}
    if len(names) > 1:
        listed = ", ".join(sorted(names))
        raise ValueError(
            f"the promoted adapters were trained on different base models ({listed}): "
            "name the one the upstream serves with --base-model"
        )
    return names.pop() if names else None


def build_app(
    home: str | Path, upstream: str, base_model: str, *, embedder: str = "minilm",
    api_key: str | None = None, reload_every: float | None = 2.0,
) -> Any:  # fmt: skip
    """The endpoint over `home`'s promoted adapters, forwarding to `upstream`; the registry is
    looked at again at most every `reload_every` seconds (None: never)."""
    from tracegym.serving.app import create_app
    from tracegym.serving.backends import UpstreamBackend
    from tracegym.serving.routing import ConversationRouter, RegistryWatch, registry_router

    watch = RegistryWatch(home, embedder, every=reload_every) if reload_every is not None else None
    router, adapter_ids = registry_router(home, embedder)
    return create_app(
        UpstreamBackend(upstream, api_key=api_key),
        ConversationRouter(router, adapter_ids, base_model, reload=watch),
    )


def register(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """Add `tracegym serve` to `app`. `home_of(ctx, home)` resolves --home; `fail(msg)` prints a
    one-line error and exits with code 2."""

    @app.command()
    def serve(
        ctx: typer.Context,
        upstream: Annotated[
            str | None,
            typer.Option(
                help="Base URL of a multi-LoRA server (vLLM --enable-lora, SGLang), "
                "e.g. http://127.0.0.1:8000/v1.",
            ),
        ] = None,
        base_model: Annotated[
            str | None,
            typer.Option(
                "--base-model",
                help="The base model's name on the upstream (default: the adapters' base model).",
            ),
        ] = None,
        port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = (
            DEFAULT_PORT
        ),
        host: Annotated[str, typer.Option(help="Loopback address to bind.")] = "127.0.0.1",
        api_key: Annotated[
            str | None,
            typer.Option(envvar="TRACEGYM_UPSTREAM_API_KEY", help="Bearer token for the upstream."),
        ] = None,
        reload_every: Annotated[
            float,
            typer.Option(
                min=0.0,
                help="Look for newly promoted adapters at most every SECONDS (0: each request).",
            ),
        ] = 2.0,
        embedder: EmbedderOption = "minilm",
        home: HomeOption = None,
    ) -> None:
        """Serve the promoted adapters as an OpenAI-compatible endpoint (point the agent's
        base_url at it); each conversation is routed to one adapter."""
        target = existing_home(home_of(ctx, home), fail)
        if upstream is None:
            fail("only the upstream backend exists so far: pass --upstream URL (docs/serving.md)")
        if not upstream.startswith(("http://", "https://")):
            fail(f"--upstream must be an http(s) URL, got {upstream!r}")
        if not is_loopback(host):
            fail(f"serve binds loopback only (it has no authentication), got --host {host}")
        try:
            import httpx  # noqa: F401
            import starlette  # noqa: F401
            import uvicorn
        except ImportError as exc:
            fail(f"serve needs: pip install 'tracegym[serve]' (missing {exc.name})")
        from tracegym.store.home import DocumentError

        try:
            name = base_model or base_model_name(target)
            if name is None:
                fail("no promoted adapters and no --base-model: nothing to serve")
            application = build_app(
                target, upstream, name, embedder=embedder, api_key=api_key,
                reload_every=reload_every,
            )  # fmt: skip
        except (ValueError, DocumentError) as exc:
            fail(str(exc))
        shown = f"[{host}]" if ":" in host else host
        typer.echo(f"tracegym serve for {target} at http://{shown}:{port}/v1 -> {upstream}")
        try:
            uvicorn.run(application, host=host, port=port, log_level="warning", access_log=False)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        except KeyboardInterrupt:
            pass
