"""constraints.txt (what `make install` pins) must satisfy pyproject.toml's dependencies.

A dependency added or narrowed in pyproject.toml without `make lock` would leave pip either
refusing the install or resolving that package on its own again; this names the package first.
"""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.fixtures.requirements import base_requirements, extra_requirements

ROOT = Path(__file__).resolve().parents[1]
# The extras `make install` and .ci/run install (Makefile's LOCK_EXTRAS).
LOCKED_EXTRAS = ("all", "dev", "spark", "iceberg", "collector")


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        assert version, f"constraints.txt: {line!r} is not a name==version pin"
        pins[canonicalize_name(name)] = version
    return pins


def _requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """The project's requirements and those of the extras."""
    return base_requirements() + extra_requirements(extras)


def test_every_locked_requirement_is_pinned_within_its_range() -> None:
    pins = _pins()
    problems = []
    for req in _requirements(LOCKED_EXTRAS):
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        version = pins.get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"{req.name}: not pinned")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}=={version} is outside {req.specifier}")
    assert not problems, "run `make lock`: " + "; ".join(problems)


def test_torch_is_the_cpu_release_the_makefile_installs_and_no_cuda_package_is_pinned() -> None:
    pins = _pins()
    makefile = (ROOT / "Makefile").read_text()
    assert f"TORCH := torch=={pins['torch']}\n" in makefile
    assert not [name for name in pins if name.startswith("nvidia-") or name == "triton"]
