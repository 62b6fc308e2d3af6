"""`agentracer`: AgenTracer TracerTraj failure logs (MetaGPT teams, labelled like Who&When).

One file is a JSON list of runs, each `{question_ID, question, ground_truth, history,
mistake_agent, mistake_step, mistake_reason}`; `history` is a list of `{step, name, role,
content}` or that list written as a Python literal string (single quotes), read with
`ast.literal_eval` (never evaluated as code).

- root: `invoke_agent MetaGPT` (the team), input = the question, output = the last history
  entry; `tracegym.source.question_id`;
- history entry `j` -> a child `invoke_agent {name}` span with `gen_ai.agent.name = name` (the
  role that spoke: `Team Leader`, `Product Manager`, `Architect`, `Engineer` ...),
  `tracegym.step.index = j`, `tracegym.message.index` = the entry's own `step` when it has one,
  output = the content;
- outcome: every TracerTraj run is a failure (the set holds failed runs only), so success =
  False unless the item says otherwise in `is_correct` / `is_corrected`; labels
  `{mistake_agent, mistake_step, mistake_step_index, mistake_reason, ground_truth}` as for
  Who&When; the span at `mistake_step` (0-based into `history`) carries `tracegym.label.*`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracegym.store.importers import ImportFormatError, load_json
from tracegym.store.importers.chat import (
    ImportedRun,
    as_text,
    check_no_labels,
    content_text,
    describe,
    guarded,
    hint,
    keyed,
    literal_list,
    source_attrs,
    synthetic_start,
)
from tracegym.store.importers.whowhen import add_turns, finish_labelled, success_of
from tracegym.tracer import semconv as sc

FORMAT = "agentracer"
TEAM = "MetaGPT"


def convert(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict[str, Any]]:
    """One AgenTracer JSON file (a list of runs, or one run object) -> spool records."""
    check_no_labels(path, labels, FORMAT)
    doc = load_json(path, data)
    items = [doc] if isinstance(doc, Mapping) else doc
    if not isinstance(items, list):
        raise ImportFormatError(
            path, f"expected a list of AgenTracer runs, got {describe(doc)}{hint(doc)}"
        )
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        where = f"run {i}"
        if not isinstance(item, Mapping):
            raise ImportFormatError(path, f"expected an object, got {describe(item)}", where)
        if "question" not in item:
            raise ImportFormatError(path, f"missing field 'question'{hint(item)}", where)
        history = _history(path, item.get("history"), where)
        success = success_of(path, item, where)
        records += guarded(path, where, _run, item, history, success, seen)
    return records


def _history(path: Path, value: Any, where: str) -> list[Mapping[str, Any]]:
    value = literal_list(path, value, where)
    for j, entry in enumerate(value):
        if not isinstance(entry, Mapping):
            raise ImportFormatError(
                path, f"expected an object, got {describe(entry)}", f"{where} history {j}"
            )
        if "content" not in entry:
            raise ImportFormatError(path, "missing field 'content'", f"{where} history {j}")
    return value


def _run(
    item: Mapping[str, Any],
    history: list[Mapping[str, Any]],
    success: bool,
    seen: dict[str, int],
) -> list[dict[str, Any]]:
    key = keyed(FORMAT, {**item, "history": history}, seen)
    question_id = item.get("question_ID")
    run = ImportedRun(FORMAT, key, f"{FORMAT}/{question_id or 'run'}/{key[:8]}", TEAM)
    start = synthetic_start(key)
    times = add_turns(run, history, start)
    run.root(
        start,
        times[len(history)],
        {
            sc.INPUT: as_text(item.get("question")),
            sc.OUTPUT: content_text(history[-1].get("content")) if history else None,
            **source_attrs(question_id=question_id),
        },
    )
    return finish_labelled(run, item, len(history), success, FORMAT)
