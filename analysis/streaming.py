"""Analysis past what memory holds: detectors fitted on a sample, every run streamed through.

Up to `MAX_RESIDENT` runs, `analyze` loads them all. Past that, `detect_streamed` fits the
detectors on a seeded sample of that many runs (what they learn are rates and rules, which a
sample of that size pins down; `sample_filter`), then streams every run from the lake through
them, one at a time, keeping of each its findings, its facts (`run_facts.RunFacts`: what
scoring, clustering and describing gaps need) and a compressed copy on disk
(`run_archive.RunArchive`). The lake is read in partitions of about RUNS_PER_PARTITION runs (by
a hash of the trace id: DuckDB then orders one partition's spans at a time, not the lake's);
with `workers` > 1, by as many processes, each with the fitted detectors, or by Spark tasks
(`engine="spark"`, `analysis.spark_tasks`). Results are put back in the runs' order: the same
findings and facts however the work was split.

Memory is then the sample while fitting, a batch of rows and a run while streaming, and the
facts and findings: flat in the number of runs bar those (docs/scale.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracegym.analysis.detection import Detection
from tracegym.analysis.detectors.base import Detector, Finding
from tracegym.analysis.run_archive import ArchivePart, RunArchive
from tracegym.analysis.run_facts import RunFacts
from tracegym.analysis.runs import RUN_ORDER, Run, iter_runs, load_runs
from tracegym.tracer import internal

MAX_RESIDENT = 5_000  # runs analysed in memory; past this they stream, fitted on this many
RUNS_PER_PARTITION = 1_000  # runs whose spans DuckDB orders at once while streaming


def count_runs(store: Any, where: str = "") -> int:
    """The runs `iter_runs(store, where)` yields."""
    within = f"WHERE {where}" if where else ""
    return int(store.sql(f"SELECT count(*) FROM traces {within}").fetchall()[0][0])


def _and(where: str, condition: str) -> str:
    return f"({where}) AND {condition}" if where else condition


def sample_filter(where: str, size: int) -> str:
    """A condition over the `traces` view keeping a seeded sample of `size` of the runs
    `where` keeps: those of the smallest hash of their trace id (uniform, the same every
    time, and no trace content in the SQL). With them, up to `size` runs whose memory writes
    another run read (`memory_ops.source_write_trace_ids`): poisoned_memory judges a read by
    the write it returned, whichever run wrote it, so a sample without the writers would lose
    every finding on memory written by a run outside it."""
    within = f"WHERE {where}" if where else ""
    n = int(size)
    sampled = (f"trace_id IN (SELECT trace_id FROM traces {within} "
               f"ORDER BY hash(trace_id), trace_id LIMIT {n})")  # fmt: skip
    writers = ("trace_id IN (SELECT DISTINCT writer FROM (SELECT unnest(source_write_trace_ids) "
               "AS writer FROM memory_ops) WHERE writer IS NOT NULL "
               f"ORDER BY hash(writer), writer LIMIT {n})")  # fmt: skip
    return _and(where, f"({sampled} OR {writers})")


def partition_filter(where: str, part: int, parts: int) -> str:
    """The runs of `where` in partition `part` of `parts` (by a hash of the trace id)."""
    return _and(where, f"hash(trace_id) % {int(parts)} = {int(part)}")


@dataclass
class Detected:
    """What detection leaves of the runs: `runs` a list, or a `RunArchive` when streamed."""

    runs: Sequence[Run]
    facts: list[RunFacts]
    findings: dict[str, list[Finding]]
    errors: dict[str, str]
    fitted_on: int


@dataclass
class _Part:
    """One worker's runs, in the order it read them."""

    archive: ArchivePart
    findings: list[list[Finding]] = field(default_factory=list)
    facts: list[RunFacts] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


Launcher = Callable[[str, Sequence[str]], None]  # runs task files (`run_task`), or raises
ENGINES = ("processes", "spark")  # what runs a streamed analysis's worker tasks


