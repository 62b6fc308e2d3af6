"""Task-template families, one plug-in module per capability, each instantiated with the gap's
own tools.

| family               | trains                                             | serves detector      |
|----------------------|----------------------------------------------------|----------------------|
| tool_order           | the mined prerequisite call before the action      | wrong_tool_order     |
| grounding            | ids and values taken from lookups, never guessed   | ungrounded_argument  |
| memory_hygiene       | re-checking a stale/errored note before using it   | poisoned_memory      |
| budget               | the main request within the step budget, despite   | budget_waste         |
|                      | distractor side requests                           |                      |
| verify_before_finish | checking that a write took effect before finishing | premature_finish     |
| exact_arguments      | ids, amounts, lists in the exact recorded format   | invalid_invocation   |
| requested_action     | calling the tool the user asked for, in the users' | unserved_request     |
|                      | own wording (needs no recorded call of it), on     |                      |
|                      | their own record or on one they name and the agent |                      |
|                      | looks up first                                     |                      |
| policy_action        | acting only where the mined state rules allow it   | forbidden_action,    |
|                      |                                                    | missed_action        |
| amount               | the amount the mined relation gives on the record  | wrong_amount         |
| list_selection       | the right elements of a looked-up record           | wrong_list           |
| record_choice        | the record the user described, among several       | wrong_choice         |
|                      | listed (not the first, the latest, a near match)   |                      |

policy_action, amount and list_selection are built only from the rules the diagnosis mined from
the agent's successful runs (`Gap.rules`), and refuse a gap without one; record_choice from the
write and argument the gap's key names and the fields the recorded listing's records differ in.

Every chain family runs on the same simulated backend (`synthesis.world`): the user asks for the
gap's write tool (the *action*) on one or more records; lookups return records generated from
the recorded result shapes; what differs is what the user says, the backend's quirks and what
the verifier requires.

A family is an `Environment` subclass in a module of this package with a `family` name and the
`detectors` it serves, by their constants (`analysis.detector_names`, or the detector class's
`name`). The package finds them itself: adding a capability is a detector module, a family
module and their tests. `family_for_gap(gap)` picks the family from the gap's detector;
`build_spec(gap, catalog)` turns a gap into an `EnvironmentSpec` or raises `NotSynthesizable`
with the reason.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from tracegym.analysis.gap import Gap, GapError, as_gap
from tracegym.analysis.plugins import plugin_classes
from tracegym.synthesis.base import Environment
from tracegym.synthesis.conventions import Conventions
from tracegym.synthesis.families.budget import BudgetEnv
from tracegym.synthesis.families.chain import ChainEnvironment
from tracegym.synthesis.families.exact_arguments import ExactArgumentsEnv
from tracegym.synthesis.families.grounding import GroundingEnv
from tracegym.synthesis.families.memory_hygiene import MemoryHygieneEnv
from tracegym.synthesis.families.requested_action import RequestedActionEnv
from tracegym.synthesis.families.tool_order import ToolOrderEnv
from tracegym.synthesis.families.verify_before_finish import VerifyBeforeFinishEnv
from tracegym.synthesis.spec import Catalog, EnvironmentSpec
from tracegym.synthesis.world import NotSynthesizable

_SHARED = {"chain"}  # modules of machinery, not families


def discover() -> dict[str, type[Environment]]:
    """Every family class defined in a module of this package, by family name (module order)."""
    found: dict[str, type[Environment]] = {}
    for cls in plugin_classes(sys.modules[__name__], Environment, machinery=_SHARED):
        if not getattr(cls, "detectors", ()):
            continue
        if cls.family in found:
            raise TypeError(
                f"two families are named {cls.family!r}: "
                f"{found[cls.family].__module__} and {cls.__module__}"
            )
        found[cls.family] = cls
    return found


FAMILIES: dict[str, type[Environment]] = discover()
DETECTOR_FAMILY: dict[str, str] = {
    d: cls.family for cls in FAMILIES.values() for d in cls.detectors
}


def _typed(gap: Gap | Mapping[str, Any]) -> Gap:
    try:
        return as_gap(gap)
    except GapError as exc:
        raise NotSynthesizable(str(exc)) from None


def family_for_gap(gap: Gap | Mapping[str, Any]) -> type[Environment]:
    """The family that serves the gap's detector, or NotSynthesizable naming the ones there are."""
    detector = _typed(gap).detector
    family = DETECTOR_FAMILY.get(detector)
    if family is None:
        raise NotSynthesizable(
            f"no family exercises detector {detector!r} "
            f"(families cover: {', '.join(sorted(DETECTOR_FAMILY))})"
        )
    return FAMILIES[family]


def build_spec(
    gap: Gap | Mapping[str, Any], catalog: Catalog, conventions: Conventions | None = None
) -> EnvironmentSpec:
    """The environment spec for `gap` (a `Gap`, or its gaps.json record), following the
    agent's `conventions` when known, or NotSynthesizable with the reason."""
    typed = _typed(gap)
    return family_for_gap(typed).build_spec(typed, catalog, conventions)


__all__ = [
    "DETECTOR_FAMILY",
    "FAMILIES",
    "BudgetEnv",
    "ChainEnvironment",
    "ExactArgumentsEnv",
    "GroundingEnv",
    "MemoryHygieneEnv",
    "RequestedActionEnv",
    "ToolOrderEnv",
    "VerifyBeforeFinishEnv",
    "build_spec",
    "discover",
    "family_for_gap",
]
