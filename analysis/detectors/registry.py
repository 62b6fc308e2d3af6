"""The built-in detectors by name, and the default set analysis runs.

    from tracegym.analysis.detectors.registry import DETECTORS, default_detectors

    detectors = [d.fit(runs) for d in default_detectors()]
    findings = [f for run in runs for d in detectors for f in d.detect(run)]

A user's own detector is any `Detector` subclass; pass it alongside (or instead of) these.
A new built-in is a module of this package defining a `Detector` subclass with a `name`: it is
found by `discover` and runs after the ones listed here (whose order is fixed: ties in gap
ranking follow it), so adding one edits no other file. A class with `opt_in = True` is left
out of `DETECTORS` and the default set and kept in `OPT_IN`: `make_detector` still makes it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import tracegym.analysis.detectors as _package
from tracegym.analysis.detectors.amounts import WrongAmount
from tracegym.analysis.detectors.base import Detector
from tracegym.analysis.detectors.budget import BudgetWaste
from tracegym.analysis.detectors.invalid import InvalidInvocation
from tracegym.analysis.detectors.list_args import WrongListArgument
from tracegym.analysis.detectors.memory import PoisonedMemory
from tracegym.analysis.detectors.missed_action import MissedAction
from tracegym.analysis.detectors.missed_request import MissedRequest
from tracegym.analysis.detectors.precondition import ForbiddenAction
from tracegym.analysis.detectors.premature import PrematureFinish
from tracegym.analysis.detectors.tool_order import WrongToolOrder
from tracegym.analysis.detectors.ungrounded import UngroundedArgument
from tracegym.analysis.detectors.unserved import UnservedRequest
from tracegym.analysis.detectors.vocabulary import UnknownValue

_ORDERED: tuple[type[Detector], ...] = (
    UngroundedArgument,
    WrongToolOrder,
    PoisonedMemory,
    BudgetWaste,
    InvalidInvocation,
    PrematureFinish,
    UnservedRequest,
    ForbiddenAction,
    MissedAction,
    WrongAmount,
    WrongListArgument,
    UnknownValue,
    MissedRequest,
)
_SHARED = {"base", "registry", "state"}  # modules of machinery, not detectors


def discover(*, opt_in: bool = False) -> dict[str, type[Detector]]:
    """The built-in detectors by name: the fixed list first, then any other `Detector` subclass
    with a `name` defined in a module of this package (by module name); `opt_in=True`: only
    those marked `opt_in` (measured, not run by default)."""
    found: dict[str, type[Detector]] = {} if opt_in else {cls.name: cls for cls in _ORDERED}
    for info in sorted(pkgutil.iter_modules(_package.__path__), key=lambda m: m.name):
        if info.name in _SHARED or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{_package.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, Detector)
                and cls.__module__ == module.__name__
                and not inspect.isabstract(cls)
                and cls.name
                and cls.name not in found
                and bool(getattr(cls, "opt_in", False)) == opt_in
            ):
                found[cls.name] = cls
    return found


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
