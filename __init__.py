"""tracegym: trace agents as OpenTelemetry spans, find the capability gaps behind their
failures, and train them away.

    import tracegym as tg
    tg.init(service="support-bot")

The tracer API is re-exported here, imported on first use (PEP 562) so that the CLI's light
commands, which never trace, do not load the OpenTelemetry SDK. Analysis, synthesis and
training live in their own subpackages (installed with the matching extras) and are never
imported by this module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tracegym import tracer as _tracer

if TYPE_CHECKING:
    from tracegym import testing
    from tracegym.tracer import *  # noqa: F403
    from tracegym.tracer.setup import __version__

__all__ = [*_tracer.__all__, "__version__", "testing"]


def __getattr__(name: str) -> Any:
    if name in _tracer.__all__:
        value = getattr(_tracer, name)
    elif name == "__version__":
        value = importlib.import_module("tracegym.tracer.setup").__version__
    elif name == "testing":
        value = importlib.import_module("tracegym.testing")
    else:
        raise AttributeError(f"module 'tracegym' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
