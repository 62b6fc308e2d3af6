"""tracegym: trace agents as OpenTelemetry spans, find the capability gaps behind their
failures, and train them away.

    import tracegym as tg
    tg.init(service="support-bot")

The tracer API is re-exported here; analysis, synthesis and training live in their own
subpackages (installed with the matching extras) and are never imported by this module.
"""

from tracegym import testing
from tracegym.tracer import *  # noqa: F403
from tracegym.tracer import __all__ as _tracer_all
from tracegym.tracer.setup import __version__

__all__ = [*_tracer_all, "__version__", "testing"]
