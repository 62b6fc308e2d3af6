"""The embedded spool: its format, concurrent writer processes, SIGKILL, locking, and reading
back damaged files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
import tracegym as tg
from tracegym.tracer import semconv as sc
from tracegym.tracer.spool import (
    SPOOL_VERSION,
    is_complete,
    iter_spool,
    read_spool_file,
    spool_dir,
)

pytestmark = pytest.mark.timeout(120)

FILE_NAME = re.compile(r"^\d{8}T\d{6}-[A-Za-z0-9_-]+-(\d+)-[0-9a-f]{8}\.jsonl$")


def spool_files(home: Path) -> list[Path]:
    return sorted(spool_dir(home).glob("*.jsonl"))


def start_python(code: str, *, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# Format -------------------------------------------------------------------------------------


def test_spool_records_round_trip(tmp_path, tracer_setup):
    home = tmp_path / "home"
    tracer_setup(home=home, flush_interval_s=0.05)

    @tg.tool
    def lookup(q):
        if q == "bad":
            raise LookupError("not found")
        return {"q": q}

    @tg.agent(name="spooler")
    def spooler():
        lookup("good")
        with contextlib.suppress(LookupError):
            lookup("bad")
        lookup("key sk-proj-Ab3dEfGhIjKlMnOpQrStUvWx1234567890")
        tg.record_outcome(tg.current_run_id(), success=True, reward=1.0)

    spooler()
    assert tg.flush()

    files = spool_files(home)
    assert len(files) == 1
    match = FILE_NAME.match(files[0].name)
    assert match, files[0].name
    assert int(match.group(1)) == os.getpid()
    raw = files[0].read_bytes()
    assert raw.endswith(b"\n")
    assert b"sk-proj-Ab3dEfGhIjKlMnOpQrStUvWx1234567890" not in raw  # redacted before writing

    records = list(iter_spool(home))
    assert len(records) == 5
    assert len(raw.splitlines()) == 5
    by_name = Counter(r["name"] for r in records)
    assert by_name == {"execute_tool lookup": 3, "invoke_agent spooler": 1, "tracegym.outcome": 1}
    agent = next(r for r in records if r["name"] == "invoke_agent spooler")
    tools = [r for r in records if r["name"] == "execute_tool lookup"]
    outcome = next(r for r in records if r["name"] == "tracegym.outcome")
    for r in records:
        assert r["v"] == SPOOL_VERSION
        assert re.fullmatch(r"[0-9a-f]{32}", r["trace_id"])
        assert re.fullmatch(r"[0-9a-f]{16}", r["span_id"])
        assert r["kind"] == "INTERNAL"
        assert r["scope"] == sc.INSTRUMENTATION_SCOPE
        assert 0 < r["start_ns"] <= r["end_ns"]
        assert isinstance(r["attributes"], dict)
        assert isinstance(r["resource"], dict)
    assert agent["parent_span_id"] is None
    for t in tools:
        assert t["parent_span_id"] == agent["span_id"]
        assert t["trace_id"] == agent["trace_id"]
    assert sorted(t["attributes"][sc.STEP_INDEX] for t in tools) == [0, 1, 2]
    failed = next(t for t in tools if t["status"] == "ERROR")
    assert failed["attributes"][sc.ERROR_TYPE] == "LookupError"
    assert failed["status_message"].startswith("LookupError")
    assert [e["name"] for e in failed["events"]] == ["exception"]
    assert failed["events"][0]["attributes"]["exception.message"] == "not found"
    assert sum(t["status"] == "UNSET" for t in tools) == 2
    assert outcome["parent_span_id"] is None
    assert outcome["trace_id"] != agent["trace_id"]
    assert outcome["attributes"][sc.OUTCOME_TARGET] == agent["attributes"][sc.RUN_ID]
    assert outcome["attributes"][sc.OUTCOME_REWARD] == 1.0
    assert tg.stats().spans_exported == 5


def test_file_is_locked_while_its_writer_is_open(tmp_path, tracer_setup):
    home = tmp_path / "home"
    tracer_setup(home=home, flush_interval_s=0.05)
    tg.tool(lambda: None)()
    assert tg.flush()
    (path,) = spool_files(home)
    assert is_complete(path) is False  # our own writer still holds it
    tg.shutdown()
    assert is_complete(path) is True
    assert is_complete(tmp_path / "missing.jsonl") is False


def line(label: str, **fields) -> dict:
    """A spool line with the required fields, named `label` (and `fields` on top)."""
    return {"v": 1, "trace_id": "ab" * 16, "span_id": "cd" * 8, "name": label, "start_ns": 1,
            "end_ns": 2, **fields}  # fmt: skip


def test_reader_skips_damaged_lines(tmp_path):
    directory = spool_dir(tmp_path)
    directory.mkdir(parents=True)
    good = [line(f"span {i}") for i in range(3)]
    lines = [json.dumps(good[0]), "{not json", json.dumps(good[1]), json.dumps(good[2])]
    (directory / "20260101T000000-h-1-00000000.jsonl").write_text("\n".join(lines) + "\n")
    (directory / "20260101T000001-h-2-00000000.jsonl").write_text(
        json.dumps(line("later")) + '\n{"v": 1, "name": "cut mid-wr'
    )
    (directory / "ignored.txt").write_text("not a spool file\n")
    records = list(iter_spool(tmp_path))
    assert [r["name"] for r in records] == ["span 0", "span 1", "span 2", "later"]
    counters = tg.stats().counters
    assert counters["spool_bad_lines_skipped"] == 1
    assert counters["spool_partial_lines_skipped"] == 1
    assert list(iter_spool(tmp_path / "nowhere")) == []


# Many processes -----------------------------------------------------------------------------

WORKER = """
import json, os, tracegym as tg
p = int(os.environ["WORKER_ID"])
tg.init(service=f"worker-{p}", home=os.environ["SPOOL_HOME"], flush_interval_s=0.05)

