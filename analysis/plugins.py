"""Plug-in classes found in the modules of a package, so a new one is a new module only.

Analysis finds its detectors this way (`analysis.detectors.registry`) and synthesis its task
families (`synthesis.families`); each says which package, which base class and which of the
package's modules are machinery rather than plug-ins, and decides itself what a found class
must have (a name, a family) and what a duplicate means.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Collection, Iterator
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")


def plugin_classes(
    package: ModuleType, base: type[T], *, machinery: Collection[str] = ()
) -> Iterator[type[T]]:
    """Every subclass of `base` defined in a module of `package` (imported on the way), in
    module-name order and by class name within a module. Modules named in `machinery`, and
    private ones (a leading underscore), are skipped; classes a module only imports are not
    its own and are skipped too."""
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in machinery or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, base) and cls.__module__ == module.__name__:
                yield cls


__all__ = ["plugin_classes"]
