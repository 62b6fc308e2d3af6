"""What each page shows: gathers the rows (queries.py) and artifacts into a template context.

No HTML here and no escaping decisions: templates autoescape everything, and chart data goes
to the page as JSON through Jinja's `tojson` (which escapes `<`, `>`, `&` and quotes).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracegym.dashboards import artifacts, clusters, findings, queries, spanview
from tracegym.dashboards.db import Database, Result
from tracegym.store.home import Home
from tracegym.store.pricing import usd
from tracegym.store.steps import step_numbers
from tracegym.tracer import semconv as sc
from tracegym.tracer.messages import chat_messages


@dataclass
class Context:
    """What every page reads from: the store's views, the artifacts, the findings model."""

    home: Path
    db: Database
    findings: findings.FindingsModel

    def run(self, query: queries.Query, cap: int | None = None) -> Result:
        return self.db.query(query.sql, query.params, cap=cap)


def _iso(value: Any) -> str:
    return value.isoformat(sep=" ", timespec="seconds") if hasattr(value, "isoformat") else ""


UNKNOWN_TIME = "unknown time"


def _when(value: Any, shape: str) -> str:
    """A time as `shape`; a NULL (a garbage row's missing start) as "unknown time", not a 500."""
    return value.strftime(shape) if hasattr(value, "strftime") else UNKNOWN_TIME


def chat_pretty(text: Any, role: str) -> str:
    """A chat span's recorded messages (the GenAI shape or an older one) as a transcript, one
    `[role] text` entry per message with its tool calls; "" when the text holds no JSON."""
    if not isinstance(text, str):
        return ""
    try:
        json.loads(text)
    except ValueError:
        return ""
    entries = []
    for message in chat_messages(text, role):
        who = message.get("role") or role
        if message.get("tool_call_id"):
            who += f" {message['tool_call_id']}"
        body = [message["content"]] if message.get("content") else []
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            body.append(f"-> {function.get('name')}({function.get('arguments') or ''})")
        entries.append(f"[{who}] " + "\n".join(body))
    return "\n".join(entries)


def pretty(text: Any) -> str:
    """JSON text indented for reading; anything else as it is (the template escapes it)."""
    if text is None:
        return ""
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, str):
            return value
        return json.dumps(value, indent=2, ensure_ascii=False)
    return json.dumps(text, indent=2, ensure_ascii=False, default=str)


# Overview -------------------------------------------------------------------------------------
def overview(ctx: Context) -> dict[str, Any]:
    summary, nightly = (ctx.run(q) for q in queries.overview())
    days, tools, hours, unit, outcome_records = (
        summary.rows[0] if summary.rows else ([], [], None, "hour", 0)
    )
    days, tools = days or [], tools or []
    document, gaps_note = artifacts.gaps_document(ctx.home)
    typed, bad = artifacts.gaps(document)
    gaps_note = gaps_note or bad
    by_detector: dict[str, dict[str, Any]] = {}
    for gap in typed:
        entry = by_detector.setdefault(
            gap.detector, {"detector": gap.detector, "gaps": 0, "failed_runs": 0}
        )
        entry["gaps"] += 1
        entry["failed_runs"] = max(entry["failed_runs"], gap.failed_runs_lacking)
    history = artifacts.nightly_history(ctx.home)
    stored_nights = nightly.dicts()
    totals = {
        "runs": sum(d["runs"] for d in days),
        "succeeded": sum(d["succeeded"] for d in days),
        "failed": sum(d["failed"] for d in days),
        "spans": int(sum(d["spans"] or 0 for d in days)),
    }
    totals["outcome_records"] = int(outcome_records or 0)
    totals["records"] = totals["spans"] + totals["outcome_records"]  # what `summary` counts
    judged = totals["succeeded"] + totals["failed"]
    totals["success_rate"] = round(totals["succeeded"] / judged, 3) if judged else None
    buckets = hours if hours else days  # per hour (or minute) when the runs span a day or two
    shape = "%Y-%m-%d %H:00" if unit == "hour" else "%Y-%m-%d %H:%M"
    chart = {
        "per": (unit or "hour") if hours else "day",
        "days": [
            _when(b["hour"] if hours else b["day"], shape if hours else "%Y-%m-%d") for b in buckets
        ],
        "runs": [b["runs"] for b in buckets],
        "rate": [
            round(b["succeeded"] / (b["succeeded"] + b["failed"]), 4)
            if b["succeeded"] + b["failed"]
            else None
            for b in buckets
        ],
        "per_run": _per_run(ctx) if 0 < len(buckets) < 3 else None,
        "tools": [r["tool"] for r in tools],
        "tool_errors": [r["errors"] for r in tools],
        "tool_failed_runs": [r["failed_runs"] for r in tools],
        "nights": [str(n["date"] or UNKNOWN_TIME) for n in stored_nights],
        "night_gaps": [n["gaps"] for n in stored_nights],
        "night_promoted": [n["adapters_promoted"] for n in stored_nights],
        "night_trained": [n["adapters_trained"] for n in stored_nights],
    }
    return {
        "totals": totals,
        "tools": tools,
        "detectors": sorted(by_detector.values(), key=lambda e: -e["failed_runs"]),
        "gaps": typed[:5],
        "gaps_note": gaps_note,
        "analysed": document.runs,
        "generated_at": document.generated_at,
        "nights": _nights(history, stored_nights),
        "chart": chart,
    }


