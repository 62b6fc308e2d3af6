"""`openai-chat`: plain chat transcripts -> one trace per run.

Input: a `.json` file holding a list of runs (or one run), or a `.jsonl` file with one run a line.
A run is `{"messages": [OpenAI chat messages], "outcome": {"success", "reward", "labels",
"source"}?, "id"?, "agent"?, "model"?}`. Messages map exactly as tau-bench's (see
`tracegym.store.importers.chat` and docs/importers.md): message `j` is the span with
`tracegym.step.index = j`.

The run id is the run's `id` (or `run_id`) when given, else `openai-chat/<content digest>`.
Failures in `outcome.labels.failures` that carry a 0-based `step_index` mark those spans; with
`labels=` (AgentRx style, `trajectory_id` = the run id) those labels replace the run's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tracegym.store.importers import ImportFormatError, iter_json_lines, load_json
from tracegym.store.importers.chat import (
    ImportedRun,
    RunLabels,
    convert_messages,
    describe,
    guarded,
    hint,
    keyed,
    load_agentrx_labels,
    match_labels,
    optional_number,
    synthetic_start,
)
from tracegym.tracer import semconv as sc

AGENT = "openai-chat"


def _runs(path: Path, data: bytes) -> list[tuple[str, Any]]:
    """(record name, run object) for each run of the file."""
    if path.suffix == ".jsonl":
        return [(f"line {n}", run) for n, run in iter_json_lines(path, data)]
    doc = load_json(path, data)
    if isinstance(doc, Mapping) and "messages" in doc:
        return [("run 0", doc)]
    if not isinstance(doc, list):
        raise ImportFormatError(
            path,
            f"expected a JSON list of runs {{messages, outcome}}, got {describe(doc)}{hint(doc)}",
        )
    return [(f"run {i}", run) for i, run in enumerate(doc)]


def _check(path: Path, where: str, run: Any) -> tuple[str | None, Mapping[str, Any] | None]:
    if not isinstance(run, Mapping):
        raise ImportFormatError(
            path,
            f"expected a run object {{messages, outcome}}, got {describe(run)}{hint(run)}",
            record=where,
        )
    if not isinstance(run.get("messages"), list):
        problem = "missing field 'messages'" if "messages" not in run else "bad 'messages'"
        raise ImportFormatError(path, f"{problem}{hint(run)}", record=where)
    outcome = run.get("outcome")
    if outcome is not None:
        if not isinstance(outcome, Mapping):
            raise ImportFormatError(path, "outcome should be an object", record=where)
        success = outcome.get("success")
        if success is not None and not isinstance(success, bool):
            raise ImportFormatError(path, "outcome.success should be true or false", record=where)
        optional_number(path, outcome, "reward", where)
    run_id = run.get("id", run.get("run_id"))
    if run_id is not None and (isinstance(run_id, bool) or not isinstance(run_id, (str, int))):
        raise ImportFormatError(path, "id should be text", record=where)
    return (str(run_id) if run_id is not None else None), outcome


def iter_records(
    path: Path, data: bytes, *, labels: Path | None = None
) -> Iterator[dict[str, Any]]:
    """`convert`, a run at a time for a JSON-lines file without labels (one line's objects
    in memory at once); otherwise all of `convert`."""
    if labels is not None or path.suffix != ".jsonl":
        yield from convert(path, data, labels=labels)
        return
    seen: dict[str, int] = {}
    for n, run in iter_json_lines(path, data):
        where = f"line {n}"
        run_id, outcome = _check(path, where, run)
        yield from guarded(path, where, _run, path, where, run, run_id, outcome, None, seen)


def convert(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict[str, Any]]:
    """A file of chat transcripts -> spool records."""
    runs = _runs(path, data)
    checked = [_check(path, where, run) for where, run in runs]
    matched: dict[int, RunLabels] = {}
    if labels is not None:
        matched = match_labels(
            path,
            load_agentrx_labels(labels),
            [
                ([run_id] if run_id else [], where)
                for (where, _), (run_id, _) in zip(runs, checked, strict=True)
            ],
        )
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, ((where, run), (run_id, outcome)) in enumerate(zip(runs, checked, strict=True)):
        records += guarded(
            path, where, _run, path, where, run, run_id, outcome, matched.get(i), seen
        )
    return records


def _run(
    path: Path,
    where: str,
    source: Mapping[str, Any],
    run_id: str | None,
    outcome: Mapping[str, Any] | None,
    labels: RunLabels | None,
    seen: dict[str, int],
) -> list[dict[str, Any]]:
    key = keyed("openai-chat", {"id": run_id, "messages": source["messages"]}, seen)
    agent = source.get("agent") if isinstance(source.get("agent"), str) else AGENT
    model = source.get("model") if isinstance(source.get("model"), str) else None
    run = ImportedRun("openai-chat", key, run_id or f"openai-chat/{key[:16]}", agent)
    start = synthetic_start(key)
    summary = convert_messages(run, path, where, source["messages"], start_ns=start, model=model)
    run.root(
        start,
        run.end_ns() if run.records else start,
        {sc.INPUT: summary.first_user, sc.OUTPUT: summary.last_assistant},
    )
    own = outcome.get("labels") if outcome else None
    if labels is not None:
        run.mark_failures(labels.failures)
        own = labels.outcome_labels()
    elif isinstance(own, Mapping) and isinstance(own.get("failures"), list):
        run.mark_failures([f for f in own["failures"] if isinstance(f, Mapping)])
    if outcome is not None or labels is not None:
        outcome = outcome or {}
        source_name = outcome.get("source")
        run.outcome(
            success=outcome.get("success"),
            reward=optional_number(path, outcome, "reward", where),
            source=source_name if isinstance(source_name, str) else "openai-chat",
            labels=own,
            labelled=own is not None,
        )
    return run.records
