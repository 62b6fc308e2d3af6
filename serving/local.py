"""The local backend: transformers + peft in this process, replies in the model's own format.

The base model with the promoted adapters loaded by name (`training.adapters.load_adapters`);
each request renders its messages and tools through the model's chat template
(`generation.chat_format.ChatFormat.render_ids`), generates with the request's adapter active
(or adapters off for the base model), and parses the reply back into content and tool calls
(`ChatFormat.parse_reply`). Requests are served one at a time (a lock; generation runs in a
worker thread so the server keeps accepting). `stream: true` is answered in OpenAI's chunk shape
but only once the whole reply is generated (tool calls can only be parsed from the whole reply),
so time to first token is the whole generation's. The KV cache is transformers' `generate`'s.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tracegym.serving.backends import Reply
from tracegym.serving.protocol import ServeError

DEFAULT_MAX_TOKENS = 256


class LocalBackend:
    """Serves `model` (a PeftModel holding the adapters, or a plain model) in `fmt`'s format."""

    def __init__(
        self,
        model: Any,
        fmt: Any,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        home: str | Path | None = None,
    ) -> None:
        """`home`: where adapters named by `want` are loaded from."""
        self.model = model
        self.fmt = fmt
        self.tokenizer = fmt.tokenizer
        self.max_tokens = max_tokens
        self.home = home
        self.adapters = set(getattr(model, "peft_config", {}) or {})
        self._wanted: set[str] = set()
        self._lock = asyncio.Lock()

    def want(self, adapter_ids: list[str]) -> None:
        """Load these adapters too (newly promoted ones), before the next generation: loading
        waits for the one running, as requests do."""
        self._wanted = set(adapter_ids) - self.adapters

    def _load_wanted(self) -> None:
        if not self._wanted or self.home is None:
            return
        from tracegym.training.adapters import load_adapters

        self.model = load_adapters(self.model, self.home, sorted(self._wanted))
        self.adapters = set(self.model.peft_config)
        self._wanted = set()

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        home: str | Path,
        adapter_ids: list[str],
        *,
        chat_template: str | Path | None = None,
    ) -> LocalBackend:
        from tracegym.generation.model import load_policy, require_tool_template
        from tracegym.training.adapters import load_adapters

        fmt = require_tool_template(folder, chat_template)
        policy = load_policy(folder)
        model = load_adapters(policy.model, home, adapter_ids) if adapter_ids else policy.model
        return cls(model, fmt_with(fmt, policy.tokenizer), home=home)

    async def complete(self, body: dict[str, Any]) -> Reply:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        temperature = body.get("temperature")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ServeError("'max_tokens' must be a positive integer", param="max_tokens")
        if temperature is not None and (
            not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2
        ):
            raise ServeError("'temperature' must be a number from 0 to 2", param="temperature")
        try:
            prompt = self.fmt.render_ids(body["messages"], tools=body.get("tools"))
        except Exception as exc:  # the template refuses the conversation: the client's to fix
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ServeError(
                f"the model's chat template cannot render these messages: {first}"
            ) from None
        async with self._lock:
            text, n_new = await asyncio.to_thread(
                self.generate_text, prompt, body["model"], max_tokens, float(temperature or 0.0)
            )
        reply = self.fmt.parse_reply(text)
        message = reply.to_openai()
        finish = "tool_calls" if reply.tool_calls else ("length" if n_new >= max_tokens else "stop")
        completion = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": n_new,
                "total_tokens": len(prompt) + n_new,
            },
        }
        if body.get("stream"):
            return Reply(chunks=_as_chunks(completion))
        return Reply(data=completion)

    def generate_text(
        self, prompt: list[int], model: str, max_tokens: int, temperature: float
    ) -> tuple[str, int]:
        """The reply's text (special tokens kept: the parser strips the family's end markers)
        and its number of new tokens, with adapter `model` active (else adapters off)."""
        import contextlib

        import torch

        self._load_wanted()
        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt], device=device)
        if model in self.adapters:
            self.model.set_adapter(model)
            context: Any = contextlib.nullcontext()
        elif self.adapters:
            context = self.model.disable_adapter()
        else:
            context = contextlib.nullcontext()
        sampling = (
            {"do_sample": True, "temperature": temperature}
            if temperature > 0
            else {"do_sample": False}
        )
        with torch.no_grad(), context:
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                **sampling,
            )
        new = out[0, ids.shape[1] :].tolist()
        return self.tokenizer.decode(new, skip_special_tokens=False), len(new)

    async def aclose(self) -> None:
        return None


def fmt_with(fmt: Any, tokenizer: Any) -> Any:
    """`fmt` over `tokenizer` (the policy's, whose pad token load_policy set) keeping its
    template."""
    from tracegym.generation.chat_format import ChatFormat

    template = getattr(fmt.tokenizer, "chat_template", None)
    return ChatFormat(tokenizer, template)


async def _as_chunks(completion: dict[str, Any]) -> AsyncIterator[bytes]:
    """A whole completion as OpenAI stream chunks: the role, the content, each tool call, then
    the finish reason and `[DONE]`."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {k: completion[k] for k in ("id", "created", "model")}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(data)}\n\n".encode()

    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for i, call in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, choice["finish_reason"])
    yield b"data: [DONE]\n\n"
