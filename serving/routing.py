"""Which adapter answers a request: decided once per conversation, kept for its later turns.

A conversation is identified by its system prompt and first user message (they are resent on
every turn). The first request of a conversation asks the router (`training/router.py`, the
same decision the evaluation measured) for its top adapter; later turns reuse that answer from
a bounded LRU map, so a conversation never switches adapter half-way. A request that names an
adapter (or the base model) as `model` is not routed. Adapters promoted (or demoted) after the
server started are taken up without a restart (`RegistryWatch`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tracegym.serving.protocol import ChatRequest, ServeError
from tracegym.store.home import DocumentError


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
        reload: Callable[[], tuple[Chooser, list[str]] | None] | None = None,
    ) -> None:
        """`reload`, asked before each request, returns a new (router, adapters) when the
        registry changed (see RegistryWatch), else None."""
        self.router = router
        self.adapters = list(adapters)
        self.base_model = base_model
        self.max_conversations = max_conversations
        self.reload = reload
        self._seen: OrderedDict[tuple[str, str], str | None] = OrderedDict()
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Take up a changed registry: new adapters serve new conversations; a conversation
        whose adapter is no longer promoted is routed again on its next turn, the others keep
        their adapter (or the base model)."""
        changed = self.reload() if self.reload is not None else None
        if changed is None:
            return
        router, adapters = changed
        with self._lock:
            self.router, self.adapters = router, list(adapters)
            for key in [k for k, a in self._seen.items() if a is not None and a not in adapters]:
                del self._seen[key]

    def model_ids(self) -> list[str]:
        self.refresh()
        return [self.base_model, *self.adapters]

    def decide(self, request: ChatRequest) -> Decision:
        self.refresh()
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


class RegistryWatch:
    """Notices a changed adapter registry: each adapter folder's meta.json and router.json
    (name, inode, size, mtime: `write_json` replaces a file whole, so a rewrite changes its
    inode), looked at no more than once every `every` seconds (0: on each request). Called, it
    returns the rebuilt (router, promoted adapter ids) when something changed, else None."""

    def __init__(
        self,
        home: Any,
        embedder: str = "minilm",
        *,
        every: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.home = home
        self.embedder = embedder
        self.every = every
        self.clock = clock
        self._checked: float | None = None
        self._signature = self.signature()

    def signature(self) -> tuple[Any, ...]:
        from tracegym.training.adapters import META_FILE, ROUTER_FILE, adapters_dir

        root = adapters_dir(self.home)
        try:
            folders = [p for p in os.scandir(root) if not p.name.startswith(".")]
        except FileNotFoundError:
            return ()
        out: list[Any] = []
        for folder in sorted(folders, key=lambda p: p.name):
            for name in (META_FILE, ROUTER_FILE):
                try:
                    st = os.stat(os.path.join(folder.path, name))
                except OSError:
                    out.append((folder.name, name, None))
                    continue
                out.append((folder.name, name, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def __call__(self) -> tuple[Any, list[str]] | None:
        now = self.clock()
        if self._checked is not None and now - self._checked < self.every:
            return None
        self._checked = now
        signature = self.signature()
        if signature == self._signature:
            return None
        try:
            rebuilt = registry_router(self.home, self.embedder)
        except DocumentError:
            return None  # a damaged document: keep serving the old registry, look again later
        self._signature = signature
        return rebuilt
