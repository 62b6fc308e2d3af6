"""What a spool holds, in numbers: the computation behind `tracegym summary`.

`summarize` is a pure function over spool records (the dicts `tracegym.tracer.spool.iter_spool`
yields, see docs/spool.md), so it is easy to test and reuse; the CLI only renders its result.
Standard library only: it must work on a bare install, without the analysis extras.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tracegym.tracer import semconv as sc
from tracegym.tracer.spool_files import spool_dir

NO_OPERATION = "(none)"


def _is_error(record: Mapping[str, Any], attributes: Mapping[str, Any]) -> bool:
    return record.get("status") == "ERROR" or sc.ERROR_TYPE in attributes


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def summarize(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts over spool records: spans, traces, runs, operations, tools, LLM usage, outcomes.

    - `spans`: every record (outcome records included); `operations` splits them by
      `gen_ai.operation.name` (NO_OPERATION for spans without one), so its values sum to `spans`.
    - `runs`: distinct run ids (`tracegym.run.id`, else the trace id) of root `invoke_agent` spans.
    - `tools`: per `gen_ai.tool.name`, calls and errors (status ERROR or `error.type` set).
    - `outcomes`: `recorded` outcome records; per target (run id or trace id) the latest one
      counts, split into `success` / `failure` / `unknown` (no success flag), with the mean of
      their rewards; `runs_without_outcome` and `unmatched` (targets that are no run seen here).
    """
    spans = 0
    errors = 0
    traces: set[str] = set()
    runs: dict[str, str] = {}  # run id -> trace id
    operations: Counter[str] = Counter()
    services: Counter[str] = Counter()
    tools: dict[str, dict[str, int]] = {}
    models: Counter[str] = Counter()
    llm_calls = input_tokens = output_tokens = 0
    outcomes: list[tuple[int, str, Mapping[str, Any]]] = []  # (end_ns, target, attributes)
    outcome_records = 0
    sources: Counter[str] = Counter()
    first_start: int | None = None
    last_end: int | None = None

    for record in records:
        attributes = record.get("attributes") or {}
        operation = attributes.get(sc.OPERATION) or NO_OPERATION
        spans += 1
        operations[str(operation)] += 1
        error = _is_error(record, attributes)
        errors += error
        start, end = record.get("start_ns"), record.get("end_ns")
        if isinstance(start, int) and (first_start is None or start < first_start):
            first_start = start
        if isinstance(end, int) and (last_end is None or end > last_end):
            last_end = end
        service = (record.get("resource") or {}).get("service.name")
        if service:
            services[str(service)] += 1

        if operation == sc.OP_OUTCOME:
            outcome_records += 1
            target = attributes.get(sc.OUTCOME_TARGET)
            sources[str(attributes.get(sc.OUTCOME_SOURCE, "unknown"))] += 1
            if target is not None:
                outcomes.append((end if isinstance(end, int) else 0, str(target), attributes))
            continue

        trace_id = record.get("trace_id")
        if trace_id:
            traces.add(str(trace_id))
        if operation == sc.OP_AGENT and record.get("parent_span_id") is None:
            run_id = attributes.get(sc.RUN_ID) or trace_id
            if run_id:
                runs[str(run_id)] = str(trace_id)
        elif operation == sc.OP_TOOL:
            name = str(attributes.get(sc.TOOL_NAME) or record.get("name") or "?")
            entry = tools.setdefault(name, {"calls": 0, "errors": 0})
            entry["calls"] += 1
            entry["errors"] += error
        elif operation == sc.OP_CHAT:
            llm_calls += 1
            input_tokens += _int(attributes.get(sc.INPUT_TOKENS))
            output_tokens += _int(attributes.get(sc.OUTPUT_TOKENS))
            model = attributes.get(sc.REQUEST_MODEL) or attributes.get(sc.RESPONSE_MODEL)
            models[str(model or "?")] += 1

    # The latest outcome of each run counts; a target is a run id or the trace id of a run.
    by_trace = {trace_id: run_id for run_id, trace_id in runs.items()}
    per_run: dict[str, tuple[int, Mapping[str, Any]]] = {}
    unmatched: set[str] = set()
    for stamp, target, attributes in outcomes:
        run = target if target in runs else by_trace.get(target)
        if run is None:
            unmatched.add(target)
            run = target
        if run not in per_run or stamp >= per_run[run][0]:
            per_run[run] = (stamp, attributes)
    verdicts = [attributes for _, attributes in per_run.values()]
    success = sum(1 for a in verdicts if a.get(sc.OUTCOME_SUCCESS) is True)
    failure = sum(1 for a in verdicts if a.get(sc.OUTCOME_SUCCESS) is False)
    rewards = [
        float(a[sc.OUTCOME_REWARD])
        for a in verdicts
        if isinstance(a.get(sc.OUTCOME_REWARD), (int, float))
    ]
    return {
        "spans": spans,
        "traces": len(traces),
        "runs": len(runs),
        "errors": errors,
        "operations": dict(operations.most_common()),
        "services": dict(services.most_common()),
        "tools": dict(sorted(tools.items(), key=lambda kv: (-kv[1]["calls"], kv[0]))),
        "llm": {
            "calls": llm_calls,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "models": dict(models.most_common()),
        },
        "outcomes": {
            "recorded": outcome_records,
            "success": success,
            "failure": failure,
            "unknown": len(verdicts) - success - failure,
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "runs_without_outcome": sum(1 for r in runs if r not in per_run),
            "unmatched": len(unmatched),
            "sources": dict(sources.most_common()),
        },
        "time": {"first_start_ns": first_start, "last_end_ns": last_end},
    }


def spool_files(home: str | os.PathLike[str]) -> dict[str, int]:
    """How many spool files there are under `home` and how many bytes they hold."""
    directory = spool_dir(Path(home))
    files = total = 0
    if directory.is_dir():
        for path in directory.glob("*.jsonl"):
            try:
                total += path.stat().st_size
            except FileNotFoundError:  # removed by compaction meanwhile
                continue
            files += 1
    return {"files": files, "bytes": total}