def check_engine(engine: str) -> None:
    """Refuse an engine not in ENGINES (before any work)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")


def detect_streamed(
    store: Any, where: str, detectors: Sequence[Detector], *, batch_rows: int, total: int,
    sample: int, workers: int, timings: dict[str, float], say: Callable[[str], None],
    engine: str = "processes",
) -> Detected:  # fmt: skip
    """Fit on a sample of `sample` runs, then stream all `total` of them (module docstring).
    With `workers` > 1 both happen in worker processes, so this one never holds the sample:
    the detectors are fitted in one (two would each hold it), then detect in `workers`. With
    `engine` "spark" the same tasks are Spark tasks (`analysis.spark_tasks`), as many as the
    session runs at once, `workers` cores for a local session."""
    check_engine(engine)
    with contextlib.ExitStack() as stack:
        if engine == "spark":
            from tracegym.analysis import spark_tasks

            session = stack.enter_context(spark_tasks.spark_session(workers))
            launch = functools.partial(_on_spark, session)
            pool = _Workers(launch, spark_tasks.parallelism(session), "Spark task", always=True)
        else:
            pool = _Workers(_in_processes, workers, "process")
        return _detect_streamed(store, where, detectors, batch_rows, total, sample, pool,
                                timings, say)  # fmt: skip


@dataclass(frozen=True)
class _Workers:
    """What runs a streamed analysis's worker tasks: `launch` runs task files, `size` at once;
    `always`: ship the work even to one of them (a Spark executor is not this process)."""

    launch: Launcher
    size: int
    called: str  # what one is called: "process", "Spark task"
    always: bool = False

    def count(self, n: int) -> str:
        return f"{n} {self.called}" + ("" if n == 1 else "es" if self.called.endswith("s") else "s")


def _detect_streamed(
    store: Any, where: str, detectors: Sequence[Detector], batch_rows: int, total: int,
    sample: int, pool: _Workers, timings: dict[str, float], say: Callable[[str], None],
) -> Detected:  # fmt: skip
    lake = getattr(store, "lake", None)  # an object lake the store was opened on, if any
    home = (str(store.home), lake.config.url if lake else None)  # what a worker opens
    parts = max(1, -(-total // RUNS_PER_PARTITION))
    workers = max(1, min(pool.size, parts))
    ship = (pool.always or workers > 1) and _portable(detectors)
    with tempfile.TemporaryDirectory(prefix="tracegym-runs-") as folder:
        say(f"{total} runs: fitting the detectors on a sample of {sample}")
        clock = time.perf_counter()
        fitted = None
        sampled = sample_filter(where, sample)
        shipped = _pickled(list(detectors)) if ship else None
        if shipped is not None:  # one process: two would each hold the sample
            task = ("fit", (home, sampled, shipped, batch_rows))
            size = count_runs(store, sampled)
            fitted = _or_none(_tasks(pool.launch, folder, "fit", [task], size, lambda r: r[1]),
                              say)  # fmt: skip
        if fitted is not None:
            [(detection, fitted_on)] = fitted
        else:
            detection, fitted_on = _fit(store, sampled, detectors, batch_rows)
        timings["fit"] = time.perf_counter() - clock

        clock = time.perf_counter()
        paths = [os.path.join(folder, f"part-{w}") for w in range(workers)]
        done: list[_Part] | None = None
        detecting = _pickled(detection) if ship else None
        if detecting is not None:
            say(f"streaming {total} runs through the detectors in {pool.count(workers)}")
            tasks = [("detect", (home, where, detecting, range(w, parts, workers), parts,
                                 batch_rows, paths[w])) for w in range(workers)]  # fmt: skip
            done = _or_none(_tasks(pool.launch, folder, "detect", tasks, total,
                                   lambda part: len(part.facts)), say)  # fmt: skip
        if done is None:
            say(f"streaming {total} runs through the detectors")
            done = [_detect_parts(store, where, detection, range(parts), parts, batch_rows,
                                  paths[0])]  # fmt: skip
        order = _run_order(store, where)
        archive = RunArchive.joined([d.archive for d in done], order)
    detected = _in_order(done, order, archive, fitted_on)
    detected.errors = {**detection.errors, **detected.errors}
    timings["detect"] = time.perf_counter() - clock
    return detected


def _fit(store: Any, where: str, detectors: Sequence[Detector],
         batch_rows: int) -> tuple[Detection, int]:  # fmt: skip
    """The detectors fitted on the runs of `where` (a sample), and how many runs that was."""
    fitting = load_runs(store, where, batch_rows)
    return Detection.fitted(detectors, fitting), len(fitting)


def _portable(detectors: Sequence[Detector]) -> bool:
    """Whether a worker process can rebuild these detectors: not where one's class is of the
    caller's own script (a worker's `__main__` is not that script)."""
    return all(type(d).__module__ != "__main__" for d in detectors)


def _pickled(value: Any) -> bytes | None:
    """The value as bytes for a worker; None where it cannot be pickled (a user's detector
    holding a lock, a lambda): then this process does the work."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # whatever pickling raises, one process still works
        return None


