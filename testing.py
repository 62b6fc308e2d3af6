"""`tracegym.testing`: record tracegym spans in memory in your own tests (see
`tracegym.tracer.testing`)."""

from tracegym.tracer.testing import Captured, capture

__all__ = ["Captured", "capture"]
