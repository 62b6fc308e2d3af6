"""`tracegym export FORMAT`: runs out of the store, in formats other tools read.

- `otlp_json`: runs as OTLP/JSON (the Collector file exporter's JSON lines), for any
  OpenTelemetry backend; `tracegym import otlp-json` reads them back as the same spans.
- `openai_ft`: OpenAI chat fine-tuning JSONL (messages with tool calls, plus tools) from
  verifier-passing runs and from registered environments' oracle demonstrations; every line is
  checked by `ft_format.validate_example` first.

Which runs: `select_runs` (run ids / trace ids / a `--where` predicate over `traces`, whose
values travel as bound parameters, or all of them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class SelectionError(ValueError):
    """A run id that matches no run (or several), or a --where predicate that does not run."""


@dataclass(frozen=True)
class SelectedRun:
    """One selected run: its trace and run ids (the run id may be None)."""

    trace_id: str
    run_id: str | None


def select_runs(
    store: Any,
    ids: Sequence[str] = (),
    *,
    where: str | None = None,
    params: Mapping[str, Any] | None = None,
    extra: str | None = None,
) -> list[SelectedRun]:
    """The runs to export, oldest first: those named in `ids` (a run id, a trace id or a unique
    trace-id prefix), those matching `where` (SQL over the `traces` view, `$name` placeholders
    bound from `params`), both when both are given, every run when neither is. `extra` is a
    condition of the caller's own (e.g. only passing runs)."""
    conditions = [f"({where})"] if where else []
    if extra:
        conditions.append(f"({extra})")
    bound: dict[str, Any] = dict(params or {})
    clash = [name for name in bound if name.startswith("_tg")]
    if clash:
        raise SelectionError(f"parameter names starting with _tg are reserved: {clash}")
    if ids:
        chosen = _resolve(store, ids)
        conditions.append("list_contains($_tg_ids, trace_id)")
        bound["_tg_ids"] = chosen
    query = "SELECT trace_id, run_id FROM traces"
    if conditions:
        query += " WHERE " + " AND ".join(conditions)
    query += " ORDER BY start_time, trace_id"
    try:
        rows = store.sql(query, bound or None).fetchall()
    except Exception as exc:  # DuckDB's own message says what is wrong with the predicate
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise SelectionError(f"--where {where!r}: {text}" if where else text) from None
    return [SelectedRun(trace_id, run_id) for trace_id, run_id in rows]


def _resolve(store: Any, ids: Sequence[str]) -> list[str]:
    """Trace ids for run ids (all of a run's traces), trace ids and unique trace-id prefixes;
    SelectionError for one that matches nothing or an ambiguous prefix."""
    out: list[str] = []
    for given in ids:
        rows = store.sql(
            "SELECT trace_id, run_id = $id, trace_id = lower($id) FROM traces "
            "WHERE run_id = $id OR starts_with(trace_id, lower($id))",
            {"id": given},
        ).fetchall()
        by_run = [t for t, run, _ in rows if run]
        exact = [t for t, _, same in rows if same]
        if by_run or exact:
            out.extend(dict.fromkeys(by_run + exact))
        elif len(rows) == 1:
            out.append(rows[0][0])
        elif rows:
            raise SelectionError(f"{given!r} matches {len(rows)} runs; give more of the id")
        else:
            raise SelectionError(f"no run with run id or trace id {given!r}")
    return list(dict.fromkeys(out))
