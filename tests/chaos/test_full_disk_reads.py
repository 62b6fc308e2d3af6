"""Reads on a full disk failed, because opening the store compacts and the
compaction could not write. Here a real tmpfs (in a mount namespace of its own) is filled to the
last byte, then remounted read-only: `tracegym sql` and `traces` answer from the lake plus the
spool as they are, with a one-line note, and the spool files stay where they were."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.chaos.tmpfs import require_tmpfs

pytest.importorskip("duckdb")

ROOT = Path(__file__).resolve().parents[2]

# Run inside the namespace, as root there: mount, fill, read, remount read-only, read again.
DRIVER = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from tests.chaos.spool_data import write_spool
    mount = Path(sys.argv[1])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    home = mount / "home"
    total = write_spool(home, files=3, spans_per_file=300)
    try:
        with open(mount / "filler", "wb", buffering=0) as filler:
            while True:
                filler.write(b"x" * 4096)
    except OSError:
        pass
    def read(*args):
        proc = subprocess.run([sys.executable, "-m", "tracegym.cli", "--home", str(home), *args],
                              capture_output=True, text=True)
        return {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr}
    query = ["sql", "-f", "csv", "SELECT count(*) FROM spans"]
    runs = {"full": read(*query), "full_traces": read("traces", "-n", "1000")}
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    runs["read_only"] = read(*query)
    runs["spool_files"] = len(list((home / "spool").glob("*.jsonl")))
    runs["total"] = total
    print(json.dumps(runs))
    """
)


@pytest.mark.slow
def test_reads_on_a_full_then_read_only_disk_answer_without_compacting(tmp_path: Path):
    mount = tmp_path / "small"
    mount.mkdir()
    prefix = require_tmpfs(mount)
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", DRIVER, str(mount), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    total = runs["total"]
    for name in ("full", "read_only"):
        run = runs[name]
        assert run["rc"] == 0, run["err"]  # was: cannot open the store (exit 2)
        assert int(run["out"].strip().splitlines()[-1]) == total
        notes = run["err"].strip().splitlines()
        assert len(notes) == 1 and "could not compact" in notes[0], run["err"]
    assert runs["full_traces"]["rc"] == 0, runs["full_traces"]["err"]
    assert runs["full_traces"]["out"].strip().splitlines()[-1] == f"{total // 10} runs"
    assert runs["spool_files"] == 3  # nothing moved, nothing lost
