"""Which adapter answers a request: decided once per conversation, kept for its later turns.

A conversation is identified by its system prompt and first user message (they are resent on
every turn). The first request of a conversation asks the router (`training/router.py`, the
same decision the evaluation measured) for its top adapter; later turns reuse that answer from
a bounded LRU map, so a conversation never switches adapter half-way. A request that names an
adapter (or the base model) as `model` is not routed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from tracegym.serving.protocol import ChatRequest, ServeError


class Chooser(Protocol):
    def choose(self, text: str) -> str | None: ...


@dataclass(frozen=True)
class Decision:
    """The adapter that answers (None: the base model), and how it was chosen."""

    adapter: str | None
    how: str  # "explicit", "routed" or "remembered"


class ConversationRouter:
    """Per-conversation routing over `adapters` (the promoted ones) with `router.choose`."""

    def __init__(
        self,
        router: Chooser | None,
        adapters: list[str],
        base_model: str,
        *,
        max_conversations: int = 10_000,
    ) -> None:
        self.router = router
        self.adapters = list(adapters)
        self.base_model = base_model
        self.max_conversations = max_conversations
        self._seen: OrderedDict[tuple[str, str], str | None] = OrderedDict()
        self._lock = threading.Lock()

    def model_ids(self) -> list[str]:
        return [self.base_model, *self.adapters]

    def decide(self, request: ChatRequest) -> Decision:
        named = request.model
        if named and named not in ("auto", "tracegym"):
            if named == self.base_model:
                return Decision(None, "explicit")
            if named in self.adapters:
                return Decision(named, "explicit")
            raise ServeError(
                f"the model {named!r} does not exist; known: "
                + ", ".join(["auto", *self.model_ids()]),
                status=404,
                param="model",
                code="model_not_found",
            )
        key = request.conversation_key()
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return Decision(self._seen[key], "remembered")
        adapter = self.router.choose(key[1]) if self.router is not None and key[1] else None
        with self._lock:
            self._seen[key] = adapter
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_conversations:
                self._seen.popitem(last=False)
        return Decision(adapter, "routed")

    def __len__(self) -> int:
        return len(self._seen)


def registry_router(home: Any, embedder: str = "minilm") -> tuple[Any, list[str]]:
    """The router over the home's promoted adapters (as `tracegym evaluate` builds it, with the
    embedder named `embedder`) and their ids."""
    from tracegym.training.router import Router, embedder_named

    router = Router.from_registry(home, embedder_named(embedder, home))
    return router, list(router.adapters)