@tg.tool
def work(p, n):
    return n

for n in range(5000):
    work(p, n)
tg.shutdown()
s = tg.stats()
print(json.dumps({"exported": s.spans_exported, "dropped": s.spans_dropped,
                  "failed": s.spans_failed, "errors": s.internal_errors}))
"""


def test_concurrent_processes_every_span_exactly_once(tmp_path):
    home = tmp_path / "home"
    env = {"SPOOL_HOME": str(home), "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test"}
    procs = [start_python(WORKER, cwd=tmp_path, env={**env, "WORKER_ID": str(p)}) for p in range(4)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert json.loads(out) == {"exported": 5000, "dropped": 0, "failed": 0, "errors": 0}

    files = spool_files(home)
    pids = {int(FILE_NAME.match(f.name).group(1)) for f in files}
    assert pids == {proc.pid for proc in procs}  # one writer per file, each process its own
    assert all(is_complete(f) for f in files)  # every writer is gone

    seen = Counter()
    for record in iter_spool(home):
        args = json.loads(record["attributes"][sc.TOOL_ARGUMENTS])
        seen[(args["p"], args["n"])] += 1
        assert record["resource"]["service.name"] == f"worker-{args['p']}"
        assert record["resource"]["deployment.environment"] == "test"
    assert len(seen) == 4 * 5000
    assert set(seen.values()) == {1}
    assert set(seen) == {(p, n) for p in range(4) for n in range(5000)}


# SIGKILL ------------------------------------------------------------------------------------

KILLED = """
import os, sys, time, tracegym as tg
tg.init(home=os.environ["SPOOL_HOME"], flush_interval_s=0.05)

@tg.tool
def work(phase, n):
    return n

for n in range(300):
    work("flushed", n)
assert tg.flush()
print("flushed", flush=True)
if os.environ.get("KEEP_WRITING"):
    n = 0
    while True:  # killed somewhere in here, possibly in the middle of a write
        work("unflushed", n)
        n += 1
