"""The OpenAI-compatible endpoint: `POST /v1/chat/completions` and `GET /v1/models`.

Each request is routed (`routing.ConversationRouter`: explicit `model`, else once per
conversation), sent to the backend with the chosen adapter's name as `model`, and answered with
that name in the response's `model` field. Bad requests get OpenAI's error object.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from tracegym.serving.backends import Backend
from tracegym.serving.protocol import MAX_BODY_BYTES, ServeError, parse_request
from tracegym.serving.routing import ConversationRouter


def create_app(
    backend: Backend,
    router: ConversationRouter,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    def error(exc: ServeError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.status)

    async def completions(request: Request) -> Any:
        try:
            declared = request.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > max_body_bytes:
                raise ServeError(
                    f"request body is {declared} bytes, over the limit of {max_body_bytes}",
                    status=413,
                    code="request_too_large",
                )
            chat = parse_request(
                await _bounded_body(request, max_body_bytes), max_bytes=max_body_bytes
            )
            decision = router.decide(chat)
            name = decision.adapter or router.base_model
            reply = await backend.complete(chat.with_model(name))
        except ServeError as exc:
            return error(exc)
        headers = {"x-tracegym-adapter": decision.adapter or "", "x-tracegym-routing": decision.how}
        if reply.chunks is not None:
            return StreamingResponse(reply.chunks, media_type="text/event-stream", headers=headers)
        data = dict(reply.data or {})
        data["model"] = name
        return JSONResponse(data, status_code=reply.status, headers=headers)

    async def models(request: Request) -> Any:
        now = int(time.time())
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": model, "object": "model", "created": now, "owned_by": "tracegym"}
                    for model in router.model_ids()
                ],
            }
        )

    async def not_found(request: Request, exc: Exception) -> Any:
        return error(ServeError(f"no route {request.url.path}", status=404, code="not_found"))

    async def not_allowed(request: Request, exc: Exception) -> Any:
        return error(
            ServeError(f"{request.method} is not allowed on {request.url.path}", status=405)
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        yield
        await backend.aclose()

    return Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: not_allowed},
        lifespan=lifespan,
    )


async def _bounded_body(request: Any, limit: int) -> bytes:
    """The body, read no further than one byte past `limit` (a chunked body has no length)."""
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        parts.append(part)
        size += len(part)
        if size > limit:
            break
    return b"".join(parts)
