"""`tracegym serve`: an OpenAI-compatible endpoint that answers with the promoted adapters.

    from tracegym.serving import ConversationRouter, UpstreamBackend, create_app
    app = create_app(UpstreamBackend("http://127.0.0.1:8000/v1"),
                     ConversationRouter(router, adapter_ids, base_model="Qwen/Qwen2.5-0.5B"))

`serving.local.LocalBackend` runs the model in process instead, batched by `serving.engine.Engine`.
docs/serving.md says what is supported.
"""

from __future__ import annotations

from tracegym.serving.app import create_app
from tracegym.serving.backends import Backend, Reply, UpstreamBackend
from tracegym.serving.local import LocalBackend
from tracegym.serving.protocol import ChatRequest, ServeError, parse_request
from tracegym.serving.routing import (
    ConversationRouter,
    Decision,
    RegistryWatch,
    registry_router,
)

__all__ = [
    "Backend",
    "ChatRequest",
    "ConversationRouter",
    "Decision",
    "LocalBackend",
    "RegistryWatch",
    "Reply",
    "ServeError",
    "UpstreamBackend",
    "create_app",
    "parse_request",
    "registry_router",
]
