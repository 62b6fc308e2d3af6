"""The built-in detectors by name, and the default set analysis runs.

    from tracegym.analysis.detectors.registry import DETECTORS, default_detectors

    detectors = [d.fit(runs) for d in default_detectors()]
    findings = [f for run in runs for d in detectors for f in d.detect(run)]

A user's own detector is any `Detector` subclass; pass it alongside (or instead of) these.
A new built-in is a module of this package defining a `Detector` subclass with a `name`, a
constant of `analysis.detector_names`, listed in its `BUILT_IN`: that tuple is the default set
and its order (ties in gap ranking follow it), and `discover` refuses a package that disagrees
with it. A class with `opt_in = True` is left out of `BUILT_IN`, `DETECTORS` and the default
set and kept in `OPT_IN`: `make_detector` still makes it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import tracegym.analysis.detectors as _package
from tracegym.analysis.detector_names import BUILT_IN
from tracegym.analysis.detectors.base import Detector
from tracegym.analysis.plugins import plugin_classes

_SHARED = {"base", "registry", "state"}  # modules of machinery, not detectors


class RegistryMismatch(TypeError):
    """The package's detectors and `detector_names.BUILT_IN` disagree."""


def discover(
    *, opt_in: bool = False, built_in: Sequence[str] = BUILT_IN
) -> dict[str, type[Detector]]:
    """The built-in detectors by name, in the order of `built_in` (`detector_names.BUILT_IN`):
    every `Detector` subclass with a `name` defined in a module of this package and not marked
    `opt_in`; RegistryMismatch when one of them is not listed or a listed name has no class.
    `opt_in=True`: only those marked `opt_in` (measured, not run by default), by module name."""
    found: dict[str, type[Detector]] = {}
    for cls in plugin_classes(_package, Detector, machinery=_SHARED):
        if (
            not inspect.isabstract(cls)
            and cls.name
            and cls.name not in found
            and bool(getattr(cls, "opt_in", False)) == opt_in
        ):
            found[cls.name] = cls
    if opt_in:
        return found
    unlisted = [name for name in found if name not in built_in]
    missing = [name for name in built_in if name not in found]
    problems = []
    if unlisted:
        problems.append(f"not in BUILT_IN (add it there, or mark it opt_in): {', '.join(unlisted)}")
    if missing:
        problems.append(f"in BUILT_IN with no detector class: {', '.join(missing)}")
    if problems:
        raise RegistryMismatch(
            f"analysis.detector_names.BUILT_IN and the detectors of {_package.__name__} "
            f"disagree: {'; '.join(problems)}"
        )
    return {name: found[name] for name in built_in}


DETECTORS: dict[str, type[Detector]] = discover()
OPT_IN: dict[str, type[Detector]] = discover(opt_in=True)  # made by name only


def default_detectors(**options: dict[str, Any]) -> list[Detector]:
    """A fresh instance of every built-in detector, in a fixed order. Keyword arguments named
    after a detector pass it constructor parameters, e.g.
    `default_detectors(wrong_tool_order={"min_support": 3})`."""
    unknown = set(options) - set(DETECTORS)
    if unknown:
        raise ValueError(f"unknown detectors: {', '.join(sorted(unknown))}")
    return [cls(**options.get(name, {})) for name, cls in DETECTORS.items()]


def make_detector(name: str, **params: Any) -> Detector:
    """One built-in detector by name."""
    try:
        return {**DETECTORS, **OPT_IN}[name](**params)
    except KeyError:
        raise ValueError(
            f"unknown detector {name!r}; known: {', '.join(sorted({**DETECTORS, **OPT_IN}))}"
        ) from None
