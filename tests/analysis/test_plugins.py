"""Plug-in discovery: the shared helper, and the detector registry's agreement with BUILT_IN."""

from __future__ import annotations

import pytest
import tracegym.analysis.detectors as detectors_package
from tracegym.analysis.detector_names import BUILT_IN, MISSED_WRITE, WRONG_CHOICE
from tracegym.analysis.detectors.base import Detector
from tracegym.analysis.detectors.choice import WrongChoice
from tracegym.analysis.detectors.registry import (
    DETECTORS,
    OPT_IN,
    RegistryMismatch,
    discover,
)
from tracegym.analysis.plugins import plugin_classes


def test_plugin_classes_finds_the_package_s_own_subclasses_in_module_order() -> None:
    found = list(plugin_classes(detectors_package, Detector, machinery={"base", "registry"}))
    modules = [cls.__module__ for cls in found]
    assert modules == sorted(modules)  # module-name order
    assert all(issubclass(cls, Detector) and cls is not Detector for cls in found)
    assert WrongChoice in found
    # a module of machinery is skipped; a class a module only imports is not counted twice
    assert not any(cls.__module__.endswith(".registry") for cls in found)
    assert len(found) == len(set(found))


def test_the_default_detectors_are_built_in_in_its_order() -> None:
    assert tuple(DETECTORS) == BUILT_IN
    assert DETECTORS[WRONG_CHOICE] is WrongChoice  # runs by default, listed in BUILT_IN
    assert list(OPT_IN) == [MISSED_WRITE] and MISSED_WRITE not in BUILT_IN


def test_a_reordered_built_in_reorders_the_registry() -> None:
    reordered = tuple(reversed(BUILT_IN))
    assert tuple(discover(built_in=reordered)) == reordered


def test_a_detector_missing_from_built_in_is_refused() -> None:
    short = tuple(n for n in BUILT_IN if n != WRONG_CHOICE)
    with pytest.raises(RegistryMismatch, match=f"not in BUILT_IN.*{WRONG_CHOICE}"):
        discover(built_in=short)


def test_a_built_in_name_without_a_detector_is_refused() -> None:
    with pytest.raises(RegistryMismatch, match="no detector class: no_such_detector"):
        discover(built_in=(*BUILT_IN, "no_such_detector"))