def _per_run(ctx: Context) -> dict[str, list[Any]]:
    """The latest runs one by one, for the chart when they all fall in a bucket or two."""
    rows = ctx.run(queries.recent_runs()).dicts()
    return {
        "labels": [
            f"{_when(r['start_time'], '%H:%M:%S')} {(r['run_id'] or r['trace_id'] or '')[:8]}"
            for r in rows
        ],
        "ids": [r["trace_id"] for r in rows],
        "spans": [r["spans"] for r in rows],
        "outcome": [
            "success" if r["success"] else ("failure" if r["success"] is False else "unknown")
            for r in rows
        ],
    }


def _nights(history: list[artifacts.Night], stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per night: the store's counts joined with history.jsonl's report (before/after)."""
    by_date = {str(n["date"]): dict(n) for n in stored}
    for night in history:
        row = by_date.setdefault(night.date, {"date": night.date})
        row["stages"] = row.get("stages") or json.dumps(night.stages)
        row["without"] = _without_environment(night.without_environment)
        row["evaluation"] = [
            {
                "adapter_id": e.adapter_id,
                "base": e.base.rate,
                "adapter": e.adapter.rate,
                "promoted": e.promoted,
            }
            for e in night.evaluation
        ]
    for row in by_date.values():
        stages = row.get("stages")
        try:
            row["stages"] = json.loads(stages) if isinstance(stages, str) else (stages or {})
        except ValueError:
            row["stages"] = {}
    return sorted(by_date.values(), key=lambda n: str(n.get("date")), reverse=True)


def _without_environment(records: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The gaps a night's synthesis gave no environment, each with its stage and reason (the
    report's `stages.synthesize.without_environment`, synthesis.GapWithoutEnvironment)."""
    from tracegym.synthesis.pipeline import GapWithoutEnvironment

    out = []
    for item in records:
        try:
            gap = GapWithoutEnvironment.from_dict(item)
        except ValueError:  # SynthesisRecordError: an older or partial record, shown as it is
            stage = item.get("stage")
            out.append(
                {
                    "gap": str(item.get("gap_name") or item.get("gap_id") or "?"),
                    "gap_id": str(item.get("gap_id") or ""),
                    "stage": stage if isinstance(stage, str) else "",
                    "reason": str(item.get("reason") or ""),
                }
            )
            continue
        out.append(
            {
                "gap": gap.gap_name or gap.gap_id or "?",
                "gap_id": gap.gap_id,
                "stage": gap.stage.label,
                "reason": gap.reason,
            }
        )
    return out


# Runs -----------------------------------------------------------------------------------------
def finding_options(home: Path) -> tuple[list[dict[str, str]], dict[str, list[str]]]:
    """Choices for the finding filter (each gap, each detector) and their evidence traces."""
    document, _ = artifacts.gaps_document(home)
    options, traces = [], {}
    detectors: dict[str, list[str]] = {}
    for gap in artifacts.gaps(document)[0]:
        ids = [m.trace_id for m in gap.members]  # every member run, as the gap_runs view
        options.append({"value": gap.id, "label": f"gap: {gap.name}"})
        traces[gap.id] = ids
        detectors.setdefault(gap.detector, []).extend(ids)
    for name, ids in sorted(detectors.items()):
        options.append({"value": name, "label": f"detector: {name}"})
        traces.setdefault(name, sorted(set(ids)))
    return options, traces


def _gap_names_by_trace(home: Path) -> dict[str, list[str]]:
    """Trace id -> the names of the gaps that list it as a member run (gaps.json)."""
    document, _ = artifacts.gaps_document(home)
    names: dict[str, list[str]] = {}
    for gap in artifacts.gaps(document)[0]:
        for member in gap.members:
            entry = names.setdefault(member.trace_id, [])
            if gap.name not in entry:
                entry.append(gap.name)
    return names


def label_items(labels: Any) -> list[tuple[str, str]]:
    """An outcome's labels (a JSON object) as sorted (key, value) text pairs."""
    parsed = spanview.parse(labels)
    if isinstance(parsed, dict):
        return [(str(k), spanview.text(v)) for k, v in sorted(parsed.items())]
    return [("labels", spanview.text(parsed))] if parsed not in (None, "") else []


def runs(ctx: Context, filters: queries.RunFilters) -> dict[str, Any]:
    options, finding_traces = finding_options(ctx.home)
    chosen = finding_traces.get(filters.finding, []) if filters.finding else None
    result = ctx.run(queries.runs(filters, chosen))
    agents, tools = ctx.run(queries.run_options()).rows[0]
    rows = result.dicts()
    total = rows[0]["total"] if rows else 0
    rows = [row for row in rows if row["trace_id"] is not None]  # a page past the end
    pages = max(1, math.ceil(total / queries.PAGE_SIZE))
    gap_names = _gap_names_by_trace(ctx.home)
    for row in rows:
        row["start"] = _iso(row["start_time"])
        row["request_line"] = spanview.request(row.get("request"))
        row["error_line"] = " ".join((row.get("first_error") or "").split())[:240]
        row["gap_names"] = gap_names.get(row["trace_id"], [])
        row["label_items"] = label_items(row.get("labels"))
        row["cost_text"] = usd(row.get("cost"))
    return {
        "rows": rows,
        "total": total,
        "page": filters.page,
        "pages": pages,
        "filters": filters,
        "active": filters.active(),
        "agents": agents,
        "tools": tools,
        "findings": options,
    }


# One run --------------------------------------------------------------------------------------
def resolve(ctx: Context, ident: str) -> tuple[str, dict[str, Any]] | None:
    """(trace id, `findings.fetch` rows) for a trace id, else for a run id; None if neither."""
    got = findings.fetch(ctx.db, [ident])
    if got["spans"][ident]:
        return ident, got
    found = ctx.run(queries.resolve_run(ident))
    if not found.rows:
        return None
    trace_id = found.rows[0][0]
    return trace_id, findings.fetch(ctx.db, [trace_id])


def _tree(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spans in depth-first order with their depth (orphans hang off the top)."""
    known = {s["span_id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for span in spans:
        parent = span["parent_span_id"] if span["parent_span_id"] in known else None
        children.setdefault(parent, []).append(span)
    ordered: list[dict[str, Any]] = []
    stack = [(s, 0) for s in reversed(children.get(None, []))]
    while stack:
        span, depth = stack.pop()
        span["depth"] = depth
        ordered.append(span)
        if span["span_id"] is not None:  # children.get(None) are the roots: no loop
            stack.extend((c, depth + 1) for c in reversed(children.get(span["span_id"], [])))
    return ordered


def _cut(text: Any) -> Any:
    return text[: queries.VALUE_CHARS] if isinstance(text, str) else text


def run(ctx: Context, trace_id: str, got: dict[str, Any]) -> dict[str, Any]:
    spans = got["spans"][trace_id]
    truncated = len(spans) > queries.MAX_RUN_SPANS
    spans = spans[: queries.MAX_RUN_SPANS]
    outcome = got["outcomes"][trace_id]
    evidence = findings.name_evidence(spans, artifacts.gap_evidence(ctx.home).get(trace_id, []))
    analysis = _analyse(ctx, trace_id, spans, outcome)
    flagged: dict[str, list[str]] = {}
    for e in evidence:
        for span_id in e.get("span_ids") or []:
            flagged.setdefault(span_id, []).append(f"gap {e.get('gap_name')}: {e.get('evidence')}")
    for f in analysis["findings"]:
        for span_id in f.get("span_ids") or []:
            flagged.setdefault(span_id, []).append(f"{f['detector']}: {f['message']}")
    decisive = findings.decisive_span(analysis, evidence)
    numbers = step_numbers(spans)  # as `show` numbers them (store/steps.py)
    start = min((s["start_ns"] for s in spans if s["start_ns"] is not None), default=0)
    end = max((s["end_ns"] for s in spans if s["end_ns"] is not None), default=start)
    width = max(end - start, 1)
    ordered = _tree(spans)
    for span in ordered:
        s0 = (span["start_ns"] or start) - start
        s1 = (span["end_ns"] or span["start_ns"] or start) - start
        span["offset_pct"] = round(100 * s0 / width, 3)
        span["width_pct"] = round(max(100 * (s1 - s0) / width, 0.3), 3)
        span["input_chars"] = len(span["input"] or "")
        span["output_chars"] = len(span["output"] or "")
        span["input"], span["output"] = _cut(span["input"]), _cut(span["output"])
        span["input_pretty"] = spanview.text(span["input"])
        span["output_pretty"] = spanview.text(span["output"])
        span["chat_in"], span["chat_out"] = [], []
        if span["operation"] == sc.OP_CHAT:  # messages as a chat, whichever shape
            span["chat_in"] = spanview.chat(span["input"], "user")
            span["chat_out"] = spanview.chat(span["output"], "assistant")
        span["attribute_items"] = spanview.attributes(_cut(span["attributes"]))
        span["event_items"] = spanview.events(span["events"], span["start_ns"])
        span["message_text"] = spanview.text(span["status_message"])
        span["memory"] = (
            {"operation": span["operation"], "store": span["memory_store"],
             "record_id": span["memory_record"],
             "source_write_span_ids": span["source_write_span_ids"],
             "source_write_trace_ids": span["source_write_trace_ids"]}
            if span["memory_store"] or span["source_write_span_ids"] else None
        )  # fmt: skip
        span["flags"] = flagged.get(span["span_id"], [])
        span["decisive"] = span["span_id"] == decisive
        span["step_number"] = numbers.get(span["span_id"])
        span["requested_by"] = requested_by(span)
        span["cost_text"] = usd(span.get("cost")) if span.get("cost") is not None else ""
    result = dict(outcome) if outcome else None
    if result is not None:
        labels = result.get("labels")
        try:
            parsed = json.loads(labels) if isinstance(labels, str) else labels
        except ValueError:
            parsed = labels
        result["label_items"] = sorted(parsed.items()) if isinstance(parsed, dict) else []
        result["labels_text"] = "" if isinstance(parsed, dict) else pretty(labels)
    root = ordered[0] if ordered else {}
    first_error = next((s["span_id"] for s in ordered if s["status"] == "ERROR"), None)
    selected = decisive if any(s["decisive"] for s in ordered) else first_error
    selected = selected or root.get("span_id")
    for span in ordered:
        span["selected"] = span["span_id"] == selected
    return {
        "trace_id": trace_id,
        "selected": selected,
        "user_request": spanview.text(root.get("input")),
        "session": session_of(root),
        "run_id": root.get("run_id"),
        "agent": root.get("agent"),
        "spans": ordered,
        "truncated": truncated,
        "duration_ms": round((end - start) / 1e6, 2),
        "errors": sum(1 for s in spans if s["status"] == "ERROR"),
        "cost": run_cost(spans),
        "cost_text": usd(run_cost(spans)),
        "outcome": result,
        "evidence": evidence,
        "analysis": analysis,
        "decisive": decisive,
        "started": _iso(dt.datetime.fromtimestamp(start / 1e9, dt.timezone.utc)) if spans else "",
    }


def run_cost(spans: list[dict[str, Any]]) -> float | None:
    """The run's priced LLM calls summed (as `traces.cost`); None when none is priced."""
    costs = [s["cost"] for s in spans if s.get("cost") is not None]
    return sum(costs) if costs else None


def _analyse(
    ctx: Context, trace_id: str, spans: list[dict[str, Any]], outcome: dict[str, Any] | None
) -> dict[str, Any]:
    """Findings and attribution; a run the analysis cannot read still gets its page."""
    try:
        return ctx.findings.analyse(findings.build(trace_id, spans, outcome))
    except Exception as exc:  # the page shows the spans and says why findings are missing
        note = f"no findings: the analysis could not read this run ({type(exc).__name__})"
        return {"findings": [], "attribution": None, "note": note}


def requested_by(span: dict[str, Any]) -> str | None:
    """Who ran a tool call when it was not the agent (tau2-bench's user-side tools: "user")."""
    if span.get("operation") != sc.OP_TOOL:
        return None
    return sc.tool_requester(sc.OP_TOOL, spanview.parse(span.get("attributes")))


def session_of(span: dict[str, Any]) -> dict[str, str] | None:
    """The conversation (or user) a root span names, for the link to its session."""
    attributes = spanview.parse(span.get("attributes"))
    if not isinstance(attributes, dict):
        return None
    for key, kind in queries.SESSION_KEYS:
        value = attributes.get(key)
        if value not in (None, ""):
            return {"kind": kind, "id": str(value)}
    return None


def sql_cells(result: Result | None) -> list[list[tuple[str, bool]]]:
    """The SQL box's values as (text, is_block): JSON (a column holding JSON text, a struct or
    a list) indented, long or multi-line text as a wrapped block; the rest inline."""
    if result is None:
        return []
    cells = []
    for row in result.rows:
        out = []
        for value in row:
            if value is None:
                out.append(("", False))
                continue
            if isinstance(value, (dict, list, tuple)):
                shown = spanview.text(json.loads(json.dumps(value, default=str)))
            elif isinstance(value, str):
                shown = spanview.text(value)
            else:
                shown = str(value)
            out.append((shown, "\n" in shown or len(shown) > 80))
        cells.append(out)
    return cells


# Sessions -------------------------------------------------------------------------------------
def sessions(ctx: Context) -> dict[str, Any]:
    rows = ctx.run(queries.sessions()).dicts()
    for row in rows:
        row["first"], row["last"] = _iso(row["first_start"]), _iso(row["last_start"])
        row["request_line"] = spanview.request(row["first_input"], 160)
    return {
        "sessions": rows,
        "total": rows[0]["total"] if rows else 0,
        "shown": queries.MAX_SESSIONS,
        "keys": [k for k, _ in queries.SESSION_KEYS],
    }


def session(ctx: Context, kind: str, ident: str) -> dict[str, Any]:
    """Raises LookupError when no run names this session."""
    if kind not in ("conversation", "user"):
        raise LookupError(kind)
    rows = ctx.run(queries.session(kind, ident)).dicts()
    if not rows:
        raise LookupError(ident)
    for row in rows:
        row["start"] = _iso(row["start_time"])
        row["request_text"] = spanview.request(row["input"], 2000)
        row["error_line"] = " ".join((row.get("first_error") or "").split())[:240]
    return {
        "kind": kind,
        "ident": ident,
        "rows": rows,
        "capped": len(rows) >= queries.MAX_SESSION_RUNS,
        "failed": sum(1 for r in rows if r["success"] is False),
        "succeeded": sum(1 for r in rows if r["success"] is True),
    }


# Gaps -----------------------------------------------------------------------------------------
def gaps(ctx: Context) -> dict[str, Any]:
    document, note = artifacts.gaps_document(ctx.home)
    typed, bad = artifacts.gaps(document)
    note = note or bad
    path = Home.at(ctx.home).gaps
    mtime = path.stat().st_mtime if path.exists() else 0.0
    cluster_map = clusters.cluster_map(ctx.home, typed, mtime)
    names = {g.id: g.name for g in typed}
    chart = {
        "points": cluster_map["points"],
        "marks": cluster_map["gaps"],
        "names": names,
        "bars": [{"name": g.name, "coverage": g.coverage, "delta": g.delta} for g in typed],
    }
    return {
        "document": document,
        "gaps": typed,
        "rejected": list(document.rejected),
        "note": note,
        "map_note": cluster_map["note"],
        "map_cached": Home.at(ctx.home).embeddings_cache.exists(),  # no cache: nothing embedded
        "chart": chart,
    }


def warm(ctx: Context) -> None:
    """Compute the signature map ahead of the first visit (loading the cache takes seconds)."""
    with contextlib.suppress(Exception):  # the page shows the problem when visited
        gaps(ctx)


# Environments and adapters --------------------------------------------------------------------
def environments(ctx: Context) -> dict[str, Any]:
    envs, note = artifacts.environments(ctx.home)
    synthesis, synthesis_note = artifacts.last_synthesis(ctx.home)
    return {
        "envs": envs,
        "note": note,
        "synthesis": synthesis,
        "without": list(synthesis.without_environment) if synthesis else [],
        "synthesis_note": synthesis_note,
    }


def environment(ctx: Context, env_id: str) -> dict[str, Any]:
    view = artifacts.environment_detail(ctx.home, env_id)
    detail, sample = view.detail, view.sample or {}
    validity = detail.validity.to_dict() if detail.validity is not None else None
    return {
        "env_id": env_id,
        "entry": detail.entry,
        "spec": pretty(detail.spec.to_dict()),
        "validity": detail.validity,
        "validity_text": pretty(validity),
        "calibration": detail.calibration,
        "calibration_text": pretty(detail.calibration),
        "task": pretty(sample.get("task")),
        "oracle": sample.get("oracle"),
        "messages": [
            {
                "role": m.get("role"),
                "content": pretty(m.get("content")),
                "tool_calls": pretty(m.get("tool_calls")) if m.get("tool_calls") else "",
            }
            for m in (sample.get("oracle") or {}).get("messages") or []
            if isinstance(m, dict)
        ],
        "sample_error": view.sample_error,
    }


def adapters(ctx: Context) -> dict[str, Any]:
    metas = artifacts.adapters(ctx.home)
    nights = artifacts.nightly_history(ctx.home)
    rows, chart = [], {"names": [], "base": [], "adapter": [], "router": []}
    for meta in metas:
        ev = meta.evaluation
        row = {
            "adapter_id": meta.adapter_id,
            "capability": meta.capability.name,
            "env_id": meta.capability.env_id,
            "family": meta.capability.family,
            "base": ev.base if ev is not None else None,
            "adapter": ev.adapter if ev is not None else None,
            "router": ev.router if ev is not None else None,
            "gain": ev.gain if ev is not None else None,
            "p_value": ev.p_value if ev is not None else None,
            "promoted": meta.promoted,
            "promotion": meta.promotion,
            "created_at": meta.created_at,
        }
        rows.append(row)
        if ev is not None:
            chart["names"].append(meta.adapter_id)
            for name, side in (("base", ev.base), ("adapter", ev.adapter), ("router", ev.router)):
                chart[name].append({"rate": side.rate, "ci": list(side.ci95)} if side else None)
    return {"adapters": rows, "routing": artifacts.routing(nights), "chart": chart}
