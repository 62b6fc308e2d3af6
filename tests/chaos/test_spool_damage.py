"""A garbage or half-written spool line became a span of NULLs. DuckDB's
`read_json(..., ignore_errors=true)` kept such a line as a row: 20 KB of random bytes gave
dozens of phantom spans after compaction, and a live batch cut mid-line gave a run with no
start time (the dashboard's `/` answered 500). Now only lines that are JSON objects with the
required fields of the right types become rows; compaction counts the others
(`CompactionReport.bad_lines`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from tracegym.store.lake import compact
from tracegym.store.records import encode_records, span_record, stable_id
from tracegym.store.store import Store
from tracegym.tracer.spool_files import SpoolWriter, is_complete, read_spool_file, spool_dir

BASE_NS = 1_764_460_800_000_000_000


def records(tag: str, n: int) -> list[dict]:
    out = []
    for i in range(n):
        start = BASE_NS + i * 1_000_000
        out.append(
            span_record(
                trace_id=stable_id(tag, i // 3),
                span_id=stable_id(tag, i, width=16),
                parent_span_id=None if i % 3 == 0 else stable_id(tag, i - i % 3, width=16),
                name="invoke_agent a" if i % 3 == 0 else "execute_tool lookup",
                start_ns=start,
                end_ns=start + 500_000,
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "q"},
            )
        )
    return out


def damage() -> tuple[bytes, int]:
    """20 KB of random bytes and a line cut mid-way that the next line was appended onto (a
    disk-full write), each ending in a newline; returns (bytes, how many lines they make)."""
    garbage = random.Random(31).randbytes(20_000)
    cut = encode_records(records("cut", 1))[:70]
    merged = cut + encode_records(records("merged", 1))
    return garbage + b"\n" + merged, garbage.count(b"\n") + 1 + 1


def nonblank(data: bytes) -> int:
    """The lines of `data` (each ending in a newline) holding more than white space."""
    return sum(1 for line in data.split(b"\n")[:-1] if line.strip())


def ids(rows: list[dict]) -> set[tuple[str, str]]:
    return {(r["trace_id"], r["span_id"]) for r in rows}


def test_garbage_lines_in_a_complete_file_are_skipped_and_counted(tmp_path: Path) -> None:
    before, after = records("before", 7), records("after", 5)
    bad, bad_lines = damage()
    directory = spool_dir(tmp_path)
    directory.mkdir(parents=True)
    path = directory / "20251130T000000-host-1-00000001.jsonl"
    # ... and a last line cut by a crash (no newline): cut off and counted apart, as before
    tail = encode_records(records("tail", 1))[:50]
    path.write_bytes(encode_records(before) + bad + encode_records(after) + tail)
    assert is_complete(path)

    report = compact(tmp_path)

    assert report.files == 1
    assert report.spans == len(before) + len(after)
    assert report.bad_lines == bad_lines
    assert report.truncated_lines == 1
    store = Store(tmp_path)
    rows = store.fetch("SELECT trace_id, span_id, name, start_time FROM spans")
    got = [dict(zip(rows.columns, row, strict=True)) for row in rows.rows]
    assert ids(got) == ids(before + after)  # no phantom row, nothing lost
    assert all(r["name"] and r["start_time"] is not None for r in got)


def test_a_live_file_shows_only_its_valid_complete_lines(tmp_path: Path) -> None:
    good = records("live", 6)
    bad, _ = damage()
    writer = SpoolWriter(tmp_path)
    try:
        writer.write(encode_records(good[:3]) + bad + encode_records(good[3:]))
        # a batch still being written: its last line has no newline yet
        writer.write(encode_records(records("unfinished", 1))[:90])
        assert writer.path is not None and not is_complete(writer.path)
        store = Store(tmp_path)
        assert store.last_compaction is not None and store.last_compaction.skipped_live
        rows = store.fetch("SELECT trace_id, span_id, start_time FROM spans")
        got = [dict(zip(rows.columns, row, strict=True)) for row in rows.rows]
        assert ids(got) == ids(good)
        assert all(r["start_time"] is not None for r in got)
        (traces,) = store.fetch("SELECT count(*) FROM traces").rows[0]
        assert traces == len({r["trace_id"] for r in good})
        # the skipped lines are counted, the one still being written among them
        counted = store.fetch("SELECT file, lines FROM spool_bad_lines").rows
        assert counted == [(str(writer.path), nonblank(bad) + 1)]
    finally:
        writer.close()


@pytest.mark.parametrize(
    "change",
    [
        {"v": "1"},
        {"v": 1.0},
        {"v": True},
        {"v": 2},
        {"trace_id": "A" * 32},
        {"trace_id": "a" * 31},
        {"span_id": 5},
        {"span_id": "zz" * 8},
        {"name": 5},
        {"name": None},
        {"start_ns": "1764460800000000000"},
        {"start_ns": 1.5},
        {"start_ns": -1},
        {"start_ns": 2**63},
        {"end_ns": None},
    ],
    ids=repr,
)
def test_a_line_with_a_required_field_of_the_wrong_type_is_not_a_span(
    tmp_path: Path, change: dict
) -> None:
    (good,) = records("typed", 1)
    bad = {**good, **change}
    directory = spool_dir(tmp_path)
    directory.mkdir(parents=True)
    path = directory / "20251130T000000-host-1-00000002.jsonl"
    line = json.dumps(bad, separators=(",", ":")) + "\n"
    path.write_text(json.dumps(good, separators=(",", ":")) + "\n" + line)
    # the standard-library reader (`tracegym summary`, importers) skips the very same lines
    assert [r["span_id"] for r in read_spool_file(path)] == [good["span_id"]]

    report = compact(tmp_path)

    assert report.spans == 1
    assert report.bad_lines == 1
    rows = Store(tmp_path).fetch("SELECT trace_id, span_id FROM spans").rows
    assert rows == [(good["trace_id"], good["span_id"])]


def test_the_compact_command_says_what_it_skipped(tmp_path: Path) -> None:
    from tracegym.cli import app
    from typer.testing import CliRunner

    bad, bad_lines = damage()
    directory = spool_dir(tmp_path)
    directory.mkdir(parents=True)
    path = directory / "20251130T000000-host-1-00000003.jsonl"
    path.write_bytes(encode_records(records("cli", 4)) + bad + b'{"v":1,"trace_id":"ab')

    done = CliRunner().invoke(app, ["--home", str(tmp_path), "compact"])

    assert done.exit_code == 0, done.output
    assert "compacted 1 spool file, 4 spans" in done.stdout
    assert f"skipped {bad_lines} lines that are no span and 1 line cut short" in done.stderr


def test_blank_lines_are_not_counted_and_a_bad_lines_values_are_never_computed(
    tmp_path: Path,
) -> None:
    """Compaction reads the spool once: a line that is no span becomes a row of NULLs routed
    to a part of its own, counted and deleted. Its values must reach no expression (a negative
    start and the largest end would overflow `end_ns - start_ns`), and blank lines are no
    line at all, as `spool_bad_lines` counts them."""
    good = records("once", 2)
    overflowing = {**good[0], "span_id": "ab" * 8, "start_ns": -(2**63), "end_ns": 2**63 - 1}
    directory = spool_dir(tmp_path)
    directory.mkdir(parents=True)
    path = directory / "20251130T000000-host-1-00000004.jsonl"
    path.write_bytes(
        encode_records(good[:1]) + b"\n   \n\t\n"
        + json.dumps(overflowing).encode() + b"\n" + encode_records(good[1:])
    )  # fmt: skip

    report = compact(tmp_path)

    assert (report.spans, report.bad_lines, report.truncated_lines) == (2, 1, 0)
    lake_files = [p.relative_to(tmp_path).as_posix() for p in (tmp_path / "lake").rglob("*")]
    assert lake_files and not [p for p in lake_files if "_bad" in p or "NULL" in p]
    rows = Store(tmp_path).fetch("SELECT trace_id, span_id FROM spans ORDER BY span_id").rows
    assert sorted(rows) == sorted(ids(good))


def test_a_line_longer_than_the_fast_buffers_is_read_again_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compaction reads with small buffers first (DuckDB reads each buffer in a thread); a line
    longer than they hold is an error there, and the batch is read again with the largest."""
    from tracegym.store import lake

    monkeypatch.setattr(lake, "FAST_LINE_BYTES", 1 << 20)  # DuckDB's floor is 16 MB
    monkeypatch.setattr(lake, "MAX_LINE_BYTES", 64 << 20)
    small = records("long", 3)
    big = {**small[1], "attributes": {"gen_ai.tool.name": "q", "blob": "x" * (40 << 20)}}
    directory = spool_dir(tmp_path)
    directory.mkdir(parents=True)
    path = directory / "20251130T000000-host-1-00000005.jsonl"
    path.write_bytes(
        encode_records(small[:1]) + json.dumps(big).encode() + b"\n" + encode_records(small[2:])
    )

    report = compact(tmp_path)

    assert (report.spans, report.bad_lines) == (3, 0)
    store = Store(tmp_path)
    (longest,) = store.fetch("SELECT max(length(attributes)) FROM spans").rows[0]
    assert longest > 40 << 20
