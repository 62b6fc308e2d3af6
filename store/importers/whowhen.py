"""`whowhen`: Who&When failure logs ("Which Agent Causes Task Failures and When?", ICML 2025).

One file is one multi-agent run: `{is_correct, question, question_ID, level, ground_truth,
history[{content, role, name}], mistake_agent, mistake_step, mistake_reason, system_prompt}`.
The Hand-Crafted half (Magentic-One) spells the outcome `is_corrected`; either is read.

- root: `invoke_agent CaptainAgent` (the orchestrator the Algorithm-Generated half ran), or
  `invoke_agent Magentic-One` when an `Orchestrator...` speaks in the history (the Hand-Crafted
  half), so the two systems keep apart where attribution learns a system's boilerplate; input =
  the question;
- history entry `j` -> a child `invoke_agent {name}` span with `gen_ai.agent.name = name` (the
  speaking agent, kept as written: `Computer_terminal` included), `tracegym.step.index = j`,
  output = the content;
- outcome: success = `is_correct` (or `is_corrected`); every Who&When log is a failure by
  construction, so a file that says neither is a failure; labels `{mistake_agent,
  mistake_step, mistake_step_index, mistake_reason, ground_truth}`; the span at
  `mistake_step` (0-based, as in the source) carries `tracegym.label.*` attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracegym.store.importers import ImportFormatError, load_json
from tracegym.store.importers.chat import (
    MESSAGE_INDEX,
    MESSAGE_ROLE,
    ImportedRun,
    as_text,
    boundaries,
    check_no_labels,
    content_text,
    describe,
    guarded,
    hint,
    keyed,
    source_attrs,
    synthetic_start,
)
from tracegym.tracer import semconv as sc

ORCHESTRATOR = "CaptainAgent"
MAGENTIC_ONE = "Magentic-One"  # the Hand-Crafted half's system: its lead is "Orchestrator (...)"
OUTCOME_FIELDS = ("is_correct", "is_corrected")


def convert(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict[str, Any]]:
    """One Who&When JSON file -> spool records for its run."""
    check_no_labels(path, labels, "whowhen")
    doc = load_json(path, data)
    if not isinstance(doc, Mapping):
        raise ImportFormatError(
            path, f"expected a Who&When log object, got {describe(doc)}{hint(doc)}"
        )
    history = doc.get("history")
    if not isinstance(history, list):
        problem = "missing field 'history'" if history is None else "'history' should be a list"
        raise ImportFormatError(path, f"{problem}{hint(doc)}", record="run")
    for j, entry in enumerate(history):
        if not isinstance(entry, Mapping):
            raise ImportFormatError(
                path, f"expected an object, got {describe(entry)}", record=f"history {j}"
            )
        if "content" not in entry:
            raise ImportFormatError(path, "missing field 'content'", record=f"history {j}")
    if "question" not in doc:
        raise ImportFormatError(path, "missing field 'question'", record="run")
    correct = success_of(path, doc, "run")
    return guarded(path, "run", _run, doc, history, correct, path.stem)


def success_of(path: Path, doc: Mapping[str, Any], where: str) -> bool:
    """`is_correct`, else `is_corrected`; a failure when neither says (failure logs are failures
    by construction: Who&When's, AgenTracer's)."""
    field = next((f for f in OUTCOME_FIELDS if doc.get(f) is not None), None)
    if field is None:
        return False
    if not isinstance(doc[field], bool):
        raise ImportFormatError(path, f"{field} should be true or false", record=where)
    return doc[field]


def mistake_index(value: Any, steps: int) -> int | None:
    """The 0-based history index `mistake_step` names (the source writes it as text)."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < steps:
        return value
    return None


def _system(history: list[Any]) -> str:
    """The root agent: Magentic-One where its Orchestrator speaks, else CaptainAgent."""
    for entry in history:
        if str(entry.get("name") or entry.get("role") or "").startswith("Orchestrator"):
            return MAGENTIC_ONE
    return ORCHESTRATOR


def _run(
    doc: Mapping[str, Any], history: list[Any], correct: bool | None, stem: str
) -> list[dict[str, Any]]:
    key = keyed("whowhen", doc, {})
    question_id = doc.get("question_ID")
    run = ImportedRun("whowhen", key, f"whowhen/{question_id or 'run'}/{key[:8]}", _system(history))
    start = synthetic_start(key)
    times = add_turns(run, history, start)
    final = content_text(history[-1].get("content")) if history else None
    run.root(
        start,
        times[len(history)],
        {
            sc.INPUT: as_text(doc.get("question")),
            sc.OUTPUT: final,
            **source_attrs(
                file=stem,  # the benchmark names runs by file ("1", "2", ...)
                question_id=question_id,
                level=doc.get("level"),
                system_prompts=doc.get("system_prompt"),
            ),
        },
    )
    return finish_labelled(run, doc, len(history), correct, "whowhen")


def add_turns(run: ImportedRun, history: list[Mapping[str, Any]], start: int) -> list[int]:
    """History entry `j` -> an `invoke_agent {name}` span at step index `j` (with the entry's
    own `step` as message index where it has one); returns the turns' time boundaries."""
    times = boundaries(len(history), start)
    for j, entry in enumerate(history):
        role = entry.get("role")
        name = entry.get("name") or role or "unknown"
        own = entry.get("step")
        run.add(
            ("history", j),
            f"{sc.OP_AGENT} {name}",
            times[j],
            times[j + 1],
            {
                sc.OPERATION: sc.OP_AGENT,
                sc.AGENT_NAME: str(name),
                sc.STEP_INDEX: j,
                MESSAGE_INDEX: own if isinstance(own, int) and not isinstance(own, bool) else None,
                MESSAGE_ROLE: as_text(role),
                sc.OUTPUT: content_text(entry.get("content")),
            },
        )
    return times


def finish_labelled(
    run: ImportedRun, doc: Mapping[str, Any], steps: int, success: bool, source: str
) -> list[dict[str, Any]]:
    """The run's outcome with its Who&When-style labels, the labelled step's span marked."""
    step = mistake_index(doc.get("mistake_step"), steps)
    labels: dict[str, Any] = {
        "mistake_agent": doc.get("mistake_agent"),
        "mistake_step": doc.get("mistake_step"),
        "mistake_step_index": step,
        "mistake_reason": doc.get("mistake_reason"),
        "ground_truth": doc.get("ground_truth"),
    }
    if doc.get("labels") is not None:  # a category a few files carry (e.g. "Factual_Error")
        labels["category"] = doc["labels"]
    has_labels = any(labels[k] is not None for k in ("mistake_agent", "mistake_step"))
    if step is not None:
        failure = {
            "failure_id": 1,
            "step_index": step,
            "failed_agent": doc.get("mistake_agent"),
            "step_reason": doc.get("mistake_reason"),
            "failure_category": doc.get("labels"),
            "root_cause": True,
        }
        run.mark_failures([failure])
    run.outcome(  # every log has one: its own, else a failure
        success=success,
        reward=None,
        source=source,
        labels=labels if has_labels else None,
        labelled=has_labels,
    )
    return run.records
