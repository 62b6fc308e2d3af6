"""Runs as analysis sees them: one `Run` per trace, its spans as ordered `Step`s.

Loaded from the store's `spans`/`traces` views in one query whose rows arrive ordered by run
and are fetched in batches (`iter_runs`), so loading holds one batch of rows at a time, not the
lake as Python rows. Runs are plain objects: detectors walk them step by step, which frames do
not make simpler. `runs_frame` gives the same data as a Polars DataFrame for feature work.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracegym.analysis.tool_kinds import is_answer_tool, is_read_tool
from tracegym.tracer import semconv as sc

ROLE = "tracegym.message.role"  # set by the importers on message spans (user, system, ...)

_STEP_COLUMNS = [
    "trace_id", "span_id", "parent_span_id", "name", "operation", "agent", "step_index", "tool",
    "call_id", "input", "output", "status", "status_message", "error_type", "start_ns",
    "end_ns", "duration_ms", "input_tokens", "output_tokens", "memory_store", "memory_record",
    "memory_content_hash", "memory_result_hashes", "subtask", "attributes",
]  # fmt: skip


def parse_json(text: Any) -> Any:
    """JSON text as a value; anything unparsable stays the text it was."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


FLATTEN_DEPTH = 8  # deeper nesting than this is not walked


def flatten(
    value: Any, path: str = "", depth: int = 0, root: str = "value"
) -> Iterator[tuple[str, Any]]:
    """(path, scalar) for every scalar in a parsed JSON value ("status", "refund.fee"); list
    items share "path[]"; a scalar value itself is at `root`."""
    if depth > FLATTEN_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(item, f"{path}.{key}" if path else str(key), depth + 1, root)
    elif isinstance(value, list):
        for item in value:
            yield from flatten(item, f"{path}[]", depth + 1, root)
    else:
        yield path or root, value


def json_type(value: Any) -> str:
    """The JSON Schema type name of a parsed JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return "string"


@dataclass(eq=False)
class Step:
    """One span of a run, in run order (`position`), with what analysis needs of it."""

    position: int  # 0-based order in the run (start time, then the source's step index)
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    operation: str | None
    agent: str | None
    step_index: int | None  # the source's own index (`tracegym.step.index`)
    tool: str | None
    call_id: str | None
    input: str | None  # raw text: tool arguments, messages, agent input, memory query
    output: str | None  # raw text: tool result, model output, memory content
    status: str
    error_type: str | None
    start_ns: int
    end_ns: int
    duration_ms: float
    input_tokens: int | None
    output_tokens: int | None
    memory_store: str | None
    memory_record: str | None
    memory_content_hash: str | None
    memory_result_hashes: list[str]
    subtask: str | None  # the innermost enclosing subtask's name
    attributes: dict[str, Any]
    source_write_span_ids: list[str | None] = field(default_factory=list)
    # The span status's description: where SDK-traced tool errors keep their text (a raised
    # `ValueError("call get_booking first")` leaves no output, only this).
    status_message: str | None = None

    @property
    def role(self) -> str | None:
        """The message role of imported message spans (user, system, assistant, tool)."""
        return self.attributes.get(ROLE)

    @property
    def failed(self) -> bool:
        return self.status == "ERROR" or self.error_type is not None

    @property
    def arguments(self) -> Any:
        """Tool arguments parsed from JSON (a dict for most tools)."""
        return parse_json(self.input) if self.operation == sc.OP_TOOL else None

    @property
    def tokens(self) -> int:
        return (self.input_tokens or 0) + (self.output_tokens or 0)

    @property
    def label(self) -> str:
        """A short human name: the tool, the operation and agent, or the span name."""
        if self.tool:
            return self.tool
        return self.name


@dataclass(eq=False)
class Run:
    """One traced run: its steps in order, its outcome and labels."""

    trace_id: str
    run_id: str | None
    agent: str | None
    success: bool | None
    reward: float | None
    labels: dict[str, Any]
    source: str | None
    steps: list[Step]

    @property
    def root(self) -> Step | None:
        return next((s for s in self.steps if s.parent_span_id is None), None)

    @property
    def failed(self) -> bool:
        return self.success is False

    def tool_calls(self) -> list[Step]:
        return [s for s in self.steps if s.operation == sc.OP_TOOL]

    def tool_sequence(self) -> list[str]:
        return [s.tool or s.name for s in self.tool_calls()]

    def by_span(self) -> dict[str, Step]:
        return {s.span_id: s for s in self.steps}

    def request_kind(self) -> str | None:
        """The kind of request the run serves, from its own calls: the first write tool it
        calls (read and answer tools by name, `tool_kinds`), None when it calls none. Gap
        selection compares runs of one kind learnt from the request text
        (`analysis.request_kinds`) and takes this for runs without request text."""
        return first_write(self.tool_sequence())


def first_write(tools: Iterable[str]) -> str | None:
    """The first tool that neither reads nor answers (`tool_kinds`): a run's kind of request
    from its own calls (`Run.request_kind`)."""
    for tool in tools:
        if not is_read_tool(tool) and not is_answer_tool(tool):
            return tool
    return None


def _subtasks(steps: Sequence[Step]) -> None:
    """Set each step's `subtask` to its innermost enclosing subtask span's name."""
    by_id = {s.span_id: s for s in steps}
    for step in steps:
        parent = by_id.get(step.parent_span_id or "")
        while parent is not None and parent.operation != sc.OP_SUBTASK:
            parent = by_id.get(parent.parent_span_id or "")
        if step.operation != sc.OP_SUBTASK:
            step.subtask = parent.attributes.get(sc.SUBTASK_NAME, parent.name) if parent else None


def _build_run(trace: Mapping[str, Any], rows: list[dict[str, Any]]) -> Run:
    """One run from its `traces` row and its span rows (any order: sorted here)."""
    rows.sort(key=lambda r: (r["start_ns"], r["step_index"] if r["step_index"] is not None
                             else -1, r["span_id"]))  # fmt: skip
    steps = []
    for position, row in enumerate(rows):
        attributes = row["attributes"]
        steps.append(Step(
            position=position,
            trace_id=row["trace_id"], span_id=row["span_id"],
            parent_span_id=row["parent_span_id"], name=row["name"],
            operation=row["operation"], agent=row["agent"], step_index=row["step_index"],
            tool=row["tool"], call_id=row["call_id"], input=row["input"],
            output=row["output"], status=row["status"] or "UNSET",
            error_type=row["error_type"], start_ns=row["start_ns"] or 0,
            end_ns=row["end_ns"] or 0, duration_ms=row["duration_ms"] or 0.0,
            input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
            memory_store=row["memory_store"], memory_record=row["memory_record"],
            memory_content_hash=row["memory_content_hash"],
            memory_result_hashes=list(row["memory_result_hashes"] or []),
            subtask=None,
            attributes=json.loads(attributes) if isinstance(attributes, str)
            else dict(attributes or {}),
            source_write_span_ids=list(row.get("source_write_span_ids") or []),
            status_message=row.get("status_message"),
        ))  # fmt: skip
    _subtasks(steps)
    labels = parse_json(trace.get("outcome_labels"))
    return Run(
        trace_id=trace["trace_id"], run_id=trace.get("run_id"), agent=trace.get("agent"),
        success=trace.get("success"), reward=trace.get("reward"),
        labels=labels if isinstance(labels, dict) else ({"labels": labels} if labels else {}),
        source=trace.get("outcome_source"), steps=steps,
    )  # fmt: skip


def build_runs(
    step_rows: Iterable[dict[str, Any]], trace_rows: Iterable[dict[str, Any]]
) -> list[Run]:
    """Runs from rows of the `spans` view (plus provenance) and the `traces` view."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in step_rows:
        grouped.setdefault(row["trace_id"], []).append(row)
    return [_build_run(trace, grouped.get(trace["trace_id"], [])) for trace in trace_rows]


