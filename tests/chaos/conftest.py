"""The chaos suite: concurrency, faults and hostile input, each a reproduction of a fault found.

Every test here is bounded in count and time and talks to loopback only. They are marked
`chaos` (run them alone with `pytest -m chaos`); the slower ones are also marked `slow`, which
the quick inner loop (`pytest -m "not slow"`) leaves out.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.chaos)
