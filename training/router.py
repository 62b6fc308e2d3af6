"""Route a task to adapters: embedding similarity to each capability's training tasks and gap.

    from tracegym.training.router import Router, apply_weights
    router = Router.from_registry(home, Embedder(home / "cache"))   # promoted adapters only
    weights = router.weights("Ticket 1f2e3d: please press the red button.")  # {} = none
    apply_weights(peft_model, weights)   # one adapter, a weighted combination, or adapters off

Scoring: each adapter's score is the mean of the top-3 cosine similarities between the task and
the adapter's router texts (its gap name and description and its training requests). Scores go
through a softmax at `temperature` together with a "none" option scored at `threshold`; options
are kept in order until their probability mass reaches `top_p`. When "none" ranks first, no
adapter is applied. The embedder is anything with `encode(texts) -> unit-length rows` (the
analysis extra's `Embedder`; tests pass a fake one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tracegym.store.home import DocumentError, Home

NONE = "none"
COMBINED = "routed"


class RoutingError(DocumentError):
    """A routing-accuracy record (in a stage result or a report) that cannot be read."""


@dataclass(frozen=True)
class RoutingAccuracy:
    """How often the router's top adapter is the expected one over held-out tasks: overall
    (None when there were no tasks), out of `n`, and per expected adapter (NONE: tasks that
    expect no adapter). It sits inside other documents, so it carries no version of its own."""

    VERSION: ClassVar[int] = 1

    accuracy: float | None
    n: int
    per_adapter: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "n": self.n, "per_adapter": dict(self.per_adapter)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoutingAccuracy:
        if not isinstance(data, Mapping):
            raise RoutingError(f"routing accuracy must be an object, got {type(data).__name__}")
        n, accuracy = data.get("n"), data.get("accuracy")
        if not isinstance(n, int) or isinstance(n, bool):
            raise RoutingError(f"routing accuracy needs an integer 'n', got {n!r}")
        if accuracy is not None and not isinstance(accuracy, (int, float)):
            raise RoutingError(f"routing accuracy's 'accuracy' must be a number, got {accuracy!r}")
        per = data.get("per_adapter") or {}
        if not isinstance(per, Mapping):
            raise RoutingError(f"routing accuracy's 'per_adapter' must be an object, got {per!r}")
        return cls(
            accuracy=float(accuracy) if accuracy is not None else None,
            n=n,
            per_adapter={str(k): float(v) for k, v in per.items()},
        )


class HashEmbedder:
    """A bag-of-words embedder hashed into `dim` dimensions (unit rows): no model, instant,
    deterministic. For tests and for homes without the analysis extra."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def encode(self, texts: Sequence[str]) -> Any:
        import hashlib
        import re

        import numpy as np

        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                rows[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return rows / np.where(norms == 0, 1, norms)


def embedder_named(
    name: str, home: str | os.PathLike[str], *, fall_back_to_hash: bool = True
) -> Any:
    """Router embeddings by name: `hash` (no model) or `minilm`, the analysis extra's sentence
    model with its cache under the home; without that extra, `hash` when `fall_back_to_hash`."""
    if name == "hash":
        return HashEmbedder()
    try:
        from tracegym.analysis.embeddings import Embedder  # numpy and a sentence model: only here
    except ImportError:
        if fall_back_to_hash:
            return HashEmbedder()
        raise
    return Embedder(Home.at(home).cache)


class Router:
    def __init__(
        self,
        embedder: Any,
        entries: Mapping[str, Sequence[str]],
        *,
        top_p: float = 0.9,
        temperature: float = 0.05,
        threshold: float = 0.35,
        max_adapters: int = 3,
        top_k: int = 3,
        competent: Sequence[str] = (),
    ) -> None:
        """`competent`: requests the agent already handles without an adapter (its passing
        runs'); a request closer to those than to any adapter's texts gets no adapter."""
        import numpy as np

        self.embedder = embedder
        self.top_p = top_p
        self.temperature = temperature
        self.threshold = threshold
        self.max_adapters = max_adapters
        self.top_k = top_k
        self.adapters = [a for a, texts in entries.items() if texts]
        self._vectors = {
            a: np.asarray(embedder.encode(list(entries[a])), dtype=np.float32)
            for a in self.adapters
        }
        self._competent = (
            np.asarray(embedder.encode(list(competent)), dtype=np.float32) if competent else None
        )

    @classmethod
    def from_registry(
        cls,
        home: str | os.PathLike[str],
        embedder: Any,
        *,
        promoted_only: bool = True,
        **options: Any,
    ) -> Router:
        from tracegym.training import adapters

        entries = {}
        for meta in adapters.all_metadata(home):
            if promoted_only and not meta.promoted:
                continue
            entries[meta.adapter_id] = adapters.read_router_texts(home, meta.adapter_id).texts
        return cls(embedder, entries, **options)

    def scores(self, text: str) -> dict[str, float]:
        """Per adapter, and for NONE: the mean of the `top_k` cosine similarities to its texts
        (NONE: to the competent requests, at least `threshold`)."""
        import numpy as np

        if not self.adapters:
            return {}
        query = np.asarray(self.embedder.encode([text]), dtype=np.float32)[0]

        def near(vectors: Any) -> float:
            return float(np.sort(vectors @ query)[::-1][: self.top_k].mean())

        out = {adapter: near(vectors) for adapter, vectors in self._vectors.items()}
        own = near(self._competent) if self._competent is not None else self.threshold
        out[NONE] = max(self.threshold, own)
        return out

    def weights(self, text: str) -> dict[str, float]:
        """Weights over adapters (summing to 1), or {} for none."""
        import numpy as np

        scores = self.scores(text)
        if not scores:
            return {}
        none = scores.pop(NONE)
        names = [*scores, NONE]
        values = np.array([*scores.values(), none]) / self.temperature
        probs = np.exp(values - values.max())
        probs /= probs.sum()
        order = np.argsort(-probs)
        if names[order[0]] == NONE:
            return {}
        kept: dict[str, float] = {}
        mass = 0.0
        for i in order:
            if names[i] == NONE or len(kept) >= self.max_adapters:
                break
            kept[names[i]] = float(probs[i])
            mass += float(probs[i])
            if mass >= self.top_p:
                break
        total = sum(kept.values())
        return {k: round(v / total, 6) for k, v in kept.items()}

    def choose(self, text: str) -> str | None:
        weights = self.weights(text)
        return max(weights, key=weights.get) if weights else None


def rounded(weights: Mapping[str, float], step: float = 0.1) -> dict[str, float]:
    """`weights` rounded to multiples of `step` (adapters that round to 0 dropped, the rest
    renormalised): tasks with nearly the same mixture share one combined adapter, so they can
    run as a batch instead of one by one."""
    kept = {a: round(w / step) * step for a, w in weights.items() if round(w / step) > 0}
    total = sum(kept.values())
    return {a: round(w / total, 6) for a, w in sorted(kept.items())} if total else {}


def apply_weights(model: Any, weights: Mapping[str, float], name: str = COMBINED) -> str | None:
    """Make `model` (a PeftModel holding the adapters) use `weights`: adapters off for {}, one
    adapter with `set_adapter`, or a linear combination with `add_weighted_adapter` (`cat` when
    the ranks differ). Returns the active adapter's name, or None."""
    lora = model.base_model
    if not weights:
        lora.disable_adapter_layers()
        return None
    lora.enable_adapter_layers()
    if len(weights) == 1:
        (only,) = weights
        model.set_adapter(only)
        return only
    if name in model.peft_config:
        model.delete_adapter(name)
    adapters = list(weights)
    ranks = {model.peft_config[a].r for a in adapters}
    model.add_weighted_adapter(
        adapters,
        [float(weights[a]) for a in adapters],
        adapter_name=name,
        combination_type="linear" if len(ranks) == 1 else "cat",
    )
    model.set_adapter(name)
    return name


def heldout_tasks(
    home: str | os.PathLike[str], adapter_ids: Iterable[str], n: int = 20
) -> list[tuple[str, str]]:
    """(request, adapter_id) pairs from the held-out tasks of each adapter's environments."""
    from tracegym.training import adapters

    out = []
    for adapter_id in adapter_ids:
        for env_id in adapters.metadata(home, adapter_id).env_ids:
            path = Home.at(home).environment_tasks(env_id, "heldout")
            if not path.exists():
                continue
            with path.open(encoding="utf-8") as handle:
                for i, line in enumerate(handle):
                    if i >= n:
                        break
                    out.append((json.loads(line)["observation"]["content"], adapter_id))
    return out


def routing_accuracy(router: Router, tasks: Sequence[tuple[str, str | None]]) -> dict[str, Any]:
    """Share of tasks whose top adapter is the expected one (None expects no adapter): a
    `RoutingAccuracy` in its JSON form, as stage results and reports carry it."""
    per: dict[str, list[int]] = {}
    for text, expected in tasks:
        got = router.choose(text)
        per.setdefault(expected or NONE, []).append(int(got == expected))
    total = sum(len(v) for v in per.values())
    correct = sum(sum(v) for v in per.values())
    return RoutingAccuracy(
        accuracy=round(correct / total, 4) if total else None,
        n=total,
        per_adapter={k: round(sum(v) / len(v), 4) for k, v in per.items()},
    ).to_dict()


__all__ = [
    "HashEmbedder",
    "Router",
    "RoutingAccuracy",
    "RoutingError",
    "apply_weights",
    "heldout_tasks",
    "rounded",
    "routing_accuracy",
]
