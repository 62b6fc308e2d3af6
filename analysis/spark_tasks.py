"""A streamed analysis's worker tasks run as Spark tasks (`analyze(..., engine="spark")`).

The tasks are the ones worker processes run (`streaming.run_task`: fit the detectors on the
sample, or detect partitions of the lake): each is a file naming its work, whose result a task
writes beside it. Spark only schedules them, so the results are the processes' to the byte.
An executor must read the lake by the home or URL the analysing process has (an object lake's
URL does on a cluster) and the task folder (local mode does; a cluster needs it on a shared
mount): where it cannot, its result is missing, the streamed analysis says so and does the
work itself. Needs the `spark` extra and Java.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tracegym.analysis.streaming import run_task

MISSING_SPARK = "the spark engine needs pyspark and Java: pip install 'tracegym[spark]'"


@contextmanager
def spark_session(cores: int) -> Iterator[Any]:
    """The active SparkSession (a cluster's, a notebook's), else a `local[cores]` one bound to
    127.0.0.1, stopped afterwards; its Python workers run this interpreter with its path."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ImportError(MISSING_SPARK, name="pyspark") from None
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    # pyspark reads the workers' interpreter from the environment when the context starts
    # (not `spark.pyspark.python`, in local mode), and the JVM it launches passes its
    # PYTHONPATH on to them: both set for that moment only.
    python = os.environ.get("PYSPARK_PYTHON") or sys.executable  # a user's choice stands
    path = os.pathsep.join(p for p in sys.path if p)
    builder = (
        SparkSession.builder.master(f"local[{max(1, int(cores))}]")
        .appName("tracegym-analyze")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.task.maxFailures", "1")  # a failed task is redone by the analysis
    )
    try:
        with _environment(PYSPARK_PYTHON=python, PYTHONPATH=path):
            session = builder.getOrCreate()
    except Exception as exc:  # no Java, a JVM that would not start: pyspark's own errors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RuntimeError(f"could not start a local Spark session ({first}): "
                           f"{MISSING_SPARK}") from exc  # fmt: skip
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def parallelism(session: Any) -> int:
    """How many tasks the session runs at once."""
    return max(1, int(session.sparkContext.defaultParallelism))


def run_tasks(session: Any, task_paths: Sequence[str]) -> None:
    """Run each task file's work as one Spark task (`run_task`, pickled by reference: the
    executors import tracegym), all of them before returning."""
    paths = list(task_paths)
    session.sparkContext.parallelize(paths, len(paths)).foreach(run_task)