class WorkerFailed(RuntimeError):
    """A worker process exited with an error (its last lines of stderr are in the message)."""


def _or_none(run: Callable[[], list[Any]], say: Callable[[str], None]) -> list[Any] | None:
    """The workers' results; None (reported, and said) where one failed or the work could
    not be shipped: this process then does it, slower, and nothing is lost."""
    try:
        return run()
    except WorkerFailed as exc:
        internal.report_error("analysis.stream_worker", exc)
        say(f"{exc}; working in this process instead")
        return None


def _run_order(store: Any, where: str) -> list[str]:
    """Trace ids in the order `iter_runs` yields them (and the in-memory analysis uses)."""
    within = f"WHERE {where}" if where else ""
    ordered = store.sql(f"SELECT trace_id FROM traces {within} ORDER BY {RUN_ORDER}")
    return [row[0] for row in ordered.fetchall()]


def _in_order(done: Sequence[_Part], order: Sequence[str], archive: RunArchive,
              fitted_on: int) -> Detected:  # fmt: skip
    """The parts' findings and facts in the runs' order: what one pass in order gives."""
    by_trace: dict[str, tuple[list[Finding], RunFacts]] = {}
    errors: dict[str, str] = {}
    for part in done:
        errors.update(part.errors)
        for found, fact in zip(part.findings, part.facts, strict=True):
            by_trace.setdefault(fact.trace_id, (found, fact))
    findings = {t: by_trace[t][0] for t in order if t in by_trace}
    facts = [by_trace[t][1] for t in order if t in by_trace]
    return Detected(archive, facts, findings, errors, fitted_on)


def _detect_parts(store: Any, where: str, detection: Detection, parts: Iterable[int],
                  of: int, batch_rows: int, path: str) -> _Part:  # fmt: skip
    """Partitions `parts` of `of` through the fitted detectors, one after the other: DuckDB
    orders one partition's spans at a time (`iter_runs`), never the whole lake's."""
    part = _Part(ArchivePart(path))
    with part.archive.writer() as archive:
        for p in parts:
            for run in iter_runs(store, partition_filter(where, p, of), batch_rows):
                found = detection.detect(run)
                part.findings.append(found)
                part.facts.append(RunFacts.of(run, found))
                archive.append(run)
    part.errors = detection.errors
    return part


Task = tuple[str, tuple[Any, ...]]  # (kind, arguments): what `run_task` does in a worker