time.sleep(120)
"""


@pytest.mark.parametrize("keep_writing", [False, True], ids=["idle", "busy"])
def test_sigkill_keeps_what_was_flushed(tmp_path, keep_writing):
    home = tmp_path / "home"
    env = {"SPOOL_HOME": str(home), "KEEP_WRITING": "1" if keep_writing else ""}
    proc = start_python(KILLED, cwd=tmp_path, env=env)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "flushed", proc.stderr.read() if proc.poll() is not None else line
        (path,) = spool_files(home)
        if keep_writing:  # let it export more batches after the flush before killing it
            flushed_size = path.stat().st_size
            deadline = time.monotonic() + 30
            while path.stat().st_size == flushed_size and time.monotonic() < deadline:
                time.sleep(0.05)
        assert is_complete(path) is False  # the writer is alive and holds the lock
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert is_complete(path) is True  # the lock died with the writer

    records = list(iter_spool(home))
    phases = Counter()
    flushed = Counter()
    for record in records:
        args = json.loads(record["attributes"][sc.TOOL_ARGUMENTS])
        phases[args["phase"]] += 1
        if args["phase"] == "flushed":
            flushed[args["n"]] += 1
    assert flushed == Counter(range(300))  # every flushed span, exactly once
    if keep_writing:
        assert phases["unflushed"] > 0
    else:
        assert phases["unflushed"] == 0

    # whatever the kill left at the end of the file, only complete lines come back
    raw = path.read_bytes()
    complete_lines = raw.count(b"\n")
    assert len(list(read_spool_file(path))) == complete_lines
    # and a line cut by a crash mid-write is skipped, not returned half
    with open(path, "ab") as handle:
        handle.write(b'{"v":1,"trace_id":"0123')
    assert len(list(iter_spool(home))) == complete_lines
    assert tg.stats().counters["spool_partial_lines_skipped"] >= 1


# Rotation, fork and versions ----------------------------------------------------------------


def finished_spans(n: int):
    with tg.testing.capture() as cap:
        for i in range(n):
            with tg.tool("rotate", arguments={"i": i}):
                pass
    return cap.spans


def test_rotation_makes_earlier_files_complete(tmp_path):
    from tracegym.tracer.spool import SpoolSpanExporter

    spans = finished_spans(12)
    exporter = SpoolSpanExporter(tmp_path, max_file_bytes=1)  # every batch gets a new file
    for start in range(0, 12, 3):
        exporter.export(spans[start : start + 3])
    files = spool_files(tmp_path)
    assert len(files) == 4
    live = [f for f in files if not is_complete(f)]
    assert live == [exporter.writer.path]  # only the current file is still open
    exporter.shutdown()
    assert is_complete(files[-1]) is True
    records = list(iter_spool(tmp_path))
    assert sorted(json.loads(r["attributes"][sc.TOOL_ARGUMENTS])["i"] for r in records) == list(
        range(12)
    )


FORKED = """
import json, os, tracegym as tg
from tracegym.tracer.spool import iter_spool
home = tg.init(home="home", flush_interval_s=60)  # nothing leaves but through flush()
t = tg.tool(name="t")(lambda who, n: n)
t("parent-flushed", 0)
assert tg.flush()
t("parent-queued", 1)                 # still in the queue when the process forks
pid = os.fork()
if pid == 0:
    t("child", 2)
    tg.flush()
    os._exit(0)
