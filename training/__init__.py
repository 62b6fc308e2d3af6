"""LoRA adapters per capability: training (SFT, GRPO), the adapter registry, the router that
sends a task to its adapters, and evaluation on held-out tasks.

    from tracegym.training import train_capability, Router, evaluate_capabilities

Needs `tracegym[training]`. Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracegym.lazy import lazy_exports

if TYPE_CHECKING:  # the names, for type checkers and editors
    from tracegym.training.adapters import (
        AdapterError as AdapterError,
    )
    from tracegym.training.adapters import (
        AdapterMetadata as AdapterMetadata,
    )
    from tracegym.training.adapters import (
        all_metadata as all_metadata,
    )
    from tracegym.training.adapters import (
        load_adapters as load_adapters,
    )
    from tracegym.training.adapters import (
        metadata as metadata,
    )
    from tracegym.training.capabilities import (
        Capability as Capability,
    )
    from tracegym.training.evaluate import (
        EvaluationRow as EvaluationRow,
    )
    from tracegym.training.evaluate import (
        evaluate_capabilities as evaluate_capabilities,
    )
    from tracegym.training.router import (
        Router as Router,
    )
    from tracegym.training.sft import (
        TrainConfig as TrainConfig,
    )
    from tracegym.training.sft import (
        default_config as default_config,
    )
    from tracegym.training.sft import (
        train_capability as train_capability,
    )

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "train_capability": "sft",
        "TrainConfig": "sft",
        "default_config": "sft",
        "Capability": "capabilities",
        "AdapterMetadata": "adapters",
        "AdapterError": "adapters",
        "all_metadata": "adapters",
        "metadata": "adapters",
        "load_adapters": "adapters",
        "Router": "router",
        "EvaluationRow": "evaluate",
        "evaluate_capabilities": "evaluate",
    },
)
