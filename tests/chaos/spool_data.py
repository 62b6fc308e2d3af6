"""Complete spool files with known contents, for the compaction and reader reproductions."""

from __future__ import annotations

from pathlib import Path

from tracegym.store.records import outcome_record, span_record, stable_id, write_spool_file

BASE_NS = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z


def write_spool(home: Path, files: int, spans_per_file: int, *, outcomes: bool = False) -> int:
    """Spool files of tool spans over two days (two parts a file), with one outcome each when
    `outcomes`; returns the span count."""
    for f in range(files):
        records = []
        for i in range(spans_per_file):
            start = BASE_NS + (f * spans_per_file + i) * 1_000_000 + (i % 2) * 86_400 * 10**9
            records.append(
                span_record(
                    trace_id=stable_id("t", f, i // 10),
                    span_id=stable_id("s", f, i, width=16),
                    name="execute_tool lookup",
                    start_ns=start,
                    end_ns=start + 500_000,
                    attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "q"},
                )
            )
        if outcomes:
            records.append(outcome_record(stable_id("t", f, 0), time_ns=BASE_NS + f, success=True))
        write_spool_file(home, records, f"20251130T000000-host-{f}-{f:08x}")
    return files * spans_per_file
