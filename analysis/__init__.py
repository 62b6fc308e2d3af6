"""Failure analysis over the store: runs, detectors, capability gaps and attribution.

    from tracegym.analysis import analyze
    result = analyze(home)                  # writes <home>/gaps.json (a GapsDocument)
    for gap in result.gaps: print(gap.name, gap.coverage, gap.delta)

Needs `tracegym[analysis]`. Names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracegym.lazy import lazy_exports

if TYPE_CHECKING:  # the names, for type checkers and editors
    from tracegym.analysis.attribution import (
        Attribution as Attribution,
    )
    from tracegym.analysis.attribution import (
        attribute as attribute,
    )
    from tracegym.analysis.attribution import (
        attribute_runs as attribute_runs,
    )
    from tracegym.analysis.detectors.base import (
        Detector as Detector,
    )
    from tracegym.analysis.detectors.base import (
        Finding as Finding,
    )
    from tracegym.analysis.detectors.registry import (
        default_detectors as default_detectors,
    )
    from tracegym.analysis.detectors.registry import (
        make_detector as make_detector,
    )
    from tracegym.analysis.gap import (
        Gap as Gap,
    )
    from tracegym.analysis.gap import (
        GapError as GapError,
    )
    from tracegym.analysis.gap import (
        GapsDocument as GapsDocument,
    )
    from tracegym.analysis.gap import (
        GapsDocumentError as GapsDocumentError,
    )
    from tracegym.analysis.pipeline import (
        Analysis as Analysis,
    )
    from tracegym.analysis.pipeline import (
        analyze as analyze,
    )
    from tracegym.analysis.runs import (
        Run as Run,
    )
    from tracegym.analysis.runs import (
        Step as Step,
    )
    from tracegym.analysis.runs import (
        load_runs as load_runs,
    )

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "analyze": "pipeline",
        "Analysis": "pipeline",
        "Gap": "gap",
        "GapError": "gap",
        "GapsDocument": "gap",
        "GapsDocumentError": "gap",
        "Run": "runs",
        "Step": "runs",
        "load_runs": "runs",
        "Detector": "detectors.base",
        "Finding": "detectors.base",
        "default_detectors": "detectors.registry",
        "make_detector": "detectors.registry",
        "attribute": "attribution",
        "attribute_runs": "attribution",
        "Attribution": "attribution",
    },
)
