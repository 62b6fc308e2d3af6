"""A fake multi-LoRA upstream on loopback that records what it was sent, and a home whose
adapter registry holds promoted and unpromoted adapters (metadata only: no weights needed to
route or to forward)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracegym.store.home import Home, write_json

ADAPTERS = {
    "press": (True, ["press the red button", "please press the blue button", "button panel"]),
    "refund": (True, ["refund the order", "issue a refund for order", "refund money to customer"]),
    "draft": (False, ["press refund draft", "draft button refund"]),
}
BASE = "org/base-model"


def adapter_home(root: Path, adapters: dict[str, tuple[bool, list[str]]] = ADAPTERS) -> Path:
    folder = Home.at(root).adapters
    for adapter_id, (promoted, texts) in adapters.items():
        (folder / adapter_id).mkdir(parents=True, exist_ok=True)
        write_json(
            folder / adapter_id / "meta.json",
            {
                "version": 2,
                "adapter_id": adapter_id,
                "capability": {"id": adapter_id, "name": adapter_id, "env_id": adapter_id},
                "base_model": {"name": BASE, "hash": "", "folder": ""},
                "promoted": promoted,
            },
        )
        write_json(folder / adapter_id / "router.json", {"version": 1, "texts": texts})
    return root


def completion(model: str, content: str | None, tool_calls: list[dict] | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def sse_chunks(model: str, pieces: list[str]) -> list[bytes]:
    out = []
    for i, piece in enumerate(pieces):
        delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
        chunk = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        out.append(f"data: {json.dumps(chunk)}\n\n".encode())
    last = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
    out.append(f"data: {json.dumps(last)}\n\n".encode())
    out.append(b"data: [DONE]\n\n")
    return out


class FakeUpstream:
    """Answers like vLLM with LoRA modules: records every body; `reply` decides the answer
    (default: echo the model name). A model named `broken` gets vLLM's 404 error object."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.reply: Any = None

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        async def completions(request: Request) -> Any:
            body = await request.json()
            self.received.append(body)
            self.headers.append(dict(request.headers))
            model = body.get("model")
            if model == "broken":
                return JSONResponse(
                    {"error": {"message": "The model `broken` does not exist.",
                               "type": "NotFoundError", "param": None, "code": 404}},
                    status_code=404,
                )  # fmt: skip
            if body.get("stream"):
                chunks = sse_chunks(model, ["Hel", "lo ", model])

                async def gen() -> Any:
                    for chunk in chunks:
                        yield chunk

                return StreamingResponse(gen(), media_type="text/event-stream")
            if self.reply is not None:
                return JSONResponse(self.reply(body))
            return JSONResponse(completion("upstream-name", f"answered by {model}"))

        return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
