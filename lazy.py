"""Lazy public faces: a room's `__init__` lists the names users call, and imports the module
behind a name only when it is first used, so `import tracegym.store` costs nothing until a
`Store` is wanted (the store needs DuckDB, training needs torch).

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"Store": "store", "compact": "lake"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """A module `__getattr__`, `__dir__` and `__all__` for `package`: each exported name is
    looked up in `package.<module>` (its value in `exports`) on first access."""
    public = sorted(exports)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return public

    return __getattr__, __dir__, public
