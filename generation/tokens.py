"""Process-wide token counters: how many tokens the generation and training loops spent.

The demo's benchmark reads them around each stage (`snapshot()` before and after) to print
tokens/s next to the compute floor. Counting is a few integer additions per forward pass, under
a lock (waves of different threads may step at once); nothing reads them on the hot path.

    fed        real tokens fed to a forward pass during generation (prompt and reply tokens;
               left padding not counted): each costs about 2 x the layers' parameters
    padded     padding positions computed in batched forwards (the batch's waste)
    generated  tokens sampled (each also costs one row of the output head)
    trained    tokens through a training step's forward and backward (padding not counted)
    loss       of those, the tokens with a loss (assistant tokens)
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class TokenCounts:
    fed: int = 0
    padded: int = 0
    generated: int = 0
    trained: int = 0
    loss: int = 0

    def __sub__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(**{k: v - getattr(other, k) for k, v in asdict(self).items()})

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


_counts = TokenCounts()
_lock = threading.Lock()


def add(**amounts: int) -> None:
    """Add to the named counters (`fed=`, `padded=`, `generated=`, `trained=`, `loss=`)."""
    with _lock:
        for name, n in amounts.items():
            setattr(_counts, name, getattr(_counts, name) + int(n))


def snapshot() -> TokenCounts:
    """The counters now (a copy: subtract two snapshots for what a block spent)."""
    with _lock:
        return TokenCounts(**asdict(_counts))


__all__ = ["TokenCounts", "add", "snapshot"]