def _tasks(launch: Launcher, folder: str, kind: str, tasks: Sequence[Task], expected: int,
           runs_of: Callable[[Any], int]) -> Callable[[], list[Any]]:  # fmt: skip
    """Work for one worker per task, as a call that writes the task files into `folder`, has
    `launch` run them all, and returns their results in task order (`WorkerFailed` where one
    failed, left no result, or where they read another number of runs, `runs_of` each result,
    than `expected`)."""

    def run() -> list[Any]:
        paths = [os.path.join(folder, f"{kind}-{n}") for n in range(len(tasks))]
        for path, task in zip(paths, tasks, strict=True):
            with open(f"{path}.task", "wb") as out:
                pickle.dump(task, out, protocol=pickle.HIGHEST_PROTOCOL)
        launch(kind, [f"{path}.task" for path in paths])
        results = []
        for path in paths:
            if not os.path.exists(f"{path}.result"):
                raise WorkerFailed(f"a {kind} worker left no result in {folder} (a folder "
                                   "the workers cannot reach?)")  # fmt: skip
            with open(f"{path}.result", "rb") as result:
                results.append(pickle.load(result))  # written by our own worker, just now
        read = sum(runs_of(result) for result in results)
        if read != expected:  # a worker read another lake (or another state of it): say so
            raise WorkerFailed(f"the {kind} workers read {read} runs, not the {expected} here")
        return results

    return run


def _in_processes(kind: str, task_paths: Sequence[str]) -> None:
    """Run each task file in a worker process of its own, all at once, and wait for every
    one. Workers are fresh interpreters (`python -m tracegym.analysis.stream_worker`): not
    forks of this one, which holds DuckDB's threads, and not multiprocessing's spawn, which
    runs the caller's own script again where it has no main guard."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", "tracegym.analysis.stream_worker"]
    quiet, piped = subprocess.DEVNULL, subprocess.PIPE
    started = [subprocess.Popen([*command, p], env=env, stdout=quiet, stderr=piped)
               for p in task_paths]  # fmt: skip
    stderr = [process.communicate()[1] for process in started]  # every one ends first
    for process, errors in zip(started, stderr, strict=True):
        if process.returncode:
            tail = errors.decode(errors="replace").strip().splitlines()[-3:]
            raise WorkerFailed(f"a {kind} worker failed (exit {process.returncode}): "
                               + " | ".join(tail))  # fmt: skip


def _on_spark(session: Any, kind: str, task_paths: Sequence[str]) -> None:
    """Run each task file as a Spark task (`spark_tasks.run_tasks`)."""
    from tracegym.analysis import spark_tasks

    try:
        spark_tasks.run_tasks(session, task_paths)
    except Exception as exc:  # Py4J's and Spark's errors alike: the work is redone here
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise WorkerFailed(f"a {kind} task failed on Spark: {lines[0][:300]}") from exc


WorkerStore = tuple[str, str | None]  # a worker's store: the home, and its object lake's URL if any


def _open(home: WorkerStore) -> Any:
    """The store a worker reads: the analysing process's home and lake (a lake URL it was
    opened with is in neither the environment nor lake.json), not compacted again."""
    from tracegym.store.store import Store

    return Store(home[0], compact_on_open=False, lake_url=home[1])


def _fit_task(
    home: WorkerStore, where: str, shipped: bytes, batch_rows: int
) -> tuple[Detection, int]:
    detectors: list[Detector] = pickle.loads(shipped)  # pickled by the analysis that started us
    with _open(home) as store:
        return _fit(store, where, detectors, batch_rows)


def _detect_task(home: WorkerStore, where: str, shipped: bytes, parts: Iterable[int], of: int,
                 batch_rows: int, path: str) -> _Part:  # fmt: skip
    detection: Detection = pickle.loads(shipped)  # pickled by the analysis that started us
    with _open(home) as store:
        return _detect_parts(store, where, detection, parts, of, batch_rows, path)


_TASKS: dict[str, Callable[..., Any]] = {"fit": _fit_task, "detect": _detect_task}


def run_task(task_path: str) -> None:
    """A worker's life (`stream_worker`): its task (fit the detectors on the sample, or detect
    its partitions of the lake), the result pickled beside the task."""
    with open(task_path, "rb") as task:  # written by the analysis that started this worker
        kind, args = pickle.load(task)
    result = _TASKS[kind](*args)
    with open(task_path.removesuffix(".task") + ".result", "wb") as out:
        pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