RUN_ORDER = "start_time, trace_id"  # the order runs are loaded in, and analysis reports them
BATCH_ROWS = 5_000  # span rows fetched from the store at a time by `iter_runs` (~50 MB as rows)


def iter_runs(store: Any, where: str = "", batch_rows: int = BATCH_ROWS) -> Iterator[Run]:
    """Every run in `store` (a `tracegym.store.store.Store`), one at a time, in the order of
    `load_runs`; optionally filtered by a SQL condition over the `traces` view (e.g.
    "agent = 'support'"). One query whose rows arrive ordered by run, `batch_rows` at a time:
    the process holds a batch of rows and the run being built, never every span as rows (the
    lake's size in Python tuples and dicts, what loading with one `fetchall` costs at 10k+
    runs)."""
    trace_filter = f"WHERE {where}" if where else ""
    traces = store.sql(
        "SELECT trace_id, run_id, agent, success, reward, outcome_source, outcome_labels "
        f"FROM traces {trace_filter} ORDER BY {RUN_ORDER}"
    )
    trace_columns = traces.columns
    trace_rows = [dict(zip(trace_columns, row, strict=True)) for row in traces.fetchall()]
    columns = ", ".join(f"s.{c}" for c in _STEP_COLUMNS)
    steps = store.sql(
        f"SELECT {columns}, m.source_write_span_ids, t.n AS run_order FROM spans s "
        f"JOIN (SELECT trace_id, row_number() OVER (ORDER BY {RUN_ORDER}) AS n "
        f"      FROM traces {trace_filter}) t ON t.trace_id = s.trace_id "
        "LEFT JOIN memory_ops m ON m.span_id = s.span_id AND m.trace_id = s.trace_id "
        "ORDER BY t.n"
    )
    at = 0  # trace_rows[at] is the next run to build (row_number is 1-based: run_order - 1)
    pending: list[dict[str, Any]] = []
    for batch in steps.to_arrow_reader(max(1, batch_rows)):
        for row in batch.to_pylist():
            order = row.pop("run_order") - 1
            while at < order:  # the run in hand is complete; runs without spans are empty
                yield _build_run(trace_rows[at], pending)
                pending, at = [], at + 1
            pending.append(row)
    while at < len(trace_rows):
        yield _build_run(trace_rows[at], pending)
        pending, at = [], at + 1


def load_runs(store: Any, where: str = "", batch_rows: int = BATCH_ROWS) -> list[Run]:
    """Every run in `store` (a `tracegym.store.store.Store`), optionally filtered by a SQL
    condition over the `traces` view (e.g. "agent = 'support'"); `iter_runs` one at a time."""
    return list(iter_runs(store, where, batch_rows))
