"""Runs kept on disk (`run_archive.RunArchive`): what goes in comes back, by position and by
trace id, through a small cache, and the file goes when the archive is closed."""

from __future__ import annotations

import dataclasses
import os

import pytest
from tracegym.analysis.run_archive import ArchivePart, RunArchive
from tracegym.analysis.runs import Run, Step


def _run(i: int, steps: int = 3) -> Run:
    return Run(
        trace_id=f"t{i}", run_id=f"r{i}", agent="a", success=i % 3 != 0, reward=None,
        labels={"n": i}, source=None,
        steps=[Step(position=j, trace_id=f"t{i}", span_id=f"s{i}-{j}", parent_span_id=None,
                    name="tool", operation="execute_tool", agent="a", step_index=j,
                    tool=f"tool{j}", call_id=None, input=f'{{"id": {i}}}', output="é" * i,
                    status="OK", error_type=None, start_ns=j, end_ns=j + 1, duration_ms=1.0,
                    input_tokens=None, output_tokens=None, memory_store=None,
                    memory_record=None, memory_content_hash=None, memory_result_hashes=[],
                    subtask=None, attributes={"k": [i, j]}) for j in range(steps)],
    )  # fmt: skip


def test_runs_come_back_as_they_went_in():
    runs = [_run(i) for i in range(50)]
    with RunArchive(cached=4) as archive:
        for run in runs:
            archive.append(run)
        want = [dataclasses.asdict(r) for r in runs]
        assert len(archive) == 50
        assert [dataclasses.asdict(r) for r in archive] == want
        assert dataclasses.asdict(archive[7]) == want[7]
        assert dataclasses.asdict(archive[-1]) == want[-1]
        assert [r.trace_id for r in archive[10:13]] == ["t10", "t11", "t12"]
        by_trace = archive.by_trace
        assert len(by_trace) == 50 and "t42" in by_trace and "nope" not in by_trace
        assert dataclasses.asdict(by_trace["t42"]) == want[42]
        assert by_trace.get("nope") is None and list(by_trace)[:2] == ["t0", "t1"]
        with pytest.raises(IndexError):
            archive[50]
        with pytest.raises(KeyError):
            by_trace["nope"]
        archive.append(_run(50))  # appends after reads go to the end, not over them
        assert archive[50].trace_id == "t50" and dataclasses.asdict(archive[0]) == want[0]


def test_recent_reads_are_cached_and_the_cache_stays_small():
    with RunArchive(cached=2) as archive:
        for i in range(5):
            archive.append(_run(i))
        first = archive[0]
        assert archive[0] is first  # cached
        archive[1], archive[2]
        assert archive[0] is not first  # evicted by two newer reads: read again
        assert len(archive._cache) == 2
        before = list(archive._cache)
        assert [r.trace_id for r in archive] == [f"t{i}" for i in range(5)]
        assert list(archive._cache) == before  # a pass over every run does not fill it


def test_the_file_goes_with_the_archive():
    archive = RunArchive()
    archive.append(_run(1))
    archive._files[0].flush()
    assert os.fstat(archive._files[0].fileno()).st_size > 0
    archive.close()
    assert archive.closed and archive._files[0].closed
    archive.close()  # twice is fine


def test_parts_written_apart_read_as_one_archive_in_the_order_given(tmp_path):
    parts = [ArchivePart(str(tmp_path / f"part-{w}")) for w in range(2)]
    for w, part in enumerate(parts):
        with part.writer() as writer:
            for i in range(w, 10, 2):
                writer.append(_run(i))
    order = [f"t{i}" for i in (9, 0, 5, 3, 8, 1, 2, 7, 6, 4)] + ["absent"]
    with RunArchive.joined(parts, order) as archive:
        assert not list(tmp_path.iterdir())  # unlinked once open: nothing left behind
        assert [r.trace_id for r in archive] == order[:-1]
        assert dataclasses.asdict(archive.by_trace["t5"]) == dataclasses.asdict(_run(5))
        archive.append(_run(10))  # its own file takes what is appended
        assert archive[-1].trace_id == "t10" and archive[0].trace_id == "t9"
    assert archive.closed