os.waitpid(pid, 0)
t("parent-after", 3)
tg.shutdown()
print(json.dumps({"parent": os.getpid(), "child": pid}))
"""


def test_forked_child_writes_its_own_file_and_never_duplicates(run_python, tmp_path):
    result = run_python(FORKED)
    assert result.returncode == 0, result.stderr
    pids = json.loads(result.stdout)
    home = tmp_path / "home"
    by_pid: dict[int, list[str]] = {}
    for path in spool_files(home):
        pid = int(FILE_NAME.match(path.name).group(1))
        for record in read_spool_file(path):
            who = json.loads(record["attributes"][sc.TOOL_ARGUMENTS])["who"]
            by_pid.setdefault(pid, []).append(who)
    assert sorted(by_pid) == sorted(pids.values())
    assert sorted(by_pid[pids["parent"]]) == ["parent-after", "parent-flushed", "parent-queued"]
    assert by_pid[pids["child"]] == ["child"]  # the parent's queued span is not written twice


def test_reader_skips_unknown_versions(tmp_path):
    directory = spool_dir(tmp_path)
    directory.mkdir(parents=True)
    lines = [line("known"), line("from the future", v=2)]
    (directory / "20260101T000000-h-1-00000000.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in lines)
    )
    assert [r["name"] for r in iter_spool(tmp_path)] == ["known"]


@pytest.mark.parametrize(
    "change",
    [{"v": "1"}, {"v": True}, {"trace_id": "AB" * 16}, {"span_id": None}, {"name": 5},
     {"start_ns": "1"}, {"start_ns": 1.0}, {"end_ns": -1}, {"end_ns": 1 << 63}],
    ids=repr,
)  # fmt: skip
def test_reader_skips_and_counts_lines_that_are_no_span(tmp_path, change):
    """The reader (`tracegym summary`, importers) took any object of version 1; it
    skips what the store skips: a required field missing or of the wrong type."""
    directory = spool_dir(tmp_path)
    directory.mkdir(parents=True)
    lines = [line("kept"), line("wrong", **change), ["not", "an", "object"]]
    (directory / "20260101T000000-h-1-00000000.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in lines)
    )
    before = tg.stats().counters.get("spool_bad_lines_skipped", 0)
    assert [r["name"] for r in iter_spool(tmp_path)] == ["kept"]
    assert tg.stats().counters["spool_bad_lines_skipped"] - before == 2


# A full disk --------------------------------------------------------------------------------


def counts() -> tuple[int, int]:
    counters = tg.stats().counters
    return counters.get("spans_exported.spool", 0), counters.get("spans_failed.spool", 0)


def span_ids(spans) -> set[str]:
    return {format(span.context.span_id, "016x") for span in spans}


@pytest.mark.parametrize("written", [1, 2], ids=["half a line", "lines and a half"])
def test_a_write_cut_short_by_a_full_disk_leaves_no_partial_line(tmp_path, monkeypatch, written):
    """`os.write` wrote part of a batch, then failed with ENOSPC; the partial line
    stayed and the next batch was appended onto it (one span counted exported was lost, the
    failed batch's complete lines were stored). Now the file is cut back to before the batch."""
    import errno

    from opentelemetry.sdk.trace.export import SpanExportResult
    from tracegym.store import lake
    from tracegym.tracer.processors import CountingExporter
    from tracegym.tracer.spool import SpoolSpanExporter

    spans = finished_spans(12)
    exporter = CountingExporter(SpoolSpanExporter(tmp_path), "spool")
    exported0, failed0 = counts()
    assert exporter.export(spans[:4]) is SpanExportResult.SUCCESS
    fd = exporter.exporter.writer._fd
    real_write = os.write
    calls = []

    def disk_full(target: int, data) -> int:
        if target != fd:
            return real_write(target, data)
        calls.append(len(data))
        if len(calls) == 1:  # the kernel takes part of the batch ...
            line = bytes(data).index(b"\n") + 1
            cut = line // 2 if written == 1 else line + line // 2
            return real_write(target, bytes(data[:cut]))
        raise OSError(errno.ENOSPC, "No space left on device")  # ... then the disk is full

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", disk_full)
        assert exporter.export(spans[4:8]) is SpanExportResult.FAILURE
    assert len(calls) == 2
    assert exporter.export(spans[8:]) is SpanExportResult.SUCCESS  # space freed
    exporter.shutdown()

    (path,) = spool_files(tmp_path)
    lines = path.read_bytes().splitlines()
    assert [json.loads(line)["span_id"] for line in lines] == [
        format(s.context.span_id, "016x") for s in spans[:4] + spans[8:]
    ]
    exported, failed = counts()
    assert (exported - exported0, failed - failed0) == (8, 4)
    report = lake.compact(tmp_path)
    assert report.spans == exported - exported0
    stored = {r["span_id"] for r in lake_rows(tmp_path)}
    assert stored == span_ids(spans[:4] + spans[8:])


def lake_rows(home: Path) -> list[dict]:
    import duckdb

    glob = str(home / "lake" / "spans" / "**" / "*.parquet")
    rel = duckdb.sql(f"SELECT span_id FROM read_parquet('{glob}')")
    return [dict(zip(rel.columns, row, strict=True)) for row in rel.fetchall()]


def test_a_file_that_cannot_be_cut_back_is_left_for_a_new_one(tmp_path, monkeypatch):
    """When the cut back fails too, the writer moves to a new file: the next batch never lands
    after a partial line (compaction later drops that line from the complete file)."""
    import errno

    from tracegym.tracer.spool_files import SpoolWriter

    writer = SpoolWriter(tmp_path)
    writer.write(b'{"n":1}\n')
    first = writer.path
    real_write = os.write

    def disk_full(target: int, data) -> int:
        if len(data) > 4:
            return real_write(target, bytes(data[:4]))
        raise OSError(errno.ENOSPC, "No space left on device")

    def broken(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", disk_full)
        patch.setattr(os, "ftruncate", broken)
        with pytest.raises(OSError):
            writer.write(b'{"n":2}\n')
    assert is_complete(first)  # closed: nobody appends to it again
    writer.write(b'{"n":3}\n')
    writer.close()
    assert writer.path != first
    assert writer.path.read_bytes() == b'{"n":3}\n'
