"""Text generation with a loaded policy: the model loader, batched decoding, drafts, shared
prefixes and the CTranslate2 engine. Training (rollouts, evaluation) and serving use it.

    from tracegym.generation import load_policy, map_batched

Needs `tracegym[training]`. Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracegym.lazy import lazy_exports

if TYPE_CHECKING:  # the names, for type checkers and editors
    from tracegym.generation.batching import (
        map_batched as map_batched,
    )
    from tracegym.generation.model import (
        ModelError as ModelError,
    )
    from tracegym.generation.model import (
        Policy as Policy,
    )
    from tracegym.generation.model import (
        ensure_model as ensure_model,
    )
    from tracegym.generation.model import (
        load_policy as load_policy,
    )

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Policy": "model",
        "ModelError": "model",
        "load_policy": "model",
        "ensure_model": "model",
        "map_batched": "batching",
    },
)
