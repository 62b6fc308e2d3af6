"""Integration tests against real backends (`make integration`; not in the default run's way:
each skips, saying why, when its backend's package is not installed)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: runs a real backend (Phoenix ...) on loopback; `make integration`"
    )
