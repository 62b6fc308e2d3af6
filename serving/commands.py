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


def build_local_app(
    home: str | Path, folder: str | Path, base_model: str, *, embedder: str = "minilm",
    reload_every: float | None = 2.0, chat_template: str | Path | None = None, slots: int = 16,
) -> Any:  # fmt: skip
    """The endpoint over `home`'s promoted adapters, served in process on the model in
    `folder`; adapters promoted later are loaded before the next generation."""
    from tracegym.serving.app import create_app
    from tracegym.serving.local import LocalBackend
    from tracegym.serving.routing import ConversationRouter, RegistryWatch, registry_router

    router, adapter_ids = registry_router(home, embedder)
    backend = LocalBackend.from_folder(
        folder, home, adapter_ids, chat_template=chat_template, slots=slots
    )
    reload = None
    if reload_every is not None:
        watch = RegistryWatch(home, embedder, every=reload_every)

        def reload() -> Any:
            changed = watch()
            if changed is not None:
                backend.want(changed[1])
            return changed

    return create_app(backend, ConversationRouter(router, adapter_ids, base_model, reload=reload))


def local_folder(home: str | Path, model: str | None) -> Path:
    """The base model folder: `model` (a name `ensure_model` knows, or a folder), else the one
    the promoted adapters were trained on."""
    from tracegym.generation.model import ensure_model
    from tracegym.training import adapters

    if model is not None:
        return Path(model) if Path(model).is_dir() else ensure_model(home, model)
    folders = {m.base_model.folder for m in adapters.all_metadata(home) if m.promoted}
    if len(folders) != 1 or not next(iter(folders)):
        raise ValueError(
            "no single base model folder among the promoted adapters: pass --model NAME"
        )
    return Path(folders.pop())


def register(app: typer.Typer, home_of: Any, fail: Any) -> None:
    """Add `tracegym serve` to `app`. `home_of(ctx, home)` resolves --home; `fail(msg)` prints a
    one-line error and exits with code 2."""

    @app.command()
    def serve(
        ctx: typer.Context,
        upstream: Annotated[
            str | None,
            typer.Option(
                help="Forward to this multi-LoRA server (vLLM --enable-lora, SGLang), e.g. "
                "http://127.0.0.1:8000/v1; without it the model runs in this process.",
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
        model: Annotated[
            str | None,
            typer.Option(
                "--model",
                help="Local backend: the base model (a name or folder; default: the one the "
                "adapters were trained on).",
            ),
        ] = None,
        chat_template: Annotated[
            Path | None,
            typer.Option(help="Local backend: a chat template file that can express tools."),
        ] = None,
        slots: Annotated[
            int,
            typer.Option(
                min=1,
                help="Local backend: conversations whose KV cache is kept, and the most "
                "requests decoded in one batch.",
            ),
        ] = 16,
        embedder: EmbedderOption = "minilm",
        home: HomeOption = None,
    ) -> None:
        """Serve the promoted adapters as an OpenAI-compatible endpoint (point the agent's
        base_url at it); each conversation is routed to one adapter."""
        target = existing_home(home_of(ctx, home), fail)
        if upstream is not None and not upstream.startswith(("http://", "https://")):
            fail(f"--upstream must be an http(s) URL, got {upstream!r}")
        if not is_loopback(host):
            fail(f"serve binds loopback only (it has no authentication), got --host {host}")
        try:
            import httpx  # noqa: F401
            import starlette  # noqa: F401
            import uvicorn
        except ImportError as exc:
            fail(f"serve needs: pip install 'tracegym[serve]' (missing {exc.name})")
        if upstream is None:
            try:
                import peft  # noqa: F401
                import torch  # noqa: F401
                import transformers  # noqa: F401
            except ImportError as exc:
                fail(
                    "the local backend needs: pip install 'tracegym[training]' "
                    f"(missing {exc.name}); or pass --upstream URL"
                )
        from tracegym.store.home import DocumentError

        try:
            if upstream is not None:
                name = base_model or base_model_name(target)
                if name is None:
                    fail("no promoted adapters and no --base-model: nothing to serve")
                application = build_app(
                    target, upstream, name, embedder=embedder, api_key=api_key,
                    reload_every=reload_every,
                )  # fmt: skip
            else:
                from tracegym.generation.model import ModelError

                try:
                    folder = local_folder(target, model)
                    name = base_model or base_model_name(target) or folder.name
                    application = build_local_app(
                        target, folder, name, embedder=embedder, reload_every=reload_every,
                        chat_template=chat_template, slots=slots,
                    )  # fmt: skip
                except ModelError as exc:
                    fail(str(exc))
        except (ValueError, DocumentError) as exc:
            fail(str(exc))
        shown = f"[{host}]" if ":" in host else host
        behind = upstream or f"{name} in process"
        typer.echo(f"tracegym serve for {target} at http://{shown}:{port}/v1 -> {behind}")
        try:
            uvicorn.run(application, host=host, port=port, log_level="warning", access_log=False)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        except KeyboardInterrupt:
            pass
