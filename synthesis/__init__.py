"""Verifiable training environments synthesised from capability gaps.

    from tracegym.synthesis import synthesize, registry
    report = synthesize(home)                      # <home>/gaps.json -> <home>/envs/
    env = registry.load(home, report.environments[0].env_id)
    observation, info = env.reset(seed=0)

Pure Python: nothing here needs the analysis or training extras (reading tool calls from the
store does, and imports it only then). See docs/environments.md.
"""

from tracegym.synthesis import registry
from tracegym.synthesis.base import Environment, Episode, Task, Verdict
from tracegym.synthesis.calibrate import calibrate, evaluate
from tracegym.synthesis.families import FAMILIES, build_spec
from tracegym.synthesis.pipeline import GapsFileError, synthesize
from tracegym.synthesis.spec import Catalog, EnvironmentSpec, ToolSchema, infer_catalog
from tracegym.synthesis.validity import check_environment
from tracegym.synthesis.world import NotSynthesizable, ToolError

__all__ = [
    "FAMILIES",
    "Catalog",
    "Environment",
    "EnvironmentSpec",
    "Episode",
    "GapsFileError",
    "NotSynthesizable",
    "Task",
    "ToolError",
    "ToolSchema",
    "Verdict",
    "build_spec",
    "calibrate",
    "check_environment",
    "evaluate",
    "infer_catalog",
    "registry",
    "synthesize",
]
