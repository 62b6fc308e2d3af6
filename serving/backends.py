"""Backends behind `tracegym serve`: one small interface, `Backend.complete(body) -> Reply`.

`body` is the OpenAI chat-completions request with `model` already set to the chosen adapter's
name (or the base model's). A Reply is either a JSON response or, for `stream: true`, the
server-sent-event bytes in OpenAI's chunk shape. Errors are ServeErrors (OpenAI error shape).

`UpstreamBackend` forwards to a multi-LoRA server that already speaks the OpenAI API (vLLM
`--enable-lora`, SGLang `--lora-paths`), which knows each adapter by its name; `local.py`'s
`LocalBackend` runs the model in process.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from tracegym.serving.protocol import ServeError


@dataclass
class Reply:
    """A JSON response (`data`) or a stream of SSE bytes (`chunks`), with its HTTP status."""

    data: dict[str, Any] | None = None
    chunks: AsyncIterator[bytes] | None = None
    status: int = 200


class Backend(Protocol):
    async def complete(self, body: dict[str, Any]) -> Reply: ...

    async def aclose(self) -> None: ...


class UpstreamBackend:
    """Forwards each request to `url` (the upstream's base, e.g. http://127.0.0.1:8000/v1)
    unchanged but for `model`; streams are passed through chunk by chunk as they arrive."""

    def __init__(
        self, url: str, *, api_key: str | None = None, timeout: float = 600.0, client: Any = None
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)
        )

    async def complete(self, body: dict[str, Any]) -> Reply:
        import httpx

        target = f"{self.url}/chat/completions"
        try:
            request = self._client.build_request("POST", target, json=body)
            response = await self._client.send(request, stream=bool(body.get("stream")))
        except httpx.HTTPError as exc:
            raise ServeError(
                f"the upstream at {self.url} did not answer: {type(exc).__name__}: {exc}",
                status=502,
                type="upstream_error",
                code="upstream_unreachable",
            ) from None
        if response.status_code >= 400:
            raw = await response.aread()
            await response.aclose()
            raise _upstream_error(response.status_code, raw)
        if not body.get("stream"):
            try:
                data = json.loads(await response.aread())
            except ValueError:
                raise ServeError(
                    "the upstream answered with a body that is not JSON",
                    status=502,
                    type="upstream_error",
                ) from None
            return Reply(data=data)
        return Reply(chunks=_passed_through(response))

    async def aclose(self) -> None:
        await self._client.aclose()


async def _passed_through(response: Any) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    finally:
        await response.aclose()


def _upstream_error(status: int, raw: bytes) -> ServeError:
    """The upstream's own error (its OpenAI error object when it sent one), with its status."""
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return ServeError(
            f"upstream: {error['message']}",
            status=status,
            type=str(error.get("type") or "upstream_error"),
            param=error.get("param"),
            code=error.get("code"),
        )
    text = raw.decode("utf-8", "replace").strip()[:500]
    return ServeError(f"upstream answered {status}: {text}", status=status, type="upstream_error")
