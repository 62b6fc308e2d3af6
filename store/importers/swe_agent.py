"""`swe-agent`: SWE-agent `.traj` files (one run each) -> traces; outcome only when known.

A `.traj` file is `{"trajectory": [{action, observation, thought, response, execution_time,
state, query ...}], "history": [chat messages], "info": {exit_status, submission, model_stats
...}, "replay_config": ...}`. Each trajectory entry `i` becomes a `step {tool}` span with
`tracegym.step.index = i`, and under it a `chat` span (the model's response: thought and action)
and an `execute_tool {tool}` span (tool = first word of the action, arguments = the action,
result = the observation), both carrying the same step index.

SWE-agent does not know whether its patch resolves the issue, so there is no outcome unless
`info` says so (`info.resolved`, true or false), or `labels=` names a SWE-bench evaluation report
(`{"resolved_ids": [...], "unresolved_ids": [...]}`, or `{instance_id: {"resolved": bool}}`).
The instance id is the file name without `.traj`.

A demonstration file (SWE-agent's `demos/`: a `history` of chat messages and no `trajectory`)
holds no run: it is skipped with that reason (`SkipFile`), and the folder's other files import.
An observation that reports an error (a Python traceback, the linter's "syntax error(s)", a
non-zero exit code) marks its `execute_tool` span as failed: status ERROR, `error.type`
`ToolError`, the status message the observation's telling line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracegym.store.importers import ImportFormatError, SkipFile, load_json
from tracegym.store.importers.chat import (
    STEP_NS,
    TOOL_ERROR_TYPE,
    ImportedRun,
    as_text,
    content_text,
    describe,
    guarded,
    hint,
    keyed,
    source_attrs,
    synthetic_start,
)
from tracegym.tracer import semconv as sc

AGENT = "swe-agent"

# Observations that say the action failed; the first matching line is the status message.
_ERROR_LINE = re.compile(
    r"Traceback \(most recent call last\)"
    r"|\bsyntax error(?:s|\(s\))?\b"
    r"|\b(?:exit(?:ed)?|return)(?: with)? (?:code|status)[:= ]+(?:[1-9]\d*|-\d+)\b",
    re.IGNORECASE | re.MULTILINE,
)


def observation_error(observation: str | None) -> str | None:
    """The line of an observation that reports an error (traceback, syntax error(s), a non-zero
    exit), or None when it reports none."""
    if not observation:
        return None
    match = _ERROR_LINE.search(observation)
    if match is None:
        return None
    start = observation.rfind("\n", 0, match.start()) + 1
    end = observation.find("\n", match.end())
    return observation[start : end if end >= 0 else len(observation)].strip()[:200]


def convert(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict[str, Any]]:
    """One SWE-agent trajectory file -> spool records."""
    doc = load_json(path, data)
    if not isinstance(doc, Mapping):
        raise ImportFormatError(
            path, f"expected a SWE-agent trajectory object, got {describe(doc)}{hint(doc)}"
        )
    trajectory = doc.get("trajectory")
    if trajectory is None and isinstance(doc.get("history"), list):
        raise SkipFile(path, "a demonstration (a 'history' and no 'trajectory'): holds no run")
    if not isinstance(trajectory, list):
        problem = "missing field 'trajectory'" if trajectory is None else "bad 'trajectory'"
        raise ImportFormatError(path, f"{problem}{hint(doc)}")
    for i, entry in enumerate(trajectory):
        where = f"trajectory {i}"
        if not isinstance(entry, Mapping):
            raise ImportFormatError(path, f"expected an object, got {describe(entry)}", where)
        if not isinstance(entry.get("action"), str):
            problem = "missing field 'action'" if "action" not in entry else "bad 'action'"
            raise ImportFormatError(path, problem, record=where)
    info = doc.get("info")
    if info is not None and not isinstance(info, Mapping):
        raise ImportFormatError(path, f"'info' should be an object, got {describe(info)}")
    instance = path.name.removesuffix(".traj").removesuffix(".json")
    resolved = info.get("resolved") if info else None
    if resolved is not None and not isinstance(resolved, bool):
        raise ImportFormatError(path, "info.resolved should be true or false")
    if labels is not None:
        resolved = _report(labels).get(instance, resolved)
    return guarded(path, "run", _run, doc, trajectory, info or {}, instance, resolved)


def _report(path: Path) -> dict[str, bool]:
    """instance id -> resolved, from a SWE-bench evaluation report."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImportFormatError(path, f"cannot read labels: {exc.strerror or exc}") from None
    report = load_json(path, data)
    if not isinstance(report, Mapping):
        raise ImportFormatError(path, f"expected a SWE-bench report object, got {describe(report)}")
    out: dict[str, bool] = {}
    for key, value in (("unresolved_ids", False), ("resolved_ids", True)):
        ids = report.get(key)
        if ids is None:
            continue
        if not isinstance(ids, list):
            raise ImportFormatError(path, f"{key} should be a list of instance ids")
        out.update({str(i): value for i in ids})
    if not out:
        for instance, entry in report.items():
            if isinstance(entry, Mapping) and isinstance(entry.get("resolved"), bool):
                out[str(instance)] = entry["resolved"]
    if not out:
        raise ImportFormatError(
            path, "expected resolved_ids/unresolved_ids or {instance_id: {resolved: bool}}"
        )
    return out


