"""`pip install .` (a regular, non-editable install) carries every subpackage under the one
`tracegym` namespace, and nothing with a generic top-level name."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_holds_one_namespace_with_every_subpackage(tmp_path: Path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("tracegym-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"tracegym", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    skip = {"tests", "benchmarks", "build", "docs"}
    folders = [d for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(".")]
    expected = {
        p.parent.relative_to(ROOT).as_posix()
        for folder in folders
        if folder.name not in skip
        for p in folder.rglob("__init__.py")
    }
    assert {"tracegym/" + p for p in expected} <= packages
    assert "tracegym/cli.py" in names and "tracegym/tracer/spool.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tracegym = tracegym.cli:app" in zipfile.ZipFile(wheel).read(entry_points).decode()
