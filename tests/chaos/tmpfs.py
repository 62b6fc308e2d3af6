"""A private tmpfs for the full-disk tests: a mount namespace of their own, so nothing outside
the test sees the mount, and a skip with the reason where this machine does not allow it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def namespace_command() -> list[str]:
    """`unshare` with a mount namespace (and a user namespace when not root); skips without."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no `unshare` here: cannot mount a private tmpfs")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [unshare, *user, "--mount"]


def require_tmpfs(mount: Path) -> list[str]:
    """The namespace prefix, once a 1 MB tmpfs on `mount` is shown to work; else skip."""
    prefix = namespace_command()
    probe = subprocess.run(
        [*prefix, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {probe.stderr.strip()[-300:]}")
    return prefix