def _tool_name(action: str) -> str:
    words = action.strip().split(maxsplit=1)
    return words[0] if words else "none"


def _model(doc: Mapping[str, Any]) -> str | None:
    """The model name from `replay_config` (SWE-agent 1.x writes it as a JSON string)."""
    config = doc.get("replay_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    agent = config.get("agent") if isinstance(config, Mapping) else None
    model = agent.get("model") if isinstance(agent, Mapping) else None
    if isinstance(model, Mapping):
        model = model.get("name") or model.get("model_name")
    return model if isinstance(model, str) else None


def _problem(doc: Mapping[str, Any]) -> str | None:
    """The task: the first user message of `history` (after the system prompt)."""
    history = doc.get("history")
    if isinstance(history, list):
        for message in history:
            if isinstance(message, Mapping) and message.get("role") == "user":
                return content_text(message.get("content"))
    return None


def _run(
    doc: Mapping[str, Any],
    trajectory: list[Mapping[str, Any]],
    info: Mapping[str, Any],
    instance: str,
    resolved: bool | None,
) -> list[dict[str, Any]]:
    key = keyed("swe-agent", {"trajectory": trajectory, "info": info}, {})
    run = ImportedRun("swe-agent", key, f"swe-agent/{instance}/{key[:8]}", AGENT)
    model = _model(doc)
    problem = _problem(doc)
    start = synthetic_start(key)
    cursor = start
    previous: str | None = problem
    for i, entry in enumerate(trajectory):
        action = entry["action"]
        tool = _tool_name(action)
        observation = as_text(entry.get("observation"))
        response = as_text(entry.get("response"))
        thought = as_text(entry.get("thought"))
        seconds = entry.get("execution_time")
        took = (
            int(seconds * 1e9)
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0
            else STEP_NS
        )
        common = {sc.STEP_INDEX: i, sc.AGENT_NAME: AGENT}
        step_id = run.span_id("step", i)
        chat_end = cursor + STEP_NS
        tool_end = chat_end + took
        run.add(
            ("step", i),
            f"{sc.OP_STEP} {tool}",
            cursor,
            tool_end,
            {
                **common,
                sc.OPERATION: sc.OP_STEP,
                sc.STEP_NAME: tool,
                sc.INPUT: thought,
                sc.OUTPUT: observation,
            },
        )
        run.add(
            ("chat", i),
            f"{sc.OP_CHAT} {model}" if model else sc.OP_CHAT,
            cursor,
            chat_end,
            {
                **common,
                sc.OPERATION: sc.OP_CHAT,
                sc.REQUEST_MODEL: model,
                sc.INPUT_MESSAGES: (
                    json.dumps([{"role": "user", "content": previous}], ensure_ascii=False)
                    if previous is not None
                    else None
                ),
                sc.OUTPUT_MESSAGES: json.dumps(
                    [{"role": "assistant", "content": response or thought or action}],
                    ensure_ascii=False,
                ),
                "tracegym.source.thought": thought,
            },
            parent=step_id,
        )
        if action.strip():
            error = observation_error(observation)
            run.add(
                ("tool", i),
                f"{sc.OP_TOOL} {tool}",
                chat_end,
                tool_end,
                {
                    **common,
                    sc.OPERATION: sc.OP_TOOL,
                    sc.TOOL_NAME: tool,
                    sc.TOOL_ARGUMENTS: action,
                    sc.TOOL_RESULT: observation,
                    **({sc.ERROR_TYPE: TOOL_ERROR_TYPE} if error else {}),
                },
                parent=step_id,
                status="ERROR" if error else "UNSET",
                status_message=error,
            )
        previous = observation
        cursor = tool_end
    run.root(
        start,
        cursor,
        {
            sc.INPUT: problem,
            sc.OUTPUT: as_text(info.get("submission")),
            **source_attrs(
                instance_id=instance,
                exit_status=info.get("exit_status"),
                model_stats=info.get("model_stats"),
                model=model,
            ),
        },
    )
    if resolved is not None:
        run.outcome(success=resolved, reward=None, source="swe-agent")
    return run.records
