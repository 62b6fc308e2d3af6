"""With the home on a full 20 MB tmpfs the agent was unharmed, but once space was
freed one span counted as exported was lost and the complete lines of the batch counted as
failed were stored: `SpoolWriter.write` left a partial line after ENOSPC and appended the next
batch onto it. Here a real tmpfs (mounted in a mount namespace of its own, so nothing outside
sees it) runs out of space in the middle of a batch; the exporter's counts must equal what
compaction stores, and no line may be merged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.chaos.tmpfs import namespace_command, require_tmpfs

pytest.importorskip("duckdb")

pytestmark = pytest.mark.timeout(180)

BATCH = 120  # spans a flush; their lines (~70 KB) are several times the space left free
FREE = 16 * 1024

AGENT = textwrap.dedent(
    """
    import errno, json, sys
    from pathlib import Path
    import tracegym as tg
    from tracegym.store.lake import compact
    from tracegym.store.store import Store

    mount, batch, free = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    home = tg.init(home=mount / "home", flush_interval_s=3600, service="full-disk")
    (home / "spool").mkdir(parents=True, exist_ok=True)

    # Fill the disk but for `free` bytes: hold them in a file, fill the rest, let them go.
    gap = mount / "gap"
    gap.write_bytes(b"g" * free)
    with open(mount / "filler", "wb", buffering=0) as filler:
        for size in (1 << 20, 4096, 1):
            try:
                while filler.write(b"f" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    gap.unlink()

    @tg.tool
    def lookup(i):
        return {"i": i}

    returned, flushed = [], []
    for b in range(3):
        returned += [lookup(b * batch + i) for i in range(batch)]
        flushed.append(tg.flush())
        if b == 0:
            (mount / "filler").unlink()  # space freed after the first, failed, batch
    tg.shutdown()
    stats = tg.stats()
    spool = sorted((home / "spool").glob("*.jsonl"))
    lines = [line for path in spool for line in path.read_bytes().split(b"\\n")[:-1]]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line)["span_id"])
        except ValueError:
            parsed.append(None)
    report = compact(home)
    stored = Store(home).fetch("SELECT span_id FROM spans").rows
    print(json.dumps({
        "returned_ok": returned == [{"i": n} for n in range(3 * batch)],
        "flushed": flushed,
        "exported": stats.counters.get("spans_exported.spool", 0),
        "failed": stats.counters.get("spans_failed.spool", 0),
        "dropped": stats.spans_dropped,
        "lines": len(lines),
        "unparsable_lines": parsed.count(None),
        "compacted": report.spans,
        "bad_lines": report.bad_lines,
        "truncated_lines": report.truncated_lines,
        "stored": len(stored),
        "stored_unique": len(set(stored)),
    }))
    """
)


def _in_tmpfs(mount: Path, size: str, *argv: str) -> subprocess.CompletedProcess:
    """Run `argv` with a fresh tmpfs of `size` on `mount`, in a private mount namespace."""
    prefix = namespace_command()
    script = 'mount -t tmpfs -o size="$1" tmpfs "$2" || exit 97; shift 2; exec "$@"'
    return subprocess.run(
        [*prefix, "sh", "-c", script, "sh", size, str(mount), *argv],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_a_full_disk_mid_batch_loses_nothing_counted_and_merges_no_line(tmp_path: Path):
    mount = tmp_path / "small"
    mount.mkdir()
    require_tmpfs(mount)

    result = _in_tmpfs(mount, "20m", sys.executable, "-c", AGENT, str(mount), str(BATCH), str(FREE))

    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["returned_ok"]  # the agent is unharmed
    assert got["flushed"] == [False, True, True]  # the first batch hit the full disk
    assert got["dropped"] == 0
    assert (got["exported"], got["failed"]) == (2 * BATCH, BATCH)
    assert got["unparsable_lines"] == 0  # no partial line, nothing appended onto one
    assert got["lines"] == got["exported"]
    assert got["compacted"] == got["stored"] == got["stored_unique"] == got["exported"]
    assert (got["bad_lines"], got["truncated_lines"]) == (0, 0)
