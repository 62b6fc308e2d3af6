"""The OpenAI chat-completions shapes `tracegym serve` accepts and answers with.

Only what the endpoint checks lives here: a request is a JSON object with a non-empty
`messages` list; everything else (`tools`, `stream`, `max_tokens`, `temperature`, ...) is kept
as sent so that a backend can pass it on unchanged. Errors use OpenAI's error object, so an
agent's client raises its usual exceptions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_BODY_BYTES = 4 * 1024 * 1024


class ServeError(Exception):
    """A request the endpoint refuses, with the HTTP status and OpenAI error fields."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class ChatRequest:
    """A chat-completions request: the body as sent, plus what routing needs from it."""

    body: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def model(self) -> str | None:
        model = self.body.get("model")
        return model if isinstance(model, str) and model else None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def conversation_key(self) -> tuple[str, str]:
        """(system prompt, first user message): the same for every turn of a conversation."""
        system = next((_text(m) for m in self.messages if m.get("role") == "system"), "")
        first = next((_text(m) for m in self.messages if m.get("role") == "user"), "")
        return system, first

    def with_model(self, model: str) -> dict[str, Any]:
        return {**self.body, "model": model}


def _text(message: Mapping[str, Any]) -> str:
    """A message's text: a string content, or the text parts of a list content."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return ""


def parse_request(raw: bytes, *, max_bytes: int = MAX_BODY_BYTES) -> ChatRequest:
    """The request in `raw`, or a ServeError saying what is wrong with it."""
    if len(raw) > max_bytes:
        raise ServeError(
            f"request body is {len(raw)} bytes, over the limit of {max_bytes}",
            status=413,
            code="request_too_large",
        )
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ServeError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ServeError("request body must be a JSON object", code="invalid_json")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ServeError("'messages' must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ServeError(
                f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]"
            )
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ServeError("'model' must be a string", param="model")
    return ChatRequest(body=body, messages=messages)
